"""Stand-ins for what an experiment's ``measure`` and the ``testbed`` command touch on a
running fabric, so unit tests can drive them without root: a Watch whose fidelity verdict is
given, a SetupRun around a stand-in network, and ``run_scenario`` replaced by a recorder."""
from __future__ import annotations

from contextlib import nullcontext
from pathlib import Path

import testbed.harness.run
from testbed.harness.progress import QuietProgress
from testbed.harness.run import Outcome
from testbed.measure.fidelity import judge
from testbed.model.verdict import Verdict

WINDOW_OFFSET_S = 100.0  # the stand-in sampler started this long before CLOCK_MONOTONIC's 0


class StandInWatch:
    """testbed.measure.fidelity.Watch with nothing sampled: no switch lost a packet, the CPU
    was 30% busy and the busiest link carried 98% of its rate; ``asked`` keeps what the
    verdict was asked about."""

    switches = {"rx_packets": 1000, "tx_packets": 1000, "queue_drops": 0}
    t_start, t_end = 1.0, 2.0

    def __init__(self):
        self.asked = None

    def __enter__(self) -> StandInWatch:
        return self

    def __exit__(self, *exc) -> None:
        pass

    def window_s(self, t0_monotonic: float, t1_monotonic: float) -> tuple[float, float]:
        return t0_monotonic - WINDOW_OFFSET_S, t1_monotonic - WINDOW_OFFSET_S

    def emulator_lost(self) -> int:
        return 0

    def verdict(self, window_s=None, bottleneck=None, bandwidth_bound=True, setup=None):
        self.asked = (window_s, bottleneck, bandwidth_bound)
        return judge(0.3, 1.0, 0.98, 0.0, bandwidth_bound, setup)


class StandInRun:
    """testbed.harness.experiment.SetupRun around a stand-in network: quiet, its queues not
    monitored, its Watch ``watched``."""

    def __init__(self, net, setup, workdir: Path):
        self.net, self.setup, self.workdir = net, setup, workdir
        self.log = lambda message: None
        self.progress = QuietProgress()
        self.watched = StandInWatch()

    def watch(self) -> StandInWatch:
        return self.watched

    def queues(self, report: dict):
        return nullcontext()


def record_runs(monkeypatch) -> list:
    """Replace ``run_scenario``: the scenarios the command resolves are kept in the returned
    list instead of run."""
    runs = []

    def fake_run(resolved, log=print, progress=None):
        runs.append(resolved)
        summary = {"run_id": "r1", "title": "t", "headline": "h", "status": "complete",
                   "error": None, "results_dir": "results/r1", "rows": [], "verdict": None}
        return Outcome(summary, Path("results/r1"), Verdict())

    monkeypatch.setattr(testbed.harness.run, "run_scenario", fake_run)
    return runs
