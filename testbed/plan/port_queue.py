"""One egress port's whole queue as one plan: the HTB rate, the drop-tail buffer or one queue
per traffic class, ECN marking (RED in each buffer's place, or the bfifo the eBPF marker sits
beside) and the link's impairment (netem delay, jitter, loss), as one list of ``tc -batch``
lines. Every handle of the tree is defined here once (``Handles``), for the plans that make
the queues, the pause agent that pauses the lossless ones and the counters that read them.
On the eBPF path the port's plan also holds the bpftool commands that fill the marker's maps:
a second list only because bpftool is another program, run right after the tc batch.

A port's tree (every part but the HTB optional; a link without a rate has no HTB)::

    1: netem  delay/jitter/loss               root when the link is impaired
    └── 5: htb  (default 5:1, or 5:10 with traffic classes)     root otherwise
        └── 5:1  the link rate
            ├── 10: bfifo limit <buffer>  or  red ... ecn nodrop          one buffer, or
            ├── 5:10 -> 20: bfifo | red                        priority 0, best effort
            ├── 5:13 -> 23: tbf (lossless, paused in place) [-> 33: red]   priority 3
            └── 5:16 -> 26: bfifo | red                        priority 6, CNP
        u32 filters on 5: send each DSCP of a class to its class; the rest go to the default
    ffff: clsact, egress: the eBPF marker (ebpf path; ``testbed.plan.ecn_plan``)

Traffic classes: every class is guaranteed an equal share of the link and may borrow all of
it, as equal-weight ETS does; each queue has the queue's whole byte buffer and drops at its
tail. A lossless class's queue is a tbf at the link rate (HTB above already shapes it, so the
tbf adds nothing while it runs) because a tbf can be paused and resumed in place: changing
its rate to ``PAUSED_RATE`` holds every queued packet; changing it back refills its tokens
and sends at once. (Pausing the HTB class itself is not resumable: the class would owe the
time of a packet at the paused rate, seconds, before it sent again.) A paused tbf still lets
out the frame its burst covers, as a real port finishes the frame on the wire.

Marking: on the ``red-qdisc`` path every buffer is a RED qdisc with ``ecn`` (a lossless
class's RED sits inside its tbf, which keeps its place for the pause agent); ``nodrop``
keeps non-ECT packets over the thresholds queued, as the eBPF path does, so only the byte
limit drops. On the ``ebpf`` path the buffers stay bfifos and the marker, a clsact egress
classifier, keeps a virtual copy of the port's FIFO at the same rate and byte limit; a queue
without ECN still gets it, in MODE_OFF (it counts and samples).

Impairment: netem sits at the root, before the shaper (netem's own documented way of
combining delay with rate control: netem at the root, the shaper as its child). Its delay
line holds each packet for its delay and then hands it to the HTB, whose buffer, classes and
marking are the port's as on an unimpaired link. Loss happens before the buffer: a packet
lost on the wire never takes buffer space (a real link loses it after the queue, so the
buffer holds at most the lost bytes fewer). The eBPF marker runs before the root qdisc: with
a fixed delay its virtual FIFO sees the same arrivals shifted by the delay, so it finds the
backlog the real queue will find; with jitter (netem reorders packets) or loss (it counts
packets netem then drops) its backlog is an approximation. netem counts its child's drops
as its own: ``testbed.system.counters.impairment_drops`` takes them out.
"""
from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from decimal import Decimal
from dataclasses import dataclass, field
from pathlib import Path

from testbed.errors import ConfigError
from testbed.model.topology.base import Fabric
from testbed.model.topology.checks import check_rate
from testbed.plan.ecn_plan import (
    BPF_OBJECT,
    BPF_SECTION,
    ECN_PATH_EBPF,
    ECN_PATH_RED,
    RedParameters,
    batch_input,
    check_ecn_path,
    ebpf_config_commands,
    marker_config,
    queue_bytes_at,
    rate_bytes_per_s,
    red_parameters,
)
from testbed.plan.profiles import DEFAULT_PRIORITY, PFC_CLASSES, QueueConfig, TrafficClass

