"""Traffic classes on an egress port: the tc commands that split a port's queue by DSCP into
one queue per priority, and the two settings that pause and resume a lossless one.

A shaped port (``testbed.apply.network.shaping_commands``) is an HTB qdisc ``5:`` whose class
``5:1`` runs at the link rate. With traffic classes, ``5:1`` gets one child per priority::

    5: htb (default 5:10)
    └── 5:1   link rate
        ├── 5:10  priority 0, best effort   -> 20: bfifo limit <buffer_bytes>
        ├── 5:13  priority 3, lossless      -> 23: tbf rate <link> limit <buffer_bytes>
        └── 5:16  priority 6, CNP           -> 26: bfifo limit <buffer_bytes>
    u32 filters on 5: send each DSCP of a class to its child; the rest go to the default.

Every child is guaranteed an equal share of the link and may borrow up to all of it, as
equal-weight ETS does. Each queue has its own byte buffer and drops at its tail.

A lossless class's queue is a tbf at the link rate (HTB above already shapes it, so the tbf
adds nothing while it runs) because a tbf can be paused and resumed in place: changing its
rate to ``PAUSED_RATE`` holds every queued packet; changing it back refills its tokens and
sends at once. (Pausing the HTB class itself is not resumable: the class would owe the time
of a packet at the paused rate, seconds, before it sent again.) A paused tbf still lets
out the frame its burst covers, as a real port finishes the frame on the wire.
"""
from __future__ import annotations

from testbed.plan.profiles import DEFAULT_PRIORITY, QueueConfig, TrafficClass

HTB_MAJOR = 5
HTB_ROOT = f"{HTB_MAJOR}:"
LINK_CLASS = "5:1"
CLASS_MINOR_BASE = 0x10  # priority p is class 5:1p (hex)
LEAF_MAJOR_BASE = 0x20  # and its queue is qdisc 2p: (hex)
INNER_MAJOR_BASE = 0x30  # a RED qdisc inside a lossless class's tbf is 3p: (hex)
FILTER_PRIO = 10
DSCP_MASK = 0xFC  # the DSCP bits of the IPv4 TOS byte
PAUSED_RATE = "1kbit"  # the slowest tbf rate tc takes with a frame-sized burst


def class_minor(priority: int) -> int:
    return CLASS_MINOR_BASE + priority


def class_id(priority: int) -> str:
    """The HTB class of ``priority``, e.g. ``5:13``."""
    return f"5:{class_minor(priority):x}"


def class_id_number(priority: int) -> int:
    """``class_id`` as the kernel's 32-bit handle (major << 16 | minor)."""
    return (HTB_MAJOR << 16) | class_minor(priority)


def leaf_major(priority: int) -> int:
    return LEAF_MAJOR_BASE + priority


def leaf_handle(priority: int) -> str:
    """The queue (qdisc) of ``priority``'s class, e.g. ``23:``."""
    return f"{leaf_major(priority):x}:"


def inner_handle(priority: int) -> str:
    """The qdisc inside a lossless class's tbf when it marks on the RED path, e.g. ``33:``
    (the tbf counts its drops and backlog, so this handle is not one of the buffers)."""
    return f"{INNER_MAJOR_BASE + priority:x}:"


def leaf_handles(queue: QueueConfig) -> list[str]:
    return [leaf_handle(tc.priority) for tc in queue.classes]


def lossless_leaf_handles(queue: QueueConfig) -> list[str]:
    return [leaf_handle(p) for p in queue.lossless_priorities]


def default_class_minor() -> int:
    """What ``htb default`` names on a port with classes: unclassified traffic (ARP,
    everything with an unmapped DSCP) is best effort."""
    return class_minor(DEFAULT_PRIORITY)


def tbf_burst_bytes(mtu_bytes: int) -> int:
    """A tbf must hold a whole frame in its bucket, or it drops it."""
    return mtu_bytes + 64


def running_tbf(rate_mbit: float, mtu_bytes: int, buffer_bytes: int) -> dict:
    """The lossless queue's tbf while it may send: the link rate."""
    return {"rate": f"{round(rate_mbit * 1000)}kbit", "burst": tbf_burst_bytes(mtu_bytes),
            "limit": buffer_bytes}


def paused_tbf(mtu_bytes: int, buffer_bytes: int) -> dict:
    """The lossless queue's tbf while its class is paused."""
    return {"rate": PAUSED_RATE, "burst": tbf_burst_bytes(mtu_bytes), "limit": buffer_bytes}


def _tbf_args(params: dict) -> str:
    return f"tbf rate {params['rate']} burst {params['burst']} limit {params['limit']}"


def _leaf_command(intf: str, tc: TrafficClass, rate_mbit: float, mtu_bytes: int,
                  buffer_bytes: int) -> str:
    where = f"dev {intf} parent {class_id(tc.priority)} handle {leaf_handle(tc.priority)}"
    if tc.lossless:
        return f"qdisc replace {where} {_tbf_args(running_tbf(rate_mbit, mtu_bytes, buffer_bytes))}"
    return f"qdisc replace {where} bfifo limit {buffer_bytes}"


def class_commands(intf: str, rate_mbit: float, mtu_bytes: int, queue: QueueConfig) -> list[str]:
    """tc batch lines (without ``tc``) giving shaped port ``intf`` one queue per traffic
    class of ``queue``; to run after the port's shaping, with its ``htb default`` set to
    ``default_class_minor()``. Adding children to ``5:1`` replaces its single buffer."""
    share_mbit = rate_mbit / len(queue.classes)
    quantum = mtu_bytes + 64
    lines = []
    for tc in sorted(queue.classes, key=lambda c: c.priority):
        lines.append(f"class replace dev {intf} parent {LINK_CLASS} classid {class_id(tc.priority)}"
                     f" htb rate {share_mbit:.6g}mbit ceil {rate_mbit}mbit"
                     f" burst {2 * mtu_bytes} cburst {2 * mtu_bytes} quantum {quantum}")
        lines.append(_leaf_command(intf, tc, rate_mbit, mtu_bytes, queue.buffer_bytes))
    for tc in queue.classes:
        for dscp in tc.dscp:
            if tc.priority == DEFAULT_PRIORITY:
                continue  # the default class takes what no filter claims
            lines.append(f"filter add dev {intf} parent {HTB_ROOT} protocol ip prio {FILTER_PRIO}"
                         f" u32 match ip dsfield {dscp << 2:#04x} {DSCP_MASK:#04x}"
                         f" flowid {class_id(tc.priority)}")
    return lines
