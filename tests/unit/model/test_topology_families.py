"""Spine-leaf, Clos, dragonfly, NVSwitch-node and rail fabrics checked against their published
formulas (see each module's docstring and docs/references.md), against the naming and
addressing rules every layer relies on, and against the controller's route computation.
Pure: nothing here touches the machine except drawing PNGs into a temporary folder."""
from __future__ import annotations

import ipaddress
import math
from collections import Counter, defaultdict
from itertools import combinations

import networkx as nx
import pytest
from tests.unit.fabric_walk import Walker, ports_by_node

from testbed.controllers.routing.ecmp import ECMP, SINGLE, compute_rules
from testbed.errors import ConfigError
from testbed.model.topology import BUILDERS, build
from testbed.model.topology.base import (
    HOST,
    LEAF,
    LINUX_IFNAMSIZ_CHARS,
    NVSWITCH,
    ROLE_CODES,
    ROUTER,
    SPINE,
    SUPERSPINE,
    Fabric,
    Link,
)
from testbed.model.topology.clos import clos
from testbed.model.topology.describe import (
    bisection_bandwidth_mbit,
    describe,
    description_rows,
    draw,
    tier_layout,
)
from testbed.model.topology.dragonfly import dragonfly, global_peer
from testbed.model.topology.fattree import fat_tree
from testbed.model.topology.limits import MAX_HOSTS, MAX_VETH_ENDS, check_fits
from testbed.model.topology.nvswitch import gpu_address, nvswitch_nodes
from testbed.model.topology.spineleaf import spine_leaf

# (kind, parameters): every family at a few sizes; all must satisfy the common invariants
ZOO = [
    ("fattree", {"k": 4}),
    ("fattree", {"k": 8, "hosts_per_edge": 1}),
    ("spineleaf", {}),
    ("spineleaf", {"leaves": 3, "spines": 5, "hosts_per_leaf": 2}),
    ("spineleaf", {"leaves": 1, "spines": 1, "hosts_per_leaf": 1}),
    ("clos", {}),
    ("clos", {"stages": 3}),
    ("clos", {"radix": 6}),
    ("clos", {"stages": 3, "radix": 8}),
    ("clos", {"pods": 3, "leaves_per_pod": 2, "spines_per_pod": 3, "superspines_per_plane": 1,
              "hosts_per_leaf": 2}),
    ("dragonfly", {}),
    ("dragonfly", {"p": 1, "a": 2, "h": 1}),
    ("dragonfly", {"p": 2, "a": 4, "h": 2, "g": 5}),
    ("nvswitch", {}),
    ("nvswitch", {"base": "spineleaf"}),
    ("nvswitch", {"base": "dragonfly", "p": 1, "a": 2, "h": 1, "gpus_per_node": 8}),
    ("nvswitch", {"base": "clos", "gpus_per_node": 2}),
    ("nvswitch", {"base": "line", "gpus_per_node": 3}),
    ("rail", {}),
    ("rail", {"nodes": 3, "gpus_per_node": 8, "spines": 1}),
    ("rail", {"nodes": 1, "gpus_per_node": 1, "spines": 1}),
]


def zoo_id(entry) -> str:
    kind, params = entry
    return kind + "".join(f"-{k}{v}" for k, v in params.items())


@pytest.fixture(scope="module", params=ZOO, ids=[zoo_id(e) for e in ZOO])
def any_fabric(request) -> Fabric:
    kind, params = request.param
    return build(kind, host_rate_mbit=10.0, **params)


def peers_of(fabric: Fabric) -> dict[str, Counter]:
    peers = defaultdict(Counter)
    for link in fabric.links:
        peers[link.a][link.b] += 1
        peers[link.b][link.a] += 1
    return peers


def ip_octets(ip: str) -> list[int]:
    return list(ipaddress.IPv4Address(ip).packed)


def router_graph(fabric: Fabric) -> nx.Graph:
    return fabric.graph().subgraph(s.name for s in fabric.switches)


def is_global(fabric: Fabric, u: str, v: str) -> bool:
    return fabric.nodes[u].coords[0] != fabric.nodes[v].coords[0]


# --- invariants of every family ------------------------------------------------------------


def test_switch_ports_count_from_one_without_gaps_and_hosts_use_port_zero(any_fabric):
    ports = ports_by_node(any_fabric)
    for switch in any_fabric.switches:
        used = sorted(ports[switch.name])
        assert used == list(range(1, len(used) + 1)), switch.name
    for host in any_fabric.hosts:
        assert ports[host.name] == [0], host.name
    assert set(ports) == set(any_fabric.nodes)  # nothing left unconnected


def test_names_fit_linux_and_identities_are_unique(any_fabric):
    names = any_fabric.interface_names()
    assert len(set(names)) == len(names)
    assert max(len(n) for n in names) <= LINUX_IFNAMSIZ_CHARS
    for attr, nodes in (("ip", any_fabric.hosts), ("mac", any_fabric.hosts),
                        ("dpid", any_fabric.switches)):
        values = [getattr(n, attr) for n in nodes]
        assert None not in values and len(set(values)) == len(values), attr
    assert len({frozenset((link.a, link.b)) for link in any_fabric.links}) == len(any_fabric.links)


