"""The rail-optimised layout: sizes against its formulas, NIC i of every node on rail leaf i,
names and addresses, parameter errors, the JSON the controller reads, and rail-aligned
routing walked from every GPU to every other. Pure: nothing here touches the machine."""
from __future__ import annotations

import math
import re
from pathlib import Path

import networkx as nx
import pytest
from tests.unit.fabric_walk import Walker

from testbed.controllers.routing.ecmp import (
    ECMP,
    MODES,
    SINGLE,
    PortRoute,
    compute_rules,
)
from testbed.controllers.routing.forwarding import (
    PRIORITY_DELIVERY,
    PRIORITY_PORT_ROUTE,
    PRIORITY_ROUTE,
    route_priority,
)
from testbed.errors import ConfigError
from testbed.experiments.registry import load
from testbed.model.topology import build
from testbed.model.topology.base import (
    HOST,
    LEAF,
    LINUX_IFNAMSIZ_CHARS,
    NVSWITCH,
    SPINE,
    Fabric,
    Node,
)
from testbed.model.topology.checks import check_interface_names
from testbed.model.topology.describe import describe, formulas, tier_layout
from testbed.model.topology.nvswitch import nic_port
from testbed.model.topology.rail import rail, rail_ports

REPO = Path(__file__).resolve().parents[3]
SIZES = [(nodes, gpus, spines) for nodes in (1, 2, 3, 4, 7) for gpus in (1, 2, 4, 8)
         for spines in (1, 2, 3)]


def size_id(size) -> str:
    return "n{}g{}s{}".format(*size)


def gpu_walks(fabric: Fabric, mode: str) -> dict[tuple[str, str], list[list[str]]]:
    """Every path from every GPU to every other GPU, keyed by (source, destination)."""
    walker = Walker(fabric, compute_rules(fabric, mode))
    return {(src.name, dst.name): walker.host_paths(src, dst)
            for src in fabric.hosts for dst in fabric.hosts if src is not dst}


# --- sizes and cabling -----------------------------------------------------------------------


@pytest.mark.parametrize("size", SIZES, ids=size_id)
def test_counts_and_description_match_the_formulas(size):
    nodes, gpus, spines = size
    fabric = rail(nodes, gpus, spines, host_rate_mbit=10.0, uplink_rate_mbit=25.0)
    assert len(fabric.hosts) == nodes * gpus
    assert len(fabric.switches) == nodes + gpus + spines
    assert len(fabric.links) == nodes * gpus + nodes * gpus + gpus * spines
    info = describe(fabric)
    assert info["switches_by_role"] == {SPINE: spines, LEAF: gpus, NVSWITCH: nodes}
    formula = formulas("rail", fabric.params)
    assert info["formula"] == formula
    assert {"hosts", "switches", "links", "equal_cost_paths", "oversubscription"} <= set(formula)
    for key, value in formula.items():
        assert info[key] == pytest.approx(value), key
    assert ("bisection_bandwidth_mbit" in formula) == (nodes % 2 == 0)


@pytest.mark.parametrize(("nodes", "ratio", "cut"), [
    (2, 18.0, 40.0), (4, 18.0, 80.0), (6, 1.0, 120.0), (4, 0.5, 40.0)])
def test_bisection_is_half_the_nodes_nics_or_their_slower_nvlinks(nodes, ratio, cut):
    fabric = rail(nodes, 4, 2, host_rate_mbit=10.0, nvlink_ratio=ratio)
    assert describe(fabric)["bisection_bandwidth_mbit"] == pytest.approx(cut)


