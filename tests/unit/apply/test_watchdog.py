"""The watchdog over a fabric's vital daemons (testbed.apply.watchdog): a daemon that dies
is named in one line with how it ended and what the fabric no longer does, and the workload
is ended at once; with every daemon alive nothing happens. Real child processes stand in for
ovs-vswitchd and the pause agent, watched on the stand-in fabric."""
from __future__ import annotations

import subprocess
import sys
import time

from tests.unit.stand_ins import StandInFabric

from testbed.apply.pfc_runtime import PauseAgentProcess
from testbed.apply.watchdog import Watchdog, dead_daemons, death_line
from testbed.model.topology.line import line

NOTICE_S = 5.0  # the watchdog polls every 0.2 s; generous for a loaded machine


def watched(vital) -> StandInFabric:
    return StandInFabric(line(2, 10.0), vital=vital)


def sleeper() -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])


def test_a_death_line_names_the_daemon_how_it_ended_and_what_stopped():
    assert death_line("ovs-vswitchd", 812, -9) == (
        "ovs-vswitchd (pid 812) died during the workload: killed by SIGKILL; the switches "
        "stopped forwarding")
    assert death_line(PauseAgentProcess.title, 90, 1) == (
        "the PFC pause agent (pid 90) died during the workload: exited with status 1; pauses "
        "were no longer sent or obeyed, so the lossless class was no longer lossless")


def test_a_killed_daemon_ends_the_workload_and_is_the_error():
    alive, doomed = sleeper(), sleeper()
    try:
        net = watched([("ovs-vswitchd", alive), ("ovs-vswitchd", doomed)])
        lines = []
        with Watchdog(net, lines.append) as watchdog:
            assert watchdog.died_now() is None
            doomed.kill()
            deadline = time.monotonic() + NOTICE_S
            while not net.workloads_ended and time.monotonic() < deadline:
                time.sleep(0.05)
        expected = (f"ovs-vswitchd (pid {doomed.pid}) died during the workload: killed by "
                    "SIGKILL; the switches stopped forwarding")
        assert net.workloads_ended == 1 and lines == [expected]
        assert watchdog.died_now() == expected
        assert dead_daemons(net.vital) == [expected]
    finally:
        for proc in (alive, doomed):
            proc.kill()
            proc.wait()


def test_nothing_happens_while_every_daemon_lives_or_when_there_is_none():
    proc = sleeper()
    try:
        net = watched([(PauseAgentProcess.title, proc)])
        with Watchdog(net, lambda m: None, poll_s=0.01) as watchdog:
            time.sleep(0.2)
        assert watchdog.died_now() is None and net.workloads_ended == 0
    finally:
        proc.kill()
        proc.wait()
    empty = watched([])
    with Watchdog(empty, lambda m: None) as watchdog:  # the machine's OVS, no PFC: no thread
        assert not watchdog.loop.running()
    assert watchdog.died_now() is None
