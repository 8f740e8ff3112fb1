"""What the controller knows while it runs, as plain data: which links and switches are down,
the table every switch should hold (testbed.controllers.routing.forwarding), and the messages to send when
that changes. No OpenFlow: testbed.controllers.apps.fabric_app feeds it events and sends what it returns.

Routing modes, by family:
  - ``ecmp``, ``single`` (testbed.controllers.routing.ecmp) on every fabric, with an anycast service
    (testbed.controllers.routing.anycast) if one is configured. After a failure the rules are recomputed on
    what survives (testbed.controllers.routing.failures.recompute_rules, group ids kept stable against the
    installed ones) and each switch is sent only its difference
    (testbed.controllers.routing.forwarding.update_plan).
  - ``minimal``, ``valiant``, ``ugal`` (testbed.controllers.routing.dragonfly), dragonfly fabrics
    only. They route an intact dragonfly: failures are recorded but not routed around (select
    groups still skip a bucket whose port is down, by watch_port). Under ``ugal`` every new
    TCP or UDP flow for another group is placed by the controller (testbed.controllers.routing.ugal:
    ``program`` adds the rules that send it the first packet, ``place_flow`` chooses,
    ``flow_removed`` forgets); the source routers' select groups, which carry every other
    protocol, are reweighted from measured port utilisation (``ugal_round``), and that
    utilisation also weighs in the flows' choices.

When a link is down: a link fails when one of its switch ports reports down, and returns when
none does. A port counts only once it has been seen up: while the fabric is built, a host
link stays down until the host has configured its end, and that is not a failure to route
around (it would recompute every switch once per host during bring-up).

Changes are cheap (set bookkeeping); ``refresh`` recomputes, only when something changed.
The controller skips it while no switch is connected to receive the result, so a whole
fabric going away at tear-down costs one recomputation, not one per switch.
"""
from __future__ import annotations

import ipaddress
from collections.abc import Mapping
from dataclasses import dataclass, replace

from testbed.controllers.routing.anycast import (
    AnycastRoute,
    anycast_routes,
    live_replicas,
)
from testbed.controllers.routing.dragonfly import (
    DRAGONFLY_MODES,
    UGAL,
    DragonflyView,
    compute_dragonfly_rules,
    dragonfly_view,
    link_utilisation,
    source_buckets,
    source_group_id,
    ugal_weights,
)
from testbed.controllers.routing.ecmp import ECMP, MODES, SwitchRules
from testbed.controllers.routing.failures import (
    Failures,
    recompute_rules,
    resolve_failures,
    surviving_fabric,
)
from testbed.controllers.routing.forwarding import (
    Barrier,
    Message,
    SwitchTable,
    dragonfly_table,
    program_plan,
    routing_table,
    update_plans,
)
from testbed.controllers.routing.ugal import (
    FiveTuple,
    FlowPlacements,
    Placement,
    TransportRule,
    to_controller_rules,
)
from testbed.model.topology.base import Fabric, Link

ROUTING_MODES = MODES + DRAGONFLY_MODES
# Hosts are addressed in 10.0.0.0/8 with no gateway (testbed.plan.bring_up.host_script): a service
# address outside it would be unreachable, not merely unusual.
HOST_NETWORK = ipaddress.IPv4Network("10.0.0.0/8")
# A source group is rewritten only when some option's weight moves by at least this much
# (of dragonfly_routing.WEIGHT_SCALE = 1000, so 5% of its traffic): measured loads jitter
# every poll, and each group change makes OVS revalidate every datapath flow using it.
UGAL_MIN_WEIGHT_CHANGE = 50

End = tuple[str, int]  # (switch, port)
UgalKey = tuple[str, int]  # (source router, destination group)
UgalWeights = dict[int | None, int]  # option (None: minimal, I: through group I) -> weight


def routing_problem(topology: str, mode: str) -> str | None:
    """Why ``mode`` cannot route a ``topology`` fabric, or None when it can."""
    if mode not in ROUTING_MODES:
        return f"must be one of {', '.join(ROUTING_MODES)}, got {mode!r}"
    if mode in DRAGONFLY_MODES and topology != "dragonfly":
        return (f"{mode!r} routes dragonfly fabrics only, not {topology}; use "
                f"{' or '.join(MODES)}")
    return None


