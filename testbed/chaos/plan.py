"""A suite planned from a seed, as plain data: which runs, with which faults (each a
scenario's failure schedule, testbed.harness.scenario.FailureSpec, where the fault is one),
when, in what order, and how long each may take. The same seed and profile give the same
plan; nothing here runs anything.

Two profiles: ``full`` (every row of the table on every workload it lists, five SIGKILLs per
phase; planned within 30 minutes on a 2-CPU machine) and ``ci`` (every row on its first
workload, shorter rings, one SIGKILL per phase; within 10 minutes). Estimates are planning
figures for such a machine (what the README's runs took), not measurements; the suite
records the real times.
"""
from __future__ import annotations

import random
from dataclasses import dataclass, field, replace

from testbed.apply.state import BRING_UP, PHASES, TEAR_DOWN, WORKLOAD
from testbed.chaos.table import (
    BASELINE,
    FAULTS,
    FAULTS_BY_KEY,
    PASSES,
    RECOVERED,
    SETUPS,
)
from testbed.harness.scenario import merge, parse_yaml, read_text

DATA_VERIFIED = "data verified on every rank"  # the AllReduce experiment's integrity check
CLEAN_S = 10.0  # about how long `testbed clean` takes after a killed run
# How far into the small run a phase ends, about: where a SIGKILL in it lands at the latest.
KILLED_BY_S = {BRING_UP: 10.0, WORKLOAD: 18.0, TEAR_DOWN: 21.0}
# A SIGKILL lands within this share of a phase's usual length: a run's phase may be shorter
# than the plain run's it was learnt from (tear-down takes about 0.17 s, and a kill planned
# at 94% of it missed twice in one suite when the run finished first).
KILL_SPAN = 0.6
SETUP_RUN_S = 15.0  # a run refused or failed before its fabric exists
STOPPED_FOR_S = 3600.0  # a stopped rank stays stopped far beyond any run's timeout
HANG_MARGIN_S = 120.0  # past its time limit by this much, a run counts as hung and is ended


@dataclass(frozen=True)
class Workload:
    """What a fault is injected into: a bundled scenario with ``settings`` (dotted fields),
    the checks that must pass for its data to count as verified (``integrity``), about how
    long a run takes (``run_s``), when after the workload starts a fault may start and for
    how long it lasts, and which switches a switch flap takes down (a failures entry's
    target fields)."""

    key: str
    scenario: str
    settings: dict
    integrity: tuple[str, ...]
    run_s: float
    fault_at_s: tuple[float, float] = (0.0, 0.0)
    fault_for_s: tuple[float, float] = (1.0, 3.0)
    switches: dict = field(default_factory=dict)


RING = "fattree-allreduce"
WORKLOADS = {w.key: w for w in (
    Workload("small", RING, {"params.size_bytes": 262_144, "params.iters": 1,
                             "params.warmup": 0, "params.expect_busbw_fraction": 0.5},
             (DATA_VERIFIED,), run_s=30.0, fault_at_s=(1.0, 3.0)),
    # 2 MiB: 5.3 s per ring iteration at 6 Mbit/s, 1 + 3 iterations: 26 s of ring after the
    # ranks' start; faults start within it and are healed well before it ends
    Workload("allreduce", RING, {"params.expect_busbw_fraction": 0.3, "params.timeout_s": 300.0},
             (DATA_VERIFIED,), run_s=50.0, fault_at_s=(6.0, 14.0), fault_for_s=(1.0, 3.0),
             switches={"switches": {"role": "core"}, "mode": "percent", "value": 50}),
    Workload("allreduce-short", RING, {"params.iters": 2, "params.warmup": 0,
                                       "params.expect_busbw_fraction": 0.3,
                                       "params.timeout_s": 300.0},
             (DATA_VERIFIED,), run_s=35.0, fault_at_s=(5.0, 8.0), fault_for_s=(1.0, 2.0),
             switches={"switches": {"role": "core"}, "mode": "percent", "value": 50}),
    Workload("roce", RING, {"params.transport": "roce", "params.iters": 2, "params.warmup": 0,
                            "params.expect_busbw_fraction": 0.3, "params.timeout_s": 300.0},
             (DATA_VERIFIED,), run_s=45.0, fault_at_s=(5.0, 8.0), fault_for_s=(1.0, 2.0),
             switches={"switches": {"role": "aggregation"}, "mode": "one"}),
    # the experiment's own cut is at 1.5 s and its repair at 3.5 s: the flap comes after both
    Workload("anycast", "fattree-anycast-failover", {"params.duration_s": 8.0},
             ("switch-over to the far replica", "back to the near replica",
              "outage (requests lost x interval)"), run_s=30.0, fault_at_s=(4.5, 5.5),
             fault_for_s=(0.5, 1.0),
             switches={"switches": {"role": "aggregation", "pod": 0}, "mode": "one"}),
    Workload("lossless", "pfc-lossless", {"params.rounds": 30, "params.capture_pauses": False},
             (), run_s=45.0, fault_at_s=(1.0, 3.0)),
)}