# A port's drop-tail buffer unless its queue names one: 50 ms at the link rate, never fewer
# than 8 full frames.
DEFAULT_BUFFER_S = 0.050
MIN_BUFFER_FRAMES = 8
HTB_OVERHEAD_BYTES = 64  # a quantum and a tbf bucket of one frame plus this
# An HTB class's token bucket holds this much of the link's time. HTB sends when its timer
# or the next packet wakes it; a wake-up that comes late (softirq work deferred to ksoftirqd,
# a vCPU the hypervisor took away) loses the link time beyond the bucket for good, so the
# port sends below its rate and its real queue climbs above the marker's virtual FIFO, which
# drains at the rate. With a bucket of two frames (1.2 ms at 20 Mbit/s) on the 2-core VM,
# two ECN flows saw a real queue of 60-71 KB where the marker's FIFO held 14 KB (K 30 KB),
# and the port carried 18.96 of 19.13 Mbit/s of goodput. A bucket lets the port catch up
# after a late wake-up of up to its length, and costs the other way round: while the port
# keeps time, the real queue runs up to a bucket below the virtual one (a packet arriving at
# an idle port finds tokens, not a queue). 3 ms: real queue 14-15 KB beside a virtual
# 21 KB, the full 19.13 Mbit/s (tests/integration/test_ecn_marking.py reads both). Ports
# with one buffer only (``htb_burst_bytes``).
HTB_CATCH_UP_S = 0.003
FILTER_PRIO = 10  # the class filters' tc priority
DSCP_MASK = 0xFC  # the DSCP bits of the IPv4 TOS byte
PAUSED_RATE = "1kbit"  # the slowest tbf rate tc takes with a frame-sized burst
MARKER_FILTER_PRIO = "2"  # after the loss program (testbed.plan.loss_plan, prio 1)
MARKER_FILTER_HANDLE = "1"
# netem's delay line must never drop on its own: it holds (delay + jitter) of arrivals at up
# to ARRIVAL_HEADROOM times the link rate (several ports feeding one) in minimum-size
# frames, and never fewer packets than netem's own default limit. An unshaped link runs at
# about a veth pair's rate (testbed bench's direct veth line; docs/capacity.md).
NETEM_DEFAULT_LIMIT_PACKETS = 1000
ARRIVAL_HEADROOM = 8
MIN_FRAME_BYTES = 64
UNSHAPED_RATE_MBIT = 20_000.0


# Where the datapath passes segmentation-offloaded packets, one GSO packet leaves a shaped
# link as a single burst: it is kept to about what the link sends in GSO_BURST_S, never
# fewer than GSO_MIN_FRAMES frames (TCP's own smallest TSO burst, tcp_min_tso_segs) and never
# more than the kernel's 64 KiB, as TCP's TSO autosizing keeps a burst near a millisecond
# of its rate: a packet behind it waits about as long as behind that many back-to-back
# segments, and the switches forward a burst as one packet.
GSO_BURST_S = 0.001
GSO_MIN_FRAMES = 2
GSO_LIMIT_BYTES = 65536
ETHERNET_HEADER_BYTES = 14


def gso_max_bytes(rate_mbit: float | None, mtu_bytes: int) -> int:
    """The largest GSO packet a link of ``rate_mbit`` carries (unshaped: the kernel's)."""
    if rate_mbit is None:
        return GSO_LIMIT_BYTES
    burst = int(rate_mbit * 1e6 / 8 * GSO_BURST_S)
    return min(GSO_LIMIT_BYTES, max(GSO_MIN_FRAMES * (mtu_bytes + ETHERNET_HEADER_BYTES),
                                    burst))


