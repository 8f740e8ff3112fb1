"""os-ken app that programs a known fabric and keeps it programmed through failures.

The fabric description (the same JSON the network was built from) and every other setting
arrive through environment variables (testbed.controllers.apps.config). What each switch should hold and
what to send when something changes is plain data from testbed.controllers.routing.fabric_state and
testbed.controllers.routing.forwarding; this app turns events into calls there and plans into OpenFlow
messages, one for one (``openflow_messages``), and nothing else:

- a switch that connects is wiped (flows and groups) and programmed from scratch with its
  current table, so a restarted controller or a reconnecting switch re-synchronises without
  stale or duplicate rules. After a barrier confirms a switch's state, its name is added to
  the status file (TESTBED_STATUS_JSON) that the testbed polls to know the fabric is ready;
- a port going down or up (port status, and the port list a switch reports when it
  connects) or a switch disconnecting updates the failure bookkeeping, recomputes, and sends
  every connected switch whose table changed its update plan (make before break, see
  testbed.controllers.routing.forwarding). Each change is logged with CLOCK_MONOTONIC times and written to
  the events file (TESTBED_EVENTS_JSONL) once every updated switch has answered the plan's
  last barrier, so the testbed can measure the reaction time from its own clock;
- under UGAL routing, every port-statistics round (testbed.controllers.apps.port_stats_app) reweights the
  source routers' select groups from the measured utilisation; and a copy of the first
  packet of every new TCP or UDP flow for another group comes here (testbed.controllers.routing.ugal): the
  flow is placed and its exact-match rule installed (it reports its removal when it idles
  out). The packet itself has already left along the minimal route, so it is not sent
  back out.

ARP is answered by testbed.controllers.apps.arp_app; port counters are polled by testbed.controllers.apps.port_stats_app.
"""
from __future__ import annotations

import json
import os
import threading
import time
from dataclasses import dataclass, field

from os_ken.base import app_manager
from os_ken.controller import ofp_event
from os_ken.controller.handler import (
    CONFIG_DISPATCHER,
    DEAD_DISPATCHER,
    MAIN_DISPATCHER,
    set_ev_cls,
)
from os_ken.lib.packet import ether_types, ipv4, packet, tcp, udp
from os_ken.ofproto import ofproto_v1_3

from testbed.controllers.apps.config import ControllerConfig
from testbed.controllers.apps.guard import survives
from testbed.controllers.apps.port_stats_app import EventPortStatsRound
from testbed.controllers.routing.fabric_state import Change, FabricState
from testbed.controllers.routing.forwarding import (
    ADD,
    DELETE,
    MODIFY,
    Barrier,
    FlowMod,
    GroupMod,
    Message,
    Wipe,
)
from testbed.controllers.routing.rules import (
    Bucket,
    FlowAction,
    FlowMatch,
    Output,
    PopVlan,
    PushVlan,
    SetEthDst,
    ToController,
    ToGroup,
)
from testbed.controllers.routing.ugal import (
    IP_PROTO_TCP,
    IP_PROTO_UDP,
    FiveTuple,
    TransportRule,
    flow_weight,
    placement_plan,
)
from testbed.model.records import port_tx_rates_mbit
from testbed.model.topology.base import Fabric

GROUP_COMMANDS = {ADD: ofproto_v1_3.OFPGC_ADD, MODIFY: ofproto_v1_3.OFPGC_MODIFY,
                  DELETE: ofproto_v1_3.OFPGC_DELETE}
# MODIFY_STRICT and DELETE_STRICT touch exactly the flow of that priority and match; the
# loose forms would also hit every more specific flow (a rail's port routes under a route).
FLOW_COMMANDS = {ADD: ofproto_v1_3.OFPFC_ADD, MODIFY: ofproto_v1_3.OFPFC_MODIFY_STRICT,
                 DELETE: ofproto_v1_3.OFPFC_DELETE_STRICT}


# --- plans to OpenFlow -----------------------------------------------------------------------

def ofp_match(parser, ofp, match: FlowMatch):
    fields = {"eth_type": match.eth_type, "in_port": match.in_port,
              "vlan_vid": None if match.vlan_vid is None else match.vlan_vid | ofp.OFPVID_PRESENT,
              "ipv4_dst": match.ipv4_dst}
    return parser.OFPMatch(**{name: value for name, value in fields.items() if value is not None})


