"""Data-parallel training as PyTorch DDP runs it, as the number of workers grows.

For each model (ResNet-50, GPT-2 small: gradient buckets from their parameter shape tables,
testbed.traffic.training.models) and each worker count (2, 4, 8, 16 by default), the ranks
of testbed.traffic.training.ddp run on the first hosts of one fabric (host subsets of one
fabric, ``placement`` packed or spread): forward, then backward with each bucket's ring
AllReduce started as soon as its gradients are ready (overlapped, as DDP does), with compute
modelled from the model's FLOPs at ``device_gflops`` and bucket bytes scaled by ``scale`` so
a step takes about a second on the emulated links. Every bucket's sum is checked on every
rank.

Reported per run: step time (the slowest rank per step, averaged), communication time and
share, the exposed share (the part of the step communication adds past the backward pass),
scaling efficiency (weak scaling: the compute-only step, which is what one worker would
take, over the measured step), and beside them the step the cost model predicts from the
fabric (testbed.plan.training.cost_links) with the same overlap.
"""
from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field, field_validator

from testbed.drive.ranks import RANK_PORT, RankWatch, host_problems, launches
from testbed.experiments.data_parallel.plots import plot_scaling
from testbed.harness.experiment import Experiment, Params, SetupRun, distinct
from testbed.harness.scenario import Problem
from testbed.model.verdict import at_most, holds
from testbed.plan.training import cost_links, place_hosts

DDP_MODULE = "testbed.traffic.training.ddp"
MODEL_NAMES = ("resnet50", "gpt2_small")
# A run's scaling efficiency may come out this much above a smaller run's (timing noise)
# before more workers count as scaling better.
EFFICIENCY_NOISE = 0.03


def relative_error(measured: float, predicted: float) -> float | None:
    return None if not predicted else abs(measured / predicted - 1)


class DataParallelParams(Params):
    """The models and worker counts, the bytes sent per byte of gradient (``scale``), the
    modelled device speed and batch (images per step for ResNet-50, tokens for GPT-2), the
    steps, DDP's bucket cap, TCP channels per peer, where the workers run, and how close the
    measured step must come to the prediction."""

    models: list[Literal["resnet50", "gpt2_small"]] = Field(
        default_factory=lambda: list(MODEL_NAMES), min_length=1, description="models to train")
    workers: list[int] = Field(default_factory=lambda: [2, 4, 8, 16], min_length=1,
                               description="worker counts, each a run on that many hosts")
    scale: float = Field(0.002, gt=0, le=1, description="bytes sent per byte of gradient")
    device_gflops: float = Field(1000.0, gt=0, le=1e7,
                                 description="modelled device speed: compute = FLOPs / this")
    images_per_step: int = Field(32, ge=1, le=65536, description="ResNet-50 batch per worker")
    tokens_per_step: int = Field(1024, ge=1, le=1 << 24, description="GPT-2 tokens per worker")
    steps: int = Field(3, ge=1, le=100, description="measured steps per run")
    warmup_steps: int = Field(1, ge=0, le=100, description="steps before the measured ones")
    bucket_cap_mb: float = Field(25.0, gt=0, le=1024, description="DDP's bucket_cap_mb")
    channels: int = Field(2, ge=1, le=16, description="TCP connections per peer")
    placement: Literal["packed", "spread"] = Field("packed", description="which hosts")
    prediction_tolerance: float = Field(0.5, gt=0, le=10,
                                        description="|measured / predicted step - 1| allowed")

    @field_validator("workers")
    @classmethod
    def _workers(cls, values: list[int]) -> list[int]:
        if any(v < 2 for v in values):
            raise ValueError(f"each must be at least 2 (one worker has nothing to reduce), got "
                             f"{values}")
        return sorted(distinct(values, "a count"))

    @field_validator("models")
    @classmethod
    def _models(cls, values: list[str]) -> list[str]:
        return distinct(values, "a model")


