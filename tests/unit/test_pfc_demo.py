"""The PFC demonstration without root: its config and per-run queues, where the pauses went
(hop distances, counter deltas, spreading by hop, the paused-ports series), the verdict at and
around its named tolerances, and the figure. Results are built by hand; nothing here starts
an emulation."""
from __future__ import annotations

import json

import pytest

from testbed.errors import ConfigError
from testbed.experiments.pfc.run import (
    CONDITIONS,
    CONGESTED,
    LOSSY,
    PAUSE_CUT_BY,
    PFC,
    PFC_ECN,
    SPREAD_MIN_HOPS,
    VICTIM_SLOWED_BY,
    ConditionResult,
    PfcDemoConfig,
    counter_deltas,
    hop_distances,
    in_window,
    interface_nodes,
    paused_ports_series,
    plot,
    spreading,
    verdict,
)
from testbed.measure.fidelity import judge
from testbed.plan.pfc import PAUSE, RESUME, switch_fan_in
from testbed.plan.profiles import StepEcn
from testbed.plan.scaling import DEFAULT_PFC_REACTION_TIME_S, pfc_headroom_bytes

# The k=4 fat-tree the demo runs on: k^3/4 hosts, 5k^2/4 switches, 3k^3/4 links.
HOSTS, SWITCHES, LINKS = 16, 20, 48
FAT_TREE_FAN_IN = 3  # every switch has k = 4 ports: three can feed the fourth's queue
LOSSLESS_PRIORITY = 3  # DEFAULT_CLASSES' RoCE class, DSCP 26
ORIGIN = "p0e0"  # the receiver's edge switch, where the incast congests
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
# How far past a verdict's bound a measurement is moved to flip the check (Mbit/s, port-s).
STEP = 0.01
LOSSY_VICTIM_MBIT = 16.0
PFC_PAUSED_S = 4.0


def default_headroom_bytes() -> int:
    config = PfcDemoConfig()
    return pfc_headroom_bytes(config.rate_mbit, config.mtu_bytes,
                              reaction_time_s=DEFAULT_PFC_REACTION_TIME_S,
                              fan_in=FAT_TREE_FAN_IN)


# --- config -----------------------------------------------------------------------------------


def test_the_default_config_is_valid():
    config = PfcDemoConfig()
    config.validate()
    assert config.conditions == CONDITIONS == (LOSSY, PFC, PFC_ECN)
    assert switch_fan_in(config.fabric()) == FAT_TREE_FAN_IN


@pytest.mark.parametrize("conditions", [(LOSSY,), (PFC,), (PFC_ECN, LOSSY), (PFC_ECN, PFC)])
def test_any_distinct_conditions_are_valid(conditions):
    PfcDemoConfig(conditions=conditions).validate()


@pytest.mark.parametrize(("changes", "field"), [
    ({"rate_mbit": 0}, "rate_mbit"),
    ({"rate_mbit": -20.0}, "rate_mbit"),
    ({"rate_mbit": float("nan")}, "rate_mbit"),
    ({"rate_mbit": float("inf")}, "rate_mbit"),
    ({"rate_mbit": True}, "rate_mbit"),
    ({"rate_mbit": "20"}, "rate_mbit"),
    ({"rate_mbit": 1000.5}, "rate_mbit"),
    ({"mtu_bytes": 575}, "mtu_bytes"),
    ({"mtu_bytes": 9001}, "mtu_bytes"),
    ({"mtu_bytes": 1500.0}, "mtu_bytes"),
    ({"buffer_bytes": 4 * 1500 - 1}, "buffer_bytes"),  # under four frames
    ({"buffer_bytes": 6000}, "buffer_bytes"),  # four frames, but not PFC's headroom
    ({"alone_s": 1}, "alone_s"),
    ({"alone_s": 601}, "alone_s"),
    ({"contention_s": 1}, "contention_s"),
    ({"contention_s": 2.5}, "contention_s"),
    ({"omit_s": -1}, "omit_s"),
    ({"alone_s": 3, "omit_s": 3}, "omit_s"),  # nothing left to measure
    ({"contention_s": 4, "omit_s": 4}, "omit_s"),
    ({"contention_s": 4, "omit_s": 5}, "omit_s"),
    ({"conditions": ()}, "conditions"),
    ({"conditions": ("red",)}, "conditions"),
    ({"conditions": (LOSSY, "PFC")}, "conditions"),
    ({"conditions": (PFC, PFC)}, "conditions"),
    ({"receiver": "p4e0h0"}, "receiver"),  # pods 0..3
    ({"receiver": "p0e0"}, "receiver"),  # a switch, not a host
    ({"victim_src": "p1e0h2"}, "victim_src"),  # two hosts per edge
    ({"victim_dst": "h1"}, "victim_dst"),
    ({"victim_dst": "p0e0h0"}, "victim_dst"),  # the receiver: the victim would use its port
    ({"victim_src": "p0e0h0"}, "victim_dst"),
    ({"victim_src": "p0e0h1"}, "victim_dst"),  # the victim would go nowhere
])
def test_bad_configs_are_one_line_errors_naming_the_field(changes, field):
    with pytest.raises(ConfigError) as info:
        PfcDemoConfig(**changes).validate()
    assert info.value.field == field
    assert "\n" not in str(info.value)


