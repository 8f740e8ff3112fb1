"""Following computed forwarding rules hop by hop, as the switches would: shared by the
routing tests of every topology family."""
from __future__ import annotations

from collections import defaultdict

from controllers.routing import Route, SwitchRules
from testbed.topology.base import Fabric


def port_peers(fabric: Fabric) -> dict[tuple[str, int], str]:
    peers = {}
    for link in fabric.links:
        peers[(link.a, link.a_port)] = link.b
        peers[(link.b, link.b_port)] = link.a
    return peers


def route_table(rules: SwitchRules) -> dict[str, Route]:
    table = {route.dst_ip: route for route in rules.routes}
    assert len(table) == len(rules.routes), f"{rules.name} has two routes for one address"
    return table


def out_ports(rules: SwitchRules, route: Route) -> tuple[int, ...]:
    if route.group_id is not None:
        assert route.port is None
        return rules.groups[route.group_id]
    assert route.port is not None
    return (route.port,)


class Walker:
    """Follows the computed rules hop by hop, as the switches would."""

    def __init__(self, fabric: Fabric, rules: dict[str, SwitchRules]):
        self.fabric = fabric
        self.rules = rules
        self.peers = port_peers(fabric)
        self.tables = {name: route_table(r) for name, r in rules.items()}

    def paths(self, start: str, host) -> list[list[str]]:
        """Every node sequence a packet for ``host`` can take from switch ``start``, following
        all ECMP choices; fails on a loop, a missing route or a dead end."""
        max_hops = len(self.fabric.nodes)
        paths, stack = [], [[start]]
        while stack:
            path = stack.pop()
            here = path[-1]
            if here == host.name:
                paths.append(path)
                continue
            assert not self.fabric.nodes[here].is_host, f"delivered to the wrong host: {path}"
            assert len(path) <= max_hops, f"no progress: {path}"
            route = self.tables[here].get(host.ip)
            assert route is not None, f"{here} has no route to {host.ip}"
            for port in out_ports(self.rules[here], route):
                nxt = self.peers[(here, port)]
                assert nxt not in path, f"loop: {path} -> {nxt}"
                stack.append(path + [nxt])
        return paths


def ports_by_node(fabric) -> dict[str, list[int]]:
    """Every port number each node uses, one entry per link end."""
    ports = defaultdict(list)
    for link in fabric.links:
        ports[link.a].append(link.a_port)
        ports[link.b].append(link.b_port)
    return ports
