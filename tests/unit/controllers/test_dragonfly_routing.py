"""Dragonfly routing modes walked as the switches would run them: every packet of every pair,
over every bucket choice, is delivered untagged without a loop, over at most one global link
(minimal) or two (Valiant, UGAL); the adversarial shift pattern piles onto one global link
under minimal routing and spreads under Valiant; UGAL weights move with the measured load;
and the fluid model agrees with the flow tables, also for a pair sent one way; under UGAL the
first packets of a new flow follow the minimal route with no controller to place them. Flows
placed one by one under UGAL: tests/unit/controllers/test_ugal.py."""
from __future__ import annotations

import functools
import random
from collections import Counter, defaultdict
from dataclasses import replace

import pytest
from tests.unit.fabric_walk import FlowWalker, Hop, port_ends

from testbed.controllers.routing.dragonfly import (
    DRAGONFLY_MODES,
    MINIMAL,
    PRIORITY_INGRESS,
    PRIORITY_MINIMAL,
    PRIORITY_TAGGED,
    UGAL,
    VALIANT,
    WEIGHT_SCALE,
    compute_dragonfly_rules,
    dragonfly_view,
    group_shift_traffic,
    link_loads_mbit,
    link_utilisation,
    source_group_id,
    ugal_shares,
    ugal_weights,
    vlan_vid,
)
from testbed.controllers.routing.rules import (
    Bucket,
    FlowRule,
    Match,
    Output,
    PopVlan,
    PushVlan,
    ToController,
    ToGroup,
)
from testbed.controllers.routing.ugal import (
    IP_PROTO_TCP,
    IP_PROTO_UDP,
    PRIORITY_TO_CONTROLLER,
    to_controller_rules,
)
from testbed.model.topology.base import Fabric
from testbed.model.topology.dragonfly import dragonfly
from testbed.model.topology.fattree import fat_tree

# (p, a, h, g): balanced sizes, fewer groups than a*h+1, and the two-group corner
SIZES = [(1, 2, 1, None), (1, 3, 1, None), (2, 2, 2, None), (2, 4, 2, None), (2, 4, 2, 5),
         (1, 4, 3, 7), (2, 3, 2, None), (1, 3, 2, 2)]
# p=1 a=3 h=2 g=3 with two extra global links: groups 0-1 and 1-2 are joined twice, so
# routers without a link to a group reach it over two gateways (an ECMP group)
PARALLEL = "parallel"
RATE_MBIT = 100.0
# UGAL bucket weights are shares rounded to 1/WEIGHT_SCALE; the flow tables then split
# traffic up to this fraction of a sender's rate away from the exact shares.
ROUNDING_SHARE = 0.005


def size_id(size) -> str:
    return size if size == PARALLEL else "p{}a{}h{}g{}".format(*size)


@functools.lru_cache(maxsize=None)
def built(size) -> Fabric:
    """One fabric per size for the whole module (tests must not change it)."""
    if size != PARALLEL:
        return dragonfly(*size)
    fabric = dragonfly(1, 3, 2, 3)  # only router 0 of each group has global links (ports 4, 5)
    fabric.add_link("g0r1", 4, "g1r1", 4, RATE_MBIT)
    fabric.add_link("g1r2", 4, "g2r2", 4, RATE_MBIT)
    return fabric


@pytest.fixture(scope="module", params=SIZES + [PARALLEL], ids=size_id)
def fly(request) -> Fabric:
    return built(request.param)


def group(fabric: Fabric, node: str) -> int:
    return fabric.nodes[node].coords[0]


def routers_of(trace: list[Hop]) -> list[str]:
    return [hop.node for hop in trace[:-1]]


def global_hops(fabric: Fabric, trace: list[Hop]) -> list[tuple[str, str]]:
    routers = routers_of(trace)
    return [(x, y) for x, y in zip(routers, routers[1:]) if group(fabric, x) != group(fabric, y)]


def hops_into_group(fabric: Fabric, trace: list[Hop], dst_group: int) -> int:
    """Router-to-router hops until the first router of ``dst_group``."""
    return next(i for i, name in enumerate(routers_of(trace)) if group(fabric, name) == dst_group)


