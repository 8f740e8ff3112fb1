"""A scenario's failure schedule on the wire: the harness takes a link down and up while the
workload runs, and the controller sees both (its own module: a run takes the machine's lock,
which other modules hold for their whole fabric)."""
from __future__ import annotations

from testbed.model.topology import build

RATE_MBIT = 6.0


def test_allreduce_across_a_scheduled_failure_completes_with_verified_data(tmp_path):
    """A scenario's failure schedule takes an aggregation-to-core link the ring crosses down
    in the middle of a ring AllReduce and brings it back: every rank's result is still the
    verified sum, and the controller saw both events. Trust is not asserted: the ring is
    meant to lose rate while the link is down."""
    from testbed.harness.run import run_scenario
    from testbed.experiments.registry import load

    fabric = build("fattree", k=4, host_rate_mbit=RATE_MBIT)
    link, end = next((link, end) for link in fabric.links for end in (0, 1)
                     if link.intf(end) == "p0a0-eth3")
    core = link.b if end == 0 else link.a
    resolved = load("fattree-allreduce", {
        "results_dir": str(tmp_path), "params.size_bytes": 1024 * 1024, "params.iters": 2,
        "params.warmup": 0,
        "failures": [{"at_s": 3.0, "action": "link_down", "link": ["p0a0", core]},
                     {"at_s": 5.0, "action": "link_up", "link": ["p0a0", core]}]})
    outcome = run_scenario(resolved, log=lambda m: None)
    result = outcome.summary["results"]["fabric"]
    assert result["verified"] and result["verified_ranks"] == 16
    assert [(e["event"], "error" in e) for e in result["failures"]] == [
        (f"link_down p0a0-{core}", False), (f"link_up p0a0-{core}", False)]
    kinds = [e["event"] for e in result["openflow"]["events"]]
    assert "link_down" in kinds and "link_up" in kinds
