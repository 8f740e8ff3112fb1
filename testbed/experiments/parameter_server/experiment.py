"""Parameter-server training (Li et al., OSDI 2014) against AllReduce on the same fabric and
model.

The model's parameters (ResNet-50's by default, bytes scaled by ``scale``) are sharded over
``servers`` server ranks, balanced by bytes; ``workers`` worker ranks compute for
``compute_ms``, push their gradient of every shard to its server and pull the shard back
(testbed.traffic.training.parameter_server), in synchronous (BSP: a server answers once all
pushes of a step are in) and asynchronous mode, one after the other. Every push of a step
reaches a server at once: an N:1 incast on the link into each server. Measured at the switch
ports that feed the servers: the real queue backlog (testbed.measure.backlog.PortBacklog,
sampled every ``backlog_sample_ms``), drops at those ports, and PFC pauses where the queue has
PFC. Then the same workers run the same model's gradients as DDP buckets with a ring
AllReduce (testbed.traffic.training.ddp), for the comparison: step time, and the bytes on the
busiest link per step (from the link counters over each phase).
"""
from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Literal

from pydantic import Field, field_validator

from testbed.harness.experiment import (
    HOSTS,
    QUEUE,
    ROUTING,
    TOPOLOGY,
    Experiment,
    Params,
    SetupRun,
    distinct,
)
from testbed.drive.ranks import RANK_PORT, RankWatch, host_problems, launches
from testbed.harness.scenario import Problem
from testbed.model.verdict import at_least, holds, near
from testbed.plan.port_queue import Handles
from testbed.plan.training import cost_links, place_hosts
from testbed.traffic.training.parameter_server import ASYNC, BSP

from testbed.experiments.parameter_server.backlog import BacklogSampler, backlog_stats
from testbed.experiments.parameter_server.plots import plot_backlog, plot_comparison

PS_MODULE = "testbed.traffic.training.parameter_server"
DDP_MODULE = "testbed.traffic.training.ddp"
ALLREDUCE_PHASE = "allreduce"
# The incast must queue at a server's port: at least this many full frames at the peak.
INCAST_MIN_BACKLOG_FRAMES = 2
PFC_KEYS = ("pause_frames_sent", "paused_time_s", "lossless_drops")


class ParameterServerParams(Params):
    """Servers and workers, the modes, the model and its bytes sent per byte of parameters,
    the steps and each worker's compute per step, where the ranks run, the DSCP of their
    traffic, how often the servers' ports are sampled, whether AllReduce runs for the
    comparison, and how close the busiest link's bytes must be to the sharding's
    expectation."""

    servers: int = Field(2, ge=1, le=64, description="server ranks (the first hosts)")
    workers: int = Field(8, ge=1, le=1024, description="worker ranks")
    modes: list[Literal["bsp", "async"]] = Field(default_factory=lambda: [BSP, ASYNC],
                                                 min_length=1, description="bsp, async")
    model: Literal["resnet50", "gpt2_small"] = Field("resnet50", description="the model")
    scale: float = Field(0.002, gt=0, le=1, description="bytes sent per byte of parameters")
    steps: int = Field(3, ge=1, le=100, description="steps per mode")
    compute_ms: float = Field(100.0, ge=0, le=60_000, description="a worker's compute per step")
    placement: Literal["packed", "spread"] = Field("spread", description="which hosts")
    dscp: int = Field(0, ge=0, le=63, description="DSCP of every rank's traffic")
    backlog_sample_ms: float = Field(10.0, gt=0, le=1000,
                                     description="how often the servers' ports are read")
    compare_allreduce: bool = Field(True, description="run DDP's AllReduce on the workers")
    bytes_tolerance: float = Field(0.25, gt=0, le=10,
                                   description="relative tolerance of the busiest-link ratio")

    @field_validator("modes")
    @classmethod
    def _modes(cls, values: list[str]) -> list[str]:
        return distinct(values, "a mode")


def server_port(fabric, host: str) -> str:
    """The switch port that sends to ``host``: where its incoming incast queues."""
    link, end = fabric.host_link(host)
    return link.intf(1 - end)


