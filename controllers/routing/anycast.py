"""Anycast: one service IPv4 address served by several replica hosts, each switch sending it
to the nearest live replica. Plain data, no OpenFlow.

Every replica host also holds the service address (the host set-up adds it), so a switch only
has to deliver the packet to the replica's port with the replica's own MAC as eth_dst; the
replica answers from the service address and its replies follow the ordinary routes.

Choice of replica: each switch s picks the live replica r minimising the pair
    (d(s, e_r), IPv4 of r)   -- d: switch hops to r's edge switch e_r; IPs compared as numbers
and forwards along shortest paths toward e_r (every equal-cost next hop, as routing does).
Hosts add the same one hop to every replica, so hop counts from s to the replicas order like
d(s, e_r). The lowest replica address breaks ties, numerically (10.0.0.9 before 10.0.0.10).

Why the choice is consistent along the path (no loop, no oscillation): let s pick r and
forward to a neighbour t with d(t, e_r) = d(s, e_r) - 1. If t picked another replica q, then
(d(t, e_q), ip_q) < (d(t, e_r), ip_r). Since d(s, e_q) <= d(t, e_q) + 1 <= d(t, e_r) + 1 =
d(s, e_r), either d(s, e_q) < d(s, e_r), or all are equal and ip_q < ip_r; both make s prefer
q, a contradiction. So every downstream switch picks r too, the distance to e_r falls by one
per hop, and the packet reaches r. The argument needs the tie-break to be one total order
shared by all switches; a per-switch tie-break (lowest port, a hash) would lose it.
"""
from __future__ import annotations

import ipaddress
from collections.abc import Iterable
from dataclasses import dataclass

import networkx as nx

from testbed.controllers.routing.ecmp import ECMP, MODES, SINGLE, next_hop_ports
from testbed.model.topology.base import Fabric, Node


@dataclass(frozen=True)
class AnycastRoute:
    """At one switch: IPv4 traffic for ``service_ip`` goes to ``replica`` out of ``ports``
    (several: equal-cost next hops, one select-group bucket each) with eth_dst set to
    ``replica_mac``. ``switch_hops`` counts switch-to-switch hops left to the replica's edge
    switch (0 there; the replica is one hop further)."""

    service_ip: str
    replica: str
    replica_ip: str
    replica_mac: str
    ports: tuple[int, ...]
    switch_hops: int


def service_mac(service_ip: str) -> str:
    """A locally administered MAC for the service address, for the controller's proxy ARP.
    Switches rewrite eth_dst to the replica's MAC, so it only has to be unicast and unused;
    host MACs start 02:00, this one 02:01."""
    octets = ipaddress.IPv4Address(service_ip).packed
    return "02:01:" + ":".join(f"{o:02x}" for o in octets)


def replica_order(node: Node) -> int:
    """The tie-break key: a replica's IPv4 address as a number (lower wins)."""
    return int(ipaddress.IPv4Address(node.ip))


def live_replicas(fabric: Fabric, service_ip: str, replicas: Iterable[str],
                  down: Iterable[str] = ()) -> list[Node]:
    """The replica hosts that are up, in tie-break order; ValueError for a service address
    that is not IPv4 or belongs to a host, or for replica names that are not hosts."""
    ipaddress.IPv4Address(service_ip)
    if any(h.ip == service_ip for h in fabric.hosts):
        raise ValueError(f"service address {service_ip} is a host's own address")
    replicas, down = list(replicas), set(down)
    for name in replicas + sorted(down):
        node = fabric.nodes.get(name)
        if node is None or not node.is_host:
            raise ValueError(f"replica {name!r} is not a host of this fabric")
    if not down <= set(replicas):
        raise ValueError(f"down replicas {sorted(down - set(replicas))} are not replicas")
    return sorted({fabric.nodes[name] for name in replicas if name not in down},
                  key=replica_order)


def anycast_routes(fabric: Fabric, service_ip: str, replicas: Iterable[str],
                   down: Iterable[str] = (), mode: str = ECMP) -> dict[str, AnycastRoute]:
    """For every switch that reaches a live replica, its route for ``service_ip`` (see the
    module docstring for the choice). ``down`` names replicas to leave out; pass a fabric
    without failed parts (testbed.controllers.routing.failures.surviving_fabric) to route around failures.
    ``mode="single"`` keeps only the lowest-numbered next hop, as routing does."""
    if mode not in MODES:
        raise ValueError(f"routing mode must be one of {MODES}, got {mode!r}")
    live = live_replicas(fabric, service_ip, replicas, down)
    graph = fabric.graph()
    switch_graph = graph.subgraph(s.name for s in fabric.switches)
    attachment = {r.name: fabric.host_attachment(r.name) for r in live}
    dist = {r.name: nx.single_source_shortest_path_length(switch_graph, attachment[r.name][0])
            for r in live}
    routes = {}
    for switch in fabric.switches:
        reachable = [(dist[r.name][switch.name], replica_order(r), r) for r in live
                     if switch.name in dist[r.name]]
        if not reachable:
            continue  # partitioned from every live replica: no route rather than a wrong one
        hops, _, replica = min(reachable, key=lambda choice: choice[:2])
        if hops == 0:
            ports = (attachment[replica.name][1],)
        else:
            ports = next_hop_ports(graph, switch.name, dist[replica.name])
        if mode == SINGLE:
            ports = ports[:1]
        routes[switch.name] = AnycastRoute(service_ip, replica.name, replica.ip, replica.mac,
                                           ports, hops)
    return routes


def replica_for_hosts(fabric: Fabric, routes: dict[str, AnycastRoute],
                      replicas: Iterable[str], down: Iterable[str] = ()) -> dict[str, str | None]:
    """Which replica each host's requests reach: its edge switch's choice (None when that
    switch has no route); a live replica reaches itself, the service address being local."""
    up = set(replicas) - set(down)
    reached = {}
    for host in fabric.hosts:
        if host.name in up:
            reached[host.name] = host.name
            continue
        route = routes.get(fabric.host_attachment(host.name)[0])
        reached[host.name] = route.replica if route else None
    return reached
