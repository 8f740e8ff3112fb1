"""Anycast routes: every switch sends the service address to its nearest live replica (lowest
address on a tie), every switch downstream agrees, packets arrive at that replica along
shortest paths with its MAC, and down replicas or cut links move clients to the next one."""
from __future__ import annotations

import ipaddress
import random

import networkx as nx
import pytest
from tests.unit.fabric_walk import fabric_id, follow, port_peers

from testbed.controllers.routing.anycast import (
    AnycastRoute,
    anycast_routes,
    live_replicas,
    replica_for_hosts,
    service_mac,
)
from testbed.controllers.routing.ecmp import ECMP, MODES, SINGLE
from testbed.controllers.routing.failures import resolve_failures, surviving_fabric
from testbed.model.topology import build
from testbed.model.topology.base import Fabric
from testbed.model.topology.fattree import fat_tree
from testbed.model.topology.spineleaf import spine_leaf

SERVICE_IP = "10.255.0.1"
FABRICS = [("fattree", {"k": 4}), ("fattree", {"k": 6}),
           ("spineleaf", {"leaves": 3, "spines": 3, "hosts_per_leaf": 2}), ("clos", {}),
           ("dragonfly", {"p": 1, "a": 3, "h": 1}), ("dragonfly", {}),
           ("rail", {"nodes": 3, "gpus_per_node": 4, "spines": 2})]
SEEDS = range(6)


@pytest.fixture(scope="module", params=FABRICS, ids=[fabric_id(e) for e in FABRICS])
def fabric(request) -> Fabric:
    kind, params = request.param
    return build(kind, **params)


def random_service(fabric: Fabric, rng: random.Random) -> tuple[list[str], list[str]]:
    """One to four replicas, all but at least one of them possibly down."""
    replicas = rng.sample([h.name for h in fabric.hosts], rng.randint(1, 4))
    return replicas, rng.sample(replicas, rng.randint(0, len(replicas) - 1))


def nearest(fabric: Fabric, source: str, candidates: list[str]) -> str | None:
    """Brute force: the candidate host fewest hops from node ``source`` in the whole graph,
    the numerically lowest address among equals."""
    graph = fabric.graph()
    reachable = [(nx.shortest_path_length(graph, source, name),
                  int(ipaddress.IPv4Address(fabric.nodes[name].ip)), name)
                 for name in candidates if nx.has_path(graph, source, name)]
    return min(reachable)[2] if reachable else None


def walk(fabric: Fabric, routes: dict[str, AnycastRoute], start: str) -> list[list[str]]:
    """Every node sequence a packet for the service takes from switch ``start``; every switch
    on the way must route toward the same replica, one switch hop closer each time."""
    peers = port_peers(fabric)
    chosen = routes[start]

    def successors(here: str) -> list[str]:
        route = routes.get(here)
        assert route is not None, f"{here} has no route for the service"
        assert route.replica == chosen.replica, (start, here, route.replica, chosen.replica)
        return [peers[(here, port)] for port in route.ports]

    paths = follow(start, successors, lambda node: fabric.nodes[node].is_host,
                   max_hops=len(fabric.nodes))
    for path in paths:
        assert [routes[s].switch_hops for s in path[:-1]] == list(
            range(chosen.switch_hops, -1, -1)), path
    return paths


def assert_routes_reach_nearest(fabric: Fabric, routes: dict[str, AnycastRoute],
                                live: list[str], mode: str):
    graph = fabric.graph()
    switch_graph = graph.subgraph(s.name for s in fabric.switches)
    for switch in fabric.switches:
        expected = nearest(fabric, switch.name, live)
        if expected is None:
            assert switch.name not in routes
            continue
        route = routes[switch.name]
        replica = fabric.nodes[expected]
        assert (route.replica, route.replica_ip, route.replica_mac) == \
            (expected, replica.ip, replica.mac)
        assert route.service_ip == SERVICE_IP
        edge, _ = fabric.host_attachment(expected)
        assert route.switch_hops == nx.shortest_path_length(switch_graph, switch.name, edge)
        paths = walk(fabric, routes, switch.name)
        assert {path[-1] for path in paths} == {expected}
        equal_cost = sum(1 for _ in nx.all_shortest_paths(switch_graph, switch.name, edge))
        assert len(paths) == (equal_cost if mode == ECMP else 1)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("seed", SEEDS)
def test_every_switch_reaches_its_nearest_live_replica(fabric, mode, seed):
    replicas, down = random_service(fabric, random.Random(seed))
    routes = anycast_routes(fabric, SERVICE_IP, replicas, down, mode)
    live = [name for name in replicas if name not in down]
    assert_routes_reach_nearest(fabric, routes, live, mode)


@pytest.mark.parametrize("seed", SEEDS)
def test_each_host_reaches_its_nearest_replica_and_replicas_themselves(fabric, seed):
    replicas, down = random_service(fabric, random.Random(50 + seed))
    live = [name for name in replicas if name not in down]
    reached = replica_for_hosts(fabric, anycast_routes(fabric, SERVICE_IP, replicas, down),
                                replicas, down)
    assert set(reached) == {h.name for h in fabric.hosts}
    for host in fabric.hosts:
        assert reached[host.name] == (host.name if host.name in live
                                      else nearest(fabric, host.name, live))


