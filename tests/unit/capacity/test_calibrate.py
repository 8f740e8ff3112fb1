"""The calibration search and how runs take their default link rate from it."""
from __future__ import annotations

import json

import pytest

from testbed.capacity.calibrate import (
    MARGIN,
    Trial,
    next_rate,
    result_of,
    ring_topology,
    ring_world,
    trial_size_bytes,
)
from testbed.harness.calibration import (
    Calibration,
    default_rate,
    load_calibration,
    save_calibration,
)

MACHINE = {"cpu_model": "x", "cpus": 2, "kernel": "6.1", "ovs_version": "3.1.0",
           "machine": "x86_64", "ovs_datapath": "userspace", "ovs_offload": "userspace-tso"}


def ok(rate):
    return Trial(rate, 0.95, True)


def bad(rate, trusted=True):
    return Trial(rate, 0.5, trusted, [] if trusted else ["cpu"])


def test_a_trial_passes_only_trusted_and_at_90_percent():
    assert ok(10).passed and not bad(10).passed
    assert not Trial(10, 0.95, False).passed and not Trial(10, None, False).passed


def test_the_search_doubles_then_bisects():
    trials: list[Trial] = []
    assert next_rate(trials, 25) == 25
    trials.append(ok(25))
    assert next_rate(trials, 25) == 50
    trials.append(ok(50))
    assert next_rate(trials, 25) == 100
    trials.append(bad(100))
    # between 50 and 100: sqrt(50 * 100) = 70.7
    assert next_rate(trials, 25) == pytest.approx(70.7)
    trials.append(ok(70.7))
    assert next_rate(trials, 25) == pytest.approx((70.7 * 100) ** 0.5, abs=0.1)  # 84.1
    trials.append(bad(84.1, trusted=False))
    assert next_rate(trials, 25) == pytest.approx((70.7 * 84.1) ** 0.5, abs=0.1)  # 77.1
    trials.append(ok(77.1))
    assert next_rate(trials, 25) is None  # 84.1 <= 77.1 * 1.15: done
    assert result_of(trials) == 77.1


def test_the_search_halves_when_the_start_fails_and_stops_at_the_top():
    assert next_rate([bad(25)], 25) == 12.5
    assert next_rate([bad(25), bad(12.5), bad(6.25), bad(3.1)], 25) is None
    assert result_of([bad(25), bad(12.5)]) is None
    assert next_rate([ok(800), ok(1600)], 25, max_mbit=1600) is None


def test_trial_size_moves_the_same_seconds_at_any_rate():
    # 100 Mbit/s for 2 s: 25e6 B of busbw; size = 25e6 * 16 / 30 = 13.33e6 -> 4 KiB multiple
    assert trial_size_bytes(100.0) == 13_332_480
    assert trial_size_bytes(1.0) == 131072
    assert trial_size_bytes(0.001) == 4096
    # a 32-rank ring's steps last as long as the 16-rank ring's: each rank's chunk is the same
    chunk_16, chunk_32 = trial_size_bytes(100.0) / 16, trial_size_bytes(100.0, 32) / 32
    assert chunk_32 == pytest.approx(chunk_16, rel=0.001)


def test_without_a_calibration_a_run_takes_the_safe_rate_and_says_so(tmp_path):
    from testbed.capabilities import detect

    rate, why = default_rate(detect(), 6.0, path=tmp_path / "none.json")
    assert rate == 6.0 and "no calibration" in why and "testbed calibrate" in why


def test_a_calibration_for_this_machine_gives_the_rate_times_the_margin(tmp_path, monkeypatch):
    import testbed.harness.calibration as calibration

    monkeypatch.setattr(calibration, "machine_description", lambda platform: MACHINE)
    path = save_calibration(Calibration(150.0, MARGIN, MACHINE, [], "2026-12-01"),
                            tmp_path / "c.json")
    rate, why = default_rate(None, 6.0, path=path)
    assert rate == round(150.0 * MARGIN, 1) and "150 Mbit/s" in why
    rate, why = default_rate(None, 6.0, cap_mbit=50.0, path=path)
    assert rate == 50.0 and "capped" in why


def test_a_calibration_of_another_machine_is_not_used(tmp_path):
    path = tmp_path / "c.json"
    path.write_text(json.dumps({"rate_mbit": 150.0, "margin": MARGIN, "trials": [],
                                "machine": {**MACHINE, "cpus": 64},
                                "measured_at": "2026-12-01"}))
    calibration, why = load_calibration(MACHINE, path)
    assert calibration is None and "another machine" in why and "cpus" in why
    path.write_text("{not json")
    assert load_calibration(MACHINE, path)[0] is None


def test_rings_beyond_k4_take_one_rank_per_edge_switch():
    assert ring_topology(4) == {"name": "fattree", "k": 4}
    assert ring_world(ring_topology(4)) == 16
    assert ring_topology(8) == {"name": "fattree", "k": 8, "hosts_per_edge": 1}
    assert ring_world(ring_topology(8)) == 32