def test_host_macs_carry_the_ip_octets_and_ips_avoid_network_and_gateway(any_fabric):
    for host in any_fabric.hosts:
        octets = ip_octets(host.ip)
        assert octets[0] == 10 and octets[3] >= 2, host.ip
        assert host.mac == "02:00:0a:" + ":".join(f"{o:02x}" for o in octets[1:])


def test_switch_dpids_encode_role_and_coordinates(any_fabric):
    for switch in any_fabric.switches:
        if switch.role == "line":
            continue
        assert switch.dpid >> 32 == ROLE_CODES[switch.role], switch.name
        high, low = (switch.dpid >> 16) & 0xFFFF, switch.dpid & 0xFFFF
        if switch.role == NVSWITCH:  # the replaced host's address octets x, y, c
            x, y, c = ip_octets(any_fabric.nodes[switch.name[:-2] + "g0"].ip)[1:]
            assert (high, low >> 8) == (x, y)
        else:
            assert (high, low) == ((0,) + switch.coords)[-2:], switch.name


def test_describe_agrees_with_every_formula_it_states(any_fabric):
    info = describe(any_fabric)
    assert info["formula"]["hosts"] == info["hosts"]
    for key, value in info["formula"].items():
        assert info[key] == pytest.approx(value), key


def test_controller_routes_reach_every_host_loop_free(any_fabric):
    """Both routing modes: from every switch every host is reached along shortest paths only."""
    graph = router_graph(any_fabric)
    for mode in (ECMP, SINGLE):
        walker = Walker(any_fabric, compute_rules(any_fabric, mode))
        for host in any_fabric.hosts:
            attached, _ = any_fabric.host_attachment(host.name)
            dist = nx.single_source_shortest_path_length(graph, attached)
            for switch in any_fabric.switches:
                paths = walker.paths(switch.name, host)
                assert paths, (switch.name, host.name)
                assert all(len(p) - 2 == dist[switch.name] for p in paths)
                if mode == SINGLE:
                    assert len(paths) == 1


# --- spine-leaf ------------------------------------------------------------------------------

SPINE_LEAF = [(1, 1, 1), (2, 2, 2), (4, 2, 4), (3, 5, 2), (8, 4, 3), (6, 1, 7), (10, 3, 1)]


@pytest.mark.parametrize(("leaves", "spines", "hosts_per_leaf"), SPINE_LEAF)
def test_spine_leaf_counts_and_full_mesh(leaves, spines, hosts_per_leaf):
    fabric = spine_leaf(leaves, spines, hosts_per_leaf)
    roles = Counter(n.role for n in fabric.switches)
    assert len(fabric.hosts) == leaves * hosts_per_leaf
    assert roles == {LEAF: leaves, SPINE: spines}
    switch_links = [link for link in fabric.links
                    if not (fabric.nodes[link.a].is_host or fabric.nodes[link.b].is_host)]
    assert len(switch_links) == spines * leaves
    peers = peers_of(fabric)
    for i in range(leaves):
        assert {p for p in peers[f"l{i}"] if fabric.nodes[p].role == SPINE} == \
            {f"s{j}" for j in range(spines)}
        assert all(count == 1 for count in peers[f"l{i}"].values())
    for j in range(spines):
        assert set(peers[f"s{j}"]) == {f"l{i}" for i in range(leaves)}


@pytest.mark.parametrize(("leaves", "spines", "hosts_per_leaf"), SPINE_LEAF)
def test_every_leaf_pair_is_two_hops_apart_through_a_spine(leaves, spines, hosts_per_leaf):
    fabric = spine_leaf(leaves, spines, hosts_per_leaf)
    graph = router_graph(fabric)
    for a, b in combinations(range(leaves), 2):
        paths = list(nx.all_shortest_paths(graph, f"l{a}", f"l{b}"))
        assert len(paths) == spines
        assert all(len(p) == 3 and fabric.nodes[p[1]].role == SPINE for p in paths)
    assert describe(fabric)["max_switch_hops_between_hosts"] == (2 if leaves > 1 else 0)


def test_spine_leaf_port_layout_and_addresses():
    fabric = spine_leaf(3, 2, 4)
    graph = fabric.graph()
    assert graph.edges["l2h3", "l2"]["ports"] == {"l2h3": 0, "l2": 4}
    assert graph.edges["l2", "s0"]["ports"] == {"l2": 5, "s0": 3}
    assert graph.edges["l0", "s1"]["ports"] == {"l0": 6, "s1": 1}
    host = fabric.nodes["l2h3"]
    assert (host.ip, host.mac, host.coords) == ("10.0.2.5", "02:00:0a:00:02:05", (2, 3))
    assert fabric.nodes["l2"].dpid == 0x0004_0000_0002
    assert fabric.nodes["s1"].dpid == 0x0005_0000_0001


