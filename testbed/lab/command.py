"""``testbed lab``: the teaching labs from the command line.

    testbed lab list                       every lab: number, title, what it runs
    testbed lab run N [--short]            run lab N's scenarios (root), then its self-check
    testbed lab run all [--short]          every lab, then the index page (make lab)
    testbed lab check N [RUN_DIR ...]      judge lab N's latest run, or the folders given
    testbed lab index                      the index page of every lab's latest run

Exit status as everywhere: 0 every item passed (on trusted runs), 1 an item failed or was
not judged, 2 bad input (no such lab, a malformed lab file, nothing to judge), 3 a run
failed, 130 interrupted.
"""
from __future__ import annotations

import argparse
from pathlib import Path

from testbed.apply.network import check_root
from testbed.apply.state import RunLock
from testbed.errors import EXIT_OK, EXIT_RUN_FAILED, EXIT_VERDICT, ConfigError, TestbedError
from testbed.harness.console import console, print_rows, table_text
from testbed.harness.run import give_to_invoking_user
from testbed.lab.index import index_rows, write_index
from testbed.lab.judge import judge
from testbed.lab.runner import (
    LABS_RESULTS,
    LabRun,
    RECORD,
    check_lab_run,
    lab_results,
    latest_run,
    match_run_folders,
    run_lab,
    write_self_check,
)
from testbed.lab.spec import all_labs, find_lab

ALL = "all"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The ``lab`` subcommands under ``parser`` (its own subparsers, of its class)."""
    sub = parser.add_subparsers(dest="lab_command", required=True, parser_class=type(parser))
    sub.add_parser("list", help="every lab: number, title and the scenarios it runs"
                   ).set_defaults(func=cmd_list)
    run = sub.add_parser("run", help="run a lab's scenarios (root), then judge its self-check")
    run.add_argument("lab", help="the lab's number, or all (every lab, then the index page)")
    run.add_argument("--short", action="store_true",
                     help="the shortened form (what CI runs): fewer iterations, shorter runs")
    run.add_argument("--results", default="results", help="results folder (default results)")
    run.set_defaults(func=cmd_run)
    check = sub.add_parser("check", help="judge a lab's latest run (or the run folders given)")
    check.add_argument("lab", help="the lab's number")
    check.add_argument("run_dirs", nargs="*", metavar="RUN_DIR",
                       help="a lab run folder, or run folders of the lab's scenarios")
    check.add_argument("--results", default="results", help="results folder (default results)")
    check.set_defaults(func=cmd_check)
    index = sub.add_parser("index", help="write results/labs/index.md and .html")
    index.add_argument("--results", default="results", help="results folder (default results)")
    index.set_defaults(func=cmd_index)


def lab_number(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise ConfigError("lab", f"a lab's number (testbed lab list), got {text!r}") from None


def cmd_list(args) -> int:
    rows = [[f"{lab.number:02d}", lab.title,
             ", ".join(r.scenario for r in lab.manifest.runs) or lab.manifest.replay,
             str(lab.folder / "README.md")] for lab in all_labs()]
    print(table_text(rows, ["lab", "title", "runs", "exercise"]))
    return EXIT_OK


def cmd_run(args) -> int:
    results = Path(args.results)
    labs = all_labs() if args.lab == ALL else [find_lab(lab_number(args.lab))]
    check_root()  # after the input is known good, before anything runs
    with RunLock("lab"):
        pass  # refused here, before anything is made, when another run or a fabric is up
    if args.lab == ALL:
        return run_all(labs, results, args.short)
    record, check = run_and_report(labs[0], results, args.short)
    return outcome_status(record, check)


def outcome_status(record, check) -> int:
    if record.errors:
        return EXIT_RUN_FAILED
    return EXIT_OK if check.passed else EXIT_VERDICT


def run_and_report(lab, results: Path, short: bool):
    """Run ``lab``, judge it, write its self-check beside it: (lab run, self-check)."""
    record = run_lab(lab, results, short, log=lambda m: print(f"[lab] {m}", flush=True))
    check = checked(lab, record)
    give_to_invoking_user(lab_results(results, lab))
    return record, check


def checked(lab, record):
    """The lab run's self-check, printed and written beside it."""
    check = check_lab_run(lab, record)
    write_self_check(check, record.folder)
    print_check(check)
    print(f"self-check: {record.folder / 'self-check.html'}")
    return check


def run_all(labs, results: Path, short: bool) -> int:
    """Every lab in turn (one failing does not stop the rest), then the index page."""
    statuses = []
    for lab in labs:
        try:
            statuses.append(outcome_status(*run_and_report(lab, results, short)))
        except ConfigError:
            raise  # bad input: nothing of the rest would fare better
        except TestbedError as exc:  # this lab could not run; the next one may
            print(f"[lab] lab {lab.name} failed: {exc}", flush=True)
            statuses.append(EXIT_RUN_FAILED)
    write_lab_index(labs, results)
    return max(statuses, default=EXIT_OK)


def cmd_check(args) -> int:
    lab = find_lab(lab_number(args.lab))
    folders = [Path(d) for d in args.run_dirs]
    if len(folders) == 1 and (folders[0] / RECORD).is_file() or not folders:
        record = LabRun.load(folders[0]) if folders else latest_run(Path(args.results), lab)
        if record.lab != lab.name:
            raise ConfigError(str(record.folder), f"a run of lab {record.lab}, not of lab "
                              f"{lab.name}")
        check = check_lab_run(lab, record)
        try:
            write_self_check(check, record.folder)
        except OSError:
            pass  # a folder not ours to write: the verdict is printed all the same
    elif lab.manifest.replay:
        raise ConfigError("run_dirs", f"lab {lab.number} is judged on a lab run folder (with "
                          f"{RECORD})")
    else:
        summaries, dirs = match_run_folders(lab, folders)
        check = judge(lab, summaries, dirs)
    print_check(check)
    return EXIT_OK if check.passed else EXIT_VERDICT


def cmd_index(args) -> int:
    for path in write_lab_index(all_labs(), Path(args.results)):
        print(f"wrote {path}")
    return EXIT_OK


def write_lab_index(labs, results: Path) -> list[Path]:
    def latest(lab):
        try:
            return latest_run(results, lab)
        except ConfigError:
            return None

    paths = write_index(index_rows(labs, latest), results / LABS_RESULTS)
    print(f"index: {paths[1]}")
    return paths


def print_check(check) -> None:
    print_rows(check.rows(), title=f"Lab {check.lab}: {check.title}")
    console().print(check.headline(), markup=False)
