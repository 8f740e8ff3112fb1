"""UGAL on a dragonfly at flow granularity, as plain data: which way the source router sends
each new TCP or UDP flow for another group, and the bookkeeping of the flows placed so far.
No OpenFlow: testbed.controllers.routing.fabric_state keeps a ``FlowPlacements`` under ``ugal`` routing, and
testbed.controllers.apps.fabric_app turns what it returns into rules.

Why per flow: a select group hashes each flow onto one bucket for the flow's whole life, so
reweighting buckets from polled load (testbed.controllers.routing.dragonfly.ugal_weights) moves only
flows that start afterwards; a few long flows never move. Here the controller sees every
flow start and chooses for it:

  1. the source router sends the controller a copy of the first packet of a TCP or UDP
     flow from one of its host ports to a host of another group, and forwards the packet
     itself along its minimal route, the same actions as the router's minimal rule for
     that address (``to_controller_rules``, PRIORITY_TO_CONTROLLER: above the select
     group's rule, which keeps carrying every other protocol);
  2. ``FlowPlacements.place`` lists the candidate paths: the minimal one for each minimal
     first-hop port, and the Valiant ones through ``VALIANT_CANDIDATES`` intermediate groups
     drawn at random from a seed and the flow's 5-tuple (the same flow is offered the same
     groups on every run);
  3. it prices each path as UGAL does, cost = load * hops (``ugal_choice``), where
       - a path's links are the router-to-router ports it leaves by, each with the share of
         the flow it carries (below 1 where a transit router splits over an ECMP group);
         its hops are those shares summed (router hops from the source router to the
         destination's, on average), and its load is that of its busiest link;
       - a link's load, in flows, is the weight of the flows placed on it (a placement
         counts from its first packet, before any counter can show it) plus the utilisation
         the port counters last measured (fraction of the link rate, so a saturated link
         counts one flow more: traffic the controller did not place, and placed flows that
         run at full rate, weigh more than placed flows that are idle);
     and keeps the cheapest minimal path unless cost_min > cost_val + UGAL_BIAS_FLOW_HOPS
     for the cheapest Valiant candidate;
  4. the app installs an exact 5-tuple rule at PRIORITY_PLACED_FLOW with an idle timeout
     (``placement_rule``) that pushes the intermediate group's VLAN tag when the path is a
     detour (the same tag and transit rules as Valiant routing) and leaves by the chosen
     port; it sends no packet-out (``placement_plan``): the packet is already on its way;
  5. when the rule idles out, its flow-removed message (it carries the placement's cookie)
     takes the flow off its links (``FlowPlacements.remove``).

Fail-secure for new flows: the controller only steers, it never carries. A flow's packets
follow the minimal route until its exact rule is in (each also reaching the controller,
which places the flow once), so a controller that is slow, restarting or gone (the switches
run with fail_mode=secure and keep their rules) leaves new flows on the minimal path, as
under ``minimal`` routing, instead of dropping them. The price: a flow placed on a detour
sends its first packets (a TCP connection's SYN, a few datagrams) the minimal way.

The reply direction of a TCP connection (its first packet is a SYN-ACK) is placed the same
way but weighs REPLY_FLOW_WEIGHT: a bulk transfer's reverse path carries acknowledgements,
and counting them as flows would make every data flow's reverse links look as busy as its
forward ones.
"""
from __future__ import annotations

import random
from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from testbed.controllers.routing.dragonfly import (
    DragonflyView,
    intermediate_groups,
    minimal_ports,
    minimal_routes,
    ports_toward_group,
    spread,
    vlan_vid,
)
from testbed.controllers.routing.rules import Action, Output, PushVlan, ToController

IP_PROTO_TCP = 6
IP_PROTO_UDP = 17
TRANSPORT_PROTOCOLS = (IP_PROTO_TCP, IP_PROTO_UDP)

# Both above the select group's rule (PRIORITY_INGRESS, which keeps other protocols) and
# below the tagged rules (which untagged packets from a host never match anyway).
PRIORITY_TO_CONTROLLER = 112
PRIORITY_PLACED_FLOW = 114

