"""Running a lab and finding its runs: the thin layer over the harness. Each lab run gets a
folder of its own, and each of its scenarios runs there through ``run_scenario``, exactly as
``testbed run`` runs it (lock, ledger, checks, trust, report):

    results/labs/
      index.md, index.html               every lab's latest run and self-check (make lab)
      NN-slug/<YYYYMMDD-HHMMSS>-labNN-<hex>/
        lab.json                          what ran: the form (full or short), each run's folder
        <run name>/<run-id>/              the run folder of one scenario (summary.json, ...)
        walkthrough.json, transcript.md   lab 00: the replayed commands and their output
        self-check.json, .md, .html       the self-check, once judged
"""
from __future__ import annotations

import datetime
import json
from dataclasses import dataclass, field
from pathlib import Path

from testbed.apply.network import check_root
from testbed.errors import ConfigError, TestbedError
from testbed.experiments.registry import load
from testbed.harness.console import print_summary
from testbed.harness.provenance import SOURCE_ROOT
from testbed.harness.report import load_summary
from testbed.harness.run import new_run_id, run_scenario
from testbed.harness.scenario import parse_yaml, read_text
from testbed.lab.index import self_check_html, self_check_markdown
from testbed.lab.judge import ItemResult, NOT_JUDGED, SelfCheck, judge
from testbed.lab.spec import Lab
from testbed.lab.walkthrough import (
    judge_steps,
    load_runs,
    load_steps,
    replay,
    save_runs,
    transcript_markdown,
)
from testbed.model.verdict import FAIL, PASS

LABS_RESULTS = "labs"
RECORD = "lab.json"
REPLAY_FILE, TRANSCRIPT = "walkthrough.json", "transcript.md"
SELF_CHECK = "self-check"
FULL, SHORT = "full", "short"


@dataclass
class LabRun:
    """One run of a lab: its folder, form, and each scenario's run folder (or error)."""

    folder: Path
    lab: str
    form: str
    runs: dict[str, str] = field(default_factory=dict)  # run name -> run folder
    errors: dict[str, str] = field(default_factory=dict)  # run name -> why it failed
    replay: str | None = None  # lab 00: walkthrough.json

    def save(self) -> None:
        (self.folder / RECORD).write_text(json.dumps(
            {"lab": self.lab, "form": self.form, "runs": self.runs, "errors": self.errors,
             "replay": self.replay}, indent=1))

    @classmethod
    def load(cls, folder: Path) -> LabRun:
        try:
            data = json.loads((folder / RECORD).read_text())
        except (OSError, ValueError):
            raise ConfigError(str(folder), f"not a lab run folder (no readable {RECORD})") \
                from None
        return cls(folder, data.get("lab", ""), data.get("form", FULL), data.get("runs", {}),
                   data.get("errors", {}), data.get("replay"))


def lab_results(results_dir: Path, lab: Lab) -> Path:
    return Path(results_dir) / LABS_RESULTS / lab.name


def run_lab(lab: Lab, results_dir: Path, short: bool = False, log=print,
            only: set[str] | None = None, overrides: dict | None = None) -> LabRun:
    """Every scenario of ``lab`` (its shortened form with ``short``; those named in ``only``,
    with ``overrides``' dotted fields on top), one after the other; a run that fails is
    recorded and the next one runs. Root."""
    folder = lab_results(results_dir, lab) / new_run_id(f"lab{lab.number:02d}")
    folder.mkdir(parents=True)
    record = LabRun(folder.resolve(), lab.name, SHORT if short else FULL)
    record.save()
    if lab.manifest.replay:
        replay_walkthrough(lab, record, log)
    runs = [r for r in lab.manifest.runs if only is None or r.name in only]
    for index, run in enumerate(runs, 1):
        log(f"lab {lab.name}: run {index}/{len(runs)} {run.name} ({run.scenario}, "
            f"{record.form} form)")
        record.runs[run.name], error = run_one(lab, run, folder / run.name, short, log,
                                               overrides or {})
        if error:
            record.errors[run.name] = error
            log(f"lab {lab.name}: run {run.name} failed: {error}")
        record.save()
    return record


