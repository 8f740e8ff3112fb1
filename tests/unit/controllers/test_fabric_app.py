"""The fabric app's connection handling, on fake connections (no switch, no os-ken loop)."""
from __future__ import annotations

import logging
import threading

from os_ken.controller import ofp_event
from os_ken.ofproto import ofproto_v1_3_parser as parser
from tests.unit.controllers.test_ugal import FakeDatapath

from testbed.controllers.apps.fabric_app import FabricApp
from testbed.controllers.routing.fabric_state import FabricState
from testbed.model.topology import build


def test_a_switch_is_programmed_by_the_dpid_of_its_features_reply_before_os_ken_sets_it():
    fabric = build("fattree", k=4)
    app = FabricApp.__new__(FabricApp)  # its __init__ reads the environment of a real run
    app.state = FabricState(fabric, "ecmp")
    app.logger = logging.getLogger("test_fabric_app")
    app.datapaths, app.awaiting, app.programmed = {}, {}, set()
    app.event_log, app.status_lock = None, threading.Lock()
    # dp.id unset, as the apps' threads may first see it: os-ken sets it in its own features
    # handler, after queueing the event for the apps
    switch, dp = fabric.nodes["p2e1"], FakeDatapath(None)
    app.switch_features_handler(ofp_event.EventOFPSwitchFeatures(
        parser.OFPSwitchFeatures(dp, datapath_id=switch.dpid)))
    assert app.datapaths == {switch.dpid: dp}
    table = app.state.tables["p2e1"]
    assert sum(isinstance(m, parser.OFPFlowMod) for m in dp.sent) >= len(table.flows) > 0
    assert sum(isinstance(m, parser.OFPGroupMod) for m in dp.sent) >= len(table.groups) > 0
