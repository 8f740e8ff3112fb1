"""A scenario's failure schedule, applied to a running fabric while a workload runs: links
and switches going down and up and the controller restarting, each at its time (seconds after
the schedule starts), in a thread of its own. Every event applied is recorded with the
CLOCK_MONOTONIC time it was applied, so the controller's reactions (its events file) can be
set against it."""
from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field


@dataclass(frozen=True)
class FailureEvent:
    """One event: ``action`` (link_down, link_up, switch_down, switch_up, controller_restart)
    at ``at_s`` on ``link`` (a, b) or ``switch``."""

    at_s: float
    action: str
    link: tuple[str, str] | None = None
    switch: str | None = None

    def describe(self) -> str:
        target = "-".join(self.link) if self.link else self.switch or "controller"
        return f"{self.action} {target}".replace("controller_restart controller",
                                                "controller_restart")


@dataclass
class FailureSchedule:
    """Runs ``events`` against ``net`` (testbed.apply.network.FabricNetwork) from ``start()``
    until the last is applied or ``stop()``; ``applied`` lists what happened."""

    net: object
    events: list[FailureEvent]
    log: object = print
    applied: list[dict] = field(default_factory=list)

    def __post_init__(self):
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self.t0 = None

    def __enter__(self) -> FailureSchedule:
        if self.events:
            self.t0 = time.monotonic()
            self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()

    def _run(self) -> None:
        for event in sorted(self.events, key=lambda e: e.at_s):
            if self._stop.wait(max(0.0, self.t0 + event.at_s - time.monotonic())):
                return
            record = {"at_s": event.at_s, "event": event.describe()}
            try:
                record["t_monotonic_s"], more = self.apply(event)
                record.update(more)
            except Exception as exc:  # recorded, and the workload goes on
                record["error"] = str(exc)
            self.log(f"failure schedule: {record['event']} at {event.at_s:g} s"
                     + (f" FAILED: {record['error']}" if "error" in record else ""))
            self.applied.append(record)

    def apply(self, event: FailureEvent) -> tuple[float, dict]:
        """Apply one event; the monotonic time it started and anything measured doing it."""
        if event.action in ("link_down", "link_up"):
            return self.net.set_link(*event.link, up=event.action == "link_up"), {}
        if event.action in ("switch_down", "switch_up"):
            return self.net.set_switch(event.switch, up=event.action == "switch_up"), {}
        t = time.monotonic()
        return t, {"reprogrammed_s": round(self.net.restart_controller(), 3)}
