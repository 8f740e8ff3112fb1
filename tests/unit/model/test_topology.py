"""Fat-tree descriptions checked against the published formulas (Al-Fares et al., SIGCOMM 2008)
and against the naming and addressing rules the fabric, controller and reports rely on."""
from __future__ import annotations

import ipaddress
import math
from collections import defaultdict

import networkx as nx
import pytest
from tests.unit.fabric_walk import ports_by_node

from testbed.errors import ConfigError
from testbed.harness.console import table_text
from testbed.model.topology import BUILDERS, build
from testbed.model.topology.base import Fabric, Link, Node, host_address, intf_name
from testbed.model.topology.describe import describe, description_rows
from testbed.model.topology.fattree import (
    AGGREGATION,
    CORE,
    EDGE,
    fat_tree,
    switch_dpid,
)

KS = [2, 4, 6, 8, 10, 12]
LINUX_IFNAMSIZ_CHARS = 15  # IFNAMSIZ (16) minus the terminating NUL
ROLE_CODES = {EDGE: 1, AGGREGATION: 2, CORE: 3}


@pytest.fixture(scope="module", params=KS, ids=lambda k: f"k{k}")
def tree(request) -> tuple[int, Fabric]:
    return request.param, fat_tree(request.param)


def mac_octets(mac: str) -> list[int]:
    return [int(x, 16) for x in mac.split(":")]


# --- sizes -------------------------------------------------------------------------------------


