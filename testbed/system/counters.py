"""The emulated queues' and switch ports' counters, in one place: drops, backlogs, per-class
lossless drops and buffer statistics from the kernel's qdisc statistics, the switch ports'
packet counters, and ECN marking's per-port counters over a run.

Where they come from: one ``tc -s -j qdisc show`` process dumps every qdisc of a namespace
(the root namespace holds every switch port; a host's NIC is read in the host's namespace);
which qdisc is what follows from its handle (``testbed.plan.port_queue.Handles``). The
switch ports' packet counters are the kernel's (``/sys/class/net/IF/statistics``), read as
packets cross the veth, not OVS's database copy of them, which it refreshes every few
seconds.

Why a tc process and not netlink from here: measured on a 2-core development VM, pyroute2
0.9.7 takes 75-95 us per qdisc to parse a dump and read its statistics (19-24 ms for the 250
or so qdiscs of a k=4 fat-tree's switch ports, 84-89 ms for 1000), while one ``tc -s -j``
process costs 2-9 ms (fastest and median, on a loaded machine) and ``json.loads`` 0.4 ms
for 250 entries. (tc's own time per qdisc could not be measured without making qdiscs; it
is compiled code.) Only the PFC agent, which reads a few qdiscs every few ms, speaks netlink
itself (``testbed.system.netlink``).

Everything here is pure but the readers at the end.
"""
from __future__ import annotations

import json
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path

from testbed.errors import TestbedError
from testbed.plan.port_queue import Handles, Port
from testbed.plan.profiles import QueueConfig

QDISC_STATS = ("tc", "-s", "-j", "qdisc", "show")
INTERFACE_COUNTERS = ("rx_packets", "tx_packets")
NETEM = "netem"
TOOL_TIMEOUT_S = 30

Qdiscs = list[dict]  # ``tc -s -j qdisc show`` output, parsed


def parse_qdiscs(tc_json: str | None) -> Qdiscs:
    """``tc -s -j qdisc show`` output -> one dict per qdisc (empty output: none)."""
    return json.loads(tc_json or "[]")


def _sum(qdiscs: Qdiscs, handles: frozenset[str], key: str) -> int:
    return sum(q.get(key, 0) for q in qdiscs if q.get("handle") in handles)


def _is_impairment(qdisc: dict) -> bool:
    return qdisc.get("kind") == NETEM and qdisc.get("handle") == Handles.IMPAIRMENT


def queue_drops(qdiscs: Qdiscs) -> int:
    """Packets dropped by the link buffers (the one buffer or the class queues; the HTB
    above them repeats their drops, so only the buffers themselves count)."""
    return _sum(qdiscs, Handles.any_buffer(), "drops")


def port_queue_drops(qdiscs: Qdiscs, intfs) -> dict[str, int]:
    """Packets dropped so far by the buffers of each port in ``intfs`` (``queue_drops``
    for one interface at a time)."""
    return {intf: queue_drops([q for q in qdiscs if q.get("dev") == intf]) for intf in intfs}


def lossless_drops(qdiscs: Qdiscs, queue: QueueConfig) -> int:
    """Packets dropped by ``queue``'s lossless-class queues (PFC must keep this at 0)."""
    return _sum(qdiscs, Handles.lossless(queue), "drops")


def queued_packets(qdiscs: Qdiscs) -> int:
    """Packets still in the emulated queues: the buffers, and netem's delay lines (netem
    counts only what it still delays; what it handed to the HTB the buffers count)."""
    return (_sum(qdiscs, Handles.any_buffer(), "qlen")
            + sum(q.get("qlen", 0) for q in qdiscs if _is_impairment(q)))


def impairment_drops(qdiscs: Qdiscs) -> int:
    """Packets the impairments dropped (their loss, and any netem queue overflow). netem
    counts its child's drops as its own, so on every interface with a netem the HTB's drops
    (which repeat the buffers') are taken out of netem's."""
    htb = {q.get("dev"): q.get("drops", 0) for q in qdiscs if q.get("handle") == Handles.HTB}
    return sum(q.get("drops", 0) - htb.get(q.get("dev"), 0) for q in qdiscs
               if _is_impairment(q))


def buffer_stats(qdiscs: Qdiscs, queue: QueueConfig | None = None) -> dict[str, dict]:
    """Every interface's buffer (``Handles.buffers(queue)``, summed over the class queues):
    kind, packets sent, drops, backlog in bytes, and for RED its ``marked`` count (the RED
    inside a lossless tbf marks; its packets are its tbf's)."""
    counted, marking = Handles.buffers(queue), Handles.marking(queue)
    stats: dict[str, dict] = {}
    for qdisc in qdiscs:
        handle = qdisc.get("handle")
        if handle not in marking or "dev" not in qdisc:
            continue
        entry = stats.setdefault(qdisc["dev"], {"kind": None, "packets": 0, "drops": 0,
                                                "backlog_bytes": 0})
        if handle in counted:
            entry["kind"] = qdisc.get("kind") if len(counted) == 1 else "classes"
            entry["packets"] += qdisc.get("packets", 0)
            entry["drops"] += qdisc.get("drops", 0)
            entry["backlog_bytes"] += qdisc.get("backlog", 0)
        if "marked" in qdisc:
            entry["marked"] = entry.get("marked", 0) + qdisc["marked"]
    return stats