def ofp_actions(parser, ofp, actions: tuple[FlowAction, ...]) -> list:
    out = []
    for action in actions:
        if isinstance(action, Output):
            out.append(parser.OFPActionOutput(action.port))
        elif isinstance(action, ToGroup):
            out.append(parser.OFPActionGroup(action.group_id))
        elif isinstance(action, PushVlan):
            out += [parser.OFPActionPushVlan(ether_types.ETH_TYPE_8021Q),
                    parser.OFPActionSetField(vlan_vid=action.vlan_vid | ofp.OFPVID_PRESENT)]
        elif isinstance(action, PopVlan):
            out.append(parser.OFPActionPopVlan())
        elif isinstance(action, SetEthDst):
            out.append(parser.OFPActionSetField(eth_dst=action.mac))
        elif isinstance(action, ToController):
            out.append(parser.OFPActionOutput(ofp.OFPP_CONTROLLER, ofp.OFPCML_NO_BUFFER))
        else:
            raise TypeError(f"no OpenFlow action for {action!r}")
    return out


def ofp_bucket(parser, ofp, bucket: Bucket):
    # watch_port lets OVS skip a bucket whose port is down before we recompute.
    port = next(a.port for a in bucket.actions if isinstance(a, Output))
    return parser.OFPBucket(weight=bucket.weight, watch_port=port, watch_group=ofp.OFPG_ANY,
                            actions=ofp_actions(parser, ofp, bucket.actions))


def transport_match(parser, rule: TransportRule):
    ports = {IP_PROTO_TCP: ("tcp_src", "tcp_dst"),
             IP_PROTO_UDP: ("udp_src", "udp_dst")}[rule.ip_proto]
    fields = {"in_port": rule.in_port, "eth_type": ether_types.ETH_TYPE_IP,
              "ip_proto": rule.ip_proto, "ipv4_src": rule.ipv4_src, "ipv4_dst": rule.ipv4_dst,
              ports[0]: rule.src_port, ports[1]: rule.dst_port}
    return parser.OFPMatch(**{name: value for name, value in fields.items() if value is not None})


def openflow_messages(dp, message: Message | TransportRule) -> list:
    """The OpenFlow messages of one plan entry, for datapath ``dp`` (anything with
    ``ofproto`` and ``ofproto_parser``)."""
    ofp, parser = dp.ofproto, dp.ofproto_parser
    if isinstance(message, TransportRule):
        inst = [parser.OFPInstructionActions(ofp.OFPIT_APPLY_ACTIONS,
                                             ofp_actions(parser, ofp, message.actions))]
        return [parser.OFPFlowMod(dp, cookie=message.cookie, command=ofp.OFPFC_ADD,
                                  idle_timeout=message.idle_timeout_s,
                                  priority=message.priority,
                                  flags=ofp.OFPFF_SEND_FLOW_REM if message.cookie else 0,
                                  match=transport_match(parser, message), instructions=inst)]
    if isinstance(message, Barrier):
        return [parser.OFPBarrierRequest(dp)]
    if isinstance(message, Wipe):
        return [parser.OFPFlowMod(dp, command=ofp.OFPFC_DELETE, table_id=ofp.OFPTT_ALL,
                                  out_port=ofp.OFPP_ANY, out_group=ofp.OFPG_ANY),
                parser.OFPGroupMod(dp, command=ofp.OFPGC_DELETE, group_id=ofp.OFPG_ALL)]
    if isinstance(message, GroupMod):
        buckets = [ofp_bucket(parser, ofp, b) for b in message.buckets]
        return [parser.OFPGroupMod(dp, GROUP_COMMANDS[message.command], ofp.OFPGT_SELECT,
                                   message.group_id, buckets)]
    assert isinstance(message, FlowMod), message
    match = ofp_match(parser, ofp, message.match)
    if message.command == DELETE:
        return [parser.OFPFlowMod(dp, command=FLOW_COMMANDS[DELETE], priority=message.priority,
                                  match=match, out_port=ofp.OFPP_ANY, out_group=ofp.OFPG_ANY)]
    inst = [parser.OFPInstructionActions(ofp.OFPIT_APPLY_ACTIONS,
                                         ofp_actions(parser, ofp, message.actions))]
    return [parser.OFPFlowMod(dp, command=FLOW_COMMANDS[message.command],
                              priority=message.priority, match=match, instructions=inst)]


