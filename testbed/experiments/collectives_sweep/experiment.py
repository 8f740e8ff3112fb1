"""nccl-tests on the emulated fabric: every collective swept over message sizes, with the
alpha-beta cost model's prediction beside each measurement.

One rank per host (``ranks`` of them, ``placement`` packed or spread), each running
testbed.traffic.collectives.sweep once per entry of ``sweeps`` (``op`` or ``op:algorithm``;
``auto`` picks the cheapest algorithm by the cost model at every size, as NCCL picks ring or
tree): sizes from ``min_bytes`` to ``max_bytes`` by ``step_factor``, ``warmup`` then ``iters``
timed iterations and one checked iteration per size, real float32 data, #wrong counted on
every rank. The ring AllReduce sweep runs on to ``busbw_claim_bytes`` at least, where its
busbw is judged against the link rate. The cost model's alpha and beta are derived from the
fabric description (testbed.plan.training.cost_links: bottleneck link rate and hop count
between ring neighbours), not from a ping-pong, so the prediction is the fabric's own.

Reports, per sweep and size, the nccl-tests row (size count type redop root time algbw busbw
#wrong) beside the predicted time; writes each sweep's table as text and every rank's JSON.
The emulator is judged over the largest size swept where the cost model expects it
bandwidth-bound (otherwise over the whole run, not bandwidth-bound), the generators' CPU over
every rank's measured window.
"""
from __future__ import annotations

import math

from pathlib import Path
from typing import Literal

from pydantic import Field, field_validator

from testbed.drive.ranks import RANK_PORT, RankWatch, host_problems, launches
from testbed.experiments.collectives_sweep.plots import plot_sweeps
from testbed.harness.experiment import Experiment, Params, SetupRun, distinct
from testbed.harness.scenario import Problem
from testbed.model.verdict import at_least, holds, near
from testbed.plan.training import cost_links, groups_argument, node_groups, place_hosts
from testbed.traffic.collectives.cost import ALLREDUCE
from testbed.traffic.collectives.data import ALGORITHMS, OPS
from testbed.traffic.collectives.sweep import AUTO, sweep_sizes

SWEEP_MODULE = "testbed.traffic.collectives.sweep"
MIB = 2**20
DEFAULT_SWEEPS = ["allreduce:ring", "allreduce:auto", "allgather", "reducescatter", "alltoall",
                  "broadcast"]
RING_ALLREDUCE = (ALLREDUCE, "ring")
HIERARCHICAL = "hierarchical"
GBYTE_TO_MBIT = 8e3
# A size the cost model expects at half the link rate or more is bandwidth-bound: there the
# busiest link must carry close to its rate (testbed.measure.fidelity's delivery check).
BANDWIDTH_BOUND_FRACTION = 0.5


def parse_sweep(entry: str) -> tuple[str, str]:
    """``op`` or ``op:algorithm`` -> (op, algorithm); the op's first algorithm by default."""
    op, _, algorithm = entry.partition(":")
    if op not in OPS:
        raise ValueError(f"unknown collective {op!r} in {entry!r}; known: {', '.join(OPS)}")
    algorithm = algorithm or ALGORITHMS[op][0]
    if algorithm != AUTO and algorithm not in ALGORITHMS[op]:
        raise ValueError(f"{op} has no algorithm {algorithm!r}; known: "
                         f"{', '.join(ALGORITHMS[op])}, {AUTO}")
    return op, algorithm


def sweep_name(op: str, algorithm: str) -> str:
    return f"{op}-{algorithm}"


