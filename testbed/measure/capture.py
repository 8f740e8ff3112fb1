"""Packet captures in an emulated host: tcpdump in the host's namespace writes what arrives
on one of its interfaces to a pcap while a block runs, each packet as it comes (-U), so a
stop by signal loses none; entering waits until tcpdump listens, leaving stops it (SIGTERM)
and reads its closing counts. testbed.measure.pauses captures pause frames with it; the
replay experiment keeps a sample of a workload's TCP packets."""
from __future__ import annotations

import re
import subprocess
import time
from pathlib import Path

from testbed.errors import TestbedError
from testbed.system.process import stop_process

LISTENING = "listening on"  # tcpdump's line once the capture is open
START_TIMEOUT_S = 10.0
START_POLL_S = 0.05
STOP_TIMEOUT_S = 10.0
TCPDUMP_STAT = re.compile(r"^(\d+) packets? (captured|received by filter|dropped by kernel)")


def capture_argv(interface: str, path: Path, expression: list[str], count: int | None = None,
                 snaplen_bytes: int | None = None) -> list[str]:
    """tcpdump writing the packets on ``interface`` that match ``expression`` to ``path``,
    each as it comes; at most ``count`` of them, each cut to ``snaplen_bytes``."""
    argv = ["tcpdump", "-i", interface, "-U", "-w", str(path)]
    if count is not None:
        argv += ["-c", str(count)]
    if snaplen_bytes is not None:
        argv += ["-s", str(snaplen_bytes)]
    return argv + list(expression)


def tcpdump_stats(text: str) -> dict[str, int]:
    """tcpdump's closing counts (``N packets captured``, ``received by filter``, ``dropped
    by kernel``) from its standard error, keyed captured / received / kernel_dropped."""
    keys = {"captured": "captured", "received by filter": "received",
            "dropped by kernel": "kernel_dropped"}
    stats = {}
    for line in text.splitlines():
        match = TCPDUMP_STAT.match(line.strip())
        if match:
            stats[keys[match.group(2)]] = int(match.group(1))
    return stats


class HostCapture:
    """``argv`` (a tcpdump command line) in ``host``'s namespace while the block runs, its
    messages in ``log_path``; ``path`` is where it writes the packets."""

    def __init__(self, net, host: str, argv: list[str], path: Path, log_path: Path):
        self.net = net
        self.host = host
        self.argv = argv
        self.path = path
        self.log_path = log_path
        self.proc = None
        self.stats: dict[str, int] = {}

    def __enter__(self):
        with open(self.log_path, "wb") as log:
            self.proc = self.net.popen(self.host, self.argv, stdout=subprocess.DEVNULL,
                                       stderr=log)
        deadline = time.monotonic() + START_TIMEOUT_S
        while LISTENING not in self.log_path.read_text(errors="replace"):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise TestbedError(f"tcpdump on {self.host} did not start: {self._log_tail()}")
            time.sleep(START_POLL_S)
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def stop(self) -> None:
        if self.proc is None:
            return
        stop_process(self.proc, STOP_TIMEOUT_S)
        self.stats = tcpdump_stats(self.log_path.read_text(errors="replace"))

    def _log_tail(self) -> str:
        return self.log_path.read_text(errors="replace").strip()[-300:] or "no message"
