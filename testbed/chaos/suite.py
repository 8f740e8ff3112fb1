"""The thin part of the suite that touches the machine: it runs each planned trial as a real
``testbed run`` (its own process, its own session), injects what the scenario's failure
schedule cannot (a SIGKILL of the testbed process at a point of the phase the run's ledger
names; a results folder on a full or read-only tmpfs; the run lock held), runs ``testbed
clean`` after a kill, takes a snapshot of the machine before and after every trial, and hands
what it saw to the judge (testbed.chaos.outcome). Root, like every run.

    results/chaos-<stamp>-seed<N>/
      summary.json                 the suite: seed, profile, counts, rows, every trial
      trials/<NN>-<fault>/         scenario.yaml, run.out, run.err, results/<run-id>/,
                                   clean.out, next/ (the plain run after a SIGKILL)
"""
from __future__ import annotations

import datetime
import errno
import json
import os
import signal
import subprocess
import sys
import time
from contextlib import contextmanager
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import yaml

from testbed.apply.state import PHASES, Ledger, RunLock
from testbed.chaos import leftovers as machine_state
from testbed.chaos.outcome import ENDED, Observation, judge, row_summaries, suite_verdict
from testbed.chaos.plan import WORKLOADS, SuitePlan, Trial, trial_scenario
from testbed.chaos.table import BASELINE, FULL_TMPFS, LOCK_HELD, PASSES
from testbed.errors import TestbedError
from testbed.system.process import stop_process

TESTBED = [sys.executable, "-m", "testbed"]
POLL_S = 0.01  # how often the ledger is read while a run goes: SIGKILLs land this close
TERM_GRACE_S = 60.0  # a hung run's clean-up after SIGTERM, before SIGKILL
CLEAN_TIMEOUT_S = 180.0
TMPFS_FULL_OPTIONS = "size=1m,mode=0755"
TMPFS_READ_ONLY_OPTIONS = "ro,size=64k,mode=0755"
FILL_CHUNK_BYTES = (65_536, 4096, 1)
SCHEMA_VERSION = 1


def phase_durations(transitions: list[tuple[str, float]], ended_at: float | None) -> dict:
    """Seconds spent in each phase, from the (phase, start) transitions a run's ledger
    showed and the time it went away (None: still there); a phase entered twice (several
    setups) adds up."""
    durations: dict[str, float] = {}
    for (phase, start), nxt in zip(transitions, [*transitions[1:], (None, ended_at)]):
        if nxt[1] is not None and phase:
            durations[phase] = round(durations.get(phase, 0.0) + nxt[1] - start, 3)
    return durations


def kill_time(phase_start: float, fraction: float, usual_s: float) -> float:
    """When a SIGKILL at ``fraction`` of a phase lands: its start plus that share of how
    long the phase usually takes."""
    return phase_start + fraction * usual_s


@dataclass
class RunResult:
    """One process run to its end: exit status (None when killed by the suite), time, the
    phases its ledger went through, and where a SIGKILL landed."""

    exit_status: int | None
    elapsed_s: float
    transitions: list
    ended_at: float | None
    hung: bool = False
    landed: str | None = None


def read_ledger(owner: int) -> Ledger | None:
    """The run ledger, if it is ``owner``'s."""
    ledger = Ledger.load()
    return ledger if ledger is not None and ledger.owner_pid == owner else None


def run_process(argv: list[str], folder: Path, name: str, env: dict, hang_s: float,
                kill: tuple[str, float, float] | None = None) -> RunResult:
    """Run ``argv`` in a session of its own (stdout and stderr to ``name``.out and .err in
    ``folder``), following its ledger's phases; ``kill``: (phase, fraction, usual seconds of
    that phase): SIGKILL it there (or as soon as it is past it). A run still going after
    ``hang_s`` is ended as hung: SIGTERM (its own clean-up), then SIGKILL."""
    t0 = time.monotonic()
    transitions: list[tuple[str, float]] = []
    ended_at = None
    with open(folder / f"{name}.out", "wb") as out, open(folder / f"{name}.err", "wb") as err:
        proc = subprocess.Popen(argv, stdout=out, stderr=err, stdin=subprocess.DEVNULL,
                                cwd=folder, env={**os.environ, **env}, start_new_session=True)
    try:
        while proc.poll() is None:
            ledger = read_ledger(proc.pid)
            if ledger is not None and ledger.phase and (
                    not transitions or transitions[-1] != (ledger.phase, ledger.phase_t_monotonic_s)):
                transitions.append((ledger.phase, ledger.phase_t_monotonic_s))
            if ledger is None and transitions and ended_at is None:
                ended_at = time.monotonic()
            if kill is not None and ledger is not None and ledger.phase in PHASES:
                phase, fraction, usual_s = kill
                past = PHASES.index(ledger.phase) > PHASES.index(phase)
                due = ledger.phase == phase and time.monotonic() >= kill_time(
                    ledger.phase_t_monotonic_s, fraction, usual_s)
                if past or due:
                    proc.send_signal(signal.SIGKILL)
                    proc.wait()
                    after = read_ledger(proc.pid)
                    return RunResult(None, time.monotonic() - t0, transitions, ended_at,
                                     landed=after.phase if after is not None else ENDED)
            if time.monotonic() - t0 > hang_s:
                return end_hung(proc, t0, transitions, ended_at)
            time.sleep(POLL_S)
    except BaseException:  # the suite interrupted: the run cleans up after itself
        stop_process(proc, TERM_GRACE_S)
        raise
    if ended_at is None and transitions:
        ended_at = time.monotonic()
    landed = ENDED if kill is not None else None
    return RunResult(proc.returncode, time.monotonic() - t0, transitions, ended_at,
                     landed=landed)


