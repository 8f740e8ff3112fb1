"""Judging runs against the fault table (testbed.chaos.outcome): each expected outcome holds
only when every part of it does, a run that must fail and claims verified data is counted,
and the suite passes only with every promise kept."""
from __future__ import annotations

from dataclasses import replace

import pytest

from testbed.chaos.outcome import (
    Observation,
    claims_verified,
    judge,
    row_summaries,
    suite_verdict,
)
from testbed.chaos.plan import PROFILES, WORKLOADS, SuitePlan, Trial
from testbed.chaos.table import (
    BASELINE,
    FAILED_LOUDLY,
    FAULTS,
    PASSES,
    RECOVERED,
    REFUSED,
    SURVIVED,
)

RING = WORKLOADS["allreduce"].integrity
NOTHING: dict = {"veths": [], "processes": []}


def summary(status="complete", verified="PASS", rate="PASS", **results) -> dict:
    return {"status": status, "results": {"fabric": results},
            "verdict": {"checks": [{"name": "data verified on every rank", "outcome": verified},
                                   {"name": "busbw / link rate", "outcome": rate}]}}


def trial(fault: str, expected: str, **more) -> Trial:
    return Trial(1, fault, "allreduce", 5, expected, within_s=100.0, **more)


def test_verified_means_complete_and_every_integrity_check_passed():
    assert claims_verified(summary(), RING)
    assert claims_verified(summary(rate="FAIL"), RING)  # a fault may cost rate
    assert not claims_verified(summary(verified="n/a"), RING)
    assert not claims_verified(summary(status="failed"), RING)
    assert not claims_verified(None, RING)
    assert not claims_verified(summary(rate="FAIL"), ())  # no integrity named: every check
    assert claims_verified(summary(), ())


def test_a_survived_fault_completes_verified_with_its_schedule_applied_and_healed():
    t = trial("link-flap", SURVIVED)
    healed = {"failures": [{"event": "link_down a-b"}],
              "fault_windows": [{"fault": "link_down a-b", "end_monotonic_s": 3.0}]}
    ok = judge(t, Observation(1, 40.0, summary=summary(rate="FAIL", **healed),
                              leftovers=NOTHING), RING)
    assert ok.held and ok.verified and not ok.wrongly_verified
    never_healed = {"fault_windows": [{"fault": "link_down a-b", "end_monotonic_s": None}]}
    v = judge(t, Observation(0, 40.0, summary=summary(**never_healed)), RING)
    assert not v.held and v.reasons == ["fabric: link_down a-b was never healed"]
    failed_step = {"failures": [{"event": "kill traffic on h1", "error": "no traffic process"}]}
    assert judge(t, Observation(0, 40.0, summary=summary(**failed_step)), RING).reasons == [
        "fabric: kill traffic on h1 failed: no traffic process"]
    v = judge(t, Observation(3, 40.0, stderr="testbed: error: x\n"), RING)
    assert v.reasons == ["exit 3: the run did not complete", "data not verified"]


def loud(stderr: str, status: int = 3, elapsed_s: float = 30.0, **more) -> Observation:
    return Observation(status, elapsed_s, stderr=stderr, **{"leftovers": NOTHING, **more})


DIED = ("testbed: error: ovs-vswitchd (pid 812) died during the workload: killed by SIGKILL; "
        "the switches stopped forwarding\n")


def test_a_loud_failure_is_exit_3_in_time_one_line_naming_what_died():
    t = trial("vswitchd-kill", FAILED_LOUDLY)
    v = judge(t, loud(DIED), RING)
    assert v.held and not v.verified and not v.wrongly_verified
    assert v.observed.startswith("exit 3 after 30 s: ovs-vswitchd (pid 812) died")
    assert judge(t, loud(DIED, elapsed_s=101.0), RING).reasons == [
        "took 101 s, more than its 100 s"]
    assert judge(t, loud("Traceback (most recent call last):\n" + DIED), RING).reasons == [
        "2 lines on stderr, not one (first: Traceback (most recent call last):)"]
    assert judge(t, loud("testbed: error: rank 3 died: killed by SIGTERM\n"), RING).reasons == [
        r"no line on stderr names what died (/ovs-vswitchd \(pid \d+\) died/)"]
    v = judge(t, loud("", status=0, summary=summary()), RING)
    assert v.wrongly_verified and "reported as verified (exit 0 or verified data) though it " \
        "must fail" in v.reasons


def test_a_hung_run_and_leftovers_never_hold():
    t = trial("rank-stop", FAILED_LOUDLY)
    hung = Observation(None, 220.0, hung=True, leftovers=NOTHING)
    assert "did not end within 100 s (ended as hung)" in judge(t, hung, RING).reasons
    left = loud("testbed: error: AllReduce iterations: rank 5 was stopped (SIGSTOP) and it "
                "did not finish in 60 s\n",
                leftovers={"processes": ["pid 9: mininet:p0e0h0"], "veths": []})
    v = judge(t, left, RING)
    assert v.reasons == ["left behind: 1 processes (pid 9: mininet:p0e0h0)"] and v.leftovers == 1


def test_a_refused_run_creates_nothing():
    t = trial("concurrent-run", REFUSED)
    line = ("testbed: error: another testbed run is active (pid 1, run holder); one emulation "
            "per machine at a time: wait for it to finish\n")
    assert judge(t, loud(line), RING).held
    assert judge(t, loud(line, created=["20260101-x"]), RING).reasons == [
        "created 20260101-x in the results folder"]


