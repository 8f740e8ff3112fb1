"""The tables the controller installs and the plans that install or change them: a plan
replayed on a switch (OpenFlow 1.3 group and flow semantics) yields exactly the new table,
never points a flow at a missing group or drops a destination on the way, and comes in the
documented order; the tables forward as the routing they come from."""
from __future__ import annotations

import random
import re

import networkx as nx
import pytest
from tests.unit.fabric_walk import FlowWalker, fabric_id, table_rules

from testbed.controllers.routing.anycast import replica_for_hosts
from testbed.controllers.routing.dragonfly import (
    DRAGONFLY_MODES,
    RouterRules,
    compute_dragonfly_rules,
)
from testbed.controllers.routing.ecmp import MODES
from testbed.controllers.routing.fabric_state import AnycastService, FabricState
from testbed.controllers.routing.failures import rule_diff, surviving_fabric
from testbed.controllers.routing.forwarding import (
    ADD,
    DELETE,
    ETH_TYPE_ARP,
    ETH_TYPE_IPV4,
    MODIFY,
    PRIORITY_ARP,
    Barrier,
    FlowMod,
    GroupMod,
    SwitchTable,
    Wipe,
    describe_plan,
    group_ports,
    program_plan,
    update_plan,
    update_plans,
)
from testbed.controllers.routing.rules import (
    Bucket,
    FlowMatch,
    Output,
    PushVlan,
    SetEthDst,
    ToController,
    ToGroup,
)
from testbed.model.topology import build
from testbed.model.topology.base import Fabric

FABRICS = [("fattree", {"k": 4}), ("fattree", {"k": 8, "hosts_per_edge": 1}),
           ("spineleaf", {"leaves": 3, "spines": 3, "hosts_per_leaf": 2}), ("clos", {}),
           ("dragonfly", {"p": 1, "a": 3, "h": 1}),
           ("rail", {"nodes": 3, "gpus_per_node": 4, "spines": 2})]
SEEDS = range(4)
SAMPLED_HOST_PAIRS = 30
SERVICE_IP = "10.255.0.1"


class SimulatedSwitch:
    """A switch's groups and flows under OpenFlow 1.3 semantics, as far as plans need: adding
    a group id in use, modifying or deleting one not in use, or a flow pointing at a missing
    group is refused (an error, as OVS sends one); a strict modify or delete of a missing
    flow changes nothing (so a plan relying on one is wrong); deleting a group deletes the
    flows still pointing at it."""

    def __init__(self, table: SwitchTable):
        self.groups = dict(table.groups)
        self.flows = dict(table.flows)

    def apply(self, message) -> None:
        if isinstance(message, Wipe):
            self.groups, self.flows = {}, {}
        elif isinstance(message, GroupMod):
            present = message.group_id in self.groups
            assert present == (message.command != ADD), message.describe()
            if message.command == DELETE:
                del self.groups[message.group_id]
                self.flows = {k: a for k, a in self.flows.items()
                              if ToGroup(message.group_id) not in a}
            else:
                self.groups[message.group_id] = message.buckets
        elif isinstance(message, FlowMod):
            key = (message.priority, message.match)
            if message.command == DELETE:
                assert key in self.flows, message.describe()
                del self.flows[key]
                return
            assert (key in self.flows) == (message.command == MODIFY), message.describe()
            missing = {a.group_id for a in message.actions if isinstance(a, ToGroup)} - set(
                self.groups)
            assert not missing, f"{message.describe()} points at missing groups {missing}"
            self.flows[key] = message.actions
        else:
            assert isinstance(message, Barrier), message

    def destinations(self) -> set[tuple]:
        return {match for _, match in self.flows}

    def holds(self, table: SwitchTable) -> bool:
        return self.groups == table.groups and self.flows == table.flows


PLAN_SHAPE = re.compile(r"(group add )*(group modify )*(flow add )*(flow modify )*"
                        r"(barrier (flow delete )*(group delete )*)?barrier ")


def plan_shape(plan) -> str:
    """The plan as its message kinds, ids and matches left out: "group add flow add barrier"."""
    return "".join(" ".join(d.split()[:2]) + " " if not d.startswith("barrier") else "barrier "
                   for d in describe_plan(plan))


def replay(old: SwitchTable, new: SwitchTable, plan) -> None:
    """Replay ``plan`` on a switch holding ``old``: every step legal, no destination that both
    tables route ever missing (make before break), and ``new`` held at the end."""
    switch = SimulatedSwitch(old)
    kept = switch.destinations() & set(new_match for _, new_match in new.flows)
    for message in plan:
        switch.apply(message)
        assert kept <= switch.destinations(), f"{old.name} lost a route at {message.describe()}"
    assert switch.holds(new), old.name


