"""Anycast on the wire, as ``scenarios/fattree-anycast-failover.yaml`` runs it: a
request/response service (testbed.traffic.anycast_service) on two replicas behind one address. A
client is served by its nearest replica; when that replica's link fails it is served by the
other one, and when the link returns it moves back (testbed.experiments.anycast.run); then a ring
AllReduce runs on the repaired fabric. The switch-over time is printed; only a generous
sanity bound is asserted (timing goals are measured by ``testbed bench``, not asserted on a
noisy machine)."""
from __future__ import annotations

import dataclasses

from testbed.experiments.allreduce.run import run_experiment
from testbed.experiments.anycast.run import FAT_TREE_K4
from testbed.harness.scenario import load_scenario

SCENARIO = "scenarios/fattree-anycast-failover.yaml"
CUT = FAT_TREE_K4            # client p0e1h0, near p0e0h0 (same pod), far p3e1h1
SANITY_BOUND_S = 3.0


def test_clients_follow_the_nearest_live_replica(tmp_path):
    config = dataclasses.replace(load_scenario(SCENARIO), warmup=0, iters=1,
                                 results_dir=str(tmp_path))
    assert config.anycast_failover == CUT.client
    summary = run_experiment(config, log=print)
    anycast = summary["anycast"]
    assert anycast["replica_for_host"][CUT.client] == CUT.near
    result = anycast["failover"]  # the run fails if the client never moved, or never back
    print(f"anycast: served by {CUT.far} {1000 * result['to_far_s']:.0f} ms after {CUT.near}'s "
          f"link went down, back on {CUT.near} {1000 * result['back_to_near_s']:.0f} ms after "
          f"it returned; {result['requests_lost']}/{result['requests']} requests lost")
    assert (result["near"], result["far"], result["interface"]) == (CUT.near, CUT.far,
                                                                    CUT.interface)
    assert result["replicas_before"] == [CUT.near]
    assert CUT.far in result["replicas_while_down"]
    assert result["to_far_s"] < SANITY_BOUND_S and result["back_to_near_s"] < SANITY_BOUND_S
    assert result["replicas_after"] == [CUT.near]
    assert summary["workload"]["verified"]
