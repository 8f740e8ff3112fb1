"""The PFC demonstration without root: its parameters and what a scenario may ask of it, each
run's setup (queues and hosts' TCP), where the pauses went (hop distances, spreading by hop,
the paused-ports series), the checks at and around their named tolerances, the trust check,
the rows, the figure and the earlier flags. Results are built by hand; nothing here starts an
emulation."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from pydantic import ValidationError
from tests.unit.stand_ins import WINDOW_OFFSET_S, StandInFabric, StandInRun, record_runs

from testbed.measure.pauses import agent_alive_checks
from testbed.apply.pfc_agent import EVENTS_FILE
from testbed.capabilities import Platform, choose_paths, probe_capabilities
from testbed.cli import main
from testbed.experiments.pfc_demo.checks import (
    CONDITIONS,
    LOSSY,
    PAUSE_CUT_BY,
    PFC,
    PFC_ECN,
    SPREAD_MIN_HOPS,
    VICTIM_SLOWED_BY,
    demo_checks,
)
from testbed.experiments.pfc_demo.experiment import PfcDemo, PfcDemoParams, condition_line
from testbed.experiments.pfc_demo.plots import PAUSED_SERIES_FILE
from testbed.experiments.pfc_demo.spreading import (
    CONGESTED,
    hop_distances,
    in_window,
    interface_nodes,
    max_paused_hops,
    paused_ports_series,
    spreading,
)
from testbed.drive.flows import SERVER_START_S
from testbed.experiments.registry import load, validate
from testbed.harness.scenario import Scenario, ScenarioError
from testbed.plan.pfc import PAUSE, RESUME, switch_fan_in
from testbed.plan.profiles import StepEcn
from testbed.plan.scaling import DEFAULT_PFC_REACTION_TIME_S, pfc_headroom_bytes

# The k=4 fat-tree the demo runs on: k^3/4 hosts, 5k^2/4 switches, 3k^3/4 links.
HOSTS, SWITCHES, LINKS = 16, 20, 48
FAT_TREE_FAN_IN = 3  # every switch has k = 4 ports: three can feed the fourth's queue
LOSSLESS_PRIORITY = 3  # DEFAULT_CLASSES' RoCE class, DSCP 26
ORIGIN = "p0e0"  # the receiver's edge switch, where the incast congests
RATE_MBIT, MTU_BYTES = 20.0, 1500  # the demo's defaults
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
# How far past a check's bound a measurement is moved to flip it (Mbit/s, port-s).
STEP = 0.01
LOSSY_VICTIM_MBIT = 16.0
PFC_PAUSED_S = 4.0


def platform(congestion=frozenset({"reno", "cubic", "bbr"})) -> Platform:
    caps = probe_capabilities({"CONFIG_MODULES": "n"}, set(), set(), set(congestion), {})
    return Platform("test", caps, choose_paths(caps))


def demo(link_rate_mbit: float | None = None, **params) -> PfcDemo:
    return PfcDemo(Scenario(name="t", experiment="pfc-demo", link_rate_mbit=link_rate_mbit),
                   PfcDemoParams(**params), platform())


def default_headroom_bytes() -> int:
    return pfc_headroom_bytes(RATE_MBIT, MTU_BYTES, reaction_time_s=DEFAULT_PFC_REACTION_TIME_S,
                              fan_in=FAT_TREE_FAN_IN)


def problem_paths(params: dict, **scenario) -> list[tuple]:
    with pytest.raises(ScenarioError) as info:
        validate({"name": "t", "experiment": "pfc-demo", "params": params, **scenario})
    return [p.path for p in info.value.problems]


# --- parameters and setups --------------------------------------------------------------------


def test_the_defaults():
    e = demo()
    p = e.params
    assert p.conditions == list(CONDITIONS) == [LOSSY, PFC, PFC_ECN]
    assert (p.buffer_bytes, p.alone_s, p.contention_s, p.omit_s) == (600_000, 5, 10, 1)
    assert (p.receiver, p.victim_src, p.victim_dst) == ("p0e0h0", "p1e0h1", "p0e0h1")
    assert (e.rate_mbit, e.mtu_bytes) == (RATE_MBIT, MTU_BYTES)
    assert e.problems() == []
    assert switch_fan_in(e.fabric()) == FAT_TREE_FAN_IN
    assert [s.name for s in load("pfc-demo").setups] == list(CONDITIONS)


@pytest.mark.parametrize("conditions", [[LOSSY], [PFC], [PFC_ECN, LOSSY], [PFC_ECN, PFC]])
def test_any_distinct_conditions_are_valid(conditions):
    assert [s.name for s in demo(conditions=conditions).setups()] == conditions


@pytest.mark.parametrize(("field", "value"), [
    ("alone_s", 1), ("alone_s", 601), ("contention_s", 1), ("contention_s", 2.5),
    ("omit_s", -1), ("buffer_bytes", 0), ("buffer_bytes", 1500.0), ("conditions", []),
    ("conditions", ["red"]), ("conditions", [LOSSY, "PFC"]), ("conditions", [PFC, PFC]),
    ("pfc_reaction_time_s", -0.001), ("pfc_reaction_time_s", float("nan")),
])
def test_params_refuse_bad_values_naming_the_field(field, value):
    with pytest.raises(ValidationError) as info:
        PfcDemoParams(**{field: value})
    assert info.value.errors()[0]["loc"][0] == field


@pytest.mark.parametrize(("params", "scenario", "path"), [
    ({"buffer_bytes": 4 * MTU_BYTES - 1}, {}, ("params", "buffer_bytes")),  # under 4 frames
    ({"buffer_bytes": 6000}, {}, ("params", "buffer_bytes")),  # 4 frames, not PFC's headroom
    ({"alone_s": 3, "omit_s": 3}, {}, ("params", "omit_s")),  # nothing left to measure
    ({"contention_s": 4, "omit_s": 4}, {}, ("params", "omit_s")),
    ({"receiver": "p4e0h0"}, {}, ("params", "receiver")),  # pods 0..3
    ({"receiver": "p0e0"}, {}, ("params", "receiver")),  # a switch, not a host
    ({"victim_src": "p1e0h2"}, {}, ("params", "victim_src")),  # two hosts per edge
    ({"victim_dst": "p0e0h0"}, {}, ("params", "victim_dst")),  # the receiver's own port
    ({"victim_src": "p0e0h1"}, {}, ("params", "victim_dst")),  # the victim would go nowhere
    ({}, {"link_rate_mbit": 1000.5}, ("link_rate_mbit",)),
    ({}, {"queue": {"pfc": True}}, ("queue",)),
])
def test_scenario_problems_name_their_field(params, scenario, path):
    assert problem_paths(params, **scenario) == [path]


def test_the_buffer_must_hold_the_headroom_only_when_a_run_has_pfc():
    headroom = default_headroom_bytes()
    assert [s.name for s in demo(buffer_bytes=6000, conditions=[LOSSY]).setups()] == [LOSSY]
    assert problem_paths({"buffer_bytes": headroom}) == [("params", "buffer_bytes")]
    # one byte over the headroom gives PFC a 1-byte XOFF: ECN's K can no longer start below it
    assert len(demo(buffer_bytes=headroom + 1, conditions=[LOSSY, PFC]).setups()) == 2
    with pytest.raises(ScenarioError) as info:
        validate({"name": "t", "experiment": "pfc-demo",
                  "params": {"buffer_bytes": headroom + 1}})
    [problem] = info.value.problems
    assert problem.path == ("params", "buffer_bytes") and "pfc+ecn queue: ecn:" in problem.message


def test_lossy_queues_are_class_queues_without_pfc():
    [lossy] = demo(conditions=[LOSSY]).setups()
    assert lossy.queue.class_queues and lossy.queue.uses_classes
    assert lossy.queue.pfc is None and lossy.queue.ecn is None
    assert lossy.queue.buffer_bytes == 600_000
    assert lossy.queue_record == {"buffer_bytes": 600_000, "per_class": True}
    assert not lossy.tcp.ecn and lossy.tcp.congestion_control == "cubic"


def test_pfc_queues_pause_below_the_buffer_with_room_for_every_feeding_port():
    [pfc] = demo(conditions=[PFC]).setups()
    thresholds = pfc.queue.pfc
    assert pfc.queue.ecn is None and pfc.queue.uses_classes
    assert pfc.queue.lossless_priorities == (LOSSLESS_PRIORITY,)
    assert 0 <= thresholds.xon_bytes < thresholds.xoff_bytes <= 600_000
    assert thresholds.xoff_bytes + thresholds.headroom_bytes <= 600_000
    assert thresholds.headroom_bytes == default_headroom_bytes()
    assert pfc.queue_record["pfc"]["fan_in"] == FAT_TREE_FAN_IN
    assert pfc.queue_record["pfc"]["xoff_bytes"] == thresholds.xoff_bytes
    assert "ecn" not in pfc.queue_record
    assert not pfc.tcp.ecn


def test_pfc_ecn_queues_mark_below_xoff_with_the_same_pfc_and_ecn_hosts():
    pfc, both = demo(conditions=[PFC, PFC_ECN]).setups()
    assert both.queue.pfc == pfc.queue.pfc
    assert isinstance(both.queue.ecn, StepEcn)
    assert 0 < both.queue.ecn.k_bytes < both.queue.pfc.xoff_bytes
    [k_record] = both.queue_record["ecn"]
    assert k_record["value"] == both.queue.ecn.k_bytes
    assert both.tcp.ecn and both.host_sysctls()["net.ipv4.tcp_ecn"] == "1"


def test_pfc_thresholds_follow_the_buffer():
    [small] = demo(buffer_bytes=400_000, conditions=[PFC]).setups()
    [large] = demo(buffer_bytes=800_000, conditions=[PFC]).setups()
    assert small.queue.pfc.headroom_bytes == large.queue.pfc.headroom_bytes
    assert large.queue.pfc.xoff_bytes - small.queue.pfc.xoff_bytes == 400_000


def test_incast_senders_are_every_other_host():
    e = demo()
    senders = e.incast_senders()
    hosts = [h.name for h in e.fabric().hosts]
    assert len(hosts) == HOSTS
    assert len(senders) == HOSTS - 3 == 13
    assert not {"p0e0h0", "p1e0h1", "p0e0h1"} & set(senders)
    assert senders == [h for h in hosts if h in senders]  # in the fabric's order
    other = demo(receiver="p3e1h1", victim_src="p2e0h0", victim_dst="p3e1h0")
    assert set(other.incast_senders()) == set(hosts) - {"p3e1h1", "p2e0h0", "p3e1h0"}
    assert e.headline().endswith("13:1 incast into p0e0h0, victim p1e0h1 -> p0e0h1; runs "
                                 "lossy, pfc, pfc+ecn")


# --- where the pauses went --------------------------------------------------------------------


def test_hop_distances_from_an_edge_switch_of_the_fat_tree():
    fabric = demo().fabric()
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
    fabric = demo().fabric()
    nodes = interface_nodes(fabric)
    assert len(fabric.links) == LINKS
    assert len(nodes) == 2 * LINKS
    assert set(nodes) == set(fabric.interface_names())
    assert nodes["p0e0-eth3"] == "p0e0"
    assert nodes["c3-eth4"] == "c3"
    assert nodes["p0e0h0-eth0"] == "p0e0h0"
    assert all(intf.startswith(f"{node}-eth") for intf, node in nodes.items())


def test_in_window_keeps_both_ends_and_the_order():
    events = [{"t": t, "event": PAUSE} for t in (0.999, 1.0, 1.5, 1.2, 2.0, 2.001)]
    assert [e["t"] for e in in_window(events, 1.0, 2.0)] == [1.0, 1.5, 1.2, 2.0]
    assert in_window(events, 3.0, 4.0) == []
    assert in_window([], 0.0, 1.0) == []


def event(t: float, kind: str, intf: str, priority: int = LOSSLESS_PRIORITY) -> dict:
    return {"t": t, "event": kind, "intf": intf, "priority": priority}


def paused(seconds: float) -> dict:
    return {"xoff_sent": 0, "xon_sent": 0, "frames_received": 1, "pauses": 1,
            "paused_s": seconds, "storms": 0}


def test_spreading_by_hops_from_the_congested_switch():
    fabric = demo().fabric()
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
    assert max_paused_hops(rows) == 3


def test_spreading_of_a_quiet_run_is_empty():
    fabric = demo().fabric()
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
    assert max_paused_hops(rows) == 1
    assert max_paused_hops(rows[:1]) is None
    assert max_paused_hops([]) is None


# --- the checks -------------------------------------------------------------------------------


def hops_rows(max_hops: int | None, paused_s: float = 0.0) -> list[dict]:
    """A paused port at every hop from 1 to ``max_hops`` (none for None)."""
    if max_hops is None:
        return [{"hops": 0, "congested_queues": ["p0e0-eth1"], "paused_ports": [],
                 "paused_s": 0.0}]
    return [{"hops": h, "congested_queues": [], "paused_ports": [f"port{h}"],
             "paused_s": paused_s / max_hops} for h in range(1, max_hops + 1)]


def demo_result(condition: str, victim_mbit: float = 10.0, paused_s: float = 0.0,
                max_hops: int | None = None, lossless_drops: int | None = 0, **extra) -> dict:
    """One run's results as ``PfcDemo.measure`` returns them (what the checks read)."""
    by_hop = hops_rows(max_hops, paused_s) if condition != LOSSY else []
    result = {"victim_alone_mbit": LOSSY_VICTIM_MBIT + 1.0, "victim_mbit": victim_mbit,
              "incast_mbit": [1.5] * 13, "queue_drops": 0, "ce_marks": 0,
              "lossless_drops": None if condition == LOSSY else lossless_drops,
              "pause_frames_sent": 0, "paused_s": paused_s, "pause_storms": 0,
              "longest_pause_s": 0.0, "by_hop": by_hop, "max_paused_hops": max_paused_hops(by_hop),
              "errors": [], "dir": f"results/x/setups/{condition}"}
    if condition != LOSSY:
        result["pause_agent_running"] = True
    return {**result, **extra}