@pytest.mark.parametrize(("hosts_per_leaf", "spines", "host_rate", "uplink_rate", "ratio"), [
    (4, 2, 100.0, None, 2.0),
    (4, 4, 100.0, None, 1.0),
    (4, 2, 100.0, 400.0, 0.5),
    (6, 2, 10.0, 20.0, 1.5),
    (3, 1, 25.0, 25.0, 3.0),
])
def test_spine_leaf_oversubscription_formula(hosts_per_leaf, spines, host_rate, uplink_rate, ratio):
    fabric = spine_leaf(4, spines, hosts_per_leaf, host_rate_mbit=host_rate,
                        uplink_rate_mbit=uplink_rate)
    assert fabric.params["oversubscription"] == pytest.approx(ratio)
    assert describe(fabric)["oversubscription"] == pytest.approx(ratio)
    uplinks = {link.rate_mbit for link in fabric.links if fabric.nodes[link.b].role == SPINE}
    assert uplinks == {uplink_rate or host_rate}


@pytest.mark.parametrize(("leaves", "spines", "hosts_per_leaf", "uplink_rate", "cut"), [
    (4, 2, 4, 100.0, 400.0),    # 2 leaves' uplinks: 2 * 2 * 100
    (4, 2, 4, 400.0, 800.0),    # 2 leaves' hosts: 2 * 4 * 100
    (2, 2, 2, 100.0, 200.0),    # non-blocking: hosts/2 * 100
    (6, 3, 5, 100.0, 900.0),
    (8, 4, 4, 50.0, 800.0),
])
def test_spine_leaf_bisection_matches_formula(leaves, spines, hosts_per_leaf, uplink_rate, cut):
    fabric = spine_leaf(leaves, spines, hosts_per_leaf, host_rate_mbit=100.0,
                        uplink_rate_mbit=uplink_rate)
    info = describe(fabric)
    assert info["bisection_bandwidth_mbit"] == pytest.approx(cut)
    assert info["formula"]["bisection_bandwidth_mbit"] == pytest.approx(cut)
    assert cut == leaves / 2 * min(hosts_per_leaf * 100.0, spines * uplink_rate)


def test_spine_leaf_description_text():
    rows = dict(description_rows(describe(spine_leaf())))
    assert rows["hosts"] == "16   (formula: 16)"
    assert rows["switch-to-switch links"] == "8   (formula: 8)"
    assert rows["max switch hops host-host"] == "2   (formula: 2)"
    assert rows["bisection bandwidth"] == "400 Mbit/s   (formula: 400 Mbit/s)"
    assert rows["oversubscription"] == "2:1   (formula: 2:1)"


# --- Clos ------------------------------------------------------------------------------------

FIVE_STAGE = [(2, 2, 2, 2, 2), (3, 2, 3, 1, 2), (4, 3, 2, 2, 1), (2, 1, 1, 1, 1), (2, 4, 2, 3, 2)]


@pytest.mark.parametrize(("pods", "leaves", "spines", "supers", "hosts"), FIVE_STAGE)
def test_five_stage_clos_counts_planes_and_hops(pods, leaves, spines, supers, hosts):
    fabric = clos(5, pods, leaves, spines, supers, hosts)
    roles = Counter(n.role for n in fabric.switches)
    assert len(fabric.hosts) == pods * leaves * hosts
    assert roles == {LEAF: pods * leaves, SPINE: pods * spines, SUPERSPINE: spines * supers}
    assert len(fabric.links) == pods * (leaves * hosts + leaves * spines + spines * supers)
    peers = peers_of(fabric)
    for plane in range(spines):
        for j in range(supers):
            assert set(peers[f"ss{plane * supers + j}"]) == {f"p{p}s{plane}" for p in range(pods)}
    info = describe(fabric)
    assert info["max_switch_hops_between_hosts"] == 4
    assert info["switch_diameter_hops"] == 4
    graph = fabric.graph()
    cross = list(nx.all_shortest_paths(graph, "p0l0h0", f"p{pods - 1}l{leaves - 1}h0"))
    assert len(cross) == spines * supers and all(len(p) == 7 for p in cross)
    if leaves > 1:
        inside = list(nx.all_shortest_paths(graph, "p0l0h0", "p0l1h0"))
        assert len(inside) == spines and all(len(p) == 5 for p in inside)


@pytest.mark.parametrize(("leaves", "spines", "hosts"),
                         [(2, 2, 2), (4, 2, 3), (5, 3, 1), (1, 2, 4)])
def test_three_stage_clos_is_one_leaf_spine_pod(leaves, spines, hosts):
    fabric = clos(3, leaves_per_pod=leaves, spines_per_pod=spines, hosts_per_leaf=hosts)
    assert len(fabric.hosts) == leaves * hosts
    assert Counter(n.role for n in fabric.switches) == {LEAF: leaves, SPINE: spines}
    assert len(fabric.links) == leaves * hosts + leaves * spines
    assert fabric.params["pods"] == 1 and fabric.params["superspines_per_plane"] == 0
    assert describe(fabric)["max_switch_hops_between_hosts"] == (2 if leaves > 1 else 0)
    same = spine_leaf(leaves, spines, hosts)
    assert fabric.nodes == same.nodes and fabric.links == same.links  # same names and cables


