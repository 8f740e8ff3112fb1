"""``testbed chaos``: its flags and what it does with them (testbed.cli registers it)."""
from __future__ import annotations

import argparse
import secrets

from testbed.apply.state import Ledger
from testbed.chaos.plan import PROFILES, plan_suite
from testbed.chaos.report import plan_rows, report_lines, report_rows
from testbed.chaos.suite import Suite
from testbed.errors import ConfigError, TestbedError
from testbed.harness.console import print_rows, table_text
from testbed.harness.run import check_can_build, give_to_invoking_user

SEED_MAX = 2**31 - 1


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--profile", choices=sorted(PROFILES), default="full",
                        help="full: every row on every workload, 5 SIGKILLs per phase, within "
                             "30 minutes; ci: every row once, 1 SIGKILL per phase, within 10")
    parser.add_argument("--seed", type=int, help="the suite's random seed (default: a new one, "
                        "printed; the same seed plans the same suite)")
    parser.add_argument("--results", default="results", help="where the suite's folder goes "
                        "(default results/)")
    parser.add_argument("--plan", action="store_true",
                        help="print the planned runs and exit (no root needed)")


def cmd_chaos(args) -> int:
    """Plan the suite from the seed, run it, print the table; 0 when every row held."""
    import datetime
    from pathlib import Path

    if args.seed is not None and not 0 <= args.seed <= SEED_MAX:
        raise ConfigError("--seed", f"must be in [0, {SEED_MAX}], got {args.seed}")
    seed = args.seed if args.seed is not None else secrets.randbelow(SEED_MAX) + 1
    plan = plan_suite(PROFILES[args.profile], seed)
    print(f"[chaos] seed {seed} (repeat with --seed {seed}); profile {args.profile}: "
          f"{sum(not t.spare for t in plan.trials)} runs planned, about "
          f"{plan.estimate_s() / 60:.0f} minutes, at most {plan.profile.budget_s / 60:.0f}",
          flush=True)
    if args.plan:
        print(table_text(plan_rows(plan)[1:], plan_rows(plan)[0]))
        return 0
    check_can_build()
    if Ledger.load() is not None:
        raise TestbedError("an earlier run left its ledger on this machine: run `testbed "
                           "clean` first, so the suite's snapshots start clean")
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    folder = Path(args.results) / f"chaos-{stamp}-seed{seed}"
    folder.mkdir(parents=True)
    try:
        summary = Suite(plan, folder, lambda m: print(f"[chaos] {m}", flush=True)).run()
    finally:
        give_to_invoking_user(folder)
    print_rows(report_rows(summary), title="Faults")
    for line in report_lines(summary):
        print(line)
    print(f"summary: {folder / 'summary.json'}")
    return 0 if summary["passed"] else 1