def in_service_ms(rate_mbit: float | None, mtu_bytes: int, offloads_on: bool) -> float:
    """The longest a packet arriving at a shaped link waits for the one the link is sending
    (which a queue's backlog no longer shows): its largest packet at its rate."""
    if rate_mbit is None:
        return 0.0
    largest = (gso_max_bytes(rate_mbit, mtu_bytes) if offloads_on
               else mtu_bytes + ETHERNET_HEADER_BYTES)
    return largest * 8 / (rate_mbit * 1e6) * 1000


def default_buffer_bytes(rate_mbit: float, mtu_bytes: int) -> int:
    """Egress buffer of a port: 50 ms at the link rate, and never under 8 full frames."""
    return max(MIN_BUFFER_FRAMES * mtu_bytes, int(rate_mbit * 1e6 / 8 * DEFAULT_BUFFER_S))


# --- handles ----------------------------------------------------------------------------------


class Handles:
    """Every handle and class id of a port's tree (the module docstring draws it)."""

    IMPAIRMENT = "1:"  # netem at the root
    IMPAIRMENT_MAJOR = 1
    IMPAIRMENT_CLASS = "1:1"  # netem's one class: the HTB hangs under it
    HTB_MAJOR = 5
    HTB = "5:"
    LINK_CLASS = "5:1"
    LINK_MINOR = 1
    BUFFER = "10:"  # the one drop-tail buffer (or RED) under the link class
    CLASS_MINOR_BASE = 0x10  # priority p is class 5:1p (hex)
    LEAF_MAJOR_BASE = 0x20  # and its queue is qdisc 2p: (hex)
    INNER_MAJOR_BASE = 0x30  # a RED qdisc inside a lossless class's tbf is 3p: (hex)

    @classmethod
    def class_minor(cls, priority: int) -> int:
        return cls.CLASS_MINOR_BASE + priority

    @classmethod
    def class_id(cls, priority: int) -> str:
        """The HTB class of ``priority``, e.g. ``5:13``."""
        return f"{cls.HTB_MAJOR:x}:{cls.class_minor(priority):x}"

    @classmethod
    def class_id_number(cls, priority: int) -> int:
        """``class_id`` as the kernel's 32-bit handle (major << 16 | minor)."""
        return (cls.HTB_MAJOR << 16) | cls.class_minor(priority)

    @classmethod
    def leaf_major(cls, priority: int) -> int:
        return cls.LEAF_MAJOR_BASE + priority

    @classmethod
    def leaf(cls, priority: int) -> str:
        """The queue (qdisc) of ``priority``'s class, e.g. ``23:``."""
        return f"{cls.leaf_major(priority):x}:"

    @classmethod
    def inner(cls, priority: int) -> str:
        """The RED qdisc inside a lossless class's tbf, e.g. ``33:`` (the tbf counts its
        drops and backlog, so this is not one of the buffers)."""
        return f"{cls.INNER_MAJOR_BASE + priority:x}:"

    @classmethod
    def inner_parent(cls, priority: int) -> str:
        """The tbf's one class, where its inner qdisc hangs, e.g. ``23:1``."""
        return f"{cls.leaf_major(priority):x}:1"

    @classmethod
    def buffers(cls, queue: QueueConfig | None) -> frozenset[str]:
        """The qdiscs that make up a port's buffer with ``queue`` (their packets, drops and
        backlog add up): the one buffer, or every traffic class's queue. The same at every
        link rate of ``queue`` (its rates share their classes, ``QueueConfig``), so the
        counters read every port by them."""
        if queue is None or not queue.uses_classes:
            return frozenset({cls.BUFFER})
        return frozenset(cls.leaf(tc.priority) for tc in queue.classes)

    @classmethod
    def marking(cls, queue: QueueConfig | None) -> frozenset[str]:
        """The qdiscs that may mark (RED's ``marked``): the buffers and the RED inside each
        lossless class's tbf."""
        if queue is None or not queue.uses_classes:
            return cls.buffers(queue)
        return cls.buffers(queue) | {cls.inner(p) for p in queue.lossless_priorities}

    @classmethod
    def lossless(cls, queue: QueueConfig) -> frozenset[str]:
        """The queues of ``queue``'s lossless classes, the ones the pause agent pauses."""
        return frozenset(cls.leaf(p) for p in queue.lossless_priorities)

    @classmethod
    def any_buffer(cls) -> frozenset[str]:
        """Every handle a buffer can have, whatever the queue: the one buffer and the queue
        of every priority (a fabric's hosts and switches can have different queues)."""
        return frozenset({cls.BUFFER, *(cls.leaf(p) for p in range(PFC_CLASSES))})


