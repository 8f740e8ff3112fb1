"""The real backlog of one switch port's buffer qdisc, read over rtnetlink, and how far a model
of that queue strays from it.

On the eBPF marking path (testbed.plan.ecn_plan) the marker cannot see the qdisc it sits in
front of, so it marks on a virtual copy of the port's FIFO, and
``testbed.apply.marking.EcnMarking.queue_depths`` reports that copy. A claim about the queue
itself reads the bfifo's own backlog: ``PortBacklog`` asks the kernel for exactly that qdisc
(one RTM_GETQDISC with NLM_F_ECHO, answered with its statistics; the request and reply codec
is ``testbed.system.netlink.QdiscBacklogs``, which the pause agent reads its lossless
queues with), so a sample costs a system call, not a process. ``backlog_divergence`` compares
the two series sampled at the same instants.
"""
from __future__ import annotations

import socket
from collections.abc import Callable, Mapping, Sequence

from testbed.errors import TestbedError
from testbed.measure.stats import percentile
from testbed.plan.port_queue import Handles
from testbed.system.netlink import QdiscBacklogs

BUFFER_HANDLE = Handles.BUFFER

# Reads the backlogs of {(ifindex, handle major)} in one go: -> {(ifindex, major): bytes}.
ReaderFactory = Callable[[set[tuple[int, int]]], object]


def handle_major(handle: str) -> int:
    """A qdisc handle as tc writes it (``10:``) -> its major number (0x10)."""
    major, sep, minor = handle.partition(":")
    if not sep or minor or not major:
        raise ValueError(f"not a qdisc handle such as '10:': {handle!r}")
    return int(major, 16)


def _netlink_reader(wanted: set[tuple[int, int]]):
    return QdiscBacklogs(wanted)


class PortBacklog:
    """The backlog in bytes of qdisc ``handle`` (default: the port's buffer, ``10:``) on
    interface ``intf`` of this network namespace; use as ``with PortBacklog(...) as b:
    b.read()``. ``open_reader`` makes the reader (the rtnetlink one unless given)."""

    def __init__(self, intf: str, ifindex: int | None = None, handle: str = BUFFER_HANDLE,
                 open_reader: ReaderFactory = _netlink_reader):
        self.intf = intf
        self.handle = handle
        try:
            index = socket.if_nametoindex(intf) if ifindex is None else ifindex
        except OSError:
            raise TestbedError(f"{intf}: no such interface to read a backlog from") from None
        self.key = (index, handle_major(handle))
        self.reader = open_reader({self.key})

    def read(self) -> int:
        try:
            backlogs: Mapping[tuple[int, int], int] = self.reader.read()
        except OSError as err:
            raise TestbedError(f"{self.intf}: cannot read the backlog of qdisc {self.handle} "
                               f"({err.strerror or err})") from None
        if self.key not in backlogs:
            raise TestbedError(f"{self.intf}: no answer for qdisc {self.handle}")
        return backlogs[self.key]

    def close(self) -> None:
        sock = getattr(self.reader, "sock", None)
        if sock is not None:
            sock.close()

    def __enter__(self) -> PortBacklog:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def backlog_divergence(real_bytes: Sequence[int], model_bytes: Sequence[int],
                       within_bytes: int) -> dict | None:
    """How a model of a queue (``model_bytes``) differs from the real backlog
    (``real_bytes``) sampled at the same instants: the mean difference model - real (its
    bias), the mean, p95 and largest absolute difference, and the fraction of samples that
    agree within ``within_bytes`` (e.g. one frame). None without samples."""
    if len(real_bytes) != len(model_bytes):
        raise ValueError(f"{len(real_bytes)} real samples against {len(model_bytes)} of the "
                         "model: the series must be sampled together")
    if not real_bytes:
        return None
    diffs = [model - real for real, model in zip(real_bytes, model_bytes)]
    spread = [abs(d) for d in diffs]
    return {"samples": len(diffs), "mean_bytes": sum(diffs) / len(diffs),
            "mean_abs_bytes": sum(spread) / len(spread), "p95_abs_bytes": percentile(spread, 95),
            "max_abs_bytes": max(spread), "within_bytes": within_bytes,
            "within_fraction": sum(d <= within_bytes for d in spread) / len(spread)}