class SweepParams(Params):
    """The sweeps (``op`` or ``op:algorithm``, algorithm ``auto`` for the cost model's
    choice), the sizes (nccl-tests' -b, -e, -f), warm-up and timed iterations per size (-w,
    -n), TCP channels per peer, how many ranks and where; the size from which the ring
    AllReduce's busbw must reach ``expect_busbw_fraction`` of the link rate, and how close
    the cost model must predict its time there."""

    sweeps: list[str] = Field(default_factory=lambda: list(DEFAULT_SWEEPS), min_length=1,
                              description="op or op:algorithm (auto: the cost model's "
                                          "choice), e.g. allreduce:ring,alltoall")
    min_bytes: int = Field(8, ge=4, le=1 << 30, description="smallest size (-b)")
    max_bytes: int = Field(2 * MIB, ge=4, le=1 << 30, description="largest size (-e)")
    step_factor: int = Field(2, ge=2, le=1024, description="size multiplier (-f)")
    warmup: int = Field(1, ge=0, le=100, description="warm-up iterations per size (-w)")
    iters: int = Field(2, ge=1, le=1000, description="timed iterations per size (-n)")
    channels: int = Field(4, ge=1, le=16, description="TCP connections per peer")
    ranks: int | None = Field(None, ge=2, description="ranks (default: every host)")
    placement: Literal["packed", "spread"] = Field("packed", description="which hosts: "
                                                   "the first ones, or spread evenly")
    busbw_claim_bytes: int = Field(8 * MIB, ge=4, le=1 << 30,
                                   description="the ring AllReduce sweep runs at least to "
                                               "this size, where its busbw is judged")
    expect_busbw_fraction: float = Field(0.9, gt=0, le=1,
                                         description="ring AllReduce busbw / link rate from "
                                                     "busbw_claim_bytes on")
    prediction_tolerance: float = Field(0.2, gt=0, le=10,
                                        description="|measured / predicted - 1| allowed for "
                                                    "the ring AllReduce at its largest size")

    @field_validator("sweeps")
    @classmethod
    def _sweeps(cls, values: list[str]) -> list[str]:
        return distinct(values, "a sweep", [parse_sweep(v) for v in values])