def all_traces(fabric: Fabric, rules) -> dict[tuple[str, str], list[list[Hop]]]:
    walker = FlowWalker(fabric, rules)
    return {(src.name, dst.name): walker.traces(src.name, dst.ip)
            for src in fabric.hosts for dst in fabric.hosts if src is not dst}


def walked_loads(fabric: Fabric, rules, traffic_mbit) -> dict[tuple[str, int], float]:
    """Load per (node, output port) from the walked traces of every pair that sends: each
    trace is one branch, carrying its final share on every hop (traces share prefixes)."""
    ends = port_ends(fabric)
    walker = FlowWalker(fabric, rules)
    loads = defaultdict(float)
    for (src, dst), rate in traffic_mbit.items():
        for trace in walker.traces(src, fabric.nodes[dst].ip):
            loads[(src, 0)] += rate * trace[-1].share
            for there in trace[1:]:
                loads[ends[(there.node, there.in_port)]] += rate * trace[-1].share
    return loads


WALKED: dict[tuple[int, str], dict] = {}


def traces_for(fabric: Fabric, mode: str):
    """All traces of every pair, with idle ports; kept per fabric and mode."""
    key = (id(fabric), mode)
    if key not in WALKED:
        WALKED[key] = all_traces(fabric, compute_dragonfly_rules(fabric, mode))
    return WALKED[key]


# --- delivery, loops, global links -----------------------------------------------------------


@pytest.mark.parametrize("mode", DRAGONFLY_MODES)
def test_every_pair_and_every_bucket_is_delivered_untagged_within_the_global_budget(fly, mode):
    """follow() already fails on a loop, a dead end or a missing rule."""
    most_globals = 1 if mode == MINIMAL else 2
    for (src, dst), traces in traces_for(fly, mode).items():
        assert traces
        assert sum(t[-1].share for t in traces) == pytest.approx(1.0)
        for trace in traces:
            assert trace[-1].node == dst and trace[-1].vlans == (), trace
            assert len(global_hops(fly, trace)) <= most_globals, trace
            assert len(routers_of(trace)) - 1 <= (3 if mode == MINIMAL else 5), trace
            if group(fly, src) == group(fly, dst):
                assert not global_hops(fly, trace) and len(traces) == 1, trace


def test_minimal_is_local_global_local_over_the_direct_links(fly):
    """Toward another group: over the router's own links to it if it has any, else over
    every link between the two groups (ECMP), each path local-global-local."""
    view = dragonfly_view(fly)
    for (src, dst), traces in traces_for(fly, MINIMAL).items():
        routers = [routers_of(t) for t in traces]
        first, last = routers[0][0], routers[0][-1]
        if group(fly, first) == group(fly, last):
            assert routers == [[first] if first == last else [first, last]]
            continue
        links = view.global_links[(group(fly, first), group(fly, last))]
        chosen = [link for link in links if link.router == first] or links
        expected = [[first] + ([link.router] if link.router != first else [])
                    + ([link.peer] if link.peer != last else []) + [last] for link in chosen]
        assert sorted(routers) == sorted(expected), (src, dst)
        assert [t[-1].share for t in traces] == pytest.approx([1 / len(chosen)] * len(chosen))


def test_parallel_links_give_ecmp_groups_only_where_a_router_owns_none():
    fabric = built(PARALLEL)
    rules = compute_dragonfly_rules(fabric, MINIMAL)
    ecmp = {name: r.groups for name, r in rules.items() if r.groups}
    # the routers of a doubly joined pair that own neither link: g0r2 (to group 1), g1r1 (to
    # group 2), g1r2 (to group 0) and g2r1 (to group 1), over local ports 2 and 3
    both = {4: (Bucket(1, (Output(2),)), Bucket(1, (Output(3),)))}
    assert ecmp == {"g0r2": both, "g1r1": both, "g1r2": both, "g2r1": both}


