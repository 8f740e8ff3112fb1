"""Where the pauses went, pure: hop distances on the fabric, the lossless queues that crossed
XOFF and the ports that were paused by hop distance from the congested switch, and the number
of paused ports over time, from the pause agent's events (testbed.apply.pfc_agent writes them
to pfc-events.jsonl) and its counters' increase (testbed.measure.pauses.counter_deltas)."""
from __future__ import annotations

import networkx as nx

from testbed.model.topology.base import Fabric
from testbed.plan.pfc import PAUSE, RESUME

CONGESTED = "congested"  # the agent's event when a lossless queue crosses XOFF


def hop_distances(fabric: Fabric, origin: str) -> dict[str, int]:
    """Hops from ``origin`` to every node of the fabric (hosts included)."""
    return dict(nx.single_source_shortest_path_length(fabric.graph(), origin))


def interface_nodes(fabric: Fabric) -> dict[str, str]:
    """Every interface of the fabric and the node it belongs to."""
    return {link.intf(end): (link.a, link.b)[end] for link in fabric.links for end in (0, 1)}


def in_window(events: list[dict], t0_s: float, t1_s: float) -> list[dict]:
    return [e for e in events if t0_s <= e["t"] <= t1_s]


def spreading(events: list[dict], deltas: dict[str, dict[str, float]], fabric: Fabric,
              origin: str) -> list[dict]:
    """By hop distance from ``origin`` (the congested switch): the lossless queues that
    crossed XOFF, the ports that were paused and their port-seconds paused. ``events`` are
    the pause agent's, already cut to the measurement window."""
    distance = hop_distances(fabric, origin)
    node_of = interface_nodes(fabric)
    rows: dict[int, dict] = {}

    def row(intf: str) -> dict:
        hops = distance[node_of[intf]]
        return rows.setdefault(hops, {"hops": hops, "congested_queues": set(),
                                      "paused_ports": set(), "paused_s": 0.0})
    for e in events:
        if e["event"] == CONGESTED:
            row(e["intf"])["congested_queues"].add(e["intf"])
        elif e["event"] == PAUSE:
            row(e["intf"])["paused_ports"].add(e["intf"])
    for intf, delta in deltas.items():
        if delta["paused_s"] > 0:
            row(intf)["paused_ports"].add(intf)
            row(intf)["paused_s"] += delta["paused_s"]
    return [{**r, "congested_queues": sorted(r["congested_queues"]),
             "paused_ports": sorted(r["paused_ports"]), "paused_s": round(r["paused_s"], 6)}
            for _, r in sorted(rows.items())]


def max_paused_hops(by_hop: list[dict]) -> int | None:
    """The farthest hop distance with a paused port (None: nothing was paused)."""
    return max((r["hops"] for r in by_hop if r["paused_ports"]), default=None)


def paused_ports_series(events: list[dict], t0_s: float) -> tuple[list[float], list[int]]:
    """How many ports were paused over time (seconds from ``t0_s``), as a step series from
    the pause and resume events."""
    paused: set[str] = set()
    ts, counts = [0.0], [0]
    for e in sorted(events, key=lambda e: e["t"]):
        key = f"{e['intf']}/{e.get('priority')}"
        if e["event"] == PAUSE:
            paused.add(key)
        elif e["event"] == RESUME:
            paused.discard(key)
        else:
            continue
        ts.append(e["t"] - t0_s)
        counts.append(len(paused))
    return ts, counts
