"""A helper process beside a running fabric (the PFC pause agent, ``testbed.apply.pfc_agent``;
the ECN anchor agent, ``testbed.apply.ecn_anchor``): both sides of its life, written once.

The launcher's side, ``AgentProcess``: write the agent's plan into the run's folder, start
``python -m MODULE PLAN WORKDIR`` (pinned to chosen CPUs) in a session of its own, record its
PID in the run ledger at once (so ``testbed clean`` ends it after a crash), wait for its ready
file (a timeout, and the log's tail if it exits first), stop it by PID, read back the counters
JSON it keeps.

The agent's side: its command line (``agent_arguments``) and stop signals
(``stop_on_signals``), ``realtime_priority`` (a real-time class, guarded by RLIMIT_RTTIME),
``quantiles`` of its poll gaps (or a ``Histogram`` of them, for a long run), and ``write_json``
for the counters file it rewrites while it runs (atomically: the launcher may read it at any
moment).
"""
from __future__ import annotations

import json
import os
import resource
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterable, Sequence
from pathlib import Path

from testbed.apply.state import Ledger
from testbed.errors import TestbedError
from testbed.system.process import stop_process

# From launch to its ready file: the agent imports scapy and opens a socket per interface.
# Seconds on the host; under software emulation (the stock-kernel VM suite, about ten times
# slower) the pause agent of a k=4 fat-tree took longer than 30 s.
START_TIMEOUT_S = 120.0
STOP_TIMEOUT_S = 5.0
READY_POLL_S = 0.05
LOG_TAIL_CHARS = 400
REALTIME_PRIORITY = 10
REALTIME_BUDGET_S = 0.5  # CPU time a real-time thread may use between two blocking calls


# --- the agent's side -------------------------------------------------------------------------


def realtime_priority() -> str:
    """Run ahead of the emulation's busy processes: a pause (or a queue reading) that waits
    for a CPU behind ovs-vswitchd and the traffic generators arrives too late to matter. An
    agent sleeps between polls, so a real-time class costs the others only what it uses;
    should a thread ever spin, RLIMIT_RTTIME ends the agent (SIGXCPU, then SIGKILL) once it
    has run ``REALTIME_BUDGET_S`` without blocking, instead of starving the machine. Returns
    the class it got ("SCHED_FIFO", or "normal" where it may not)."""
    try:
        budget_us = int(REALTIME_BUDGET_S * 1e6)
        resource.setrlimit(resource.RLIMIT_RTTIME, (budget_us, 2 * budget_us))
        os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(REALTIME_PRIORITY))
        return "SCHED_FIFO"
    except (OSError, AttributeError):
        return "normal"


def quantiles(values: list[float]) -> dict:
    """Count, median, 99th percentile and maximum of sorted ``values`` (e.g. poll gaps)."""
    if not values:
        return {"count": 0}
    pick = lambda q: round(values[min(len(values) - 1, int(q * len(values)))], 3)  # noqa: E731
    return {"count": len(values), "p50": pick(0.5), "p99": pick(0.99), "max": round(values[-1], 3)}


class Histogram:
    """A long series (e.g. poll gaps in ms) in constant memory and time: counts in bins of
    ``width`` (values past the last bin count in it) and the exact maximum. Its quantiles
    are those of ``quantiles``, each rounded up to its bin's upper edge (never above the
    maximum), so an agent can report them every second without sorting its history."""

    def __init__(self, width: float, bins: int = 2000):
        if width <= 0 or bins < 1:
            raise ValueError(f"need width > 0 and bins >= 1, got {width!r}, {bins!r}")
        self.width = width
        self.counts = [0] * bins
        self.count = 0
        self.max = 0.0

    def add(self, value: float) -> None:
        self.counts[min(max(0, int(value / self.width)), len(self.counts) - 1)] += 1
        self.count += 1
        self.max = max(self.max, value)

    def _at_rank(self, rank: int) -> float:
        seen = 0
        for i, n in enumerate(self.counts):
            seen += n
            if seen > rank:
                return min((i + 1) * self.width, self.max)
        return self.max

    def quantiles(self) -> dict:
        if not self.count:
            return {"count": 0}
        pick = lambda q: round(self._at_rank(min(self.count - 1, int(q * self.count))), 3)  # noqa: E731
        return {"count": self.count, "p50": pick(0.5), "p99": pick(0.99),
                "max": round(self.max, 3)}


def agent_arguments(module: str, argv: list[str]) -> tuple[dict, Path] | None:
    """An agent's command line, ``PLAN_JSON WORKDIR``: the plan (parsed) and the folder; None,
    after a usage line on stderr, when it is not that."""
    if len(argv) != 2:
        print(f"usage: python -m {module} PLAN_JSON WORKDIR", file=sys.stderr)
        return None
    return json.loads(Path(argv[0]).read_text()), Path(argv[1])


def stop_on_signals(stop: threading.Event) -> None:
    """SIGTERM (the launcher's stop) and SIGINT set ``stop``: the agent's loop ends, and it
    writes its counters on the way out."""
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())


def write_json(path: Path, data: dict) -> None:
    """Replace ``path`` with ``data`` in one step: a reader never sees half a file."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data))
    tmp.replace(path)


# --- the launcher's side ----------------------------------------------------------------------


class AgentProcess:
    """One agent of a running fabric, as a process recorded in the run's ledger. A subclass
    names its module, what it is called in messages and its files in ``workdir``."""

    module = ""  # run as ``python -m module PLAN WORKDIR``
    title = "the agent"
    plan_file = log_file = ready_file = counters_file = ""

    def __init__(self, workdir: Path, ledger: Ledger, log=print):
        self.workdir = workdir
        self.ledger = ledger
        self.log = log
        self.proc: subprocess.Popen | None = None

    def launch(self, plan: dict, cpus: Sequence[int] = (), stale: Iterable[str] = ()) -> None:
        """Write ``plan`` and start the agent on ``cpus`` (empty: any); returns once it wrote
        its ready file. ``stale``: more files of an earlier start to remove first."""
        for name in (self.ready_file, self.counters_file, *stale):
            (self.workdir / name).unlink(missing_ok=True)
        plan_path = self.workdir / self.plan_file
        plan_path.write_text(json.dumps(plan, indent=1))
        with open(self.workdir / self.log_file, "ab") as log:
            pin = ["taskset", "-c", ",".join(map(str, cpus))] if cpus else []
            self.proc = subprocess.Popen(
                [*pin, sys.executable, "-m", self.module, str(plan_path), str(self.workdir)],
                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                start_new_session=True)
        self.ledger.add_process(self.proc.pid)
        deadline = time.monotonic() + START_TIMEOUT_S
        while not (self.workdir / self.ready_file).exists():
            if self.proc.poll() is not None:
                raise TestbedError(f"{self.title} exited ({self.proc.returncode}): "
                                   f"{self.log_tail()}")
            if time.monotonic() > deadline:
                raise TestbedError(f"{self.title} did not start within {START_TIMEOUT_S:.0f} s; "
                                   f"see {self.workdir / self.log_file}")
            time.sleep(READY_POLL_S)

    def log_tail(self) -> str:
        try:
            return (self.workdir / self.log_file).read_text().strip()[-LOG_TAIL_CHARS:]
        except OSError:
            return "no log"

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None else None

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self) -> None:
        """Stop the agent by PID (it writes its final counters on the way out)."""
        stop_process(self.proc, STOP_TIMEOUT_S)

    def counters(self) -> dict:
        """The counters the agent wrote last ({} before it wrote any)."""
        try:
            return json.loads((self.workdir / self.counters_file).read_text())
        except (OSError, ValueError):
            return {}
