"""What a switch holds, as OpenFlow-shaped plain data, and the message plans that install it
or move a switch from one state to another. No OpenFlow library: the controller's apps turn
plans into messages one to one (testbed.controllers.apps.fabric_app).

A ``SwitchTable`` is one switch's select groups (id -> buckets) and flows ((priority, match)
-> actions), one table. Two families of routing fill it:
  - shortest-path routing (testbed.controllers.routing.ecmp, ecmp and single) and anycast
    (testbed.controllers.routing.anycast): ``routing_table``;
  - the dragonfly modes (testbed.controllers.routing.dragonfly: minimal, valiant, ugal):
    ``dragonfly_table``.
Both add the rule that sends every ARP packet to the controller, which answers it: nothing
floods, and there is no table-miss flow (IPv6 ND, stray broadcasts are dropped). Both add the
rule that sends every LLDP frame to the controller, above every other rule: the wiring check
(testbed.controllers.apps.lldp_app) reads them, and no switch ever forwards one. That rule belongs to the
table rather than to the wiring app because a connecting switch is wiped and programmed from
its table: a flow another app sent alongside could land before the wipe and be lost.

Plans are lists of message descriptions (``GroupMod``, ``FlowMod``, ``Barrier``, ``Wipe``):
  - ``program_plan``: what a switch gets when it connects: wipe flows and groups, add every
    group, add every flow, barrier. A reconnect or a controller restart never leaves stale
    rules.
  - ``update_plan``: the difference between two tables of a running switch, make before
    break:
        group ADD, group MODIFY, flow ADD, flow MODIFY, barrier, flow DELETE, group DELETE,
        barrier.
    New groups exist before any flow points at them; flows leave a group before it goes
    (deleting a group also deletes every flow still pointing at it); the barrier between
    keeps OVS from reordering the two halves; the last barrier's reply says the switch holds
    the new table. Groups are compared id by id, so give the new rules stable group ids
    (testbed.controllers.routing.failures.stable_group_ids) first, or every renumbered group shows up as a
    modification.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from testbed.controllers.routing.anycast import AnycastRoute
from testbed.controllers.routing.dragonfly import RouterRules
from testbed.controllers.routing.ecmp import Route, SwitchRules
from testbed.controllers.routing.failures import keyed_changes
from testbed.controllers.routing.rules import (
    Bucket,
    FlowAction,
    FlowKey,
    FlowMatch,
    Match,
    Output,
    SetEthDst,
    ToController,
    ToGroup,
)

ETH_TYPE_IPV4 = 0x0800
ETH_TYPE_ARP = 0x0806
ETH_TYPE_LLDP = 0x88CC

# Priorities of the shortest-path family (the dragonfly modes bring their own, 100-120).
PRIORITY_LLDP = 210  # above everything: an LLDP frame only ever goes to the controller
PRIORITY_ARP = 200
PRIORITY_DELIVERY = 120    # to a host of this switch, where port routes exist
PRIORITY_PORT_ROUTE = 110  # by input port: a GPU's own rail
PRIORITY_ROUTE = 100       # by destination (the anycast service address too, unless delivered)

ADD, MODIFY, DELETE = "add", "modify", "delete"


@dataclass
class SwitchTable:
    """Everything one switch holds: select groups (id -> buckets) and flows."""

    name: str
    dpid: int
    groups: dict[int, tuple[Bucket, ...]] = field(default_factory=dict)
    flows: dict[FlowKey, tuple[FlowAction, ...]] = field(default_factory=dict)

    def add_flow(self, priority: int, match: FlowMatch, actions: tuple[FlowAction, ...]) -> None:
        key = (priority, match)
        if key in self.flows:
            raise ValueError(f"{self.name}: two flows at priority {priority} for "
                             f"{match.describe()}")
        self.flows[key] = actions


# --- tables from routing ---------------------------------------------------------------------

def route_priority(rules: SwitchRules, route: Route) -> int:
    """The priority of a route by destination on this switch."""
    # A node switch's own GPUs must outrank its port routes, or a GPU's packet for a GPU of
    # the same node would leave on the rail instead of NVLink. Without port routes one priority
    # serves: destination matches never overlap, and other fabrics' flow tables stay as they were.
    if rules.port_routes and rules.is_delivery(route):
        return PRIORITY_DELIVERY
    return PRIORITY_ROUTE


def route_actions(route: Route) -> tuple[FlowAction, ...]:
    return (ToGroup(route.group_id),) if route.group_id else (Output(route.port),)


def base_table(name: str, dpid: int) -> SwitchTable:
    """What every switch holds whatever its routing: the rules sending ARP and LLDP to the
    controller."""
    table = SwitchTable(name, dpid)
    table.add_flow(PRIORITY_LLDP, FlowMatch(eth_type=ETH_TYPE_LLDP), (ToController(),))
    table.add_flow(PRIORITY_ARP, FlowMatch(eth_type=ETH_TYPE_ARP), (ToController(),))
    return table


def routing_table(rules: SwitchRules, anycast: AnycastRoute | None = None) -> SwitchTable:
    """The table of a switch under shortest-path routing, with the anycast route if any.

    The anycast route reuses the switch's route to the chosen replica's own address, at its
    priority: anycast picks the same next hops (shortest paths to the replica's edge switch,
    see testbed.controllers.routing.anycast), so the group it needs already exists, and delivery to a GPU of
    this node outranks the rail's port routes as it does for the GPU's own address. Only
    eth_dst is rewritten."""
    table = base_table(rules.name, rules.dpid)
    table.groups = {gid: tuple(Bucket(1, (Output(port),)) for port in ports)
                    for gid, ports in rules.groups.items()}
    for route in rules.routes:
        table.add_flow(route_priority(rules, route),
                       FlowMatch(eth_type=ETH_TYPE_IPV4, ipv4_dst=route.dst_ip),
                       route_actions(route))
    # IPv4 only, like every route: a GPU's IPv6 or broadcast frames are still dropped, not
    # carried along its rail, and its ARP requests still reach the controller.
    for port_route in rules.port_routes:
        table.add_flow(PRIORITY_PORT_ROUTE,
                       FlowMatch(eth_type=ETH_TYPE_IPV4, in_port=port_route.in_port),
                       (Output(port_route.out_port),))
    if anycast is not None:
        route = replica_route(rules, anycast)
        table.add_flow(route_priority(rules, route),
                       FlowMatch(eth_type=ETH_TYPE_IPV4, ipv4_dst=anycast.service_ip),
                       (SetEthDst(anycast.replica_mac),) + route_actions(route))
    return table


def replica_route(rules: SwitchRules, anycast: AnycastRoute) -> Route:
    """The switch's own route to the anycast replica, checked to leave on the anycast ports."""
    route = next((r for r in rules.routes if r.dst_ip == anycast.replica_ip), None)
    ports = None
    if route is not None:
        ports = rules.groups[route.group_id] if route.group_id else (route.port,)
    if ports != anycast.ports:
        raise ValueError(f"{rules.name}: anycast toward {anycast.replica} leaves on "
                         f"{anycast.ports}, the route to it on {ports}")
    return route


