"""Synthetic summaries of the labs' runs, with the structure real ones have: each lab
scenario is loaded and resolved as ``testbed lab run`` loads it, the results are built by
the experiments' own unit tests' helpers (what each ``measure`` returns), the verdict's
checks are the experiment's own ``checks`` on them, and the summary around them is the
harness's own (``start_summary``). Every number is chosen so that the experiment's checks
and the lab's items pass; ``violations`` then breaks each item."""
from __future__ import annotations

from pathlib import Path

from tests.unit.experiments.test_allreduce import rank
from tests.unit.experiments.test_collectives_sweep import results as sweep_results
from tests.unit.experiments.test_collectives_sweep import row as sweep_row
from tests.unit.experiments.test_data_parallel import run as ddp_run
from tests.unit.experiments.test_dctcp import GOOD_DROPTAIL, GOOD_ECN, result_of, results_of
from tests.unit.experiments.test_dragonfly_compare import results_with as dragonfly_results
from tests.unit.experiments.test_hedera import results_with as hedera_results
from tests.unit.experiments.test_parameter_server_experiment import phases
from tests.unit.experiments.test_pfc_demo import three_runs
from tests.unit.experiments.test_pipeline_experiment import summary as pipeline_summary
from tests.unit.experiments.test_roce_experiments import CAPTURE_OK, bottleneck, loss_result
from tests.unit.experiments.test_tensor_parallel_experiment import placements

from testbed.experiments.allreduce.experiment import ecmp_spread, summarise
from testbed.experiments.tensor_parallel.experiment import compare
from testbed.harness.run import COMPLETE, start_summary
from testbed.experiments.registry import load
from testbed.lab.spec import Lab
from testbed.model.verdict import Verdict, holds

GOOD_BUSBW = {"ring": 0.96, "hierarchical": 1.13}  # busbw / link rate by algorithm
HEDERA = {  # pattern: (non-blocking, ECMP, single-path), as docs/hedera.md measured
    "stride1": (0.980, 0.980, 0.976), "stride2": (0.980, 0.674, 0.491),
    "stride4": (0.977, 0.495, 0.246), "stride8": (0.976, 0.433, 0.247),
    "random": (0.975, 0.547, 0.397)}


def resolved_run(lab: Lab, run, short: bool):
    """The run's scenario as ``testbed lab run`` loads it (full or short form)."""
    return load(lab.scenario_path(run), run.short if short else {})


def summaries(lab: Lab, short: bool, folder: Path, trusted: bool = True) -> dict[str, dict]:
    """Run name -> a complete summary.json of that run, every check and item passing."""
    found = {}
    for run in lab.manifest.runs:
        resolved = resolved_run(lab, run, short)
        results = RESULTS[resolved.experiment.name](resolved, folder / run.name)
        found[run.name] = summary_of(resolved, results, trusted)
    return found


def summary_of(resolved, results: dict, trusted: bool = True) -> dict:
    """summary.json as the harness writes it for ``results``: the experiment's own checks,
    and one trust check."""
    summary = start_summary(resolved, "20260101-000000-synthetic-0000", Path("results/x"))
    verdict = Verdict(resolved.experiment.checks(results),
                      [holds("machine CPU busy", trusted, "synthetic")])
    summary.update(status=COMPLETE, results=results, verdict=verdict.to_dict(), wall_s=1.0)
    return summary


def allreduce(resolved, folder: Path) -> dict:
    e, setup = resolved.experiment, resolved.setups[0]
    p, world = e.params, len(setup.fabric.hosts)
    fraction = GOOD_BUSBW.get(p.algorithm, GOOD_BUSBW["ring"])
    seconds = p.size_bytes * 8 * 2 * (world - 1) / world / (fraction * e.rate_mbit * 1e6)
    ranks = [rank([seconds] * p.iters, [10.0, 10.0 + seconds * p.iters])
             for _ in range(world)]
    rates = {f"{a}->{b}": 0.9 * e.rate_mbit for link in setup.fabric.links
             for a, b in ((link.a, link.b), (link.b, link.a))}
    return {"fabric": {**summarise(ranks, p.size_bytes, e.rate_mbit), "transport": p.transport,
                       "ecmp": ecmp_spread(setup.fabric, setup.routing, rates),
                       "link_utilisation": {}}}


