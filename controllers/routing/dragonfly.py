"""Dragonfly routing modes (testbed.model.topology.dragonfly): minimal, Valiant and UGAL-like, as
plain data: OpenFlow-shaped flow rules and select groups, no OpenFlow library.

MINIMAL (the paper's): local-global-local, at most one global link. Toward another group a
router uses its own global link(s) to that group if it owns one, else the local link(s) to
the router(s) that do (ECMP when there are several); inside a group, the direct local link.
Plain shortest-path ECMP (testbed.controllers.routing.ecmp) is not this: it sometimes takes a 2-hop
global-global path.

VALIANT: a packet for another group goes first to a random intermediate group I (neither
its source nor its destination group), minimally, then minimally to its destination, so at
most two global links. Forwarding is per destination, so the phase travels in the packet
as an 802.1Q tag, VID = I + 1 (VID 0 means "no VLAN"):
  - source router: packets from its own host ports for another group hit a select group
    (one per destination group) whose buckets each push VID(I) and leave toward I; the
    switch hashes each flow onto one bucket;
  - every router outside I forwards VID(I)-tagged packets minimally toward I;
  - the first router of I pops the tag and forwards the packet like any untagged one;
  - untagged packets follow the minimal routes. Traffic inside a group stays minimal.
With two groups there is no intermediate group, and Valiant degenerates to minimal.

UGAL: TCP and UDP flows are placed one by one by the controller, which sees each flow's
first packet (testbed.controllers.routing.ugal: minimal unless q_min*H_min exceeds q_val*H_val by a bias, the
loads counting the flows already placed); a detour is tagged as under Valiant. Until a flow's
own rule is in, and with no controller at all, its packets follow the minimal route. Everything
else follows the source router's select group, which holds the minimal path as well as the
Valiant ones, weighted from measured utilisation (``ugal_weights``): costs are load * hops as
UGAL compares q_min*H_min with q_nm*H_nm; while the minimal path is cheapest it takes
everything; a detour whose cost is below the minimal one takes a share of traffic equal to
its relative saving.

Priorities (higher wins; 200 stays the controller's ARP rule):
  PRIORITY_TAGGED  120  match vlan_vid: transit toward, or arrival in, the intermediate group
  (testbed.controllers.routing.ugal, under UGAL: 114 a placed flow's exact 5-tuple; 112 a TCP or UDP packet
  from a host port for another group, to the controller and on along the minimal route)
  PRIORITY_INGRESS 110  match in_port (a host port) + ipv4_dst in another group: pick a path
  PRIORITY_MINIMAL 100  match ipv4_dst: minimal route (any VLAN, so tagged packets need the
                        higher tagged rules, which every router has for every VID in use)
Group ids: 1..g are the source groups (id = destination group + 1, stable while UGAL weights
change); ECMP groups of plain ports follow from g+1.
"""
from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from statistics import mean

from testbed.controllers.routing.rules import (
    Action,
    Bucket,
    FlowRule,
    Match,
    Output,
    PopVlan,
    PushVlan,
    ToGroup,
)
from testbed.model.topology.base import ROUTER, Fabric

MINIMAL, VALIANT, UGAL = "minimal", "valiant", "ugal"
DRAGONFLY_MODES = (MINIMAL, VALIANT, UGAL)

PRIORITY_MINIMAL = 100
PRIORITY_INGRESS = 110
PRIORITY_TAGGED = 120

MAX_VLAN_VID = 4094
WEIGHT_SCALE = 1000  # bucket weights of a source group sum to about this (OpenFlow: 16 bits)
# Utilisation below which a port counts as idle: with all ports idle UGAL still prefers
# the shorter path, since costs are max(load, floor) * hops.
LOAD_FLOOR = 0.01


# --- rules as data --------------------------------------------------------------------------

@dataclass
class RouterRules:
    """One router's select groups (id -> buckets) and flow rules (one table)."""

    name: str
    dpid: int
    groups: dict[int, tuple[Bucket, ...]] = field(default_factory=dict)
    flows: list[FlowRule] = field(default_factory=list)


def vlan_vid(group: int) -> int:
    """The VID that carries intermediate group ``group``."""
    return group + 1


