"""Per-switch forwarding state computed from the fabric description: plain data, no OpenFlow.

For every destination host, each switch forwards on the ports that lie on a shortest path to
the host's edge switch. More than one such port becomes an ECMP select group (one bucket per
port); one port is a plain output. Groups are shared: one group per distinct port set on a
switch. ``mode="single"`` keeps only the lowest-numbered next hop, the static single-path
baseline ECMP is compared against. Shortest-path next hops strictly decrease the distance to
the destination, so the forwarding graph is loop-free by construction.

Rail fabrics (testbed.model.topology.rail) add port routes at every node switch, in both modes: IPv4
entering on GPU i's port leaves on NIC i's port, so a GPU talks to other nodes over its own
rail instead of being spread over all of them. Precedence at a switch, highest first, which
the controller turns into OpenFlow priorities: delivery to a host of this switch (GPUs of one
node stay on NVLink), then port routes, then routes by destination. Still loop-free: a port
route only takes traffic fresh from a GPU to its rail leaf, which is one hop from every node
(a rail that lost a node gets no port routes), so the rail path is one of the shortest paths
and the routes by destination finish it.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import networkx as nx

from testbed.model.topology.base import Fabric
from testbed.model.topology.rail import rail_ports

ECMP, SINGLE = "ecmp", "single"
MODES = (ECMP, SINGLE)


@dataclass(frozen=True)
class Route:
    """Forward IPv4 traffic for ``dst_ip`` to one port or to an ECMP group."""

    dst_ip: str
    port: int | None = None
    group_id: int | None = None


@dataclass(frozen=True)
class PortRoute:
    """Forward IPv4 traffic entering on ``in_port`` to ``out_port``, unless it is for a host
    of this switch: a GPU's own rail."""

    in_port: int
    out_port: int


@dataclass
class SwitchRules:
    """Everything one switch needs: its groups (id -> bucket ports), its routes by destination
    and by input port, and which host sits on which port."""

    name: str
    dpid: int
    groups: dict[int, tuple[int, ...]] = field(default_factory=dict)
    routes: list[Route] = field(default_factory=list)
    host_ports: dict[int, str] = field(default_factory=dict)
    port_routes: list[PortRoute] = field(default_factory=list)

    def is_delivery(self, route: Route) -> bool:
        """True for a route to a host cabled to this switch: it outranks the port routes."""
        return route.group_id is None and route.port in self.host_ports

    def group_for(self, ports: tuple[int, ...]) -> int:
        for gid, existing in self.groups.items():
            if existing == ports:
                return gid
        gid = len(self.groups) + 1
        self.groups[gid] = ports
        return gid


def next_hop_ports(graph: nx.Graph, switch: str, dist_to_dst: dict[str, int]) -> tuple[int, ...]:
    """Ports of ``switch`` toward neighbours one hop closer to the destination, sorted."""
    here = dist_to_dst[switch]
    ports = [graph.edges[switch, nbr]["ports"][switch]
             for nbr in graph.neighbors(switch)
             if graph.nodes[nbr]["role"] != "host" and dist_to_dst.get(nbr) == here - 1]
    return tuple(sorted(ports))


def compute_rules(fabric: Fabric, mode: str = ECMP) -> dict[str, SwitchRules]:
    """Forwarding state for every switch of the fabric, keyed by switch name."""
    if mode not in MODES:
        raise ValueError(f"routing mode must be one of {MODES}, got {mode!r}")
    graph = fabric.graph()
    switch_graph = graph.subgraph(s.name for s in fabric.switches)
    rules = {s.name: SwitchRules(s.name, s.dpid) for s in fabric.switches}
    for host in fabric.hosts:
        edge, edge_port = fabric.host_attachment(host.name)
        rules[edge].host_ports[edge_port] = host.name
        dist = nx.single_source_shortest_path_length(switch_graph, edge)
        for name, sw in rules.items():
            if name == edge:
                sw.routes.append(Route(host.ip, port=edge_port))
                continue
            if name not in dist:
                continue  # partitioned: no route rather than a wrong one
            ports = next_hop_ports(graph, name, dist)
            if mode == SINGLE or len(ports) == 1:
                sw.routes.append(Route(host.ip, port=ports[0]))
            else:
                sw.routes.append(Route(host.ip, group_id=sw.group_for(ports)))
    for name, nic_by_gpu_port in rail_ports(fabric).items():
        rules[name].port_routes = [PortRoute(gpu_port, nic_port)
                                   for gpu_port, nic_port in nic_by_gpu_port.items()]
    return rules


def arp_table(fabric: Fabric) -> dict[str, str]:
    """IPv4 -> MAC of every host: the controller answers ARP from it (no flooding)."""
    return {h.ip: h.mac for h in fabric.hosts}
