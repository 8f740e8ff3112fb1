"""A real framework on the fabric: PyTorch DistributedDataParallel over gloo between the
emulated hosts, its step time beside the generator's prediction for the same parameters.

``world`` ranks of testbed.traffic.training.torch_ddp, one per host (``placement``), join
one gloo process group at rank 0's fabric address, gloo bound to each host's fabric
interface (``<host>-eth0``: GLOO_SOCKET_IFNAME), and train a multi-layer perceptron
(``input_dim`` -> ``hidden`` x ``layers`` -> ``outputs``) with DDP (``bucket_cap_mb``) and
SGD on synthetic regression batches. Verified on every rank: DDP's averaged gradient equals
the mean of the ranks' local gradients (float tolerance), and the parameters after training
are identical everywhere; the loss on a held-out batch falls. Beside the measured step (the
slowest rank's), the prediction of testbed.traffic.training.ddp for the torch model's own
parameter shapes: its DDP buckets AllReduced by the cost model (alpha and beta from the
fabric) while the measured backward compute runs. torch is an optional extra: without it
the scenario is refused at validation.
"""
from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Literal

from pydantic import Field

from testbed.drive.ranks import RANK_PORT, Launch, RankWatch, host_problems, rank_argv
from testbed.experiments.torch_ddp.plots import plot_steps
from testbed.harness.experiment import Experiment, Params, SetupRun
from testbed.harness.scenario import Problem
from testbed.model.verdict import at_most, holds
from testbed.plan.training import cost_links, place_hosts
from testbed.traffic.training.torch_ddp import TORCH_MISSING

TORCH_DDP_MODULE = "testbed.traffic.training.torch_ddp"


def torch_installed() -> bool:
    return importlib.util.find_spec("torch") is not None


def fabric_interface(fabric, host: str) -> str:
    """The host's interface into the fabric, as Mininet names it (``<host>-eth0``)."""
    link, end = fabric.host_link(host)
    return link.intf(end)


class TorchDdpParams(Params):
    """The ranks and where they run, the perceptron's shape, the batch per rank, the steps,
    DDP's bucket cap, SGD's learning rate, torch's threads per rank, and how close the
    measured step must come to the prediction."""

    world: int = Field(4, ge=2, le=64, description="ranks, one per host")
    placement: Literal["packed", "spread"] = Field("spread", description="which hosts")
    input_dim: int = Field(256, ge=1, le=1 << 16, description="input features")
    hidden: int = Field(128, ge=1, le=1 << 16, description="hidden layer width")
    layers: int = Field(2, ge=1, le=64, description="hidden layers")
    outputs: int = Field(16, ge=1, le=1 << 16, description="output width (classes)")
    batch: int = Field(32, ge=1, le=1 << 16, description="samples per rank and step")
    steps: int = Field(5, ge=1, le=1000, description="measured steps")
    warmup_steps: int = Field(1, ge=0, le=100, description="steps before the measured ones")
    bucket_cap_mb: float = Field(0.05, gt=0, le=1024, description="DDP's bucket_cap_mb")
    lr: float = Field(0.05, gt=0, le=10, description="SGD learning rate")
    threads: int = Field(1, ge=1, le=64, description="torch intra-op threads per rank")
    prediction_tolerance: float = Field(0.5, gt=0, le=10,
                                        description="|measured / predicted step - 1| allowed")