def source_group_id(dst_group: int) -> int:
    """Id of a source router's select group toward ``dst_group``."""
    return dst_group + 1


# --- the fabric seen as groups --------------------------------------------------------------

@dataclass(frozen=True)
class GlobalLink:
    """A global link seen from its ``router`` end: ``port`` there, ``peer`` router beyond."""

    router: str
    port: int
    peer: str


@dataclass
class DragonflyView:
    """A dragonfly fabric read as groups: which group each router is in, the local port
    between two routers of a group, the global links from one group to another, where each
    host is cabled and who is at the far end of every port. Built by ``dragonfly_view``."""

    fabric: Fabric
    group_of: dict[str, int]
    routers: dict[int, list[str]]
    local_port: dict[tuple[str, str], int]
    global_links: dict[tuple[int, int], list[GlobalLink]]
    host_at: dict[str, tuple[str, int]]
    peer: dict[tuple[str, int], tuple[str, int]]

    @property
    def groups(self) -> list[int]:
        return sorted(self.routers)


def dragonfly_view(fabric: Fabric) -> DragonflyView:
    """The group structure of a dragonfly fabric, read from its description (router coords
    (group, index)); ValueError unless every switch is a router, every group is fully
    meshed and every pair of groups has a global link."""
    if any(s.role != ROUTER for s in fabric.switches):
        raise ValueError("dragonfly routing needs a fabric of routers only")
    group_of = {s.name: s.coords[0] for s in fabric.switches}
    routers = defaultdict(list)
    for name, group in group_of.items():
        routers[group].append(name)
    if max(group_of.values()) + 1 > MAX_VLAN_VID:
        raise ValueError(f"at most {MAX_VLAN_VID} groups fit in a VLAN tag")
    local_port, global_links, peer = {}, defaultdict(list), {}
    for link in fabric.links:
        peer[(link.a, link.a_port)] = (link.b, link.b_port)
        peer[(link.b, link.b_port)] = (link.a, link.a_port)
        if link.a not in group_of or link.b not in group_of:
            continue
        for here, port, there in ((link.a, link.a_port, link.b), (link.b, link.b_port, link.a)):
            if group_of[here] == group_of[there]:
                local_port[(here, there)] = port
            else:
                global_links[(group_of[here], group_of[there])].append(
                    GlobalLink(here, port, there))
    for members in routers.values():
        for a in members:
            for b in members:
                if a != b and (a, b) not in local_port:
                    raise ValueError(f"{a} and {b} share a group but no local link")
    for ga in routers:
        for gb in routers:
            if ga != gb and not global_links[(ga, gb)]:
                raise ValueError(f"no global link from group {ga} to group {gb}")
    host_at = {h.name: fabric.host_attachment(h.name) for h in fabric.hosts}
    return DragonflyView(fabric, group_of, dict(routers), local_port,
                         {k: sorted(v, key=lambda link: (link.router, link.port))
                          for k, v in global_links.items()}, host_at, peer)


# --- minimal routes -------------------------------------------------------------------------

def used_global_links(view: DragonflyView, router: str, group: int) -> list[GlobalLink]:
    """The global links a minimal route from ``router`` to ``group`` crosses: the router's own
    links to that group if it has any, else all links from its group to that group."""
    links = view.global_links[(view.group_of[router], group)]
    own = [link for link in links if link.router == router]
    return own or links


def ports_toward_group(view: DragonflyView, router: str, group: int) -> tuple[int, ...]:
    """Minimal next-hop ports from ``router`` (outside ``group``) into ``group``."""
    return tuple(sorted({link.port if link.router == router
                         else view.local_port[(router, link.router)]
                         for link in used_global_links(view, router, group)}))


def minimal_ports(view: DragonflyView, router: str, host: str) -> tuple[int, ...]:
    """Minimal next-hop ports from ``router`` toward ``host`` (its host port when cabled)."""
    dst_router, host_port = view.host_at[host]
    if router == dst_router:
        return (host_port,)
    if view.group_of[router] == view.group_of[dst_router]:
        return (view.local_port[(router, dst_router)],)
    return ports_toward_group(view, router, view.group_of[dst_router])


