"""The watchdog over a fabric's vital daemons (testbed.apply.watchdog): a daemon that dies
is named in one line with how it ended and what the fabric no longer does, and the workload
is ended at once; with every daemon alive nothing happens. Real child processes stand in for
ovs-vswitchd and the pause agent."""
from __future__ import annotations

import subprocess
import sys
import time

from testbed.apply.pfc_runtime import PauseAgentProcess
from testbed.apply.watchdog import Watchdog, dead_daemons, death_line

NOTICE_S = 5.0  # the watchdog polls every 0.2 s; generous for a loaded machine


class StandInNet:
    def __init__(self, vital):
        self.vital = vital
        self.ended = 0

    def vital_daemons(self):
        return self.vital

    def end_workload(self):
        self.ended += 1


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
        net = StandInNet([("ovs-vswitchd", alive), ("ovs-vswitchd", doomed)])
        lines = []
        with Watchdog(net, lines.append) as watchdog:
            assert watchdog.died_now() is None
            doomed.kill()
            deadline = time.monotonic() + NOTICE_S
            while not net.ended and time.monotonic() < deadline:
                time.sleep(0.05)
        expected = (f"ovs-vswitchd (pid {doomed.pid}) died during the workload: killed by "
                    "SIGKILL; the switches stopped forwarding")
        assert net.ended == 1 and lines == [expected]
        assert watchdog.died_now() == expected
        assert dead_daemons(net.vital) == [expected]
    finally:
        for proc in (alive, doomed):
            proc.kill()
            proc.wait()


def test_nothing_happens_while_every_daemon_lives_or_when_there_is_none():
    proc = sleeper()
    try:
        net = StandInNet([(PauseAgentProcess.title, proc)])
        with Watchdog(net, lambda m: None, poll_s=0.01) as watchdog:
            time.sleep(0.2)
        assert watchdog.died_now() is None and net.ended == 0
    finally:
        proc.kill()
        proc.wait()
    empty = StandInNet([])
    with Watchdog(empty, lambda m: None) as watchdog:  # the machine's OVS, no PFC: no thread
        assert not watchdog.loop.running()
    assert watchdog.died_now() is None