def three_runs(pfc_victim_mbit: float = 4.0, max_hops: int | None = SPREAD_MIN_HOPS + 1,
               ecn_paused_s: float = 0.5, ecn_drops: int = 0) -> dict[str, dict]:
    return {
        LOSSY: demo_result(LOSSY, victim_mbit=LOSSY_VICTIM_MBIT),
        PFC: demo_result(PFC, victim_mbit=pfc_victim_mbit, paused_s=PFC_PAUSED_S,
                         max_hops=max_hops, pause_frames_sent=40, pause_storms=1,
                         longest_pause_s=0.25),
        PFC_ECN: demo_result(PFC_ECN, victim_mbit=9.0, paused_s=ecn_paused_s, max_hops=1,
                             lossless_drops=ecn_drops, ce_marks=123),
    }


def by_name(checks) -> dict:
    return {(c.setup, c.name): c for c in checks}


HOL = (PFC, "head-of-line blocking: the victim's rate under PFC")
SPREAD = (PFC, "congestion spreading: the farthest paused port")
CUT = (PFC_ECN, "ECN cuts the pause time")


def test_the_tolerances_say_what_the_demo_claims():
    assert 0 < VICTIM_SLOWED_BY < 1 and 0 < PAUSE_CUT_BY < 1
    assert SPREAD_MIN_HOPS == 2  # "more than one hop"