FLOW_IDLE_TIMEOUT_S = 2  # a placed flow's rule goes after this long without a packet
# Intermediate groups offered to each flow (all of them when fewer exist). On p=1 a=3 h=2
# g=7 (5 to draw from), shift pattern, flows arriving in host order, seeds 1-3, max-min fair
# rates of the fluid model (tests/unit/controllers/test_ugal.py): 3 candidates deliver 78% of the host
# links, 4 93%, all 5 100%; with iperf3's idle control connections counted as flows too,
# 64%, 71% and 79%. More candidates spread better; a few keep the draw (and its seed)
# meaningful on small fabrics.
VALIANT_CANDIDATES = 4
# A detour must be cheaper by more than this, in flows times hops: measured noise on an idle
# fabric never moves a flow, nor does one flow on a one-hop minimal path (two flows sharing
# that link cost less than a detour loading two or more); one flow on a minimal path of two
# hops or more does, when a detour is free.
UGAL_BIAS_FLOW_HOPS = 1.0
DATA_FLOW_WEIGHT = 1.0
REPLY_FLOW_WEIGHT = 0.1  # a TCP connection's reply direction (acknowledgements), in flows
DEFAULT_SEED = 1

End = tuple[str, int]  # (router, output port): one direction of a link


@dataclass(frozen=True)
class FiveTuple:
    """A transport flow (5-tuple): IP protocol number (6 TCP, 17 UDP), addresses, ports."""

    ip_proto: int
    ipv4_src: str
    ipv4_dst: str
    src_port: int
    dst_port: int

    def describe(self) -> str:
        return (f"{self.ip_proto}:{self.ipv4_src}:{self.src_port}->"
                f"{self.ipv4_dst}:{self.dst_port}")


def flow_weight(ip_proto: int, tcp_syn: bool = False, tcp_ack: bool = False) -> float:
    """How many flows a new flow counts for, from its first packet: a TCP SYN-ACK opens the
    reply direction of a connection (REPLY_FLOW_WEIGHT), anything else is data."""
    if ip_proto == IP_PROTO_TCP and tcp_syn and tcp_ack:
        return REPLY_FLOW_WEIGHT
    return DATA_FLOW_WEIGHT


# --- paths -----------------------------------------------------------------------------------

@dataclass(frozen=True)
class Path:
    """One way from the source router to the destination router: ``option`` None for
    minimal or the intermediate group, ``port`` the first hop's output port, ``links`` the
    router-to-router ports it leaves by with the share of the flow each carries."""

    option: int | None
    port: int
    links: tuple[tuple[End, float], ...]

    @property
    def hops(self) -> float:
        """Router-to-router hops, on average over the ECMP branches of transit routers."""
        return sum(share for _, share in self.links)

    @property
    def actions(self) -> tuple[Action, ...]:
        """What the source router does to the flow's packets: tag a detour, then output."""
        tag = () if self.option is None else (PushVlan(vlan_vid(self.option)),)
        return tag + (Output(self.port),)


def path_through(view: DragonflyView, router: str, port: int, option: int | None,
                 dst_host: str) -> Path:
    """The path a packet for ``dst_host`` takes when ``router`` sends it out of ``port``,
    tagged for intermediate group ``option`` (None: untagged, minimal): the rules every
    other router holds (testbed.controllers.routing.dragonfly) carry it on."""
    dst_router = view.host_at[dst_host][0]
    shares: dict[End, float] = {(router, port): 1.0}
    first = view.peer[(router, port)][0]

    def toward_dst(node: str) -> tuple[int, ...]:
        return minimal_ports(view, node, dst_host)

    def at_dst(node: str) -> bool:
        return node == dst_router

    if option is None:
        spread(view, shares, first, 1.0, toward_dst, at_dst)
    else:
        entries = spread(view, shares, first, 1.0,
                         lambda node: ports_toward_group(view, node, option),
                         lambda node: view.group_of.get(node) == option)
        for entry, share in entries.items():
            spread(view, shares, entry, share, toward_dst, at_dst)
    return Path(option, port, tuple(sorted(shares.items())))


def sampled_middles(view: DragonflyView, src_group: int, dst_group: int, flow: FiveTuple,
                    seed: int, count: int = VALIANT_CANDIDATES) -> list[int]:
    """The intermediate groups offered to ``flow``: ``count`` of them at random, drawn from
    the seed and the 5-tuple alone (a string seed is hashed the same in every process)."""
    middles = intermediate_groups(view, src_group, dst_group)
    rng = random.Random(f"{seed}/{flow.describe()}")
    return sorted(rng.sample(middles, min(count, len(middles))))


def candidate_paths(view: DragonflyView, router: str, dst_host: str,
                    middles: Iterable[int]) -> tuple[list[Path], list[Path]]:
    """(minimal paths, Valiant paths through ``middles``) from ``router`` to ``dst_host``,
    one per first-hop port."""
    dst_group = view.group_of[view.host_at[dst_host][0]]
    minimal = [path_through(view, router, port, None, dst_host)
               for port in ports_toward_group(view, router, dst_group)]
    valiant = [path_through(view, router, port, middle, dst_host)
               for middle in middles for port in ports_toward_group(view, router, middle)]
    return minimal, valiant