@dataclass(frozen=True)
class AnycastService:
    """One service address answered by the nearest live replica host."""

    service_ip: str
    replicas: tuple[str, ...]

    @classmethod
    def from_dict(cls, data) -> AnycastService:
        """From ``{"service_ip": "10.255.0.1", "replicas": ["h1", "h2"]}``; ValueError for any
        other shape."""
        if not isinstance(data, dict) or set(data) != {"service_ip", "replicas"}:
            raise ValueError('must be a mapping with exactly "service_ip" and "replicas"')
        ip, replicas = data["service_ip"], data["replicas"]
        if not isinstance(ip, str):
            raise ValueError(f"service_ip must be an IPv4 address string, got {ip!r}")
        if (not isinstance(replicas, list) or not replicas
                or not all(isinstance(r, str) for r in replicas)):
            raise ValueError(f"replicas must be a non-empty list of host names, got {replicas!r}")
        if len(set(replicas)) != len(replicas):
            raise ValueError(f"replicas name a host twice: {replicas}")
        return cls(ip, tuple(replicas))

    def to_dict(self) -> dict:
        return {"service_ip": self.service_ip, "replicas": list(self.replicas)}

    def check(self, fabric: Fabric, mode: str) -> None:
        """ValueError unless the service can run on ``fabric`` under routing ``mode``."""
        if mode not in MODES:
            raise ValueError(f"needs routing {' or '.join(MODES)}, not {mode!r}")
        try:
            address = ipaddress.IPv4Address(self.service_ip)
        except ValueError:
            raise ValueError(f"service_ip {self.service_ip!r} is not an IPv4 address") from None
        if (address not in HOST_NETWORK
                or address in (HOST_NETWORK.network_address, HOST_NETWORK.broadcast_address)):
            raise ValueError(f"service_ip {address} must be a host address in {HOST_NETWORK}, "
                             "the hosts' own network")
        live_replicas(fabric, self.service_ip, self.replicas)  # names hosts, not a host's IP


def anycast_problem(fabric: Fabric, anycast, mode: str) -> str | None:
    """Why an anycast setting (as a scenario gives it) cannot run, or None when it can."""
    try:
        AnycastService.from_dict(anycast).check(fabric, mode)
    except ValueError as exc:
        return str(exc)
    return None


def link_ends(fabric: Fabric) -> dict[End, Link]:
    """(switch, port) -> the link cabled there, for every switch port of the fabric."""
    switches = {s.name for s in fabric.switches}
    return {(node, port): link for link in fabric.links
            for node, port in ((link.a, link.a_port), (link.b, link.b_port)) if node in switches}


def link_description(link: Link) -> dict:
    return {"a": link.a, "a_port": link.a_port, "b": link.b, "b_port": link.b_port}


@dataclass(frozen=True)
class Change:
    """A change in what is down: ``event`` is link_down, link_up, switch_down or switch_up
    (the controller adds ``recomputed``: a switch connected after changes that no connected
    switch was there to receive)."""

    event: str
    link: Link | None = None
    switch: str | None = None

    def describe(self) -> str:
        """"link_down p0e0:3-p0a0:1", "switch_down p0a0"."""
        if self.link is not None:
            what = f"{self.link.a}:{self.link.a_port}-{self.link.b}:{self.link.b_port}"
        else:
            what = self.switch or ""
        return f"{self.event} {what}".strip()

    def to_dict(self) -> dict:
        return {"event": self.event,
                "link": link_description(self.link) if self.link else None,
                "switch": self.switch}


def ugal_updates(view: DragonflyView, applied: Mapping[UgalKey, UgalWeights],
                 utilisation: Mapping[tuple[str, int], float],
                 min_change: int = UGAL_MIN_WEIGHT_CHANGE) -> dict[UgalKey, UgalWeights]:
    """The source groups to rewrite after a poll round: for every (router, destination group)
    of ``applied`` (the weights installed), the new UGAL weights from ``utilisation``
    (fraction of the link rate per (router, output port)) when some option's weight moved by
    at least ``min_change``."""
    changed = {}
    for (router, group), before in applied.items():
        after = ugal_weights(view, router, group, utilisation)
        moved = max(abs(after.get(option, 0) - before.get(option, 0))
                    for option in set(before) | set(after))
        if moved >= min_change:
            changed[(router, group)] = after
    return changed


