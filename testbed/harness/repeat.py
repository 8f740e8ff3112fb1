"""A scenario run N times, each run on a fabric of its own built afresh, reported as one
result: every headline number (the summary rows' numbers and every check's measured value)
with its median, min, max and N, and a verdict that passes only when every run completed,
every judged check of every run passed and the emulator was trusted in every run; its
reasons name the runs that did not pass and why.

    results/<repeat-id>/
      summary.json       kind "repeat" (testbed.harness.summary_schema.RepeatSummary)
      report.md, report.html, plots/spread.png
      <run-id>/          each run's folder, exactly as a single run leaves it

``aggregate`` and the functions it uses are pure: they work on the runs' summaries alone.
``run_repeated`` makes the runs (``testbed run SCENARIO --repeat N``).
"""
from __future__ import annotations

import dataclasses
import statistics
import time
from dataclasses import dataclass
from pathlib import Path

from testbed.errors import ConfigError, TestbedError
from testbed.harness.plots import plot_spread
from testbed.harness.report import write_report
from testbed.harness.run import _now, give_to_invoking_user, new_run_id, run_scenario
from testbed.harness.summary_schema import (
    COMPLETE,
    FAILED,
    INTERRUPTED,
    REPEAT,
    SCHEMA_VERSION,
    is_number,
    read_summary,
    run_reasons,
    show,
    show_value,
    spread_text,
    write_summary,
)
from testbed.model.verdict import FAIL, NOT_JUDGED, PASS

NOT_RUN = "-"  # a check's outcome in a run that did not judge it
SPREAD_PLOT_PANELS = 16  # headline numbers drawn in plots/spread.png
SPREAD_CAPTION = ("Each run's value of every headline number (dots) and their median (line): "
                  "where the dots spread, one run alone would have misled.")


# --- the spread of a number over the runs ------------------------------------------------------


def spread(values: list, unit: str) -> dict:
    """Median, min and max of the runs' values (those that are numbers), how many there are
    (``n``), and each run's value in order (None where a run has no number)."""
    per_run = [float(v) if is_number(v) else None for v in values]
    numbers = [v for v in per_run if v is not None]
    return {"median": statistics.median(numbers) if numbers else None,
            "min": min(numbers, default=None), "max": max(numbers, default=None),
            "n": len(numbers), "unit": unit, "values": per_run}


# --- rows and checks over the runs -------------------------------------------------------------


def aggregate_rows(summaries: list[dict]) -> list[dict]:
    """The summary rows of every run, row by row (by ``what``, in the order they first
    appear) and number by number (by name): each number's spread, and a text of the spreads;
    a row without numbers keeps its text, marked where the runs' texts differ."""
    rows: dict[str, list[dict | None]] = {}
    for index, summary in enumerate(summaries):
        for row in summary.get("rows") or []:
            rows.setdefault(row["what"], [None] * len(summaries))[index] = row
    out = []
    for what, per_run in rows.items():
        names: dict[str, str] = {}  # number name -> unit, in order
        for row in per_run:
            for n in (row or {}).get("numbers", []):
                names.setdefault(n["name"], n["unit"])
        numbers = []
        for name, unit in names.items():
            values = [next((n["value"] for n in (row or {}).get("numbers", [])
                            if n["name"] == name), None) for row in per_run]
            numbers.append({"name": name, **spread(values, unit)})
        if numbers:
            text = "; ".join(spread_text(n) if n["name"] == what or len(numbers) == 1
                             else f"{n['name']} {spread_text(n)}" for n in numbers)
        else:
            texts = [row["text"] for row in per_run if row is not None]
            text = texts[0] if len(set(texts)) == 1 else f"differs between runs; run 1: " \
                f"{texts[0]}"
        out.append({"what": what, "text": text, "numbers": numbers})
    return out


def check_outcome(outcomes: list[str]) -> bool | None:
    """A check over the runs: failed if any run failed it, passed if every run that judged
    it passed, None when none judged it."""
    if FAIL in outcomes:
        return False
    return True if PASS in outcomes else None


def aggregate_checks(summaries: list[dict], key: str = "checks") -> list[dict]:
    """The checks (``key`` "checks") or the trust checks ("trust") of every run, check by
    check (by name and setup): the measured values' spread, each run's outcome."""
    checks: dict[tuple, list[dict | None]] = {}
    for index, summary in enumerate(summaries):
        for check in (summary.get("verdict") or {}).get(key, []):
            slot = checks.setdefault((check["name"], check.get("setup")),
                                     [None] * len(summaries))
            slot[index] = check
    out = []
    for (name, setup), per_run in checks.items():
        first = next(c for c in per_run if c is not None)
        measured = [c["measured"] if c else None for c in per_run]
        outcomes = [c["outcome"] if c else NOT_RUN for c in per_run]
        out.append({"name": name, "setup": setup, "unit": first["unit"],
                    "expected": first["expected"],
                    "measured": spread(measured, first["unit"])
                    if any(is_number(m) for m in measured) else None,
                    "outcomes": outcomes, "passed": check_outcome(outcomes)})
    return out