def test_minimal_is_not_the_shortest_path_where_two_global_links_are_shorter():
    """g0r1 -> g1r1: shortest is g0r1-g4r2-g1r1 (two global links); minimal is 3 hops."""
    fabric = dragonfly()
    traces = FlowWalker(fabric, compute_dragonfly_rules(fabric, MINIMAL)).traces(
        "g0r1h0", fabric.nodes["g1r1h0"].ip)
    assert [routers_of(t) for t in traces] == [["g0r1", "g0r0", "g1r3", "g1r1"]]


def test_valiant_visits_every_intermediate_group_once_with_the_tag_on_the_first_leg(fly):
    groups = fly.params["g"]
    for (src, dst), traces in traces_for(fly, VALIANT).items():
        gs, gd = group(fly, src), group(fly, dst)
        if gs == gd or groups == 2:
            assert len(traces) == 1 and not any(h.vlans for h in traces[0])
            continue
        middles = Counter()
        for trace in traces:
            assert len(global_hops(fly, trace)) == 2
            middle = group(fly, global_hops(fly, trace)[0][1])
            middles[middle] += trace[-1].share
            for hop in trace[1:]:  # the tag each hop arrives with
                in_source = group(fly, hop.node) == gs
                entering = hop.node == global_hops(fly, trace)[0][1]
                assert hop.vlans == ((vlan_vid(middle),) if in_source or entering else ())
        assert set(middles) == set(range(groups)) - {gs, gd}
        for share in middles.values():
            assert share == pytest.approx(1 / (groups - 2))


def test_two_groups_leave_valiant_and_ugal_minimal():
    fabric = dragonfly(1, 3, 2, 2)
    minimal = compute_dragonfly_rules(fabric, MINIMAL)
    assert compute_dragonfly_rules(fabric, VALIANT) == minimal
    assert compute_dragonfly_rules(fabric, UGAL, {("g0r0", 5): 1.0}) == minimal


def test_idle_ugal_routes_minimally(fly):
    minimal = traces_for(fly, MINIMAL)
    ugal = traces_for(fly, UGAL)
    assert {pair: [routers_of(t) for t in ts] for pair, ts in ugal.items()} == \
        {pair: [routers_of(t) for t in ts] for pair, ts in minimal.items()}


def test_ugal_first_packets_follow_the_minimal_route_with_no_controller(fly):
    """The rules that catch a new TCP or UDP flow for another group send the controller a
    copy and forward the packet with the router's own minimal actions (its ECMP group, which
    the table holds, where it has one: the parallel fabric). Walked with the controller's
    copy gone, as when no controller answers, every such packet wins over the select group
    and is delivered exactly along the minimal route, over every ECMP branch."""
    view = dragonfly_view(fly)
    caught = {}
    for name, rules in compute_dragonfly_rules(fly, UGAL).items():
        minimal = {f.match.ipv4_dst: f.actions for f in rules.flows
                   if f.priority == PRIORITY_MINIMAL}
        catch = to_controller_rules(view, name)
        for rule in catch:
            assert rule.actions == (ToController(),) + minimal[rule.ipv4_dst], rule
            assert {a.group_id for a in rule.actions if isinstance(a, ToGroup)} <= set(
                rules.groups), rule
        assert {rule.ip_proto for rule in catch} <= {IP_PROTO_TCP, IP_PROTO_UDP}
        caught[name] = replace(rules, flows=rules.flows + [
            FlowRule(rule.priority, Match(in_port=rule.in_port, ipv4_dst=rule.ipv4_dst),
                     rule.actions[1:])
            for rule in catch if rule.ip_proto == IP_PROTO_TCP])
    walker = FlowWalker(fly, caught)
    expected = traces_for(fly, MINIMAL)
    ecmp = 0
    for src in fly.hosts:
        for dst in fly.hosts:
            if group(fly, src.name) == group(fly, dst.name):
                continue
            traces = walker.traces(src.name, dst.ip)
            assert walker.lookup(traces[0][0], dst.ip).priority == PRIORITY_TO_CONTROLLER
            assert traces == expected[(src.name, dst.name)], (src.name, dst.name)
            ecmp += len(traces) > 1
    assert (ecmp > 0) == (fly is built(PARALLEL))


# --- the rules themselves --------------------------------------------------------------------


