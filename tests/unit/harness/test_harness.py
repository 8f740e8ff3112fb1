"""The harness's pure parts: the verdict, run ids, progress lines, reports, the failure
schedule against a stand-in network, queue plans from a scenario's section, plot titles and
exit statuses."""
from __future__ import annotations

import datetime
import json
import re
import time

import pytest
from tests.unit.stand_ins import StandInFabric

from testbed.apply.failures import FailureEvent, FailureSchedule
from testbed.errors import ConfigError
from testbed.harness.plans import queue_plan
from testbed.harness.progress import Progress, describe, eta_s
from testbed.harness.report import checks_table
from testbed.harness.run import COMPLETE, FAILED, Outcome, new_run_id, plot_title
from testbed.harness.scenario import QueueSpec
from testbed.model.topology.fattree import fat_tree
from testbed.model.verdict import Check, Verdict, at_least, at_most, holds, near, trust_checks

MTU = 1500


# --- the verdict ------------------------------------------------------------------------------


def test_checks_judge_their_numbers():
    assert at_least("x", 0.9, 0.9, "").passed is True
    assert at_least("x", 0.89, 0.9, "").passed is False
    assert at_most("x", 0.95, 0.95, "").passed is True
    assert at_most("x", 0.951, 0.95, "").passed is False
    assert near("x", 10, 12, 2, "B").passed is True and near("x", 9, 12, 2, "B").passed is False
    assert holds("x", True).passed is True and holds("x", False).passed is False


def test_nothing_measured_is_not_judged_never_a_pass():
    for check in (at_least("x", None, 1, ""), at_most("x", None, 1, ""),
                  near("x", None, 1, 1, ""), holds("x", None)):
        assert check.passed is None and check.outcome == "n/a"
    verdict = Verdict([at_least("x", None, 1, "")], [at_least("cpu", 1, 0, "")])
    assert verdict.passed and verdict.counts() == {"PASS": 0, "FAIL": 0, "n/a": 1}


def test_trust_needs_a_check_and_every_one_passing():
    assert Verdict().emulator_trusted is False
    assert Verdict().reasons == ["nothing measured whether the emulator kept up"]
    bad = at_most("machine CPU busy", 0.99, 0.95, "", "the machine was CPU-bound")
    v = Verdict(trust=[at_most("lost", 0, 0.005, ""), bad])
    assert not v.emulator_trusted
    assert v.reasons == ["machine CPU busy: 0.99  (expected <= 0.95)"]


def test_verdict_round_trips_through_json():
    v = Verdict([near("q", 3000, 3000, 4500, "B", "near K", "n2")],
                [at_most("cpu", 0.5, 0.95, "fraction")], ["said"])
    again = Verdict.from_dict(json.loads(json.dumps(v.to_dict())))
    assert again.to_dict() == v.to_dict()
    assert v.to_dict()["checks"][0]["outcome"] == "PASS"


def test_trust_checks_come_from_each_setups_fidelity():
    from testbed.measure.fidelity import judge

    good = judge(0.5, 1.0, 0.97, 0.0, setup="a").to_dict()
    bad = judge(0.99, 1.0, 0.97, 0.0, setup="b").to_dict()
    checks = trust_checks([("a", good), ("b", bad)])
    assert [(c.setup, c.name, c.outcome) for c in checks if c.outcome == "FAIL"] == [
        ("b", "machine CPU busy", "FAIL")]
    assert len(checks) == 6
    older = trust_checks([("c", {"trustworthy": False, "reasons": ["why"]})])
    assert [(c.name, c.passed, c.statement) for c in older] == [("emulator kept up", False, "why")]


# --- run ids and titles -----------------------------------------------------------------------


def test_new_run_id_format():
    before = datetime.datetime.now().replace(microsecond=0)
    run_id = new_run_id("fattree-allreduce")
    after = datetime.datetime.now()
    match = re.fullmatch(r"(\d{8}-\d{6})-fattree-allreduce-([0-9a-f]{4})", run_id)
    assert match, run_id
    assert before <= datetime.datetime.strptime(match.group(1), "%Y%m%d-%H%M%S") <= after


def test_new_run_ids_differ():
    assert len({new_run_id("x") for _ in range(50)}) >= 45


def test_plot_titles_name_the_run_topology_and_rate():
    summary = {"run_id": "r1", "link_rate_mbit": 6.0,
               "setups": {"fabric": {"fabric": {"label": "fattree k=4"}}}}
    assert plot_title(summary) == "r1 | fattree k=4 | 6 Mbit/s links"


# --- progress ----------------------------------------------------------------------------------


def test_eta_at_the_pace_so_far():
    assert eta_s(0, 4, 10.0) is None and eta_s(2, None, 10.0) is None
    assert eta_s(1, 4, 10.0) == pytest.approx(30.0)
    assert describe("AllReduce", 3, 4, 21.0, "rank 0") == (
        "AllReduce: 3/4, 21.0 s elapsed, about 7 s left (rank 0)")


def test_progress_logs_the_end_once_and_otherwise_at_most_every_interval():
    lines: list[str] = []
    progress = Progress(log=lines.append, live=False, every_s=3600)
    with progress.phase("work", total=3) as phase:
        phase.advance()
        phase.advance()  # within the interval: not logged
        phase.advance()  # finished: logged once
        phase.update(3)  # the same again: not logged twice
    assert [line.split(",")[0] for line in lines] == ["work: 3/3", "work: done in 0.0 s"]