# --- the runs and the verdict --------------------------------------------------------------------


def run_passed(summary: dict) -> tuple[bool, bool]:
    """(every judged check passed, the emulator was trusted) of one run's summary."""
    verdict = summary.get("verdict") or {}
    checks_passed = not any(c["outcome"] == FAIL for c in verdict.get("checks", []))
    return checks_passed, bool(verdict.get("emulator_trusted"))


def run_entry(summary: dict, folder: Path) -> dict:
    """A run as the repeat's summary lists it, its folder relative to the repeat's."""
    checks_passed, trusted = run_passed(summary)
    run_dir = Path(summary["results_dir"])
    return {"run_id": summary["run_id"],
            "dir": str(run_dir.relative_to(folder)) if run_dir.is_relative_to(folder)
            else str(run_dir),
            "status": summary["status"], "error": summary.get("error"),
            "checks_passed": checks_passed, "emulator_trusted": trusted,
            "wall_s": summary.get("wall_s")}


def repeat_verdict(summaries: list[dict], asked: int) -> dict:
    """Passes only when all ``asked`` runs were made and each completed with every judged
    check passed and the emulator trusted; ``reasons`` say which runs did not, and why."""
    per_run = [run_reasons(f"run {index} ({s['run_id']})", s)
               for index, s in enumerate(summaries, 1)]
    reasons = [r for run in per_run for r in run]
    passed_runs = sum(1 for run in per_run if not run)
    if len(summaries) < asked:
        reasons.append(f"only {len(summaries)} of the {asked} runs asked for were made")
    return {"passed": passed_runs == asked and len(summaries) == asked, "runs_asked": asked,
            "runs_made": len(summaries), "runs_passed": passed_runs, "reasons": reasons}


def aggregate(summaries: list[dict], asked: int, repeat_id: str, folder: Path) -> dict:
    """The repeat's summary (without its timing, status and report) from its runs'
    summaries, in run order."""
    first = summaries[0]
    return {"schema_version": SCHEMA_VERSION, "kind": REPEAT, "run_id": repeat_id,
            "experiment": first["experiment"], "title": first["title"],
            "headline": f"{first['headline']}, {asked} runs",
            "provenance": first["provenance"], "results_dir": str(folder),
            "scenario": first["scenario"], "params": first["params"],
            "link_rate_mbit": first["link_rate_mbit"], "repeat": asked,
            "runs": [run_entry(s, folder) for s in summaries],
            "rows": aggregate_rows(summaries), "checks": aggregate_checks(summaries),
            "trust": aggregate_checks(summaries, "trust"),
            "verdict": repeat_verdict(summaries, asked)}


def spread_series(summary: dict, most: int = SPREAD_PLOT_PANELS) -> list[tuple[str, dict]]:
    """The headline numbers of a repeat's summary as (label, spread), rows' numbers first,
    then the checks' measured values; at most ``most``, only those some run measured."""
    series = [(n["name"] if n["name"] == row["what"] else f"{row['what']}: {n['name']}", n)
              for row in summary["rows"] for n in row["numbers"]]
    series += [(c["name"] + (f" [{c['setup']}]" if c.get("setup") else ""), c["measured"])
               for c in summary["checks"] if c["measured"] is not None]
    return [(label, s) for label, s in series if s["n"]][:most]


# --- running it --------------------------------------------------------------------------------


@dataclass
class RepeatOutcome:
    """What a repeated run left: its summary (as written), its folder and each run's
    testbed.harness.run.Outcome."""

    summary: dict
    workdir: Path
    outcomes: list

    def exit_status(self, accept_failed: bool = False, accept_untrusted: bool = False) -> int:
        """0: every run asked for was made and each exits 0 (with the same acceptances);
        1 otherwise."""
        if len(self.outcomes) < self.summary["repeat"]:
            return 1
        return max((o.exit_status(accept_failed, accept_untrusted) for o in self.outcomes),
                   default=1)


