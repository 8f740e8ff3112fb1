"""The one table of faults and the outcome each must have: plain data, read by the planner
(testbed.chaos.plan), the judge (testbed.chaos.outcome) and the report, and rendered into the
reliability page (``faults_markdown``; a unit test checks the page holds it as written here).

Outcomes:

- **survived**: the run completes (status complete) and every integrity check of its
  workload passes (its data verified); a fault may cost rate, so exit 1 (a rate check
  failed, or the emulator not trusted) counts as well as 0;
- **failed loudly**: exit 3 within the run's time limit, exactly one line on stderr and it
  names what died, never "verified", nothing left behind;
- **refused**: exit 3 at once, one line, nothing created, nothing left;
- **recovered**: after a SIGKILL of the testbed process, ``testbed clean`` exits 0 and leaves
  nothing (namespaces, interfaces, bridges, processes, BPF pins, the ledger) with every kernel
  setting back to its value before the run, and the next run passes;
- **passes**: a plain run (the suite's first, and the one after each SIGKILL): exit 0, data
  verified, nothing left.
"""
from __future__ import annotations

from dataclasses import dataclass

from testbed.apply.state import BRING_UP, TEAR_DOWN, WORKLOAD

SURVIVED, FAILED_LOUDLY, REFUSED, RECOVERED, PASSES = (
    "survived", "failed loudly", "refused", "recovered", "passes")
OUTCOMES = {
    SURVIVED: "the run completes with its data verified (exit 0, or 1 when the fault cost "
              "rate or trust)",
    FAILED_LOUDLY: "exit 3 within the run's time limit, one line on stderr naming what died, "
                   "never verified, nothing left",
    REFUSED: "exit 3 at once, one line, nothing created, nothing left",
    RECOVERED: "`testbed clean` leaves nothing and restores every kernel setting; the next "
               "run passes",
    PASSES: "exit 0, data verified, nothing left",
}
# Where a results folder lives for a fault that is about the folder (testbed.chaos.suite).
FULL_TMPFS, READ_ONLY, LOCK_HELD = "full-tmpfs", "read-only", "lock-held"
SIGKILL_HOW = ("SIGKILL at a random point of the phase the run's ledger names, then `testbed "
               "clean`, then a plain run")


@dataclass(frozen=True)
class Fault:
    """One row: ``key``, what is done (``fault``), the outcome it must have, the workloads
    it is injected into (testbed.chaos.plan.WORKLOADS; the full suite runs each, the CI
    profile the first), the pattern the one error line must match (``names``), how the
    suite injects it, and for a SIGKILL the phase it lands in."""

    key: str
    fault: str
    expected: str
    workloads: tuple[str, ...]
    how: str
    names: str = ""
    phase: str | None = None


FAULTS = (
    Fault("controller-restart", "the controller restarts mid-workload", SURVIVED,
          ("allreduce",), "failures: controller_restart at a random time in the ring"),
    Fault("link-flap", "a link goes down and comes back within the run", SURVIVED,
          ("allreduce",), "failures: link_down for 1-3 s (healed by the schedule) on one "
          "link of an aggregation switch, picked with the seed"),
    Fault("switch-flap", "a switch goes down and comes back within the run", SURVIVED,
          ("allreduce", "roce", "anycast"), "failures: switch_down for 0.5-3 s; AllReduce: "
          "half the core switches (mode percent), RoCE: one aggregation switch, anycast: one "
          "aggregation switch of the client's pod"),
    Fault("vswitchd-kill", "ovs-vswitchd is killed (SIGKILL)", FAILED_LOUDLY, ("allreduce",),
          "failures: kill daemon ovs-vswitchd (the run's own, userspace datapath)",
          names=r"ovs-vswitchd \(pid \d+\) died"),
    Fault("pause-agent-kill", "the PFC pause agent is killed during a lossless run",
          FAILED_LOUDLY, ("lossless",), "failures: kill daemon pause-agent in the PFC incast",
          names=r"pause agent \(pid \d+\) died"),
    Fault("rank-kill", "one rank is killed (SIGKILL)", FAILED_LOUDLY, ("allreduce",),
          "failures: kill daemon traffic on one host (mode one)", names=r"rank \d+ died"),
    Fault("rank-stop", "one rank is stopped (SIGSTOP) for longer than the run's timeout",
          FAILED_LOUDLY, ("allreduce",), "failures: stop daemon traffic on one host, for "
          "far longer than params.timeout_s", names=r"rank \d+ was stopped"),
    Fault("results-full", "the results folder is on a full tmpfs", FAILED_LOUDLY,
          ("small",), "--results on a 1 MiB tmpfs filled to the last byte",
          names=r"No space left on device"),
    Fault("results-read-only", "the results folder is not writable", FAILED_LOUDLY,
          ("small",), "--results on a read-only tmpfs", names=r"Read-only file system"),
    Fault("concurrent-run", "a second run starts while another holds the machine", REFUSED,
          ("small",), "the suite holds the run lock while the run starts",
          names=r"another testbed run is active"),
    Fault("sigkill-bring-up", "SIGKILL of the testbed process during bring-up", RECOVERED,
          ("small",), SIGKILL_HOW, phase=BRING_UP),
    Fault("sigkill-workload", "SIGKILL of the testbed process during the workload",
          RECOVERED, ("small",), SIGKILL_HOW, phase=WORKLOAD),
    Fault("sigkill-tear-down", "SIGKILL of the testbed process during tear-down", RECOVERED,
          ("small",), SIGKILL_HOW, phase=TEAR_DOWN),
)
FAULTS_BY_KEY = {f.key: f for f in FAULTS}
BASELINE = "plain-run"  # the trials that are no fault: the first run, the run after a SIGKILL
SETUPS = {"results-full": FULL_TMPFS, "results-read-only": READ_ONLY,
          "concurrent-run": LOCK_HELD}


def faults_markdown() -> str:
    """The table as the reliability page shows it (Markdown)."""
    lines = ["| fault | expected outcome | injected into | how |", "|---|---|---|---|"]
    for f in FAULTS:
        lines.append(f"| {f.fault} (`{f.key}`) | **{f.expected}**: {OUTCOMES[f.expected]} | "
                     f"{', '.join(f.workloads)} | {f.how} |")
    return "\n".join(lines)
