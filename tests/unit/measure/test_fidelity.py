"""The fidelity verdict: CPU headroom and packet conservation decide; delivery is a note."""
from __future__ import annotations

import pytest
from tests.unit.stand_ins import StandInFabric

from testbed.measure.fidelity import (
    MAX_CPU_BUSY_FRACTION,
    MAX_EMULATOR_LOSS_FRACTION,
    MAX_THREAD_CORES,
    MIN_LINK_DELIVERY_FRACTION,
    emulator_losses,
    judge,
)
from testbed.model.topology.fattree import fat_tree

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


# --- the ports' queues: standing backlogs must drain at their rate; the marker must follow ----

from testbed.apply.pfc_runtime import empty_within, paused_within  # noqa: E402
from testbed.measure.fidelity import (  # noqa: E402
    MARKER_DIVERGENCE_RANGE_FRACTION,
    MARKER_DIVERGENCE_SLACK_FRAMES,
    MIN_BACKLOGGED_DELIVERY_FRACTION,
    MIN_QUEUE_SAMPLES,
    STANDING_BACKLOG_FRAMES,
    STANDING_SAMPLE_FRACTION,
    backlog_checks,
    backlogged_delivery,
    marker_divergence,
    marker_tolerance_bytes,
    standing_ports,
    union_spans,
)
from testbed.plan.profiles import RedEcn, StepEcn  # noqa: E402

FRAME = 1514
T = [0.25 * i for i in range(41)]  # 10 s of samples
FULL = (0.0, 10.0)


def test_a_port_stands_when_half_its_samples_hold_two_frames():
    floor = STANDING_BACKLOG_FRAMES * FRAME
    half = int(len(T) * STANDING_SAMPLE_FRACTION) + 1
    backlog = {"a->b": [floor] * half + [0] * (len(T) - half),
               "b->a": [floor - 1] * len(T),  # never two frames
               "c->d": [floor] * (half - 2) + [0] * (len(T) - half + 2)}
    assert set(standing_ports(T, backlog, FULL, FRAME)) == {"a->b"}


def test_too_few_samples_decide_nothing():
    t = T[:MIN_QUEUE_SAMPLES - 1]
    assert standing_ports(t, {"a->b": [10**6] * len(t)}, FULL, FRAME) == {}


def test_only_the_window_counts():
    backlog = {"a->b": [10**6 if t < 5 else 0 for t in T]}
    assert standing_ports(T, backlog, (0.0, 4.75), FRAME) == {"a->b": 1.0}
    assert standing_ports(T, backlog, (5.0, 10.0), FRAME) == {}


def test_delivery_counts_only_the_intervals_a_port_was_backlogged_throughout():
    floor = STANDING_BACKLOG_FRAMES * FRAME
    rate_mbit = 8.0  # one byte per microsecond: 250000 B per 0.25 s interval
    per_interval = int(rate_mbit * 1e6 / 8 * 0.25)
    # busy (backlogged) for the first 30 intervals, sending at 90% of the rate; then idle
    backlog = {"a->b": [floor] * 31 + [0] * 10}
    sent = {"a->b": [min(i, 30) * int(0.9 * per_interval) for i in range(len(T))]}
    out = backlogged_delivery(T, backlog, sent, {"a->b": rate_mbit}, {}, FULL, FRAME)
    assert out["a->b"]["delivery"] == pytest.approx(0.9)
    assert out["a->b"]["intervals"] == 30 and out["a->b"]["busy_s"] == pytest.approx(7.5)


def test_delivery_of_a_backlogged_port_discounts_the_time_pfc_paused_it():
    floor = STANDING_BACKLOG_FRAMES * FRAME
    rate_mbit = 8.0
    per_interval = int(rate_mbit * 1e6 / 8 * 0.25)
    backlog = {"a->b": [floor] * len(T)}
    # paused for the second half, sending nothing then
    sent = {"a->b": [min(i, 20) * per_interval for i in range(len(T))]}
    out = backlogged_delivery(T, backlog, sent, {"a->b": rate_mbit}, {"a->b": [(5.0, 10.0)]},
                              FULL, FRAME)
    assert out["a->b"]["delivery"] == pytest.approx(1.0)
    whole = backlogged_delivery(T, backlog, sent, {"a->b": rate_mbit}, {}, FULL, FRAME)
    assert whole["a->b"]["delivery"] == pytest.approx(0.5)


def test_a_port_backlogged_in_too_few_intervals_is_not_judged():
    floor = STANDING_BACKLOG_FRAMES * FRAME
    backlog = {"a->b": [floor if i % 2 else 0 for i in range(len(T))]}  # never twice in a row
    backlog["a->b"][:22] = [floor] * 2 + [0, floor] * 10  # half the samples, one pair
    assert backlogged_delivery(T, backlog, {"a->b": [0] * len(T)}, {"a->b": 8.0}, {}, FULL,
                               FRAME) == {}