def test_counts_match_published_formulas(tree):
    k, fabric = tree
    roles = [n.role for n in fabric.switches]
    assert len(fabric.hosts) == k ** 3 // 4
    assert len(fabric.switches) == 5 * k * k // 4
    assert len(fabric.links) == 3 * k ** 3 // 4
    assert roles.count(CORE) == (k // 2) ** 2
    assert roles.count(AGGREGATION) == k * k // 2
    assert roles.count(EDGE) == k * k // 2


def test_every_switch_uses_exactly_k_ports_numbered_from_one(tree):
    k, fabric = tree
    ports = ports_by_node(fabric)
    for switch in fabric.switches:
        assert sorted(ports[switch.name]) == list(range(1, k + 1)), switch.name


def test_every_host_has_one_link_on_port_zero(tree):
    _, fabric = tree
    ports = ports_by_node(fabric)
    for host in fabric.hosts:
        assert ports[host.name] == [0], host.name


def test_port_numbering_follows_the_documented_layout(tree):
    """Edge: hosts on 1..k/2, uplinks on k/2+1..k; aggregation: down 1..k/2, up k/2+1..k."""
    k, fabric = tree
    half = k // 2
    roles = {n.name: n.role for n in fabric.nodes.values()}
    for link in fabric.links:
        for node, port, peer in ((link.a, link.a_port, link.b), (link.b, link.b_port, link.a)):
            role, peer_role = roles[node], roles[peer]
            if role == EDGE:
                assert (port <= half) == (peer_role == "host")
            elif role == AGGREGATION:
                assert (port <= half) == (peer_role == EDGE)
            elif role == CORE:
                assert peer_role == AGGREGATION
                assert port == fabric.nodes[peer].coords[0] + 1  # core port p+1 goes to pod p


def test_links_join_the_right_tiers(tree):
    k, fabric = tree
    roles = {n.name: n.role for n in fabric.nodes.values()}
    pairs = [tuple(sorted((roles[link.a], roles[link.b]))) for link in fabric.links]
    assert pairs.count((EDGE, "host")) == k ** 3 // 4
    assert pairs.count((AGGREGATION, EDGE)) == k ** 3 // 4
    assert pairs.count((AGGREGATION, CORE)) == k ** 3 // 4
    for link in fabric.links:
        a, b = fabric.nodes[link.a], fabric.nodes[link.b]
        if CORE not in (a.role, b.role):
            assert a.coords[0] == b.coords[0], f"{link.a}-{link.b} crosses pods below the core"


def test_core_switch_joins_aggregation_i_of_every_pod(tree):
    k, fabric = tree
    half = k // 2
    peers = defaultdict(set)
    for link in fabric.links:
        peers[link.a].add(link.b)
        peers[link.b].add(link.a)
    for core in (n for n in fabric.switches if n.role == CORE):
        i = core.coords[0] // half
        assert peers[core.name] == {f"p{pod}a{i}" for pod in range(k)}


def test_no_duplicate_cables(tree):
    _, fabric = tree
    ends = [frozenset((link.a, link.b)) for link in fabric.links]
    assert len(set(ends)) == len(ends)


# --- identities --------------------------------------------------------------------------------


def test_ips_macs_dpids_and_names_are_unique(tree):
    _, fabric = tree
    ips = [h.ip for h in fabric.hosts]
    macs = [h.mac for h in fabric.hosts]
    dpids = [s.dpid for s in fabric.switches]
    assert len(set(ips)) == len(ips)
    assert len(set(macs)) == len(macs)
    assert len(set(dpids)) == len(dpids)
    assert len(fabric.nodes) == len(fabric.hosts) + len(fabric.switches)
    assert all(s.ip is None and s.mac is None for s in fabric.switches)
    assert all(h.dpid is None for h in fabric.hosts)


def test_host_ip_and_mac_encode_the_host_coordinates(tree):
    _, fabric = tree
    for host in fabric.hosts:
        pod, edge, index = host.coords
        ip = ipaddress.IPv4Address(host.ip)
        assert ip in ipaddress.IPv4Network("10.0.0.0/8")
        assert list(ip.packed) == [10, pod, edge, index + 2]
        octets = mac_octets(host.mac)
        assert octets[:3] == [0x02, 0x00, 0x0A]
        assert octets[0] & 0x02 and not octets[0] & 0x01  # locally administered, unicast
        assert octets[3:] == list(ip.packed)[1:]
        assert host.name == f"p{pod}e{edge}h{index}"


def test_switch_dpid_encodes_role_and_coordinates(tree):
    _, fabric = tree
    for switch in fabric.switches:
        assert switch.dpid >> 32 == ROLE_CODES[switch.role]
        if switch.role == CORE:
            assert (switch.dpid >> 16) & 0xFFFF == 0
            assert switch.dpid & 0xFFFF == switch.coords[0]
            assert switch.name == f"c{switch.coords[0]}"
        else:
            pod, index = switch.coords
            assert (switch.dpid >> 16) & 0xFFFF == pod
            assert switch.dpid & 0xFFFF == index
            assert switch.name == f"p{pod}{'e' if switch.role == EDGE else 'a'}{index}"
        assert 0 < switch.dpid < 2 ** 64


def test_switch_dpid_layout():
    assert switch_dpid(EDGE, 3, 2) == 0x0001_0003_0002
    assert switch_dpid(AGGREGATION, 0, 1) == 0x0002_0000_0001
    assert switch_dpid(CORE, 0, 35) == 0x0003_0000_0023


def test_interface_names_fit_linux_limit_and_are_unique(tree):
    _, fabric = tree
    names = fabric.interface_names()
    assert len(names) == 2 * len(fabric.links)
    assert len(set(names)) == len(names)
    assert max(len(n) for n in names) <= LINUX_IFNAMSIZ_CHARS


def test_interface_names_for_largest_supported_k_fit():
    """k=64 has the longest coordinates the builder accepts (pod 63, edge/host 31)."""
    for node, port in (("p63e31h31", 0), ("p63e31", 64), ("p63a31", 64), ("c1023", 64)):
        assert len(intf_name(node, port)) <= LINUX_IFNAMSIZ_CHARS


def test_host_attachment_matches_the_naming_scheme(tree):
    _, fabric = tree
    for host in fabric.hosts:
        pod, edge, index = host.coords
        assert fabric.host_attachment(host.name) == (f"p{pod}e{edge}", index + 1)
    with pytest.raises(KeyError):
        fabric.host_attachment("nosuchhost")


def test_link_intf_names_each_end():
    link = Link("p0e0h1", 0, "p0e0", 2, 10.0)
    assert link.intf(0) == "p0e0h1-eth0"
    assert link.intf(1) == "p0e0-eth2"


# --- paths -------------------------------------------------------------------------------------


def count_shortest_paths(graph: nx.Graph, src: str, dst: str) -> int:
    return sum(1 for _ in nx.all_shortest_paths(graph, src, dst))


def test_equal_cost_paths_between_pods(tree):
    k, fabric = tree
    graph = fabric.graph()
    half = k // 2
    last_pod = k - 1
    pairs = [("p0e0h0", f"p{last_pod}e{half - 1}h{half - 1}"), ("p0e0h0", "p1e0h0")]
    for src, dst in pairs:
        assert count_shortest_paths(graph, src, dst) == half ** 2, (src, dst)
        assert nx.shortest_path_length(graph, src, dst) == 6


def test_equal_cost_paths_inside_a_pod(tree):
    k, fabric = tree
    graph = fabric.graph()
    half = k // 2
    if half > 1:
        assert count_shortest_paths(graph, "p0e0h0", "p0e1h0") == half
        assert nx.shortest_path_length(graph, "p0e0h0", "p0e1h0") == 4
        assert count_shortest_paths(graph, "p0e0h0", "p0e0h1") == 1
        assert nx.shortest_path_length(graph, "p0e0h0", "p0e0h1") == 2


def test_graph_edges_carry_ports_and_rates():
    fabric = fat_tree(4, host_rate_mbit=10.0, fabric_rate_mbit=40.0)
    graph = fabric.graph()
    assert graph.number_of_nodes() == 36
    assert graph.number_of_edges() == 48
    assert graph.edges["p0e0h0", "p0e0"]["ports"] == {"p0e0h0": 0, "p0e0": 1}
    assert graph.edges["p0e0h0", "p0e0"]["rate_mbit"] == 10.0
    assert graph.edges["p0e1", "p0a0"]["ports"] == {"p0e1": 3, "p0a0": 2}
    assert graph.edges["p2a1", "c3"]["ports"] == {"p2a1": 4, "c3": 3}
    assert graph.edges["p2a1", "c3"]["rate_mbit"] == 40.0
    assert graph.nodes["c3"]["role"] == CORE


def test_fabric_rate_defaults_to_host_rate():
    fabric = fat_tree(4, host_rate_mbit=25.0)
    assert {link.rate_mbit for link in fabric.links} == {25.0}
    assert fabric.params == {"k": 4, "host_rate_mbit": 25.0, "fabric_rate_mbit": 25.0}


# --- describe ----------------------------------------------------------------------------------


def test_describe_matches_formulas(tree):
    k, fabric = tree
    info = describe(fabric)
    for key in ("hosts", "switches", "links", "equal_cost_paths"):
        assert info[key] == info["formula"][key], key
    assert info["formula"] == {"hosts": k ** 3 // 4, "switches": 5 * k * k // 4,
                               "links": 3 * k ** 3 // 4, "equal_cost_paths": (k // 2) ** 2,
                               "switch_links": k ** 3 // 2, "max_switch_ports": k,
                               "max_switch_hops_between_hosts": 4,
                               "bisection_bandwidth_mbit": k ** 3 / 8 * 100.0}
    for key in ("switch_links", "max_switch_ports", "max_switch_hops_between_hosts",
                "bisection_bandwidth_mbit"):
        assert info[key] == info["formula"][key], key
    assert info["oversubscription"] is None  # fat-tree params carry none
    assert info["switches_by_role"] == {CORE: (k // 2) ** 2, AGGREGATION: k * k // 2,
                                        EDGE: k * k // 2}
    assert info["switch_diameter_hops"] == 4
    assert info["host_pair_hops"] == 6
    assert info["host_pair"] == ["p0e0h0", f"p{k - 1}e{k // 2 - 1}h{k // 2 - 1}"]


def test_description_rows_k4_and_their_table():
    rows = description_rows(describe(fat_tree(4)))
    lines = table_text(rows).splitlines()
    width = len("equal-cost paths p0e0h0 -> p3e1h1")  # the longest label sets the column
    expected = [
        ("topology", "fattree {'k': 4, 'host_rate_mbit': 100.0, 'fabric_rate_mbit': 100.0}"),
        ("hosts", "16   (formula: 16)"),
        ("switches", "20   (formula: 20)"),
        ("switches by role", "4 core, 8 aggregation, 8 edge"),
        ("links", "48   (formula: 48)"),
        ("equal-cost paths p0e0h0 -> p3e1h1", "4   (formula: 4)"),
        ("switch diameter", "4 hops"),
        ("switch-to-switch links", "32   (formula: 32)"),
        ("max switch ports", "4   (formula: 4)"),
        ("max switch hops host-host", "4   (formula: 4)"),
        ("bisection bandwidth", "800 Mbit/s   (formula: 800 Mbit/s)"),
    ]
    assert rows == expected
    assert lines == [f"{label:<{width}}  {value}" for label, value in expected]


# --- serialisation -----------------------------------------------------------------------------


def test_to_dict_from_dict_round_trip(tree):
    _, fabric = tree
    again = Fabric.from_dict(fabric.to_dict())
    assert again == fabric
    assert list(again.nodes) == list(fabric.nodes)
    assert all(isinstance(n.coords, tuple) for n in again.nodes.values())


def test_json_file_round_trip(tmp_path):
    fabric = fat_tree(4, host_rate_mbit=6.0, mtu_bytes=1500)
    path = tmp_path / "fabric.json"
    fabric.dump_json(path)
    again = Fabric.load_json(path)
    assert again == fabric
    assert again.mtu_bytes == 1500
    assert again.links[0] == Link("p0e0h0", 0, "p0e0", 1, 6.0)


def test_add_node_rejects_duplicates():
    fabric = Fabric(kind="x", params={})
    fabric.add_node(Node("s1", "edge", dpid=1))
    with pytest.raises(ValueError, match="duplicate node s1"):
        fabric.add_node(Node("s1", "edge", dpid=2))


@pytest.mark.parametrize(("coords", "ip", "mac"), [
    ((0, 0, 2), "10.0.0.2", "02:00:0a:00:00:02"),
    ((3, 1, 3), "10.3.1.3", "02:00:0a:03:01:03"),
    ((255, 255, 255), "10.255.255.255", "02:00:0a:ff:ff:ff"),
])
def test_host_address(coords, ip, mac):
    assert host_address(*coords) == (ip, mac)


@pytest.mark.parametrize("coords", [(256, 0, 2), (0, -1, 2), (0, 0, 300)])
def test_host_address_rejects_out_of_range(coords):
    with pytest.raises(ValueError, match="out of range"):
        host_address(*coords)


# --- errors ------------------------------------------------------------------------------------


@pytest.mark.parametrize("k", [3, 5, 1, 0, -2, True, False, 4.0, "4", None, 66])
def test_bad_k_is_a_config_error_on_k(k):
    with pytest.raises(ConfigError) as info:
        fat_tree(k)
    assert info.value.field == "k"
    assert str(info.value).startswith("k: ")


@pytest.mark.parametrize(("params", "field"), [
    ({"host_rate_mbit": 0}, "host_rate_mbit"),
    ({"host_rate_mbit": -5.0}, "host_rate_mbit"),
    ({"fabric_rate_mbit": 0}, "fabric_rate_mbit"),
    ({"fabric_rate_mbit": -1}, "fabric_rate_mbit"),
])
def test_non_positive_rates_are_config_errors(params, field):
    with pytest.raises(ConfigError) as info:
        fat_tree(4, **params)
    assert info.value.field == field


@pytest.mark.parametrize("hosts_per_edge", [0, 5, -1, 2.0, "1", True])
def test_bad_hosts_per_edge_is_a_config_error_on_it(hosts_per_edge):
    with pytest.raises(ConfigError) as info:
        fat_tree(8, hosts_per_edge=hosts_per_edge)
    assert info.value.field == "hosts_per_edge"


def test_fewer_hosts_per_edge_keep_every_switch_and_path():
    full, thin = fat_tree(8), fat_tree(8, hosts_per_edge=1)
    assert [s.name for s in thin.switches] == [s.name for s in full.switches]
    assert [h.name for h in thin.hosts] == [f"p{p}e{e}h0" for p in range(8) for e in range(4)]
    assert thin.params["hosts_per_edge"] == 1 and "hosts_per_edge" not in full.params
    # the edge switch's uplinks follow its one host port; the aggregation side is unchanged
    assert ("p0e0", 2, "p0a0", 1) in {(l.a, l.a_port, l.b, l.b_port) for l in thin.links}
    assert fat_tree(8, hosts_per_edge=4).to_dict() == full.to_dict()
    paths = list(nx.all_shortest_paths(thin.graph(), "p0e0h0", "p7e3h0"))
    assert len(paths) == 16


@pytest.mark.parametrize("params", [{"host_rate_mbit": math.nan}, {"fabric_rate_mbit": math.nan}])
def test_nan_rate_is_a_config_error(params):
    with pytest.raises(ConfigError):
        fat_tree(4, **params)


def test_build_by_name():
    assert BUILDERS["fattree"] is fat_tree
    fabric = build("fattree", k=2, host_rate_mbit=5.0)
    assert fabric.kind == "fattree"
    assert len(fabric.hosts) == 2
    assert fabric == fat_tree(2, host_rate_mbit=5.0)


def test_build_unknown_topology():
    with pytest.raises(ConfigError) as info:
        build("torus", k=4)
    assert info.value.field == "topology"
    assert "torus" in str(info.value) and "fattree" in str(info.value)


def test_build_unknown_parameter():
    with pytest.raises(ConfigError) as info:
        build("fattree", k=4, radix=8)
    assert info.value.field == "radix"
    assert "not a parameter of fattree; valid: k, host_rate_mbit" in str(info.value)


def test_build_passes_parameter_errors_through():
    with pytest.raises(ConfigError) as info:
        build("fattree", k=7)
    assert info.value.field == "k"


def test_switch_ends_are_every_non_host_link_end_once(tree):
    _, fabric = tree
    ends = fabric.switch_ends()
    assert len(ends) == 2 * len(fabric.links) - len(fabric.hosts)
    assert len({intf for _, _, intf, _ in ends}) == len(ends)
    assert all(not fabric.nodes[sw].is_host and intf == f"{sw}-eth{port}"
               for sw, port, intf, _ in ends)


def test_host_link_names_the_hosts_end(tree):
    _, fabric = tree
    for host in fabric.hosts:
        link, end = fabric.host_link(host.name)
        assert (link.a, link.b)[end] == host.name
        assert fabric.host_attachment(host.name) == ((link.b, link.b_port) if end == 0
                                                     else (link.a, link.a_port))
