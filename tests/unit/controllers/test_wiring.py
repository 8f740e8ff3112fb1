"""The wiring check without a network: what every switch port should face, LLDP frames built
and read back with os-ken's packet classes, verdicts on cabling simulated from the
description (intact, a swapped pair, a silent link, a port down, a switch gone), when checks
send and judge, the report read back, the tables that keep LLDP away from the fabric's
forwarding, and the os-ken app itself fed OpenFlow messages by simulated switches, with its
periodic re-check catching a swap no switch reports and writing quiet checks as one line."""
from __future__ import annotations

import json
import logging

import pytest
from tests.unit.fabric_walk import port_ends
from os_ken.controller import ofp_event
from os_ken.lib.packet import arp, ether_types, ethernet, lldp, packet
from os_ken.ofproto import ofproto_protocol
from os_ken.ofproto import ofproto_v1_3 as ofp
from os_ken.ofproto import ofproto_v1_3_parser as parser
from os_ken.topology.switches import LLDPPacket

from testbed.controllers.apps.config import (
    DEFAULT_WIRING_RECHECK_INTERVAL_S,
    ENV_FABRIC,
    ENV_WIRING,
    ENV_WIRING_RECHECK_INTERVAL,
    ControllerConfig,
)
from testbed.controllers.routing.fabric_state import FabricState
from testbed.controllers.routing.forwarding import (
    ETH_TYPE_ARP,
    ETH_TYPE_IPV4,
    ETH_TYPE_LLDP,
    PRIORITY_LLDP,
)
from testbed.controllers.routing.rules import FlowMatch, ToController
from testbed.controllers.routing.wiring import (
    ABSENT,
    CHANGE,
    DOWN,
    MISSING,
    MISWIRED,
    OK,
    PERIODIC,
    RECHECK_INTERVAL_S,
    STATUSES,
    UNEXPECTED,
    CheckSchedule,
    Peer,
    PortVerdict,
    expected_neighbours,
    judge,
    lldp_frame,
    lldp_ports,
    parse_lldp,
    report_records,
    same_verdicts_as,
    status_counts,
    wiring_checks,
    wiring_summary,
)
from testbed.model.topology import BUILDERS, build
from testbed.model.topology.fattree import fat_tree
from testbed.model.topology.spineleaf import spine_leaf

K = 4
MAC = "02:00:00:00:00:01"
Cables = dict[tuple[str, int], tuple[str, int]]


@pytest.fixture(scope="module")
def tree():
    return fat_tree(K)


def all_up(fabric) -> dict[str, dict[int, bool]]:
    """Every switch connected, every port of the description up."""
    ports: dict[str, dict[int, bool]] = {s.name: {} for s in fabric.switches}
    for switch, port, _, _ in fabric.switch_ends():
        ports[switch][port] = True
    return ports


def swap(cables: Cables, one: tuple[str, int], other: tuple[str, int]) -> Cables:
    """The cabling after the cables plugged into ports ``one`` and ``other`` trade places."""
    out = dict(cables)
    far_one, far_other = cables[one], cables[other]
    out[one], out[far_other] = far_other, one
    out[other], out[far_one] = far_one, other
    return out


def received_over(fabric, cables: Cables, ports: dict[str, dict[int, bool]]) -> dict:
    """What every switch port hears in one LLDP round over ``cables``: each sending port's
    frame, built and read back, arrives at the far end when that is an up switch port."""
    expected = expected_neighbours(fabric)
    received = {}
    for switch, up in ports.items():
        for port in lldp_ports(expected, switch, up):
            far = cables.get((switch, port))
            if far is None or fabric.nodes[far[0]].is_host or not ports.get(far[0], {}).get(
                    far[1]):
                continue
            received[far] = parse_lldp(lldp_frame(fabric.nodes[switch].dpid, port, MAC))
    return received


def names(fabric) -> dict[int, str]:
    return {s.dpid: s.name for s in fabric.switches}


def not_ok(verdicts) -> dict[tuple[str, int], PortVerdict]:
    return {v.end: v for v in verdicts if v.status != OK}


# --- expected neighbours ---------------------------------------------------------------------