@dataclass(frozen=True)
class Profile:
    """How much a suite runs: ``kills_per_phase`` SIGKILLs that must land in each phase
    (and ``spare_kills`` more tries per phase, run only when a kill lands elsewhere), every
    workload of a row or its first (``every_workload``), workloads swapped for shorter ones
    (``substitutes``), the stopped rank's run timeout, and the time it must fit in."""

    name: str
    budget_s: float
    kills_per_phase: int
    spare_kills: int
    every_workload: bool
    rank_timeout_s: float
    substitutes: dict = field(default_factory=dict)


PROFILES = {
    "full": Profile("full", 30 * 60, kills_per_phase=5, spare_kills=3, every_workload=True,
                    rank_timeout_s=60.0),
    "ci": Profile("ci", 10 * 60, kills_per_phase=1, spare_kills=1, every_workload=False,
                  rank_timeout_s=30.0, substitutes={"allreduce": "allreduce-short"}),
}


@dataclass(frozen=True)
class Trial:
    """One run of the suite: the fault (a table key, or BASELINE for a plain run), its
    workload, the scenario's seed, the failure schedule and other scenario fields it adds,
    its environment, how its results folder is set up (table.SETUPS), where a SIGKILL goes
    (phase, and the fraction of that phase's usual length after it starts), the outcome it
    must have, the time it must end in (``within_s``) and its planning estimate. A
    ``spare`` runs only when the kills before it missed their phase."""

    index: int
    fault: str
    workload: str
    seed: int
    expected: str
    failures: tuple = ()
    settings: dict = field(default_factory=dict)
    env: dict = field(default_factory=dict)
    setup: str | None = None
    kill_phase: str | None = None
    kill_fraction: float | None = None
    within_s: float = 0.0
    estimate_s: float = 0.0
    spare: bool = False

    @property
    def name(self) -> str:
        return f"{self.index:02d}-{self.fault}"

    @property
    def hang_s(self) -> float:
        """Past this the run is ended as hung."""
        return self.within_s + HANG_MARGIN_S


@dataclass(frozen=True)
class SuitePlan:
    seed: int
    profile: Profile
    trials: tuple[Trial, ...]

    def estimate_s(self, spares: bool = False) -> float:
        return sum(t.estimate_s for t in self.trials if spares or not t.spare)


def between(rng: random.Random, span: tuple[float, float]) -> float:
    """A time drawn uniformly in ``span``, to 0.1 s."""
    return round(rng.uniform(*span), 1)