def test_three_stage_accepts_one_pod_and_zero_superspines_spelled_out():
    assert clos(3, pods=1, superspines_per_plane=0).links == clos(3).links


@pytest.mark.parametrize("radix", [2, 4, 6, 8])
def test_radix_derived_five_stage_clos_is_non_blocking(radix):
    fabric = clos(5, radix=radix, host_rate_mbit=10.0)
    half = radix // 2
    assert (fabric.params["pods"], fabric.params["leaves_per_pod"], fabric.params["spines_per_pod"],
            fabric.params["superspines_per_plane"], fabric.params["hosts_per_leaf"]) == \
        (radix, half, half, half, half)
    assert len(fabric.hosts) == radix ** 3 // 4          # a fat-tree's host count for k = radix
    assert len(fabric.switches) == 5 * radix ** 2 // 4
    ports = ports_by_node(fabric)
    assert {len(ports[s.name]) for s in fabric.switches} == {radix}  # every port used, none more
    assert fabric.params["oversubscription"] == 1.0
    assert describe(fabric)["bisection_bandwidth_mbit"] == pytest.approx(len(fabric.hosts) / 2 * 10)


@pytest.mark.parametrize("radix", [2, 4, 6, 8, 12])
def test_radix_derived_three_stage_clos_is_non_blocking(radix):
    fabric = clos(3, radix=radix, host_rate_mbit=10.0)
    assert len(fabric.hosts) == radix * radix // 2
    ports = ports_by_node(fabric)
    assert {len(ports[s.name]) for s in fabric.switches} == {radix}
    assert fabric.params["oversubscription"] == 1.0
    assert describe(fabric)["bisection_bandwidth_mbit"] == pytest.approx(len(fabric.hosts) / 2 * 10)


@pytest.mark.parametrize(("counts", "rates", "ratio", "cut"), [
    ((2, 4, 2, 1, 2), (10.0, 10.0), 4.0, 20.0),    # pod: 8 hosts over 2 super-spine links
    ((2, 2, 2, 2, 4), (10.0, 10.0), 2.0, 40.0),    # leaf: 4 hosts over 2 spines, 2 leaves
    ((2, 2, 2, 2, 2), (10.0, 5.0), 2.0, 20.0),     # slower fabric: 2 leaves of 2 uplinks
    ((4, 2, 2, 2, 2), (10.0, 10.0), 1.0, 80.0),    # non-blocking: 16 hosts / 2 * 10
])
def test_clos_oversubscription_and_bisection(counts, rates, ratio, cut):
    fabric = clos(5, *counts, host_rate_mbit=rates[0], fabric_rate_mbit=rates[1])
    info = describe(fabric)
    assert fabric.params["oversubscription"] == pytest.approx(ratio)
    assert info["bisection_bandwidth_mbit"] == pytest.approx(cut)
    assert info["formula"]["bisection_bandwidth_mbit"] == pytest.approx(cut)


def test_clos_names_ports_and_addresses():
    fabric = clos()
    graph = fabric.graph()
    assert graph.edges["p1l0h1", "p1l0"]["ports"] == {"p1l0h1": 0, "p1l0": 2}
    assert graph.edges["p1l0", "p1s1"]["ports"] == {"p1l0": 4, "p1s1": 1}
    assert graph.edges["p1s1", "ss3"]["ports"] == {"p1s1": 4, "ss3": 2}
    assert fabric.nodes["p1l0h1"].ip == "10.1.0.3"
    assert fabric.nodes["ss3"].coords == (1, 1)
    assert fabric.nodes["ss3"].dpid == 0x0006_0001_0001
    assert fabric.nodes["p1s1"].dpid == 0x0005_0001_0001


# --- dragonfly -------------------------------------------------------------------------------

BALANCED = [(1, 2, 1), (2, 4, 2), (1, 3, 1), (2, 2, 2), (3, 6, 3), (1, 4, 1), (2, 3, 2)]


@pytest.mark.parametrize(("p", "a", "h"), BALANCED)
def test_dragonfly_sizes_and_radix(p, a, h):
    fabric = dragonfly(p, a, h)
    g = a * h + 1
    radix = p + a + h - 1
    assert fabric.params["g"] == g
    assert len(fabric.hosts) == a * p * (a * h + 1) == fabric.params["hosts_N"]
    assert len(fabric.switches) == a * g
    assert {n.role for n in fabric.switches} == {ROUTER}
    assert fabric.params["radix_k"] == radix
    ports = ports_by_node(fabric)
    for router in fabric.switches:
        assert sorted(ports[router.name]) == list(range(1, radix + 1)), router.name