def send_plan(dp, plan: list[Message | TransportRule]) -> int | None:
    """Send a plan to a switch; returns the xid of its last barrier (None without one)."""
    xid = None
    for message in plan:
        for msg in openflow_messages(dp, message):
            dp.send_msg(msg)  # assigns the xid
            if isinstance(message, Barrier):
                xid = msg.xid
    return xid


def transport_flow(pkt: packet.Packet) -> tuple[FiveTuple, float] | None:
    """The flow a parsed frame belongs to and what it weighs (testbed.controllers.routing.ugal.flow_weight);
    None when it is no IPv4 TCP or UDP packet with its ports (an IP fragment has none)."""
    ip = pkt.get_protocol(ipv4.ipv4)
    if ip is None:
        return None
    segment = pkt.get_protocol(tcp.tcp)
    if ip.proto == IP_PROTO_TCP and segment is not None:
        weight = flow_weight(IP_PROTO_TCP, segment.has_flags(tcp.TCP_SYN),
                             segment.has_flags(tcp.TCP_ACK))
        return FiveTuple(IP_PROTO_TCP, ip.src, ip.dst, segment.src_port, segment.dst_port), weight
    datagram = pkt.get_protocol(udp.udp)
    if ip.proto == IP_PROTO_UDP and datagram is not None:
        return (FiveTuple(IP_PROTO_UDP, ip.src, ip.dst, datagram.src_port, datagram.dst_port),
                flow_weight(IP_PROTO_UDP))
    return None


def port_up(ofp, reason: int | None, config: int, state: int) -> bool:
    """Whether a port carries traffic, from a port status (``reason``) or a port description
    (``reason`` None): not deleted, not administratively down, link up."""
    return (reason != ofp.OFPPR_DELETE and not config & ofp.OFPPC_PORT_DOWN
            and not state & ofp.OFPPS_LINK_DOWN)


# --- the app ---------------------------------------------------------------------------------

@dataclass
class PendingChange:
    """A change whose update plans were sent: its event record and the (connection, barrier
    xid) replies still awaited."""

    record: dict
    waiting: set[tuple[object, int]] = field(default_factory=set)