class TorchDdp(Experiment):
    name = "torch-ddp"
    title = "PyTorch DDP (gloo) on the fabric"
    Params = TorchDdpParams
    captions = {
        "torch_ddp_steps.png": ("Measured steps should sit near the generator's prediction, "
                                "above compute alone by the AllReduce time."),
    }

    def problems(self) -> list[Problem]:
        problems = host_problems(self.fabric(), "world", self.params.world)
        if not torch_installed():
            problems.append(Problem(("experiment",), TORCH_MISSING))
        return problems

    def setups(self):
        return [self.scenario_setup()]

    def headline(self) -> str:
        p = self.params
        return (f"{self.title}: {p.world} ranks, MLP {p.input_dim}-{p.hidden}x{p.layers}-"
                f"{p.outputs}, bucket cap {p.bucket_cap_mb:g} MB on {self.fabric().label()} "
                f"at {self.rate_mbit:g} Mbit/s")

    def rank_args(self, cost) -> list[str]:
        p = self.params
        return ["--input-dim", str(p.input_dim), "--hidden", str(p.hidden),
                "--layers", str(p.layers), "--outputs", str(p.outputs), "--batch", str(p.batch),
                "--steps", str(p.steps), "--warmup-steps", str(p.warmup_steps),
                "--bucket-cap-mb", repr(p.bucket_cap_mb), "--lr", repr(p.lr),
                "--threads", str(p.threads), "--seed", str(self.scenario.seed), *cost.argv()]

    def launches(self, fabric, hosts: list[str], cost) -> list[Launch]:
        """Every rank with rank 0's fabric address as the rendezvous and its own fabric
        interface for gloo."""
        ips = [fabric.nodes[h].ip for h in hosts]
        return [Launch(host, rank_argv(TORCH_DDP_MODULE, rank, ips, RANK_PORT,
                                       ["--ifname", fabric_interface(fabric, host),
                                        *self.rank_args(cost)]))
                for rank, host in enumerate(hosts)]

    def measure(self, run: SetupRun) -> dict:
        fabric = run.net.fabric
        p = self.params
        hosts = place_hosts(fabric, p.world, p.placement)
        cost = cost_links(fabric, hosts)
        with RankWatch(run) as watch:
            results = watch.run_ranks(self.launches(fabric, hosts, cost), "torch DDP steps",
                                      p.warmup_steps + p.steps)
        summary = training_summary(results)
        run.log(f"torch DDP: {training_cell(summary)}")
        return {"hosts": hosts, **summary, "cost_model": cost.to_dict(),
                "fidelity": watch.fidelity(),
                "window_monotonic_s": [watch.watch.t_start, watch.watch.t_end]}

    def checks(self, results):
        r = results["fabric"]
        ratio = r["step_s"] / r["predicted_step_s"] if r["predicted_step_s"] else None
        return [
            holds("DDP's gradient is the mean of the ranks' gradients",
                  r["grad_wrong_total"] == 0,
                  f"{r['grad_wrong_total']} of {r['params'] * r['world']} gradient elements "
                  "differ from the mean of the local gradients beyond float tolerance",
                  measured=r["grad_wrong_total"], expected=0),
            holds("parameters identical on every rank", r["params_identical"],
                  "after training every replica holds bitwise the same parameters"),
            holds("the loss falls", r["loss_after"] < r["loss_before"],
                  f"on a held-out batch the loss was {r['loss_before']:.4f} before training, "
                  f"{r['loss_after']:.4f} after", measured=round(r["loss_after"], 6),
                  expected=f"< {r['loss_before']:.6f}"),
            at_most("step time vs the generator's prediction",
                    None if ratio is None else round(abs(ratio - 1), 4),
                    self.params.prediction_tolerance, "|measured / predicted - 1|",
                    f"torch DDP stepped in {r['step_s'] * 1e3:.1f} ms; the generator predicts "
                    f"{(r['predicted_step_s'] or 0) * 1e3:.1f} ms for the same parameter shapes"),
        ]

    def rows(self, results):
        r = results["fabric"]
        return [("ranks", ", ".join(r["hosts"])), ("training", training_cell(r)),
                ("buckets (predicted)", ", ".join(map(str, r["bucket_bytes"])) + " B")]

    def plots(self, results, folder: Path, title: str) -> list[Path]:
        r = results["fabric"]
        return [plot_steps(r, title, folder / "torch_ddp_steps.png")] if r["job_step_s"] else []


def training_summary(results: list[dict]) -> dict:
    head = results[0]
    predicted = head.get("predicted") or {}
    return {"world": head["world"], "params": head["params"], "param_bytes": head["param_bytes"],
            "job_step_s": head["job_step_s"], "step_s": head["mean_step_s"],
            "forward_s": head["forward_s"], "backward_s": head["backward_s"],
            "optimizer_s": head["optimizer_s"],
            "predicted_step_s": predicted.get("predicted_step_s"),
            "predicted_comm_s": predicted.get("comm_s"),
            "bucket_bytes": predicted.get("bucket_bytes", []),
            "loss_before": head["loss_before"], "loss_after": head["loss_after"],
            "grad_wrong_total": head["grad_wrong_total"],
            "params_identical": head["params_identical"],
            "verified": bool(head["verified"]) and all(x["verified"] for x in results),
            "tcp_retransmits": head["tcp_retrans_segs_total"],
            "timed_window_monotonic_s": head["timed_window_monotonic_s"]}


def training_cell(r: dict) -> str:
    predicted = "-" if r["predicted_step_s"] is None else f"{r['predicted_step_s'] * 1e3:.1f} ms"
    return (f"{r['params']} parameters, step {r['step_s'] * 1e3:.1f} ms (predicted {predicted}; "
            f"compute {1e3 * (r['forward_s'] + r['backward_s'] + r['optimizer_s']):.1f} ms), "
            f"held-out loss {r['loss_before']:.4f} -> {r['loss_after']:.4f}, "
            f"{'verified' if r['verified'] else 'NOT verified'}")