@dataclass
class NextHops:
    """How a router leaves by a set of next-hop ports: one port is an output, several share
    one ECMP select group (one equal bucket per port), numbered from ``first_group_id`` in
    the order the port sets are first asked for."""

    first_group_id: int
    group_ids: dict[tuple[int, ...], int] = field(default_factory=dict)

    def forward(self, ports: tuple[int, ...]) -> tuple[Action, ...]:
        """Output on one port, or through the (shared) ECMP group of several."""
        if len(ports) == 1:
            return (Output(ports[0]),)
        if ports not in self.group_ids:
            self.group_ids[ports] = self.first_group_id + len(self.group_ids)
        return (ToGroup(self.group_ids[ports]),)

    def groups(self) -> dict[int, tuple[Bucket, ...]]:
        """The ECMP groups asked for so far: id -> buckets."""
        return {gid: tuple(Bucket(1, (Output(port),)) for port in ports)
                for ports, gid in self.group_ids.items()}


def minimal_routes(view: DragonflyView, router: str
                   ) -> tuple[NextHops, dict[str, tuple[Action, ...]]]:
    """``router``'s minimal route to every host: (its next hops, holding the ECMP groups
    these routes use, host IPv4 address -> the route's actions). The one source of those
    actions for the router's minimal rules and for every other rule that forwards a packet
    the minimal way (testbed.controllers.routing.ugal's first packets); the routing modes number their
    further ECMP groups after these."""
    hops = NextHops(len(view.groups) + 1)
    return hops, {host.ip: hops.forward(minimal_ports(view, router, host.name))
                  for host in view.fabric.hosts}


# --- path choice at the source router -------------------------------------------------------

def intermediate_groups(view: DragonflyView, src_group: int, dst_group: int) -> list[int]:
    return [g for g in view.groups if g not in (src_group, dst_group)]


def leg_hops(link: GlobalLink, router: str) -> int:
    """Router-to-router hops from ``router`` into the far group over ``link``."""
    return 1 if link.router == router else 2


def option_costs(view: DragonflyView, router: str, dst_group: int,
                 utilisation: Mapping[tuple[str, int], float]) -> dict[int | None, float]:
    """UGAL cost of each way from ``router`` into ``dst_group``: None for minimal, I for the
    detour through group I. Cost = max(q, LOAD_FLOOR) * H, with H the router hops until the
    destination group is entered and q the utilisation (fraction of the link rate, keyed by
    (router, output port); missing ports are idle) of the busiest global port on the way;
    ECMP alternatives are averaged, as the switch spreads flows evenly over them."""
    def load(link: GlobalLink) -> float:
        return utilisation.get((link.router, link.port), 0.0)

    def cost(hops: float, q: float) -> float:
        return max(q, LOAD_FLOOR) * hops

    minimal = used_global_links(view, router, dst_group)
    costs: dict[int | None, float] = {
        None: cost(mean(leg_hops(link, router) for link in minimal),
                   mean(load(link) for link in minimal))}
    for group in intermediate_groups(view, view.group_of[router], dst_group):
        detours = [(leg_hops(first, router) + leg_hops(second, first.peer),
                    max(load(first), load(second)))
                   for first in used_global_links(view, router, group)
                   for second in used_global_links(view, first.peer, dst_group)]
        costs[group] = cost(mean(h for h, _ in detours), mean(q for _, q in detours))
    return costs


def ugal_shares(costs: Mapping[int | None, float]) -> dict[int | None, float]:
    """Traffic shares from option costs (None: minimal). A detour I saves
    s_I = max(0, c_min - c_I) / c_min; the detours together take the best saving max s_I,
    split among them in proportion to s_I; minimal keeps the rest. Continuous in the loads:
    nothing moves until a detour becomes cheaper than the minimal path."""
    c_min = costs[None]
    savings = {o: max(0.0, c_min - c) / c_min for o, c in costs.items() if o is not None}
    detoured = max(savings.values(), default=0.0)
    total = sum(savings.values())
    shares: dict[int | None, float] = {None: 1.0 - detoured}
    for option, saving in savings.items():
        shares[option] = detoured * saving / total if total else 0.0
    return shares