@pytest.mark.parametrize(("p", "a", "h", "g"), [(p, a, h, a * h + 1) for p, a, h in BALANCED]
                         + [(2, 4, 2, 5), (1, 3, 2, 2), (1, 4, 3, 7)])
def test_every_pair_of_groups_has_exactly_one_global_link(p, a, h, g):
    fabric = dragonfly(p, a, h, g)
    pairs = Counter()
    local = Counter()
    for link in fabric.links:
        ga, gb = fabric.nodes[link.a].coords[0], fabric.nodes[link.b].coords[0]
        if fabric.nodes[link.a].is_host or fabric.nodes[link.b].is_host:
            continue
        if ga != gb:
            pairs[frozenset((ga, gb))] += 1
        else:
            local[ga] += 1
    assert pairs == Counter({frozenset(pair): 1 for pair in combinations(range(g), 2)})
    assert local == Counter({group: a * (a - 1) // 2 for group in range(g)})


def test_dragonfly_consecutive_arrangement_worked_example():
    """The docstring's example, p=2 a=4 h=2 g=9: global ports are p+a+j = 6+j."""
    fabric = dragonfly()
    graph = fabric.graph()
    assert graph.edges["g0r0", "g1r3"]["ports"] == {"g0r0": 6, "g1r3": 7}
    assert graph.edges["g0r0", "g2r3"]["ports"] == {"g0r0": 7, "g2r3": 6}
    assert graph.edges["g0r3", "g8r0"]["ports"] == {"g0r3": 7, "g8r0": 6}
    assert graph.edges["g3r1", "g6r2"]["ports"] == {"g3r1": 6, "g6r2": 7}
    assert graph.edges["g5r1", "g5r3"]["ports"] == {"g5r1": 5, "g5r3": 4}  # local, p+1+x
    assert global_peer(0, 0, 9) == (1, 7)
    assert global_peer(4, 7, 9) == (3, 0)
    for group in range(9):
        for channel in range(8):
            assert global_peer(*global_peer(group, channel, 9), 9) == (group, channel)
    with pytest.raises(ValueError):
        global_peer(0, 8, 9)
    host = fabric.nodes["g7r2h1"]
    assert (host.ip, host.mac) == ("10.7.2.3", "02:00:0a:07:02:03")
    assert fabric.nodes["g7r2"].dpid == 0x0007_0007_0002


def test_fewer_groups_leave_the_last_channels_unused():
    fabric = dragonfly(2, 4, 2, g=5)  # 4 of 8 channels per group used: routers 0 and 1
    ports = ports_by_node(fabric)
    assert [len(ports[f"g0r{r}"]) for r in range(4)] == [7, 7, 5, 5]


@pytest.mark.parametrize(("p", "a", "h"), [(1, 2, 1), (2, 4, 2), (1, 3, 1), (2, 2, 2), (1, 4, 1)])
def test_minimal_routes_use_one_global_link_and_shortest_paths_at_most_three_hops(p, a, h):
    """Every router pair in different groups has the paper's minimal route (local, the one
    global link between the groups, local) of at most 3 hops; no shortest path is longer."""
    fabric = dragonfly(p, a, h)
    graph = router_graph(fabric)
    gateway = {}
    for u, v in graph.edges:
        if is_global(fabric, u, v):
            gu, gv = fabric.nodes[u].coords[0], fabric.nodes[v].coords[0]
            gateway[(gu, gv)], gateway[(gv, gu)] = (u, v), (v, u)
    lengths = dict(nx.all_pairs_shortest_path_length(graph))
    for src, dst in combinations(graph.nodes, 2):
        assert lengths[src][dst] <= 3
        gs, gd = fabric.nodes[src].coords[0], fabric.nodes[dst].coords[0]
        if gs == gd:
            assert lengths[src][dst] == 1
            continue
        out, into = gateway[(gs, gd)]
        minimal = [src] + ([out] if out != src else []) + ([into] if into != dst else []) + [dst]
        assert all(graph.has_edge(x, y) for x, y in zip(minimal, minimal[1:]))
        assert sum(is_global(fabric, x, y) for x, y in zip(minimal, minimal[1:])) == 1
        assert len(minimal) - 1 <= 3
        assert lengths[src][dst] <= len(minimal) - 1
    assert describe(fabric)["max_switch_hops_between_hosts"] == 3


def test_some_shortest_paths_cross_two_global_links():
    """Shortest-path ECMP is not the paper's minimal routing: in the default dragonfly a
    router owning global links to two groups gives a 2-hop global-global path that beats the
    3-hop local-global-local route. Counts of router pairs in different groups (576)."""
    fabric = dragonfly()
    graph = router_graph(fabric)
    some, only = 0, 0
    for src, dst in combinations(sorted(graph.nodes), 2):
        if not is_global(fabric, src, dst):
            continue
        globals_used = [sum(is_global(fabric, x, y) for x, y in zip(path, path[1:]))
                        for path in nx.all_shortest_paths(graph, src, dst)]
        some += max(globals_used) > 1
        only += min(globals_used) > 1
    assert (some, only) == (207, 18)
    # g4r2 owns global links to g0r1 and g1r1; the minimal route g0r1-g0r0-g1r3-g1r1 is longer
    assert list(nx.all_shortest_paths(graph, "g0r1", "g1r1")) == [["g0r1", "g4r2", "g1r1"]]
    assert all(graph.has_edge(x, y) for x, y in [("g0r1", "g0r0"), ("g0r0", "g1r3"),
                                                  ("g1r3", "g1r1")])


# --- NVSwitch nodes --------------------------------------------------------------------------

BASES = [("fattree", {"k": 4}), ("spineleaf", {}), ("spineleaf", {"leaves": 2, "spines": 2,
         "hosts_per_leaf": 2}), ("clos", {}), ("dragonfly", {"p": 1, "a": 2, "h": 1})]


@pytest.mark.parametrize("gpus", [1, 2, 4, 8])
@pytest.mark.parametrize(("base_kind", "base_params"), BASES, ids=[zoo_id(b) for b in BASES])
def test_nvswitch_nodes_multiply_hosts_and_keep_the_nvlink_ratio(base_kind, base_params, gpus):
    base = build(base_kind, host_rate_mbit=6.0, **base_params)
    fabric = nvswitch_nodes(base, gpus_per_node=gpus, nvlink_ratio=18.0)
    assert len(fabric.hosts) == len(base.hosts) * gpus
    assert len(fabric.switches) == len(base.switches) + len(base.hosts)
    assert len(fabric.links) == len(base.links) + len(base.hosts) * gpus
    graph = fabric.graph()
    for host in base.hosts:
        node = host.name + "nv"
        fabric_switch, port = base.host_attachment(host.name)
        assert graph.edges[node, fabric_switch]["ports"] == {node: gpus + 1, fabric_switch: port}
        nic_rate = graph.edges[node, fabric_switch]["rate_mbit"]
        assert nic_rate == 6.0
        for i in range(gpus):
            gpu = f"{host.name}g{i}"
            assert fabric.host_attachment(gpu) == (node, i + 1)
            assert graph.edges[gpu, node]["rate_mbit"] == pytest.approx(18.0 * nic_rate)
    names = fabric.interface_names()
    assert max(len(n) for n in names) <= LINUX_IFNAMSIZ_CHARS
    for attr, nodes in (("ip", fabric.hosts), ("mac", fabric.hosts), ("dpid", fabric.switches)):
        values = [getattr(n, attr) for n in nodes]
        assert len(set(values)) == len(values), attr


def test_gpu_address_scheme_example():
    fabric = build("nvswitch", base="fattree", k=4, gpus_per_node=4, host_rate_mbit=6)
    gpu = fabric.nodes["p0e1h1g3"]
    assert (gpu.ip, gpu.mac, gpu.coords) == ("10.0.1.35", "02:00:0a:00:01:23", (0, 1, 1, 3))
    assert fabric.nodes["p3e0h0g0"].ip == "10.3.0.16"
    assert fabric.nodes["p0e1h1nv"].dpid == 0x0008_0000_0103
    assert fabric.nodes["p0e1h1nv"].role == NVSWITCH
    assert gpu_address("10.2.1.16", 15) == ("10.2.1.255", "02:00:0a:02:01:ff")
    for ip, gpu_index in (("10.0.0.17", 0), ("10.0.0.2", 16), ("10.0.0.1", 0)):
        with pytest.raises(ValueError):
            gpu_address(ip, gpu_index)


def test_nvswitch_builder_passes_the_rest_to_the_base():
    fabric = build("nvswitch", base="spineleaf", leaves=2, spines=2, hosts_per_leaf=2,
                   gpus_per_node=4, host_rate_mbit=6)
    assert fabric.kind == "nvswitch"
    assert fabric.params["base"] == "spineleaf" and fabric.params["leaves"] == 2
    assert len(fabric.hosts) == 16
    assert {link.rate_mbit for link in fabric.links} == {6, 108.0}
    assert describe(fabric)["bisection_bandwidth_mbit"] == pytest.approx(12.0)  # 2 NICs of 6


def test_nvswitch_default_fat_tree_keeps_its_cut_and_hops():
    info = describe(build("nvswitch", host_rate_mbit=10.0))
    assert (info["hosts"], info["switches"], info["links"]) == (64, 36, 112)
    assert info["bisection_bandwidth_mbit"] == pytest.approx(80.0)  # 8 NICs of 10 Mbit/s
    assert info["max_switch_hops_between_hosts"] == 6
    assert info["equal_cost_paths"] == 4


# --- bisection -------------------------------------------------------------------------------


@pytest.mark.parametrize(("k", "host_rate", "fabric_rate", "cut"), [
    (4, 100.0, 100.0, 800.0), (6, 100.0, 100.0, 2700.0), (4, 10.0, 5.0, 40.0),
    (6, 10.0, 40.0, 270.0), (2, 10.0, 10.0, 10.0)])
def test_fat_tree_bisection_is_hosts_over_two_times_the_slower_rate(k, host_rate, fabric_rate, cut):
    fabric = fat_tree(k, host_rate_mbit=host_rate, fabric_rate_mbit=fabric_rate)
    assert bisection_bandwidth_mbit(fabric) == pytest.approx(cut)
    assert describe(fabric)["formula"]["bisection_bandwidth_mbit"] == pytest.approx(cut)


def test_bisection_cut_finds_a_single_slow_link():
    fabric = spine_leaf(2, 1, 2, host_rate_mbit=100.0)
    slow = [link for link in fabric.links if {link.a, link.b} == {"l1", "s0"}][0]
    fabric.links[fabric.links.index(slow)] = Link(slow.a, slow.a_port, slow.b, slow.b_port, 7.0)
    assert bisection_bandwidth_mbit(fabric) == pytest.approx(7.0)


def test_bisection_is_none_for_unshaped_links():
    assert bisection_bandwidth_mbit(build("line")) is None
    assert dict(description_rows(describe(build("line"))))["bisection bandwidth"] == \
        "n/a (unshaped links or one host)"


# --- drawing ---------------------------------------------------------------------------------


def test_tier_layout_puts_hosts_at_the_bottom_and_roles_upwards():
    fabric = build("nvswitch", host_rate_mbit=10.0)
    pos = tier_layout(fabric)
    rows = {fabric.nodes[name].role: y for name, (_, y) in pos.items()}
    assert rows == {HOST: 0.0, NVSWITCH: 1.0, "edge": 2.0, "aggregation": 3.0, "core": 4.0}
    assert len({pos[h.name] for h in fabric.hosts}) == 64  # no two hosts on one spot


@pytest.mark.parametrize(("kind", "params"), [("clos", {}), ("dragonfly", {})])
def test_draw_writes_a_png(tmp_path, kind, params):
    path = draw(build(kind, **params), tmp_path / f"{kind}.png")
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    width, height = int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")
    assert width >= 1000 and height >= 600


# --- machine-size guard ----------------------------------------------------------------------


def test_check_fits_rejects_a_k16_fat_tree_with_the_estimate():
    with pytest.raises(ConfigError) as info:
        check_fits(fat_tree(16))
    assert info.value.field == "topology"
    message = str(info.value)
    assert "needs 1024 hosts / 6144 interfaces" in message
    assert f"this machine holds about {MAX_HOSTS} hosts / {MAX_VETH_ENDS} interfaces (estimate)" \
        in message
    assert "\n" not in message


def test_check_fits_accepts_the_measured_k8_fat_tree_and_the_families_defaults():
    check_fits(fat_tree(8))  # 128 hosts, 768 interfaces: measured to work
    for kind in ("spineleaf", "clos", "dragonfly", "nvswitch", "rail"):
        check_fits(build(kind))
    assert (MAX_HOSTS, MAX_VETH_ENDS) == (256, 2000)


@pytest.mark.parametrize(("limits", "fits"), [
    ({"max_hosts": 16, "max_interfaces": 96}, True),
    ({"max_hosts": 15}, False),
    ({"max_interfaces": 95}, False),
])
def test_check_fits_boundaries(limits, fits):
    fabric = fat_tree(4)  # 16 hosts, 48 links = 96 interfaces
    if fits:
        check_fits(fabric, **limits)
    else:
        with pytest.raises(ConfigError, match="needs 16 hosts / 96 interfaces"):
            check_fits(fabric, **limits)


def test_check_fits_rejects_a_big_dragonfly_on_hosts():
    fabric = dragonfly(4, 8, 4)  # 33 groups, 1056 hosts
    with pytest.raises(ConfigError, match="needs 1056 hosts"):
        check_fits(fabric)


# --- errors ----------------------------------------------------------------------------------

BAD_COUNTS = [0, -1, True, False, 2.5, 2.0, "2", math.nan, 101]


@pytest.mark.parametrize("value", BAD_COUNTS)
@pytest.mark.parametrize("field", ["leaves", "spines", "hosts_per_leaf"])
def test_spine_leaf_bad_counts(field, value):
    with pytest.raises(ConfigError) as info:
        spine_leaf(**{field: value})
    assert info.value.field == field
    assert "\n" not in str(info.value) and repr(value) in str(info.value)


@pytest.mark.parametrize("value", BAD_COUNTS)
@pytest.mark.parametrize("field", ["pods", "leaves_per_pod", "spines_per_pod",
                                   "superspines_per_plane", "hosts_per_leaf"])
def test_clos_bad_counts(field, value):
    with pytest.raises(ConfigError) as info:
        clos(**{field: value})
    assert info.value.field == field


@pytest.mark.parametrize("value", BAD_COUNTS)
@pytest.mark.parametrize("field", ["p", "a", "h"])
def test_dragonfly_bad_counts(field, value):
    with pytest.raises(ConfigError) as info:
        dragonfly(**{field: value})
    assert info.value.field == field


@pytest.mark.parametrize(("params", "field", "text"), [
    ({"stages": 4}, "stages", "must be 3 or 5"),
    ({"stages": True}, "stages", "must be 3 or 5"),
    ({"stages": 5.0}, "stages", "must be 3 or 5"),
    ({"radix": 8, "pods": 2}, "radix", "not both"),
    ({"radix": 8, "hosts_per_leaf": 4}, "radix", "hosts_per_leaf=4"),
    ({"radix": 5}, "radix", "even"),
    ({"radix": 0}, "radix", "even"),
    ({"radix": True}, "radix", "even"),
    ({"radix": 102}, "radix", "even"),
    ({"stages": 3, "pods": 2}, "pods", "omit pods or set 1"),
    ({"stages": 3, "superspines_per_plane": 2}, "superspines_per_plane", "set 0"),
    ({"host_rate_mbit": 0}, "host_rate_mbit", "positive"),
    ({"fabric_rate_mbit": math.nan}, "fabric_rate_mbit", "positive"),
    ({"mtu_bytes": True}, "mtu_bytes", "integer"),
])
def test_clos_config_errors(params, field, text):
    with pytest.raises(ConfigError) as info:
        clos(**params)
    assert info.value.field == field
    assert text in info.value.problem


@pytest.mark.parametrize(("params", "field", "text"), [
    ({"g": 10}, "g", "at most a*h+1 = 9"),
    ({"p": 1, "a": 2, "h": 1, "g": 4}, "g", "at most a*h+1 = 3"),
    ({"g": 1}, "g", ">= 2"),
    ({"g": True}, "g", ">= 2"),
    ({"g": 3.0}, "g", ">= 2"),
    ({"a": 50, "h": 4}, "g", "at most 100"),
    ({"global_rate_mbit": -1}, "global_rate_mbit", "positive"),
    ({"local_rate_mbit": math.nan}, "local_rate_mbit", "positive"),
    ({"host_rate_mbit": math.inf}, "host_rate_mbit", "positive"),
    ({"host_rate_mbit": True}, "host_rate_mbit", "positive"),
    ({"mtu_bytes": 0}, "mtu_bytes", "integer"),
])
def test_dragonfly_config_errors(params, field, text):
    with pytest.raises(ConfigError) as info:
        dragonfly(**params)
    assert info.value.field == field
    assert text in info.value.problem


@pytest.mark.parametrize(("params", "field"), [
    ({"uplink_rate_mbit": 0}, "uplink_rate_mbit"),
    ({"uplink_rate_mbit": math.nan}, "uplink_rate_mbit"),
    ({"host_rate_mbit": -3}, "host_rate_mbit"),
    ({"host_rate_mbit": "fast"}, "host_rate_mbit"),
    ({"mtu_bytes": 9000.0}, "mtu_bytes"),
])
def test_spine_leaf_rate_and_mtu_errors(params, field):
    with pytest.raises(ConfigError) as info:
        spine_leaf(**params)
    assert info.value.field == field


@pytest.mark.parametrize(("params", "field"), [
    ({"base": "torus"}, "base"),
    ({"base": "nvswitch"}, "base"),
    ({"base": 3}, "base"),
    ({"gpus_per_node": 0}, "gpus_per_node"),
    ({"gpus_per_node": 17}, "gpus_per_node"),
    ({"gpus_per_node": True}, "gpus_per_node"),
    ({"nvlink_ratio": 0}, "nvlink_ratio"),
    ({"nvlink_ratio": math.nan}, "nvlink_ratio"),
    ({"base": "fattree", "k": 3}, "k"),
    ({"base": "spineleaf", "hosts_per_leaf": 16}, "base"),          # host index 15 > 14
    ({"base": "clos", "pods": 11, "leaves_per_pod": 11, "hosts_per_leaf": 11,
      "spines_per_pod": 1, "superspines_per_plane": 1}, "base"),    # p10l10h10g3-eth0
    ({"base": "fattree", "radix": 4}, "radix"),                     # not a fat-tree parameter
])
def test_nvswitch_config_errors(params, field):
    with pytest.raises(ConfigError) as info:
        build("nvswitch", **params)
    assert info.value.field == field
    assert "\n" not in str(info.value)


def test_every_family_is_registered_and_takes_the_run_layers_arguments():
    assert set(BUILDERS) == {"fattree", "line", "spineleaf", "clos", "dragonfly", "nvswitch",
                             "rail"}
    for kind in ("fattree", "spineleaf", "clos", "dragonfly", "nvswitch", "rail"):
        fabric = build(kind, host_rate_mbit=7.5, mtu_bytes=1500)
        assert fabric.mtu_bytes == 1500
        host_links = [link for link in fabric.links if fabric.nodes[link.a].is_host]
        nvlink = kind in ("nvswitch", "rail")  # GPUs sit on NVLink, the NICs get the host rate
        assert {link.rate_mbit for link in host_links} == ({7.5 * 18} if nvlink else {7.5})