def switch_totals(interface_counters: Mapping[str, Mapping[str, int]],
                  qdiscs: Qdiscs) -> dict[str, int]:
    """What the packet-conservation check needs of the switches
    (``testbed.measure.fidelity.emulator_losses``): packets received and sent by all their
    ports, dropped by their egress queues, and dropped by impairments (intended losses, to
    take out of the emulator's)."""
    totals = {key: sum(c[key] for c in interface_counters.values())
              for key in INTERFACE_COUNTERS}
    totals["queue_drops"] = queue_drops(qdiscs)
    totals["impairment_drops"] = impairment_drops(qdiscs)
    return totals


# --- ECN marking's per-port counters ------------------------------------------------------------

# Counters that add up over time (a run's share is after minus before); the rest are peaks.
ADDITIVE_FIELDS = ("marks", "ect_packets", "offered_packets", "not_ect_over", "ce_arrived",
                   "virtual_fifo_drops", "fifo_drops", "sent_packets", "anchors",
                   "anchor_error_bytes", "anchor_abs_error_bytes")
MARKER_FIELDS = {  # port counter -> field of the marker's ecn_counters
    "marks": "ce_marks", "ect_packets": "ect_packets", "offered_packets": "packets",
    "not_ect_over": "not_ect_over", "ce_arrived": "ce_arrived",
    "virtual_fifo_drops": "fifo_drops", "max_queue_bytes": "max_queue_bytes",
    # anchoring (testbed.plan.anchoring): readings applied, and the model's error at each
    "anchors": "anchors", "anchor_error_bytes": "anchor_error_bytes",
    "anchor_abs_error_bytes": "anchor_abs_error_bytes",
    "anchor_max_abs_error_bytes": "anchor_max_abs_error_bytes",
}
PEAK_FIELDS = ("max_queue_bytes", "anchor_max_abs_error_bytes")


def port_counters(ports: Sequence[Port], marker: Mapping[int, Mapping[str, int]] | None,
                  buffers: Mapping[str, Mapping]) -> dict[str, dict]:
    """Every port's counters: from the marker's map (keyed by ifindex; None on the RED path,
    whose marks come from the qdisc and whose other marker fields are None) and from its
    buffer's statistics (``buffer_stats``). On the eBPF path the buffer's drops beside the
    marker's virtual drops show whether the virtual FIFO kept in step with the real one."""
    counters = {}
    for port in ports:
        qdisc = buffers.get(port.intf, {})
        entry: dict = {"rate_mbit": port.rate_mbit, "fifo_drops": qdisc.get("drops", 0),
                       "sent_packets": qdisc.get("packets", 0)}
        if marker is None:
            entry.update(dict.fromkeys(MARKER_FIELDS))
            entry["marks"] = qdisc.get("marked", 0)
        else:
            values = marker.get(port.ifindex, {})
            entry.update({name: values.get(source, 0) for name, source in MARKER_FIELDS.items()})
        counters[port.intf] = entry
    return counters


def counter_delta(before: Mapping[str, Mapping], after: Mapping[str, Mapping]) -> dict[str, dict]:
    """``after`` with its additive counters made relative to ``before`` (peaks stay as read)."""
    delta = {}
    for intf, values in after.items():
        old = before.get(intf, {})
        delta[intf] = {name: (value - old[name] if name in ADDITIVE_FIELDS and value is not None
                              and old.get(name) is not None else value)
                       for name, value in values.items()}
    return delta


def counter_totals(counters: Mapping[str, Mapping]) -> dict:
    """Sums of the additive counters over all ports (None where no port has the field), the
    highest of each peak (queue, anchoring error), and how many ports marked at all."""
    totals: dict = {}
    for name in ADDITIVE_FIELDS:
        values = [c.get(name) for c in counters.values() if c.get(name) is not None]
        totals[name] = sum(values) if values else None
    for name in PEAK_FIELDS:
        peaks = [c.get(name) for c in counters.values() if c.get(name) is not None]
        totals[name] = max(peaks) if peaks else None
    totals["ports_marking"] = sum(1 for c in counters.values() if c.get("marks"))
    return totals


# --- reading ------------------------------------------------------------------------------------


def read_qdiscs() -> Qdiscs:
    """Every qdisc of this process's namespace, with its statistics (one tc process)."""
    out = subprocess.run(QDISC_STATS, capture_output=True, text=True, timeout=TOOL_TIMEOUT_S)
    if out.returncode != 0:
        raise TestbedError(f"tc could not read the queues: {out.stderr.strip()[-300:]}")
    return parse_qdiscs(out.stdout)


def read_host_qdiscs(host) -> Qdiscs:
    """Every qdisc of a Mininet host's namespace, through its shell."""
    return parse_qdiscs(host.cmd(*QDISC_STATS))


def read_interface_counters(intfs: Sequence[str],
                            sys_net: Path = Path("/sys/class/net")) -> dict[str, dict[str, int]]:
    """Packets received and sent by each interface of this namespace, as its kernel counts."""
    return {intf: {key: int((sys_net / intf / "statistics" / key).read_text())
                   for key in INTERFACE_COUNTERS} for intf in intfs}
