"""Pure plans for the training-traffic experiments: which hosts of a fabric run the ranks, the
node groups of a hierarchical collective, and the alpha-beta cost model's link from the
fabric description instead of a ping-pong between ranks.

The cost model (testbed.traffic.collectives.cost) charges a message of n bytes alpha + n *
beta. Here beta comes from the bottleneck link rate on the path between the ranks that talk
(ring neighbours: consecutive ranks), and alpha from the path's length in links (hops) read
from the fabric's graph: each hop adds the serialisation of a small message's frame at the
bottleneck rate (store and forward) and a switch's forwarding time, and each message pays
the hosts' own cost once (sockets, the executor's threads). The worst pair of neighbours
sets both, since a ring step ends when its slowest pair is done.

    alpha = HOST_MESSAGE_S + hops * (FRAME_HEADER_BYTES * 8 / rate + SWITCH_FORWARDING_S)
    beta  = 8 / rate                                   (rate in bit/s)
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass

import networkx as nx

from testbed.model.topology.base import Fabric
from testbed.traffic.collectives.cost import AlphaBeta, link_alpha_beta

# A small message's frame: Ethernet 14 + IPv4 20 + TCP 32 (with timestamps) bytes of headers.
FRAME_HEADER_BYTES = 66
# A switch's forwarding time per frame. An assumption of this model, not a measurement: the
# userspace datapath's per-packet work is tens of microseconds on these machines.
SWITCH_FORWARDING_S = 20e-6
# A host's cost per message: one way of an 8-byte ping-pong through the collectives' executor
# between two ranks on 127.0.0.1 took 131 us on a 2-core VM (testbed.traffic.collectives
# .program.calibrate); rounded up, as emulated hosts share those cores with the switches.
HOST_MESSAGE_S = 150e-6
FABRIC_SOURCE = "derived from the fabric description (bottleneck link rate and hops)"

PACKED, SPREAD = "packed", "spread"
PLACEMENTS = (PACKED, SPREAD)


def place_hosts(fabric: Fabric, count: int, placement: str = SPREAD) -> list[str]:
    """``count`` hosts of the fabric in rank order: the first ``count`` in the fabric's order
    (``packed``: neighbours share switches, as a scheduler packing a job does) or evenly
    spaced through it (``spread``: on a fat-tree, one per pod before two in any pod)."""
    hosts = [h.name for h in fabric.hosts]
    if not 1 <= count <= len(hosts):
        raise ValueError(f"{count} ranks asked, the fabric has {len(hosts)} hosts")
    if placement == PACKED:
        return hosts[:count]
    if placement == SPREAD:
        return [hosts[i * len(hosts) // count] for i in range(count)]
    raise ValueError(f"unknown placement {placement!r}; known: {', '.join(PLACEMENTS)}")


def node_groups(fabric: Fabric, hosts: list[str]) -> list[list[int]]:
    """The ranks (positions in ``hosts``) behind each switch a host is cabled to, in rank
    order, first rank first: an NVSwitch-like node's GPUs, or an edge switch's hosts."""
    groups: dict[str, list[int]] = {}
    for rank, name in enumerate(hosts):
        switch, _ = fabric.host_attachment(name)
        groups.setdefault(switch, []).append(rank)
    return list(groups.values())


def groups_argument(groups: list[list[int]]) -> str:
    """Node groups as the rank programs' ``--groups`` reads them: ``0,1,2,3/4,5,6,7``."""
    return "/".join(",".join(map(str, g)) for g in groups)


@dataclass(frozen=True)
class PathCost:
    """The worst path between the ranks that talk: its length in links and bottleneck rate
    (None: no shaped link on it), and the cost model's link for it."""

    hops: int
    rate_mbit: float | None

    @property
    def alpha_beta(self) -> AlphaBeta | None:
        if self.rate_mbit is None:
            return None
        per_hop_s = FRAME_HEADER_BYTES * 8 / (self.rate_mbit * 1e6) + SWITCH_FORWARDING_S
        return link_alpha_beta(self.rate_mbit, self.hops, per_hop_s, HOST_MESSAGE_S)

    def to_dict(self) -> dict:
        link = self.alpha_beta
        return {"hops": self.hops, "rate_mbit": self.rate_mbit,
                "alpha_us": None if link is None else round(link.alpha_s * 1e6, 3)}