def test_the_buffer_must_hold_the_headroom_only_when_a_run_has_pfc():
    headroom = default_headroom_bytes()
    PfcDemoConfig(buffer_bytes=6000, conditions=(LOSSY,)).validate()
    with pytest.raises(ConfigError) as info:
        PfcDemoConfig(buffer_bytes=headroom).validate()
    assert info.value.field == "buffer_bytes"
    # one byte over the headroom gives PFC a 1-byte XOFF: ECN's K can no longer start below it
    PfcDemoConfig(buffer_bytes=headroom + 1, conditions=(LOSSY, PFC)).validate()
    with pytest.raises(ConfigError) as info:
        PfcDemoConfig(buffer_bytes=headroom + 1).validate()
    assert info.value.field == "ecn"


def test_lossy_queues_are_class_queues_without_pfc():
    config = PfcDemoConfig()
    queue, record = config.queue(LOSSY)
    assert queue.class_queues and queue.uses_classes
    assert queue.pfc is None and queue.ecn is None
    assert queue.buffer_bytes == config.buffer_bytes
    assert record == {"buffer_bytes": config.buffer_bytes, "per_class": True}


def test_pfc_queues_pause_below_the_buffer_with_room_for_every_feeding_port():
    config = PfcDemoConfig()
    queue, record = config.queue(PFC)
    pfc = queue.pfc
    assert queue.ecn is None and queue.uses_classes
    assert queue.lossless_priorities == (LOSSLESS_PRIORITY,)
    assert 0 <= pfc.xon_bytes < pfc.xoff_bytes <= config.buffer_bytes
    assert pfc.xoff_bytes + pfc.headroom_bytes <= config.buffer_bytes
    assert pfc.headroom_bytes == default_headroom_bytes()
    assert record["pfc"]["fan_in"] == FAT_TREE_FAN_IN
    assert record["pfc"]["xoff_bytes"] == pfc.xoff_bytes
    assert "ecn" not in record


def test_pfc_ecn_queues_mark_below_xoff_with_the_same_pfc():
    config = PfcDemoConfig()
    queue, record = config.queue(PFC_ECN)
    pfc_alone, _ = config.queue(PFC)
    assert queue.pfc == pfc_alone.pfc
    assert isinstance(queue.ecn, StepEcn)
    assert 0 < queue.ecn.k_bytes < queue.pfc.xoff_bytes
    [k_record] = record["ecn"]
    assert k_record["value"] == queue.ecn.k_bytes


def test_pfc_thresholds_follow_the_buffer():
    small, _ = PfcDemoConfig(buffer_bytes=400_000).queue(PFC)
    large, _ = PfcDemoConfig(buffer_bytes=800_000).queue(PFC)
    assert small.pfc.headroom_bytes == large.pfc.headroom_bytes
    assert large.pfc.xoff_bytes - small.pfc.xoff_bytes == 400_000


def test_incast_senders_are_every_other_host():
    config = PfcDemoConfig()
    senders = config.incast_senders()
    hosts = [h.name for h in config.fabric().hosts]
    assert len(hosts) == HOSTS
    assert len(senders) == HOSTS - 3 == 13
    assert len(set(senders)) == len(senders)
    assert not {config.receiver, config.victim_src, config.victim_dst} & set(senders)
    assert senders == [h for h in hosts if h in senders]  # in the fabric's order
    other = PfcDemoConfig(receiver="p3e1h1", victim_src="p2e0h0", victim_dst="p3e1h0")
    assert set(other.incast_senders()) == set(hosts) - {"p3e1h1", "p2e0h0", "p3e1h0"}


# --- where the pauses went --------------------------------------------------------------------


