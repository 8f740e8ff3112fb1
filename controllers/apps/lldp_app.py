"""os-ken app that checks the cabling against the fabric description with LLDP, and writes
what it finds (testbed.controllers.routing.wiring) to TESTBED_WIRING_JSONL; unset, the app does nothing.

Every switch sends LLDP frames to the controller (the rule of testbed.controllers.routing.forwarding, part of
every table the fabric app programs; no rule forwards one). This app keeps each connected
switch's ports as its port list and port statuses report them, and runs a check whenever
something changes, and again every TESTBED_WIRING_RECHECK_INTERVAL_S seconds after the last
verdict (testbed.controllers.routing.wiring.CheckSchedule): a few rounds of one LLDP packet-out per up port of
every connected switch, except the ports that face hosts (they send nothing), then, after a
deadline, a verdict per port from the frames that came back. Every verdict goes to the report
file; a miswired port is also logged as an error, any other problem as a warning. A periodic
check whose verdicts are all as before writes one line, and logs none above debug.

A switch counts as programmed, and so able to pass LLDP up, once the first barrier on its
connection is answered: the fabric app ends the program of a connecting switch with one (and
this app sends no barrier of its own). Its becoming programmed starts the check again.

The event handlers run on this app's event thread, the rounds and the verdicts on a thread of
its own (testbed.controllers.apps.poller), so the two share the switches' state and the report file under
a lock.
"""
from __future__ import annotations

import json
import time

from os_ken.controller import ofp_event
from os_ken.controller.handler import (
    CONFIG_DISPATCHER,
    DEAD_DISPATCHER,
    MAIN_DISPATCHER,
    set_ev_cls,
)
from os_ken.ofproto import ofproto_v1_3

from testbed.controllers.apps.config import ControllerConfig
from testbed.controllers.apps.fabric_app import port_up
from testbed.controllers.apps.guard import survives
from testbed.controllers.apps.poller import PollingApp
from testbed.controllers.routing.wiring import (
    CHANGE,
    MISWIRED,
    OK,
    PERIODIC,
    CheckSchedule,
    End,
    PortVerdict,
    expected_neighbours,
    judge,
    lldp_frame,
    lldp_ports,
    parse_lldp,
    report_records,
    same_verdicts_as,
    status_counts,
)
from testbed.model.topology.base import Fabric

TICK_S = 0.05  # how often the check thread looks whether a round or a verdict is due