@pytest.mark.parametrize("mode", DRAGONFLY_MODES)
def test_rule_counts_priorities_and_group_ids(fly, mode):
    p, a, g = fly.params["p"], fly.params["a"], fly.params["g"]
    hosts, outside = len(fly.hosts), len(fly.hosts) - a * p
    tagged = mode != MINIMAL and g >= 3
    for name, rules in compute_dragonfly_rules(fly, mode).items():
        own = group(fly, name)
        by_priority = Counter(f.priority for f in rules.flows)
        assert by_priority[PRIORITY_MINIMAL] == hosts
        assert by_priority[PRIORITY_INGRESS] == (p * outside if tagged else 0)
        assert by_priority[PRIORITY_TAGGED] == ((g - 1) + outside if tagged else 0)
        assert PRIORITY_MINIMAL < PRIORITY_INGRESS < PRIORITY_TAGGED
        sources = {source_group_id(x) for x in range(g) if x != own} if tagged else set()
        assert sources <= set(rules.groups)
        for gid in set(rules.groups) - sources:  # ECMP over gateways: only with parallel links
            assert gid > g and fly is built(PARALLEL)
            assert all(b.weight == 1 and len(b.actions) == 1 for b in rules.groups[gid])
        for gid in sources:
            for bucket in rules.groups[gid]:
                assert bucket.weight > 0 and isinstance(bucket.actions[-1], Output)
        transit = {f.match.vlan_vid for f in rules.flows
                   if f.priority == PRIORITY_TAGGED and f.match.ipv4_dst is None}
        assert transit == ({vlan_vid(x) for x in range(g) if x != own} if tagged else set())
        for flow in rules.flows:
            if flow.priority == PRIORITY_TAGGED and flow.match.ipv4_dst is not None:
                assert flow.match.vlan_vid == vlan_vid(own)
                assert isinstance(flow.actions[0], PopVlan)
            if flow.priority == PRIORITY_INGRESS:
                assert flow.match.in_port in range(1, p + 1)
                assert flow.actions == (ToGroup(source_group_id(
                    group(fly, next(h.name for h in fly.hosts if h.ip == flow.match.ipv4_dst)))),)


def test_valiant_source_group_buckets_push_the_intermediate_group():
    fabric = dragonfly()
    rules = compute_dragonfly_rules(fabric, VALIANT)["g0r0"]
    buckets = rules.groups[source_group_id(1)]
    assert [b.actions[0] for b in buckets] == [PushVlan(vlan_vid(x)) for x in range(2, 9)]
    assert {b.weight for b in buckets} == {round(WEIGHT_SCALE / 7)}
    # g0r0 owns channels 0 and 1 (groups 1, 2: ports 6, 7); group 3 is behind g0r1 (port 3)
    assert buckets[0].actions[1] == Output(7) and buckets[1].actions[1] == Output(3)
    assert Match(vlan_vid=vlan_vid(0), ipv4_dst="10.1.0.2") in [f.match for f in rules.flows]


@pytest.mark.parametrize(("make", "text"), [
    (lambda: fat_tree(4), "routers only"),
    (lambda: without(dragonfly(1, 3, 1), "g0r0", "g0r1"), "no local link"),
    (lambda: without(dragonfly(1, 3, 1), "g0r0", "g1r2"), "no global link"),
])
def test_fabrics_that_are_not_whole_dragonflies_are_refused(make, text):
    with pytest.raises(ValueError, match=text):
        dragonfly_view(make())


def without(fabric: Fabric, a: str, b: str) -> Fabric:
    fabric.links = [link for link in fabric.links if {link.a, link.b} != {a, b}]
    return fabric


def test_unknown_mode_is_refused():
    with pytest.raises(ValueError, match="dragonfly routing mode"):
        compute_dragonfly_rules(dragonfly(1, 2, 1), "ecmp")


# --- the adversarial pattern and the fluid model ---------------------------------------------


@pytest.mark.parametrize("size", [s for s in SIZES if (s[3] or s[1] * s[2] + 1) >= 4],
                         ids=size_id)