def test_hop_distances_from_an_edge_switch_of_the_fat_tree():
    fabric = PfcDemoConfig().fabric()
    expected = {"p0e0": 0, "p0e0h0": 1, "p0e0h1": 1, "p0a0": 1, "p0a1": 1,
                "p0e1": 2, "p0e1h0": 3, "p0e1h1": 3}
    expected.update({f"c{n}": 2 for n in range(4)})
    for pod in (1, 2, 3):  # through a core: aggregation 3, edge 4, host 5
        for i in (0, 1):
            expected.update({f"p{pod}a{i}": 3, f"p{pod}e{i}": 4,
                             f"p{pod}e{i}h0": 5, f"p{pod}e{i}h1": 5})
    assert len(expected) == HOSTS + SWITCHES
    assert hop_distances(fabric, ORIGIN) == expected
    assert hop_distances(fabric, "p0e0h0")["p0e0h1"] == 2


def test_interface_nodes_name_every_interface_of_the_fabric():
    fabric = PfcDemoConfig().fabric()
    nodes = interface_nodes(fabric)
    assert len(fabric.links) == LINKS
    assert len(nodes) == 2 * LINKS
    assert set(nodes) == set(fabric.interface_names())
    assert nodes["p0e0-eth3"] == "p0e0"
    assert nodes["p0a0-eth1"] == "p0a0"
    assert nodes["c3-eth4"] == "c3"
    assert nodes["p0e0h0-eth0"] == "p0e0h0"
    assert all(intf.startswith(f"{node}-eth") for intf, node in nodes.items())


def test_in_window_keeps_both_ends_and_the_order():
    events = [{"t": t, "event": PAUSE} for t in (0.999, 1.0, 1.5, 1.2, 2.0, 2.001)]
    assert [e["t"] for e in in_window(events, 1.0, 2.0)] == [1.0, 1.5, 1.2, 2.0]
    assert in_window(events, 3.0, 4.0) == []
    assert in_window([], 0.0, 1.0) == []


def agent_counters(xoff=0, xon=0, received=0, pauses=0, paused_s=0.0, storms=0) -> dict:
    """One interface's counters as the pause agent writes them, with fields the deltas skip."""
    return {"node": "n", "xoff_sent": xoff, "xon_sent": xon, "frames_received": received,
            "pauses": pauses, "paused_s": paused_s, "storms": storms,
            "longest_pause_s": 0.3, "max_backlog_bytes": 99}


def test_counter_deltas():
    before = {"p0a0-eth1": agent_counters(xoff=3, xon=1, received=2, pauses=1, paused_s=0.25),
              "p0e0-eth1": agent_counters(xoff=1)}
    after = {"p0a0-eth1": agent_counters(xoff=7, xon=2, received=5, pauses=3, paused_s=1.0,
                                         storms=1),
             "p0e0-eth1": agent_counters(xoff=1),
             "c0-eth1": agent_counters(received=4, pauses=2, paused_s=0.5)}  # new: from zero
    deltas = counter_deltas(before, after)
    assert deltas == {
        "p0a0-eth1": {"xoff_sent": 4, "xon_sent": 1, "frames_received": 3, "pauses": 2,
                      "paused_s": 0.75, "storms": 1},
        "p0e0-eth1": {"xoff_sent": 0, "xon_sent": 0, "frames_received": 0, "pauses": 0,
                      "paused_s": 0.0, "storms": 0},
        "c0-eth1": {"xoff_sent": 0, "xon_sent": 0, "frames_received": 4, "pauses": 2,
                    "paused_s": 0.5, "storms": 0},
    }
    assert counter_deltas({}, {}) == {}


def event(t: float, kind: str, intf: str, priority: int = LOSSLESS_PRIORITY) -> dict:
    return {"t": t, "event": kind, "intf": intf, "priority": priority}


def paused(seconds: float) -> dict:
    return {"xoff_sent": 0, "xon_sent": 0, "frames_received": 1, "pauses": 1,
            "paused_s": seconds, "storms": 0}


