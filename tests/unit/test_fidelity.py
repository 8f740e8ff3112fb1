"""The fidelity verdict: CPU headroom and packet conservation decide; delivery is a note."""
from __future__ import annotations

import pytest

from testbed.measure.fidelity import (
    MAX_CPU_BUSY_FRACTION,
    MAX_EMULATOR_LOSS_FRACTION,
    MAX_THREAD_CORES,
    MIN_LINK_DELIVERY_FRACTION,
    emulator_losses,
    judge,
)

STEP = 1e-4  # just across a tolerance

GOOD = dict(cpu_busy_fraction=0.5, vswitchd_cores=0.9, link_delivery_fraction=0.97,
            emulator_loss_fraction=0.0)


def test_good_run_is_trustworthy_and_says_why():
    v = judge(**GOOD)
    assert v.trustworthy and v.notes == []
    assert len(v.reasons) == 1 and "CPU 50% busy" in v.reasons[0]
    assert "0.90 cores" in v.reasons[0]


@pytest.mark.parametrize(("cpu", "trusted"), [
    (MAX_CPU_BUSY_FRACTION, True), (MAX_CPU_BUSY_FRACTION + STEP, False)])
def test_cpu_limit(cpu, trusted):
    v = judge(**{**GOOD, "cpu_busy_fraction": cpu})
    assert v.trustworthy is trusted
    assert trusted or "CPU-bound" in v.reasons[0]


@pytest.mark.parametrize(("loss", "trusted"), [
    (MAX_EMULATOR_LOSS_FRACTION, True), (MAX_EMULATOR_LOSS_FRACTION + STEP, False)])
def test_emulator_loss_limit(loss, trusted):
    v = judge(**{**GOOD, "emulator_loss_fraction": loss})
    assert v.trustworthy is trusted
    assert trusted or "could not keep up" in v.reasons[0]


def test_both_problems_are_reported():
    v = judge(**{**GOOD, "cpu_busy_fraction": 0.99, "emulator_loss_fraction": 0.05})
    assert not v.trustworthy and len(v.reasons) == 2


@pytest.mark.parametrize(("delivery", "trusted"), [
    (MIN_LINK_DELIVERY_FRACTION, True), (MIN_LINK_DELIVERY_FRACTION - STEP, False)])
def test_delivery_limit_for_bandwidth_bound_workloads(delivery, trusted):
    v = judge(**{**GOOD, "link_delivery_fraction": delivery})
    assert v.trustworthy is trusted
    assert trusted or "limited the traffic" in v.reasons[0]


def test_low_delivery_is_only_a_note_when_not_bandwidth_bound():
    v = judge(**{**GOOD, "link_delivery_fraction": 0.3}, bandwidth_bound=False)
    assert v.trustworthy and len(v.notes) == 1 and "decides nothing" in v.notes[0]


@pytest.mark.parametrize(("rx", "tx", "drops", "lost"), [
    (1000, 990, 10, 0), (1000, 980, 10, 10), (1000, 1000, 0, 0), (1000, 995, 10, 0)])
def test_emulator_losses_by_conservation(rx, tx, drops, lost):
    assert emulator_losses(rx, tx, drops) == lost


def test_verdict_serialises_every_input():
    d = judge(**GOOD).to_dict()
    assert set(d) == {"trustworthy", "reasons", "cpu_busy_fraction", "vswitchd_cores",
                      "link_delivery_fraction", "emulator_loss_fraction", "notes", "checks",
                      "threads", "rtt", "cpu_stolen_fraction"}
    assert [c["name"] for c in d["checks"]] == ["machine CPU busy",
                                               "packets lost inside the switches",
                                               "busiest link delivery"]
    assert all(c["passed"] for c in d["checks"])


def test_stolen_cpu_is_named_beside_the_busy_check_and_noted_from_its_threshold():
    quiet = judge(**GOOD, cpu_stolen_fraction=0.01)
    assert quiet.trustworthy and quiet.notes == [] and quiet.cpu_stolen_fraction == 0.01
    assert "1% of its time stolen by the hypervisor" in quiet.checks[0].statement
    stolen = judge(**GOOD, cpu_stolen_fraction=0.12)
    assert stolen.trustworthy  # steal is counted as busy; it decides nothing by itself
    assert stolen.notes == ["the hypervisor took 12% of the CPUs' time (steal, counted as "
                            "busy): wake-ups came late"]
    assert "stolen" not in judge(**GOOD).checks[0].statement  # not measured: not claimed


def test_checks_fail_where_the_verdict_does():
    d = judge(**{**GOOD, "cpu_busy_fraction": 0.99, "link_delivery_fraction": 0.5}).to_dict()
    outcomes = {c["name"]: c["outcome"] for c in d["checks"]}
    assert outcomes == {"machine CPU busy": "FAIL", "packets lost inside the switches": "PASS",
                        "busiest link delivery": "FAIL"}
    assert [c["name"] for c in judge(**GOOD, bandwidth_bound=False).to_dict()["checks"]] == [
        "machine CPU busy", "packets lost inside the switches"]


@pytest.mark.parametrize(("cores", "trusted"), [
    (MAX_THREAD_CORES, True), (MAX_THREAD_CORES + STEP, False)])
def test_a_saturated_thread_is_flagged_even_with_machine_cpu_to_spare(cores, trusted):
    v = judge(**GOOD, threads={"ovs-vswitchd": ("ovs-vswitchd", cores),
                               "pause agent": ("python3", 0.4)})
    assert v.trustworthy is trusted
    assert trusted or "saturated thread" in v.reasons[0]
    outcomes = {c.name: c.outcome for c in v.checks}
    assert outcomes["ovs-vswitchd busiest thread"] == ("PASS" if trusted else "FAIL")
    assert outcomes["pause agent busiest thread"] == "PASS"
    assert v.to_dict()["threads"]["ovs-vswitchd"] == {"thread": "ovs-vswitchd",
                                                      "cores": round(cores, 4)}


def test_the_watch_checks_the_busiest_thread_of_every_agent_beside_the_switches():
    from types import SimpleNamespace

    from testbed.measure.fidelity import Watch
    from testbed.model.topology import build

    fabric = build("spineleaf", leaves=1, spines=1, hosts_per_leaf=2, host_rate_mbit=20.0)
    net = SimpleNamespace(fabric=fabric, switchd=SimpleNamespace(pids=[101]),
                          pfc=SimpleNamespace(proc=SimpleNamespace(pid=202)),
                          marking=SimpleNamespace(anchor_pids=[303]))
    assert Watch(net).sampler.threads == {"ovs-vswitchd": [101], "pause agent": [202],
                                          "ECN anchor agent": [303]}
    net.pfc = net.marking = None  # neither agent: ovs-vswitchd alone
    assert Watch(net).sampler.threads == {"ovs-vswitchd": [101]}