def path_load_flows(path: Path, link_load_flows: Mapping[End, float]) -> float:
    """The load of a path, in flows: that of its busiest link (missing links are idle)."""
    return max(link_load_flows.get(end, 0.0) for end, _ in path.links)


def path_cost(path: Path, link_load_flows: Mapping[End, float]) -> float:
    """UGAL's cost of a path: its load times its hops (q * H)."""
    return path_load_flows(path, link_load_flows) * path.hops


def ugal_choice(minimal: list[Path], valiant: list[Path],
                link_load_flows: Mapping[End, float],
                bias_flow_hops: float = UGAL_BIAS_FLOW_HOPS) -> Path:
    """UGAL's rule: the cheapest minimal path, unless its cost exceeds that of the cheapest
    Valiant path by more than ``bias_flow_hops``. Ties go to the fewer hops, then to the
    first listed, so the choice is the same every time."""
    def cheapest(paths: list[Path]) -> Path:
        return min(paths, key=lambda p: (path_cost(p, link_load_flows), p.hops))

    best_min = cheapest(minimal)
    if not valiant:
        return best_min
    best_val = cheapest(valiant)
    if path_cost(best_min, link_load_flows) > path_cost(best_val, link_load_flows) + bias_flow_hops:
        return best_val
    return best_min


# --- placements ------------------------------------------------------------------------------

@dataclass(frozen=True)
class Placement:
    """A flow placed at its source router: ``cookie`` names its rule there (flow-removed
    messages carry it back), ``in_port`` the host port it came in by, ``weight_flows`` what
    it adds to each link of ``path`` (times the link's share)."""

    cookie: int
    router: str
    in_port: int
    flow: FiveTuple
    path: Path
    weight_flows: float


@dataclass(frozen=True)
class TransportRule:
    """A flow rule that matches the IP protocol, and for a placed flow its addresses and
    ports too (what testbed.controllers.routing.forwarding.FlowMatch does not say). ``cookie`` non-zero: the
    switch reports the rule's removal (after ``idle_timeout_s`` without a packet)."""

    priority: int
    in_port: int
    ip_proto: int
    ipv4_dst: str
    actions: tuple
    ipv4_src: str | None = None
    src_port: int | None = None
    dst_port: int | None = None
    idle_timeout_s: int = 0
    cookie: int = 0

    def describe(self) -> str:
        ends = (f" {self.ipv4_src}:{self.src_port}->{self.ipv4_dst}:{self.dst_port}"
                if self.ipv4_src else f" ->{self.ipv4_dst}")
        return f"transport rule {self.priority} in_port={self.in_port} proto={self.ip_proto}{ends}"


def to_controller_rules(view: DragonflyView, router: str) -> list[TransportRule]:
    """The rules that catch the first packets of each TCP and UDP flow from ``router``'s host
    ports to a host of another group: each packet goes whole to the controller, which places
    the flow, and on along the minimal route (``minimal_routes``: the actions of the
    router's minimal rule for that address, an output or its ECMP group), so no packet
    waits for the controller and none is lost without one."""
    own = view.group_of[router]
    host_ports = sorted(port for r, port in view.host_at.values() if r == router)
    _, minimal = minimal_routes(view, router)
    return [TransportRule(PRIORITY_TO_CONTROLLER, port, proto, host.ip,
                          (ToController(),) + minimal[host.ip])
            for host in view.fabric.hosts if view.group_of[view.host_at[host.name][0]] != own
            for port in host_ports for proto in TRANSPORT_PROTOCOLS]


def placement_rule(placement: Placement,
                   idle_timeout_s: int = FLOW_IDLE_TIMEOUT_S) -> TransportRule:
    """The exact-match rule that steers a placed flow along its path."""
    flow = placement.flow
    return TransportRule(PRIORITY_PLACED_FLOW, placement.in_port, flow.ip_proto, flow.ipv4_dst,
                         placement.path.actions, flow.ipv4_src, flow.src_port, flow.dst_port,
                         idle_timeout_s, placement.cookie)


def placement_plan(placement: Placement, new: bool) -> list[TransportRule]:
    """What the source router is sent when a packet of ``placement``'s flow reaches the
    controller: the flow's exact rule when the placement is ``new``, else nothing (more of
    its packets came before the rule was in). Never the packet: the rule that caught it has
    already forwarded it, so a packet-out would deliver it twice."""
    return [placement_rule(placement)] if new else []