def all_ports_up(state: FabricState) -> None:
    for switch, port in state.links_at:
        assert state.port_status(switch, port, True) is None


@pytest.fixture(scope="module", params=FABRICS, ids=[fabric_id(e) for e in FABRICS])
def fabric(request) -> Fabric:
    kind, params = request.param
    return build(kind, **params)


# --- one plan, message by message ------------------------------------------------------------


def small_tables() -> tuple[SwitchTable, SwitchTable]:
    """Group 1 loses a bucket, group 2 is new, group 3 goes; a route moves to group 2, one is
    added, one removed, one stays."""
    def ip(n: int) -> FlowMatch:
        return FlowMatch(eth_type=ETH_TYPE_IPV4, ipv4_dst=f"10.0.0.{n}")

    def ports(*numbers: int) -> tuple[Bucket, ...]:
        return tuple(Bucket(1, (Output(p),)) for p in numbers)

    old = SwitchTable("s", 1, groups={1: ports(1, 2), 3: ports(3, 4)},
                      flows={(100, ip(2)): (ToGroup(1),), (100, ip(3)): (Output(3),),
                             (100, ip(4)): (ToGroup(3),)})
    new = SwitchTable("s", 1, groups={1: ports(1), 2: ports(2, 3)},
                      flows={(100, ip(2)): (ToGroup(1),), (100, ip(3)): (ToGroup(2),),
                             (100, ip(5)): (Output(4),)})
    return old, new


def test_update_plan_comes_in_the_safe_order():
    old, new = small_tables()
    assert describe_plan(update_plan(old, new)) == [
        "group add 2",
        "group modify 1",
        "flow add 100 eth_type=0x0800,ipv4_dst=10.0.0.5",
        "flow modify 100 eth_type=0x0800,ipv4_dst=10.0.0.3",
        "barrier",
        "flow delete 100 eth_type=0x0800,ipv4_dst=10.0.0.4",
        "group delete 3",
        "barrier",
    ]
    replay(old, new, update_plan(old, new))


def test_update_plan_without_removals_has_one_barrier_and_equal_tables_none():
    old, new = small_tables()
    grown = SwitchTable("s", 1, groups={**old.groups, **new.groups},
                        flows={**old.flows, **new.flows})
    assert plan_shape(update_plan(old, grown)) == ("group add group modify flow add flow modify "
                                                   "barrier ")
    assert update_plan(old, old) == []
    assert update_plans({"s": old}, {"s": old}) == {}


def test_program_plan_wipes_then_builds_the_whole_table():
    old, new = small_tables()
    plan = program_plan(new)
    assert isinstance(plan[0], Wipe) and isinstance(plan[-1], Barrier)
    kinds = plan_shape(plan[1:])
    assert kinds == "group add " * len(new.groups) + "flow add " * len(new.flows) + "barrier "
    switch = SimulatedSwitch(old)  # whatever it held before
    for message in plan:
        switch.apply(message)
    assert switch.holds(new)


# --- plans after failures, on whole fabrics --------------------------------------------------


def fail_random_links(state: FabricState, rng: random.Random, count: int) -> list:
    """Take ``count`` random links down, each by one of its switch ends."""
    links = rng.sample(sorted(set(state.links_at.values()), key=str), count)
    for link in links:
        end = next(e for e in ((link.a, link.a_port), (link.b, link.b_port))
                   if e in state.links_at)
        assert state.port_status(*end, up=False).event == "link_down"
    return links


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("seed", SEEDS)
def test_failure_plans_replay_to_the_recomputed_tables(fabric, mode, seed):
    rng = random.Random(seed)
    state = FabricState(fabric, mode)
    all_ports_up(state)
    before_rules, before = dict(state.rules), dict(state.tables)
    fail_random_links(state, rng, rng.randint(1, 3))
    plans = state.refresh()
    for name, table in state.tables.items():
        if name in plans:
            assert PLAN_SHAPE.fullmatch(plan_shape(plans[name])), describe_plan(plans[name])
            replay(before[name], table, plans[name])
        else:
            assert before[name] == table, name
    # the same switches, and the same group changes, as failures.rule_diff finds
    diffs = rule_diff(before_rules, state.rules)
    assert set(plans) == set(diffs)
    for name, diff in diffs.items():
        group_changes = {(m.command, m.group_id) for m in plans[name] if isinstance(m, GroupMod)}
        assert group_changes == ({(ADD, g) for g in diff.groups_added}
                                 | {(MODIFY, g) for g in diff.groups_modified}
                                 | {(DELETE, g) for g in diff.groups_removed}), name