def fault_trial(fault_key: str, workload: Workload, rng: random.Random,
                profile: Profile) -> Trial:
    """The trial injecting one fault into one workload (its index set later)."""
    fault = FAULTS_BY_KEY[fault_key]
    at_s = between(rng, workload.fault_at_s)
    for_s = between(rng, workload.fault_for_s)
    failures, settings, env = (), dict(workload.settings), {}
    within_s = 2 * workload.run_s
    if fault_key == "controller-restart":
        failures = ({"at_s": at_s, "action": "controller_restart"},)
    elif fault_key == "link-flap":
        failures = ({"at_s": at_s, "for_s": for_s, "action": "link_down",
                     "links": {"role": "aggregation"}, "mode": "one"},)
    elif fault_key == "switch-flap":
        failures = ({"at_s": at_s, "for_s": for_s, "action": "switch_down",
                     **workload.switches},)
    elif fault_key == "vswitchd-kill":
        failures = ({"at_s": at_s, "action": "kill", "daemon": "ovs-vswitchd"},)
        env = {"TESTBED_DATAPATH": "user"}  # the run's own ovs-vswitchd, never the machine's
    elif fault_key == "pause-agent-kill":
        failures = ({"at_s": at_s, "action": "kill", "daemon": "pause-agent"},)
    elif fault_key == "rank-kill":
        failures = ({"at_s": at_s, "action": "kill", "daemon": "traffic", "hosts": {},
                     "mode": "one"},)
    elif fault_key == "rank-stop":
        failures = ({"at_s": at_s, "for_s": STOPPED_FOR_S, "action": "stop",
                     "daemon": "traffic", "hosts": {}, "mode": "one"},)
        settings["params.timeout_s"] = profile.rank_timeout_s
        within_s = workload.run_s + profile.rank_timeout_s
    estimate_s = SETUP_RUN_S if fault_key in SETUPS else within_s / 2
    if fault_key == "rank-stop":
        estimate_s = within_s
    return Trial(0, fault_key, workload.key, rng.randrange(1, 2**31 - 1), fault.expected,
                 failures, settings, env, SETUPS.get(fault_key), within_s=within_s,
                 estimate_s=estimate_s)


def plain_trial(rng: random.Random) -> Trial:
    """A run with no fault that must pass: the suite's first, and the run after a kill."""
    small = WORKLOADS["small"]
    return Trial(0, BASELINE, small.key, rng.randrange(1, 2**31 - 1), PASSES,
                 settings=dict(small.settings), within_s=3 * small.run_s,
                 estimate_s=small.run_s)


def kill_trial(phase: str, rng: random.Random, spare: bool) -> Trial:
    """A SIGKILL of the testbed process at a random point of ``phase`` (within its first
    KILL_SPAN of its usual length); the suite then runs
    `testbed clean` and a plain run (counted in this trial's estimate)."""
    small = WORKLOADS["small"]
    fault = next(f for f in FAULTS if f.phase == phase)
    return Trial(0, fault.key, small.key, rng.randrange(1, 2**31 - 1), RECOVERED,
                 settings=dict(small.settings), kill_phase=phase,
                 kill_fraction=round(rng.random() * KILL_SPAN, 3), within_s=3 * small.run_s,
                 estimate_s=KILLED_BY_S[phase] + CLEAN_S + small.run_s, spare=spare)


def plan_suite(profile: Profile, seed: int) -> SuitePlan:
    """The suite for ``profile`` and ``seed``: a plain run first, then every fault row on its
    workloads and the SIGKILLs of every phase in an order shuffled with the seed, and the
    spare kills last."""
    rng = random.Random(seed)
    trials = []
    for fault in FAULTS:
        if fault.expected == RECOVERED:
            continue
        workloads = fault.workloads if profile.every_workload else fault.workloads[:1]
        for key in workloads:
            workload = WORKLOADS[profile.substitutes.get(key, key)]
            trials.append(fault_trial(fault.key, workload, rng, profile))
    trials += [kill_trial(phase, rng, spare=False) for phase in PHASES
               for _ in range(profile.kills_per_phase)]
    rng.shuffle(trials)
    trials = [plain_trial(rng), *trials]
    trials += [kill_trial(phase, rng, spare=True) for phase in PHASES
               for _ in range(profile.spare_kills)]
    return SuitePlan(seed, profile, tuple(replace(t, index=i) for i, t in enumerate(trials)))


def trial_scenario(trial: Trial) -> dict:
    """The scenario a trial runs, as the mapping written to its folder: the workload's
    bundled scenario with the trial's fields, failure schedule, seed and name."""
    workload = WORKLOADS[trial.workload]
    data = parse_yaml(read_text(workload.scenario), workload.scenario)
    fields = {**trial.settings, "name": f"chaos-{trial.fault}", "seed": trial.seed}
    if trial.failures:
        fields["failures"] = [dict(entry) for entry in trial.failures]
    return merge(data, fields)
