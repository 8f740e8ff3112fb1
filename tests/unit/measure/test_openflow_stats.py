"""The controller's files read back: port-counter lines become per-link rates over known
intervals (each direction counted at its switch side), and failure events become reaction
times from a known injection time."""
from __future__ import annotations

import dataclasses

import json

import pytest

from testbed.measure.openflow import (
    RatePoint,
    link_rate_series,
    link_rate_summary,
    reaction_times,
    window_mean_mbit,
)
from testbed.model.records import (
    PortSample,
    port_samples,
    port_tx_rates_mbit,
    rate_mbit,
    read_json_lines,
)
from testbed.model.topology.line import line

RATE_REL_TOL = 1e-9
MBIT_BYTES = 1e6 / 8


def sample(t: float, switch: str, port: int, tx: float = 0, rx: float = 0) -> PortSample:
    return PortSample(t, switch, port, int(tx), int(rx), 0, 0, 0)


@pytest.fixture(scope="module")
def fabric():
    return line(2, host_rate_mbit=10.0)  # h0 -1- s0 -2--1- s1 -2- h1


def test_samples_round_trip_through_json_lines(tmp_path):
    samples = [sample(1.5, "s1", 2, tx=1000, rx=20), PortSample(2.0, "s2", 1, 3, 4, 5, 6, 7)]
    path = tmp_path / "port-stats.jsonl"
    path.write_text("".join(s.to_json() + "\n" for s in samples))
    assert port_samples(read_json_lines(path)) == samples
    assert set(json.loads(samples[1].to_json())) == {
        "t_monotonic_s", "switch", "port", "tx_bytes", "rx_bytes", "tx_packets", "rx_packets",
        "tx_dropped", "duration_s"}


def test_a_torn_last_line_is_left_out_a_torn_middle_line_is_an_error(tmp_path):
    path = tmp_path / "events.jsonl"
    path.write_text('{"a": 1}\n{"b": 2}\n{"c"')
    assert read_json_lines(path) == [{"a": 1}, {"b": 2}]
    path.write_text('{"a": 1}\n{"b"\n{"c": 3}\n')
    with pytest.raises(ValueError, match=":2: not a JSON object"):
        read_json_lines(path)
    assert read_json_lines(tmp_path / "missing.jsonl") == []


def test_rates_from_counters():
    before, after = sample(10.0, "s1", 1, tx=0), sample(10.5, "s1", 1, tx=3 * MBIT_BYTES)
    assert rate_mbit(before, after, "tx_bytes") == pytest.approx(6.0, rel=RATE_REL_TOL)
    assert rate_mbit(after, before, "tx_bytes") is None  # counter went back: port re-added
    assert rate_mbit(before, before, "tx_bytes") is None  # no time passed
    rates = port_tx_rates_mbit({("s1", 1): before, ("s1", 2): before},
                               {("s1", 1): after, ("s2", 1): after})
    assert rates == {("s1", 1): pytest.approx(6.0, rel=RATE_REL_TOL)}


def test_rates_use_the_switchs_own_clock_when_the_samples_carry_it():
    # the replies reached the controller 0.6 s apart, but the switch read its counters 0.5 s
    # apart (the port's age went from 20.0 to 20.5 s): 3 Mbit in 0.5 s is 6 Mbit/s, not 5
    before = dataclasses.replace(sample(10.0, "s1", 1, tx=0), duration_s=20.0)
    after = dataclasses.replace(sample(10.6, "s1", 1, tx=3 * MBIT_BYTES), duration_s=20.5)
    assert rate_mbit(before, after, "tx_bytes") == pytest.approx(6.0, rel=RATE_REL_TOL)
    # one sample without it: the controller's times
    plain = sample(10.6, "s1", 1, tx=3 * MBIT_BYTES)
    assert rate_mbit(before, plain, "tx_bytes") == pytest.approx(5.0, rel=RATE_REL_TOL)


