"""While a workload runs, the daemons a fabric cannot do without are watched: the run's own
ovs-vswitchd (the switches) and the PFC pause agent (what makes the lossless class lossless).
One that dies ends the workload at once (every process the hosts run is killed, so the ranks
or flows waiting on a dead fabric stop instead of hanging until their timeouts), and the
harness ends the run with one line naming it (testbed.harness.run.measure_setup). Without the
watchdog a killed ovs-vswitchd left the ranks waiting for minutes, and a killed pause agent
went unnoticed until the verdict.

The controller is not watched: the switches keep forwarding without it (fail-secure), and a
failure schedule restarts it on purpose.
"""
from __future__ import annotations

from testbed.apply.background import Background
from testbed.apply.state import exit_description

POLL_S = 0.2
CONSEQUENCES = {  # what a fabric without the daemon no longer does
    "ovs-vswitchd": "the switches stopped forwarding",
    "the PFC pause agent": "pauses were no longer sent or obeyed, so the lossless class was "
                           "no longer lossless",
}


def death_line(name: str, pid: int, returncode: int | None) -> str:
    """``ovs-vswitchd (pid 812) died during the workload: killed by SIGKILL; the switches
    stopped forwarding``."""
    consequence = CONSEQUENCES.get(name)
    return (f"{name} (pid {pid}) died during the workload: {exit_description(returncode)}"
            + (f"; {consequence}" if consequence else ""))


def dead_daemons(vital: list[tuple[str, object]]) -> list[str]:
    """One line per daemon of ``vital`` ((name, subprocess.Popen) pairs) that has ended."""
    return [death_line(name, proc.pid, proc.returncode) for name, proc in vital
            if proc.poll() is not None]


class Watchdog:
    """Watches ``net``'s vital daemons (``net.vital_daemons()``) every ``poll_s`` for the
    block; on a death it logs the line and ends the workload (``net.end_workload()``).
    ``died_now()`` looks once more and returns the line (None while all live)."""

    def __init__(self, net, log=print, poll_s: float = POLL_S):
        self.net = net
        self.log = log
        self.poll_s = poll_s
        self.died: str | None = None
        self.loop = Background(self._run)

    def __enter__(self) -> Watchdog:
        if self.net.vital_daemons():
            self.loop.start()
        return self

    def __exit__(self, *exc) -> None:
        self.loop.stop()

    def died_now(self) -> str | None:
        if self.died is None:
            dead = dead_daemons(self.net.vital_daemons())
            self.died = dead[0] if dead else None
        return self.died

    def _run(self) -> None:
        while not self.loop.stopping.wait(self.poll_s):
            if self.died_now():
                self.log(self.died)
                self.net.end_workload()
                return