def ugal_weights(view: DragonflyView, router: str, dst_group: int,
                 utilisation: Mapping[tuple[str, int], float]) -> dict[int | None, int]:
    """Integer bucket weights (summing to about WEIGHT_SCALE) for the ways from ``router``
    into ``dst_group``, from measured utilisation: None is the minimal path, I the detour
    through group I. Loads in, weights out."""
    shares = ugal_shares(option_costs(view, router, dst_group, utilisation))
    return {option: round(share * WEIGHT_SCALE) for option, share in shares.items()}


def option_shares(view: DragonflyView, router: str, dst_group: int, mode: str,
                  utilisation: Mapping[tuple[str, int], float]) -> dict[int | None, float]:
    """How a source router splits traffic for another group among minimal (None) and the
    detours through intermediate groups, per mode."""
    middle = intermediate_groups(view, view.group_of[router], dst_group)
    if mode == MINIMAL or not middle:
        return {None: 1.0}
    if mode == VALIANT:
        return {group: 1.0 / len(middle) for group in middle}
    return ugal_shares(option_costs(view, router, dst_group, utilisation))


def option_first_hops(view: DragonflyView, router: str, dst_group: int,
                      option: int | None) -> tuple[tuple[Action, ...], tuple[int, ...]]:
    """(actions before output, next-hop ports) of one option at the source router."""
    if option is None:
        return (), ports_toward_group(view, router, dst_group)
    return (PushVlan(vlan_vid(option)),), ports_toward_group(view, router, option)


def source_buckets(view: DragonflyView, router: str, dst_group: int, mode: str,
                   utilisation: Mapping[tuple[str, int], float]) -> tuple[Bucket, ...]:
    """The select-group buckets a source router uses toward ``dst_group``: per option one
    bucket per next-hop port, the option's share split evenly; zero-weight buckets are left
    out (UGAL while the minimal path is cheapest)."""
    buckets = []
    for option, share in option_shares(view, router, dst_group, mode, utilisation).items():
        before, ports = option_first_hops(view, router, dst_group, option)
        weight = round(share * WEIGHT_SCALE / len(ports))
        if weight > 0:
            buckets.extend(Bucket(weight, before + (Output(port),)) for port in ports)
    return tuple(buckets)


# --- rules per router -----------------------------------------------------------------------

def compute_dragonfly_rules(fabric: Fabric, mode: str = MINIMAL,
                            utilisation: Mapping[tuple[str, int], float] | None = None
                            ) -> dict[str, RouterRules]:
    """Flow rules and groups for every router, keyed by name. ``utilisation`` (UGAL only):
    fraction of the link rate per (router, output port), e.g. from port counters."""
    if mode not in DRAGONFLY_MODES:
        raise ValueError(f"dragonfly routing mode must be one of {DRAGONFLY_MODES}, got {mode!r}")
    view = dragonfly_view(fabric)
    return {s.name: router_rules(view, s.name, s.dpid, mode, utilisation or {})
            for s in fabric.switches}


def router_rules(view: DragonflyView, here: str, dpid: int, mode: str,
                 utilisation: Mapping[tuple[str, int], float]) -> RouterRules:
    """The flow rules and groups of router ``here`` (see the module docstring)."""
    own = view.group_of[here]
    rules = RouterRules(here, dpid)
    hops, minimal = minimal_routes(view, here)
    rules.flows = [FlowRule(PRIORITY_MINIMAL, Match(ipv4_dst=ip), actions)
                   for ip, actions in minimal.items()]
    if mode == MINIMAL or len(view.groups) < 3:
        rules.groups = hops.groups()
        return rules
    for group in view.groups:
        if group != own:
            rules.flows.append(FlowRule(PRIORITY_TAGGED, Match(vlan_vid=vlan_vid(group)),
                                        hops.forward(ports_toward_group(view, here, group))))
            rules.groups[source_group_id(group)] = source_buckets(view, here, group, mode,
                                                                  utilisation)
    host_ports = sorted(port for router, port in view.host_at.values() if router == here)
    for host in view.fabric.hosts:
        dst_group = view.group_of[view.host_at[host.name][0]]
        if dst_group == own:
            continue
        rules.flows.append(FlowRule(
            PRIORITY_TAGGED, Match(vlan_vid=vlan_vid(own), ipv4_dst=host.ip),
            (PopVlan(),) + minimal[host.ip]))
        rules.flows.extend(FlowRule(PRIORITY_INGRESS, Match(in_port=port, ipv4_dst=host.ip),
                                    (ToGroup(source_group_id(dst_group)),))
                           for port in host_ports)
    rules.groups.update(hops.groups())
    return rules