def htb_burst_bytes(rate_mbit: float, mtu_bytes: int, classes: bool = False) -> int:
    """The bucket (burst and cburst) of every HTB class of a port: with one buffer,
    ``HTB_CATCH_UP_S`` of the link's bytes, never fewer than two frames; with traffic
    ``classes``, two frames in every bucket: a resumed lossless queue sends its HTB classes'
    tokens at once, and PFC's headroom (testbed.plan.scaling.pfc_headroom_bytes) counts two
    frames per upstream port; a 3 ms bucket there cost the fan-in 15 incast 5 lossless
    drops."""
    if classes:
        return 2 * mtu_bytes
    return max(2 * mtu_bytes, int(rate_mbit * 1e6 / 8 * HTB_CATCH_UP_S))


# --- the lossless class's tbf -----------------------------------------------------------------


def tbf_burst_bytes(mtu_bytes: int) -> int:
    """A tbf must hold a whole frame in its bucket, or it drops it."""
    return mtu_bytes + HTB_OVERHEAD_BYTES


def running_tbf(rate_mbit: float, mtu_bytes: int, buffer_bytes: int) -> dict:
    """The lossless queue's tbf while it may send: the link rate."""
    return {"rate": f"{round(rate_mbit * 1000)}kbit", "burst": tbf_burst_bytes(mtu_bytes),
            "limit": buffer_bytes}


def paused_tbf(mtu_bytes: int, buffer_bytes: int) -> dict:
    """The lossless queue's tbf while its class is paused."""
    return {"rate": PAUSED_RATE, "burst": tbf_burst_bytes(mtu_bytes), "limit": buffer_bytes}


def tbf_args(params: dict) -> str:
    return f"tbf rate {params['rate']} burst {params['burst']} limit {params['limit']}"


