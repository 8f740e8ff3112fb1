"""The failure schedule (testbed.apply.failures.FailureSchedule) on the stand-in fabric: a
fault is healed at its time, or when the block ends first, even by an exception; a stopped
process is resumed, and only if it is still the process that was stopped; impairments start
and end on the link; every step is recorded with its action, target and time."""
from __future__ import annotations

import signal
import subprocess
import sys
import time

import pytest
from tests.unit.stand_ins import StandInFabric

from testbed.apply.failures import FailureSchedule
from testbed.apply.state import process_state
from testbed.harness.scenario import FailureSpec
from testbed.model.topology import build
from testbed.plan.fault_schedule import schedule_events
from testbed.plan.port_queue import Impairment

SETTLE_S = 0.3  # a schedule step is applied within this of its time on an idle machine


def fabric():
    return build("fattree", k=4, host_rate_mbit=6.0)


def asked(net: StandInFabric) -> list[tuple]:
    """What the schedule asked of the stand-in fabric, in order, without the times asked."""
    return [call[:-1] for call in net.calls]


def events(*items: dict, seed: int = 1):
    return schedule_events([FailureSpec.model_validate(i) for i in items], fabric(), seed)


def test_a_fault_is_healed_at_its_time():
    net = StandInFabric(fabric())
    with FailureSchedule(net, events({"at_s": 0.05, "for_s": 0.1, "action": "link_down",
                                      "link": ["p0e0", "p0a0"]}), log=lambda m: None) as s:
        time.sleep(SETTLE_S)
    assert asked(net) == [("link", "p0e0", "p0a0", False), ("link", "p0e0", "p0a0", True)]
    assert [(r["action"], r.get("at_exit", False)) for r in s.applied] == [
        ("link_down", False), ("link_up", False)]
    assert s.applied[0]["fault"] == 0 and s.applied[0]["target"] == "p0e0-p0a0"


def test_a_fault_still_on_when_the_block_ends_is_healed_even_by_an_exception():
    net = StandInFabric(fabric())
    lines = []
    with pytest.raises(RuntimeError, match="the workload broke"):
        with FailureSchedule(net, events(
                {"at_s": 0.0, "for_s": 3600, "action": "switch_down",
                 "switches": {"role": "core"}, "mode": "fixed", "value": 2},
                {"at_s": 3000, "for_s": 1, "action": "link_down", "link": ["p0e0", "p0a0"]}),
                lines.append) as s:
            time.sleep(SETTLE_S)
            raise RuntimeError("the workload broke")
    downs = [c for c in asked(net) if c[2] is False]
    ups = [c for c in asked(net) if c[2] is True]
    assert len(downs) == 2 and sorted(ups) == sorted((c[0], c[1], True) for c in downs)
    assert [r["at_exit"] for r in s.applied if r["action"] == "switch_up"] == [True, True]
    assert not any(c[0] == "link" for c in asked(net))  # never started: nothing to heal
    assert sum("as the schedule ended" in line for line in lines) == 2


def test_an_impairment_starts_and_ends_on_its_link():
    net = StandInFabric(fabric())
    with FailureSchedule(net, events({"at_s": 0.0, "for_s": 0.05, "action": "impair",
                                      "link": ["p0e0", "p0a0"], "loss_percent": 2}),
                         log=lambda m: None):
        time.sleep(SETTLE_S)
    assert asked(net) == [("impair", "p0e0", "p0a0", Impairment(loss_percent=2)),
                         ("impair", "p0e0", "p0a0", None)]


def sleeper() -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])


def test_a_stopped_process_is_resumed_when_the_fault_ends():
    proc = sleeper()
    try:
        net = StandInFabric(fabric(), signalled=[proc.pid])
        with FailureSchedule(net, events({"at_s": 0.0, "for_s": 3600, "action": "stop",
                                          "daemon": "traffic", "host": "p0e0h0"}),
                             log=lambda m: None) as s:
            time.sleep(SETTLE_S)
            assert process_state(proc.pid) == "T"
        assert process_state(proc.pid) in ("S", "R")
        assert [(r["action"], r["pids"]) for r in s.applied] == [("stop", [proc.pid]),
                                                                 ("resume", [proc.pid])]
    finally:
        proc.kill()
        proc.wait()


def test_a_stopped_process_that_died_meanwhile_is_not_signalled_again():
    proc = sleeper()
    net = StandInFabric(fabric(), signalled=[proc.pid])
    with FailureSchedule(net, events({"at_s": 0.0, "for_s": 3600, "action": "stop",
                                      "daemon": "traffic", "host": "p0e0h0"}),
                         log=lambda m: None) as s:
        time.sleep(SETTLE_S)
        proc.kill()  # what the harness does to a rank past its deadline
        proc.wait()
    assert s.applied[-1]["action"] == "resume" and s.applied[-1]["pids"] == []


def test_a_kill_signals_the_daemon_and_a_failed_step_is_recorded_and_the_run_goes_on():
    net = StandInFabric(fabric())

    def nothing_there(daemon, host, sig):
        raise RuntimeError(f"no {daemon} process in {host} to signal")
    net.signal_daemon = nothing_there
    with FailureSchedule(net, events({"at_s": 0.0, "action": "kill", "daemon": "traffic",
                                      "host": "p0e0h0"}), log=lambda m: None) as s:
        time.sleep(SETTLE_S)
    assert s.applied == [{"at_s": 0.0, "event": "kill traffic on p0e0h0", "action": "kill",
                          "target": "traffic on p0e0h0", "fault": 0,
                          "error": "no traffic process in p0e0h0 to signal"}]
    net = StandInFabric(fabric())
    with FailureSchedule(net, events({"at_s": 0.0, "action": "kill", "daemon": "ovs-vswitchd"}),
                         log=lambda m: None):
        time.sleep(SETTLE_S)
    assert asked(net) == [("signal", "ovs-vswitchd", None, signal.SIGKILL)]
