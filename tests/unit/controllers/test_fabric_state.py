"""The controller's bookkeeping, without OpenFlow: switch ports map to the fabric's links, a
link fails once and returns once (ports still being built do not count), switches come and
go, routing modes and anycast services are checked before anything runs, and UGAL rewrites
a source group only when measured load moves its weights enough."""
from __future__ import annotations

import pytest

from testbed.controllers.routing.dragonfly import (
    MINIMAL,
    UGAL,
    VALIANT,
    WEIGHT_SCALE,
    dragonfly_view,
    source_buckets,
    source_group_id,
    ugal_weights,
)
from testbed.controllers.routing.fabric_state import (
    UGAL_MIN_WEIGHT_CHANGE,
    AnycastService,
    Change,
    FabricState,
    anycast_problem,
    link_ends,
    routing_problem,
    ugal_updates,
)
from testbed.controllers.routing.forwarding import (
    ETH_TYPE_ARP,
    ETH_TYPE_LLDP,
    PRIORITY_ARP,
    PRIORITY_LLDP,
    GroupMod,
    describe_plan,
)
from testbed.controllers.routing.rules import FlowMatch
from testbed.model.topology import build
from testbed.model.topology.fattree import fat_tree

OFPP_LOCAL = 0xFFFFFFFE


@pytest.fixture(scope="module")
def tree():
    return fat_tree(4)


@pytest.fixture(scope="module")
def dragonfly():
    return build("dragonfly", p=1, a=2, h=1)  # 3 groups of 2 routers, 1 host each


def trunk(fabric, a: str, b: str):
    return next(link for link in fabric.links if {link.a, link.b} == {a, b})


def up_everywhere(state: FabricState) -> FabricState:
    for end in state.links_at:
        state.port_status(*end, up=True)
    return state


# --- ports and links -------------------------------------------------------------------------


def test_every_switch_port_maps_to_its_link(tree):
    ends = link_ends(tree)
    switches = {s.name for s in tree.switches}
    assert len(ends) == sum((link.a in switches) + (link.b in switches) for link in tree.links)
    for (switch, port), link in ends.items():
        assert (switch, port) in ((link.a, link.a_port), (link.b, link.b_port))
        assert switch in switches
    host_link, _ = tree.host_link("p0e0h0")
    assert ends[("p0e0", 1)] == host_link and ("p0e0h0", 0) not in ends
    state = FabricState(tree)
    assert state.port_status("p0e0", OFPP_LOCAL, up=False) is None  # the bridge's own port


def test_a_link_fails_once_and_returns_when_both_ends_are_up(tree):
    state = up_everywhere(FabricState(tree))
    link = trunk(tree, "p0e0", "p0a0")
    a, b = (link.a, link.a_port), (link.b, link.b_port)
    assert state.port_status(*a, up=False) == Change("link_down", link=link)
    assert state.port_status(*b, up=False) is None  # the peer notices too: one failure
    assert state.failed_links == {link}
    assert state.port_status(*a, up=True) is None  # b still reports down
    assert state.port_status(*b, up=True) == Change("link_up", link=link)
    assert state.failed_links == frozenset()


def test_ports_never_seen_up_are_being_built_not_failed(tree):
    state = FabricState(tree)
    host_link, _ = tree.host_link("p0e0h0")
    assert state.port_status("p0e0", 1, up=False) is None  # the host has not configured eth0
    assert state.refresh() == {} and not state.dirty
    assert state.port_status("p0e0", 1, up=True) is None  # now it has: nothing to recompute
    assert state.port_status("p0e0", 1, up=False) == Change("link_down", link=host_link)


def test_switch_down_empties_its_table_and_reroutes_its_neighbours(tree):
    state = up_everywhere(FabricState(tree))
    before = dict(state.tables)
    assert state.switch_status("p0a0", up=False) == Change("switch_down", switch="p0a0")
    assert state.switch_status("p0a0", up=False) is None
    plans = state.refresh()
    assert set(state.tables["p0a0"].flows) == {(PRIORITY_ARP, FlowMatch(eth_type=ETH_TYPE_ARP)),
                                               (PRIORITY_LLDP, FlowMatch(eth_type=ETH_TYPE_LLDP))}
    assert not state.tables["p0a0"].groups
    assert {"p0e0", "p0e1"} <= set(plans)  # its edge switches lose an uplink
    assert state.switch_status("p0a0", up=True) == Change("switch_up", switch="p0a0")
    assert state.switch_status("p0a0", up=True) is None
    state.refresh()
    assert state.tables["p0a0"] == before["p0a0"]


def test_refresh_recomputes_only_after_a_change(tree):
    state = up_everywhere(FabricState(tree))
    tables = state.tables
    assert state.refresh() == {} and state.tables is tables
    link = trunk(tree, "p1e1", "p1a1")
    state.port_status(link.a, link.a_port, up=False)
    assert state.dirty and state.refresh() and not state.dirty


def test_change_records_name_the_link_by_its_ends(tree):
    link = trunk(tree, "p0e0", "p0a0")
    assert Change("link_down", link=link).describe() == (
        f"link_down {link.a}:{link.a_port}-{link.b}:{link.b_port}")
    assert Change("switch_down", switch="c0").describe() == "switch_down c0"
    assert Change("link_down", link=link).to_dict() == {
        "event": "link_down", "link": {"a": link.a, "a_port": link.a_port, "b": link.b,
                                       "b_port": link.b_port}, "switch": None}


def test_dragonfly_modes_record_failures_without_rerouting(dragonfly):
    state = up_everywhere(FabricState(dragonfly, MINIMAL))
    tables = dict(state.tables)
    link = next(iter(set(state.links_at.values())))
    end = next(e for e in state.links_at if state.links_at[e] == link)
    assert state.port_status(*end, up=False).event == "link_down"
    assert not state.reroutes and state.refresh() == {} and state.tables == tables


