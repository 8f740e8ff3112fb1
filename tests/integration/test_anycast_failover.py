"""Anycast on the wire: a request/response service (traffic.anycast_service) on two replicas
behind one address. A client is served by its nearest replica; when that replica's link
fails it is served by the other one, and when the link returns it moves back
(testbed.anycast_failover). The switch-over time is printed; only a generous sanity bound is
asserted (timing goals are measured by ``testbed bench``, not asserted on a noisy machine)."""
from __future__ import annotations

from testbed.anycast_failover import FAT_TREE_K4, cut_and_repair
from testbed.controller import write_anycast
from testbed.experiment import start_anycast
from testbed.fabric import FabricNetwork
from testbed.topology import build

CUT = FAT_TREE_K4            # client p0e1h0, near p0e0h0 (same pod), far p3e1h1
SANITY_BOUND_S = 3.0


def test_clients_follow_the_nearest_live_replica(ledger, tmp_path):
    fabric = build("fattree", k=4, host_rate_mbit=6.0)
    write_anycast(tmp_path, CUT.service.to_dict())
    with FabricNetwork(fabric, tmp_path, ledger, log=lambda m: None) as net:
        expected = start_anycast(net, CUT.service, net.routing, lambda m: None)
        assert expected["replica_for_host"][CUT.client] == CUT.near
        result = cut_and_repair(net, CUT)  # TestbedError if it never moved, or never back
    print(f"anycast: served by {CUT.far} {1000 * result.to_far_s:.0f} ms after {CUT.near}'s "
          f"link went down, back on {CUT.near} {1000 * result.back_to_near_s:.0f} ms after it "
          f"returned; {result.requests_lost}/{result.requests} requests lost")
    assert result.replicas_before == [CUT.near]
    assert result.to_far_s < SANITY_BOUND_S and result.back_to_near_s < SANITY_BOUND_S
    assert result.replicas_after == [CUT.near]