def test_a_slow_backlogged_port_fails_the_run_and_is_named():
    ok = MIN_BACKLOGGED_DELIVERY_FRACTION
    def entry(f):
        return {"delivery": f, "busy_s": 5.0, "intervals": 20}

    checks, problems = backlog_checks({"a->b": entry(ok), "c->d": entry(ok - STEP)}, None)
    assert [c.passed for c in checks] == [False] and checks[0].measured == round(ok - STEP, 4)
    assert "c->d" in problems[0] and "below" in problems[0]
    checks, problems = backlog_checks({"a->b": entry(ok)}, None)
    assert checks[0].passed and not problems
    checks, problems = backlog_checks({}, None)
    assert checks[0].passed and checks[0].measured is None and not problems
    assert backlog_checks(None, None) == ([], [])


def test_a_run_whose_queues_could_not_be_read_is_not_trusted():
    checks, problems = backlog_checks({"error": "OSError: gone"}, None)
    assert checks[0].passed is None and "OSError: gone" in problems[0]
    v = judge(**GOOD, backlogged={"error": "OSError: gone"})
    assert not v.trustworthy


def test_marker_tolerance_is_a_quarter_of_the_marking_range_plus_two_frames():
    slack = MARKER_DIVERGENCE_SLACK_FRAMES * FRAME
    assert marker_tolerance_bytes(StepEcn(30_000), FRAME) == \
        int(MARKER_DIVERGENCE_RANGE_FRACTION * 30_000 + slack)
    assert marker_tolerance_bytes(RedEcn(5_000, 200_000, 0.01), FRAME) == \
        int(MARKER_DIVERGENCE_RANGE_FRACTION * 195_000 + slack)
    # a token bucket sends up to its bucket at once where the model drains smoothly
    assert marker_tolerance_bytes(StepEcn(30_000), FRAME, 7_500) == \
        marker_tolerance_bytes(StepEcn(30_000), FRAME) + 7_500


def test_marker_divergence_is_a_high_percentile_of_the_paired_gap():
    real = {"a->b": [1000] * len(T)}
    model = {"a->b": [1000] * (len(T) - 1) + [90_000]}  # one outlier of 41: below p95
    out = marker_divergence(T, model, real, FULL)["a->b"]
    assert out["abs_bytes"] < 90_000 and out["samples"] == len(T)
    drifted = {"a->b": [1000 + 100 * i for i in range(len(T))]}
    assert marker_divergence(T, drifted, real, FULL)["a->b"]["abs_bytes"] > 3000


def test_a_queue_moving_while_it_is_read_is_no_divergence():
    real = {"a->b": [1000] * len(T)}
    model = {"a->b": [7000] * len(T)}
    moving = {"a->b": [6000] * len(T)}  # the model swung 12 KB around the kernel's reading
    assert marker_divergence(T, model, real, FULL, moving)["a->b"]["abs_bytes"] == 0
    partly = {"a->b": [2000] * len(T)}  # only the excess over the swing counts
    assert marker_divergence(T, model, real, FULL, partly)["a->b"]["abs_bytes"] == 4000
    assert marker_divergence(T, model, real, FULL, partly)["a->b"]["mean_bytes"] == 6000


def test_a_drifting_marker_fails_the_run():
    tol = marker_tolerance_bytes(StepEcn(30_000), FRAME)
    near = {"abs_bytes": tol, "mean_bytes": 0, "samples": 40, "tolerance_bytes": tol}
    far = {**near, "abs_bytes": tol + 1}
    checks, problems = backlog_checks(None, {"a->b": near, "c->d": far})
    assert checks[0].passed is False and "c->d" in problems[0]
    v = judge(**GOOD, marker={"a->b": near})
    assert v.trustworthy and v.checks[-1].name == "ECN marker's model follows the real queue"
    assert not judge(**GOOD, marker={"c->d": far}).trustworthy


def test_paused_spans_are_the_union_of_the_priorities_pauses_within_the_window():
    events = [{"t": 1.0, "event": "pause", "intf": "s1-eth1", "priority": 3},
              {"t": 2.0, "event": "pause", "intf": "s1-eth1", "priority": 4},
              {"t": 3.0, "event": "resume", "intf": "s1-eth1", "priority": 3},
              {"t": 4.0, "event": "resume", "intf": "s1-eth1", "priority": 4},
              {"t": 5.0, "event": "xoff_sent", "intf": "s1-eth2", "priority": 3},
              {"t": 8.0, "event": "pause", "intf": "h1-eth0", "priority": 3}]  # still open
    assert paused_within(events, 0.0, 10.0) == {"s1-eth1": [(1.0, 4.0)], "h1-eth0": [(8.0, 10.0)]}
    assert paused_within(events, 2.5, 9.0) == {"s1-eth1": [(2.5, 4.0)], "h1-eth0": [(8.0, 9.0)]}
    assert paused_within(events, 4.5, 7.0) == {}


