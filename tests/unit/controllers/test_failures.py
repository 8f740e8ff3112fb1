"""Forwarding after link and switch failures: recomputed rules reach every surviving host along
shortest paths of what survives, never over what failed; group ids stay put where the buckets
do; and the per-switch difference, applied to the old state, gives exactly the new one."""
from __future__ import annotations

import random
from dataclasses import replace

import networkx as nx
import pytest
from tests.unit.fabric_walk import Walker, fabric_id, out_ports, route_table

from testbed.controllers.routing.ecmp import (
    MODES,
    SINGLE,
    PortRoute,
    Route,
    SwitchRules,
    compute_rules,
)
from testbed.controllers.routing.failures import (
    Failures,
    SwitchDiff,
    recompute_rules,
    resolve_failures,
    rule_diff,
    stable_group_ids,
    surviving_fabric,
    switch_diff,
)
from testbed.model.topology import build
from testbed.model.topology.base import Fabric
from testbed.model.topology.fattree import fat_tree

FABRICS = [("fattree", {"k": 4}), ("fattree", {"k": 6}),
           ("spineleaf", {"leaves": 3, "spines": 3, "hosts_per_leaf": 2}), ("clos", {}),
           ("dragonfly", {"p": 1, "a": 3, "h": 1}),
           ("rail", {"nodes": 3, "gpus_per_node": 4, "spines": 2})]
SEEDS = range(5)
SAMPLED_HOST_PAIRS = 40


def random_failures(fabric: Fabric, rng: random.Random) -> Failures:
    """One to three failed links (a host link among them now and then) and at most one
    failed switch."""
    trunks = [link for link in fabric.links
              if not (fabric.nodes[link.a].is_host or fabric.nodes[link.b].is_host)]
    host_links = [link for link in fabric.links if link not in trunks]
    links = rng.sample(trunks, rng.randint(1, min(3, len(trunks))))
    if rng.random() < 0.3:
        links.append(rng.choice(host_links))
    switches = rng.sample([s.name for s in fabric.switches], rng.randint(0, 1))
    # name links by an end half of the time, as a port-status event would
    refs = [link if rng.random() < 0.5 else (link.b, link.b_port) for link in links]
    return resolve_failures(fabric, refs, switches)


def failed_hops(failures: Failures) -> set[frozenset[str]]:
    return {frozenset((link.a, link.b)) for link in failures.links}


def state(rules: SwitchRules) -> tuple:
    """What a switch holds, independent of list order."""
    return (rules.groups, {r.dst_ip: r for r in rules.routes},
            {r.in_port: r for r in rules.port_routes})


def applied(old: SwitchRules, diff: SwitchDiff) -> SwitchRules:
    """``old`` after the controller sends ``diff``; fails on an add of an id in use or a
    modify of an id not in use."""
    assert not set(diff.groups_added) & set(old.groups), diff
    assert set(diff.groups_modified) | set(diff.groups_removed) <= set(old.groups), diff
    groups = {gid: p for gid, p in old.groups.items() if gid not in diff.groups_removed}
    groups.update(diff.groups_modified)
    groups.update(diff.groups_added)
    routes = {r.dst_ip: r for r in old.routes if r.dst_ip not in diff.routes_removed}
    routes.update({r.dst_ip: r for r in diff.routes_added + diff.routes_changed})
    port_routes = {r.in_port: r for r in old.port_routes
                   if r.in_port not in diff.port_routes_removed}
    port_routes.update({r.in_port: r for r in diff.port_routes_added + diff.port_routes_changed})
    return replace(old, groups=groups, routes=list(routes.values()),
                   port_routes=list(port_routes.values()))


def apply_all(old: dict[str, SwitchRules], diffs: dict[str, SwitchDiff]) -> dict[str, SwitchRules]:
    return {name: applied(r, diffs[name]) if name in diffs else r for name, r in old.items()}


def assert_same_forwarding(a: dict[str, SwitchRules], b: dict[str, SwitchRules]):
    """Same out ports for every route and same port routes, whatever the group numbering."""
    assert set(a) == set(b)
    for name in a:
        ports_a = {r.dst_ip: out_ports(a[name], r) for r in a[name].routes}
        ports_b = {r.dst_ip: out_ports(b[name], r) for r in b[name].routes}
        assert ports_a == ports_b, name
        assert sorted(a[name].port_routes, key=lambda r: r.in_port) == \
            sorted(b[name].port_routes, key=lambda r: r.in_port), name


