"""A topology given node by node and cable by cable (a scenario's ``topology: {nodes, links}``).

    nodes: [{name: h1, role: host}, {name: s1}, {name: s2}, {name: h2, role: host}]
    links: [[h1, s1], [s1, s2], {ends: [s2, h2], rate_mbit: 5}]

Switch ports are numbered from 1 in the order the links name them; a host has exactly one
link (its eth0). Hosts get 10.200.x.y addresses and MACs in node order, switches DPIDs with
the role code of their role (``switch`` when none is given). Every link runs at the run's link
rate unless it names its own.
"""
from __future__ import annotations

from collections.abc import Iterable, Mapping

import networkx as nx

from testbed.errors import ConfigError
from testbed.model.topology.base import (
    HOST,
    ROLE_CODES,
    SWITCH,
    Fabric,
    Node,
    host_address,
    switch_dpid,
)
from testbed.model.topology.checks import (
    check_count,
    check_interface_names,
    check_mtu,
    check_rate,
)

ADDRESS_OCTET = 200  # 10.200.0.0/16 for explicit topologies' hosts
HOSTS_PER_OCTET = 250
MAX_NODES = 1000


def link_ends(link) -> tuple[tuple[str, str], float | None]:
    """``[a, b]`` or ``{"ends": [a, b], "rate_mbit": r}`` as ((a, b), rate or None)."""
    if isinstance(link, Mapping):
        return tuple(link["ends"]), link.get("rate_mbit")
    return tuple(link), None


def explicit(nodes: Iterable[Mapping], links: Iterable, host_rate_mbit: float = 100.0,
             mtu_bytes: int = 9000) -> Fabric:
    """The fabric the nodes and links describe; every problem is a ConfigError naming the
    node or link (``topology.nodes.I`` / ``topology.links.I``)."""
    nodes, links = list(nodes), list(links)
    check_rate("link_rate_mbit", host_rate_mbit)
    check_mtu(mtu_bytes)
    check_count("topology.nodes", len(nodes), 2, MAX_NODES)
    fabric = Fabric(kind="explicit", mtu_bytes=mtu_bytes,
                    params={"nodes": len(nodes), "links": len(links),
                            "host_rate_mbit": host_rate_mbit})
    hosts = switches = 0
    for i, spec in enumerate(nodes):
        name, role = spec["name"], spec.get("role") or SWITCH
        if name in fabric.nodes:
            raise ConfigError(f"topology.nodes.{i}.name", f"{name} is named twice")
        if role == HOST:
            ip, mac = host_address(ADDRESS_OCTET, hosts // HOSTS_PER_OCTET,
                                   hosts % HOSTS_PER_OCTET + 2)
            fabric.add_node(Node(name, HOST, (hosts,), ip=ip, mac=mac))
            hosts += 1
        elif role in ROLE_CODES:
            switches += 1
            fabric.add_node(Node(name, role, (switches,),
                                 dpid=switch_dpid(role, switches >> 16, switches & 0xFFFF)))
        else:
            raise ConfigError(f"topology.nodes.{i}.role", f"must be host or a switch role "
                              f"({', '.join(sorted(ROLE_CODES))}), got {role!r}")
    next_port = {name: (0 if node.is_host else 1) for name, node in fabric.nodes.items()}
    cabled = set()
    for i, link in enumerate(links):
        (a, b), rate = link_ends(link)
        for end in (a, b):
            if end not in fabric.nodes:
                raise ConfigError(f"topology.links.{i}", f"{end} is not a node")
        if a == b:
            raise ConfigError(f"topology.links.{i}", f"cables {a} to itself")
        pair = frozenset((a, b))
        if pair in cabled:
            raise ConfigError(f"topology.links.{i}", f"{a} and {b} are cabled twice")
        cabled.add(pair)
        for end in (a, b):
            if fabric.nodes[end].is_host and next_port[end] > 0:
                raise ConfigError(f"topology.links.{i}", f"host {end} has more than one link")
        if fabric.nodes[a].is_host and fabric.nodes[b].is_host:
            raise ConfigError(f"topology.links.{i}", "cables two hosts together; hosts "
                              "connect to switches")
        fabric.add_link(a, next_port[a], b, next_port[b],
                        host_rate_mbit if rate is None else rate)
        next_port[a] += 1
        next_port[b] += 1
    for name, node in fabric.nodes.items():
        if node.is_host and next_port[name] == 0:
            raise ConfigError("topology.links", f"host {name} has no link")
    if not fabric.hosts:
        raise ConfigError("topology.nodes", "needs at least one host")
    parts = list(nx.connected_components(fabric.graph()))
    if len(parts) > 1:
        apart = sorted(min(part) for part in parts)
        raise ConfigError("topology.links", f"the fabric falls apart in {len(parts)} pieces "
                          f"(e.g. {apart[0]} and {apart[1]} are not connected)")
    check_interface_names(fabric, "topology.nodes", "use shorter node names")
    return fabric