def test_shift_pattern_piles_onto_one_link_minimally_and_spreads_under_valiant(size):
    """Every host of group G sends to group G+1: minimal puts a whole group (p*a hosts) on the
    one direct global link; Valiant leaves that link empty and puts 2*p*a/(g-2) host rates on
    every other global link, with twice the global links per packet."""
    fabric = built(size)
    p, a, g = fabric.params["p"], fabric.params["a"], fabric.params["g"]
    traffic = group_shift_traffic(fabric, RATE_MBIT)
    glob = {(link.a, link.a_port): (link.a, link.b) for link in fabric.links
            if not fabric.nodes[link.a].is_host and group(fabric, link.a) != group(fabric, link.b)}
    glob.update({(link.b, link.b_port): (link.b, link.a) for link in fabric.links
                 if (link.a, link.a_port) in glob})
    expected = {
        MINIMAL: lambda x, y: p * a * RATE_MBIT if y == (x + 1) % g else 0.0,
        VALIANT: lambda x, y: 0.0 if y == (x + 1) % g else 2 * p * a * RATE_MBIT / (g - 2)}
    mean_globals = {}
    for mode, load_of in expected.items():
        loads = link_loads_mbit(fabric, mode, traffic)
        for end, (x, y) in glob.items():
            assert loads.get(end, 0.0) == pytest.approx(load_of(group(fabric, x),
                                                                group(fabric, y))), (mode, end)
        traces = traces_for(fabric, mode)
        first_globals = defaultdict(set)
        hops = []
        for (src, dst) in traffic:
            for trace in traces[(src, dst)]:
                first_globals[group(fabric, src)].add(global_hops(fabric, trace)[0])
                hops.append((len(global_hops(fabric, trace)), trace[-1].share))
        spread = {len(links) for links in first_globals.values()}
        assert spread == ({1} if mode == MINIMAL else {g - 2})
        mean_globals[mode] = sum(n * share for n, share in hops) / len(traffic)
    assert mean_globals == pytest.approx({MINIMAL: 1.0, VALIANT: 2.0})
    # on global links Valiant's worst, 2*p*a/(g-2), beats minimal's p*a once g > 4
    worst = {mode: max(u for end, u in link_utilisation(
        fabric, link_loads_mbit(fabric, mode, traffic)).items() if end in glob)
        for mode in expected}
    assert worst == pytest.approx({MINIMAL: p * a, VALIANT: 2 * p * a / (g - 2)})
    assert (worst[VALIANT] < worst[MINIMAL]) == (g > 4)


def test_shift_pattern_on_the_default_dragonfly_worst_link_over_all_links():
    """72 hosts at 100 Mbit/s: minimal offers 8x a global link's rate to one link; Valiant's
    worst link, global or local, gets 16/7 of its rate, so about 3.5x the throughput."""
    fabric = dragonfly()
    traffic = group_shift_traffic(fabric, RATE_MBIT)
    worst = {mode: max(link_utilisation(fabric, link_loads_mbit(fabric, mode, traffic)).values())
             for mode in (MINIMAL, VALIANT)}
    assert worst == pytest.approx({MINIMAL: 8.0, VALIANT: 16 / 7})


@pytest.mark.parametrize("mode", DRAGONFLY_MODES)
def test_fluid_model_matches_the_walked_flow_tables(fly, mode):
    rng = random.Random(3)
    hosts = [h.name for h in fly.hosts]
    traffic = {(s, d): rng.choice([10.0, 50.0, 100.0]) for s in hosts for d in hosts
               if s != d and rng.random() < 0.3}
    utilisation = {(link.a, link.a_port): rng.random() for link in fly.links}
    utilisation.update({(link.b, link.b_port): rng.random() for link in fly.links})
    model = link_loads_mbit(fly, mode, traffic, utilisation)
    walked = walked_loads(fly, compute_dragonfly_rules(fly, mode, utilisation), traffic)
    tolerance_mbit = ROUNDING_SHARE * sum(traffic.values()) if mode == UGAL else 1e-6
    for end in set(model) | set(walked):
        assert model.get(end, 0.0) == pytest.approx(walked.get(end, 0.0), abs=tolerance_mbit)


