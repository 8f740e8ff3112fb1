"""Following computed forwarding rules hop by hop, as the switches would: shared by the
routing tests of every topology family. ``follow`` enumerates every branch a packet can take;
``Walker`` applies it to per-destination and per-input-port routes (testbed.controllers.routing.ecmp),
``FlowWalker`` to prioritised flow tables with VLAN actions and weighted select groups
(testbed.controllers.routing.dragonfly, and the tables the controller installs:
testbed.controllers.routing.forwarding)."""
from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Hashable
from dataclasses import dataclass

from testbed.controllers.routing.dragonfly import RouterRules
from testbed.controllers.routing.ecmp import PortRoute, Route, SwitchRules
from testbed.controllers.routing.forwarding import (
    ETH_TYPE_IPV4,
    PRIORITY_PORT_ROUTE,
    SwitchTable,
    route_priority,
)
from testbed.controllers.routing.rules import (
    Action,
    FlowRule,
    Match,
    Output,
    PopVlan,
    PushVlan,
    SetEthDst,
    ToGroup,
)
from testbed.model.topology.base import Fabric


def port_ends(fabric: Fabric) -> dict[tuple[str, int], tuple[str, int]]:
    """(node, port) -> (node, port) at the other end of its link, for both ends."""
    ends = {}
    for link in fabric.links:
        ends[(link.a, link.a_port)] = (link.b, link.b_port)
        ends[(link.b, link.b_port)] = (link.a, link.a_port)
    return ends


def port_peers(fabric: Fabric) -> dict[tuple[str, int], str]:
    return {end: peer for end, (peer, _) in port_ends(fabric).items()}


def route_table(rules: SwitchRules) -> dict[str, Route]:
    table = {route.dst_ip: route for route in rules.routes}
    assert len(table) == len(rules.routes), f"{rules.name} has two routes for one address"
    return table


def port_route_table(rules: SwitchRules) -> dict[int, PortRoute]:
    table = {route.in_port: route for route in rules.port_routes}
    assert len(table) == len(rules.port_routes), f"{rules.name} has two routes for one port"
    return table


def out_ports(rules: SwitchRules, route: Route) -> tuple[int, ...]:
    if route.group_id is not None:
        assert route.port is None
        return rules.groups[route.group_id]
    assert route.port is not None
    return (route.port,)


def follow(start, successors: Callable[[object], list], arrived: Callable[[object], bool],
           max_hops: int, node_of: Callable[[object], Hashable] = lambda state: state
           ) -> list[list]:
    """Every sequence of packet states from ``start`` until ``arrived``, branching over all
    ``successors`` (which assert on a missing rule); fails on a dead end, a loop (one node
    twice in a sequence) or more than ``max_hops`` states."""
    paths, stack = [], [[start]]
    while stack:
        path = stack.pop()
        if arrived(path[-1]):
            paths.append(path)
            continue
        assert len(path) <= max_hops, f"no progress: {path}"
        nexts = successors(path[-1])
        assert nexts, f"dead end: {path}"
        seen = [node_of(state) for state in path]
        for nxt in nexts:
            assert node_of(nxt) not in seen, f"loop: {seen} -> {node_of(nxt)}"
            stack.append(path + [nxt])
    return paths


class Walker:
    """Follows the computed rules hop by hop, as the switches would. Where rules overlap (a
    rail fabric's port routes), the one the controller installs at the highest priority
    applies, as OVS picks it."""

    def __init__(self, fabric: Fabric, rules: dict[str, SwitchRules]):
        self.fabric = fabric
        self.rules = rules
        self.peers = port_peers(fabric)
        self.ends = port_ends(fabric)
        self.tables = {name: route_table(r) for name, r in rules.items()}
        self.port_tables = {name: port_route_table(r) for name, r in rules.items()}

    def next_ports(self, switch: str, dst_ip: str, in_port: int | None) -> tuple[int, ...]:
        """Where ``switch`` sends a packet for ``dst_ip`` that entered on ``in_port`` (None: no
        port route applies): the matching rule of the highest priority."""
        rules = self.rules[switch]
        matches = []
        route = self.tables[switch].get(dst_ip)
        if route is not None:
            matches.append((route_priority(rules, route), out_ports(rules, route)))
        port_route = self.port_tables[switch].get(in_port)
        if port_route is not None:
            matches.append((PRIORITY_PORT_ROUTE, (port_route.out_port,)))
        assert matches, f"{switch} has no route to {dst_ip}"
        assert len({priority for priority, _ in matches}) == len(matches), \
            f"{switch}: overlapping rules of one priority for {dst_ip} from port {in_port}"
        return max(matches)[1]

    def paths(self, start: str, host, in_port: int | None = None) -> list[list[str]]:
        """Every node sequence a packet for ``host`` can take from switch ``start`` (entered on
        ``in_port``), following all ECMP choices; fails on a loop, a missing route or a dead
        end."""
        def successors(state: tuple[str, int | None]) -> list[tuple[str, int]]:
            here, entered = state
            assert not self.fabric.nodes[here].is_host, f"delivered to the wrong host: {here}"
            return [self.ends[(here, port)] for port in self.next_ports(here, host.ip, entered)]

        walks = follow((start, in_port), successors, lambda state: state[0] == host.name,
                       max_hops=len(self.fabric.nodes), node_of=lambda state: state[0])
        return [[node for node, _ in walk] for walk in walks]

    def host_paths(self, src, dst) -> list[list[str]]:
        """Every node sequence from host ``src`` to host ``dst``, entering the fabric where
        ``src`` is cabled."""
        switch, port = self.fabric.host_attachment(src.name)
        return [[src.name] + path for path in self.paths(switch, dst, in_port=port)]


