"""Tensor (Megatron) parallelism inside one NVSwitch-like node against across nodes.

A tensor-parallel group of ``tp_size`` ranks runs testbed.traffic.training.tensor_parallel:
per transformer layer two AllReduces of the activations (batch x sequence x hidden, bytes
scaled by ``scale``) in the forward pass and two in the backward, with modelled compute
between them and nothing overlapping them, real float32 data checked on every rank. The
group runs twice on one fabric of NVSwitch-like nodes (topology nvswitch: hosts are GPUs,
NVLink at ``nvlink_ratio`` times the NIC rate): ``inside``, on the GPUs of one node, where
every AllReduce stays on NVLink; and ``across``, on one GPU of each of ``tp_size`` nodes,
where every AllReduce crosses the nodes' NICs. Reported: each placement's step and
communication time and the cost model's prediction (alpha and beta from the fabric), the
step-time difference, and beside it the bandwidth ratio of the two placements (bottleneck
rate inside over across) and the communication-time ratio it explains.
"""
from __future__ import annotations

import time
from pathlib import Path

from pydantic import Field

from testbed.drive.ranks import RANK_PORT, RankWatch, launches
from testbed.experiments.tensor_parallel.plots import plot_placements
from testbed.harness.experiment import HOSTS, ROUTING, TOPOLOGY, Experiment, Params, SetupRun
from testbed.harness.scenario import FamilyTopology, Problem
from testbed.model.topology.base import NVSWITCH
from testbed.model.verdict import at_least, holds, near
from testbed.plan.training import cost_links, node_groups

TP_MODULE = "testbed.traffic.training.tensor_parallel"
INSIDE, ACROSS = "inside", "across"
WHERE = {INSIDE: "inside one node", ACROSS: "across nodes"}


class TensorParallelParams(Params):
    """The group's size, the transformer's shape (GPT-2 small by default) and the bytes sent
    per byte of activation, the modelled compute per layer, the steps, TCP channels per
    peer; how much slower across nodes must be, and how close the step-time ratio must come
    to the prediction."""

    tp_size: int = Field(4, ge=2, le=16, description="ranks in the tensor-parallel group")
    layers: int = Field(12, ge=1, le=1000, description="transformer layers")
    hidden: int = Field(768, ge=1, le=1 << 16, description="hidden size")
    seq: int = Field(1024, ge=1, le=1 << 20, description="sequence length")
    batch: int = Field(8, ge=1, le=1 << 16, description="micro-batch size (sequences)")
    bytes_per_elem: int = Field(2, ge=1, le=8, description="activation bytes (2: fp16/bf16)")
    scale: float = Field(0.001, gt=0, le=1, description="bytes sent per byte of activation")
    layer_forward_ms: float = Field(4.0, ge=0, le=60_000, description="compute per layer")
    layer_backward_ms: float = Field(8.0, ge=0, le=60_000, description="compute per layer")
    steps: int = Field(3, ge=1, le=100, description="measured steps per placement")
    warmup_steps: int = Field(1, ge=0, le=100, description="steps before the measured ones")
    channels: int = Field(1, ge=1, le=16, description="TCP connections per peer")
    min_step_ratio: float = Field(1.5, ge=1, le=1000,
                                  description="across / inside step time, at least")
    prediction_tolerance: float = Field(0.5, gt=0, le=10,
                                        description="relative tolerance of the step-time "
                                                    "ratio against the prediction")