def test_every_demonstration_shown():
    checks = by_name(demo_checks(three_runs()))
    assert {key: c.outcome for key, c in checks.items()} == {
        HOL: "PASS", SPREAD: "PASS", CUT: "PASS",
        (PFC, "lossless-class drops"): "PASS", (PFC_ECN, "lossless-class drops"): "PASS"}
    assert (checks[HOL].measured, checks[HOL].expected) == (4.0, "<= 8")  # half of 16
    assert (checks[SPREAD].measured, checks[SPREAD].expected) == (3, ">= 2")
    assert (checks[CUT].measured, checks[CUT].expected) == (0.5, "<= 2")  # half of 4
    assert not any("NOT" in c.statement for c in checks.values())
    assert "123 CE marks" in checks[CUT].statement
    assert "alone it got 17.00" in checks[HOL].statement
    assert "1 at 1 hops, 1 at 2 hops, 1 at 3 hops" in checks[SPREAD].statement
    assert "1 pause storms" in checks[(PFC, "lossless-class drops")].statement


@pytest.mark.parametrize(("offset", "shown"), [(-STEP, True), (0.0, True), (STEP, False)])
def test_head_of_line_blocking_at_its_tolerance(offset, shown):
    bound = LOSSY_VICTIM_MBIT * (1 - VICTIM_SLOWED_BY)
    check = by_name(demo_checks(three_runs(pfc_victim_mbit=bound + offset)))[HOL]
    assert check.passed is shown
    assert ("NOT at most" in check.statement) is not shown
    assert f"{bound + offset:.2f} Mbit/s under PFC" in check.statement