def run_one(lab: Lab, run, results: Path, short: bool, log, overrides: dict
            ) -> tuple[str, str]:
    """One scenario through the harness: (its run folder, why it failed or "")."""
    resolved = load(lab.scenario_path(run), {**(run.short if short else {}), **overrides,
                                             "results_dir": str(results)})
    try:
        outcome = run_scenario(resolved, log=lambda m: log(f"  {m}"))
    except TestbedError as exc:
        folders = sorted(p for p in results.glob("*") if p.is_dir())
        return (str(folders[-1].resolve()) if folders else ""), str(exc)
    print_summary(outcome.summary)
    return str(Path(outcome.workdir).resolve()), ""


def replay_walkthrough(lab: Lab, record: LabRun, log) -> None:
    """Lab 00: the page's commands replayed, their output kept beside the lab run."""
    check_root()
    steps = load_steps(lab.folder / lab.manifest.replay)
    runs = replay(steps, SOURCE_ROOT, log=lambda m: log(f"lab {lab.name}: {m}"))
    save_runs(runs, record.folder / REPLAY_FILE)
    (record.folder / TRANSCRIPT).write_text(transcript_markdown(runs, judge_steps(steps, runs)))
    record.replay = REPLAY_FILE
    record.save()


def latest_run(results_dir: Path, lab: Lab) -> LabRun:
    """The newest lab run folder of ``lab`` (run folders sort by their time stamp)."""
    root = lab_results(results_dir, lab)
    folders = sorted(p for p in root.glob("*") if (p / RECORD).is_file()) if root.is_dir() \
        else []
    if not folders:
        raise ConfigError(f"lab {lab.number}", f"no run under {root}: `sudo .venv/bin/testbed "
                          f"lab run {lab.number}` first, or give a run folder")
    return LabRun.load(folders[-1])


def summaries_of(record: LabRun) -> dict[str, dict]:
    """Run name -> summary.json, for the runs of ``record`` that wrote one."""
    found = {}
    for name, folder in record.runs.items():
        try:
            found[name] = json.loads((Path(folder) / "summary.json").read_text())
        except (OSError, ValueError):
            continue
    return found


def match_run_folders(lab: Lab, folders: list[Path]) -> tuple[dict[str, dict], dict[str, str]]:
    """Run folders given by hand, each matched to the lab's run whose scenario it ran (by the
    scenario's name): (run name -> summary, run name -> folder)."""
    by_scenario = {}
    for run in lab.manifest.runs:
        path = lab.scenario_path(run)
        by_scenario[parse_yaml(read_text(path), str(path)).get("name")] = run.name
    summaries, dirs = {}, {}
    for folder in folders:
        summary = load_summary(folder)
        name = (summary.get("scenario") or {}).get("name")
        if name not in by_scenario:
            raise ConfigError(str(folder), f"a run of scenario {name!r}, not one of lab "
                              f"{lab.number}'s ({', '.join(sorted(map(str, by_scenario)))})")
        summaries[by_scenario[name]] = summary
        dirs[by_scenario[name]] = str(folder)
    return summaries, dirs


def check_lab_run(lab: Lab, record: LabRun) -> SelfCheck:
    """The self-check of a lab run: lab 00's replay against its companion file, any other
    lab's items against its runs' summaries."""
    if lab.manifest.replay:
        return check_replay(lab, record)
    return judge(lab, summaries_of(record), record.runs)


def check_replay(lab: Lab, record: LabRun) -> SelfCheck:
    steps = load_steps(lab.folder / lab.manifest.replay)
    if not record.replay or not (record.folder / record.replay).is_file():
        items = [ItemResult(s.text, "walkthrough", NOT_JUDGED, "-", "-", "not replayed")
                 for s in steps]
    else:
        results = judge_steps(steps, load_runs(record.folder / record.replay))
        items = [ItemResult(r.text, "walkthrough", PASS if r.passed else FAIL,
                            "as expected" if r.passed else "differs", "the page's shape",
                            "; ".join(r.problems)) for r in results]
    return SelfCheck(lab.name, lab.title, items, {"walkthrough": str(record.folder)})


def write_self_check(check: SelfCheck, folder: Path) -> list[Path]:
    """self-check.json, .md and .html in a lab run folder."""
    paths = [folder / f"{SELF_CHECK}.json", folder / f"{SELF_CHECK}.md",
             folder / f"{SELF_CHECK}.html"]
    data = {**check.to_dict(), "judged_at": datetime.datetime.now(
        datetime.timezone.utc).isoformat(timespec="seconds")}
    paths[0].write_text(json.dumps(data, indent=1))
    paths[1].write_text(self_check_markdown(check, folder))
    paths[2].write_text(self_check_html(check, folder))
    return paths