class FabricState:
    """The failure bookkeeping and the tables of every switch (see the module docstring)."""

    def __init__(self, fabric: Fabric, mode: str = ECMP, anycast: AnycastService | None = None):
        problem = routing_problem(fabric.kind, mode)
        if problem:
            raise ValueError(f"routing: {problem}")
        if anycast is not None:
            anycast.check(fabric, mode)
        self.fabric = fabric
        self.mode = mode
        self.anycast = anycast
        self.names = {s.dpid: s.name for s in fabric.switches}
        self.links_at = link_ends(fabric)
        self.seen_up: set[End] = set()
        self.down_ends: set[End] = set()
        self.failed_switches: set[str] = set()
        self.rules: dict[str, SwitchRules] = {}
        self.ugal_applied: dict[UgalKey, UgalWeights] = {}
        self.view = dragonfly_view(fabric) if mode in DRAGONFLY_MODES else None
        self.placements = FlowPlacements(self.view) if mode == UGAL else None
        self.tables = self.compute_tables()
        self.dirty = False

    @property
    def reroutes(self) -> bool:
        """Whether failures change the rules (the shortest-path family) or are only recorded."""
        return self.mode in MODES

    @property
    def failed_links(self) -> frozenset[Link]:
        return frozenset(self.links_at[end] for end in self.down_ends)

    def failures(self) -> Failures:
        return resolve_failures(self.fabric, self.failed_links, self.failed_switches)

    # --- events ------------------------------------------------------------------------------
    def port_status(self, switch: str, port: int, up: bool) -> Change | None:
        """A port of ``switch`` reported up or down; the change of a link, if any."""
        end = (switch, port)
        link = self.links_at.get(end)
        if link is None:
            return None  # the bridge's own port, or a port the fabric does not know
        was_failed = link in self.failed_links
        if up:
            self.seen_up.add(end)
            self.down_ends.discard(end)
        elif end in self.seen_up:
            self.down_ends.add(end)
        is_failed = link in self.failed_links
        if was_failed == is_failed:
            return None
        self.dirty = True
        return Change("link_down" if is_failed else "link_up", link=link)

    def switch_status(self, switch: str, up: bool) -> Change | None:
        """``switch`` connected (up) or disconnected; the change, if it is one."""
        if not up and self.placements is not None:
            self.placements.forget_router(switch)  # its rules' removals go unreported
        if (switch not in self.failed_switches) == up:
            return None
        if up:
            self.failed_switches.discard(switch)
        else:
            self.failed_switches.add(switch)
        self.dirty = True
        return Change("switch_up" if up else "switch_down", switch=switch)

    # --- tables ------------------------------------------------------------------------------
    def program(self, switch: str) -> list[Message | TransportRule]:
        """Everything ``switch`` is sent when it connects (testbed.controllers.routing.forwarding.program_plan
        of its current table) and, under ``ugal``, the rules that send the controller each
        new flow's first packet, before the final barrier. The wipe removes the rules of the
        flows placed there, so they are forgotten."""
        plan: list[Message | TransportRule] = program_plan(self.tables[switch])
        if self.placements is None:
            return plan
        self.placements.forget_router(switch)
        assert isinstance(plan[-1], Barrier)
        return plan[:-1] + to_controller_rules(self.view, switch) + plan[-1:]

    def refresh(self) -> dict[str, list[Message]]:
        """Recompute after changes; per switch, the update plan of every switch whose table
        changed (none when nothing changed or when failures are only recorded)."""
        if not self.dirty:
            return {}
        self.dirty = False
        if not self.reroutes:
            return {}
        tables = self.compute_tables()
        plans = update_plans(self.tables, tables)
        self.tables = tables
        return plans

    def compute_tables(self) -> dict[str, SwitchTable]:
        if not self.reroutes:
            rules = compute_dragonfly_rules(self.fabric, self.mode)
            if self.mode == UGAL:
                self.ugal_applied = {(router, group): ugal_weights(self.view, router, group, {})
                                     for router in rules for group in self.view.groups
                                     if group != self.view.group_of[router]}
            return {name: dragonfly_table(r) for name, r in rules.items()}
        failures = self.failures()
        self.rules = recompute_rules(self.fabric, failures, self.rules or None, self.mode)
        anycast = self.anycast_routes(failures)
        return {name: routing_table(r, anycast.get(name)) for name, r in self.rules.items()}

    def anycast_routes(self, failures: Failures) -> dict[str, AnycastRoute]:
        """The anycast route of every switch that reaches a replica over what survives."""
        if self.anycast is None:
            return {}
        surviving = surviving_fabric(self.fabric, failures)
        cabled = [name for name in self.anycast.replicas if name in surviving.nodes]
        if not cabled:
            return {}
        return anycast_routes(surviving, self.anycast.service_ip, cabled, mode=self.mode)

    def ugal_round(self, loads_mbit: Mapping[tuple[str, int], float]) -> dict[str, list[Message]]:
        """New UGAL weights from one poll round's measured loads (Mbit/s sent per (router,
        output port)); per router, the group modifications of the source groups that moved
        enough (``ugal_updates``)."""
        if self.mode != UGAL:
            return {}
        utilisation = link_utilisation(self.fabric, {end: load for end, load in loads_mbit.items()
                                                     if end in self.links_at})
        self.placements.measured(utilisation)
        changed = ugal_updates(self.view, self.ugal_applied, utilisation)
        tables = dict(self.tables)
        for (router, group), weights in changed.items():
            groups = dict(tables[router].groups)
            groups[source_group_id(group)] = source_buckets(self.view, router, group, UGAL,
                                                            utilisation)
            tables[router] = replace(tables[router], groups=groups)
            self.ugal_applied[(router, group)] = weights
        plans = update_plans(self.tables, tables)
        self.tables = tables
        return plans

    # --- flows placed one by one (ugal) ---------------------------------------------------------
    def place_flow(self, switch: str, in_port: int, flow: FiveTuple,
                   weight_flows: float) -> tuple[Placement, bool]:
        """Where ``switch`` sends a new flow that entered by host port ``in_port``, and
        whether the placement is new (testbed.controllers.routing.ugal.FlowPlacements.place); ValueError
        unless routing is ``ugal`` and the flow leaves for another group."""
        if self.placements is None:
            raise ValueError(f"flows are placed under ugal routing, not {self.mode}")
        return self.placements.place(switch, in_port, flow, weight_flows)

    def flow_removed(self, cookie: int) -> Placement | None:
        """A placed flow's rule is gone: the placement it was, or None if none is known."""
        return self.placements.remove(cookie) if self.placements is not None else None