@pytest.mark.parametrize(("max_hops", "shown"), [
    (SPREAD_MIN_HOPS - 1, False), (SPREAD_MIN_HOPS, True), (SPREAD_MIN_HOPS + 2, True),
    (None, False),  # nothing paused at all: a failed claim, not a pass
])
def test_spreading_beyond_one_hop_at_its_tolerance(max_hops, shown):
    check = by_name(demo_checks(three_runs(max_hops=max_hops)))[SPREAD]
    assert check.passed is shown
    assert ("NOT beyond one hop" in check.statement) is not shown
    if max_hops is None:
        assert "no port was paused" in check.statement and check.measured == 0
    else:
        assert f"up to {max_hops} hops" in check.statement
        assert f"1 at {max_hops} hops" in check.statement


@pytest.mark.parametrize(("offset", "shown"), [(-STEP, True), (0.0, True), (STEP, False)])
def test_ecn_cuts_the_pause_time_at_its_tolerance(offset, shown):
    bound = PFC_PAUSED_S * (1 - PAUSE_CUT_BY)
    check = by_name(demo_checks(three_runs(ecn_paused_s=bound + offset)))[CUT]
    assert check.passed is shown
    assert ("NOT at most" in check.statement) is not shown


def test_a_lossless_drop_breaks_the_promise():
    checks = by_name(demo_checks(three_runs(ecn_drops=2)))
    lossless = checks[(PFC_ECN, "lossless-class drops")]
    assert lossless.passed is False and lossless.measured == 2
    assert "pfc+ecn: 2 drops in the lossless class" in lossless.statement
    assert checks[HOL].passed is True  # the other checks stand


