"""os-ken app that answers ARP for the fabric: every switch sends ARP to the controller
(testbed.controllers.routing.forwarding), and this app replies on the port the request came in on, so ARP
never floods. It knows every host's address (testbed.controllers.routing.ecmp.arp_table) and, when an
anycast service is configured, the service address with its own MAC
(testbed.controllers.routing.anycast.service_mac): switches rewrite that MAC to the chosen replica's.
"""
from __future__ import annotations

from os_ken.base import app_manager
from os_ken.controller import ofp_event
from os_ken.controller.handler import MAIN_DISPATCHER, set_ev_cls
from os_ken.lib.packet import arp, ether_types, ethernet, packet
from os_ken.ofproto import ofproto_v1_3

from testbed.controllers.apps.config import ControllerConfig
from testbed.controllers.apps.guard import survives
from testbed.controllers.routing.anycast import service_mac
from testbed.controllers.routing.ecmp import arp_table
from testbed.model.topology.base import Fabric


def proxy_arp_table(fabric: Fabric, service_ip: str | None = None) -> dict[str, str]:
    """IPv4 -> MAC the controller answers ARP with."""
    table = arp_table(fabric)
    if service_ip is not None:
        table[service_ip] = service_mac(service_ip)
    return table


class ProxyArpApp(app_manager.OSKenApp):
    OFP_VERSIONS = [ofproto_v1_3.OFP_VERSION]

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        config = ControllerConfig.from_env()
        service = config.anycast_service()
        self.arp = proxy_arp_table(Fabric.load_json(config.fabric_path),
                                   service.service_ip if service else None)

    @set_ev_cls(ofp_event.EventOFPPacketIn, MAIN_DISPATCHER)
    @survives
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
            return  # not a fabric address: stay silent rather than guess
        reply = packet.Packet()
        reply.add_protocol(ethernet.ethernet(ethertype=ether_types.ETH_TYPE_ARP,
                                             dst=eth.src, src=mac))
        reply.add_protocol(arp.arp(opcode=arp.ARP_REPLY, src_mac=mac, src_ip=req.dst_ip,
                                   dst_mac=req.src_mac, dst_ip=req.src_ip))
        reply.serialize()
        ofp, parser = dp.ofproto, dp.ofproto_parser
        in_port = msg.match["in_port"]
        dp.send_msg(parser.OFPPacketOut(dp, buffer_id=ofp.OFP_NO_BUFFER,
                                        in_port=ofp.OFPP_CONTROLLER,
                                        actions=[parser.OFPActionOutput(in_port)],
                                        data=reply.data))