def killed(clean=0, nxt: Observation | None = None, landed="workload") -> Observation:
    return Observation(None, 12.0, leftovers=NOTHING, landed=landed, clean_status=clean,
                       next_run=nxt)


def test_a_killed_run_is_recovered_by_clean_and_the_next_run_passes():
    t = trial("sigkill-workload", RECOVERED, kill_phase="workload", kill_fraction=0.5)
    passing = Observation(0, 30.0, summary=summary(), leftovers=NOTHING)
    v = judge(t, killed(nxt=passing), RING)
    assert v.held and v.verified and not v.wrongly_verified
    assert v.observed == "killed in workload, clean exit 0, next run exit 0"
    assert judge(t, killed(clean=3, nxt=passing), RING).reasons == ["testbed clean exited 3"]
    failing = Observation(3, 30.0, stderr="testbed: error: busy\n", leftovers=NOTHING)
    assert judge(t, killed(nxt=failing), RING).reasons == [
        "the next run did not pass: exit 3 after 30 s: busy"]
    dirty = replace(passing, leftovers={"veths": ["p0e0-eth1 (veth)"]})
    assert judge(t, killed(nxt=dirty), RING).reasons == [
        "the next run left behind: 1 veths (p0e0-eth1 (veth))"]


def test_a_kill_that_came_after_the_run_ended_is_a_plain_run_not_a_wrong_verdict():
    from testbed.chaos.outcome import ENDED

    t = trial("sigkill-tear-down", RECOVERED, kill_phase="tear-down", kill_fraction=0.9)
    missed = Observation(0, 30.0, summary=summary(), leftovers=NOTHING, landed=ENDED,
                         clean_status=0, next_run=Observation(0, 30.0, summary=summary(),
                                                              leftovers=NOTHING))
    v = judge(t, missed, RING)
    assert v.held and not v.wrongly_verified
    assert not judge(t, replace(missed, summary=summary(verified="FAIL")), RING).held


def test_a_plain_run_must_exit_0_verified():
    t = trial(BASELINE, PASSES)
    assert judge(t, Observation(0, 30.0, summary=summary(), leftovers=NOTHING), RING).held
    assert judge(t, Observation(1, 30.0, summary=summary(rate="FAIL")), RING).reasons == [
        "exit 1, not 0"]


def every_row_done(kills_per_phase: int = 1) -> list[tuple]:
    """One held run per row of the table (kills_per_phase per phase), verified survivals."""
    done = []
    passing = Observation(0, 30.0, summary=summary(), leftovers=NOTHING)
    for i, fault in enumerate(FAULTS):
        for _ in range(kills_per_phase if fault.phase else 1):
            t = Trial(i, fault.key, fault.workloads[0], 1, fault.expected,
                      kill_phase=fault.phase, within_s=100.0)
            if fault.phase:
                obs = killed(nxt=passing, landed=fault.phase)
            elif fault.expected == SURVIVED:
                obs = passing
            else:
                obs = loud("testbed: error: fine\n")
            done.append((t, judge(t, obs, WORKLOADS[fault.workloads[0]].integrity), obs))
    return done


def plan(profile: str = "ci") -> SuitePlan:
    return SuitePlan(1, PROFILES[profile], ())


def test_the_suite_passes_with_every_promise_kept():
    done = every_row_done()
    for t, v, _ in done:  # the loud stand-in line names nothing: hold them by hand
        v.held, v.reasons = True, []
    verdict = suite_verdict(plan(), done, wall_s=500.0, not_run=[])
    assert verdict.passed, verdict.reasons
    assert verdict.kills == {"bring-up": 1, "workload": 1, "tear-down": 1}
    assert verdict.counts["faults_injected"] == len(FAULTS)
    assert verdict.counts["survived_verified"] == 3


@pytest.mark.parametrize(("change", "reason"), [
    (lambda done: done[:-1], "0 SIGKILLs landed in tear-down, 1 needed"),
    (lambda done: [d for d in done if d[0].fault != "rank-stop"], "rows never run: rank-stop"),
    (lambda done: [d for d in done if d[0].expected != SURVIVED],
     "no survivable fault ended with its data verified"),
])
def test_the_suite_fails_without_each_promise(change, reason):
    done = every_row_done()
    for _, v, _ in done:
        v.held, v.reasons = True, []
    verdict = suite_verdict(plan(), change(done), wall_s=500.0, not_run=[])
    assert not verdict.passed and reason in verdict.reasons


def test_the_suite_fails_over_its_budget_with_wrong_verdicts_or_leftovers():
    done = every_row_done()
    for _, v, _ in done:
        v.held, v.reasons = True, []
    done[3][1].wrongly_verified = True
    done[4][1].leftovers = 2
    verdict = suite_verdict(plan(), done, wall_s=601.0, not_run=[done[0][0]])
    assert verdict.reasons == ["1 runs reported data verified that must fail",
                               "2 things left behind",
                               "1 runs not started: the suite was over its 10 minutes",
                               "took 10.0 minutes, over its 10"]
    five = suite_verdict(plan("full"), every_row_done(kills_per_phase=4), 500.0, [])
    assert "4 SIGKILLs landed in bring-up, 5 needed" in five.reasons


def test_rows_count_runs_held_and_what_was_seen():
    done = every_row_done(kills_per_phase=2)
    rows = {r["fault"]: r for r in row_summaries(done)}
    assert rows[BASELINE]["runs"] == 0
    assert rows["sigkill-workload"]["runs"] == 2
    assert rows["sigkill-workload"]["observed"] == "killed in workload x2"
    assert rows["link-flap"]["held"] == 1 and rows["link-flap"]["observed"] == "exit 0 x1"