# --- reports (more in test_report.py) ---------------------------------------------------------


def test_checks_table_shows_not_judged_and_setups():
    rows = checks_table([Check("x", None, ">= 1", None, "", None, "", "n2").to_dict()])
    assert rows[1] == ["n/a", "x", "-", ">= 1", "-", "", "n2", ""]


# --- exit status -----------------------------------------------------------------------------


@pytest.mark.parametrize(("status", "checks", "trust", "flags", "code"), [
    (COMPLETE, [at_least("a", 1, 0, "")], [at_least("t", 1, 0, "")], (), 0),
    (COMPLETE, [at_least("a", 0, 1, "")], [at_least("t", 1, 0, "")], (), 1),
    (COMPLETE, [at_least("a", 0, 1, "")], [at_least("t", 1, 0, "")], (True, False), 0),
    (COMPLETE, [], [at_least("t", 0, 1, "")], (), 1),
    (COMPLETE, [], [at_least("t", 0, 1, "")], (False, True), 0),
    (FAILED, [], [at_least("t", 1, 0, "")], (True, True), 1),
])
def test_exit_status(tmp_path, status, checks, trust, flags, code):
    outcome = Outcome({"status": status}, tmp_path, Verdict(checks, trust))
    assert outcome.exit_status(*flags) == code


# --- queue plans from the scenario's queue section --------------------------------------------


def test_queue_plan_without_a_section_is_none():
    assert queue_plan(None, 10.0, MTU, fat_tree(4)) == (None, None)


def test_queue_plan_defaults_the_buffer_to_50_ms_and_records_why():
    queue, record = queue_plan(QueueSpec(), 20.0, MTU, fat_tree(4))
    assert queue.buffer_bytes == 125_000 and not queue.uses_classes and queue.ecn is None
    assert record["buffer_rule"].startswith("50 ms")


def test_queue_plan_with_pfc_and_ecn_sizes_headroom_per_feeding_port():
    fabric = fat_tree(4, host_rate_mbit=20.0)
    queue, record = queue_plan(QueueSpec(buffer_bytes=600_000, pfc=True, ecn={"scheme": "dctcp"}),
                               20.0, MTU, fabric)
    assert queue.uses_classes and queue.pfc is not None and queue.ecn is not None
    assert record["pfc"]["fan_in"] == 3  # a k=4 switch's 4 ports, less the congested one
    assert queue.pfc.xoff_bytes + queue.pfc.headroom_bytes <= 600_000


def test_queue_plan_errors_name_the_field_inside_queue():
    with pytest.raises(ConfigError) as info:
        queue_plan(QueueSpec(buffer_bytes=3000, pfc=True), 20.0, MTU, fat_tree(4))
    assert info.value.field == "queue.buffer_bytes"


# --- the failure schedule ---------------------------------------------------------------------


def test_the_schedule_applies_each_event_at_its_time_in_order():
    net = StandInFabric(fat_tree(4))
    events = [FailureEvent(0.2, "link_up", ("a", "b")), FailureEvent(0.05, "link_down", ("a", "b")),
              FailureEvent(0.1, "controller_restart"), FailureEvent(0.15, "switch_down",
                                                                     switch="s1")]
    with FailureSchedule(net, events, log=lambda m: None) as schedule:
        t0 = schedule.t0
        time.sleep(0.4)
    assert [c[0] for c in net.calls] == ["link", "controller", "switch", "link"]
    assert [c[3] if c[0] == "link" else None for c in net.calls][::3] == [False, True]
    offsets = [c[-1] - t0 for c in net.calls]
    assert all(abs(o - at) < 0.05 for o, at in zip(offsets, (0.05, 0.1, 0.15, 0.2))), offsets
    assert [r["event"] for r in schedule.applied] == [
        "link_down a-b", "controller_restart", "switch_down s1", "link_up a-b"]
    assert schedule.applied[1]["reprogrammed_s"] == 0.25


def test_the_schedule_stops_with_the_workload_and_records_failures():
    net = StandInFabric(fat_tree(4))

    def broken(a, b, up):
        raise RuntimeError("no such interface")
    net.set_link = broken
    with FailureSchedule(net, [FailureEvent(0.0, "link_down", ("a", "b")),
                               FailureEvent(30.0, "switch_up", switch="s1")],
                         log=lambda m: None) as schedule:
        time.sleep(0.1)
    assert schedule.applied == [{"at_s": 0.0, "event": "link_down a-b", "action": "link_down",
                                 "target": "a-b", "error": "no such interface"}]
    assert net.calls == []  # the switch event never came: the block ended first


def test_a_list_parameter_refuses_a_value_twice():
    from testbed.harness.experiment import distinct

    assert distinct([2, 4]) == [2, 4]
    with pytest.raises(ValueError, match=r"lists a mode twice: \['bsp', 'bsp'\]"):
        distinct(["bsp", "bsp"], "a mode")
    # compared by keys: two spellings of one sweep
    with pytest.raises(ValueError, match="lists a sweep twice"):
        distinct(["allreduce", "allreduce:ring"], "a sweep", [("allreduce", "ring")] * 2)