def test_ties_go_to_the_numerically_lowest_address():
    """Two replicas on one leaf, 10.0.0.9 and 10.0.0.10: as text .10 would sort first."""
    fabric = spine_leaf(leaves=2, spines=1, hosts_per_leaf=10)
    assert (fabric.nodes["l0h7"].ip, fabric.nodes["l0h8"].ip) == ("10.0.0.9", "10.0.0.10")
    routes = anycast_routes(fabric, SERVICE_IP, ["l0h8", "l0h7"])
    assert {r.replica for r in routes.values()} == {"l0h7"}
    assert routes["l0"].ports == (8,)
    assert [r.name for r in live_replicas(fabric, SERVICE_IP, ["l0h8", "l0h7", "l1h0"])] == \
        ["l0h7", "l0h8", "l1h0"]


def test_equidistant_pods_split_by_address_and_downstream_agrees():
    tree = fat_tree(4)
    routes = anycast_routes(tree, SERVICE_IP, ["p1e0h0", "p0e0h0"])
    reached = replica_for_hosts(tree, routes, ["p1e0h0", "p0e0h0"])
    for host in tree.hosts:
        pod = host.coords[0]
        assert reached[host.name] == ("p1e0h0" if pod == 1 else "p0e0h0"), host.name
    # a core is 2 switch hops from both replicas' edge switches: the lower address wins
    assert routes["c0"] == AnycastRoute(SERVICE_IP, "p0e0h0", "10.0.0.2", "02:00:0a:00:00:02",
                                        (1,), 2)


def test_down_replicas_hand_their_clients_to_the_next_nearest():
    tree = fat_tree(4)
    replicas = ["p0e0h0", "p0e1h0", "p3e0h0"]
    everyone = replica_for_hosts(tree, anycast_routes(tree, SERVICE_IP, replicas), replicas)
    assert everyone["p0e0h1"] == "p0e0h0" and everyone["p2e0h0"] == "p0e0h0"
    down = ["p0e0h0"]
    after = replica_for_hosts(tree, anycast_routes(tree, SERVICE_IP, replicas, down),
                              replicas, down)
    assert after["p0e0h1"] == "p0e1h0" and after["p2e0h0"] == "p0e1h0"
    assert after["p3e1h1"] == "p3e0h0"
    assert anycast_routes(tree, SERVICE_IP, replicas, replicas) == {}
    assert set(replica_for_hosts(tree, {}, replicas, replicas).values()) == {None}


@pytest.mark.parametrize("mode", MODES)
def test_failures_and_partitions_move_clients_and_leave_cut_off_switches_without_routes(mode):
    tree = fat_tree(4)
    replicas = ["p0e0h0", "p2e0h0"]
    # p0e0 loses both uplinks: its own host still reaches p0e0h0, the rest of the fabric p2e0h0
    view = surviving_fabric(tree, resolve_failures(tree, [("p0e0", 3), ("p0e0", 4)]))
    routes = anycast_routes(view, SERVICE_IP, replicas, mode=mode)
    assert_routes_reach_nearest(view, routes, replicas, mode)
    reached = replica_for_hosts(view, routes, replicas)
    assert reached["p0e0h1"] == "p0e0h0" and reached["p0e1h0"] == "p2e0h0"
    # every core down: each pod is an island, and only the replicas' pods have a route
    cut = surviving_fabric(tree, resolve_failures(tree, switches=["c0", "c1", "c2", "c3"]))
    routes = anycast_routes(cut, SERVICE_IP, replicas, mode=mode)
    assert {name[:2] for name in routes} == {"p0", "p2"}
    assert_routes_reach_nearest(cut, routes, replicas, mode)


def test_single_mode_keeps_the_lowest_next_hop_of_ecmp():
    tree = fat_tree(6)
    ecmp = anycast_routes(tree, SERVICE_IP, ["p5e2h2"], mode=ECMP)
    single = anycast_routes(tree, SERVICE_IP, ["p5e2h2"], mode=SINGLE)
    assert set(ecmp) == set(single)
    assert any(len(r.ports) > 1 for r in ecmp.values())
    for name, route in ecmp.items():
        assert single[name].ports == (min(route.ports),)


def test_service_mac_is_unicast_local_and_unlike_any_host():
    mac = service_mac(SERVICE_IP)
    assert mac == "02:01:0a:ff:00:01"
    first = int(mac.split(":")[0], 16)
    assert first & 0x01 == 0 and first & 0x02  # unicast, locally administered
    assert mac not in {h.mac for h in fat_tree(4).hosts}


@pytest.mark.parametrize(("service_ip", "replicas", "down", "mode", "text"), [
    ("10.0.0.2", ["p1e0h0"], [], ECMP, "host's own address"),
    (SERVICE_IP, ["p0e0"], [], ECMP, "not a host"),
    (SERVICE_IP, ["nobody"], [], ECMP, "not a host"),
    (SERVICE_IP, ["p0e0h0"], ["p0e0h1"], ECMP, "not replicas"),
    (SERVICE_IP, ["p0e0h0"], [], "anycast", "routing mode"),
])
def test_bad_services_are_refused(service_ip, replicas, down, mode, text):
    with pytest.raises(ValueError, match=text):
        anycast_routes(fat_tree(4), service_ip, replicas, down, mode)


def test_a_service_address_must_be_ipv4():
    with pytest.raises(ValueError):
        anycast_routes(fat_tree(4), "10.0.0.300", ["p0e0h0"])