@pytest.mark.parametrize("size", [(4, 4, 2), (3, 8, 1), (5, 2, 3)], ids=size_id)
def test_nic_i_of_every_node_lands_on_rail_leaf_i(size):
    nodes, gpus, spines = size
    fabric = rail(nodes, gpus, spines, host_rate_mbit=6.0, uplink_rate_mbit=12.0)
    graph = fabric.graph()
    for k in range(nodes):
        node = f"n{k}nv"
        assert sorted(graph.neighbors(node)) == sorted(
            [f"n{k}g{i}" for i in range(gpus)] + [f"l{i}" for i in range(gpus)])
        for i in range(gpus):
            nic = graph.edges[node, f"l{i}"]
            assert nic["ports"] == {node: gpus + 1 + i, f"l{i}": k + 1}
            assert nic["rate_mbit"] == 6.0
            assert fabric.host_attachment(f"n{k}g{i}") == (node, i + 1)
            assert graph.edges[f"n{k}g{i}", node]["rate_mbit"] == pytest.approx(18 * 6.0)
    for i in range(gpus):
        for j in range(spines):
            uplink = graph.edges[f"l{i}", f"s{j}"]
            assert uplink["ports"] == {f"l{i}": nodes + 1 + j, f"s{j}": i + 1}
            assert uplink["rate_mbit"] == 12.0
    assert rail_ports(fabric) == {f"n{k}nv": {i + 1: gpus + 1 + i for i in range(gpus)}
                                  for k in range(nodes)}


def test_names_addresses_and_dpids():
    fabric = rail()
    gpu = fabric.nodes["n2g3"]
    assert (gpu.ip, gpu.mac, gpu.coords) == ("10.0.2.19", "02:00:0a:00:02:13", (2, 3))
    assert fabric.nodes["n2nv"].dpid == 0x0008_0000_0202
    assert fabric.nodes["l3"].dpid == 0x0004_0000_0003
    assert fabric.nodes["s1"].dpid == 0x0005_0000_0001
    assert fabric.params == {"nodes": 4, "gpus_per_node": 4, "spines": 2, "host_rate_mbit": 100.0,
                             "uplink_rate_mbit": 100.0, "nvlink_ratio": 18.0,
                             "oversubscription": 2.0}


@pytest.mark.parametrize("size", [(100, 16, 100), (99, 16, 1), (100, 1, 100)], ids=size_id)
def test_names_fit_linux_and_identities_are_unique_at_the_largest_sizes(size):
    fabric = rail(*size)
    names = fabric.interface_names()
    assert max(len(n) for n in names) <= LINUX_IFNAMSIZ_CHARS
    assert len(set(names)) == len(names)
    for attr, nodes in (("ip", fabric.hosts), ("mac", fabric.hosts), ("dpid", fabric.switches)):
        values = [getattr(n, attr) for n in nodes]
        assert None not in values and len(set(values)) == len(values), attr


def test_interface_name_check_names_the_longest_in_one_line():
    fabric = Fabric("x", {})
    fabric.add_node(Node("averyveryverylonghost", HOST, ip="10.0.0.2", mac="02:00:0a:00:00:02"))
    fabric.add_node(Node("s0", SPINE, dpid=1))
    fabric.add_link("averyveryverylonghost", 0, "s0", 1, 1.0)
    with pytest.raises(ConfigError) as info:
        check_interface_names(fabric, "nodes", "use fewer nodes")
    assert info.value.field == "nodes"
    assert "averyveryverylonghost-eth0 has 26 characters" in info.value.problem
    assert "\n" not in str(info.value)
    check_interface_names(rail(), "nodes", "use fewer nodes")  # fits: no error


def test_tier_layout_stacks_gpus_node_switches_rails_and_spines():
    fabric = rail(2, 4, 2)
    rows = {fabric.nodes[name].role: y for name, (_, y) in tier_layout(fabric).items()}
    assert rows == {HOST: 0.0, NVSWITCH: 1.0, LEAF: 2.0, SPINE: 3.0}


# --- errors ----------------------------------------------------------------------------------