def test_checks_need_the_runs_they_compare():
    runs = three_runs()
    assert demo_checks({}) == []
    assert demo_checks({LOSSY: runs[LOSSY]}) == []
    assert set(by_name(demo_checks({PFC: runs[PFC]}))) == {SPREAD, (PFC, "lossless-class drops")}
    assert set(by_name(demo_checks({LOSSY: runs[LOSSY], PFC_ECN: runs[PFC_ECN]}))) == {
        (PFC_ECN, "lossless-class drops")}


def test_the_checks_claim_nothing_for_pauses_that_never_happened():
    runs = {PFC: demo_result(PFC, victim_mbit=9.0, paused_s=0.0),
            PFC_ECN: demo_result(PFC_ECN, victim_mbit=9.0, paused_s=0.0)}
    checks = by_name(demo_checks(runs))
    assert checks[CUT].passed is False and "PFC alone paused nothing" in checks[CUT].statement
    assert checks[SPREAD].passed is False


def test_the_pause_agent_is_a_trust_check_of_the_pfc_runs():
    runs = three_runs()
    runs[PFC_ECN]["pause_agent_running"] = False
    trust = agent_alive_checks(runs)  # the harness adds it to every run's trust
    assert [(c.setup, c.passed) for c in trust] == [(PFC, True), (PFC_ECN, False)]