def test_spreading_by_hops_from_the_congested_switch():
    fabric = PfcDemoConfig().fabric()
    events = [
        event(1.0, CONGESTED, "p0e0-eth1"),  # the receiver's port: 0 hops
        event(1.1, PAUSE, "p0a1-eth1"),  # aggregations: 1 hop
        event(1.1, PAUSE, "p0a0-eth1"),
        event(1.2, PAUSE, "p0e0h1-eth0"),  # the victim's NIC beside the receiver: 1 hop
        event(1.3, CONGESTED, "p0a0-eth1"),
        event(1.4, PAUSE, "c0-eth1"),  # a core: 2 hops
        event(1.5, PAUSE, "p1a0-eth3"),  # another pod's aggregation: 3 hops
        event(1.6, RESUME, "p3e1-eth3"),  # neither a pause nor congestion: no row
        event(1.7, "drained", "p2e0-eth1"),
        event(1.8, "xoff_sent", "p2e1-eth1"),
        event(1.9, PAUSE, "p0a0-eth1"),  # paused again: counted once
    ]
    deltas = {
        "p0a0-eth1": paused(0.5), "p0a1-eth1": paused(0.25), "p0e0h1-eth0": paused(0.125),
        "c0-eth1": paused(0.0),
        "c1-eth1": paused(0.0625),  # paused for a while but its pause event was cut off
        "p2a0-eth3": paused(0.0),  # never paused: no row at 3 hops from it
    }
    rows = spreading(events, deltas, fabric, ORIGIN)
    assert rows == [
        {"hops": 0, "congested_queues": ["p0e0-eth1"], "paused_ports": [], "paused_s": 0.0},
        {"hops": 1, "congested_queues": ["p0a0-eth1"],
         "paused_ports": ["p0a0-eth1", "p0a1-eth1", "p0e0h1-eth0"], "paused_s": 0.875},
        {"hops": 2, "congested_queues": [], "paused_ports": ["c0-eth1", "c1-eth1"],
         "paused_s": 0.0625},
        {"hops": 3, "congested_queues": [], "paused_ports": ["p1a0-eth3"], "paused_s": 0.0},
    ]
    json.dumps(rows)  # lists, not sets: it goes into summary.json
    result = demo_result(PFC, by_hop=rows)
    assert result.max_paused_hops == 3


def test_spreading_of_a_quiet_run_is_empty():
    fabric = PfcDemoConfig().fabric()
    assert spreading([], {}, fabric, ORIGIN) == []
    assert spreading([], {"p0a0-eth1": paused(0.0)}, fabric, ORIGIN) == []


def test_paused_ports_series_steps_with_pauses_and_resumes():
    a, b = "p0a0-eth1", "c0-eth1"
    events = [
        event(11.0, PAUSE, b),
        event(10.5, PAUSE, a),  # out of order: the series sorts by time
        event(11.2, PAUSE, a),  # already paused: the count stays
        event(11.3, CONGESTED, "p0e0-eth1"),  # ignored
        event(11.5, RESUME, a),
        event(11.6, PAUSE, a, priority=LOSSLESS_PRIORITY + 1),  # another class on the port
        event(12.0, RESUME, b),
        event(12.2, "pause_storm", b),  # ignored
        event(12.5, RESUME, a, priority=LOSSLESS_PRIORITY + 1),
        event(13.0, RESUME, "p1a0-eth3"),  # never paused: the count stays at zero
    ]
    ts, counts = paused_ports_series(events, 10.0)
    assert ts == pytest.approx([0.0, 0.5, 1.0, 1.2, 1.5, 1.6, 2.0, 2.5, 3.0])
    assert counts == [0, 1, 2, 2, 1, 2, 1, 0, 0]
    assert paused_ports_series([], 10.0) == ([0.0], [0])


def test_max_paused_hops_skips_rows_without_paused_ports():
    rows = [{"hops": 0, "congested_queues": ["q"], "paused_ports": [], "paused_s": 0.0},
            {"hops": 1, "congested_queues": [], "paused_ports": ["x"], "paused_s": 0.1},
            {"hops": 4, "congested_queues": ["y"], "paused_ports": [], "paused_s": 0.0}]
    assert demo_result(PFC, by_hop=rows).max_paused_hops == 1
    assert demo_result(PFC, by_hop=rows[:1]).max_paused_hops is None
    assert demo_result(PFC).max_paused_hops is None


# --- the verdict ------------------------------------------------------------------------------


TRUSTED = judge(0.3, 1.0, 1.0, 0.0).to_dict()
CPU_BOUND = judge(0.99, 1.0, 1.0, 0.0).to_dict()


def hops_rows(max_hops: int | None, paused_s: float = 0.0) -> list[dict]:
    """A paused port at every hop from 1 to ``max_hops`` (none for None)."""
    if max_hops is None:
        return [{"hops": 0, "congested_queues": ["p0e0-eth1"], "paused_ports": [],
                 "paused_s": 0.0}]
    return [{"hops": h, "congested_queues": [], "paused_ports": [f"port{h}"],
             "paused_s": paused_s / max_hops} for h in range(1, max_hops + 1)]