class FlowPlacements:
    """The flows placed so far and the load they put on every link (in flows), with the
    utilisation measured last; ``place`` chooses for a new flow, ``remove`` forgets one."""

    def __init__(self, view: DragonflyView, seed: int = DEFAULT_SEED,
                 valiant_candidates: int = VALIANT_CANDIDATES,
                 bias_flow_hops: float = UGAL_BIAS_FLOW_HOPS):
        self.view = view
        self.seed = seed
        self.valiant_candidates = valiant_candidates
        self.bias_flow_hops = bias_flow_hops
        self.host_by_ip = {h.ip: h.name for h in view.fabric.hosts}
        self.placed: dict[int, Placement] = {}  # cookie -> placement
        self.cookie_of: dict[tuple[str, FiveTuple], int] = {}  # (router, flow) -> cookie
        # per link, what each placement on it adds (weight * share): removing a placement
        # deletes its entries, so an emptied link is exactly zero again
        self.on_link: dict[End, dict[int, float]] = defaultdict(dict)
        self.utilisation: dict[End, float] = {}
        self.next_cookie = 1

    def placed_flows(self, end: End) -> float:
        """The weight of the flows placed on one link (times their shares on it)."""
        return sum(self.on_link.get(end, {}).values())

    def link_load_flows(self) -> dict[End, float]:
        """Every link's load in flows: placed flows plus measured utilisation."""
        loads = dict(self.utilisation)
        for end, shares in self.on_link.items():
            loads[end] = loads.get(end, 0.0) + sum(shares.values())
        return loads

    def measured(self, utilisation: Mapping[End, float]) -> None:
        """The utilisation from the latest port counters (fraction of the link rate per
        (router, output port)); it replaces the previous round's."""
        self.utilisation = dict(utilisation)

    def destination(self, router: str, ipv4_dst: str) -> tuple[str, int]:
        """(host, group) of ``ipv4_dst``; ValueError unless it is a host of another group
        than ``router``'s."""
        dst_host = self.host_by_ip.get(ipv4_dst)
        if dst_host is None:
            raise ValueError(f"{ipv4_dst} is no host of the fabric")
        dst_group = self.view.group_of[self.view.host_at[dst_host][0]]
        if dst_group == self.view.group_of[router]:
            raise ValueError(f"{ipv4_dst} is in the group of {router}: nothing to choose")
        return dst_host, dst_group

    def choose(self, router: str, flow: FiveTuple) -> Path:
        """The path UGAL picks for ``flow`` at ``router`` now."""
        dst_host, dst_group = self.destination(router, flow.ipv4_dst)
        middles = sampled_middles(self.view, self.view.group_of[router], dst_group, flow,
                                  self.seed, self.valiant_candidates)
        minimal, valiant = candidate_paths(self.view, router, dst_host, middles)
        return ugal_choice(minimal, valiant, self.link_load_flows(), self.bias_flow_hops)

    def place(self, router: str, in_port: int, flow: FiveTuple,
              weight_flows: float = DATA_FLOW_WEIGHT) -> tuple[Placement, bool]:
        """(the placement of ``flow`` at ``router``, whether it is new): a flow already
        placed there (more of its packets reached the controller before its rule did)
        keeps its path and counts once."""
        cookie = self.cookie_of.get((router, flow))
        if cookie is not None:
            return self.placed[cookie], False
        placement = Placement(self.next_cookie, router, in_port, flow,
                              self.choose(router, flow), weight_flows)
        self.next_cookie += 1
        self.placed[placement.cookie] = placement
        self.cookie_of[(router, flow)] = placement.cookie
        for end, share in placement.path.links:
            self.on_link[end][placement.cookie] = weight_flows * share
        return placement, True

    def remove(self, cookie: int) -> Placement | None:
        """Forget a placement (its rule is gone); None for a cookie not placed (any more)."""
        placement = self.placed.pop(cookie, None)
        if placement is None:
            return None
        del self.cookie_of[(placement.router, placement.flow)]
        for end, _ in placement.path.links:
            shares = self.on_link[end]
            del shares[cookie]
            if not shares:
                del self.on_link[end]
        return placement

    def forget_router(self, router: str) -> list[Placement]:
        """Forget every placement at ``router`` (it disconnected, or reconnected and was
        wiped): their rules are gone without a flow-removed message of ours to say so."""
        return [self.remove(cookie) for cookie, p in list(self.placed.items())
                if p.router == router]