class FabricApp(app_manager.OSKenApp):
    OFP_VERSIONS = [ofproto_v1_3.OFP_VERSION]

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        config = ControllerConfig.from_env()
        self.fabric = Fabric.load_json(config.fabric_path)
        self.state = FabricState(self.fabric, config.routing, config.anycast_service())
        self.status_path = config.status_path
        # line-buffered: every event reaches the file as it is written
        self.event_log = (open(config.events_path, "a", buffering=1) if config.events_path
                          else None)
        self.datapaths: dict[int, object] = {}  # dpid -> connected os-ken Datapath
        # by connection, not dpid: a reconnected switch never answers the old one's barriers
        self.awaiting: dict[tuple[object, int], PendingChange] = {}
        self.last_round: dict = {}  # the previous port-statistics round (UGAL)
        self.programmed: set[str] = set()
        self.status_lock = threading.Lock()
        self.logger.info("fabric %s %s: %d switches, routing %s%s", self.fabric.kind,
                         self.fabric.params, len(self.state.tables), config.routing,
                         f", anycast {self.state.anycast}" if self.state.anycast else "")

    @property
    def rules_by_dpid(self):
        """dpid -> the table that switch should hold now (testbed.controllers.routing.forwarding.SwitchTable)."""
        return {table.dpid: table for table in self.state.tables.values()}

    def close(self):
        if self.event_log:
            self.event_log.close()

    def live_datapath(self, name: str):
        """The connection to switch ``name``, None when it is not connected."""
        dp = self.datapaths.get(self.fabric.nodes[name].dpid)
        return dp if dp is not None and dp.state != DEAD_DISPATCHER else None

    @set_ev_cls(ofp_event.EventOFPSwitchFeatures, CONFIG_DISPATCHER)
    @survives
    def switch_features_handler(self, ev):
        t0 = time.monotonic()
        dp = ev.msg.datapath
        # The message's dpid, not dp.id: os-ken queues this event for the apps before its own
        # handler, in the connection's thread, sets dp.id, so this thread may run first.
        dpid = ev.msg.datapath_id
        name = self.state.names.get(dpid)
        if name is None:
            self.logger.warning("unknown switch dpid %016x connected; leaving it empty", dpid)
            return
        self.datapaths[dpid] = dp
        change = self.state.switch_status(name, up=True)
        # Recompute first (a returning switch, or changes made while no switch was connected),
        # so the switch is programmed with the current state; the others follow after it.
        plans = self.state.refresh()
        table = self.state.tables[name]
        send_plan(dp, self.state.program(name))
        self.logger.info("programming %s: %d groups, %d flows", name, len(table.groups),
                         len(table.flows))
        if change is not None or plans:
            self.send_plans(change or Change("recomputed", switch=name), t0, plans, skip=name)

    # os-ken's ofp_handler asks every connecting switch for its ports (OpenFlow 1.3) and moves
    # it to MAIN on the reply; reading that reply too tells which ports are up at connect time.
    @set_ev_cls(ofp_event.EventOFPPortDescStatsReply, CONFIG_DISPATCHER)
    @survives
    def port_desc_stats_reply_handler(self, ev):
        dp = ev.msg.datapath
        for port in ev.msg.body:
            self.port_changed(dp, port.port_no, port_up(dp.ofproto, None, port.config,
                                                        port.state))

    @set_ev_cls(ofp_event.EventOFPPortStatus, MAIN_DISPATCHER)
    @survives
    def port_status_handler(self, ev):
        msg = ev.msg
        dp = msg.datapath
        self.port_changed(dp, msg.desc.port_no, port_up(dp.ofproto, msg.reason, msg.desc.config,
                                                        msg.desc.state))

    def port_changed(self, dp, port_no: int, up: bool) -> None:
        t0 = time.monotonic()
        name = self.state.names.get(dp.id)
        change = self.state.port_status(name, port_no, up) if name else None
        if change is not None:
            self.apply_change(change, t0)

    @set_ev_cls(ofp_event.EventOFPStateChange, DEAD_DISPATCHER)
    @survives
    def state_change_handler(self, ev):
        t0 = time.monotonic()
        dp = ev.datapath
        for key in [key for key in self.awaiting if key[0] is dp]:
            pending = self.awaiting.pop(key)
            pending.waiting.discard(key)
            pending.record.setdefault("unconfirmed", []).append(self.state.names[dp.id])
            if not pending.waiting:
                self.write_event(pending.record)
        if dp.id is None or self.datapaths.get(dp.id) is not dp:
            return  # never finished its handshake, or an older connection of a switch
        del self.datapaths[dp.id]
        change = self.state.switch_status(self.state.names[dp.id], up=False)
        if change is not None:
            self.apply_change(change, t0)

    def apply_change(self, change: Change, t0: float) -> None:
        """Recompute and send the update plans, unless no switch is connected to take them
        (a fabric going away): then the recomputation waits for the next switch to connect."""
        live = any(self.live_datapath(name) for name in self.state.tables)
        plans = self.state.refresh() if live else {}
        if not self.state.reroutes:
            self.logger.warning("%s: %s routing does not route around failures; only select "
                                "groups skip dead ports", change.describe(), self.state.mode)
        self.send_plans(change, t0, plans)

    def send_plans(self, change: Change, t0: float, plans: dict, skip: str | None = None) -> None:
        """Send each connected switch its plan; the change's event is written once all have
        confirmed (at once if none needed anything)."""
        pending = PendingChange({"t_monotonic_s": t0, **change.to_dict(), "switches_updated": 0,
                                 "messages": 0})
        for name, plan in plans.items():
            dp = self.live_datapath(name)
            if dp is None or name == skip:
                continue  # programmed from scratch when it connects
            key = (dp, send_plan(dp, plan))
            pending.waiting.add(key)
            self.awaiting[key] = pending
            pending.record["messages"] += len(plan)
        pending.record["switches_updated"] = len(pending.waiting)
        self.logger.info("%s at t=%.6f: %d switches updated, %d messages, computed in %.3f s",
                         change.describe(), t0, len(pending.waiting),
                         pending.record["messages"], time.monotonic() - t0)
        if not pending.waiting:
            self.write_event(pending.record)

    def write_event(self, record: dict) -> None:
        record["applied_monotonic_s"] = time.monotonic()
        self.logger.info("%s applied at t=%.6f (%.3f s after the event)", record["event"],
                         record["applied_monotonic_s"],
                         record["applied_monotonic_s"] - record["t_monotonic_s"])
        if self.event_log:
            self.event_log.write(json.dumps(record) + "\n")

    @set_ev_cls(EventPortStatsRound)
    @survives
    def port_stats_round_handler(self, ev):
        loads = port_tx_rates_mbit(self.last_round, ev.samples)
        self.last_round = ev.samples
        plans = self.state.ugal_round(loads)
        sent = 0
        for name, plan in plans.items():
            dp = self.live_datapath(name)
            if dp is not None:  # one that is not gets the new weights when it connects
                send_plan(dp, plan)
                sent += 1
        if plans:
            self.logger.info("ugal: source groups reweighted on %d routers (%d connected)",
                             len(plans), sent)

    # Only ugal routing sends IPv4 here (testbed.controllers.routing.ugal.to_controller_rules); ARP is
    # testbed.controllers.apps.arp_app's, and this handler leaves it alone. The rule that sent the packet
    # asked for all of it (OFPCML_NO_BUFFER, so buffer_id is OFP_NO_BUFFER and no switch
    # buffer waits for a packet-out) and has already forwarded it along the minimal route:
    # a packet-out would deliver it twice. An IP fragment without ports has nothing to place.
    @set_ev_cls(ofp_event.EventOFPPacketIn, MAIN_DISPATCHER)
    @survives
    def packet_in_handler(self, ev):
        if self.state.placements is None:
            return
        msg = ev.msg
        dp = msg.datapath
        name = self.state.names.get(dp.id)
        found = transport_flow(packet.Packet(msg.data))
        if name is None or found is None:
            return
        flow, weight = found
        placement, new = self.state.place_flow(name, msg.match["in_port"], flow, weight)
        send_plan(dp, placement_plan(placement, new))
        if new:
            path = placement.path
            self.logger.info("ugal: %s at %s: %s, port %d (%.1f hops)", flow.describe(), name,
                             "minimal" if path.option is None
                             else f"through group {path.option}", path.port, path.hops)

    @set_ev_cls(ofp_event.EventOFPFlowRemoved, MAIN_DISPATCHER)
    @survives
    def flow_removed_handler(self, ev):
        placement = self.state.flow_removed(ev.msg.cookie) if ev.msg.cookie else None
        if placement is not None:
            self.logger.debug("ugal: %s at %s removed", placement.flow.describe(),
                              placement.router)

    @set_ev_cls(ofp_event.EventOFPErrorMsg, [CONFIG_DISPATCHER, MAIN_DISPATCHER])
    @survives
    def error_msg_handler(self, ev):
        msg = ev.msg
        self.logger.warning("%s refused message xid %d: error type %d code %d",
                            self.state.names.get(msg.datapath.id, "?"), msg.xid, msg.type,
                            msg.code)

    @set_ev_cls(ofp_event.EventOFPBarrierReply, [CONFIG_DISPATCHER, MAIN_DISPATCHER])
    @survives
    def barrier_reply_handler(self, ev):
        dp = ev.msg.datapath
        key = (dp, ev.msg.xid)
        pending = self.awaiting.pop(key, None)
        if pending is not None:
            pending.waiting.discard(key)
            if not pending.waiting:
                self.write_event(pending.record)
        name = self.state.names.get(dp.id)
        if name is None or name in self.programmed:
            return
        with self.status_lock:
            self.programmed.add(name)
            self.write_status()
        self.logger.info("programmed %s (%d/%d)", name, len(self.programmed),
                         len(self.state.tables))

    def write_status(self):
        if not self.status_path:
            return
        tmp = self.status_path + ".tmp"
        with open(tmp, "w") as fh:
            json.dump({"programmed": sorted(self.programmed)}, fh)
        os.replace(tmp, self.status_path)
