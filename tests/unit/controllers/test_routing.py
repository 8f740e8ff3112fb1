"""Forwarding state computed from the fabric: every route reaches its host along a shortest
path, ECMP groups hold every equal-cost uplink, and the single-path baseline keeps one."""
from __future__ import annotations

import networkx as nx
import pytest
from tests.unit.fabric_walk import Walker, out_ports, route_table

from testbed.controllers.routing.ecmp import (
    ECMP,
    MODES,
    SINGLE,
    Route,
    SwitchRules,
    arp_table,
    compute_rules,
)
from testbed.model.topology.base import Fabric
from testbed.model.topology.fattree import AGGREGATION, CORE, EDGE, fat_tree

KS = [4, 6]


@pytest.fixture(scope="module", params=KS, ids=lambda k: f"k{k}")
def tree(request) -> tuple[int, Fabric]:
    return request.param, fat_tree(request.param)


@pytest.mark.parametrize("mode", [ECMP, SINGLE])
def test_every_switch_reaches_every_host_along_shortest_paths(tree, mode):
    """ECMP offers every equal-cost path, each once; single-path mode exactly one of them."""
    _, fabric = tree
    walker = Walker(fabric, compute_rules(fabric, mode))
    switch_graph = fabric.graph().subgraph(s.name for s in fabric.switches)
    for host in fabric.hosts:
        edge, _ = fabric.host_attachment(host.name)
        dist = nx.single_source_shortest_path_length(switch_graph, edge)
        for switch in fabric.switches:
            paths = walker.paths(switch.name, host)
            for path in paths:
                assert path[-2] == edge
                assert len(path) - 2 == dist[switch.name]  # switch hops to the edge switch
            equal_cost = sum(1 for _ in nx.all_shortest_paths(switch_graph, switch.name, edge))
            assert len(paths) == (equal_cost if mode == ECMP else 1)
            assert len({tuple(p) for p in paths}) == len(paths)


def test_single_mode_has_no_groups_and_one_port_per_route(tree):
    _, fabric = tree
    for rules in compute_rules(fabric, SINGLE).values():
        assert rules.groups == {}
        assert len(rules.routes) == len(fabric.hosts)
        assert all(r.port is not None and r.group_id is None for r in rules.routes)


def test_single_mode_keeps_the_lowest_numbered_next_hop(tree):
    _, fabric = tree
    ecmp = compute_rules(fabric, ECMP)
    single = compute_rules(fabric, SINGLE)
    for name, rules in ecmp.items():
        single_table = route_table(single[name])
        for route in rules.routes:
            assert single_table[route.dst_ip].port == min(out_ports(rules, route))


def test_ecmp_groups_are_the_uplinks_and_shared(tree):
    k, fabric = tree
    half = k // 2
    uplinks = tuple(range(half + 1, k + 1))
    rules = compute_rules(fabric, ECMP)
    for switch in fabric.switches:
        r = rules[switch.name]
        grouped = [route for route in r.routes if route.group_id is not None]
        if switch.role == EDGE:
            # one shared group: all k/2 uplinks, used by every host not on this edge switch
            assert r.groups == {1: uplinks}
            assert len(grouped) == len(fabric.hosts) - half
            assert {route.group_id for route in grouped} == {1}
        elif switch.role == AGGREGATION:
            # hosts outside the pod: all k/2 core uplinks; inside the pod: one port down
            assert r.groups == {1: uplinks}
            assert len(grouped) == len(fabric.hosts) - half * half
        else:
            assert switch.role == CORE
            assert r.groups == {}
            assert grouped == []
    assert sum(len(r.groups) for r in rules.values()) == k * k


def test_edge_switch_routes_its_own_hosts_to_their_ports(tree):
    k, fabric = tree
    rules = compute_rules(fabric, ECMP)
    edge = rules["p1e0"]
    table = route_table(edge)
    assert edge.host_ports == {i + 1: f"p1e0h{i}" for i in range(k // 2)}
    for port, name in edge.host_ports.items():
        assert table[fabric.nodes[name].ip] == Route(fabric.nodes[name].ip, port=port)


def test_core_switch_routes_each_pod_down_its_port(tree):
    _, fabric = tree
    table = route_table(compute_rules(fabric, ECMP)["c0"])
    for host in fabric.hosts:
        assert table[host.ip] == Route(host.ip, port=host.coords[0] + 1)


def test_rules_carry_switch_identity(tree):
    _, fabric = tree
    rules = compute_rules(fabric)
    assert set(rules) == {s.name for s in fabric.switches}
    for switch in fabric.switches:
        assert rules[switch.name].dpid == switch.dpid
        assert rules[switch.name].name == switch.name
        assert len(rules[switch.name].routes) == len(fabric.hosts)


def test_default_mode_is_ecmp():
    fabric = fat_tree(4)
    assert compute_rules(fabric) == compute_rules(fabric, ECMP)
    assert MODES == (ECMP, SINGLE) == ("ecmp", "single")


def test_k2_fat_tree_has_no_multipath():
    rules = compute_rules(fat_tree(2), ECMP)
    assert all(r.groups == {} for r in rules.values())


@pytest.mark.parametrize("mode", ["x", "ECMP", "", None])
def test_invalid_mode_raises(mode):
    with pytest.raises(ValueError, match="routing mode"):
        compute_rules(fat_tree(2), mode)


def test_partitioned_switch_gets_no_routes_and_others_avoid_it():
    fabric = fat_tree(4)
    fabric.links = [link for link in fabric.links if "c0" not in (link.a, link.b)]
    rules = compute_rules(fabric, ECMP)
    assert rules["c0"].routes == []
    # p*a0 lost one core uplink: remote pods are reached through c1 alone, a plain port
    table = route_table(rules["p0a0"])
    remote = fabric.nodes["p3e1h1"]
    assert table[remote.ip] == Route(remote.ip, port=4)
    walker = Walker(fabric, rules)
    for switch in fabric.switches:
        if switch.name != "c0":
            for path in walker.paths(switch.name, remote):
                assert "c0" not in path


def test_group_for_reuses_and_numbers_from_one():
    rules = SwitchRules("s", 1)
    assert rules.group_for((3, 4)) == 1
    assert rules.group_for((1, 2)) == 2
    assert rules.group_for((3, 4)) == 1
    assert rules.groups == {1: (3, 4), 2: (1, 2)}


def test_arp_table_maps_every_host_ip_to_its_mac(tree):
    _, fabric = tree
    table = arp_table(fabric)
    assert len(table) == len(fabric.hosts)
    for host in fabric.hosts:
        assert table[host.ip] == host.mac
    assert table["10.0.0.2"] == "02:00:0a:00:00:02"
