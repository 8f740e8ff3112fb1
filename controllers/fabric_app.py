"""os-ken app that programs a known fabric: ECMP select groups, IPv4 routes (by destination,
and by input port where a rail fabric pins each GPU to its NIC), proxy ARP.

The fabric description (the same JSON the network was built from) arrives through the
TESTBED_FABRIC_JSON environment variable; routes come from controllers.routing. Each switch
that connects is wiped (flows and groups) and programmed from scratch, so a restarted
controller re-synchronises without stale or duplicate rules. After a barrier confirms a
switch's state, its name is added to the status file (TESTBED_STATUS_JSON) that the testbed
polls to know the fabric is ready.
"""
from __future__ import annotations

import json
import os
import threading

from os_ken.base import app_manager
from os_ken.controller import ofp_event
from os_ken.controller.handler import CONFIG_DISPATCHER, MAIN_DISPATCHER, set_ev_cls
from os_ken.lib.packet import arp, ethernet, ether_types, packet
from os_ken.ofproto import ofproto_v1_3

from controllers.routing import ECMP, Route, SwitchRules, arp_table, compute_rules
from testbed.topology.base import Fabric

PRIORITY_ARP = 200
PRIORITY_DELIVERY = 120    # to a host of this switch, where port routes exist
PRIORITY_PORT_ROUTE = 110  # by input port: a GPU's own rail
PRIORITY_ROUTE = 100       # by destination


def route_priority(rules: SwitchRules, route: Route) -> int:
    """The priority of a route by destination on this switch."""
    # A node switch's own GPUs must outrank its port routes, or a GPU's packet for a GPU of
    # the same node would leave on the rail instead of NVLink. Without port routes one priority
    # serves: destination matches never overlap, and other fabrics' flow tables stay as they were.
    if rules.port_routes and rules.is_delivery(route):
        return PRIORITY_DELIVERY
    return PRIORITY_ROUTE