def test_a_queue_is_empty_between_samples_that_leave_it_out():
    sample_s = 0.01
    samples = [{"t": 1.00, "q": {"s1-eth1/3": 9000}},
               {"t": 1.01, "q": {"s1-eth1/3": 6000, "s1-eth2/3": 1500}},
               {"t": 1.02, "q": {"s1-eth2/3": 1500}},
               {"t": 1.03, "q": {"s1-eth1/3": 3000}},
               # nothing written for 0.5 s: every queue read empty
               {"t": 1.53, "q": {"s1-eth1/3": 3000, "s1-eth1/4": 1500}}]
    spans = empty_within(samples, ["s1-eth1", "s1-eth2", "s1-eth3"], sample_s, 0.5, 2.0)
    assert spans["s1-eth1"] == [(0.5, 1.0), (1.02, 1.03), (1.04, 1.53), (1.54, 2.0)]
    assert spans["s1-eth2"] == [(0.5, 1.01), (1.03, 2.0)]
    assert spans["s1-eth3"] == [(0.5, 2.0)]  # never named: empty throughout
    # the window clips, and a busy sample before it holds the queue busy into it
    assert empty_within(samples, ["s1-eth1"], sample_s, 1.005, 1.035) == {
        "s1-eth1": [(1.02, 1.03)]}
    assert empty_within(samples, ["s1-eth1"], sample_s, 2.0, 2.0) == {}


def test_a_port_owes_nothing_in_the_gaps_its_queue_read_empty():
    floor = STANDING_BACKLOG_FRAMES * FRAME
    rate_mbit = 8.0
    per_interval = int(rate_mbit * 1e6 / 8 * 0.25)
    # backlogged at every sample, but each interval's last 0.05 s went idle between them
    backlog = {"a->b": [floor] * len(T)}
    sent = {"a->b": [i * int(0.8 * per_interval) for i in range(len(T))]}
    idle = [(t + 0.2, t + 0.25) for t in T[:-1]]
    out = backlogged_delivery(T, backlog, sent, {"a->b": rate_mbit}, {"a->b": idle}, FULL,
                              FRAME)
    assert out["a->b"]["delivery"] == pytest.approx(1.0)
    assert backlogged_delivery(T, backlog, sent, {"a->b": rate_mbit}, {}, FULL,
                               FRAME)["a->b"]["delivery"] == pytest.approx(0.8)


def test_spans_are_merged_into_a_disjoint_union():
    assert union_spans([(1.0, 3.0), (5.0, 6.0)], [(2.0, 4.0), (6.0, 7.0), (8.0, 8.0)]) == [
        (1.0, 4.0), (5.0, 7.0)]
    assert union_spans() == []


def test_the_watch_checks_the_busiest_thread_of_every_emulator_process():
    from testbed.measure.fidelity import Watch
    from testbed.model.topology import build

    fabric = build("spineleaf", leaves=1, spines=1, hosts_per_leaf=2, host_rate_mbit=20.0)
    net = StandInFabric(fabric)
    net.emulator_processes = lambda: {"ovs-vswitchd": [101], "pause agent": [202]}
    watch = Watch(net)
    assert watch.sampler.threads == {"ovs-vswitchd": [101], "pause agent": [202]}
    assert watch.sampler.vswitchd_pids == [101]


def test_packets_lost_to_the_runs_own_cuts_are_not_the_emulators():
    from testbed.measure.fidelity import Watch

    watch = Watch.__new__(Watch)
    watch.t_start, watch.t_end = 10.0, 20.0
    watch.switches = {"rx_packets": 1000, "tx_packets": 900, "queue_drops": 40,
                      "impairment_drops": 0}
    windows = [{"start_s": 12.0, "end_s": 14.0, "lost_packets": 50},
               {"start_s": 9.0, "end_s": 11.0, "lost_packets": 7}]  # began before the watch
    watch.net = StandInFabric(fat_tree(4))
    watch.net.failure_losses = lambda: windows
    assert watch.failure_lost() == 50
    assert watch.emulator_lost() == 10
    windows[0]["lost_packets"] = 80  # never below zero
    assert watch.emulator_lost() == 0