def expected_busiest_ratio(workers: int, shard_message_bytes: list[int],
                           allreduce_message_bytes: int) -> float | None:
    """Bytes per step on the busiest link, parameter server over ring AllReduce: a server's
    link carries every worker's push of its shard (and as much back), a ring link 2(n-1)/n of
    the gradients per direction."""
    ring = 2 * (workers - 1) / workers * allreduce_message_bytes
    return workers * max(shard_message_bytes) / ring if ring else None


class ParameterServer(Experiment):
    name = "parameter-server"
    title = "parameter server vs AllReduce"
    Params = ParameterServerParams
    captions = {
        "server_backlog.png": ("The queues into the servers fill at every push and pull: the "
                               "N:1 incast a parameter server makes."),
        "ps_vs_allreduce.png": ("The parameter server's busiest link carries more bytes per "
                                "step than the ring's, and its step is slower."),
    }
    sections = frozenset({TOPOLOGY, ROUTING, QUEUE, HOSTS})

    def problems(self) -> list[Problem]:
        p = self.params
        problems = host_problems(self.fabric(), "workers", p.servers + p.workers,
                                 "servers and workers")
        if p.compare_allreduce and p.workers < 2:
            problems.append(Problem(("params", "workers"), "the AllReduce comparison needs at "
                                    "least 2 workers"))
        return problems

    def setups(self):
        return [self.scenario_setup()]

    def headline(self) -> str:
        p = self.params
        return (f"{self.title}: {p.model} x{p.scale:g} on {p.servers} servers and "
                f"{p.workers} workers ({', '.join(p.modes)}) of {self.fabric().label()} at "
                f"{self.rate_mbit:g} Mbit/s")

    def backlog_handle(self, queue) -> str:
        """The qdisc holding this traffic's queue at a port: the one buffer, or its class's."""
        if queue is None or not queue.uses_classes:
            return Handles.BUFFER
        return Handles.leaf(queue.priority_for_dscp(self.params.dscp))

    def ps_args(self, mode: str) -> list[str]:
        p = self.params
        return ["--servers", str(p.servers), "--mode", mode, "--model", p.model,
                "--scale", repr(p.scale), "--steps", str(p.steps),
                "--compute-ms", repr(p.compute_ms), "--seed", str(self.scenario.seed),
                "--channels", "1", "--dscp", str(p.dscp)]

    def allreduce_args(self, cost) -> list[str]:
        """DDP on the workers with the same compute per step, split as forward and backward
        (1:2), every step counted."""
        p = self.params
        return ["--model", p.model, "--scale", repr(p.scale), "--steps", str(p.steps),
                "--warmup-steps", "0", "--forward-ms", repr(p.compute_ms / 3),
                "--backward-ms", repr(2 * p.compute_ms / 3), "--channels", "1",
                "--dscp", str(p.dscp), "--seed", str(self.scenario.seed), *cost.argv()]

    # -- on a running fabric ----------------------------------------------------------------
    def measure(self, run: SetupRun) -> dict:
        p = self.params
        net, fabric = run.net, run.net.fabric
        hosts = place_hosts(fabric, p.servers + p.workers, p.placement)
        servers, workers = hosts[:p.servers], hosts[p.servers:]
        ips = {h: fabric.nodes[h].ip for h in hosts}
        ports = [server_port(fabric, s) for s in servers]
        handle = self.backlog_handle(run.setup.queue)
        phases = {}
        with RankWatch(run) as watch:
            for mode in p.modes:
                drops = net.port_queue_drops()
                pfc = net.pfc_summary() if net.lossless else None
                t0 = time.monotonic()
                with BacklogSampler(ports, handle, p.backlog_sample_ms / 1e3) as backlog:
                    results = watch.run_ranks(launches(PS_MODULE, hosts, [ips[h] for h in hosts],
                                                       self.ps_args(mode), RANK_PORT),
                                              f"parameter server, {mode}", prefix=f"ps-{mode}-rank")
                t1 = time.monotonic()
                after = net.port_queue_drops()
                phase = ps_summary(mode, results, p.steps)
                phase["server_ports"] = {
                    intf: {"server": server, **backlog_stats(backlog.series["backlog_bytes"][intf]),
                           "drops": after[intf] - drops[intf]}
                    for server, intf in zip(servers, ports)}
                phase["backlog_error"] = backlog.error
                if pfc is not None:
                    later = net.pfc_summary()
                    phase["pfc"] = {k: round(later[k] - pfc[k], 6) for k in PFC_KEYS}
                phase.update(busiest_link(watch.watch, t0, t1, p.steps))
                # what the model predicts: a server's own link (the busiest link may be an
                # uplink that ECMP gave several servers' flows)
                phase["server_link"] = busiest_link(watch.watch, t0, t1, p.steps, set(servers))
                (run.workdir / f"backlog-{mode}.json").write_text(json.dumps(backlog.series))
                phases[mode] = phase
                run.log(f"{mode}: {phase_cell(phase)}")
            if p.compare_allreduce:
                cost = cost_links(fabric, workers)
                t0 = time.monotonic()
                results = watch.run_ranks(launches(DDP_MODULE, workers, [ips[h] for h in workers],
                                                   self.allreduce_args(cost), RANK_PORT),
                                          "AllReduce on the workers", p.steps,
                                          prefix="allreduce-rank")
                t1 = time.monotonic()
                phase = allreduce_summary(results)
                phase.update(busiest_link(watch.watch, t0, t1, p.steps))
                phase["cost_model"] = cost.to_dict()
                phases[ALLREDUCE_PHASE] = phase
                run.log(f"AllReduce: {phase_cell(phase)}")
        return {"servers": servers, "workers": workers, "server_ports": ports,
                "backlog_handle": handle, "mtu_bytes": fabric.mtu_bytes, "phases": phases,
                "fidelity": watch.fidelity(),
                "window_monotonic_s": [watch.watch.t_start, watch.watch.t_end]}

    # -- judging and showing ----------------------------------------------------------------
    def checks(self, results):
        r = results["fabric"]
        p = self.params
        phases = r["phases"]
        checks = [holds(f"{name}: data verified", x["verified"],
                        f"{x['verified_ranks']}/{x['ranks']} ranks verified what they hold "
                        f"({x['wrong_total']} wrong elements)", measured=x["wrong_total"],
                        expected=0)
                  for name, x in phases.items()]
        minimum = INCAST_MIN_BACKLOG_FRAMES * r["mtu_bytes"]
        for mode in p.modes:
            ports = phases[mode]["server_ports"].values()
            peak = max((port["peak_bytes"] for port in ports), default=None)
            checks.append(at_least(f"{mode}: incast queue at the servers' ports", peak, minimum,
                                   "bytes", f"the pushes of a step queued at the ports into "
                                   f"the servers (peak backlog {peak} B, drops "
                                   f"{sum(port['drops'] for port in ports)})"))
        ar = phases.get(ALLREDUCE_PHASE)
        bsp = phases.get(BSP) or phases.get(p.modes[0])
        if ar is not None and bsp is not None:
            expected = expected_busiest_ratio(len(r["workers"]), bsp["shard_message_bytes"],
                                              ar["message_bytes"])
            server = bsp.get("server_link") or bsp
            measured = (server["busiest_link_bytes_per_step"] / ar["busiest_link_bytes_per_step"]
                        if ar["busiest_link_bytes_per_step"] else None)
            checks.append(near(
                "busiest server link bytes / busiest AllReduce link bytes",
                None if measured is None else round(measured, 4),
                None if expected is None else round(expected, 4),
                None if expected is None else round(p.bytes_tolerance * expected, 4), "ratio",
                f"per step, the server link {server['busiest_link']} carried "
                f"{server['busiest_link_bytes_per_step']:.0f} B in {bsp['mode']} mode (the "
                f"busiest link of all, {bsp['busiest_link']}, "
                f"{bsp['busiest_link_bytes_per_step']:.0f} B), "
                f"{ar['busiest_link']} "
                f"{ar['busiest_link_bytes_per_step']:.0f} B under AllReduce"))
            checks.append(holds("AllReduce steps faster than the parameter server",
                                ar["step_s"] < bsp["step_s"],
                                f"AllReduce {ar['step_s']:.3f} s per step, parameter server "
                                f"({bsp['mode']}) {bsp['step_s']:.3f} s",
                                measured=round(ar["step_s"], 4),
                                expected=f"< {bsp['step_s']:.4f}"))
        return checks

    def rows(self, results):
        r = results["fabric"]
        rows = [("servers, workers", f"{', '.join(r['servers'])}; {', '.join(r['workers'])}")]
        rows += [(name, phase_cell(x)) for name, x in r["phases"].items()]
        return rows

    def plots(self, results, folder: Path, title: str) -> list[Path]:
        r = results["fabric"]
        paths = []
        series = {mode: json.loads((Path(r["dir"]) / f"backlog-{mode}.json").read_text())
                  for mode in self.params.modes
                  if (Path(r["dir"]) / f"backlog-{mode}.json").exists()}
        if series:
            paths.append(plot_backlog(series, title, folder / "server_backlog.png"))
        if r["phases"]:
            paths.append(plot_comparison(r["phases"], title, folder / "ps_vs_allreduce.png"))
        return paths