# --- routing modes and anycast, checked up front ---------------------------------------------


@pytest.mark.parametrize(("topology", "mode", "words"), [
    ("fattree", "ugal", "'ugal' routes dragonfly fabrics only, not fattree"),
    ("rail", "valiant", "'valiant' routes dragonfly fabrics only"),
    ("dragonfly", "shortest", "must be one of ecmp, single, minimal, valiant, ugal"),
])
def test_routing_problems(topology, mode, words):
    assert words in routing_problem(topology, mode)


@pytest.mark.parametrize(("topology", "mode"), [
    ("fattree", "ecmp"), ("rail", "single"), ("dragonfly", "ecmp"), ("dragonfly", "minimal"),
    ("dragonfly", "valiant"), ("dragonfly", "ugal")])
def test_routing_fine(topology, mode):
    assert routing_problem(topology, mode) is None


def test_state_refuses_what_validation_refuses(tree, dragonfly):
    with pytest.raises(ValueError, match="routing: 'ugal' routes dragonfly fabrics only"):
        FabricState(tree, UGAL)
    with pytest.raises(ValueError, match="needs routing ecmp or single"):
        FabricState(dragonfly, VALIANT, AnycastService("10.255.0.1", ("g0r0h0",)))


@pytest.mark.parametrize(("anycast", "words"), [
    ({"service_ip": "10.255.0.1"}, 'exactly "service_ip" and "replicas"'),
    ({"service_ip": "10.255.0.1", "replicas": []}, "non-empty list of host names"),
    ({"service_ip": "10.255.0.1", "replicas": ["p0e0h0", "p0e0h0"]}, "name a host twice"),
    ({"service_ip": 5, "replicas": ["p0e0h0"]}, "IPv4 address string"),
    ({"service_ip": "10.255.0.300", "replicas": ["p0e0h0"]}, "not an IPv4 address"),
    ({"service_ip": "192.168.0.1", "replicas": ["p0e0h0"]}, "in 10.0.0.0/8"),
    ({"service_ip": "10.255.255.255", "replicas": ["p0e0h0"]}, "in 10.0.0.0/8"),
    ({"service_ip": "10.0.0.2", "replicas": ["p0e0h1"]}, "a host's own address"),
    ({"service_ip": "10.255.0.1", "replicas": ["p0e0"]}, "'p0e0' is not a host"),
    ([], 'exactly "service_ip" and "replicas"'),
])
def test_anycast_problems(tree, anycast, words):
    assert words in anycast_problem(tree, anycast, "ecmp")


def test_anycast_fine_and_round_trips(tree):
    good = {"service_ip": "10.255.0.1", "replicas": ["p0e0h0", "p3e1h1"]}
    assert anycast_problem(tree, good, "single") is None
    assert AnycastService.from_dict(good).to_dict() == good


# --- UGAL ------------------------------------------------------------------------------------


def global_link(fabric, a: str):
    """The global link of router ``a`` (one per router with h=1)."""
    return next(link for link in fabric.links
                if a in (link.a, link.b) and link.a[:2] != link.b[:2]
                and not fabric.nodes[link.a].is_host and not fabric.nodes[link.b].is_host)


def test_ugal_moves_traffic_off_a_busy_global_link_and_only_then(dragonfly):
    state = FabricState(dragonfly, UGAL)
    view = dragonfly_view(dragonfly)
    assert state.ugal_round({}) == {}  # idle: the installed (minimal) weights stand
    link = global_link(dragonfly, "g0r0")
    rate = link.rate_mbit
    busy = {(link.a, link.a_port): 0.8 * rate}
    plans = state.ugal_round(busy)
    assert plans, "a busy minimal path must move traffic"
    utilisation = {(link.a, link.a_port): 0.8}
    for router, plan in plans.items():
        assert all(isinstance(m, GroupMod) and m.command == "modify" for m in plan[:-1])
        assert describe_plan(plan)[-1] == "barrier"
        for message in plan[:-1]:
            group = next(g for g in view.groups if source_group_id(g) == message.group_id)
            assert group != view.group_of[router]  # only source groups are reweighted
            assert message.buckets == source_buckets(view, router, group, UGAL, utilisation)
            assert state.tables[router].groups[message.group_id] == message.buckets
    assert state.ugal_round(busy) == {}  # same load, same weights: nothing to send
    assert state.ugal_round({}), "the load is gone: back to minimal"


def test_ugal_updates_need_a_weight_to_move_by_the_threshold(dragonfly):
    view = dragonfly_view(dragonfly)
    link = global_link(dragonfly, "g0r0")
    utilisation = {(link.a, link.a_port): 0.8}
    key = ("g0r0", view.group_of[link.b])
    now = ugal_weights(view, *key, utilisation)
    assert max(now.values()) < WEIGHT_SCALE  # the detour takes a share
    just_under = {o: w + (UGAL_MIN_WEIGHT_CHANGE - 1 if o is None else 0) for o, w in now.items()}
    just_at = {o: w + (UGAL_MIN_WEIGHT_CHANGE if o is None else 0) for o, w in now.items()}
    assert ugal_updates(view, {key: just_under}, utilisation) == {}
    assert ugal_updates(view, {key: just_at}, utilisation) == {key: now}


def test_ugal_rounds_do_nothing_under_other_modes(dragonfly):
    link = global_link(dragonfly, "g0r0")
    for mode in ("ecmp", MINIMAL, VALIANT):
        assert FabricState(dragonfly, mode).ugal_round({(link.a, link.a_port): 90.0}) == {}
