"""The training experiments' pure plans (testbed.plan.training): which hosts run the ranks,
node groups, and the cost model's alpha and beta from the fabric, against values computed by
hand from the fabric's links."""
from __future__ import annotations

import pytest

from testbed.model.topology import build
from testbed.model.topology.line import line
from testbed.model.topology.spineleaf import spine_leaf
from testbed.plan.training import (
    FRAME_HEADER_BYTES,
    HOST_MESSAGE_S,
    SWITCH_FORWARDING_S,
    PathCost,
    cost_links,
    groups_argument,
    node_groups,
    path_cost,
    place_hosts,
    ring_cost,
)

US = 1e-6


@pytest.fixture(scope="module")
def fattree():
    return build("fattree", k=4, host_rate_mbit=6.0)


@pytest.fixture(scope="module")
def gpus():
    return build("nvswitch", base="spineleaf", leaves=2, spines=2, hosts_per_leaf=2,
                 gpus_per_node=4, host_rate_mbit=6.0)


def test_packed_hosts_are_the_first_and_spread_hosts_one_per_pod(fattree):
    assert place_hosts(fattree, 3, "packed") == ["p0e0h0", "p0e0h1", "p0e1h0"]
    assert place_hosts(fattree, 4, "spread") == ["p0e0h0", "p1e0h0", "p2e0h0", "p3e0h0"]
    assert place_hosts(fattree, 16, "spread") == place_hosts(fattree, 16, "packed")
    with pytest.raises(ValueError, match="17 ranks asked, the fabric has 16 hosts"):
        place_hosts(fattree, 17)
    with pytest.raises(ValueError, match="unknown placement"):
        place_hosts(fattree, 2, "scattered")


def test_node_groups_are_the_hosts_behind_each_switch(fattree, gpus):
    hosts = place_hosts(fattree, 6, "packed")
    assert node_groups(fattree, hosts) == [[0, 1], [2, 3], [4, 5]]
    spread = place_hosts(fattree, 4, "spread")
    assert node_groups(fattree, spread) == [[0], [1], [2], [3]]
    every_gpu = [h.name for h in gpus.hosts]
    assert node_groups(gpus, every_gpu) == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11],
                                            [12, 13, 14, 15]]
    assert groups_argument([[0, 1, 2], [3, 4]]) == "0,1,2/3,4"


def test_alpha_and_beta_across_pods_by_hand(fattree):
    # p0e1h1 -> p1e0h0: host-edge-aggregation-core-aggregation-edge-host, 6 links at 6 Mbit/s
    cost = path_cost(fattree, "p0e1h1", "p1e0h0")
    assert (cost.hops, cost.rate_mbit) == (6, 6.0)
    link = cost.alpha_beta
    # per hop: a 66-byte frame at 6 Mbit/s (528 bits / 6e6 = 88 us) + 20 us of forwarding
    assert link.alpha_s == pytest.approx(150 * US + 6 * (88 * US + 20 * US))  # 798 us
    assert link.beta_s_per_byte == pytest.approx(8 / 6e6)
    assert cost.to_dict() == {"hops": 6, "rate_mbit": 6.0, "alpha_us": 798.0}
    assert (FRAME_HEADER_BYTES, SWITCH_FORWARDING_S, HOST_MESSAGE_S) == (66, 20e-6, 150e-6)


def test_same_edge_switch_is_two_hops(fattree):
    cost = path_cost(fattree, "p0e0h0", "p0e0h1")
    assert cost.hops == 2
    assert cost.alpha_beta.alpha_s == pytest.approx(150 * US + 2 * 108 * US)  # 366 us


def test_the_ring_takes_its_worst_pair_of_neighbours(fattree):
    # packed: neighbours on one edge (2 hops), in one pod (4), across pods (6); the worst: 6
    assert ring_cost(fattree, place_hosts(fattree, 16, "packed")) == PathCost(6, 6.0)
    assert ring_cost(fattree, ["p0e0h0", "p0e0h1"]) == PathCost(2, 6.0)
    assert ring_cost(fattree, ["p0e0h0", "p0e1h0"]) == PathCost(4, 6.0)
    with pytest.raises(ValueError, match="two hosts"):
        ring_cost(fattree, ["p0e0h0"])


def test_the_bottleneck_is_the_slowest_link_on_the_path():
    fabric = spine_leaf(leaves=2, spines=1, hosts_per_leaf=2, host_rate_mbit=6.0,
                        uplink_rate_mbit=3.0)
    hosts = [h.name for h in fabric.hosts]
    assert path_cost(fabric, hosts[0], hosts[2]) == PathCost(4, 3.0)
    assert path_cost(fabric, hosts[0], hosts[1]) == PathCost(2, 6.0)
    # at 3 Mbit/s a 66-byte frame takes 176 us per hop
    assert PathCost(4, 3.0).alpha_beta.alpha_s == pytest.approx(150 * US + 4 * 196 * US)


def test_nvlink_inside_a_node_and_nic_across_nodes(gpus):
    every_gpu = [h.name for h in gpus.hosts]
    inside = cost_links(gpus, every_gpu[:4])
    assert inside.link == PathCost(2, 108.0)  # 18 x the 6 Mbit/s NIC
    # 66 bytes at 108 Mbit/s: 528 / 108e6 s = 4.889 us
    assert inside.link.alpha_beta.alpha_s == pytest.approx(150 * US + 2 * (528 / 108e6 + 20 * US))
    across = cost_links(gpus, [every_gpu[0], every_gpu[4], every_gpu[8], every_gpu[12]])
    assert across.link == PathCost(6, 6.0)
    grouped = cost_links(gpus, every_gpu, node_groups(gpus, every_gpu))
    assert grouped.link == PathCost(6, 6.0) and grouped.intra == PathCost(2, 108.0)


def test_the_programs_cost_arguments(gpus):
    every_gpu = [h.name for h in gpus.hosts]
    plain = cost_links(gpus, every_gpu[:4])
    argv = plain.argv()
    assert argv[0::2] == ["--link-rate-mbit", "--alpha-us"]
    assert float(argv[1]) == pytest.approx(108.0)
    assert float(argv[3]) == pytest.approx(199.778, abs=1e-3)
    grouped = cost_links(gpus, every_gpu, node_groups(gpus, every_gpu)).argv()
    assert grouped[0::2] == ["--link-rate-mbit", "--alpha-us", "--intra-link-rate-mbit",
                             "--intra-alpha-us"]
    assert float(grouped[5]) == pytest.approx(108.0)
    assert plain.to_dict()["source"].startswith("derived from the fabric description")


def test_an_unshaped_fabric_leaves_the_ranks_to_calibrate():
    fabric = line(switches=2, host_rate_mbit=None)
    costs = cost_links(fabric, [h.name for h in fabric.hosts])
    assert costs.link == PathCost(3, None) and costs.link.alpha_beta is None
    assert not costs.derived and costs.argv() == []
    assert costs.to_dict()["source"].startswith("calibrated by the ranks")