def eta_text(index: int, total: int, elapsed_s: float) -> str:
    """`` (about 4 min left)`` before run ``index`` of ``total`` (from 1), at the pace of the
    runs so far; empty before the first."""
    if index == 1:
        return ""
    left_s = elapsed_s / (index - 1) * (total - index + 1)
    minutes, seconds = divmod(round(left_s), 60)
    return f" (about {minutes} min {seconds:02d} s left)" if minutes else \
        f" (about {seconds} s left)"


def outcome_line(outcome) -> str:
    """One line on how a run ended: its checks and the emulator's trust."""
    counts = (outcome.summary.get("verdict") or {}).get("counts", {})
    return (f"{outcome.status}, {counts.get(PASS, 0)} checks passed, {counts.get(FAIL, 0)} "
            f"failed, {counts.get(NOT_JUDGED, 0)} not judged; emulator "
            f"{'trusted' if outcome.verdict.emulator_trusted else 'NOT trusted'}")


def run_repeated(resolved, repeat: int, log=print, progress=None) -> RepeatOutcome:
    """Run a resolved scenario (testbed.harness.experiment.Resolved) ``repeat`` times, each
    run on a fabric of its own (``run_scenario``), its folder inside the repeat's; then
    write the repeat's summary.json, report and spread plot. A run that fails or is
    interrupted stops the repeat: what the runs so far measured is still written, and the
    error re-raised."""
    if not isinstance(repeat, int) or isinstance(repeat, bool) or repeat < 1:
        raise ConfigError("repeat", f"must be a whole number of runs, at least 1, not {repeat!r}")
    scenario = resolved.scenario
    repeat_id = new_run_id(f"{scenario.name}-x{repeat}")
    folder = Path(scenario.results_dir) / repeat_id
    inner = dataclasses.replace(resolved, scenario=scenario.model_copy(
        update={"results_dir": str(folder)}))
    log(f"repeat {repeat_id}: {repeat} runs of {scenario.name}, each on a fresh fabric")
    outcomes: list = []
    timing = {"started_at": _now(), "t0": time.monotonic()}
    status, error = FAILED, None
    try:
        for index in range(1, repeat + 1):
            log(f"run {index}/{repeat}{eta_text(index, repeat, time.monotonic() - timing['t0'])}")
            outcome = run_scenario(inner, log=log, progress=progress)
            outcomes.append(outcome)
            log(f"run {index}/{repeat}: {outcome_line(outcome)}")
        status = COMPLETE
    except KeyboardInterrupt:
        status, error = INTERRUPTED, "interrupted"
        raise
    except BaseException as exc:
        error = str(exc) if isinstance(exc, TestbedError) else repr(exc)
        raise
    finally:
        summaries = run_summaries(folder, outcomes)
        summary = None
        if summaries:
            summary = finish_repeat(summaries, repeat, repeat_id, folder, timing, status,
                                    error)
            give_to_invoking_user(folder)
            log(f"repeat {repeat_id}: {summary['verdict']['runs_passed']}/{repeat} runs "
                f"passed; {folder / 'summary.json'}")
    return RepeatOutcome(summary, folder, outcomes)


def run_summaries(folder: Path, outcomes: list) -> list[dict]:
    """The summaries of the runs made, in order: those that returned, then the one that
    stopped the repeat (its folder is the one no outcome names)."""
    summaries = [read_summary(o.workdir) for o in outcomes]
    known = {Path(o.workdir).resolve() for o in outcomes}
    if folder.is_dir():
        for run_dir in sorted(p for p in folder.iterdir() if (p / "summary.json").exists()):
            if run_dir.resolve() not in known:
                summaries.append(read_summary(run_dir))
    return summaries


def finish_repeat(summaries: list[dict], asked: int, repeat_id: str, folder: Path,
                  timing: dict, status: str, error: str | None) -> dict:
    """The repeat's summary.json, spread plot and report, from its runs' summaries."""
    summary = aggregate(summaries, asked, repeat_id, folder)
    summary.update(status=status, error=error, started_at=timing["started_at"],
                   finished_at=_now(), wall_s=round(time.monotonic() - timing["t0"], 3),
                   plots=[], report=None)
    series = spread_series(summary)
    if series:
        (folder / "plots").mkdir(exist_ok=True)
        path = plot_spread(series, f"{repeat_id} | {summary['headline']}",
                           folder / "plots" / "spread.png")
        summary["plots"] = [{"path": str(path.relative_to(folder)), "caption": SPREAD_CAPTION}]
    write_summary(folder, summary)
    summary["report"] = [str(p.relative_to(folder)) for p in write_report(summary, folder)]
    write_summary(folder, summary)
    return summary