def dragonfly_routing(resolved, folder: Path) -> dict:
    return dragonfly_results({"minimal": (0.333, 0.784), "valiant": (0.42, 0.52),
                              "ugal": (0.65, 0.74), "ecmp": (0.60, 0.75)})


def anycast_failover(resolved, folder: Path) -> dict:
    p = resolved.experiment.params
    return {"fabric": {"failover": {"client": p.client, "far": "p3e1h1", "near": "p0e0h0",
                                    "interface": "p0e0-eth1", "to_far_s": 0.049,
                                    "back_to_near_s": 0.046, "requests_lost": 4,
                                    "requests": 600, "outage_s": 0.04}}}


def hedera(resolved, folder: Path) -> dict:
    patterns = resolved.experiment.params.patterns
    return hedera_results(
        {setup: {p: HEDERA[p][i] for p in patterns}
         for i, setup in enumerate(("nonblocking", "ecmp", "single"))},
        spread={"ecmp": [9.31, 9.84], "single": [19.15, 0.0]})


def roce_loss(resolved, folder: Path) -> dict:
    results = {}
    for p in resolved.experiment.params.loss_percents:
        roce = 18.93 if p == 0 else 18.93 * max(0.5, 1 - 0.5 * p)
        extra = {"capture": CAPTURE_OK} if p == 0 else {}
        results[f"loss-{p:g}"] = loss_result(p, roce, 18.72, **extra)
    return results


def dctcp(resolved, folder: Path) -> dict:
    return results_of(*(result_of(**good, senders=n)
                        for n in resolved.experiment.params.senders
                        for good in (GOOD_DROPTAIL, GOOD_ECN)))


def roce_dcqcn(resolved, folder: Path) -> dict:
    folder.mkdir(parents=True, exist_ok=True)
    limits = {"kmin_bytes": 5000, "kmax_bytes": 200_000, "xoff_bytes": 484_680}
    return {setup.name: bottleneck(folder, setup.name, int(setup.name[1]),
                                   "none" if setup.name.endswith("none") else "dcqcn",
                                   450_000 if setup.name.endswith("none") else 30_000,
                                   [9.5, 9.0], **limits)
            for setup in resolved.setups}


def pfc_demo(resolved, folder: Path) -> dict:
    runs = three_runs()
    runs["lossy"]["queue_drops"] = 161
    return runs


def collectives_sweep(resolved, folder: Path) -> dict:
    p = resolved.experiment.params
    rate = resolved.experiment.rate_mbit
    rows = [sweep_row(p.min_bytes, 0.001, 3e4, 1e4)]
    size = p.min_bytes
    while size < p.busbw_claim_bytes:
        size *= p.step_factor
        rows.append(sweep_row(size, 0.95 * rate, 1.1e6, 1.0e6))
    results = sweep_results(rows)
    results["fabric"]["link_rate_mbit"] = rate
    return results


def parameter_server(resolved, folder: Path) -> dict:
    p = resolved.experiment.params
    shards = phases(20000, 2.3 * 358400, 358400, 0.4)
    shards["async"] = {**shards["bsp"], "mode": "async", "step_s": 0.8}
    return {"fabric": {"servers": [f"s{i}" for i in range(p.servers)],
                       "workers": [f"w{i}" for i in range(p.workers)], "mtu_bytes": 9000,
                       "phases": {mode: shards[mode] for mode in [*p.modes, "allreduce"]}}}