class DataParallel(Experiment):
    name = "data-parallel"
    title = "data-parallel training (DDP buckets)"
    Params = DataParallelParams
    captions = {
        "scaling.png": ("Step time grows and scaling efficiency falls as workers are added; "
                        "the gap between the step and compute alone is the exposed "
                        "communication."),
    }

    def samples(self, model: str) -> int:
        return self.params.images_per_step if model == "resnet50" else self.params.tokens_per_step

    def problems(self) -> list[Problem]:
        return host_problems(self.fabric(), "workers", max(self.params.workers), "workers")

    def setups(self):
        return [self.scenario_setup()]

    def headline(self) -> str:
        p = self.params
        return (f"{self.title}: {', '.join(p.models)} on {', '.join(map(str, p.workers))} "
                f"workers of {self.fabric().label()} at {self.rate_mbit:g} Mbit/s, gradients x"
                f"{p.scale:g}")

    def rank_args(self, model: str, cost) -> list[str]:
        p = self.params
        return ["--model", model, "--scale", repr(p.scale), "--steps", str(p.steps),
                "--warmup-steps", str(p.warmup_steps), "--device-gflops", repr(p.device_gflops),
                "--samples", str(self.samples(model)), "--split", "flops",
                "--bucket-cap-mb", repr(p.bucket_cap_mb), "--channels", str(p.channels),
                "--seed", str(self.scenario.seed), *cost.argv()]

    def measure(self, run: SetupRun) -> dict:
        fabric = run.net.fabric
        p = self.params
        runs = []
        with RankWatch(run) as watch:
            for model in p.models:
                for workers in p.workers:
                    hosts = place_hosts(fabric, workers, p.placement)
                    ips = [fabric.nodes[h].ip for h in hosts]
                    cost = cost_links(fabric, hosts)
                    name = f"{model}-{workers}"
                    results = watch.run_ranks(
                        launches(DDP_MODULE, hosts, ips, self.rank_args(model, cost), RANK_PORT),
                        f"{model} on {workers} workers", p.warmup_steps + p.steps,
                        prefix=f"{name}-rank")
                    runs.append(run_summary(model, hosts, results, cost.to_dict()))
                    run.log(f"{name}: {run_cell(runs[-1])}")
        return {"runs": runs, "fidelity": watch.fidelity(),
                "window_monotonic_s": [watch.watch.t_start, watch.watch.t_end]}

    def checks(self, results):
        r = results["fabric"]
        p = self.params
        checks = [holds("data verified on every rank", all(x["verified"] for x in r["runs"]),
                        f"{sum(x['verified_ranks'] for x in r['runs'])}/"
                        f"{sum(x['workers'] for x in r['runs'])} ranks over "
                        f"{len(r['runs'])} runs held every bucket's exact sum",
                        measured=sum(x["verified_ranks"] for x in r["runs"]),
                        expected=sum(x["workers"] for x in r["runs"]))]
        for model in p.models:
            mine = [x for x in r["runs"] if x["model"] == model]
            if len(mine) >= 2:
                first, last = mine[0], mine[-1]
                checks.append(holds(
                    f"{model}: scaling efficiency falls with workers",
                    last["scaling_efficiency"] <= first["scaling_efficiency"] + EFFICIENCY_NOISE,
                    f"{first['workers']} workers: {first['scaling_efficiency']:.0%}, "
                    f"{last['workers']} workers: {last['scaling_efficiency']:.0%} (the ring "
                    f"moves 2(n-1)/n of the gradients per link, in 2(n-1) steps)",
                    measured=round(last["scaling_efficiency"], 4),
                    expected=f"<= {first['scaling_efficiency'] + EFFICIENCY_NOISE:.4f}"))
            errors = [relative_error(x["step_s"], x["predicted_step_s"]) for x in mine]
            worst = max((e for e in errors if e is not None), default=None)
            checks.append(at_most(f"{model}: step time vs prediction", None if worst is None
                                  else round(worst, 4), p.prediction_tolerance,
                                  "|measured / predicted - 1|",
                                  "the cost model from the fabric with DDP's overlap explains "
                                  "every run's step time (worst run shown)"))
        return checks

    def rows(self, results):
        return [(f"{x['model']}, {x['workers']} workers", run_cell(x))
                for x in results["fabric"]["runs"]]

    def plots(self, results, folder: Path, title: str) -> list[Path]:
        runs = results["fabric"]["runs"]
        return [plot_scaling(runs, title, folder / "scaling.png")] if runs else []


def mean(values) -> float:
    values = list(values)
    return sum(values) / len(values) if values else 0.0


def run_summary(model: str, hosts: list[str], results: list[dict], cost: dict) -> dict:
    """One (model, workers) run from its ranks' results: rank 0's job view (the slowest
    rank per step) and prediction, and how many ranks verified."""
    head = results[0]
    step = head.get("job_mean_step_s") or head["mean_step_s"]
    compute = head["forward_s"] + head["backward_s"]
    predicted = head["predicted"]
    return {"model": model, "workers": len(hosts), "hosts": hosts,
            "buckets": len(head["buckets"]),
            "message_bytes": sum(b["message_bytes"] for b in head["buckets"]),
            "step_s": step, "job_step_s": head.get("job_step_s"), "compute_s": compute,
            "comm_s": head["mean_comm_s"], "comm_share": head["mean_comm_s"] / step if step else 0,
            "exposed_comm_s": head["mean_exposed_comm_s"], "exposed_share": head["exposed_share"],
            "scaling_efficiency": compute / step if step else 0.0,
            "predicted_step_s": predicted["step_s"],
            "predicted_exposed_share": predicted["exposed_share"],
            "predicted_scaling_efficiency": compute / predicted["step_s"] if predicted["step_s"]
            else 0.0,
            "verified": all(x["verified"] for x in results),
            "verified_ranks": sum(bool(x["verified"]) for x in results),
            "tcp_retransmits": sum(x["tcp_retrans_segs"] for x in results),
            "cost_model": cost, "timed_window_monotonic_s": head["timed_window_monotonic_s"]}


def run_cell(x: dict) -> str:
    return (f"step {x['step_s']:.3f} s (predicted {x['predicted_step_s']:.3f} s), compute "
            f"{x['compute_s']:.3f} s, communication {x['comm_s']:.3f} s ({x['comm_share']:.0%} "
            f"of the step, {x['exposed_share']:.0%} exposed), scaling efficiency "
            f"{x['scaling_efficiency']:.0%} (predicted {x['predicted_scaling_efficiency']:.0%}); "
            f"{x['buckets']} buckets, {x['message_bytes']} B per step; "
            f"{'verified' if x['verified'] else 'NOT verified'}")