def mean(values) -> float:
    values = list(values)
    return sum(values) / len(values) if values else 0.0


def ps_summary(mode: str, results: list[dict], steps: int) -> dict:
    """A mode's ranks' results: the job's step time (the slowest worker per step), each
    worker's push-pull time, verification, shard bytes, TCP retransmissions."""
    head = results[0]
    workers = [x for x in results if x["role"] == "worker"]
    return {"mode": mode, "ranks": len(results), "step_s": mean(head["job_step_s"]),
            "job_step_s": head["job_step_s"],
            "push_pull_s": mean(s["push_pull_s"] for w in workers for s in w["steps"]),
            "verified": bool(head["verified"]) and all(x["verified"] for x in results),
            "verified_ranks": sum(bool(x["verified"]) for x in results),
            "wrong_total": head["wrong_total"],
            "shard_message_bytes": head["shard_message_bytes"],
            "shard_imbalance": head["shard_imbalance"],
            "message_bytes": sum(head["shard_message_bytes"]),
            "tcp_retransmits": sum(x["tcp_retrans_segs"] for x in results), "steps": steps}


def allreduce_summary(results: list[dict]) -> dict:
    head = results[0]
    return {"mode": ALLREDUCE_PHASE, "ranks": len(results),
            "step_s": head.get("job_mean_step_s") or head["mean_step_s"],
            "job_step_s": head.get("job_step_s"), "comm_s": head["mean_comm_s"],
            "verified": all(x["verified"] for x in results),
            "verified_ranks": sum(bool(x["verified"]) for x in results),
            "wrong_total": sum(x["wrong"] for x in results),
            "message_bytes": sum(b["message_bytes"] for b in head["buckets"]),
            "predicted_step_s": head["predicted"]["step_s"],
            "tcp_retransmits": sum(x["tcp_retrans_segs"] for x in results)}