class LldpApp(PollingApp):
    OFP_VERSIONS = [ofproto_v1_3.OFP_VERSION]

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        config = ControllerConfig.from_env()
        fabric = Fabric.load_json(config.fabric_path)
        self.expected = expected_neighbours(fabric)
        self.names = {s.dpid: s.name for s in fabric.switches}
        self.dpids = {name: dpid for dpid, name in self.names.items()}
        # line-buffered: every record reaches the file as it is written
        self.out = open(config.wiring_path, "a", buffering=1) if config.wiring_path else None
        self.connections: dict[str, object] = {}  # switch -> its current connection
        self.programmed: set[str] = set()  # switches whose current connection is programmed
        self.ports: dict[str, dict[int, bool]] = {}  # switch -> port -> up, as reported
        self.macs: dict[End, str] = {}  # a port's own MAC: the source of its LLDP frames
        self.received: dict[End, tuple[int, int]] = {}  # port -> the (dpid, port) it heard
        self.schedule = CheckSchedule(recheck_interval_s=config.wiring_recheck_interval_s)
        self.checks = 0
        # (check, verdicts) of the last check that wrote its port records
        self.written: tuple[int, list[PortVerdict]] | None = None
        self.poll_interval_s = TICK_S

    def poll_description(self) -> str:
        interval_s = self.schedule.recheck_interval_s
        return (f"checking the wiring of {len(self.expected)} switch ports with LLDP, "
                + (f"and again every {interval_s:g} s" if interval_s > 0
                   else "only when something changes"))

    # --- what the switches report ------------------------------------------------------------

    def start_check(self, now: float, trigger: str) -> None:
        """Start a check from scratch (under lock): frames received before may describe the
        cabling as it was."""
        self.received.clear()
        self.schedule.start(now, trigger)

    def changed(self) -> None:
        """Something the check depends on changed: start it again (under lock)."""
        self.start_check(time.monotonic(), CHANGE)

    def current(self, dp) -> str | None:
        """The switch name of connection ``dp`` while it is that switch's current one."""
        name = self.names.get(dp.id)
        return name if name is not None and self.connections.get(name) is dp else None

    @set_ev_cls(ofp_event.EventOFPSwitchFeatures, CONFIG_DISPATCHER)
    @survives
    def switch_features_handler(self, ev):
        name = self.names.get(ev.msg.datapath_id)
        if not self.out or name is None:
            return
        with self.lock:
            self.connections[name] = ev.msg.datapath
            self.programmed.discard(name)
            self.ports[name] = {}
            self.changed()

    # os-ken's ofp_handler asks every connecting switch for its ports (OpenFlow 1.3).
    @set_ev_cls(ofp_event.EventOFPPortDescStatsReply, CONFIG_DISPATCHER)
    @survives
    def port_desc_stats_reply_handler(self, ev):
        dp = ev.msg.datapath
        ofp = dp.ofproto
        with self.lock:
            name = self.current(dp) if self.out else None
            if name is None:
                return
            for port in ev.msg.body:
                if port.port_no <= ofp.OFPP_MAX:  # not the bridge's own LOCAL port
                    self.ports[name][port.port_no] = port_up(ofp, None, port.config, port.state)
                    self.macs[(name, port.port_no)] = port.hw_addr
            self.changed()

    @set_ev_cls(ofp_event.EventOFPPortStatus, MAIN_DISPATCHER)
    @survives
    def port_status_handler(self, ev):
        msg = ev.msg
        dp = msg.datapath
        ofp = dp.ofproto
        if msg.desc.port_no > ofp.OFPP_MAX:
            return
        with self.lock:
            name = self.current(dp) if self.out else None
            if name is None:
                return
            end = (name, msg.desc.port_no)
            if msg.reason == ofp.OFPPR_DELETE:
                self.ports[name].pop(msg.desc.port_no, None)
                self.macs.pop(end, None)
            else:
                self.ports[name][msg.desc.port_no] = port_up(ofp, msg.reason, msg.desc.config,
                                                             msg.desc.state)
                self.macs[end] = msg.desc.hw_addr
            self.changed()

    @set_ev_cls(ofp_event.EventOFPBarrierReply, [CONFIG_DISPATCHER, MAIN_DISPATCHER])
    @survives
    def barrier_reply_handler(self, ev):
        with self.lock:
            name = self.current(ev.msg.datapath) if self.out else None
            if name is None or name in self.programmed:
                return
            self.programmed.add(name)
            self.changed()

    @set_ev_cls(ofp_event.EventOFPStateChange, DEAD_DISPATCHER)
    @survives
    def state_change_handler(self, ev):
        dp = ev.datapath
        if dp.id is None:
            return  # never finished its handshake
        with self.lock:
            name = self.current(dp) if self.out else None
            if name is None:
                return  # an older connection of a switch that has reconnected
            del self.connections[name]
            self.programmed.discard(name)
            del self.ports[name]
            self.changed()

    @set_ev_cls(ofp_event.EventOFPPacketIn, MAIN_DISPATCHER)
    @survives
    def packet_in_handler(self, ev):
        msg = ev.msg
        name = self.names.get(msg.datapath.id)
        if not self.out or name is None:
            return
        sender = parse_lldp(msg.data)
        if sender is None:
            return  # ARP (testbed.controllers.apps.arp_app), or LLDP that is not ours
        with self.lock:
            self.received[(name, msg.match["in_port"])] = sender

    # --- the check -----------------------------------------------------------------------

    def poll(self) -> None:
        try:
            self.tick(time.monotonic())
        except Exception:  # as testbed.controllers.apps.guard does for handlers: log, keep checking
            self.logger.exception("wiring check failed; carrying on")

    def tick(self, now: float) -> None:
        """Start the periodic check, send the round or judge the check that is due at
        ``now``, if any."""
        with self.lock:
            if self.schedule.recheck_due(now):
                self.start_check(now, PERIODIC)
                return
            if self.schedule.round_due(now):
                self.schedule.round_sent()
                sends = self.round_messages()
            elif self.schedule.judge_due(now):
                self.write_check(now)
                sends = []
            else:
                return
        for dp, msg in sends:
            dp.send_msg(msg)

    def round_messages(self) -> list[tuple[object, object]]:
        """One LLDP packet-out per port that sends LLDP, on every connected switch (under
        lock). A switch that is not programmed yet may send: only receiving needs the rule."""
        sends = []
        for name, dp in self.connections.items():
            ofp, parser = dp.ofproto, dp.ofproto_parser
            for port in lldp_ports(self.expected, name, self.ports[name]):
                frame = lldp_frame(self.dpids[name], port, self.macs[(name, port)])
                sends.append((dp, parser.OFPPacketOut(
                    dp, buffer_id=ofp.OFP_NO_BUFFER, in_port=ofp.OFPP_CONTROLLER,
                    actions=[parser.OFPActionOutput(port)], data=frame)))
        return sends

    def write_check(self, now: float) -> None:
        """Judge the check, write its report and log what is wrong (under lock); a periodic
        check that finds nothing new is one line, and logged at debug level only."""
        self.checks += 1
        verdicts = judge(self.expected, self.ports, self.received, self.names)
        trigger = self.schedule.trigger
        same_as = same_verdicts_as(trigger, verdicts, self.written)
        records = report_records(self.checks, self.schedule.started_s, now, verdicts, trigger,
                                 same_as)
        self.schedule.judged(now)
        if same_as is None:
            self.written = (self.checks, verdicts)
        if not self.out.closed:
            self.out.writelines(json.dumps(record) + "\n" for record in records)
        counts = ", ".join(f"{n} {status}" for status, n in status_counts(verdicts).items() if n)
        if same_as is not None:
            self.logger.debug("wiring check %d (%s): as check %d: %s", self.checks, trigger,
                              same_as, counts)
            return
        wrong = [v for v in verdicts if v.status != OK]
        for verdict in wrong:
            (self.logger.error if verdict.status == MISWIRED else self.logger.warning)(
                "WIRING %s", verdict.describe())
        (self.logger.error if wrong else self.logger.info)(
            "wiring check %d (%s): %s (%d ports, %d switches connected)", self.checks, trigger,
            counts, len(verdicts), len(self.connections))
