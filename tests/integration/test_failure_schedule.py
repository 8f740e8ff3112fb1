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


def core_of_p0a0_eth3(fabric) -> str:
    link, end = next((link, end) for link in fabric.links for end in (0, 1)
                     if link.intf(end) == "p0a0-eth3")
    return link.b if end == 0 else link.a


def test_a_scheduled_loss_starts_and_ends_on_its_link_and_the_ring_still_verifies(tmp_path):
    """An ``impair`` with ``for_s``: the link's ports were prepared at bring-up (a netem that
    adds nothing, or an idle cut of the eBPF loss program), the loss starts at its time and
    is removed for_s later; the ring's data is still the verified sum."""
    from testbed.harness.run import run_scenario
    from testbed.experiments.registry import load

    core = core_of_p0a0_eth3(build("fattree", k=4, host_rate_mbit=RATE_MBIT))
    resolved = load("fattree-allreduce", {
        "results_dir": str(tmp_path), "params.size_bytes": 1024 * 1024, "params.iters": 2,
        "params.warmup": 0, "params.expect_busbw_fraction": 0.3,
        "failures": [{"at_s": 3.0, "for_s": 3.0, "action": "impair", "link": ["p0a0", core],
                      "loss_percent": 5.0}]})
    outcome = run_scenario(resolved, log=lambda m: None)
    result = outcome.summary["results"]["fabric"]
    assert result["verified"] and result["verified_ranks"] == 16
    assert [(r["action"], "error" in r) for r in result["failures"]] == [
        ("impair", False), ("unimpair", False)]
    (window,) = result["fault_windows"]
    assert window["end_monotonic_s"] - window["start_monotonic_s"] >= 2.5
    assert result["impairments"]["scheduled"] == [["p0a0", core]]
    if result["impairments"]["path"] == "ebpf-loss":  # netem counts nothing of its own here
        assert result["impairments"]["loss_counters"]["matched"] > 0
    assert "plots/faults.png" in [plot["path"] for plot in outcome.summary["plots"]]


def test_a_rank_stopped_for_a_while_is_resumed_and_the_ring_completes(tmp_path):
    """``stop`` of a host's traffic program for 2 s (SIGSTOP, then SIGCONT to the same
    process): the ring waits for it and completes with verified data."""
    from testbed.harness.run import run_scenario
    from testbed.experiments.registry import load

    resolved = load("fattree-allreduce", {
        "results_dir": str(tmp_path), "params.size_bytes": 1024 * 1024, "params.iters": 2,
        "params.warmup": 0, "params.expect_busbw_fraction": 0.3,
        "failures": [{"at_s": 4.0, "for_s": 2.0, "action": "stop", "daemon": "traffic",
                      "host": "p1e0h1"}]})
    outcome = run_scenario(resolved, log=lambda m: None)
    result = outcome.summary["results"]["fabric"]
    assert result["verified"] and result["verified_ranks"] == 16
    stop, resume = result["failures"]
    assert (stop["action"], resume["action"]) == ("stop", "resume")
    assert len(stop["pids"]) == 1 and resume["pids"] == stop["pids"]  # the rank, and only it