# --- rows, the figure, the flags --------------------------------------------------------------


def test_rows_give_each_run_and_every_flow_error():
    runs = three_runs()
    runs[PFC]["errors"] = ["p1e0h1 -> p0e0h1: control socket has closed unexpectedly"]
    rows = demo().rows(runs)
    assert [what for what, _ in rows] == [LOSSY, PFC, PFC_ECN, "pfc: flow error"]
    assert rows[0][1] == ("victim 16.00 Mbit/s beside the incast (alone 17.0), incast 19.5 "
                          "Mbit/s, 0 queue drops, 0 CE marks")
    assert rows[1][1].endswith("0 lossless drops, 40 pause frames, 4.00 port-s paused, pauses "
                               "up to 3 hops away")
    assert condition_line(demo_result(PFC)).endswith("no port paused")


def assert_png(path: Path) -> None:
    assert path.read_bytes()[:len(PNG_SIGNATURE)] == PNG_SIGNATURE


def test_the_figure_with_pauses(tmp_path):
    runs = three_runs()
    for condition, series in ((PFC, ([0.0, 0.5, 1.0, 2.0], [0, 3, 5, 0])),
                              (PFC_ECN, ([0.0, 0.7], [0, 1]))):
        folder = tmp_path / condition
        folder.mkdir()
        (folder / PAUSED_SERIES_FILE).write_text(json.dumps({"t_s": series[0],
                                                             "ports": series[1]}))
        runs[condition]["dir"] = str(folder)
    [path] = demo().plots(runs, tmp_path, "run | fattree k=4 | 20 Mbit/s links")
    assert path.name == "pfc-demo.png"
    assert_png(path)


@pytest.mark.parametrize("conditions", [[LOSSY], [LOSSY, PFC]])
def test_the_figure_without_pauses(tmp_path, conditions):
    runs = {LOSSY: demo_result(LOSSY, victim_mbit=LOSSY_VICTIM_MBIT)}
    if PFC in conditions:
        runs[PFC] = demo_result(PFC, by_hop=[])  # PFC on, nothing paused, no series file
    [path] = demo(conditions=conditions).plots(runs, tmp_path, "run")
    assert_png(path)


def test_the_earlier_flags_still_work(monkeypatch):
    started = record_runs(monkeypatch)
    main(["pfc-demo", "--condition", "pfc", "--seconds", "5", "--omit", "2", "--alone-s", "3",
          "--rate-mbit", "10", "--victim-src", "p2e0h0", "--quiet"])
    [resolved] = started
    p = resolved.experiment.params
    assert (p.conditions, p.contention_s, p.omit_s, p.alone_s, p.victim_src) == (
        [PFC], 5, 2, 3, "p2e0h0")
    assert resolved.experiment.rate_mbit == 10.0


# --- measure, on a stand-in fabric -------------------------------------------------------------
# iperf3 is replaced by a stand-in of the same command line: a server listens, a client reports
# 2 Mbit/s on the victim's port and 1.5 elsewhere, and appends a pause of its host's NIC to
# the pause agent's events file (with the real monotonic clock, so the victim's run alone
# falls outside the measured window). No namespace, switch or packet is involved.