def assert_groups_all_used(rules: dict[str, SwitchRules]):
    for r in rules.values():
        assert {route.group_id for route in r.routes if route.group_id} == set(r.groups), r.name


def assert_reaches_survivors(fabric: Fabric, failures: Failures,
                             rules: dict[str, SwitchRules], mode: str, rng: random.Random):
    """Walked on the original cabling: every surviving host is reached from every switch still
    connected to it, along shortest paths of the surviving graph, none over a failed link or
    switch; switches cut off from a host, and every switch for a host taken off the fabric,
    have no route."""
    view = surviving_fabric(fabric, failures)
    graph = view.graph()
    switch_graph = graph.subgraph(s.name for s in view.switches)
    walker = Walker(fabric, rules)
    bad_hops = failed_hops(failures)
    for host in fabric.hosts:
        tables = {name: route_table(r) for name, r in rules.items()}
        if host.name not in view.nodes:
            assert all(host.ip not in table for table in tables.values()), host.name
            continue
        edge, _ = view.host_attachment(host.name)
        dist = nx.single_source_shortest_path_length(switch_graph, edge)
        for switch in fabric.switches:
            if switch.name not in dist:
                assert host.ip not in tables[switch.name], (switch.name, host.name)
                continue
            paths = walker.paths(switch.name, host)
            for path in paths:
                assert len(path) - 2 == dist[switch.name], path
                assert not set(path) & failures.switches, path
                assert not {frozenset(hop) for hop in zip(path, path[1:])} & bad_hops, path
            if mode == SINGLE:
                assert len(paths) == 1
    survivors = list(view.hosts)
    pairs = [(a, b) for a in survivors for b in survivors if a is not b]
    for src, dst in rng.sample(pairs, min(SAMPLED_HOST_PAIRS, len(pairs))):
        if not nx.has_path(graph, src.name, dst.name):
            continue
        for path in walker.host_paths(src, dst):
            assert len(path) - 1 == nx.shortest_path_length(graph, src.name, dst.name), path


@pytest.fixture(scope="module", params=FABRICS, ids=[fabric_id(e) for e in FABRICS])
def fabric(request) -> Fabric:
    kind, params = request.param
    return build(kind, **params)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("seed", SEEDS)
def test_random_failures_route_around_along_shortest_paths(fabric, mode, seed):
    rng = random.Random(seed)
    failures = random_failures(fabric, rng)
    before = compute_rules(fabric, mode)
    after = recompute_rules(fabric, failures, before, mode)
    assert_reaches_survivors(fabric, failures, after, mode, rng)
    # the same forwarding as routing computes on what survives, only renumbered
    assert_same_forwarding(after, compute_rules(surviving_fabric(fabric, failures), mode))
    assert_groups_all_used(after)
    for name in failures.switches:
        assert state(after[name]) == ({}, {}, {})


@pytest.mark.parametrize("seed", SEEDS)
def test_group_ids_follow_the_buckets_and_the_diff_rebuilds_the_new_state(fabric, seed):
    rng = random.Random(100 + seed)
    before = compute_rules(fabric)
    after = recompute_rules(fabric, random_failures(fabric, rng), before)
    diffs = rule_diff(before, after)
    for name, old in before.items():
        new = after[name]
        old_ids = {ports: gid for gid, ports in old.groups.items()}
        for gid, ports in new.groups.items():
            if ports in old_ids:
                assert gid == old_ids[ports], (name, ports)
        if name in diffs:
            assert not set(diffs[name].groups_added) & set(old.groups)
            assert diffs[name].message_count > 0
    rebuilt = apply_all(before, diffs)
    assert {n: state(r) for n, r in rebuilt.items()} == {n: state(r) for n, r in after.items()}