def end_hung(proc: subprocess.Popen, t0: float, transitions, ended_at) -> RunResult:
    """A run past its time: SIGTERM (the testbed's clean-up path), SIGKILL after a grace."""
    stop_process(proc, TERM_GRACE_S)
    return RunResult(None, time.monotonic() - t0, transitions, ended_at, hung=True)


@contextmanager
def results_folder(setup: str | None, folder: Path):
    """Where a trial's run writes its results: a folder of its own, or one on a full or a
    read-only tmpfs (mounted here, unmounted after), or an ordinary one while the suite
    holds the run lock."""
    if setup is None:
        yield folder / "results"
        return
    if setup == LOCK_HELD:
        with RunLock("chaos: holding the machine while a second run is tried"):
            yield folder / "results"
        return
    mount = folder / "mnt"
    mount.mkdir()
    options = TMPFS_FULL_OPTIONS if setup == FULL_TMPFS else TMPFS_READ_ONLY_OPTIONS
    subprocess.run(["mount", "-t", "tmpfs", "-o", options, "testbed-chaos", str(mount)],
                   check=True, capture_output=True)
    try:
        if setup == FULL_TMPFS:
            fill(mount / "filler")
        yield mount
    finally:
        if subprocess.run(["umount", str(mount)], capture_output=True).returncode != 0:
            subprocess.run(["umount", "-l", str(mount)], capture_output=True)


def fill(path: Path) -> None:
    """Write ``path`` until its file system has no byte left."""
    with open(path, "wb", buffering=0) as fh:
        for size in FILL_CHUNK_BYTES:
            chunk = b"\0" * size
            try:
                while True:
                    fh.write(chunk)
            except OSError as exc:
                if exc.errno != errno.ENOSPC:
                    raise


def run_summary(results: Path) -> tuple[dict | None, list[str]]:
    """A results folder's run summary (the newest run's, None without one) and what is in
    the folder (the filler of a full tmpfs left out)."""
    try:
        entries = sorted(p.name for p in results.iterdir() if p.name != "filler")
    except OSError:
        return None, []
    summaries = sorted(results.glob("*/summary.json"), key=lambda p: p.stat().st_mtime)
    try:
        return (json.loads(summaries[-1].read_text()) if summaries else None), entries
    except (OSError, ValueError):
        return None, entries