BAD_COUNTS = [0, -1, True, False, 2.5, 2.0, "2", math.nan, 101]
BAD_PARAMS = [({field: value}, field) for field in ("nodes", "gpus_per_node", "spines")
              for value in BAD_COUNTS] + [
    ({"gpus_per_node": 17}, "gpus_per_node"),      # the GPU index is an address nibble
    ({"host_rate_mbit": 0}, "host_rate_mbit"),
    ({"host_rate_mbit": "fast"}, "host_rate_mbit"),
    ({"uplink_rate_mbit": math.nan}, "uplink_rate_mbit"),
    ({"uplink_rate_mbit": -1}, "uplink_rate_mbit"),
    ({"nvlink_ratio": 0}, "nvlink_ratio"),
    ({"nvlink_ratio": math.inf}, "nvlink_ratio"),
    ({"nvlink_ratio": True}, "nvlink_ratio"),
    ({"mtu_bytes": 9000.0}, "mtu_bytes"),
    ({"mtu_bytes": 67}, "mtu_bytes"),
    ({"base": "fattree"}, "base"),                 # not a rail parameter
]


@pytest.mark.parametrize(("params", "field"), BAD_PARAMS)
def test_bad_parameters_are_one_line_errors_naming_field_and_value(params, field):
    with pytest.raises(ConfigError) as info:
        build("rail", **params)
    assert info.value.field == field
    assert "\n" not in str(info.value)
    if field in params:  # the value, or (for an unknown parameter) the parameters it takes
        assert repr(params[field]) in info.value.problem or \
            info.value.problem.startswith("not a parameter of rail; valid: nodes,")


# --- the JSON the controller reads -----------------------------------------------------------


def test_json_round_trip_keeps_the_fabric_and_its_rules(tmp_path):
    fabric = rail(3, 4, 2, host_rate_mbit=6.0)
    path = tmp_path / "fabric.json"
    fabric.dump_json(path)
    loaded = Fabric.load_json(path)
    assert loaded == fabric
    assert loaded.to_dict() == fabric.to_dict()
    for mode in MODES:
        assert compute_rules(loaded, mode) == compute_rules(fabric, mode)


# --- rail-aligned routing --------------------------------------------------------------------


@pytest.mark.parametrize("mode", [ECMP, SINGLE])
@pytest.mark.parametrize("size", [(2, 4, 2), (4, 4, 2), (3, 8, 1), (3, 2, 3), (1, 4, 2)],
                         ids=size_id)
def test_every_gpu_reaches_every_other_over_its_own_rail(size, mode):
    """One path per pair in both modes, loop-free (the walker fails on a loop), as short as
    any: NVLink inside a node, else out on the source's rail and across the far node switch."""
    fabric = rail(*size)
    graph = fabric.graph()
    for (src, dst), paths in gpu_walks(fabric, mode).items():
        assert len(paths) == 1, (src, dst, paths)
        path = paths[0]
        assert path[0] == src and path[-1] == dst
        assert len(path) - 1 == nx.shortest_path_length(graph, src, dst)
        (k, i), (m, j) = fabric.nodes[src].coords, fabric.nodes[dst].coords
        if k == m:
            assert path == [src, f"n{k}nv", dst]
        else:
            assert path == [src, f"n{k}nv", f"l{i}", f"n{m}nv", dst]


@pytest.mark.parametrize("mode", [ECMP, SINGLE])
def test_first_nic_used_by_gpu_i_is_nic_i(mode):
    gpus = 8
    fabric = rail(4, gpus, 2)
    graph = fabric.graph()
    for (src, dst), (path,) in gpu_walks(fabric, mode).items():
        k, i = fabric.nodes[src].coords
        if fabric.nodes[dst].coords[0] != k:
            assert graph.edges[path[1], path[2]]["ports"][path[1]] == nic_port(gpus, i), (src, dst)