def test_a_sequence_of_failures_and_repairs_stays_in_step_and_ends_where_it_began(fabric):
    """The controller's mirror of the switches, updated by diffs only, always equals the
    recomputed rules; repairing everything restores the original forwarding."""
    rng = random.Random(7)
    original = compute_rules(fabric)
    held, failed = original, Failures()
    for _ in range(6):
        if failed.links and rng.random() < 0.4:
            failed = Failures(frozenset(rng.sample(sorted(failed.links, key=str),
                                                   len(failed.links) - 1)), failed.switches)
        else:
            extra = random_failures(fabric, rng)
            failed = Failures(failed.links | extra.links, failed.switches | extra.switches)
        new = recompute_rules(fabric, failed, held)
        held = apply_all(held, rule_diff(held, new))
        assert {n: state(r) for n, r in held.items()} == {n: state(r) for n, r in new.items()}
        assert_groups_all_used(held)
    repaired = recompute_rules(fabric, Failures(), held)
    assert_same_forwarding(repaired, original)
    assert rule_diff(repaired, recompute_rules(fabric, Failures(), repaired)) == {}


# --- naming failures and the surviving fabric ------------------------------------------------


def test_links_are_named_by_either_end_or_by_the_link():
    tree = fat_tree(4)
    link = next(link for link in tree.links if (link.a, link.b) == ("p0e0", "p0a0"))
    by_a = resolve_failures(tree, [(link.a, link.a_port)])
    by_b = resolve_failures(tree, [(link.b, link.b_port)])
    by_link = resolve_failures(tree, [replace(link)])
    assert by_a == by_b == by_link == Failures(frozenset({link}))


@pytest.mark.parametrize(("links", "switches", "text"), [
    ([("p0e0", 99)], (), "no link ends"), ([("nowhere", 1)], (), "no link ends"),
    ((), ["p0e0h0"], "not a switch"), ((), ["x"], "not a switch")])
def test_unknown_failures_are_refused(links, switches, text):
    with pytest.raises(ValueError, match=text):
        resolve_failures(fat_tree(4), links, switches)


def test_surviving_fabric_drops_failed_parts_and_the_hosts_they_strand():
    tree = fat_tree(4)
    count = (len(tree.nodes), len(tree.links))
    failures = resolve_failures(tree, [("p0e0h0", 0), ("p1e0", 3)], ["p2e1"])
    view = surviving_fabric(tree, failures)
    assert (len(tree.nodes), len(tree.links)) == count  # the original is left alone
    assert "p0e0h0" not in view.nodes and "p0e0h1" in view.nodes
    assert {"p2e1h0", "p2e1h1"}.isdisjoint(view.nodes)
    assert "p2e1" in view.nodes and not any("p2e1" in (link.a, link.b) for link in view.links)
    assert ("p1e0", 3) not in {end for link in view.links
                               for end in ((link.a, link.a_port), (link.b, link.b_port))}
    # one host link, p1e0's uplink, p2e1's 2 uplinks and 2 host links
    assert len(view.links) == len(tree.links) - 6
    assert surviving_fabric(tree, Failures()).to_dict() == tree.to_dict()


# --- what one failure costs ------------------------------------------------------------------


def test_an_edge_uplink_failure_is_one_group_modify_at_that_edge_switch():
    """k=8: p0e0 loses uplink 5; its shared group (5,6,7,8) becomes (6,7,8) under the same
    id, so every route through it moves with one OFPGC_MODIFY and no flow changes."""
    tree = fat_tree(8)
    before = compute_rules(tree)
    after = recompute_rules(tree, resolve_failures(tree, [("p0e0", 5)]), before)
    diff = rule_diff(before, after)["p0e0"]
    assert diff == SwitchDiff("p0e0", tree.nodes["p0e0"].dpid, groups_modified={1: (6, 7, 8)})
    assert diff.message_count == 1


def test_a_host_link_failure_only_withdraws_routes_to_that_host():
    tree = fat_tree(4)
    host = tree.nodes["p3e1h0"]
    before = compute_rules(tree)
    diffs = rule_diff(before, recompute_rules(tree, resolve_failures(tree, [(host.name, 0)]),
                                              before))
    assert set(diffs) == set(before)
    for name, diff in diffs.items():
        assert diff == SwitchDiff(name, tree.nodes[name].dpid, routes_removed=(host.ip,))