@dataclass(frozen=True)
class Hop:
    """A packet at ``node``, entered by ``in_port``, carrying 802.1Q ``vlans`` (outermost
    first), on a branch that carries ``share`` of the sender's traffic."""

    node: str
    in_port: int
    vlans: tuple[int, ...]
    share: float


def flow_matches(match: Match, in_port: int, vlans: tuple[int, ...], ipv4_dst: str) -> bool:
    """OpenFlow semantics for an IPv4 packet: a field left out matches anything, tagged or
    not; a match on another ethertype (the controller's ARP rule) does not."""
    return (getattr(match, "eth_type", None) in (None, ETH_TYPE_IPV4)
            and (match.in_port is None or match.in_port == in_port)
            and (match.vlan_vid is None or vlans[:1] == (match.vlan_vid,))
            and (match.ipv4_dst is None or match.ipv4_dst == ipv4_dst))


class FlowWalker:
    """Follows flow tables hop by hop: the highest-priority matching rule applies (two at
    that priority is an error), actions run in order, a select group branches into every
    bucket with its weight's share."""

    def __init__(self, fabric: Fabric, rules: dict[str, RouterRules]):
        self.fabric = fabric
        self.rules = rules
        self.ends = port_ends(fabric)
        # per node: rules by exact ipv4_dst, and those without one (they match every address)
        self.by_dst: dict[str, dict[str | None, list[FlowRule]]] = {}
        for name, r in rules.items():
            self.by_dst[name] = defaultdict(list)
            for flow in r.flows:
                self.by_dst[name][flow.match.ipv4_dst].append(flow)

    def lookup(self, hop: Hop, ipv4_dst: str) -> FlowRule:
        candidates = self.by_dst[hop.node].get(ipv4_dst, []) + self.by_dst[hop.node].get(None, [])
        hits = [f for f in candidates if flow_matches(f.match, hop.in_port, hop.vlans, ipv4_dst)]
        assert hits, f"{hop} has no rule for {ipv4_dst}"
        top = max(f.priority for f in hits)
        winners = [f for f in hits if f.priority == top]
        assert len(winners) == 1, f"{hop}: ambiguous rules for {ipv4_dst}: {winners}"
        return winners[0]

    def run(self, node: str, actions: tuple[Action, ...], vlans: tuple[int, ...],
            share: float) -> list[tuple[int, tuple[int, ...], float]]:
        """(output port, vlans, share) of every copy the actions send out."""
        sent = []
        for action in actions:
            if isinstance(action, PushVlan):
                vlans = (action.vlan_vid,) + vlans
            elif isinstance(action, PopVlan):
                assert vlans, f"{node} pops a tag from an untagged packet"
                vlans = vlans[1:]
            elif isinstance(action, Output):
                sent.append((action.port, vlans, share))
            elif isinstance(action, SetEthDst):
                continue  # the MAC does not steer forwarding
            else:
                assert isinstance(action, ToGroup), action
                buckets = self.rules[node].groups[action.group_id]
                total = sum(b.weight for b in buckets)
                assert buckets and all(b.weight > 0 for b in buckets), (node, buckets)
                for bucket in buckets:
                    sent += self.run(node, bucket.actions, vlans, share * bucket.weight / total)
        return sent

    def traces(self, src_host: str, ipv4_dst: str) -> list[list[Hop]]:
        """Every hop sequence a packet from ``src_host`` to ``ipv4_dst`` can take, from the
        source's switch to the host it is delivered to, over all bucket choices."""
        def successors(hop: Hop) -> list[Hop]:
            actions = self.lookup(hop, ipv4_dst).actions
            return [Hop(*self.ends[(hop.node, port)], vlans, share)
                    for port, vlans, share in self.run(hop.node, actions, hop.vlans, hop.share)]

        first = Hop(*self.ends[(src_host, 0)], (), 1.0)
        return follow(first, successors, lambda hop: self.fabric.nodes[hop.node].is_host,
                      max_hops=len(self.fabric.nodes), node_of=lambda hop: hop.node)


def table_rules(tables: dict[str, SwitchTable]) -> dict[str, RouterRules]:
    """Installed tables (testbed.controllers.routing.forwarding) in the shape FlowWalker walks."""
    return {name: RouterRules(name, t.dpid, t.groups,
                              [FlowRule(priority, match, actions)
                               for (priority, match), actions in t.flows.items()])
            for name, t in tables.items()}


def fabric_id(entry: tuple[str, dict]) -> str:
    """Test id of a (kind, parameters) entry, e.g. ``fattree-k4``."""
    kind, params = entry
    return kind + "".join(f"-{k}{v}" for k, v in params.items())


def ports_by_node(fabric) -> dict[str, list[int]]:
    """Every port number each node uses, one entry per link end."""
    ports = defaultdict(list)
    for link in fabric.links:
        ports[link.a].append(link.a_port)
        ports[link.b].append(link.b_port)
    return ports
