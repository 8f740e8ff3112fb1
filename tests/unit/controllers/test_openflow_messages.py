"""Plans become the OpenFlow 1.3 messages they describe: built with os-ken's own parser
classes, serialised to wire format and read back (flow mods by os-ken's parser, group buckets
by its bucket parser), no switch needed. Port states read as up or down, and the proxy ARP
knows every address it should answer for."""
from __future__ import annotations

import pytest
from os_ken.ofproto import ofproto_parser, ofproto_protocol, ofproto_v1_3
from os_ken.ofproto import ofproto_v1_3_parser as parser

from testbed.controllers.apps.arp_app import proxy_arp_table
from testbed.controllers.apps.fabric_app import openflow_messages, port_up
from testbed.controllers.routing.forwarding import (
    ADD,
    DELETE,
    ETH_TYPE_IPV4,
    MODIFY,
    Barrier,
    FlowMod,
    GroupMod,
    Wipe,
)
from testbed.controllers.routing.rules import (
    Bucket,
    FlowMatch,
    Output,
    PopVlan,
    PushVlan,
    SetEthDst,
    ToController,
    ToGroup,
)
from testbed.model.topology.fattree import fat_tree

ofp = ofproto_v1_3
GROUP_MOD_HEADER_BYTES = 16  # ofp_header, command, type, pad, group_id


@pytest.fixture
def dp():
    """What os-ken needs to build and serialise messages: the protocol version's modules."""
    return ofproto_protocol.ProtocolDesc(ofp.OFP_VERSION)


def wire(dp, msg):
    msg.set_xid(1)
    msg.serialize()
    return msg.buf


def read_back(dp, msg):
    buf = wire(dp, msg)
    return ofproto_parser.msg(dp, ofp.OFP_VERSION, msg.msg_type, len(buf), 1, buf)


def test_flow_add_with_vlan_push_and_group(dp):
    match = FlowMatch(eth_type=ETH_TYPE_IPV4, in_port=2, vlan_vid=3, ipv4_dst="10.1.0.2")
    (msg,) = openflow_messages(dp, FlowMod(ADD, 110, match, (PushVlan(3), ToGroup(4))))
    back = read_back(dp, msg)
    assert back.command == ofp.OFPFC_ADD and back.priority == 110
    assert dict(back.match.items()) == {"eth_type": 0x0800, "in_port": 2,
                                        "vlan_vid": 3 | ofp.OFPVID_PRESENT,
                                        "ipv4_dst": "10.1.0.2"}
    (inst,) = back.instructions
    assert inst.type == ofp.OFPIT_APPLY_ACTIONS
    push, set_vid, group = inst.actions
    assert push.ethertype == 0x8100
    assert set_vid.key == "vlan_vid" and set_vid.value == 3 | ofp.OFPVID_PRESENT
    assert group.group_id == 4


def test_flow_modify_rewrites_mac_pops_and_outputs_strictly(dp):
    actions = (PopVlan(), SetEthDst("02:00:0a:00:00:02"), Output(7), ToController())
    (msg,) = openflow_messages(dp, FlowMod(MODIFY, 100, FlowMatch(ipv4_dst="10.0.0.2",
                                                                  eth_type=ETH_TYPE_IPV4),
                                           actions))
    back = read_back(dp, msg)
    assert back.command == ofp.OFPFC_MODIFY_STRICT
    pop, mac, out, controller = back.instructions[0].actions
    assert pop.type == ofp.OFPAT_POP_VLAN
    assert (mac.key, mac.value) == ("eth_dst", "02:00:0a:00:00:02")
    assert out.port == 7
    assert (controller.port, controller.max_len) == (ofp.OFPP_CONTROLLER, ofp.OFPCML_NO_BUFFER)


def test_flow_delete_is_strict_and_unfiltered(dp):
    (msg,) = openflow_messages(dp, FlowMod(DELETE, 120, FlowMatch(vlan_vid=2)))
    back = read_back(dp, msg)
    assert back.command == ofp.OFPFC_DELETE_STRICT and back.priority == 120
    # out_port/out_group 0 would only delete flows that output to port 0: nothing
    assert (back.out_port, back.out_group) == (ofp.OFPP_ANY, ofp.OFPG_ANY)
    assert dict(back.match.items()) == {"vlan_vid": 2 | ofp.OFPVID_PRESENT}


@pytest.mark.parametrize(("command", "code"), [(ADD, ofp.OFPGC_ADD), (MODIFY, ofp.OFPGC_MODIFY),
                                               (DELETE, ofp.OFPGC_DELETE)])
def test_group_mods_are_select_groups_whose_buckets_watch_their_port(dp, command, code):
    buckets = (Bucket(727, (Output(3),)), Bucket(273, (PushVlan(3), Output(2))))
    (msg,) = openflow_messages(dp, GroupMod(command, 5, buckets if command != DELETE else ()))
    buf = wire(dp, msg)
    assert (msg.command, msg.type, msg.group_id) == (code, ofp.OFPGT_SELECT, 5)
    offset, read = GROUP_MOD_HEADER_BYTES, []
    while offset < len(buf):
        bucket = parser.OFPBucket.parser(buf, offset)
        read.append(bucket)
        offset += bucket.len
    if command == DELETE:
        assert read == []
        return
    assert [(b.weight, b.watch_port, b.watch_group) for b in read] == [
        (727, 3, ofp.OFPG_ANY), (273, 2, ofp.OFPG_ANY)]
    assert [a.type for a in read[1].actions] == [ofp.OFPAT_PUSH_VLAN, ofp.OFPAT_SET_FIELD,
                                                 ofp.OFPAT_OUTPUT]


def test_wipe_deletes_every_flow_and_group_and_barrier_is_a_barrier(dp):
    flows, groups = openflow_messages(dp, Wipe())
    back = read_back(dp, flows)
    assert (back.command, back.table_id, back.out_port, back.out_group) == (
        ofp.OFPFC_DELETE, ofp.OFPTT_ALL, ofp.OFPP_ANY, ofp.OFPG_ANY)
    wire(dp, groups)
    assert (groups.command, groups.group_id) == (ofp.OFPGC_DELETE, ofp.OFPG_ALL)
    (barrier,) = openflow_messages(dp, Barrier())
    assert isinstance(barrier, parser.OFPBarrierRequest)


@pytest.mark.parametrize(("reason", "config", "state", "up"), [
    (ofp.OFPPR_MODIFY, 0, 0, True),
    (None, 0, 0, True),  # a port description: no reason
    (ofp.OFPPR_ADD, 0, ofp.OFPPS_LIVE, True),
    (ofp.OFPPR_MODIFY, 0, ofp.OFPPS_LINK_DOWN, False),  # the peer veth went down
    (ofp.OFPPR_MODIFY, ofp.OFPPC_PORT_DOWN, 0, False),  # ovs-ofctl mod-port ... down
    (ofp.OFPPR_MODIFY, ofp.OFPPC_NO_FWD, 0, True),
    (ofp.OFPPR_DELETE, 0, 0, False),  # ovs-vsctl del-port
    (None, 0, ofp.OFPPS_LINK_DOWN, False),
])
def test_port_up(reason, config, state, up):
    assert port_up(ofp, reason, config, state) is up


def test_proxy_arp_answers_for_every_host_and_the_anycast_service():
    fabric = fat_tree(4)
    table = proxy_arp_table(fabric, "10.255.0.1")
    assert table == {**{h.ip: h.mac for h in fabric.hosts}, "10.255.0.1": "02:01:0a:ff:00:01"}
    assert proxy_arp_table(fabric) == {h.ip: h.mac for h in fabric.hosts}