class FabricApp(app_manager.OSKenApp):
    OFP_VERSIONS = [ofproto_v1_3.OFP_VERSION]

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.fabric = Fabric.load_json(os.environ["TESTBED_FABRIC_JSON"])
        self.status_path = os.environ.get("TESTBED_STATUS_JSON")
        mode = os.environ.get("TESTBED_ROUTING", ECMP)
        self.rules_by_dpid = {r.dpid: r for r in compute_rules(self.fabric, mode).values()}
        self.arp = arp_table(self.fabric)
        self.programmed: set[str] = set()
        self.status_lock = threading.Lock()
        self.logger.info("fabric %s %s: %d switches, routing %s", self.fabric.kind,
                         self.fabric.params, len(self.rules_by_dpid), mode)

    @set_ev_cls(ofp_event.EventOFPSwitchFeatures, CONFIG_DISPATCHER)
    def switch_features_handler(self, ev):
        dp = ev.msg.datapath
        rules = self.rules_by_dpid.get(dp.id)
        if rules is None:
            self.logger.warning("unknown switch dpid %016x connected; leaving it empty", dp.id)
            return
        ofp, parser = dp.ofproto, dp.ofproto_parser
        # Start from nothing so a reconnect or a controller restart never leaves stale rules.
        dp.send_msg(parser.OFPFlowMod(dp, command=ofp.OFPFC_DELETE, table_id=ofp.OFPTT_ALL,
                                      out_port=ofp.OFPP_ANY, out_group=ofp.OFPG_ANY))
        dp.send_msg(parser.OFPGroupMod(dp, command=ofp.OFPGC_DELETE, group_id=ofp.OFPG_ALL))
        for gid, ports in rules.groups.items():
            # watch_port lets OVS skip a bucket whose port is down before we recompute.
            buckets = [parser.OFPBucket(weight=1, watch_port=port, watch_group=ofp.OFPG_ANY,
                                        actions=[parser.OFPActionOutput(port)])
                       for port in ports]
            dp.send_msg(parser.OFPGroupMod(dp, ofp.OFPGC_ADD, ofp.OFPGT_SELECT, gid, buckets))
        # ARP never floods: every request goes to the controller, which answers it.
        self.add_flow(dp, PRIORITY_ARP, parser.OFPMatch(eth_type=ether_types.ETH_TYPE_ARP),
                      [parser.OFPActionOutput(ofp.OFPP_CONTROLLER, ofp.OFPCML_NO_BUFFER)])
        for route in rules.routes:
            match = parser.OFPMatch(eth_type=ether_types.ETH_TYPE_IP, ipv4_dst=route.dst_ip)
            action = (parser.OFPActionGroup(route.group_id) if route.group_id
                      else parser.OFPActionOutput(route.port))
            self.add_flow(dp, route_priority(rules, route), match, [action])
        # IPv4 only, like every route: a GPU's IPv6 or broadcast frames are still dropped,
        # not carried along its rail, and its ARP requests still reach the controller.
        for port_route in rules.port_routes:
            match = parser.OFPMatch(in_port=port_route.in_port, eth_type=ether_types.ETH_TYPE_IP)
            self.add_flow(dp, PRIORITY_PORT_ROUTE, match,
                          [parser.OFPActionOutput(port_route.out_port)])
        # No table-miss flow: anything else (IPv6 ND, stray broadcasts) is dropped, not flooded.
        dp.send_msg(parser.OFPBarrierRequest(dp))
        self.logger.info("programming %s: %d groups, %d routes, %d port routes", rules.name,
                         len(rules.groups), len(rules.routes), len(rules.port_routes))

    @staticmethod
    def add_flow(dp, priority, match, actions):
        parser = dp.ofproto_parser
        inst = [parser.OFPInstructionActions(dp.ofproto.OFPIT_APPLY_ACTIONS, actions)]
        dp.send_msg(parser.OFPFlowMod(dp, priority=priority, match=match, instructions=inst))

    @set_ev_cls(ofp_event.EventOFPBarrierReply, MAIN_DISPATCHER)
    def barrier_reply_handler(self, ev):
        rules = self.rules_by_dpid.get(ev.msg.datapath.id)
        if rules is None:
            return
        with self.status_lock:
            self.programmed.add(rules.name)
            self.write_status()
        self.logger.info("programmed %s (%d/%d)", rules.name, len(self.programmed),
                         len(self.rules_by_dpid))

    def write_status(self):
        if not self.status_path:
            return
        tmp = self.status_path + ".tmp"
        with open(tmp, "w") as fh:
            json.dump({"programmed": sorted(self.programmed)}, fh)
        os.replace(tmp, self.status_path)

    @set_ev_cls(ofp_event.EventOFPPacketIn, MAIN_DISPATCHER)
    def packet_in_handler(self, ev):
        msg = ev.msg
        dp = msg.datapath
        pkt = packet.Packet(msg.data)
        req = pkt.get_protocol(arp.arp)
        eth = pkt.get_protocol(ethernet.ethernet)
        if req is None or eth is None or req.opcode != arp.ARP_REQUEST:
            return
        mac = self.arp.get(req.dst_ip)
        if mac is None:
            return  # not a fabric host: stay silent rather than guess
        reply = packet.Packet()
        reply.add_protocol(ethernet.ethernet(ethertype=ether_types.ETH_TYPE_ARP,
                                             dst=eth.src, src=mac))
        reply.add_protocol(arp.arp(opcode=arp.ARP_REPLY, src_mac=mac, src_ip=req.dst_ip,
                                   dst_mac=req.src_mac, dst_ip=req.src_ip))
        reply.serialize()
        ofp, parser = dp.ofproto, dp.ofproto_parser
        in_port = msg.match["in_port"]
        dp.send_msg(parser.OFPPacketOut(dp, buffer_id=ofp.OFP_NO_BUFFER, in_port=ofp.OFPP_CONTROLLER,
                                        actions=[parser.OFPActionOutput(in_port)],
                                        data=reply.data))
