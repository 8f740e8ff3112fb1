"""Link failures on real OVS: the controller notices a fabric link going down, routes around
it (single-path routing, so nothing but the controller can save the flow), and puts the
routes back when the link returns; with ECMP the failed port's bucket leaves the select
groups and comes back. The reaction time is measured by ``testbed bench``; here only a
generous bound that catches hangs is asserted."""
from __future__ import annotations

import re

from testbed.apply.controller import EVENTS_FILE
from testbed.apply.network import FabricNetwork
from testbed.measure.failover import cut_and_repair, ping_received, wait_for_event
from testbed.model.topology import build

RATE_MBIT = 6.0
FAILED_PORT = "p0e0-eth3"        # edge p0e0's first uplink: single-path's choice for other pods
SANITY_BOUND_S = 5.0             # far beyond the 1 s goal: a bound that only catches hangs


def test_single_path_routes_around_a_failed_uplink_and_back(ledger, tmp_path):
    fabric = build("fattree", k=4, host_rate_mbit=RATE_MBIT)
    with FabricNetwork(fabric, tmp_path, ledger, routing="single", log=lambda m: None) as net:
        src, dst = net.host("p0e0h0"), fabric.nodes["p3e1h1"].ip
        uplink_tx = f"/sys/class/net/{FAILED_PORT}/statistics/tx_packets"
        before = int(open(uplink_tx).read())
        assert ping_received(src.cmd("ping", "-c", "5", "-i", "0.05", dst)) == 5
        assert int(open(uplink_tx).read()) - before >= 5  # the probes use the uplink we cut

        result = cut_and_repair(net, FAILED_PORT, "p0e0h0", "p3e1h1")
        print(result.to_dict())
        assert result.down_applied_s < SANITY_BOUND_S and result.outage_s < SANITY_BOUND_S
        before = int(open(uplink_tx).read())
        assert ping_received(src.cmd("ping", "-c", "5", "-i", "0.05", dst)) == 5
        assert int(open(uplink_tx).read()) - before >= 5  # back on the original uplink


def test_ecmp_buckets_leave_and_return_with_the_link(ledger, tmp_path):
    fabric = build("fattree", k=4, host_rate_mbit=RATE_MBIT)
    events = tmp_path / EVENTS_FILE
    with FabricNetwork(fabric, tmp_path, ledger, log=lambda m: None) as net:
        def buckets():
            return sorted(re.findall(r"actions=output:(\d+)", net.switchd.dump_groups("p0e0")))

        original = buckets()
        assert "3" in original and "4" in original
        t_down = net.set_interface(FAILED_PORT, False)
        assert wait_for_event(events, "link_down", t_down)
        # nothing forwards to the dead port: no bucket, no flow (one uplink left: plain outputs)
        assert "3" not in buckets()
        assert "output:3" not in net.switchd.dump_flows("p0e0")
        assert ping_received(net.host("p0e0h0").cmd("ping", "-c", "3", "-i", "0.1",
                                               fabric.nodes["p3e1h1"].ip)) == 3
        t_up = net.set_interface(FAILED_PORT, True)
        assert wait_for_event(events, "link_up", t_up)
        assert buckets() == original