class Suite:
    """Runs a SuitePlan into ``folder``, printing a line per trial through ``log``."""

    def __init__(self, plan: SuitePlan, folder: Path, log=print):
        self.plan = plan
        self.folder = folder.resolve()  # runs start in their trial's folder
        self.log = log
        self.done: list[tuple] = []
        self.not_run: list[Trial] = []
        self.usual_s = {phase: 1.0 for phase in PHASES}  # learnt from the plain runs

    def run(self) -> dict:
        """Every trial (a spare only while its phase lacks kills), then the verdict; returns
        the suite's summary (also written to summary.json)."""
        t0 = time.monotonic()
        started_at = now()
        try:
            for trial in self.plan.trials:
                if trial.spare and not self.needs_kill(trial.kill_phase):
                    continue
                if time.monotonic() - t0 > self.plan.profile.budget_s:
                    self.not_run.append(trial)
                    continue
                self.log(f"{trial.name} on {trial.workload}: expected {trial.expected}")
                verdict, obs = self.run_trial(trial)
                self.done.append((trial, verdict, obs))
                self.log(f"{trial.name}: {verdict.observed}: "
                         + ("as expected" if verdict.held else "NOT AS EXPECTED: "
                            + "; ".join(verdict.reasons)))
                if trial.index == 0 and not verdict.held:  # the plain run before any fault
                    self.write(started_at, time.monotonic() - t0, "the plain run failed")
                    raise TestbedError(f"the plain run before any fault did not pass "
                                       f"({'; '.join(verdict.reasons)}); nothing was injected: "
                                       f"see {self.folder / 'trials' / trial.name}")
        except KeyboardInterrupt:
            self.write(started_at, time.monotonic() - t0, "interrupted")
            raise
        return self.write(started_at, time.monotonic() - t0)

    def needs_kill(self, phase: str) -> bool:
        landed = sum(1 for t, _, o in self.done if t.kill_phase and o.landed == phase)
        return landed < self.plan.profile.kills_per_phase

    def run_trial(self, trial: Trial):
        folder = self.folder / "trials" / trial.name
        folder.mkdir(parents=True)
        obs = self.observe(trial, folder)
        integrity = WORKLOADS[trial.workload].integrity
        return judge(trial, obs, integrity), obs

    def observe(self, trial: Trial, folder: Path) -> Observation:
        """Run one trial and see what it did and left."""
        scenario = folder / "scenario.yaml"
        scenario.write_text(yaml.safe_dump(trial_scenario(trial), sort_keys=False))
        before = machine_state.snapshot()
        kill = None
        if trial.kill_phase is not None:
            kill = (trial.kill_phase, trial.kill_fraction, self.usual_s[trial.kill_phase])
        with results_folder(trial.setup, folder) as results:
            run = run_process([*TESTBED, "run", str(scenario), "--results", str(results)],
                              folder, "run", trial.env, trial.hang_s, kill)
            summary, created = run_summary(results)
        obs = Observation(run.exit_status, round(run.elapsed_s, 1),
                          (folder / "run.err").read_text(errors="replace"), summary, created,
                          hung=run.hung, landed=run.landed)
        if trial.expected == PASSES and run.exit_status == 0 and trial.workload == "small":
            self.learn(run)
        if kill is not None or run.hung:
            obs.clean_status = self.clean(folder)
        obs.leftovers = machine_state.leftovers(before, machine_state.snapshot())
        if any(obs.leftovers.values()) and obs.clean_status is None:
            obs.clean_status = self.clean(folder)  # the next trial starts on a clean machine
        if kill is not None:
            nxt = replace(trial, fault=BASELINE, expected=PASSES, kill_phase=None,
                          kill_fraction=None)
            (folder / "next").mkdir()
            obs.next_run = self.observe(nxt, folder / "next")
        return obs

    def learn(self, run: RunResult) -> None:
        """How long each phase of a plain small run takes, from its ledger."""
        for phase, seconds in phase_durations(run.transitions, run.ended_at).items():
            self.usual_s[phase] = max(seconds, POLL_S)

    def clean(self, folder: Path) -> int:
        """``testbed clean``; its exit status."""
        return run_process([*TESTBED, "clean"], folder, "clean", {}, CLEAN_TIMEOUT_S).exit_status

    def write(self, started_at: str, wall_s: float, stopped: str | None = None) -> dict:
        """summary.json (``stopped``: why the suite ended early); returns it."""
        verdict = suite_verdict(self.plan, self.done, wall_s, self.not_run)
        profile = self.plan.profile
        summary = {
            "schema_version": SCHEMA_VERSION, "kind": "chaos", "seed": self.plan.seed,
            "profile": profile.name,
            "command": f"testbed chaos --profile {profile.name} --seed {self.plan.seed}",
            "started_at": started_at, "finished_at": now(), "wall_s": round(wall_s, 1),
            "budget_s": profile.budget_s, "stopped": stopped,
            "passed": verdict.passed and stopped is None,
            "reasons": verdict.reasons + ([f"stopped: {stopped}"] if stopped else []),
            "counts": verdict.counts, "kills": verdict.kills,
            "kills_per_phase": profile.kills_per_phase, "usual_phase_s": self.usual_s,
            "rows": row_summaries(self.done),
            "trials": [trial_record(t, v, o) for t, v, o in self.done],
            "not_run": [t.name for t in self.not_run],
        }
        (self.folder / "summary.json").write_text(json.dumps(summary, indent=1, default=str))
        return summary


def trial_record(trial: Trial, verdict, obs: Observation) -> dict:
    """One trial in the suite's summary.json."""
    record = {**asdict(trial), "name": trial.name, **asdict(verdict),
              "exit_status": obs.exit_status, "elapsed_s": obs.elapsed_s,
              "landed": obs.landed, "clean_status": obs.clean_status,
              "left": {k: v for k, v in obs.leftovers.items() if v},
              "error_line": next((line for line in obs.stderr.splitlines()[::-1]
                                  if line.strip()), None),
              "run_dir": (obs.summary or {}).get("results_dir")}
    if obs.next_run is not None:
        record["next_run"] = {"exit_status": obs.next_run.exit_status,
                              "elapsed_s": obs.next_run.elapsed_s,
                              "left": {k: v for k, v in obs.next_run.leftovers.items() if v}}
    return record


def now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