STAND_IN_IPERF_SERVER = r"""
import socket, sys, time
with socket.socket() as server:
    server.bind(("127.0.0.1", int(sys.argv[1])))
    server.listen()
    time.sleep(60)  # until the flows are over and run_flows ends it
"""
STAND_IN_IPERF_CLIENT = r"""
import json, sys, time
events, host, port = sys.argv[1], sys.argv[2], int(sys.argv[3])
with open(events, "a") as fh:
    fh.write(json.dumps({"t": time.monotonic(), "event": "pause", "intf": f"{host}-eth0",
                         "priority": 3}) + "\n")
rate = 2e6 if port == 5400 else 1.5e6
print(json.dumps({"end": {"sum_received": {"bits_per_second": rate}}}))
"""


def agent_counters(fabric):
    """The pause agent's counters, read after read: every host NIC paused 0.5 s more at each
    reading."""
    nics = [f"{h.name}-eth0" for h in fabric.hosts]
    reads = 0

    def read() -> dict:
        nonlocal reads
        reads += 1
        return {nic: {"xoff_sent": 0, "xon_sent": 0, "frames_received": reads,
                      "pauses": reads, "paused_s": 0.5 * reads, "storms": 0,
                      "longest_pause_s": 0.25} for nic in nics}
    return read


def stand_in_iperf(workdir: Path):
    """How the stand-in fabric starts iperf3: the stand-in server or client above."""
    def start(host, argv, kwargs):
        port = argv[argv.index("-p") + 1]
        if "-s" in argv:
            return subprocess.Popen([sys.executable, "-c", STAND_IN_IPERF_SERVER, port],
                                    **kwargs)
        events = str(workdir / EVENTS_FILE)
        return subprocess.Popen([sys.executable, "-c", STAND_IN_IPERF_CLIENT, events, host,
                                 port], **kwargs)
    return start


def test_measure_runs_alone_then_beside_the_incast_and_finds_the_pauses(tmp_path, monkeypatch):
    monkeypatch.setattr("testbed.experiments.pfc_demo.experiment.EVENTS_SETTLE_S", 0.0)
    e = demo(conditions=[PFC], alone_s=3, contention_s=4, omit_s=1)
    [setup] = e.setups()
    net = StandInFabric(setup.fabric, tmp_path, start=stand_in_iperf(tmp_path),
                        pause=agent_counters(setup.fabric), steps={"queue_drops": 7})
    run = StandInRun(net, setup, tmp_path)
    result = e.measure(run)
    assert (result["victim_alone_mbit"], result["victim_mbit"]) == (2.0, 2.0)
    assert result["incast_mbit"] == [1.5] * 13 and result["errors"] == []
    assert result["queue_drops"] == 7  # one reading later
    # the window: after the servers' start and the omitted second, contention_s long
    t0, t1 = result["window_monotonic_s"]
    (start, end), bottleneck, bandwidth_bound = run.watched.asked
    assert start == pytest.approx(t0 + SERVER_START_S + 1 - WINDOW_OFFSET_S)
    assert end <= start + 4
    assert (bottleneck, bandwidth_bound) == ("p0e0->p0e0h0", True)
    # every host NIC paused 0.5 s between the two readings of the agent's counters
    assert result["paused_s"] == pytest.approx(0.5 * HOSTS)
    assert result["lossless_drops"] == 0 and result["pause_agent_running"] is True
    # 14 senders paused their NICs during the incast: the other pod-0 edge's hosts 3 hops
    # from p0e0, the other pods' 5 hops; the victim beside the receiver, 1 hop, was paused
    # only by the counters (no event)
    assert {r["hops"]: len(r["paused_ports"]) for r in result["by_hop"]} == {
        1: 2, 3: 2, 5: 12}
    assert result["max_paused_hops"] == 5
    series = json.loads((tmp_path / PAUSED_SERIES_FILE).read_text())
    assert series["ports"][-1] == 14 and min(series["t_s"]) >= 0  # the run alone is left out
    results = {PFC: {**json.loads(json.dumps(result)), "dir": str(tmp_path)}}
    assert [c.outcome for c in demo_checks(results)] == ["PASS", "PASS"]