class CollectivesSweep(Experiment):
    name = "collectives-sweep"
    title = "nccl-tests collective sweep"
    Params = SweepParams
    captions = {
        "busbw.png": ("Measured (solid) against predicted (dashed) per size: small sizes are "
                      "latency-bound, large ones should approach the link-rate line."),
    }
    # Every size's collective is a run of latency-bound exchanges between the ranks (the
    # small sizes nothing else): on the hosts' one CPU beside a pinned ovs-vswitchd the
    # bundled sweep's ranks waited 0.72 threads for a core, 0.31 unpinned (docs/capacity.md).
    min_host_cpus = 2

    # -- plans ------------------------------------------------------------------------------
    def plan(self) -> list[tuple[str, str, int]]:
        """(op, algorithm, largest size) of every sweep: the ring AllReduce runs on to the
        busbw claim's size."""
        p = self.params
        out = []
        for entry in p.sweeps:
            op, algorithm = parse_sweep(entry)
            top = max(p.max_bytes, first_size_at_least(p.min_bytes, p.busbw_claim_bytes,
                                                       p.step_factor)) \
                if (op, algorithm) == RING_ALLREDUCE else p.max_bytes
            out.append((op, algorithm, top))
        return out

    def hosts(self, fabric) -> list[str]:
        return place_hosts(fabric, self.params.ranks or len(fabric.hosts), self.params.placement)

    def groups(self, fabric, hosts: list[str]) -> list[list[int]] | None:
        """Node groups when a sweep can use them (hierarchical, or auto with hierarchical
        among its candidates) and they are groups: more than one, not all single ranks."""
        wanted = any(algorithm in (HIERARCHICAL, AUTO) and HIERARCHICAL in ALGORITHMS[op]
                     for op, algorithm, _ in self.plan())
        groups = node_groups(fabric, hosts)
        if not wanted or len(groups) < 2 or all(len(g) == 1 for g in groups):
            return None
        return groups

    def problems(self) -> list[Problem]:
        p = self.params
        problems = []
        if p.max_bytes < p.min_bytes:
            problems.append(Problem(("params", "max_bytes"), f"must be at least min_bytes "
                                    f"({p.min_bytes}), got {p.max_bytes}"))
        fabric = self.fabric()
        if p.ranks is not None:
            problems += host_problems(fabric, "ranks", p.ranks)
        if not problems and any(a == HIERARCHICAL for _, a, _ in self.plan()) and \
                self.groups(fabric, self.hosts(fabric)) is None:
            problems.append(Problem(("params", "sweeps"), "hierarchical needs ranks in "
                                    "several groups of more than one (NVSwitch-like nodes or "
                                    "hosts sharing an edge switch)"))
        return problems

    def setups(self):
        return [self.scenario_setup()]

    def headline(self) -> str:
        fabric = self.fabric()
        p = self.params
        return (f"{self.title}: {', '.join(p.sweeps)}, {p.min_bytes} B to "
                f"{max(top for *_, top in self.plan()) / MIB:g} MiB x{p.step_factor}, "
                f"{len(self.hosts(fabric))} ranks on {fabric.label()} at {self.rate_mbit:g} "
                "Mbit/s")

    def rank_args(self, op: str, algorithm: str, top: int, cost, groups) -> list[str]:
        """A sweep's arguments beside the rank and addresses (the same on every rank)."""
        p = self.params
        out = ["--op", op, "--algo", algorithm, "-b", str(p.min_bytes), "-e", str(top),
               "-f", str(p.step_factor), "-w", str(p.warmup), "-n", str(p.iters),
               "--channels", str(p.channels), "--seed", str(self.scenario.seed), *cost.argv()]
        if groups is not None:
            out += ["--groups", groups_argument(groups)]
        return out

    # -- on a running fabric ----------------------------------------------------------------
    def measure(self, run: SetupRun) -> dict:
        fabric = run.net.fabric
        hosts = self.hosts(fabric)
        ips = [fabric.nodes[h].ip for h in hosts]
        groups = self.groups(fabric, hosts)
        cost = cost_links(fabric, hosts, groups)
        run.log(f"cost model: {cost.to_dict()['source']}: {cost.to_dict()['link']}")
        sweeps = {}
        with RankWatch(run) as watch:
            for index, (op, algorithm, top) in enumerate(self.plan()):
                name = sweep_name(op, algorithm)
                total = len(sweep_sizes(self.params.min_bytes, top, self.params.step_factor))
                ranks = launches(SWEEP_MODULE, hosts, ips,
                                 self.rank_args(op, algorithm, top, cost, groups),
                                 RANK_PORT + index)
                results = watch.run_ranks(ranks, f"{name} sweep", total, prefix=f"{name}-rank")
                sweeps[name] = sweep_result(results)
                (run.workdir / f"nccl-tests-{name}.txt").write_text(results[0]["table"] + "\n")
                run.log(f"{name}:\n{results[0]['table']}")
        window = judged_window(sweeps, self.rate_mbit)
        return {"hosts": hosts, "cost_model": cost.to_dict(), "sweeps": sweeps,
                "link_rate_mbit": self.rate_mbit,
                "fidelity": watch.fidelity(window, bandwidth_bound=window is not None),
                "window_monotonic_s": [watch.watch.t_start, watch.watch.t_end]}

    # -- judging and showing ----------------------------------------------------------------
    def checks(self, results):
        r = results["fabric"]
        p = self.params
        checks = [holds(f"{name}: #wrong", s["wrong_total"] == 0 and s["verified_ranks"] ==
                        s["world"], f"every rank held the expected result at every size "
                        f"({s['verified_ranks']}/{s['world']} ranks, {s['wrong_total']} wrong "
                        "elements)", measured=s["wrong_total"], expected=0)
                  for name, s in r["sweeps"].items()]
        ring = r["sweeps"].get(sweep_name(*RING_ALLREDUCE))
        if ring is not None:
            claimed = [row for row in ring["rows"] if row["size_bytes"] >= p.busbw_claim_bytes]
            if not claimed:
                checks.append(at_least("ring AllReduce busbw / link rate", None,
                                       p.expect_busbw_fraction, "fraction",
                                       f"no size reached {p.busbw_claim_bytes} B"))
            for row in claimed:
                fraction = row["busbw_mbit_s"] / r["link_rate_mbit"]
                checks.append(at_least(
                    f"ring AllReduce busbw / link rate at {row['size_bytes']} B",
                    round(fraction, 4), p.expect_busbw_fraction, "fraction",
                    f"busbw {row['busbw_mbit_s']:.2f} Mbit/s is {fraction:.0%} of the "
                    f"{r['link_rate_mbit']:g} Mbit/s link rate (expected at least "
                    f"{p.expect_busbw_fraction:.0%})"))
            top = ring["rows"][-1]
            ratio = top["time_us"] / top["predicted_us"] if top["predicted_us"] else None
            checks.append(near("ring AllReduce time / predicted at the largest size",
                               None if ratio is None else round(ratio, 4), 1.0,
                               p.prediction_tolerance, "ratio",
                               f"at {top['size_bytes']} B the ring took {top['time_us'] / 1e6:.3f}"
                               f" s, the cost model from the fabric predicted "
                               f"{top['predicted_us'] / 1e6:.3f} s"))
        return checks

    def rows(self, results):
        r = results["fabric"]
        rate = r["link_rate_mbit"]
        rows = [("cost model", f"{r['cost_model']['source']}: link "
                               f"{r['cost_model']['link']}")]
        for name, s in r["sweeps"].items():
            for row in s["rows"]:
                rows.append((f"{name} {row['size_bytes']} B", row_cell(row, rate)))
        return rows

    def plots(self, results, folder: Path, title: str) -> list[Path]:
        r = results["fabric"]
        if not r["sweeps"]:
            return []
        return [plot_sweeps(r["sweeps"], r["link_rate_mbit"], title, folder / "busbw.png")]