def test_port_routes_only_at_the_node_switches_of_a_rail_fabric():
    gpus = 4
    fabric = rail(3, gpus, 2)
    for mode in MODES:
        for name, rules in compute_rules(fabric, mode).items():
            if fabric.nodes[name].role == NVSWITCH:
                assert rules.port_routes == [PortRoute(i + 1, gpus + 1 + i) for i in range(gpus)]
            else:
                assert rules.port_routes == []
    # one GPU per node on a spine-leaf also has one NIC per GPU, but no rails: no port routes
    for kind, params in (("fattree", {"k": 4}), ("spineleaf", {}), ("dragonfly", {}),
                         ("nvswitch", {"base": "spineleaf", "gpus_per_node": 1})):
        other = build(kind, **params)
        for mode in MODES:
            assert all(r.port_routes == [] for r in compute_rules(other, mode).values()), kind


def test_deliveries_outrank_port_routes_which_outrank_routes_by_destination():
    fabric = rail(2, 4, 2)
    rules = compute_rules(fabric, ECMP)
    node = rules["n0nv"]
    by_ip = {route.dst_ip: route for route in node.routes}
    for gpu in fabric.hosts:
        priority = route_priority(node, by_ip[gpu.ip])
        assert priority == (PRIORITY_DELIVERY if gpu.coords[0] == 0 else PRIORITY_ROUTE)
    assert PRIORITY_DELIVERY > PRIORITY_PORT_ROUTE > PRIORITY_ROUTE
    # switches without port routes keep every route at one priority, local or not
    for name in ("l0", "s0"):
        assert {route_priority(rules[name], r) for r in rules[name].routes} == {PRIORITY_ROUTE}
    tree = compute_rules(build("fattree", k=4), ECMP)["p0e0"]
    assert {route_priority(tree, r) for r in tree.routes} == {PRIORITY_ROUTE}


@pytest.mark.parametrize("mode", [ECMP, SINGLE])
def test_a_rail_that_lost_a_nic_is_not_pinned_and_shortest_paths_take_over(mode):
    """n0's NIC 1 is gone: rail leaf l1 no longer reaches n0, so no GPU is pinned to rail 1
    (pinned, n1g1's packets for n0 would bounce back off l1 through a node switch); every pair
    is still delivered along a shortest path, rail 1's GPUs over the remaining rails."""
    fabric = rail(3, 4, 2)
    fabric.links = [link for link in fabric.links if {link.a, link.b} != {"n0nv", "l1"}]
    assert rail_ports(fabric) == {f"n{k}nv": {1: 5, 3: 7, 4: 8} for k in range(3)}
    graph = fabric.graph()
    walks = gpu_walks(fabric, mode)
    for (src, dst), paths in walks.items():
        assert paths, (src, dst)
        k, i = fabric.nodes[src].coords
        for path in paths:
            assert len(path) - 1 == nx.shortest_path_length(graph, src, dst)
            if fabric.nodes[dst].coords[0] != k and i != 1:
                assert path[2] == f"l{i}", (src, dst, path)
    spread = {ECMP: ({"l0", "l2", "l3"}, {"l0", "l1", "l2", "l3"}), SINGLE: ({"l0"}, {"l0"})}
    assert {path[2] for path in walks[("n1g1", "n0g1")]} == spread[mode][0]
    assert {path[2] for path in walks[("n1g1", "n2g1")]} == spread[mode][1]


def test_rail_ports_of_a_fabric_without_gpu_links_is_empty_per_node():
    fabric = rail(2, 2, 1)
    fabric.links = [link for link in fabric.links if not fabric.nodes[link.a].is_host]
    assert rail_ports(fabric) == {}


# --- the scenario and its make target --------------------------------------------------------


def test_rail_scenario_and_make_target():
    fabric = load(REPO / "scenarios" / "rail-allreduce.yaml").setups[0].fabric
    assert fabric.kind == "rail"
    assert (len(fabric.hosts), len(fabric.switches)) == (8, 8)
    makefile = (REPO / "Makefile").read_text()
    target = re.search(r"^run-rail:.*\n\t\$\(TESTBED\) run (\S+)$", makefile, re.MULTILINE)
    assert target and target.group(1) == "scenarios/rail-allreduce.yaml"
