"""A scenario's failure schedule, applied to a running fabric while a workload runs: links and
switches going down and up, the controller restarting, links impaired, daemons stopped or
killed, each at its time (seconds after the schedule starts), in a thread of its own. The
events are plain data (testbed.plan.fault_schedule expands the scenario's entries); every
event applied is recorded with the CLOCK_MONOTONIC time it was applied, so the controller's
reactions (its events file) can be set against it. A fault with a heal (``for_s``) is always
healed: at its time, or when the block ends first, however it ends."""
from __future__ import annotations

import os
import signal
import time
from dataclasses import dataclass, field

from testbed.apply.background import Background
from testbed.apply.state import process_start_ticks
from testbed.plan.fault_schedule import (  # FailureEvent: the harness and tests import it here
    CONTROLLER_RESTART,
    IMPAIR,
    KILL,
    RESUME,
    STOP,
    UNIMPAIR,
    FailureEvent,
)

SIGNALS = {STOP: signal.SIGSTOP, KILL: signal.SIGKILL}  # RESUME: only what STOP stopped


@dataclass
class FailureSchedule:
    """Runs ``events`` against ``net`` (testbed.apply.network.FabricNetwork) from ``start()``
    until the last is applied or ``stop()``; ``applied`` lists what happened. On the way out
    every fault that started and is not healed yet is healed."""

    net: object
    events: list[FailureEvent]
    log: object = print
    applied: list[dict] = field(default_factory=list)

    def __post_init__(self):
        self.loop = Background(self._run)
        self._started: set[tuple] = set()  # (fault, target) of every fault started or tried
        self._done: set[FailureEvent] = set()
        self._stopped: dict[tuple, dict[int, int]] = {}  # (fault, target) -> PID: start ticks
        self.t0 = None

    def __enter__(self) -> FailureSchedule:
        if self.events:
            self.t0 = time.monotonic()
            self.loop.start()
        return self

    def __exit__(self, *exc) -> None:
        self.loop.stop()
        for heal in self.pending_heals():
            self._apply_and_record(heal, at_exit=True)

    def pending_heals(self) -> list[FailureEvent]:
        """The heals not applied yet of faults that were (or were tried to be) started."""
        return [e for e in self.events if e.heal and e not in self._done
                and (e.fault, e.target) in self._started]

    def _run(self) -> None:
        for event in sorted(self.events, key=lambda e: e.at_s):
            if self.loop.stopping.wait(max(0.0, self.t0 + event.at_s - time.monotonic())):
                return
            self._apply_and_record(event)

    def _apply_and_record(self, event: FailureEvent, at_exit: bool = False) -> None:
        record = {"at_s": event.at_s, "event": event.describe(), "action": event.action,
                  "target": event.target}
        if event.fault is not None:
            record["fault"] = event.fault
        if at_exit:
            record["at_exit"] = True
        if not event.heal:
            self._started.add((event.fault, event.target))
        self._done.add(event)
        try:
            record["t_monotonic_s"], more = self.apply(event)
            record.update(more)
        except Exception as exc:  # recorded, and the workload goes on
            record["error"] = str(exc)
        when = "as the schedule ended" if at_exit else f"at {event.at_s:g} s"
        self.log(f"failure schedule: {record['event']} {when}"
                 + (f" FAILED: {record['error']}" if "error" in record else ""))
        self.applied.append(record)

    def apply(self, event: FailureEvent) -> tuple[float, dict]:
        """Apply one event; the monotonic time it started and anything measured doing it."""
        if event.action in ("link_down", "link_up"):
            return self.net.set_link(*event.link, up=event.action == "link_up"), {}
        if event.action in ("switch_down", "switch_up"):
            return self.net.set_switch(event.switch, up=event.action == "switch_up"), {}
        if event.action in (IMPAIR, UNIMPAIR):
            return self.net.impair_link(*event.link, event.impairment), {}
        if event.action == RESUME:  # the very processes it stopped, those still alive
            t = time.monotonic()
            stopped = self._stopped.pop((event.fault, event.target), {})
            resumed = [pid for pid, ticks in stopped.items() if resume(pid, ticks)]
            return t, {"pids": resumed}
        if event.action in SIGNALS:
            t, pids = self.net.signal_daemon(event.daemon, event.host, SIGNALS[event.action])
            if event.action == STOP:
                self._stopped[(event.fault, event.target)] = {
                    pid: process_start_ticks(pid) for pid in pids}
            return t, {"pids": pids}
        if event.action != CONTROLLER_RESTART:
            raise ValueError(f"unknown failure action {event.action!r}")
        t = time.monotonic()
        return t, {"reprogrammed_s": round(self.net.restart_controller(), 3)}


def resume(pid: int, start_ticks: int | None) -> bool:
    """SIGCONT to ``pid`` if it is still the process that was stopped; whether it was sent."""
    if start_ticks is None or process_start_ticks(pid) != start_ticks:
        return False
    try:
        os.kill(pid, signal.SIGCONT)
    except ProcessLookupError:
        return False
    return True
