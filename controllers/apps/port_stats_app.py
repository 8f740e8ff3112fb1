"""os-ken app that polls the port counters of every connected switch over OpenFlow.

Every TESTBED_PORT_STATS_INTERVAL_S seconds (default 0.5) a thread sends one
OFPPortStatsRequest to each switch; each reply's fabric ports become JSON lines of
TESTBED_PORT_STATS_JSONL (testbed.measure.openflow.PortSample: CLOCK_MONOTONIC time of the
reply, switch, port, byte, packet and drop counters). One file handle, flushed once a round.
At the start of each round the latest sample of every port goes to the other apps as an
``EventPortStatsRound``: UGAL routing (testbed.controllers.apps.fabric_app) reweights from it.

Polling is off when TESTBED_PORT_STATS_JSONL is unset, except under UGAL routing, which
needs the counters (it then polls without writing them).

The reply handler runs on this app's event thread, the poll rounds on a thread of its own
(testbed.controllers.apps.poller), so the two share the latest samples and the file under a lock.
"""
from __future__ import annotations

import time

from os_ken.controller import event, ofp_event
from os_ken.controller.handler import DEAD_DISPATCHER, MAIN_DISPATCHER, set_ev_cls
from os_ken.ofproto import ofproto_v1_3

from testbed.controllers.apps.config import ControllerConfig
from testbed.controllers.apps.guard import survives
from testbed.controllers.apps.poller import PollingApp
from testbed.controllers.routing.dragonfly import UGAL
from testbed.controllers.routing.fabric_state import link_ends
from testbed.model.records import PortSample
from testbed.model.topology.base import Fabric


class EventPortStatsRound(event.EventBase):
    """The newest sample of every polled port, {(switch, port): PortSample}, as a new poll
    round starts."""

    def __init__(self, samples: dict):
        super().__init__()
        self.samples = samples


class PortStatsApp(PollingApp):
    OFP_VERSIONS = [ofproto_v1_3.OFP_VERSION]
    _EVENTS = [EventPortStatsRound]

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        config = ControllerConfig.from_env()
        fabric = Fabric.load_json(config.fabric_path)
        self.names = {s.dpid: s.name for s in fabric.switches}
        self.ends = set(link_ends(fabric))  # the bridge's own port (LOCAL) is left out
        self.poll_interval_s = config.port_stats_interval_s
        self.out = open(config.port_stats_path, "a") if config.port_stats_path else None
        self.enabled = self.out is not None or config.routing == UGAL
        self.datapaths: dict[int, object] = {}
        self.latest: dict = {}

    def polling(self) -> bool:
        return self.enabled

    def poll_description(self) -> str:
        return (f"polling port counters every {self.poll_interval_s:.3f} s"
                + ("" if self.out else " (not written: no file given)"))

    def poll(self) -> None:
        """One round: flush the last round's samples, hand them to the other apps, and ask
        every switch for its counters."""
        with self.lock:
            if self.out:
                self.out.flush()
            samples = dict(self.latest)
            datapaths = list(self.datapaths.values())
        if samples:
            self.send_event_to_observers(EventPortStatsRound(samples))
        for dp in datapaths:
            ofp, parser = dp.ofproto, dp.ofproto_parser
            dp.send_msg(parser.OFPPortStatsRequest(dp, 0, ofp.OFPP_ANY))

    @set_ev_cls(ofp_event.EventOFPStateChange, [MAIN_DISPATCHER, DEAD_DISPATCHER])
    @survives
    def state_change_handler(self, ev):
        dp = ev.datapath
        if dp.id not in self.names:
            return
        with self.lock:
            if ev.state == MAIN_DISPATCHER:
                self.datapaths[dp.id] = dp
            elif self.datapaths.get(dp.id) is dp:
                del self.datapaths[dp.id]

    @set_ev_cls(ofp_event.EventOFPPortStatsReply, MAIN_DISPATCHER)
    @survives
    def port_stats_reply_handler(self, ev):
        t = time.monotonic()
        name = self.names.get(ev.msg.datapath.id)
        samples = [PortSample(t, name, s.port_no, s.tx_bytes, s.rx_bytes, s.tx_packets,
                              s.rx_packets, s.tx_dropped,
                              s.duration_sec + s.duration_nsec / 1e9)
                   for s in ev.msg.body if (name, s.port_no) in self.ends]
        with self.lock:
            for sample in samples:
                self.latest[sample.end] = sample
            if self.out and not self.out.closed:
                self.out.writelines(sample.to_json() + "\n" for sample in samples)