class TensorParallel(Experiment):
    name = "tensor-parallel"
    title = "tensor parallelism inside vs across nodes"
    Params = TensorParallelParams
    captions = {
        "placements.png": ("The communication share of the step grows when the tensor-parallel "
                           "group leaves the NVLink domain; diamonds mark the predicted step."),
    }
    sections = frozenset({TOPOLOGY, ROUTING, HOSTS})
    # Each layer's AllReduces are latency-bound exchanges between the ranks: on one CPU a
    # rank waits for its peer's turn at every step (docs/tensor-parallel.md).
    min_host_cpus = 2

    def default_topology(self):
        return FamilyTopology(name="nvswitch", base="spineleaf", leaves=2, spines=2,
                              hosts_per_leaf=2, gpus_per_node=4)

    def placements(self, fabric) -> dict[str, list[str]]:
        """The group's hosts in each placement: the first ``tp_size`` GPUs of the first
        node, and the first GPU of each of the first ``tp_size`` nodes."""
        hosts = [h.name for h in fabric.hosts]
        groups = node_groups(fabric, hosts)
        size = self.params.tp_size
        return {INSIDE: [hosts[r] for r in groups[0][:size]],
                ACROSS: [hosts[g[0]] for g in groups[:size]]}

    def problems(self) -> list[Problem]:
        fabric = self.fabric()
        hosts = [h.name for h in fabric.hosts]
        groups = node_groups(fabric, hosts)
        size = self.params.tp_size
        node_switch, _ = fabric.host_attachment(hosts[0])
        if fabric.nodes[node_switch].role != NVSWITCH:
            return [Problem(("topology",), "needs NVSwitch-like nodes (topology nvswitch: "
                            "hosts are GPUs), got " + fabric.label())]
        if len(groups[0]) < size:
            return [Problem(("params", "tp_size"), f"a node has {len(groups[0])} GPUs, the "
                            f"group needs {size}")]
        if len(groups) < size:
            return [Problem(("params", "tp_size"), f"the fabric has {len(groups)} nodes, the "
                            f"group across nodes needs {size}")]
        return []

    def setups(self):
        return [self.scenario_setup()]

    def headline(self) -> str:
        p = self.params
        return (f"{self.title}: a group of {p.tp_size}, {p.layers} layers, activations "
                f"{p.batch}x{p.seq}x{p.hidden} x{p.scale:g}, on {self.fabric().label()} at "
                f"{self.rate_mbit:g} Mbit/s")

    def rank_args(self, cost) -> list[str]:
        p = self.params
        return ["--layers", str(p.layers), "--hidden", str(p.hidden), "--seq", str(p.seq),
                "--batch", str(p.batch), "--bytes-per-elem", str(p.bytes_per_elem),
                "--scale", repr(p.scale), "--layer-forward-ms", repr(p.layer_forward_ms),
                "--layer-backward-ms", repr(p.layer_backward_ms), "--steps", str(p.steps),
                "--warmup-steps", str(p.warmup_steps), "--channels", str(p.channels),
                "--seed", str(self.scenario.seed), *cost.argv()]

    def measure(self, run: SetupRun) -> dict:
        fabric = run.net.fabric
        p = self.params
        placements = {}
        with RankWatch(run) as watch:
            for name, hosts in self.placements(fabric).items():
                cost = cost_links(fabric, hosts)
                t0 = time.monotonic()
                results = watch.run_ranks(
                    launches(TP_MODULE, hosts, [fabric.nodes[h].ip for h in hosts],
                             self.rank_args(cost), RANK_PORT),
                    f"tensor parallel, {WHERE[name]}", p.warmup_steps + p.steps,
                    prefix=f"{name}-rank")
                placements[name] = {**placement_summary(hosts, results, cost.to_dict()),
                                    "window_monotonic_s": [t0, time.monotonic()]}
                run.log(f"{name}: {placement_cell(placements[name])}")
        return {"placements": placements, "comparison": compare(placements),
                "fidelity": watch.fidelity(),
                "window_monotonic_s": [watch.watch.t_start, watch.watch.t_end]}

    def checks(self, results):
        r = results["fabric"]
        p = self.params
        checks = [holds(f"{name}: data verified", x["verified"],
                        f"{x['verified_ranks']}/{len(x['hosts'])} ranks held every "
                        "AllReduce's exact sum", measured=x["verified_ranks"],
                        expected=len(x["hosts"]))
                  for name, x in r["placements"].items()]
        c = r["comparison"]
        if c is None:
            return checks
        checks.append(at_least("step time across / inside a node", round(c["step_ratio"], 4),
                               p.min_step_ratio, "ratio",
                               f"across nodes a step took {c['step_difference_s']:.3f} s longer "
                               f"({c['step_ratio']:.2f}x); the placements' bandwidth ratio is "
                               f"{c['bandwidth_ratio']:g} and communication took "
                               f"{c['comm_ratio']:.2f}x as long"))
        checks.append(near("step-time ratio vs prediction", round(c["step_ratio"], 4),
                           round(c["predicted_step_ratio"], 4),
                           round(p.prediction_tolerance * c["predicted_step_ratio"], 4), "ratio",
                           "the cost model from the fabric (alpha and beta of each placement) "
                           "predicts how much slower the group is across nodes"))
        return checks

    def rows(self, results):
        r = results["fabric"]
        rows = [(name, placement_cell(x)) for name, x in r["placements"].items()]
        c = r["comparison"]
        if c is not None:
            rows += [("step-time difference", f"{c['step_difference_s']:.3f} s "
                      f"({c['step_ratio']:.2f}x, predicted {c['predicted_step_ratio']:.2f}x)"),
                     ("bandwidth ratio (inside / across)", f"{c['bandwidth_ratio']:g}"),
                     ("communication-time ratio (across / inside)",
                      f"{c['comm_ratio']:.2f} (predicted {c['predicted_comm_ratio']:.2f})")]
        return rows

    def plots(self, results, folder: Path, title: str) -> list[Path]:
        r = results["fabric"]
        if not r["placements"]:
            return []
        return [plot_placements(r["placements"], r["comparison"], title,
                                folder / "placements.png")]