def polls(mbit_by_direction: dict[str, float], times: list[float]) -> list[PortSample]:
    """Counters of every switch port of the 2-switch line at ``times``, each direction
    carrying its given constant rate."""
    rates = {label: mbit * MBIT_BYTES for label, mbit in mbit_by_direction.items()}
    ports = {("s0", 1): ("s0->h0", "h0->s0"), ("s0", 2): ("s0->s1", "s1->s0"),
             ("s1", 1): ("s1->s0", "s0->s1"), ("s1", 2): ("s1->h1", "h1->s1")}
    return [sample(t, switch, port, tx=rates.get(sent, 0) * t, rx=rates.get(received, 0) * t)
            for t in times for (switch, port), (sent, received) in ports.items()]


def test_each_direction_is_measured_where_its_bytes_are_counted(fabric):
    labels = {f"{link.a}->{link.b}" for link in fabric.links} | {
        f"{link.b}->{link.a}" for link in fabric.links}
    assert labels == {"h0->s0", "s0->h0", "s0->s1", "s1->s0", "s1->h1", "h1->s1"}
    # a host's uplink has no switch TX counter: its bytes are the RX counter of its switch port
    want = {"h0->s0": 4.0, "s0->s1": 3.0, "s1->h1": 2.5, "h1->s1": 1.0}
    series = link_rate_series(fabric, polls(want, [0.0, 0.5, 1.0, 1.6]))
    for label in labels:
        points = series[label]
        assert [(p.t0_s, p.t1_s) for p in points] == [(0.0, 0.5), (0.5, 1.0), (1.0, 1.6)]
        for p in points:
            assert p.mbit == pytest.approx(want.get(label, 0.0), rel=RATE_REL_TOL, abs=1e-9)


def test_window_means_weigh_intervals_by_their_overlap():
    points = [RatePoint(0.0, 1.0, 2.0), RatePoint(1.0, 3.0, 8.0)]
    assert window_mean_mbit(points, 0.0, 3.0) == pytest.approx((2 + 16) / 3, rel=RATE_REL_TOL)
    assert window_mean_mbit(points, 0.5, 1.5) == pytest.approx(5.0, rel=RATE_REL_TOL)
    assert window_mean_mbit(points, 4.0, 5.0) is None


def test_summary_over_the_timed_window(fabric):
    samples = polls({"s0->s1": 5.0}, [0.0, 0.5, 1.0, 1.5, 2.0])
    summary = link_rate_summary(fabric, samples, (0.5, 1.5))
    assert summary["polls"] == 5 and summary["window_monotonic_s"] == [0.5, 1.5]
    link = summary["links"]["s0->s1"]
    assert link["mean_mbit"] == pytest.approx(5.0, rel=RATE_REL_TOL)
    assert link["peak_utilisation"] == pytest.approx(0.5, rel=RATE_REL_TOL)  # 10 Mbit/s links
    assert summary["links"]["s1->s0"]["mean_mbit"] == 0.0
    assert link_rate_summary(fabric, [], None)["links"]["s0->s1"]["mean_mbit"] is None


def test_reaction_times_count_from_the_injection():
    link = {"a": "s1", "a_port": 2, "b": "s2", "b_port": 1}
    events = [
        {"t_monotonic_s": 5.0, "event": "link_down", "link": link, "switch": None,
         "switches_updated": 3, "messages": 9, "applied_monotonic_s": 5.2},  # an earlier one
        {"t_monotonic_s": 10.25, "event": "link_up", "link": link, "switch": None,
         "switches_updated": 3, "messages": 9, "applied_monotonic_s": 10.5},
        {"t_monotonic_s": 10.05, "event": "link_down", "link": link, "switch": None,
         "switches_updated": 4, "messages": 12, "applied_monotonic_s": 10.125},
    ]
    (reaction,) = reaction_times(events, injected_monotonic_s=10.0)
    assert reaction.event == "link_down" and reaction.link == link
    assert reaction.detected_s == pytest.approx(0.05, abs=1e-9)
    assert reaction.applied_s == pytest.approx(0.125, abs=1e-9)
    assert reaction.switches_updated == 4
    assert [r.event for r in reaction_times(events, 10.0, kinds=("link_up",))] == ["link_up"]
    assert reaction_times(events, 11.0) == []
