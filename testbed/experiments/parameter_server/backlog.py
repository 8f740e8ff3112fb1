"""The incast at the servers' links, as the switch ports that feed the servers hold it: each
port's real queue backlog (testbed.measure.backlog.PortBacklog, the qdisc's own statistics
over rtnetlink) sampled in a thread, and the series reduced to what the checks read."""
from __future__ import annotations

import threading
import time

from testbed.errors import TestbedError
from testbed.measure.backlog import PortBacklog
from testbed.measure.stats import percentile

SAMPLE_INTERVAL_S = 0.01


class BacklogSampler:
    """The backlog in bytes of qdisc ``handle`` on each of ``intfs`` (root namespace) every
    ``interval_s`` while the block runs; ``series``: {"t_s": [monotonic], "backlog_bytes":
    {intf: [bytes]}}; a port that stops answering ends the sampling (``error``)."""

    def __init__(self, intfs: list[str], handle: str, interval_s: float = SAMPLE_INTERVAL_S,
                 open_backlog=None):
        self.intfs = list(intfs)
        self.handle = handle
        self.interval_s = interval_s
        self.open_backlog = open_backlog or PortBacklog
        self.series: dict = {"t_s": [], "backlog_bytes": {intf: [] for intf in self.intfs}}
        self.error: str | None = None
        self._ports: list = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> BacklogSampler:
        self._ports = [self.open_backlog(intf, handle=self.handle) for intf in self.intfs]
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
        for port in self._ports:
            port.close()

    def _run(self) -> None:
        while True:
            try:
                values = [port.read() for port in self._ports]
            except TestbedError as err:
                self.error = str(err)
                return
            self.series["t_s"].append(time.monotonic())
            for intf, value in zip(self.intfs, values):
                self.series["backlog_bytes"][intf].append(value)
            if self._stop.wait(self.interval_s):
                return


def backlog_stats(values: list[int]) -> dict:
    """Peak, 95th percentile and mean of a port's sampled backlog (zeros without samples)."""
    if not values:
        return {"samples": 0, "peak_bytes": 0, "p95_bytes": 0.0, "mean_bytes": 0.0}
    return {"samples": len(values), "peak_bytes": max(values),
            "p95_bytes": round(percentile(values, 95), 1),
            "mean_bytes": round(sum(values) / len(values), 1)}