def summed(*loads_mbit: dict, scale: float = 1.0) -> dict:
    total = defaultdict(float)
    for loads in loads_mbit:
        for end, load in loads.items():
            total[end] += load * scale
    return dict(total)


def test_a_pair_given_an_option_sends_all_of_its_rate_that_way():
    """What a flow placed by the controller does (testbed.controllers.routing.ugal): Valiant's loads are the
    mean of the loads through each intermediate group; minimal is None; other pairs still
    follow the mode."""
    fabric = dragonfly(1, 3, 2, 7)
    pair, other = ("g0r1h0", "g1r2h0"), ("g3r0h0", "g5r1h0")
    by_option = [link_loads_mbit(fabric, MINIMAL, {pair: 50.0}, options={pair: middle})
                 for middle in range(2, 7)]
    assert link_loads_mbit(fabric, VALIANT, {pair: 50.0}) == pytest.approx(
        summed(*by_option, scale=1 / len(by_option)))
    assert link_loads_mbit(fabric, VALIANT, {pair: 50.0, other: 20.0},
                           options={pair: None}) == pytest.approx(
        summed(link_loads_mbit(fabric, MINIMAL, {pair: 50.0}),
               link_loads_mbit(fabric, VALIANT, {other: 20.0})))


def test_shift_traffic_is_a_permutation_between_groups():
    fabric = dragonfly()
    for shift in (1, 4, 8):
        traffic = group_shift_traffic(fabric, 7.0, shift)
        assert len(traffic) == len(fabric.hosts) == len({dst for _, dst in traffic})
        for (src, dst), rate in traffic.items():
            s, d = fabric.nodes[src].coords, fabric.nodes[dst].coords
            assert d == ((s[0] + shift) % 9,) + s[1:] and rate == 7.0


def test_unshaped_links_have_no_utilisation():
    fabric = dragonfly(1, 2, 1)
    fabric.links[0] = replace(fabric.links[0], rate_mbit=None)
    loads = link_loads_mbit(fabric, MINIMAL, group_shift_traffic(fabric, 10.0))
    utilisation = link_utilisation(fabric, loads)
    first = fabric.links[0]
    assert (first.a, first.a_port) in loads and (first.a, first.a_port) not in utilisation
    assert utilisation and all(u >= 0 for u in utilisation.values())


# --- UGAL weights ----------------------------------------------------------------------------


def global_ports(fabric: Fabric) -> list[tuple[str, int]]:
    return [end for link in fabric.links if not fabric.nodes[link.a].is_host
            and group(fabric, link.a) != group(fabric, link.b)
            for end in ((link.a, link.a_port), (link.b, link.b_port))]


def test_ugal_shares_follow_the_relative_saving():
    assert ugal_shares({None: 0.5, 3: 0.6, 4: 0.4}) == pytest.approx({None: 0.8, 3: 0.0, 4: 0.2})
    assert ugal_shares({None: 1.0, 3: 0.5, 4: 0.75}) == pytest.approx(
        {None: 0.5, 3: 0.5 * 0.5 / 0.75, 4: 0.5 * 0.25 / 0.75})
    assert ugal_shares({None: 0.3}) == {None: 1.0}
    assert ugal_shares({None: 0.3, 1: 0.3}) == {None: 1.0, 1: 0.0}  # ties stay minimal