def normalised(table: SwitchTable) -> dict:
    """A table's flows with each group replaced by its buckets: equal for equal forwarding,
    whatever the group numbering."""
    def expand(actions):
        return tuple(table.groups[a.group_id] if isinstance(a, ToGroup) else a for a in actions)
    return {key: expand(actions) for key, actions in table.flows.items()}


def test_repairing_every_link_restores_the_forwarding_and_replays_back(fabric):
    rng = random.Random(5)
    state = FabricState(fabric)
    all_ports_up(state)
    original = {name: normalised(t) for name, t in state.tables.items()}
    links = fail_random_links(state, rng, 3)
    state.refresh()
    failed = dict(state.tables)
    for link in links:
        for end in ((link.a, link.a_port), (link.b, link.b_port)):
            if end in state.links_at:
                state.port_status(*end, up=True)
    plans = state.refresh()
    for name, plan in plans.items():
        replay(failed[name], state.tables[name], plan)
    assert {name: normalised(t) for name, t in state.tables.items()} == original


# --- the tables forward as their routing does ------------------------------------------------


@pytest.mark.parametrize("seed", SEEDS)
def test_tables_deliver_every_survivor_and_anycast_to_its_replica(fabric, seed):
    rng = random.Random(50 + seed)
    hosts = [h.name for h in fabric.hosts]
    service = AnycastService(SERVICE_IP, tuple(rng.sample(hosts, 2)))
    state = FabricState(fabric, anycast=service)
    all_ports_up(state)
    links = fail_random_links(state, rng, rng.randint(1, 2))
    state.refresh()
    failures = state.failures()
    view = surviving_fabric(fabric, failures)
    graph = view.graph()
    walker = FlowWalker(fabric, table_rules(state.tables))
    cut = {frozenset((link.a, link.b)) for link in links}
    survivors = [h.name for h in view.hosts]
    pairs = [(a, b) for a in survivors for b in survivors if a != b and nx.has_path(graph, a, b)]
    for src, dst in rng.sample(pairs, min(SAMPLED_HOST_PAIRS, len(pairs))):
        for trace in walker.traces(src, fabric.nodes[dst].ip):
            nodes = [src] + [hop.node for hop in trace]
            assert nodes[-1] == dst, nodes
            assert not {frozenset(h) for h in zip(nodes, nodes[1:])} & cut, nodes
    cabled = [r for r in service.replicas if r in view.nodes]
    expected = replica_for_hosts(view, state.anycast_routes(failures), cabled)
    for host in survivors:
        if host in service.replicas or expected[host] is None:
            continue  # a replica answers itself; a host cut off from every replica: no route
        for trace in walker.traces(host, SERVICE_IP):
            assert trace[-1].node == expected[host], (host, trace)
            last_switch = state.tables[trace[-2].node]
            rewrites = [actions[0] for (_, match), actions in last_switch.flows.items()
                        if match.ipv4_dst == SERVICE_IP]
            assert rewrites == [SetEthDst(fabric.nodes[expected[host]].mac)]


@pytest.mark.parametrize("mode", DRAGONFLY_MODES)
def test_dragonfly_tables_walk_like_their_rules(mode):
    fabric = build("dragonfly", p=1, a=3, h=1)
    rules = compute_dragonfly_rules(fabric, mode)
    tables = FabricState(fabric, mode).tables
    by_rules, by_tables = FlowWalker(fabric, rules), FlowWalker(fabric, table_rules(tables))
    for src in fabric.hosts:
        for dst in fabric.hosts:
            if src is not dst:
                assert by_tables.traces(src.name, dst.ip) == by_rules.traces(src.name, dst.ip)


def test_every_table_sends_arp_to_the_controller_and_groups_list_their_ports():
    fabric = build("dragonfly", p=1, a=3, h=1)
    for mode in MODES + DRAGONFLY_MODES:
        for table in FabricState(fabric, mode).tables.values():
            assert table.flows[(PRIORITY_ARP, FlowMatch(eth_type=ETH_TYPE_ARP))] == (
                ToController(),)
    router = RouterRules("r", 1, groups={
        2: (Bucket(600, (Output(4),)), Bucket(400, (PushVlan(3), Output(5)))),
        9: (Bucket(1, (Output(2),)), Bucket(1, (Output(1),)))})
    table = SwitchTable("r", 1, groups=router.groups)
    assert group_ports(table) == [(4, 5), (1, 2)]


def test_two_flows_for_one_match_and_priority_are_refused():
    table = SwitchTable("s", 1)
    table.add_flow(100, FlowMatch(ipv4_dst="10.0.0.2"), (Output(1),))
    with pytest.raises(ValueError, match="two flows"):
        table.add_flow(100, FlowMatch(ipv4_dst="10.0.0.2"), (Output(2),))