def path_cost(fabric: Fabric, a: str, b: str, graph: nx.Graph | None = None) -> PathCost:
    """Hops and bottleneck rate between hosts ``a`` and ``b``: the shortest path's length,
    and the best bottleneck among the shortest paths (ECMP can take any of them)."""
    graph = fabric.graph() if graph is None else graph
    best_rate: float | None = None
    hops = 0
    for path in nx.all_shortest_paths(graph, a, b):
        hops = len(path) - 1
        rates = [graph.edges[u, v]["rate_mbit"] for u, v in itertools.pairwise(path)]
        shaped = [r for r in rates if r is not None]
        rate = min(shaped) if shaped else None
        if rate is not None and (best_rate is None or rate > best_rate):
            best_rate = rate
    return PathCost(hops, best_rate)


def worst_cost(costs: list[PathCost]) -> PathCost:
    """The most hops and the lowest rate of several paths (a ring step waits for both)."""
    rates = [c.rate_mbit for c in costs if c.rate_mbit is not None]
    return PathCost(max(c.hops for c in costs), min(rates) if rates else None)


def ring_cost(fabric: Fabric, hosts: list[str], graph: nx.Graph | None = None) -> PathCost:
    """The worst path between ring neighbours (rank r and r+1, the last and the first)."""
    if len(hosts) < 2:
        raise ValueError("a ring needs two hosts")
    graph = fabric.graph() if graph is None else graph
    pairs = zip(hosts, hosts[1:] + hosts[:1])
    return worst_cost([path_cost(fabric, a, b, graph) for a, b in pairs])


@dataclass(frozen=True)
class CostLinks:
    """The cost model's links for a group of ranks: between ring neighbours, and inside a
    node group (None without groups)."""

    link: PathCost
    intra: PathCost | None = None
    source: str = FABRIC_SOURCE

    @property
    def derived(self) -> bool:
        """Whether the fabric gives a rate (an unshaped fabric leaves the programs to
        calibrate by ping-pong)."""
        return self.link.rate_mbit is not None

    def argv(self) -> list[str]:
        """The rank programs' cost-model arguments (testbed.traffic.collectives.program
        .add_cost_arguments); none when the fabric gives no rate."""
        if not self.derived:
            return []
        link = self.link.alpha_beta
        out = ["--link-rate-mbit", repr(link.rate_mbit), "--alpha-us", repr(link.alpha_s * 1e6)]
        intra = self.intra.alpha_beta if self.intra is not None else None
        if intra is not None:
            out += ["--intra-link-rate-mbit", repr(intra.rate_mbit),
                    "--intra-alpha-us", repr(intra.alpha_s * 1e6)]
        return out

    def to_dict(self) -> dict:
        return {"source": self.source if self.derived else
                "calibrated by the ranks (ping-pong): the fabric has no shaped link",
                "link": self.link.to_dict(),
                "intra_link": None if self.intra is None else self.intra.to_dict(),
                "frame_header_bytes": FRAME_HEADER_BYTES,
                "switch_forwarding_us": SWITCH_FORWARDING_S * 1e6,
                "host_message_us": HOST_MESSAGE_S * 1e6}


def cost_links(fabric: Fabric, hosts: list[str],
               groups: list[list[int]] | None = None) -> CostLinks:
    """The cost model's links for ranks on ``hosts``: the worst pair of ring neighbours and,
    with node groups, the worst pair of neighbours inside a group (a hierarchical
    collective's intra-node link)."""
    graph = fabric.graph()
    link = ring_cost(fabric, hosts, graph)
    inside = [path_cost(fabric, hosts[a], hosts[b], graph)
              for g in groups or [] for a, b in itertools.pairwise(g)]
    return CostLinks(link, worst_cost(inside) if inside else None)