def data_parallel(resolved, folder: Path) -> dict:
    p = resolved.experiment.params
    falls = {"resnet50": (0.99, 0.95), "gpt2_small": (0.50, 0.29)}
    runs = []
    for model in p.models:
        first, last = falls[model]
        for i, workers in enumerate(p.workers):
            efficiency = first + (last - first) * i / max(1, len(p.workers) - 1)
            runs.append(ddp_run(model, workers, efficiency, 1.0, 0.95))
    return {"fabric": {"runs": runs}}


def tensor_parallel(resolved, folder: Path) -> dict:
    p = placements()
    return {"fabric": {"placements": p, "comparison": compare(p)}}


def pipeline_parallel(resolved, folder: Path) -> dict:
    p = resolved.experiment.params
    stages, m = p.stages, p.micro_batches
    theory = (stages - 1) / (m + stages - 1)
    schedules = {}
    for name in p.schedules:
        peaks = [m] * stages if name == "gpipe" else [min(stages - s, m) for s in range(stages)]
        schedules[name] = {**pipeline_summary(round(theory * 1.04, 4), peaks),
                           "bubble_theory": theory, "peak_in_flight_expected": peaks}
    return {"fabric": {"schedules": schedules}}


RESULTS = {"allreduce": allreduce, "dragonfly-routing": dragonfly_routing,
           "anycast-failover": anycast_failover, "hedera": hedera, "roce-loss": roce_loss,
           "dctcp": dctcp, "roce-dcqcn": roce_dcqcn, "pfc-demo": pfc_demo,
           "collectives-sweep": collectives_sweep, "parameter-server": parameter_server,
           "data-parallel": data_parallel, "tensor-parallel": tensor_parallel,
           "pipeline-parallel": pipeline_parallel}

# Per lab, per run: values that break every item that judges a value (the items that judge
# an experiment's check are broken by failing that check).
VIOLATIONS: dict[int, dict[str, dict[str, object]]] = {
    1: {"one-spine": {"results.fabric.verified_ranks": 15,
                      "results.fabric.busbw_fraction_of_link": 0.5}},
    2: {"five-stage": {"results.fabric.busbw_fraction_of_link": 0.5},
        "three-stage": {"results.fabric.verified_ranks": 7}},
    3: {"single-path": {"results.fabric.verified_ranks": 15,
                        "results.fabric.busbw_fraction_of_link": 0.5}},
    4: {"routing": {"results.valiant.patterns.random.fraction_of_capacity": 0.9,
                    "results.valiant.patterns.shift.fraction_of_capacity": 0.3}},
    5: {"failover": {"results.fabric.failover.to_far_s": 0.5}},
    6: {"hedera": {"results.single.patterns.stride8.fraction_of_capacity": 0.5}},
    7: {"write": {"results.loss-0.roce_goodput_mbit": 5.0},
        "ring": {"results.fabric.transport": "tcp"}},
    8: {"loss": {'results."loss-1".tcp_goodput_mbit': 5.0}},
    9: {"dctcp": {"results.n2-ecn.queue.median_packets": 60.0, "results.n2-ecn.marks": 0}},
    10: {"pfc-demo": {"results.pfc.pause_frames_sent": 0, "results.lossy.queue_drops": 0}},
    11: {"hierarchical": {"results.fabric.verified_ranks": 15,
                          "results.fabric.busbw_mbit_s": 4.0}},
    12: {"sweep": {"results.fabric.sweeps.allreduce-ring.rows[0].busbw_mbit_s": 5.0}},
    13: {"ps": {"results.fabric.phases.allreduce.step_s": 0.9}},
    14: {"ddp": {"results.fabric.runs[model=gpt2_small][-1].scaling_efficiency": 0.99}},
    15: {"tp": {"results.fabric.comparison.bandwidth_ratio": 2.0}},
    16: {"pipeline": {"results.fabric.schedules.gpipe.bubble_measured": 0.5,
                      "results.fabric.schedules.1f1b.bubble_measured": 0.5}},
}