def test_fat_tree_neighbours_cover_every_port_once_and_agree_both_ways(tree):
    expected = expected_neighbours(tree)
    switches = 5 * K * K // 4
    assert len(expected) == switches * K  # every switch uses ports 1..k
    for switch in tree.switches:
        assert sorted(p for s, p in expected if s == switch.name) == list(range(1, K + 1))
    facing_hosts = {end for end, peer in expected.items() if peer.is_host}
    assert len(facing_hosts) == K ** 3 // 4  # one port per host
    assert {port for _, port in facing_hosts} == set(range(1, K // 2 + 1))  # edge ports down
    assert len(expected) - len(facing_hosts) == 2 * (K ** 3 // 2)  # both ends of k^3/2 links
    for (switch, port), peer in expected.items():
        if not peer.is_host:
            assert expected[(peer.node, peer.port)] == Peer(switch, port)
    assert expected[("p0e0", 3)] == Peer("p0a0", 1)
    assert expected[("p0e0", 1)] == Peer("p0e0h0", 0, is_host=True)
    assert list(expected)[:2] == [("c0", 1), ("c0", 2)]  # the fabric's switch order, by port


def test_spine_leaf_neighbours():
    leaves, spines, hosts = 4, 2, 4
    fabric = spine_leaf(leaves=leaves, spines=spines, hosts_per_leaf=hosts)
    expected = expected_neighbours(fabric)
    assert len(expected) == leaves * hosts + 2 * leaves * spines
    assert sum(peer.is_host for peer in expected.values()) == leaves * hosts
    for j in range(spines):
        assert {expected[(f"s{j}", 1 + i)] for i in range(leaves)} == {
            Peer(f"l{i}", hosts + 1 + j) for i in range(leaves)}
    for i in range(leaves):
        assert lldp_ports(expected, f"l{i}", all_up(fabric)[f"l{i}"]) == list(
            range(hosts + 1, hosts + spines + 1))  # uplinks only: host ports send nothing


@pytest.mark.parametrize("kind", sorted(BUILDERS))
def test_every_family_has_one_neighbour_per_switch_port(kind):
    fabric = build(kind)
    expected = expected_neighbours(fabric)
    assert len(expected) == len(fabric.switch_ends())
    for (switch, port), peer in expected.items():
        if not peer.is_host:
            assert expected[(peer.node, peer.port)] == Peer(switch, port)


def test_a_port_cabled_twice_is_refused():
    fabric = spine_leaf(leaves=2, spines=1, hosts_per_leaf=1)
    fabric.add_link("l0", 2, "l1", 5, None)  # l0:2 already goes to s0
    with pytest.raises(ValueError, match="l0:2 is cabled twice"):
        expected_neighbours(fabric)


def test_only_up_ports_that_do_not_face_hosts_send():
    fabric = fat_tree(K)
    expected = expected_neighbours(fabric)
    up = {1: True, 2: True, 3: False, 4: True, 9: True}  # 9: not in the description
    assert lldp_ports(expected, "p0e0", up) == [4, 9]


# --- LLDP frames -----------------------------------------------------------------------------

@pytest.mark.parametrize(("dpid", "port"), [(0x0003_0000_0001, 3), (1, 1),
                                            (2 ** 64 - 1, ofp.OFPP_MAX)])
def test_lldp_frame_round_trip(dpid, port):
    assert parse_lldp(lldp_frame(dpid, port, MAC)) == (dpid, port)


def test_lldp_frame_is_what_its_docstring_says():
    pkt = packet.Packet(lldp_frame(0x0003_0000_0001, 3, MAC))
    eth = pkt.get_protocol(ethernet.ethernet)
    assert ether_types.ETH_TYPE_LLDP == ETH_TYPE_LLDP  # the table's rule matches these frames
    assert (eth.dst, eth.src, eth.ethertype) == (lldp.LLDP_MAC_NEAREST_BRIDGE, MAC, ETH_TYPE_LLDP)
    chassis, port, ttl, end = pkt.get_protocol(lldp.lldp).tlvs
    assert chassis.chassis_id == b"dpid:0000000300000001"
    assert port.port_id == b"3"
    assert chassis.subtype == lldp.ChassisID.SUB_LOCALLY_ASSIGNED
    assert port.subtype == lldp.PortID.SUB_LOCALLY_ASSIGNED
    assert ttl.ttl > 0 and isinstance(end, lldp.End)


def arp_frame() -> bytes:
    pkt = packet.Packet()
    pkt.add_protocol(ethernet.ethernet(dst="ff:ff:ff:ff:ff:ff", src=MAC,
                                       ethertype=ether_types.ETH_TYPE_ARP))
    pkt.add_protocol(arp.arp(src_mac=MAC, src_ip="10.0.0.2", dst_ip="10.0.0.3"))
    pkt.serialize()
    return bytes(pkt.data)


def lldp_with(chassis: lldp.ChassisID, port: lldp.PortID) -> bytes:
    pkt = packet.Packet()
    pkt.add_protocol(ethernet.ethernet(dst=lldp.LLDP_MAC_NEAREST_BRIDGE, src=MAC,
                                       ethertype=ether_types.ETH_TYPE_LLDP))
    pkt.add_protocol(lldp.lldp((chassis, port, lldp.TTL(ttl=120), lldp.End())))
    pkt.serialize()
    return bytes(pkt.data)


LOCAL = lldp.ChassisID.SUB_LOCALLY_ASSIGNED


@pytest.mark.parametrize("data", [
    arp_frame(),
    LLDPPacket.lldp_packet(5, 7, MAC, 120),  # os-ken's topology discovery: packed port id
    lldp_with(lldp.ChassisID(subtype=lldp.ChassisID.SUB_MAC_ADDRESS, chassis_id=bytes(6)),
              lldp.PortID(subtype=lldp.PortID.SUB_INTERFACE_NAME, port_id=b"eth0")),  # lldpd
    lldp_with(lldp.ChassisID(subtype=LOCAL, chassis_id=b"dpid:0003"),
              lldp.PortID(subtype=LOCAL, port_id=b"3")),  # short DPID
    lldp_with(lldp.ChassisID(subtype=LOCAL, chassis_id=b"dpid:000000030000000x"),
              lldp.PortID(subtype=LOCAL, port_id=b"3")),
    lldp_with(lldp.ChassisID(subtype=LOCAL, chassis_id=b"dpid:0000000300000001"),
              lldp.PortID(subtype=LOCAL, port_id=b"eth3")),
    lldp_frame(1, 3, MAC)[:20],  # cut inside the chassis id
    b"",
    b"\x00" * 13,
], ids=["arp", "os-ken", "lldpd", "short-dpid", "bad-hex", "port-name", "truncated", "empty",
        "garbage"])
def test_frames_not_in_our_format_are_ignored(data):
    assert parse_lldp(data) is None


# --- verdicts --------------------------------------------------------------------------------

def test_an_intact_fabric_is_all_ok(tree):
    ports = all_up(tree)
    verdicts = judge(expected_neighbours(tree), ports,
                     received_over(tree, port_ends(tree), ports), names(tree))
    assert status_counts(verdicts) == {**dict.fromkeys(STATUSES, 0), OK: len(verdicts)}
    assert len(verdicts) == 5 * K * K // 4 * K


def test_a_swapped_pair_of_cables_flags_both_ports_and_both_far_ends(tree):
    ports = all_up(tree)
    cables = swap(port_ends(tree), ("p0e0", 3), ("p0e1", 4))  # to p0a0:1 and p0a1:2
    verdicts = judge(expected_neighbours(tree), ports, received_over(tree, cables, ports),
                     names(tree))
    wrong = not_ok(verdicts)
    assert {end: v.status for end, v in wrong.items()} == {
        ("p0e0", 3): MISWIRED, ("p0e1", 4): MISWIRED, ("p0a0", 1): MISWIRED,
        ("p0a1", 2): MISWIRED}
    assert (wrong[("p0e0", 3)].expected, wrong[("p0e0", 3)].seen) == (Peer("p0a0", 1),
                                                                      Peer("p0a1", 2))
    assert (wrong[("p0a1", 2)].expected, wrong[("p0a1", 2)].seen) == (Peer("p0e1", 4),
                                                                      Peer("p0e0", 3))
    assert wrong[("p0e0", 3)].describe() == "p0e0:3 miswired: expected p0a0:1, saw p0a1:2"


def test_a_link_that_carries_nothing_is_missing_at_both_ends(tree):
    ports = all_up(tree)
    cables = port_ends(tree)
    del cables[("p0a0", 3)], cables[("c0", 1)]  # up at both ends, but nothing gets across
    verdicts = judge(expected_neighbours(tree), ports, received_over(tree, cables, ports),
                     names(tree))
    wrong = not_ok(verdicts)
    assert {end: v.status for end, v in wrong.items()} == {("p0a0", 3): MISSING,
                                                           ("c0", 1): MISSING}
    assert wrong[("c0", 1)].describe() == "c0:1 missing: expected p0a0:3"


def test_a_port_down_is_down_and_its_far_end_hears_nothing(tree):
    ports = all_up(tree)
    ports["p0e0"][3] = False
    ports["p0e0"][1] = False  # a host port: no LLDP either way, down all the same
    verdicts = judge(expected_neighbours(tree), ports,
                     received_over(tree, port_ends(tree), ports), names(tree))
    assert {end: v.status for end, v in not_ok(verdicts).items()} == {
        ("p0e0", 3): DOWN, ("p0e0", 1): DOWN, ("p0a0", 1): MISSING}


def test_a_switch_gone_and_a_port_gone_are_absent(tree):
    ports = all_up(tree)
    del ports["c0"]  # not connected
    del ports["p3e1"][4]  # not in its port list
    verdicts = judge(expected_neighbours(tree), ports,
                     received_over(tree, port_ends(tree), ports), names(tree))
    statuses = {end: v.status for end, v in not_ok(verdicts).items()}
    assert statuses == {**{("c0", p): ABSENT for p in range(1, K + 1)},
                        **{(f"p{pod}a0", 3): MISSING for pod in range(K)},
                        ("p3e1", 4): ABSENT, ("p3a1", 2): MISSING}


def test_ports_beyond_the_description_are_unexpected(tree):
    ports = all_up(tree)
    ports["p0e0"][9] = True
    ports["p0e1"][9] = True
    cables = {**port_ends(tree), ("p0e0", 9): ("p0e1", 9), ("p0e1", 9): ("p0e0", 9)}
    verdicts = judge(expected_neighbours(tree), ports, received_over(tree, cables, ports),
                     names(tree))
    assert [(v.end, v.status, v.expected, v.seen) for v in not_ok(verdicts).values()] == [
        (("p0e0", 9), UNEXPECTED, None, Peer("p0e1", 9)),
        (("p0e1", 9), UNEXPECTED, None, Peer("p0e0", 9))]
    assert verdicts[-2:] == list(not_ok(verdicts).values())  # after the description's ports


def test_a_switch_cabled_where_a_host_should_be(tree):
    ports = all_up(tree)
    cables = swap(port_ends(tree), ("p0e0", 1), ("p0e0", 3))  # host and uplink trade ports
    verdicts = judge(expected_neighbours(tree), ports, received_over(tree, cables, ports),
                     names(tree))
    wrong = not_ok(verdicts)
    assert {end: v.status for end, v in wrong.items()} == {
        ("p0e0", 1): MISWIRED, ("p0e0", 3): MISSING, ("p0a0", 1): MISSING}
    assert wrong[("p0e0", 1)].describe() == "p0e0:1 miswired: expected host p0e0h0, saw p0a0:1"


def test_lldp_from_an_unknown_switch_names_its_chassis(tree):
    verdicts = judge(expected_neighbours(tree), {"p0e0": {3: True}},
                     {("p0e0", 3): (0xABC, 7)}, names(tree))
    (verdict,) = [v for v in verdicts if v.end == ("p0e0", 3)]
    assert (verdict.status, verdict.seen) == (MISWIRED, Peer("dpid:0000000000000abc", 7))


# --- when checks run -------------------------------------------------------------------------

def test_a_check_sends_its_rounds_then_judges_and_a_change_starts_it_again():
    schedule = CheckSchedule(round_delays_s=(0.0, 1.0), deadline_s=1.0)
    assert not schedule.round_due(0.0) and not schedule.judge_due(100.0)  # nothing running
    schedule.start(10.0)
    assert schedule.round_due(10.0)
    schedule.round_sent()
    assert not schedule.round_due(10.9) and not schedule.judge_due(10.9)
    assert schedule.round_due(11.0)
    schedule.round_sent()
    assert not schedule.round_due(20.0)
    assert not schedule.judge_due(11.9) and schedule.judge_due(12.0)
    schedule.start(11.95)  # a port changed just before the verdict: start over
    assert not schedule.judge_due(12.0) and schedule.round_due(11.95)
    schedule.round_sent()
    schedule.round_sent()
    assert schedule.judge_due(13.95)
    schedule.judged(13.95)
    assert not schedule.judge_due(20.0) and not schedule.round_due(20.0)
    assert schedule.trigger == CHANGE


def test_a_periodic_check_starts_an_interval_after_the_last_verdict():
    schedule = CheckSchedule(round_delays_s=(0.0, 1.0), deadline_s=1.0, recheck_interval_s=5.0)
    assert not schedule.recheck_due(1000.0)  # no verdict yet: the switches' connecting brings one
    schedule.start(10.0)
    assert not schedule.recheck_due(1000.0)  # a check runs
    schedule.round_sent()
    schedule.round_sent()
    schedule.judged(12.0)
    assert not schedule.recheck_due(16.99) and schedule.recheck_due(17.0)
    schedule.start(17.0, PERIODIC)
    assert schedule.trigger == PERIODIC and schedule.round_due(17.0)
    assert not schedule.recheck_due(30.0)  # the periodic check runs
    schedule.round_sent()
    schedule.start(17.5)  # a port changed during it: a check of its own, started by the change
    assert schedule.trigger == CHANGE and schedule.rounds_sent == 0
    schedule.round_sent()
    schedule.round_sent()
    assert not schedule.judge_due(19.49) and schedule.judge_due(19.5)
    schedule.judged(19.5)
    assert not schedule.recheck_due(24.49) and schedule.recheck_due(24.5)


def test_a_zero_interval_means_no_periodic_check():
    schedule = CheckSchedule(recheck_interval_s=0.0)
    schedule.start(0.0)
    schedule.judged(3.0)
    assert not any(schedule.recheck_due(t) for t in (3.0, 13.0, 1e9))


# --- the report ------------------------------------------------------------------------------

def test_report_records_read_back_as_checks(tree):
    ports = all_up(tree)
    expected = expected_neighbours(tree)
    intact = judge(expected, ports, received_over(tree, port_ends(tree), ports), names(tree))
    swapped = judge(expected, ports, received_over(
        tree, swap(port_ends(tree), ("p0e0", 3), ("p0e1", 3)), ports), names(tree))
    lines = [json.dumps(r) for r in report_records(1, 5.0, 7.0, intact, CHANGE)
             + report_records(2, 9.0, 11.0, swapped, PERIODIC)
             + report_records(3, 12.0, 14.0, intact, CHANGE)[:5]]
    records = [json.loads(line) for line in lines]
    checks = wiring_checks(records)
    assert [c["check"] for c in checks] == [1, 2]  # check 3 never closed
    assert [c["trigger"] for c in checks] == [CHANGE, PERIODIC]
    assert checks[0]["ports_checked"] == checks[0][OK] == len(intact) == len(checks[0]["verdicts"])
    assert (checks[1]["started_monotonic_s"], checks[1]["t_monotonic_s"]) == (9.0, 11.0)
    assert checks[1][MISWIRED] == 4
    summary = wiring_summary(records)
    assert (summary["check"], summary["checks"], summary[MISWIRED]) == (2, 2, 4)
    assert summary["trigger"] == PERIODIC
    assert summary["problems"] == [v.describe() for v in swapped if v.status != OK]
    assert "p0e0:3 miswired: expected p0a0:1, saw p0a0:2" in summary["problems"]
    assert wiring_summary([]) is None


def test_only_a_periodic_check_with_nothing_new_refers_back(tree):
    ports = all_up(tree)
    expected = expected_neighbours(tree)
    intact = judge(expected, ports, received_over(tree, port_ends(tree), ports), names(tree))
    again = judge(expected, ports, received_over(tree, port_ends(tree), ports), names(tree))
    swapped = judge(expected, ports, received_over(
        tree, swap(port_ends(tree), ("p0e0", 3), ("p0e1", 3)), ports), names(tree))
    assert again == intact and swapped != intact
    assert same_verdicts_as(PERIODIC, again, (4, intact)) == 4
    assert same_verdicts_as(PERIODIC, swapped, (4, intact)) is None
    assert same_verdicts_as(CHANGE, again, (4, intact)) is None  # a change is written in full
    assert same_verdicts_as(PERIODIC, again, None) is None  # nothing written yet


def test_a_quiet_periodic_check_is_one_line_and_reads_back_in_full(tree):
    ports = all_up(tree)
    expected = expected_neighbours(tree)
    intact = judge(expected, ports, received_over(tree, port_ends(tree), ports), names(tree))
    swapped = judge(expected, ports, received_over(
        tree, swap(port_ends(tree), ("p0e0", 3), ("p0e1", 3)), ports), names(tree))
    full = report_records(1, 5.0, 7.0, swapped, CHANGE)
    quiet = report_records(2, 17.0, 19.5, swapped, PERIODIC, same_as=1)
    assert len(full) == len(swapped) + 1 and len(quiet) == 1
    assert quiet[0] == {**full[-1], "check": 2, "trigger": PERIODIC, "t_monotonic_s": 19.5,
                        "started_monotonic_s": 17.0, "same_verdicts_as": 1}
    records = [json.loads(json.dumps(r)) for r in full + quiet]
    first, second = wiring_checks(records)
    assert second["verdicts"] == [{**v, "check": 2, "t_monotonic_s": 19.5}
                                  for v in first["verdicts"]]
    summary = wiring_summary(records)
    assert (summary["check"], summary["trigger"], summary[MISWIRED]) == (2, PERIODIC, 4)
    assert summary["problems"] == [v.describe() for v in swapped if v.status != OK]
    # a controller that starts again numbers its checks from 1: a quiet check names its own
    restarted = report_records(1, 30.0, 32.5, intact, CHANGE) + report_records(
        2, 42.5, 45.0, intact, PERIODIC, same_as=1)
    summary = wiring_summary(records + restarted)
    assert (summary["checks"], summary[OK], summary["problems"]) == (4, len(intact), [])
    assert wiring_checks(quiet) == []  # the check it names is not there
    old = {k: v for k, v in full[-1].items() if k != "trigger"}  # written before triggers
    assert wiring_checks([old])[0]["trigger"] == CHANGE


# --- LLDP never meets the fabric's forwarding ------------------------------------------------

@pytest.mark.parametrize(("kind", "params", "mode"), [
    ("fattree", {"k": 4}, "ecmp"), ("fattree", {"k": 4}, "single"), ("rail", {}, "ecmp"),
    ("dragonfly", {"p": 1, "a": 2, "h": 1}, "minimal"),
    ("dragonfly", {"p": 1, "a": 2, "h": 1}, "valiant"),
    ("dragonfly", {"p": 1, "a": 2, "h": 1}, "ugal")])
def test_every_table_sends_lldp_to_the_controller_and_no_other_rule_can_take_it(
        kind, params, mode):
    for table in FabricState(build(kind, **params), mode).tables.values():
        lldp_rule = (PRIORITY_LLDP, FlowMatch(eth_type=ETH_TYPE_LLDP))
        assert table.flows[lldp_rule] == (ToController(),)
        for (priority, match), _ in table.flows.items():
            if (priority, match) == lldp_rule:
                continue
            assert priority < PRIORITY_LLDP
            # an untagged LLDP frame matches neither an IPv4/ARP ethertype nor a VLAN tag
            assert match.eth_type in (ETH_TYPE_IPV4, ETH_TYPE_ARP) or match.vlan_vid is not None


# --- the app, fed OpenFlow messages by simulated switches -------------------------------------

class Datapath(ofproto_protocol.ProtocolDesc):
    """What the app uses of an os-ken connection: the protocol modules, an id, send_msg."""

    def __init__(self, dpid: int):
        super().__init__(ofp.OFP_VERSION)
        self.id = dpid
        self.sent: list = []

    def send_msg(self, msg) -> None:
        self.sent.append(msg)


def port_desc(port_no: int, up: bool = True):
    return parser.OFPPort(port_no, f"02:00:00:00:{port_no // 256:02x}:{port_no % 256:02x}",
                          f"p{port_no}", 0, 0 if up else ofp.OFPPS_LINK_DOWN, 0, 0, 0, 0, 0, 0)


class SimulatedSwitches:
    """Switches that answer the app as OVS would, over simulated cables: each connects
    (features, port list, the fabric app's barrier), and a packet-out leaves on its port and
    comes back to the app as a packet-in from the far switch."""

    def __init__(self, app, fabric, cables: Cables):
        self.app, self.fabric, self.cables = app, fabric, cables
        self.dps = {s.name: Datapath(s.dpid) for s in fabric.switches}
        ports = all_up(fabric)
        for name, dp in self.dps.items():
            app.switch_features_handler(ofp_event.EventOFPSwitchFeatures(
                parser.OFPSwitchFeatures(dp, datapath_id=dp.id)))
            app.port_desc_stats_reply_handler(ofp_event.EventOFPPortDescStatsReply(
                parser.OFPPortDescStatsReply(dp, body=[port_desc(p) for p in ports[name]]
                                             + [port_desc(ofp.OFPP_LOCAL)])))
            app.barrier_reply_handler(ofp_event.EventOFPBarrierReply(parser.OFPBarrierReply(dp)))

    def deliver(self) -> int:
        """Every packet-out sent so far, delivered over the cables; returns how many."""
        sent = 0
        for name, dp in self.dps.items():
            for msg in dp.sent:
                (action,) = msg.actions
                assert msg.in_port == ofp.OFPP_CONTROLLER
                far = self.cables.get((name, action.port))
                if far is not None and not self.fabric.nodes[far[0]].is_host:
                    self.app.packet_in_handler(ofp_event.EventOFPPacketIn(parser.OFPPacketIn(
                        self.dps[far[0]], match=parser.OFPMatch(in_port=far[1]),
                        data=msg.data)))
            sent += len(dp.sent)
            dp.sent.clear()
        return sent

    def check(self) -> list[int]:
        """Run the app's check as its thread would, from its start to its verdict; returns
        the packet-outs of each round."""
        schedule = self.app.schedule
        started = schedule.started_s
        rounds = []
        for delay in schedule.round_delays_s:
            self.app.tick(started + delay - 0.01)  # not due yet
            assert self.deliver() == 0
            self.app.tick(started + delay)
            rounds.append(self.deliver())
        self.app.tick(started + schedule.round_delays_s[-1] + schedule.deadline_s)
        assert schedule.started_s is None  # judged
        return rounds


def test_the_app_checks_what_the_switches_send_and_reports_a_swap(tree, tmp_path, monkeypatch,
                                                                  caplog):
    from testbed.controllers.apps.lldp_app import LldpApp

    fabric_json, report = tmp_path / "fabric.json", tmp_path / "wiring.jsonl"
    tree.dump_json(fabric_json)
    monkeypatch.setenv(ENV_FABRIC, str(fabric_json))
    monkeypatch.setenv(ENV_WIRING, str(report))
    app = LldpApp()
    switch_facing = 2 * (K ** 3 // 2)
    rounds = len(app.schedule.round_delays_s)
    try:
        net = SimulatedSwitches(app, tree, port_ends(tree))
        assert app.programmed == {s.name for s in tree.switches}
        assert net.check() == [switch_facing] * rounds  # host ports and LOCAL send nothing
        net.cables = swap(port_ends(tree), ("p0e0", 3), ("p0e1", 3))
        # the moved ports go and come back: a change, so the next check starts afresh
        for name in ("p0e0", "p0e1"):
            dp = net.dps[name]
            for reason in (ofp.OFPPR_DELETE, ofp.OFPPR_ADD):
                app.port_status_handler(ofp_event.EventOFPPortStatus(
                    parser.OFPPortStatus(dp, reason=reason, desc=port_desc(3))))
        assert app.received == {} and app.schedule.rounds_sent == 0
        with caplog.at_level(logging.ERROR):
            assert net.check() == [switch_facing] * rounds
        # a switch that goes away is absent from the next check
        app.state_change_handler(ofp_event.EventOFPStateChange(net.dps["c3"]))
        assert net.check() == [switch_facing - K] * rounds
    finally:
        app.close()
    checks = wiring_checks(json.loads(line) for line in report.read_text().splitlines())
    assert [c["check"] for c in checks] == [1, 2, 3]
    assert checks[0][OK] == checks[0]["ports_checked"] == 5 * K * K // 4 * K
    assert {(v["switch"], v["port"]): (v["expected"]["node"], v["expected"]["port"],
                                       v["seen"]["node"], v["seen"]["port"])
            for v in checks[1]["verdicts"] if v["status"] != OK} == {
        ("p0e0", 3): ("p0a0", 1, "p0a0", 2), ("p0e1", 3): ("p0a0", 2, "p0a0", 1),
        ("p0a0", 1): ("p0e0", 3, "p0e1", 3), ("p0a0", 2): ("p0e1", 3, "p0e0", 3)}
    assert "WIRING p0e0:3 miswired: expected p0a0:1, saw p0a0:2" in caplog.messages
    assert checks[2][ABSENT] == K and checks[2][MISSING] == K  # c3's ports, and their far ends


def test_the_app_rechecks_periodically_and_catches_a_swap_no_switch_reports(
        tree, tmp_path, monkeypatch, caplog):
    from testbed.controllers.apps.lldp_app import LldpApp

    fabric_json, report = tmp_path / "fabric.json", tmp_path / "wiring.jsonl"
    tree.dump_json(fabric_json)
    monkeypatch.setenv(ENV_FABRIC, str(fabric_json))
    monkeypatch.setenv(ENV_WIRING, str(report))
    monkeypatch.setenv(ENV_WIRING_RECHECK_INTERVAL, "5")
    app = LldpApp()
    schedule = app.schedule
    assert schedule.recheck_interval_s == 5.0
    switch_facing = 2 * (K ** 3 // 2)
    rounds = len(schedule.round_delays_s)
    lines_per_check = []

    def periodic_check() -> list[int]:
        """Wait out the interval as the app's thread would, then run the periodic check."""
        lines = len(report.read_text().splitlines())
        app.tick(schedule.judged_s + schedule.recheck_interval_s - 0.01)
        assert schedule.started_s is None  # not due yet
        app.tick(schedule.judged_s + schedule.recheck_interval_s)
        assert schedule.trigger == PERIODIC and app.received == {}
        sent = net.check()
        lines_per_check.append(len(report.read_text().splitlines()) - lines)
        return sent

    try:
        net = SimulatedSwitches(app, tree, port_ends(tree))
        assert net.check() == [switch_facing] * rounds
        assert periodic_check() == [switch_facing] * rounds  # all ok again: one line
        # cables trade places between two ports that stay up: no switch says a word
        net.cables = swap(port_ends(tree), ("p0e0", 3), ("p0e1", 3))
        # the app's own logger: one made after mininet is imported has a level of its own
        with caplog.at_level(logging.DEBUG, logger=app.logger.name):
            assert periodic_check() == [switch_facing] * rounds
            errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
            caplog.clear()
            periodic_check()  # still swapped: one line, nothing logged above debug
            assert [r.levelno for r in caplog.records] == [logging.DEBUG]
    finally:
        app.close()
    ports = 5 * K * K // 4 * K
    assert lines_per_check == [1, ports + 1, 1]
    assert "WIRING p0e0:3 miswired: expected p0a0:1, saw p0a0:2" in errors
    records = [json.loads(line) for line in report.read_text().splitlines()]
    checks = wiring_checks(records)
    assert [(c["check"], c["trigger"], c.get("same_verdicts_as")) for c in checks] == [
        (1, CHANGE, None), (2, PERIODIC, 1), (3, PERIODIC, None), (4, PERIODIC, 3)]
    assert [c[MISWIRED] for c in checks] == [0, 0, 4, 4]
    summary = wiring_summary(records)
    assert (summary["check"], summary["trigger"], summary[MISWIRED]) == (4, PERIODIC, 4)
    assert "p0e0:3 miswired: expected p0a0:1, saw p0a0:2" in summary["problems"]


@pytest.mark.parametrize(("value", "interval_s"), [(None, RECHECK_INTERVAL_S), ("0", 0.0),
                                                   ("2.5", 2.5)])
def test_the_recheck_interval_setting(value, interval_s):
    env = {ENV_FABRIC: "f.json", ENV_WIRING: "w.jsonl"}
    if value is not None:
        env[ENV_WIRING_RECHECK_INTERVAL] = value
    config = ControllerConfig.from_env(env)
    assert DEFAULT_WIRING_RECHECK_INTERVAL_S == RECHECK_INTERVAL_S == 10.0
    assert config.wiring_recheck_interval_s == interval_s
    assert ControllerConfig.from_env(config.to_env()) == config
    assert (ENV_WIRING_RECHECK_INTERVAL in config.to_env()) == (value is not None)


@pytest.mark.parametrize("bad", ["-1", "nan", "inf"])
def test_a_recheck_interval_that_cannot_be_is_refused(bad):
    with pytest.raises(ValueError, match=ENV_WIRING_RECHECK_INTERVAL):
        ControllerConfig.from_env({ENV_FABRIC: "f.json", ENV_WIRING_RECHECK_INTERVAL: bad})
