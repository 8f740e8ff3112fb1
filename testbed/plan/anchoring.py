"""Anchoring the eBPF marker's virtual FIFO in the real queue, as plain data: which ports the
anchor agent (``testbed.apply.ecn_anchor``) reads, what it reads of each, and the anchors it
writes from one poll's readings. The marker's side of the rule is
``testbed.plan.profiles.anchored_backlog`` (and ``bpf/ecn_marker.c``); docs/ecn.md explains
the design and its bound.

What a port's real backlog is: everything its HTB tree holds (``Handles.HTB``): the one
buffer, or every class's queue, a paused lossless tbf included, which is what the marker's
one virtual FIFO per port models. Where the link is impaired, netem sits before the HTB, and
the marker, which runs before netem, sees each packet a delay earlier than the HTB does: its
virtual FIFO holds what the HTB will hold a delay from now. For such a port the agent also
reads netem's delay line (``Handles.IMPAIRMENT``, whose backlog is only what it still
delays) and the anchor is what the HTB will hold once the line has drained into it:
max(0, htb + line - rate * delay), exact while the HTB stays busy over the delay.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass

from testbed.plan.bpf_maps import pack_value, unpack_value
from testbed.plan.ecn_plan import (
    ANCHOR_LAYOUT,
    MODE_OFF,
    QDEPTH_LAYOUT,
    marker_config,
    pinned_map_path,
    rate_bytes_per_s,
)
from testbed.plan.port_queue import Handles, Impairment, Port
from testbed.plan.profiles import QueueConfig, drained_bytes

# How often the agent reads every marked port's real backlog and anchors the marker in it.
# Between two anchors the model runs free, so it can drift by the mismatch between the
# nominal rate and the real drain over one interval (docs/ecn.md): a port whose HTB drains at
# 64% of 20 Mbit/s (measured in roce-dcqcn on a CI VM) drifts 1.8 KB, about one 1500-byte
# frame, per 2 ms; a paused port (PFC) drains nothing while the model drains 5 KB. The trust
# check holds the marker within 0.25 x K plus 2 frames of the qdisc, 3.8 KB for dctcp's
# K = 3000 B. A poll costs three system calls and Python work per port: its CPU is counted
# in the verdict (the agent's thread check), and raising this interval is the lever if it
# proves too dear.
ANCHOR_POLL_S = 0.002
FIRST_SEQ = 1  # seq 0 is the marker's "no reading yet"


@dataclass(frozen=True)
class AnchorPort:
    """A marked switch port: its interface, ifindex (the marker's key), HTB rate and the
    fixed delay of netem before its HTB (0 without one)."""

    intf: str
    ifindex: int
    rate_bytes_per_s: int
    delay_ns: int = 0

    def backlog_keys(self) -> list[tuple[int, int]]:
        """The qdiscs to read: (ifindex, handle major) of the HTB, and of netem's delay
        line when there is a delay."""
        keys = [(self.ifindex, Handles.HTB_MAJOR)]
        if self.delay_ns:
            keys.append((self.ifindex, Handles.IMPAIRMENT_MAJOR))
        return keys


@dataclass(frozen=True)
class AnchorPlan:
    """Everything the anchor agent needs, as JSON-able data: the poll interval, the marked
    ports and where the marker's two maps it uses are pinned."""

    poll_s: float
    ports: tuple[AnchorPort, ...]
    qdepth_pin: str = str(pinned_map_path("ecn_qdepth"))
    anchor_pin: str = str(pinned_map_path("ecn_anchor"))

    def backlog_keys(self) -> set[tuple[int, int]]:
        return {key for port in self.ports for key in port.backlog_keys()}

    def ifindexes(self) -> list[int]:
        return [port.ifindex for port in self.ports]

    def to_json(self) -> dict:
        return {**asdict(self), "ports": [asdict(port) for port in self.ports]}

    @classmethod
    def from_json(cls, data: dict) -> AnchorPlan:
        return cls(**{**data, "ports": tuple(AnchorPort(**port) for port in data["ports"])})


def anchor_plan(ports: Sequence[Port], queue: QueueConfig,
                impairments: Mapping[str, Impairment] | None = None,
                poll_s: float = ANCHOR_POLL_S) -> AnchorPlan | None:
    """The agent's plan for the marked ``ports`` (those whose marker config marks: a port
    in MODE_OFF only counts, and needs no anchor); None when no port marks."""
    if poll_s <= 0:
        raise ValueError(f"poll_s must be > 0, got {poll_s!r}")
    impairments = impairments or {}
    marked = []
    for port in ports:
        if marker_config(port.rate_mbit, queue.for_rate(port.rate_mbit)).mode == MODE_OFF:
            continue
        impairment = impairments.get(port.intf)
        delay_ns = round(impairment.delay_ms * 1e6) if impairment is not None else 0
        marked.append(AnchorPort(port.intf, port.ifindex, rate_bytes_per_s(port.rate_mbit),
                                 delay_ns))
    return AnchorPlan(poll_s, tuple(marked)) if marked else None


def accepted_bytes(qdepth: Mapping[int, bytes]) -> dict[int, int]:
    """The marker's ``ecn_qdepth`` entries (raw values by ifindex) -> bytes each port's
    virtual FIFO has accepted so far."""
    return {ifindex: unpack_value(QDEPTH_LAYOUT, raw)["accepted_bytes"]
            for ifindex, raw in qdepth.items()}


def port_backlog(port: AnchorPort, backlogs: Mapping[tuple[int, int], int]) -> int | None:
    """The backlog the marker's FIFO stands for on ``port``, from one poll's readings
    ({(ifindex, handle major): bytes}); None when a reading is missing."""
    keys = port.backlog_keys()
    if any(key not in backlogs for key in keys):
        return None
    total = sum(backlogs[key] for key in keys)
    return max(0, total - drained_bytes(port.rate_bytes_per_s, port.delay_ns))


def anchor_values(plan: AnchorPlan, accepted: Mapping[int, int],
                  backlogs: Mapping[tuple[int, int], int], time_ns: int,
                  seq: int) -> dict[int, bytes]:
    """One poll's anchors, {ifindex: ``struct ecn_anchor`` bytes}: each port's backlog read at
    ``time_ns`` (CLOCK_MONOTONIC) with the accepted bytes read just before, under ``seq``.
    A port missing either reading is left out (its marker keeps its last anchor)."""
    if seq < FIRST_SEQ:
        raise ValueError(f"seq must be >= {FIRST_SEQ} (0 means no reading), got {seq}")
    values = {}
    for port in plan.ports:
        backlog = port_backlog(port, backlogs)
        if backlog is None or port.ifindex not in accepted:
            continue
        values[port.ifindex] = pack_value(ANCHOR_LAYOUT, {
            "backlog_bytes": backlog, "time_ns": time_ns,
            "accepted_bytes": accepted[port.ifindex], "seq": seq})
    return values