# --- fluid model ----------------------------------------------------------------------------

Loads = dict[tuple[str, int], float]


def spread(view: DragonflyView, loads: Loads, start: str, rate_mbit: float,
           next_ports: Callable[[str], tuple[int, ...]],
           arrived: Callable[[str], bool]) -> dict[str, float]:
    """Push ``rate_mbit`` from node ``start`` hop by hop, split evenly over ``next_ports``,
    adding it to ``loads`` per (node, output port), until nodes where ``arrived`` holds;
    returns the rate arriving at each of those."""
    at, done = {start: rate_mbit}, defaultdict(float)
    for _ in range(len(view.fabric.nodes)):
        if not at:
            return dict(done)
        moving = defaultdict(float)
        for node, rate in at.items():
            if arrived(node):
                done[node] += rate
                continue
            ports = next_ports(node)
            for port in ports:
                loads[(node, port)] = loads.get((node, port), 0.0) + rate / len(ports)
                moving[view.peer[(node, port)][0]] += rate / len(ports)
        at = moving
    raise AssertionError(f"traffic from {start} did not arrive: routes loop")


def link_loads_mbit(fabric: Fabric, mode: str, traffic_mbit: Mapping[tuple[str, str], float],
                    utilisation: Mapping[tuple[str, int], float] | None = None,
                    options: Mapping[tuple[str, str], int | None] | None = None) -> Loads:
    """Fluid model: offered load (Mbit/s) per (node, output port) when each (src host, dst
    host) pair sends its rate, split as ``mode`` splits it (select groups spread flows in
    proportion to bucket weights, many flows assumed). A pair listed in ``options`` sends
    all of its rate one way instead (None: minimal, I: through group I), as a flow placed by
    the controller does (testbed.controllers.routing.ugal). Host uplinks are (host, 0)."""
    view = dragonfly_view(fabric)
    loads: Loads = {}
    for (src, dst), rate in traffic_mbit.items():
        if rate <= 0 or src == dst:
            continue
        loads[(src, 0)] = loads.get((src, 0), 0.0) + rate
        router = view.host_at[src][0]
        dst_group = view.group_of[view.host_at[dst][0]]

        def toward_dst(node: str) -> tuple[int, ...]:
            return minimal_ports(view, node, dst)

        def is_dst(node: str) -> bool:
            return node == dst

        if view.group_of[router] == dst_group:
            spread(view, loads, router, rate, toward_dst, is_dst)
            continue
        shares = ({options[(src, dst)]: 1.0} if options and (src, dst) in options
                  else option_shares(view, router, dst_group, mode, utilisation or {}))
        for option, share in shares.items():
            if option is None:
                spread(view, loads, router, rate * share, toward_dst, is_dst)
                continue
            entries = spread(view, loads, router, rate * share,
                             lambda node, g=option: ports_toward_group(view, node, g),
                             lambda node, g=option: view.group_of.get(node) == g)
            for entry, entry_rate in entries.items():
                spread(view, loads, entry, entry_rate, toward_dst, is_dst)
    return loads


def link_utilisation(fabric: Fabric, loads_mbit: Loads) -> dict[tuple[str, int], float]:
    """Offered load over link rate per (node, output port); unshaped links are left out."""
    rate = {}
    for link in fabric.links:
        rate[(link.a, link.a_port)] = rate[(link.b, link.b_port)] = link.rate_mbit
    return {end: load / rate[end] for end, load in loads_mbit.items() if rate[end]}


def group_shift_traffic(fabric: Fabric, rate_mbit: float, shift: int = 1
                        ) -> dict[tuple[str, str], float]:
    """The adversarial pattern: host (G, r, i) sends ``rate_mbit`` to host (G + shift mod g,
    r, i), so every host of a group sends to the same other group."""
    groups = fabric.params["g"]
    by_coords = {h.coords: h.name for h in fabric.hosts}
    return {(h.name, by_coords[((h.coords[0] + shift) % groups,) + h.coords[1:]]): rate_mbit
            for h in fabric.hosts}