# --- impairments ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Impairment:
    """What one direction of a link adds: a fixed delay with jitter, and random loss.
    ``scheduled``: a netem that adds nothing until a failure schedule's ``impair`` changes
    it in place (so the fault changes a setting, not the port's queue)."""

    delay_ms: float = 0.0
    jitter_ms: float = 0.0
    loss_percent: float = 0.0
    scheduled: bool = False

    def __post_init__(self):
        for name in ("delay_ms", "jitter_ms", "loss_percent"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
                raise ConfigError(name, f"must be a number >= 0, got {value!r}")
        if self.loss_percent > 100:
            raise ConfigError("loss_percent", f"must be at most 100, got {self.loss_percent!r}")
        if self.jitter_ms and not self.delay_ms:
            raise ConfigError("jitter_ms", "needs delay_ms")
        if not (self.delay_ms or self.loss_percent or self.scheduled):
            raise ConfigError("impairment", "needs delay_ms or loss_percent")


def _decimal(value: float) -> str:
    """A number as tc reads it: plain decimals, no exponent (0.00001, not 1e-05)."""
    return format(Decimal(repr(value)), "f")


def netem_limit_packets(rate_mbit: float | None, impairment: Impairment) -> int:
    """netem's queue limit: room for (delay + jitter) of minimum-size frames arriving at
    ``ARRIVAL_HEADROOM`` times the link rate, at least netem's default."""
    window_s = (impairment.delay_ms + impairment.jitter_ms) / 1000
    rate_bytes_per_s = (rate_mbit or UNSHAPED_RATE_MBIT) * 1e6 / 8
    frames = math.ceil(ARRIVAL_HEADROOM * rate_bytes_per_s * window_s / MIN_FRAME_BYTES)
    return max(NETEM_DEFAULT_LIMIT_PACKETS, frames)


def impairment_line(intf: str, rate_mbit: float | None, impairment: Impairment) -> str:
    """The netem qdisc at ``intf``'s root."""
    args = [f"qdisc replace dev {intf} root handle {Handles.IMPAIRMENT} netem",
            f"limit {netem_limit_packets(rate_mbit, impairment)}"]
    if impairment.delay_ms:
        args.append(f"delay {_decimal(impairment.delay_ms)}ms")
        if impairment.jitter_ms:
            args.append(f"{_decimal(impairment.jitter_ms)}ms")
    if impairment.loss_percent:
        args.append(f"loss {_decimal(impairment.loss_percent)}%")
    return " ".join(args)


def impairment_change_argv(intf: str, rate_mbit: float | None,
                           impairment: Impairment) -> list[str]:
    """``tc`` changing the netem already at ``intf``'s root to ``impairment`` in place: the
    queue below it and its counters stay (a scheduled impairment starting or ending)."""
    line = impairment_line(intf, rate_mbit, impairment)
    return ["tc", *line.replace("qdisc replace ", "qdisc change ", 1).split()]


ALL_LINKS = "all"


def link_impairments(fabric: Fabric,
                     entries: Iterable[tuple[object, Impairment]]) -> dict[str, Impairment]:
    """Every impaired interface of ``fabric`` -> its impairment, from (link, impairment)
    entries whose link is a pair of node names or ``"all"``. Both ends of a link get it, so
    each direction is delayed and loses packets alike; where entries overlap the later one
    wins."""
    impaired: dict[str, Impairment] = {}
    for link_spec, impairment in entries:
        wanted = None if link_spec == ALL_LINKS else frozenset(link_spec)
        matched = False
        for link in fabric.links:
            if wanted is None or frozenset((link.a, link.b)) == wanted:
                matched = True
                impaired[link.intf(0)] = impaired[link.intf(1)] = impairment
        if not matched:
            raise ConfigError("impairments", f"{link_spec!r} names no link of the fabric")
    return impaired


# --- one port ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class PortPlan:
    """One port's whole queue: tc batch lines (without the leading ``tc``), then, on the eBPF
    path, the bpftool commands giving the marker the port's map entries."""

    tc: list[str]
    bpftool: list[list[str]] = field(default_factory=list)


def _queue_line(intf: str, parent: str, handle: str, buffer_bytes: int,
                red: RedParameters | None, rate_mbit: float, verb: str = "replace") -> str:
    """A buffer: a bfifo of ``buffer_bytes``, or a RED-ECN qdisc of that limit."""
    where = f"qdisc {verb} dev {intf} parent {parent} handle {handle}"
    if red is None:
        return f"{where} bfifo limit {buffer_bytes}"
    return (f"{where} red limit {buffer_bytes} min {red.min_bytes} max {red.max_bytes} "
            f"avpkt {red.avpkt_bytes} burst {red.burst} probability {red.probability!r} "
            f"bandwidth {rate_mbit}mbit ecn nodrop")


def _class_lines(intf: str, rate_mbit: float, mtu_bytes: int, queue: QueueConfig,
                 red: RedParameters | None) -> list[str]:
    """One HTB class and queue per traffic class under the link class, and the DSCP filters.
    A lossless class's RED goes inside its tbf (``qdisc add`` into the tbf's class takes
    the place of the tbf's default inner bfifo)."""
    share_mbit = rate_mbit / len(queue.classes)
    burst = htb_burst_bytes(rate_mbit, mtu_bytes, classes=True)
    quantum = mtu_bytes + HTB_OVERHEAD_BYTES
    lines = []
    for tc in sorted(queue.classes, key=lambda c: c.priority):
        class_id = Handles.class_id(tc.priority)
        lines.append(f"class replace dev {intf} parent {Handles.LINK_CLASS} classid {class_id}"
                     f" htb rate {share_mbit:.6g}mbit ceil {rate_mbit}mbit"
                     f" burst {burst} cburst {burst} quantum {quantum}")
        leaf = Handles.leaf(tc.priority)
        if not tc.lossless:
            lines.append(_queue_line(intf, class_id, leaf, queue.buffer_bytes, red, rate_mbit))
            continue
        tbf = tbf_args(running_tbf(rate_mbit, mtu_bytes, queue.buffer_bytes))
        lines.append(f"qdisc replace dev {intf} parent {class_id} handle {leaf} {tbf}")
        if red is not None:
            lines.append(_queue_line(intf, Handles.inner_parent(tc.priority),
                                     Handles.inner(tc.priority), queue.buffer_bytes, red,
                                     rate_mbit, verb="add"))
    lines += _filter_lines(intf, queue.classes)
    return lines


def _filter_lines(intf: str, classes: Iterable[TrafficClass]) -> list[str]:
    """A u32 filter per DSCP of every class but the default, which takes the rest."""
    return [f"filter add dev {intf} parent {Handles.HTB} protocol ip prio {FILTER_PRIO}"
            f" u32 match ip dsfield {dscp << 2:#04x} {DSCP_MASK:#04x}"
            f" flowid {Handles.class_id(tc.priority)}"
            for tc in classes if tc.priority != DEFAULT_PRIORITY for dscp in tc.dscp]


def marker_lines(intf: str, obj: Path = BPF_OBJECT) -> list[str]:
    """The eBPF marker on ``intf``'s egress (idempotent). The first attach creates and pins
    the marker's maps; later attaches reuse them, keyed by ifindex."""
    if any(ch.isspace() or ch in "\"'#\\" for ch in str(obj)):
        raise ConfigError("obj", f"the marker's path cannot go in a tc batch line: {obj}")
    return [f"qdisc replace dev {intf} clsact",
            f"filter replace dev {intf} egress prio {MARKER_FILTER_PRIO} handle "
            f"{MARKER_FILTER_HANDLE} bpf da obj {obj} sec {BPF_SECTION}"]


def port_plan(intf: str, rate_mbit: float | None, mtu_bytes: int,
              queue: QueueConfig | None = None, ecn_path: str | None = None,
              impairment: Impairment | None = None, ifindex: int | None = None,
              obj: Path = BPF_OBJECT) -> PortPlan:
    """The whole queue of port ``intf``: netem for ``impairment``; with a rate, the HTB, and
    the buffer or class queues of ``queue`` at that rate (``QueueConfig.for_rate``; None: one
    bfifo of ``default_buffer_bytes``), marked on ``ecn_path`` (None: no marking, as on a
    host's NIC; ``ebpf`` needs ``ifindex`` for the marker's map entries)."""
    check_ecn_path(ecn_path)
    if ecn_path is not None and queue is None:
        raise ValueError("a marking path needs a queue to mark")
    lines = [impairment_line(intf, rate_mbit, impairment)] if impairment is not None else []
    if rate_mbit is None:
        return PortPlan(lines)  # an unshaped link has no queue of its own to plan
    check_rate("rate_mbit", rate_mbit)
    if queue is not None:
        queue = queue.for_rate(rate_mbit)
    classes = queue is not None and queue.uses_classes
    default_minor = Handles.class_minor(DEFAULT_PRIORITY) if classes else Handles.LINK_MINOR
    where = f"parent {Handles.IMPAIRMENT_CLASS}" if impairment is not None else "root"
    burst = htb_burst_bytes(rate_mbit, mtu_bytes, classes)
    lines += [
        f"qdisc replace dev {intf} {where} handle {Handles.HTB} htb default {default_minor:x}",
        f"class replace dev {intf} parent {Handles.HTB} classid {Handles.LINK_CLASS} htb rate "
        f"{rate_mbit}mbit burst {burst} cburst {burst} quantum {mtu_bytes + HTB_OVERHEAD_BYTES}",
    ]
    red = (red_parameters(queue.ecn, mtu_bytes)
           if ecn_path == ECN_PATH_RED and queue.ecn is not None else None)
    if classes:
        lines += _class_lines(intf, rate_mbit, mtu_bytes, queue, red)
    else:
        buffer_bytes = (queue.buffer_bytes if queue is not None
                        else default_buffer_bytes(rate_mbit, mtu_bytes))
        lines.append(_queue_line(intf, Handles.LINK_CLASS, Handles.BUFFER, buffer_bytes, red,
                                 rate_mbit))
    if ecn_path != ECN_PATH_EBPF:
        return PortPlan(lines)
    if ifindex is None:
        raise ValueError("the eBPF marker's map entries need the port's ifindex")
    return PortPlan(lines + marker_lines(intf, obj),
                    ebpf_config_commands(ifindex, marker_config(rate_mbit, queue)))


# --- a fabric's ports -------------------------------------------------------------------------


@dataclass(frozen=True)
class Port:
    """A shaped switch port with a queue: its interface (root namespace), ifindex and rate."""

    intf: str
    ifindex: int
    rate_mbit: float


def depths_from_qdepth(ports: Sequence[Port], samples: Mapping[int, Mapping[str, int]],
                       now_ns: int) -> dict[str, int]:
    """Every port's virtual backlog at ``now_ns`` (CLOCK_MONOTONIC) from the marker's
    ``ecn_qdepth`` entries; a port that has seen no packet is empty."""
    return {port.intf: (queue_bytes_at(samples[port.ifindex], rate_bytes_per_s(port.rate_mbit),
                                       now_ns) if port.ifindex in samples else 0)
            for port in ports}


@dataclass(frozen=True)
class QueuePlan:
    """Many ports' plans in one: one ``tc -batch`` (on the eBPF path it also creates and pins
    the marker's maps), then one ``bpftool batch`` that fills them; and the shaped ports."""

    tc: list[str]
    bpftool: list[list[str]]
    ports: list[Port]

    def tc_batch(self) -> str:
        return "\n".join(self.tc) + "\n" if self.tc else ""

    def bpftool_batch(self) -> str:
        return batch_input(self.bpftool, "bpftool") if self.bpftool else ""


def switch_queue_plan(fabric: Fabric, queue: QueueConfig | None = None,
                      ecn_path: str | None = None,
                      impairments: Mapping[str, Impairment] | None = None,
                      ifindex: Callable[[str], int] | None = None,
                      obj: Path = BPF_OBJECT) -> QueuePlan:
    """Every switch end's whole queue, in fabric order: ``queue`` (at each port's own link
    rate) marked on ``ecn_path`` on every shaped port (``queue`` None: each shaped port a
    default buffer), ``impairments`` (interface -> Impairment, ``link_impairments``) where a
    port has one. ``ifindex`` names each port's interface index (needed for ``ports`` and
    the marker's entries)."""
    check_ecn_path(ecn_path)
    if queue is not None and not any(link.rate_mbit is not None
                                     for _, _, _, link in fabric.switch_ends()):
        raise ConfigError("queue", "needs shaped links: no switch port has a rate to queue at")
    impairments = impairments or {}
    tc: list[str] = []
    bpftool: list[list[str]] = []
    ports: list[Port] = []
    for _, _, intf, link in fabric.switch_ends():
        index = None
        if link.rate_mbit is not None and ifindex is not None:
            index = ifindex(intf)
            ports.append(Port(intf, index, link.rate_mbit))
        plan = port_plan(intf, link.rate_mbit, fabric.mtu_bytes, queue, ecn_path,
                         impairments.get(intf), index, obj)
        tc += plan.tc
        bpftool += plan.bpftool
    return QueuePlan(tc, bpftool, ports)


def host_queue(queue: QueueConfig | None) -> QueueConfig | None:
    """What a host's NIC queues with: the class queues of ``queue`` (at the NIC's link rate,
    ``port_plan``) when it has traffic classes (so PFC can pause its lossless class), else a
    default buffer."""
    return queue if queue is not None and queue.uses_classes else None