def test_a_failed_switch_is_emptied_and_its_neighbours_drop_its_ports():
    tree = fat_tree(4)
    before = compute_rules(tree)
    after = recompute_rules(tree, resolve_failures(tree, switches=["c0"]), before)
    diff = rule_diff(before, after)["c0"]
    assert len(diff.routes_removed) == len(tree.hosts) and not diff.routes_added
    # p*a0 lost core c0 (port 3): remote pods through c1 alone, a plain port; the group goes
    for pod in range(4):
        agg = rule_diff(before, after)[f"p{pod}a0"]
        assert agg.groups_removed == (1,) and not agg.groups_added
        assert {r.port for r in agg.routes_changed} == {4}


# --- numbering and diffing, by hand ----------------------------------------------------------


def rules_of(groups: dict, routes: dict) -> SwitchRules:
    """A switch ``s`` with these groups and dst -> port (int) or group id (str "gN")."""
    made = [Route(ip, group_id=int(to[1:])) if isinstance(to, str) else Route(ip, port=to)
            for ip, to in routes.items()]
    return SwitchRules("s", 1, groups=dict(groups), routes=made)


def test_stable_ids_keep_inherit_or_take_a_fresh_number():
    old = rules_of({1: (3, 4, 5), 2: (1, 2), 3: (6, 7)},
                   {"A": "g1", "B": "g1", "C": "g1", "D": "g2", "E": 9, "F": "g3"})
    # as group_for numbers them: by first use, so (1, 2) now has id 2 by chance only
    new = rules_of({1: (4, 5), 2: (1, 2), 3: (8, 9), 4: (3, 5)},
                   {"A": "g1", "B": "g1", "C": "g4", "D": "g2", "E": "g3", "F": 6})
    stable = stable_group_ids(old, new)
    # (1,2) kept 2; (4,5) took over 1 from (3,4,5), followed by 2 of its 3 routes; (3,5), also
    # from 1, and (8,9), new, take numbers unused before: 4 and 5; 3 goes away
    assert stable.groups == {1: (4, 5), 2: (1, 2), 4: (8, 9), 5: (3, 5)}
    table = route_table(stable)
    assert {ip: out_ports(stable, r) for ip, r in table.items()} == {
        "A": (4, 5), "B": (4, 5), "C": (3, 5), "D": (1, 2), "E": (8, 9), "F": (6,)}
    diff = switch_diff(old, stable)
    assert diff.groups_modified == {1: (4, 5)}
    assert diff.groups_added == {4: (8, 9), 5: (3, 5)}
    assert diff.groups_removed == (3,)
    assert {r.dst_ip for r in diff.routes_changed} == {"C", "E", "F"}


def test_stable_ids_keep_everything_when_nothing_changed_and_keep_port_routes():
    rules = rules_of({1: (3, 4), 2: (5, 6)}, {"A": "g2", "B": "g1"})
    rules.port_routes = [PortRoute(1, 5)]
    assert stable_group_ids(rules, rules) == rules
    shuffled = rules_of({1: (5, 6), 2: (3, 4)}, {"A": "g1", "B": "g2"})
    shuffled.port_routes = [PortRoute(1, 5)]
    assert stable_group_ids(rules, shuffled) == rules


def test_rule_diff_reports_routes_and_port_routes_by_key_and_whole_switches():
    old = {"s": rules_of({1: (1, 2)}, {"A": 1, "B": "g1", "C": 3})}
    old["s"].port_routes = [PortRoute(1, 5), PortRoute(2, 6)]
    new = {"s": rules_of({1: (1, 2)}, {"A": 1, "B": 2, "D": 4}),
           "t": rules_of({}, {"A": 1})}
    new["s"].port_routes = [PortRoute(1, 7), PortRoute(3, 8)]
    diffs = rule_diff(old, new)
    assert diffs["s"] == SwitchDiff("s", 1, routes_added=(Route("D", port=4),),
                                    routes_changed=(Route("B", port=2),), routes_removed=("C",),
                                    port_routes_added=(PortRoute(3, 8),),
                                    port_routes_changed=(PortRoute(1, 7),),
                                    port_routes_removed=(2,))
    assert diffs["t"].routes_added == (Route("A", port=1),)
    assert rule_diff(new, old)["t"].routes_removed == ("A",)
    assert rule_diff(old, old) == {}