@pytest.mark.parametrize(("router", "dst_group"), [("g0r0", 1), ("g0r1", 1), ("g3r2", 7)])
def test_ugal_detours_exactly_when_q_min_h_min_exceeds_q_nm_h_nm(router, dst_group):
    """Every global port at load x except the minimal path's at y: detour I gets weight iff
    y * H_min > x * H_nm(I), the hop counts read off the walked minimal and Valiant paths."""
    fabric = dragonfly()
    view = dragonfly_view(fabric)
    source = next(h for h in fabric.hosts if h.name.startswith(router + "h"))
    target = next(h for h in fabric.hosts if group(fabric, h.name) == dst_group)
    walker = {mode: FlowWalker(fabric, compute_dragonfly_rules(fabric, mode))
              for mode in (MINIMAL, VALIANT)}
    (minimal,) = walker[MINIMAL].traces(source.name, target.ip)
    h_min = hops_into_group(fabric, minimal, dst_group)
    h_nm = {group(fabric, global_hops(fabric, t)[0][1]): hops_into_group(fabric, t, dst_group)
            for t in walker[VALIANT].traces(source.name, target.ip)}
    (link,) = view.global_links[(group(fabric, router), dst_group)]
    x = 0.2
    for margin in (0.95, 1.05):
        for middle, hops in h_nm.items():
            y = margin * x * hops / h_min
            utilisation = {end: x for end in global_ports(fabric)}
            utilisation[(link.router, link.port)] = y
            weights = ugal_weights(view, router, dst_group, utilisation)
            cheaper = {i for i, h in h_nm.items() if y * h_min > x * h}
            assert (middle in cheaper) == (margin > 1)
            assert {i for i, w in weights.items() if i is not None and w > 0} == cheaper
            assert abs(sum(weights.values()) - WEIGHT_SCALE) <= len(weights)


def test_ugal_weights_idle_saturated_and_monotone():
    fabric = dragonfly()
    view = dragonfly_view(fabric)
    (link,) = view.global_links[(0, 1)]
    idle = ugal_weights(view, "g0r1", 1, {})
    assert idle == {None: WEIGHT_SCALE, **{i: 0 for i in range(2, 9)}}
    saturated = ugal_weights(view, "g0r1", 1, {(link.router, link.port): 1.0})
    assert saturated[None] < 0.05 * WEIGHT_SCALE
    assert all(saturated[i] > 0 for i in range(2, 9))
    rng = random.Random(11)
    ports = global_ports(fabric)
    for _ in range(200):
        utilisation = {end: rng.uniform(0, 1.2) for end in ports}
        router = f"g{rng.randrange(9)}r{rng.randrange(4)}"
        dst_group = rng.choice([x for x in range(9) if x != group(fabric, router)])
        (minimal,) = view.global_links[(group(fabric, router), dst_group)]
        before = ugal_weights(view, router, dst_group, utilisation)
        busier = dict(utilisation)
        busier[(minimal.router, minimal.port)] += rng.uniform(0, 0.5)
        assert ugal_weights(view, router, dst_group, busier)[None] <= before[None]
        middle = rng.choice([i for i in before if i is not None])
        (first,) = view.global_links[(group(fabric, router), middle)]
        detour_busier = dict(utilisation)
        detour_busier[(first.router, first.port)] += rng.uniform(0, 0.5)
        assert ugal_weights(view, router, dst_group, detour_busier)[middle] <= before[middle]


def test_ugal_rules_under_load_spread_and_stay_within_two_global_links():
    fabric = dragonfly()
    view = dragonfly_view(fabric)
    (link,) = view.global_links[(0, 1)]
    utilisation = {(link.router, link.port): 1.0}
    walker = FlowWalker(fabric, compute_dragonfly_rules(fabric, UGAL, utilisation))
    traces = walker.traces("g0r2h0", fabric.nodes["g1r2h1"].ip)
    assert len(traces) == 1 + 7
    minimal = [t for t in traces if len(global_hops(fabric, t)) == 1]
    assert len(minimal) == 1 and minimal[0][-1].share < 0.05
    assert all(len(global_hops(fabric, t)) <= 2 for t in traces)


def test_ugal_counts_the_busier_global_link_of_a_detour():
    """Detours through groups 2..5 have an idle first global link but a saturated second one
    (into group 1): they are no cheaper than the saturated minimal path and get nothing."""
    fabric = dragonfly()
    view = dragonfly_view(fabric)
    (minimal,) = view.global_links[(0, 1)]
    utilisation = {(minimal.router, minimal.port): 1.0}
    for middle in (2, 3, 4, 5):
        (second,) = view.global_links[(middle, 1)]
        utilisation[(second.router, second.port)] = 1.0
    weights = ugal_weights(view, "g0r1", 1, utilisation)
    assert {i for i, w in weights.items() if i is not None and w > 0} == {6, 7, 8}