def dragonfly_match(match: Match) -> FlowMatch:
    return FlowMatch(eth_type=ETH_TYPE_IPV4 if match.ipv4_dst else None, in_port=match.in_port,
                     vlan_vid=match.vlan_vid, ipv4_dst=match.ipv4_dst)


def dragonfly_table(rules: RouterRules) -> SwitchTable:
    """The table of a router under a dragonfly mode: its rules as they are, plus ARP."""
    table = base_table(rules.name, rules.dpid)
    table.groups = dict(rules.groups)
    for flow in rules.flows:
        table.add_flow(flow.priority, dragonfly_match(flow.match), flow.actions)
    return table


def group_ports(table: SwitchTable) -> list[tuple[int, ...]]:
    """The output ports of each select group, sorted, one tuple per group."""
    return [tuple(sorted({a.port for b in buckets for a in b.actions if isinstance(a, Output)}))
            for _, buckets in sorted(table.groups.items())]


# --- message plans ---------------------------------------------------------------------------

@dataclass(frozen=True)
class GroupMod:
    """Add, modify or delete select group ``group_id``."""

    command: str
    group_id: int
    buckets: tuple[Bucket, ...] = ()

    def describe(self) -> str:
        return f"group {self.command} {self.group_id}"


@dataclass(frozen=True)
class FlowMod:
    """Add, modify (strictly: same priority and match) or delete one flow."""

    command: str
    priority: int
    match: FlowMatch
    actions: tuple[FlowAction, ...] = ()

    def describe(self) -> str:
        return f"flow {self.command} {self.priority} {self.match.describe()}"


@dataclass(frozen=True)
class Barrier:
    def describe(self) -> str:
        return "barrier"


@dataclass(frozen=True)
class Wipe:
    """Delete every flow of every table and every group."""

    def describe(self) -> str:
        return "wipe"


Message = GroupMod | FlowMod | Barrier | Wipe


def flow_order(key: FlowKey) -> tuple[int, str]:
    """Flows by priority, then by their match: plans come out the same every time."""
    priority, match = key
    return priority, match.describe()


def sorted_flows(flows: dict[FlowKey, tuple]) -> list[tuple[FlowKey, tuple]]:
    return sorted(flows.items(), key=lambda item: flow_order(item[0]))


def program_plan(table: SwitchTable) -> list[Message]:
    """Everything a switch that (re)connects is sent: from nothing to ``table``."""
    plan: list[Message] = [Wipe()]
    plan += [GroupMod(ADD, gid, buckets) for gid, buckets in sorted(table.groups.items())]
    plan += [FlowMod(ADD, priority, match, actions)
             for (priority, match), actions in sorted_flows(table.flows)]
    return plan + [Barrier()]


def update_plan(old: SwitchTable, new: SwitchTable) -> list[Message]:
    """The messages that move a running switch from ``old`` to ``new``, in the safe order of
    the module docstring; empty when the tables are equal."""
    groups_added, groups_changed, groups_removed = keyed_changes(old.groups, new.groups)
    flows_added, flows_changed, flows_removed = keyed_changes(old.flows, new.flows)
    plan: list[Message] = []
    plan += [GroupMod(ADD, gid, groups_added[gid]) for gid in sorted(groups_added)]
    plan += [GroupMod(MODIFY, gid, groups_changed[gid]) for gid in sorted(groups_changed)]
    plan += [FlowMod(ADD, priority, match, actions)
             for (priority, match), actions in sorted_flows(flows_added)]
    plan += [FlowMod(MODIFY, priority, match, actions)
             for (priority, match), actions in sorted_flows(flows_changed)]
    if flows_removed or groups_removed:
        plan.append(Barrier())
        plan += [FlowMod(DELETE, priority, match)
                 for priority, match in sorted(flows_removed, key=flow_order)]
        plan += [GroupMod(DELETE, gid) for gid in sorted(groups_removed)]
    return plan + [Barrier()] if plan else []


def update_plans(old: dict[str, SwitchTable],
                 new: dict[str, SwitchTable]) -> dict[str, list[Message]]:
    """Per switch, the update plan of every switch whose table changes."""
    plans = {name: update_plan(old[name], table) for name, table in new.items()}
    return {name: plan for name, plan in plans.items() if plan}


def describe_plan(plan: list[Message]) -> list[str]:
    return [message.describe() for message in plan]
