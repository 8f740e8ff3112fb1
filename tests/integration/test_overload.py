"""An overloaded run is flagged: the k=4 ring AllReduce at a link rate far above what the
machine forwards (``testbed bench`` measures the ceiling) must come out NOT trusted, for a
reason that names the overload (the machine's CPU, a saturated forwarding thread, the
bottleneck short of its rate, or delay no emulated queue explains), and still exit with the
status that says so. Needs root; runs alone."""
from __future__ import annotations

from testbed.cli import EXIT_VERDICT
from testbed.harness.run import run_scenario
from testbed.experiments.registry import load

OVERLOAD_RATE_MBIT = 2000  # several times this kind of machine's k=4 ceiling
OVERLOAD_CHECKS = {"machine CPU busy", "ovs-vswitchd busiest thread", "busiest link delivery",
                   "probe RTT beyond idle and the emulated queues",
                   "generator busiest thread", "generator wait for a core"}


def test_a_ring_far_above_the_machines_ceiling_is_not_trusted(tmp_path):
    resolved = load("fattree-allreduce", {
        "results_dir": str(tmp_path), "link_rate_mbit": OVERLOAD_RATE_MBIT,
        "params.size_bytes": 32 << 20, "params.iters": 1, "params.warmup": 0})
    outcome = run_scenario(resolved, log=print)
    failed = {c.name for c in outcome.verdict.trust if c.passed is False}
    print(outcome.verdict.reasons, failed)
    assert outcome.status == "complete"
    assert not outcome.verdict.emulator_trusted
    assert failed & OVERLOAD_CHECKS, failed
    assert outcome.exit_status() == EXIT_VERDICT
    assert outcome.exit_status(accept_failed=True, accept_untrusted=True) == 0
