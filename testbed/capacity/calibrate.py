"""What link rate this machine emulates faithfully: ``testbed calibrate`` searches for the
highest rate at which the default workload (the k=4 fat-tree's 16-rank ring AllReduce) is
trustworthy and delivers at least 90% of the link rate in busbw, and stores it with a
description of the machine. Runs whose scenario fixes no rate take the calibrated rate times
a margin; without a calibration for this machine they say so and take a safe rate.

The search doubles the rate from ``start_mbit`` while runs pass, then bisects between the last
pass and the first failure until the bracket is within ``resolution``. Each trial moves about
the same number of seconds of data whatever its rate (the AllReduce size scales with it), so a
trial takes about half a minute.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path

from testbed.capabilities import detect
from testbed.errors import TestbedError
from testbed.experiments.registry import load
from testbed.harness.calibration import Calibration, machine_description, save_calibration
from testbed.harness.run import run_scenario
from testbed.model.topology import build
from testbed.model.topology.base import Fabric

SAFE_RATE_MBIT = 6.0      # trustworthy on a busy 2-core machine with no calibration
MARGIN = 0.8              # runs take this share of the calibrated rate
MIN_BUSBW_FRACTION = 0.9  # a trial passes at busbw >= 90% of the link rate, and trusted
START_MBIT = 25.0
MAX_MBIT = 1600.0
RESOLUTION = 0.15         # stop when the bracket's upper end is within 15% of its lower end
ITERATION_S = 2.0         # seconds of the k=4 ring's traffic per iteration at the trial's rate
WORLD = 16                # ranks of the k=4 fat-tree


def trial_size_bytes(rate_mbit: float, world: int = WORLD,
                     iteration_s: float | None = None) -> int:
    """The AllReduce size whose ring moves ``iteration_s`` of data at ``rate_mbit``: busbw =
    size / t * 2(n-1)/n, so size = rate * t * n / (2(n-1)); a multiple of 4 KiB. By default
    every ring step lasts as long as the k=4 ring's (``ITERATION_S`` over its 2(n-1) steps),
    so a larger world's steps are not shorter and its per-step latency weighs no more."""
    if iteration_s is None:
        iteration_s = ITERATION_S * (world - 1) / (WORLD - 1)
    size = rate_mbit * 1e6 / 8 * iteration_s * world / (2 * (world - 1))
    return max(4096, int(size) // 4096 * 4096)


@dataclass
class Trial:
    rate_mbit: float
    busbw_fraction: float | None
    trusted: bool
    reasons: list[str] = field(default_factory=list)
    forwarded_mbit: float | None = None  # every switch port's sending rate, summed
    run_dir: str | None = None

    @property
    def passed(self) -> bool:
        return self.trusted and (self.busbw_fraction or 0.0) >= MIN_BUSBW_FRACTION


def next_rate(trials: list[Trial], start_mbit: float = START_MBIT,
              max_mbit: float = MAX_MBIT, resolution: float = RESOLUTION) -> float | None:
    """The next rate to try, or None when the search is done: double while every trial
    passed, then bisect (geometrically) between the best pass and the lowest failure."""
    if not trials:
        return start_mbit
    passes = [t.rate_mbit for t in trials if t.passed]
    fails = [t.rate_mbit for t in trials if not t.passed]
    if not fails:
        top = max(passes)
        return None if top >= max_mbit else min(top * 2, max_mbit)
    low_fail = min(fails)
    if not passes:
        return None if low_fail <= start_mbit / 8 else low_fail / 2
    best = max(p for p in passes if p < low_fail) if any(p < low_fail for p in passes) else None
    if best is None:
        return low_fail / 2
    if low_fail <= best * (1 + resolution):
        return None
    return round((best * low_fail) ** 0.5, 1)


def result_of(trials: list[Trial]) -> float | None:
    """The highest rate that passed below every failure (None if none passed)."""
    fails = [t.rate_mbit for t in trials if not t.passed]
    ceiling = min(fails, default=float("inf"))
    passes = [t.rate_mbit for t in trials if t.passed and t.rate_mbit < ceiling]
    return max(passes, default=None)


def forwarded_mbit(result: dict, fabric) -> float:
    """The fabric's aggregate forwarded switch-hop throughput over a run's measured window:
    what every switch port sent, summed (each hop a packet crosses counts once)."""
    switches = {s.name for s in fabric.switches}
    rates = {f"{l.a}->{l.b}": l.rate_mbit for l in fabric.links}
    rates.update({f"{l.b}->{l.a}": l.rate_mbit for l in fabric.links})
    return sum(util * rates[label] for label, util in result["link_utilisation"].items()
               if label.split("->")[0] in switches and rates.get(label))


def ring_topology(k: int) -> dict:
    """The fat-tree whose ring a ceiling is searched on: the k=4 tree with every host (the
    calibrated workload); larger trees with one rank per edge switch (k^2/2 ranks), so the
    search measures the fabric's switches rather than how many Python ranks the hosts' CPUs
    run (the k=8 tree's 128 ranks saturate a 2-core machine at 5 Mbit/s)."""
    return {"name": "fattree", "k": k} if k <= 4 else {"name": "fattree", "k": k,
                                                       "hosts_per_edge": 1}


def ring_world(topology: dict) -> int:
    """How many ranks the ring on ``topology`` has: one per host."""
    params = {key: value for key, value in topology.items() if key != "name"}
    return len(build(topology["name"], **params).hosts)


def trial(rate_mbit: float, topology: dict, results_dir: str, log=print) -> Trial:
    """One run of the ring on ``topology`` (a fat-tree, ring_topology) at ``rate_mbit``,
    judged."""
    label = "".join(f"-{key}{value}" for key, value in topology.items() if key != "name")
    resolved = load("fattree-allreduce", {
        "link_rate_mbit": rate_mbit,
        "params.size_bytes": trial_size_bytes(rate_mbit, ring_world(topology)),
        "params.warmup": 1, "params.iters": 2, "results_dir": results_dir,
        "topology": topology, "name": f"ceiling{label}-{rate_mbit:g}"})
    try:
        outcome = run_scenario(resolved, log=lambda m: None)
    except TestbedError as exc:
        return Trial(rate_mbit, None, False, [str(exc)])
    result = outcome.summary["results"]["fabric"]
    fabric = Fabric.load_json(Path(result["dir"]) / "fabric.json")
    return Trial(rate_mbit, result["busbw_fraction_of_link"], outcome.verdict.emulator_trusted,
                 outcome.verdict.reasons, round(forwarded_mbit(result, fabric), 1),
                 str(outcome.workdir))


def search(k: int = 4, log=print, start_mbit: float = START_MBIT, max_mbit: float = MAX_MBIT,
           results_dir: str = "results") -> list[Trial]:
    """The trials of the search for the ceiling of the k-ary fat-tree's ring
    (ring_topology) on this machine."""
    topology = ring_topology(k)
    world = ring_world(topology)
    trials: list[Trial] = []
    while (rate := next_rate(trials, start_mbit, max_mbit)) is not None:
        log(f"k={k} trial {len(trials) + 1}: {rate:g} Mbit/s, {world} ranks, "
            f"{trial_size_bytes(rate, world) / 2**20:.1f} MiB AllReduce")
        t = trial(rate, topology, results_dir, log)
        trials.append(t)
        busbw = "-" if t.busbw_fraction is None else f"{t.busbw_fraction:.3f}"
        log(f"  busbw {busbw} of the link, "
            f"{'trusted' if t.trusted else 'NOT trusted: ' + '; '.join(t.reasons)}: "
            f"{'pass' if t.passed else 'fail'}")
    return trials


def calibrate(log=print, start_mbit: float = START_MBIT, max_mbit: float = MAX_MBIT,
              results_dir: str = "results", path: Path | None = None) -> Calibration:
    """Run the search on this machine (root) and store the result."""
    import datetime

    trials = search(4, log, start_mbit, max_mbit, results_dir)
    best = result_of(trials)
    if best is None:
        raise TestbedError(f"no rate passed (the lowest tried: {min(t.rate_mbit for t in trials):g}"
                           " Mbit/s); see the trials' run folders")
    calibration = Calibration(best, MARGIN, machine_description(detect()),
                              [asdict(t) for t in trials],
                              datetime.datetime.now().isoformat(timespec="seconds"))
    where = save_calibration(calibration, path)
    log(f"calibrated: the k=4 ring holds {best:g} Mbit/s; runs take {calibration.run_rate_mbit:g}"
        f" Mbit/s (x{MARGIN:g}); stored in {where}")
    return calibration