def placement_summary(hosts: list[str], results: list[dict], cost: dict) -> dict:
    """A placement's ranks' results: the job's step time (slowest rank per step), rank 0's
    communication time, the prediction, verification."""
    head = results[0]
    job = head.get("job_step_s") or [s["step_s"] for s in head["steps"]]
    step = sum(job) / len(job) if job else 0.0
    predicted_comm = head["allreduces_per_step"] * head["predicted_allreduce_s"]
    return {"hosts": hosts, "step_s": step, "comm_s": head["mean_comm_s"],
            "compute_s": step - head["mean_comm_s"], "predicted_step_s": head["predicted_step_s"],
            "predicted_comm_s": predicted_comm, "message_bytes": head["message_bytes"],
            "allreduces_per_step": head["allreduces_per_step"],
            "verified": all(x["verified"] for x in results),
            "verified_ranks": sum(bool(x["verified"]) for x in results),
            "tcp_retransmits": sum(x["tcp_retrans_segs"] for x in results),
            "cost_model": cost}


def compare(placements: dict[str, dict]) -> dict | None:
    """Across against inside: step-time difference and ratio, communication-time ratio and
    the bandwidth ratio of the placements (bottleneck rate inside over across), each with
    the prediction's."""
    if INSIDE not in placements or ACROSS not in placements:
        return None
    i, a = placements[INSIDE], placements[ACROSS]
    rate_in = i["cost_model"]["link"]["rate_mbit"]
    rate_across = a["cost_model"]["link"]["rate_mbit"]
    return {"step_difference_s": a["step_s"] - i["step_s"],
            "step_ratio": a["step_s"] / i["step_s"] if i["step_s"] else 0.0,
            "predicted_step_ratio": (a["predicted_step_s"] / i["predicted_step_s"]
                                     if i["predicted_step_s"] else 0.0),
            "comm_ratio": a["comm_s"] / i["comm_s"] if i["comm_s"] else 0.0,
            "predicted_comm_ratio": (a["predicted_comm_s"] / i["predicted_comm_s"]
                                     if i["predicted_comm_s"] else 0.0),
            "bandwidth_ratio": (rate_in / rate_across if rate_in and rate_across else None)}


def placement_cell(x: dict) -> str:
    link = x["cost_model"]["link"]
    return (f"{', '.join(x['hosts'])}: step {x['step_s']:.3f} s (predicted "
            f"{x['predicted_step_s']:.3f} s), communication {x['comm_s']:.3f} s over "
            f"{x['allreduces_per_step']} AllReduces of {x['message_bytes']} B; path "
            f"{link['hops']} hops at {link['rate_mbit']:g} Mbit/s; "
            f"{'verified' if x['verified'] else 'NOT verified'}")
