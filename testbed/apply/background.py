"""A loop in a thread of its own beside a workload (the failure schedule, the watchdog over a
fabric's daemons): started when there is something to do, told to stop and joined when the
block it serves ends."""
from __future__ import annotations

import threading
from collections.abc import Callable


class Background:
    """``target`` in a daemon thread; ``stopping`` is set by ``stop``, which then waits for
    the thread to end (``target`` is expected to watch ``stopping``)."""

    def __init__(self, target: Callable[[], None]):
        self.stopping = threading.Event()
        self._thread = threading.Thread(target=target, daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self.stopping.set()
        if self._thread.is_alive():
            self._thread.join()

    def running(self) -> bool:
        return self._thread.is_alive()