LEAN_KEYS = ("size_bytes", "count", "type", "redop", "root", "algorithm", "time_us",
             "time_us_max", "algbw_gbyte_s", "busbw_gbyte_s", "algbw_mbit_s", "busbw_mbit_s",
             "wrong", "predicted_us", "predicted_busbw_gbyte_s", "window_monotonic_s")


def sweep_result(results: list[dict]) -> dict:
    """A sweep's ranks' results as the setup keeps them: rank 0's rows (the job's view),
    how many ranks verified, and their TCP counters."""
    head = results[0]
    return {"op": head["op"], "algorithm": head["algorithm"], "world": head["world"],
            "channels": head["channels"], "rows": [{k: row[k] for k in LEAN_KEYS}
                                                   for row in head["results"]],
            "wrong_total": head["wrong_total"],
            "verified_ranks": sum(bool(x["verified"]) for x in results),
            "cost_model": head["cost_model"],
            "tcp": {"segments_sent": head["tcp_out_segs"],
                    "segments_retransmitted": head["tcp_retrans_segs"]},
            "timed_window_monotonic_s": head["timed_window_monotonic_s"]}


def first_size_at_least(min_bytes: int, size_bytes: int, factor: float) -> int:
    """The first size of the sweep from ``min_bytes`` by ``factor`` that reaches
    ``size_bytes`` (with -f 3 from 1 B, 8 MiB is only reached at 12.7 MB)."""
    size = max(min_bytes, 1)
    while size < size_bytes:
        size *= factor
    return math.ceil(size)  # as -e: sweep_sizes keeps a size while it is at most this


def judged_window(sweeps: dict, rate_mbit: float) -> list[float] | None:
    """Where the emulator is judged bandwidth-bound: the largest size of any sweep (the
    first sweep's on a tie), if the cost model expects its busbw at
    ``BANDWIDTH_BOUND_FRACTION`` of the link rate or more; None otherwise (the run is then
    judged as a whole, not bandwidth-bound)."""
    rows = [s["rows"][-1] for s in sweeps.values() if s["rows"]]
    if not rows:
        return None
    top = max(rows, key=lambda row: row["size_bytes"])  # max keeps the first of equals
    predicted_mbit = top["predicted_busbw_gbyte_s"] * GBYTE_TO_MBIT
    return top["window_monotonic_s"] if predicted_mbit >= BANDWIDTH_BOUND_FRACTION * rate_mbit \
        else None


def row_cell(row: dict, rate_mbit: float) -> str:
    """One nccl-tests row with the prediction beside it."""
    return (f"count {row['count']} {row['type']} {row['redop']} root "
            f"{row['root']} ({row['algorithm']}): time {row['time_us']:.1f} us, algbw "
            f"{row['algbw_gbyte_s']:.6f} GB/s, busbw {row['busbw_gbyte_s']:.6f} GB/s = "
            f"{row['busbw_mbit_s'] / rate_mbit:.0%} of the link, #wrong {row['wrong']}; "
            f"predicted {row['predicted_us']:.1f} us")
