"""Progress of long work: the phase, how far it is (iteration k of n), elapsed time and an
estimate of what is left. On a terminal a live line (rich); elsewhere (CI logs, pipes) a log
line when a phase starts and ends and at most every ``every_s`` in between."""
from __future__ import annotations

import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)
from rich.progress import Progress as RichProgress

LOG_EVERY_S = 10.0


def eta_s(done: float, total: float | None, elapsed_s: float) -> float | None:
    """Seconds left at the pace so far; None before any progress or without a total."""
    if not total or done <= 0:
        return None
    return elapsed_s * (total - done) / done


def describe(name: str, done: float, total: float | None, elapsed_s: float,
             note: str = "") -> str:
    """``AllReduce: 2/4 iterations, 10.5 s elapsed, about 10 s left (note)``."""
    parts = [f"{name}: "]
    parts.append(f"{done:g}/{total:g}" if total else f"{done:g}")
    parts.append(f", {elapsed_s:.1f} s elapsed")
    left = eta_s(done, total, elapsed_s)
    if left is not None and done < total:
        parts.append(f", about {left:.0f} s left")
    if note:
        parts.append(f" ({note})")
    return "".join(parts)


class Phase:
    """One phase of work; ``advance`` or ``update`` as it goes."""

    def __init__(self, owner: Progress, name: str, total: float | None):
        self.owner = owner
        self.name = name
        self.total = total
        self.done = 0.0
        self.note = ""
        self.t0 = time.monotonic()
        self._last_log = self.t0
        self._logged_done = None
        self._task = None

    @property
    def elapsed_s(self) -> float:
        return time.monotonic() - self.t0

    def update(self, done: float, note: str = "") -> None:
        self.done = done
        self.note = note or self.note
        self.owner._show(self)

    def advance(self, step: float = 1, note: str = "") -> None:
        self.update(self.done + step, note)

    def line(self) -> str:
        return describe(self.name, self.done, self.total, self.elapsed_s, self.note)


class Progress:
    """Where progress goes: a live display on a terminal, else ``log`` lines."""

    def __init__(self, log: Callable[[str], None] = print, live: bool | None = None,
                 every_s: float = LOG_EVERY_S):
        self.log = log
        self.live = sys.stdout.isatty() if live is None else live
        self.every_s = every_s
        self._rich: RichProgress | None = None

    @contextmanager
    def phase(self, name: str, total: float | None = None) -> Iterator[Phase]:
        phase = Phase(self, name, total)
        if self.live:
            with RichProgress(TextColumn("{task.description}"), BarColumn(),
                              MofNCompleteColumn(), TimeElapsedColumn(), TextColumn("left"),
                              TimeRemainingColumn(), console=Console(), transient=True) as bar:
                phase._task = bar.add_task(name, total=total)
                self._rich = bar
                try:
                    yield phase
                finally:
                    self._rich = None
        else:
            yield phase
        self.log(f"{name}: done in {phase.elapsed_s:.1f} s"
                 + (f" ({phase.note})" if phase.note else ""))

    def _show(self, phase: Phase) -> None:
        if self._rich is not None and phase._task is not None:
            description = phase.name + (f" ({phase.note})" if phase.note else "")
            self._rich.update(phase._task, completed=phase.done, description=description)
            return
        now = time.monotonic()
        finished = phase.total is not None and phase.done >= phase.total
        if finished and phase._logged_done == phase.done:
            return
        if now - phase._last_log >= self.every_s or finished:
            phase._last_log = now
            phase._logged_done = phase.done
            self.log(phase.line())


class QuietProgress(Progress):
    """Progress that shows nothing (tests, the Python API unless asked)."""

    def __init__(self):
        super().__init__(log=lambda message: None, live=False)