def busiest_link(watch, t0_monotonic: float, t1_monotonic: float, steps: int,
                 among: set[str] | None = None) -> dict:
    """The link direction (of ``among``'s hosts' links, or of all) that carried the most
    bytes between two instants (the harness's link counters), its bytes and bytes per step."""
    window = watch.window_s(t0_monotonic, t1_monotonic)
    rates = watch.rates_mbit(window)
    if among is not None:
        rates = {label: v for label, v in rates.items() if among & set(label.split("->"))}
    if not rates:
        return {"busiest_link": None, "busiest_link_bytes": 0, "busiest_link_bytes_per_step": 0}
    label = max(rates, key=rates.get)
    carried = rates[label] * 1e6 / 8 * (window[1] - window[0])
    return {"busiest_link": label, "busiest_link_bytes": round(carried),
            "busiest_link_bytes_per_step": carried / steps,
            "window_monotonic_s": [t0_monotonic, t1_monotonic]}


def phase_cell(x: dict) -> str:
    cell = (f"step {x['step_s']:.3f} s, busiest link {x['busiest_link']} "
            f"{x['busiest_link_bytes_per_step']:.0f} B per step, {x['tcp_retransmits']} TCP "
            f"retransmissions, {'verified' if x['verified'] else 'NOT verified'}")
    ports = x.get("server_ports")
    if ports:
        cell += "; servers' ports: " + ", ".join(
            f"{intf} peak {v['peak_bytes']} B (p95 {v['p95_bytes']:.0f} B), {v['drops']} drops"
            for intf, v in ports.items())
    if x.get("pfc"):
        cell += f"; PFC {x['pfc']}"
    return cell