def demo_result(condition: str, victim_mbit: float = 10.0, paused_s: float = 0.0,
                max_hops: int | None = None, lossless_drops: int | None = 0,
                fidelity: dict = TRUSTED, **extra) -> ConditionResult:
    if "by_hop" not in extra:
        extra["by_hop"] = hops_rows(max_hops, paused_s) if condition != LOSSY else []
    return ConditionResult(condition, queue={}, scaling={}, host_tcp={},
                           victim_alone_mbit=LOSSY_VICTIM_MBIT + 1.0, victim_mbit=victim_mbit,
                           incast_mbit=[1.0] * 13, paused_s=paused_s,
                           lossless_drops=None if condition == LOSSY else lossless_drops,
                           fidelity=fidelity, **extra)


def three_runs(pfc_victim_mbit: float = 4.0, max_hops: int | None = SPREAD_MIN_HOPS + 1,
               ecn_paused_s: float = 0.5, ecn_drops: int = 0,
               ecn_fidelity: dict = TRUSTED) -> dict[str, ConditionResult]:
    return {
        LOSSY: demo_result(LOSSY, victim_mbit=LOSSY_VICTIM_MBIT),
        PFC: demo_result(PFC, victim_mbit=pfc_victim_mbit, paused_s=PFC_PAUSED_S,
                         max_hops=max_hops, pause_frames_sent=40, pause_storms=1,
                         longest_pause_s=0.25),
        PFC_ECN: demo_result(PFC_ECN, victim_mbit=9.0, paused_s=ecn_paused_s, max_hops=1,
                             lossless_drops=ecn_drops, ce_marks=123, fidelity=ecn_fidelity),
    }


def statement(out: dict, start: str) -> str:
    [line] = [s for s in out["statements"] if s.startswith(start)]
    return line


def test_the_tolerances_say_what_the_demo_claims():
    assert 0 < VICTIM_SLOWED_BY < 1 and 0 < PAUSE_CUT_BY < 1
    assert SPREAD_MIN_HOPS == 2  # "more than one hop"
    out = verdict(three_runs())
    assert out["tolerances"] == {"victim_slowed_by": VICTIM_SLOWED_BY,
                                 "spread_min_hops": SPREAD_MIN_HOPS,
                                 "pause_cut_by": PAUSE_CUT_BY}


def test_every_demonstration_shown():
    out = verdict(three_runs())
    assert out["checks"] == {"head_of_line_blocking": True, "spreading_beyond_one_hop": True,
                             "ecn_cuts_pause_time": True, "lossless": True}
    assert out["emulator_trusted"] is True
    assert not any("NOT" in s for s in out["statements"])
    assert not any("may not have kept up" in s for s in out["statements"])
    assert "123 CE marks" in statement(out, "ECN cuts the pause time")
    assert "pfc 0, pfc+ecn 0" in statement(out, "lossless class drops")
    assert "pfc 1 (longest pause 0.250 s)" in statement(out, "lossless class drops")
    json.dumps(out)


@pytest.mark.parametrize(("offset", "shown"), [(-STEP, True), (0.0, True), (STEP, False)])
def test_head_of_line_blocking_at_its_tolerance(offset, shown):
    bound = LOSSY_VICTIM_MBIT * (1 - VICTIM_SLOWED_BY)
    out = verdict(three_runs(pfc_victim_mbit=bound + offset))
    assert out["checks"]["head_of_line_blocking"] is shown
    line = statement(out, "head-of-line blocking")
    assert ("NOT at most" in line) is not shown
    assert f"{bound + offset:.2f} Mbit/s under PFC" in line


@pytest.mark.parametrize(("max_hops", "shown"), [
    (SPREAD_MIN_HOPS - 1, False), (SPREAD_MIN_HOPS, True), (SPREAD_MIN_HOPS + 2, True),
    (None, False),  # nothing paused at all
])
def test_spreading_beyond_one_hop_at_its_tolerance(max_hops, shown):
    out = verdict(three_runs(max_hops=max_hops))
    assert out["checks"]["spreading_beyond_one_hop"] is shown
    line = statement(out, "congestion spreading")
    assert ("NOT beyond one hop" in line) is not shown
    if max_hops is None:
        assert "no port was paused" in line
    else:
        assert f"up to {max_hops} hops" in line and f"1 at {max_hops} hops" in line


