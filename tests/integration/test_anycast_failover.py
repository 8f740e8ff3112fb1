"""Anycast on the wire, as ``scenarios/fattree-anycast-failover.yaml`` runs it: a
request/response service (testbed.traffic.anycast_service) on two replicas behind one address. A
client is served by its nearest replica; when that replica's link fails it is served by the
other one, and when the link returns it moves back (testbed.experiments.anycast). The run's
own checks hold both moves and the outage to the controller's 1 s goal, and the run must have
been trustworthy, on this machine's datapath (part of the stock-kernel suite, make vm-test)."""
from __future__ import annotations

import os

import pytest

from testbed.capabilities import detect
from testbed.harness.run import run_scenario
from testbed.experiments.registry import load
from testbed.measure.anycast_failover import FAT_TREE_K4

pytestmark = pytest.mark.stock_kernel

CUT = FAT_TREE_K4            # client p0e1h0, near p0e0h0 (same pod), far p3e1h1
# Inside the stock-kernel guest (software emulation, about ten times slower) the service and
# its client need longer than the scenario's 1.5 s to answer before the cut: the schedule
# keeps its shape, each phase a few seconds, and the probes go every 20 ms.
IN_VM = os.environ.get("TESTBED_IN_VM") == "1"
SCHEDULE = ({"params.interval_s": 0.02, "params.down_at_s": 6.0, "params.up_at_s": 12.0,
             "params.duration_s": 18.0} if IN_VM else {})


def test_clients_follow_the_nearest_live_replica(tmp_path):
    resolved = load("fattree-anycast-failover", {"results_dir": str(tmp_path), **SCHEDULE})
    outcome = run_scenario(resolved, log=print)
    ran = outcome.summary["provenance"]["paths"]
    assert ran["ovs_datapath"] == detect().paths.ovs_datapath, ran
    result = outcome.summary["results"]["fabric"]
    assert result["bring_up"]["anycast"]["replica_for_host"][CUT.client] == CUT.near
    failover = result["failover"]  # the run fails if the client never moved, or never back
    print(f"anycast: served by {CUT.far} {1000 * failover['to_far_s']:.0f} ms after "
          f"{CUT.near}'s link went down, back on {CUT.near} "
          f"{1000 * failover['back_to_near_s']:.0f} ms after it returned; "
          f"{failover['requests_lost']}/{failover['requests']} requests lost")
    assert (failover["near"], failover["far"], failover["interface"]) == (
        CUT.near, CUT.far, CUT.interface)
    assert failover["replicas_before"] == [CUT.near]
    assert CUT.far in failover["replicas_while_down"]
    assert failover["replicas_after"] == [CUT.near]
    assert outcome.verdict.emulator_trusted, outcome.verdict.reasons
    assert [c.outcome for c in outcome.verdict.checks] == ["PASS"] * 3, outcome.verdict.checks
    assert outcome.exit_status() == 0