@pytest.mark.parametrize(("offset", "shown"), [(-STEP, True), (0.0, True), (STEP, False)])
def test_ecn_cuts_the_pause_time_at_its_tolerance(offset, shown):
    bound = PFC_PAUSED_S * (1 - PAUSE_CUT_BY)
    out = verdict(three_runs(ecn_paused_s=bound + offset))
    assert out["checks"]["ecn_cuts_pause_time"] is shown
    assert ("NOT at most" in statement(out, "ECN cuts the pause time")) is not shown


def test_a_lossless_drop_breaks_the_promise():
    out = verdict(three_runs(ecn_drops=2))
    assert out["checks"]["lossless"] is False
    assert "pfc+ecn 2" in statement(out, "lossless class drops")
    assert out["checks"]["head_of_line_blocking"] is True  # the other checks stand


def test_checks_without_the_runs_they_need_are_none():
    runs = three_runs()
    nothing = verdict({})
    assert nothing["checks"] == dict.fromkeys(("head_of_line_blocking",
                                               "spreading_beyond_one_hop",
                                               "ecn_cuts_pause_time", "lossless"))
    assert nothing["statements"] == []
    lossy_only = verdict({LOSSY: runs[LOSSY]})["checks"]
    assert set(lossy_only.values()) == {None}
    pfc_only = verdict({PFC: runs[PFC]})["checks"]
    assert pfc_only == {"head_of_line_blocking": None, "spreading_beyond_one_hop": True,
                        "ecn_cuts_pause_time": None, "lossless": True}
    without_pfc = verdict({LOSSY: runs[LOSSY], PFC_ECN: runs[PFC_ECN]})["checks"]
    assert without_pfc == {"head_of_line_blocking": None, "spreading_beyond_one_hop": None,
                           "ecn_cuts_pause_time": None, "lossless": True}


def test_an_emulator_that_did_not_keep_up_is_said():
    out = verdict(three_runs(ecn_fidelity=CPU_BOUND))
    assert out["emulator_trusted"] is False
    line = statement(out, f"{PFC_ECN}: the emulator may not have kept up")
    assert CPU_BOUND["reasons"][0] in line
    assert not any(s.startswith(f"{PFC}: ") for s in out["statements"])
    # a run without a fidelity verdict is not trusted, but has nothing to say either
    runs = three_runs()
    runs[PFC].fidelity = {}
    out = verdict(runs)
    assert out["emulator_trusted"] is False
    assert not any("may not have kept up" in s for s in out["statements"])


def test_run_errors_are_stated():
    runs = three_runs()
    runs[PFC].errors = ["the pause agent died during the run"]
    out = verdict(runs)
    assert f"{PFC}: the pause agent died during the run" in out["statements"]


# --- the figure -------------------------------------------------------------------------------


def assert_png(path) -> None:
    assert path.read_bytes()[:len(PNG_SIGNATURE)] == PNG_SIGNATURE


def test_plot_with_pauses(tmp_path):
    runs = three_runs()
    runs[PFC].paused_series = ([0.0, 0.5, 1.0, 2.0], [0, 3, 5, 0])
    runs[PFC_ECN].paused_series = ([0.0, 0.7], [0, 1])
    path = tmp_path / "pfc-demo.png"
    plot(runs, PfcDemoConfig(), path)
    assert_png(path)


@pytest.mark.parametrize("conditions", [(LOSSY,), (LOSSY, PFC)])
def test_plot_without_pauses(tmp_path, conditions):
    runs = {LOSSY: demo_result(LOSSY, victim_mbit=LOSSY_VICTIM_MBIT)}
    if PFC in conditions:
        runs[PFC] = demo_result(PFC, by_hop=[])  # PFC on, nothing paused, no events
    path = tmp_path / "pfc-demo.png"
    plot(runs, PfcDemoConfig(conditions=conditions), path)
    assert_png(path)


def test_verdict_claims_nothing_for_pauses_that_never_happened():
    from testbed.experiments.pfc.run import ConditionResult, verdict

    def run(condition, paused_s):
        return ConditionResult(condition, {}, {}, {}, victim_alone_mbit=19.0, victim_mbit=9.0,
                               lossless_drops=0, paused_s=paused_s)
    out = verdict({"pfc": run("pfc", 0.0), "pfc+ecn": run("pfc+ecn", 0.0)})
    assert out["checks"]["ecn_cuts_pause_time"] is False
    assert out["checks"]["spreading_beyond_one_hop"] is False
    assert any("no port was paused" in line for line in out["statements"])
    assert verdict({})["emulator_trusted"] is False
