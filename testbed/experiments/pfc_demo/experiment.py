"""``pfc-demo``: what a lossless fabric costs, shown on the k=4 fat-tree.

PFC keeps a class lossless by pausing whoever feeds a full queue, and the pauses reach flows
that never use that queue: head-of-line blocking, and congestion that spreads hop by hop
back towards the senders (Guo et al., "RDMA over Commodity Ethernet at Scale", SIGCOMM
2016). End-to-end rate control driven by ECN keeps queues below XOFF, so the fabric pauses
far less (Zhu et al., "Congestion Control for Large-Scale RDMA Deployments" (DCQCN),
SIGCOMM 2015).

Three runs, each a setup of its own (a fresh fabric whose every port has the same per-class
buffers):

- ``lossy``: drop-tail class queues, no PFC; hosts cubic (reno without it), ECN off;
- ``pfc``: PFC on the lossless class (``testbed.plan.scaling.pfc_thresholds``, headroom per
  feeding port), no ECN; hosts as in lossy;
- ``pfc+ecn``: the same PFC plus step marking at DCTCP's K scaled to the link rate; hosts
  with ECN (dctcp where the kernel has it, else cubic with ECN).

In each, all traffic is TCP in the lossless class (DSCP 26). A **victim** flow from
``victim_src`` (another pod) to ``victim_dst`` (beside the receiver, on its edge switch)
runs alone, then beside an **incast**: every other host sends one long flow to
``receiver``. The victim never uses the receiver's port, where the incast congests; it only
shares the aggregation-to-edge links that carry the incast to that switch. The claims and
their tolerances are in testbed.experiments.pfc_demo.checks; where the pauses went, in
testbed.experiments.pfc_demo.spreading. Trust: each run's CPU, packet conservation and the
receiver's link delivering its rate (testbed.measure.fidelity), and the pause agent alive.
"""
from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Literal

from pydantic import Field, field_validator

from testbed.drive.flows import SERVER_START_S, run_flows
from testbed.errors import ConfigError
from testbed.experiments.pfc_demo.checks import CONDITIONS, LOSSY, PFC_ECN, demo_checks
from testbed.experiments.pfc_demo.plots import PAUSED_SERIES_FILE, plot_demo
from testbed.experiments.pfc_demo.spreading import (
    in_window,
    max_paused_hops,
    paused_ports_series,
    spreading,
)
from testbed.harness.experiment import Experiment, Params, Setup, SetupRun, distinct
from testbed.harness.scenario import Problem
from testbed.measure.pauses import counter_deltas
from testbed.model.rows import Number, Row
from testbed.plan.modes import LOSSLESS_TOS, mode_tcp
from testbed.plan.pfc import switch_fan_in
from testbed.plan.profiles import U32_MAX, QueueConfig
from testbed.plan.scaling import DEFAULT_PFC_REACTION_TIME_S, dctcp_step, pfc_thresholds

FAT_TREE_K = 4
EVENTS_SETTLE_S = 0.5  # the agent writes its events and counters every 0.2 s
MAX_SECONDS = 600
MAX_RATE_MBIT = 1000.0
MIN_BUFFER_FRAMES = 4


class PfcDemoParams(Params):
    """What to run: every port's buffer per class, how long the victim runs alone and beside
    the incast (``omit_s`` of each not counted: slow start), the three hosts that matter,
    the runs, and the pause path's reaction time that sizes the PFC headroom."""

    buffer_bytes: int = Field(600_000, ge=1, le=U32_MAX,
                              description="every port's buffer per class")
    alone_s: int = Field(5, ge=2, le=MAX_SECONDS,
                         description="seconds the victim runs alone first")
    contention_s: int = Field(10, ge=2, le=MAX_SECONDS,
                              description="seconds the victim runs beside the incast")
    omit_s: int = Field(1, ge=0, le=MAX_SECONDS, description="TCP start-up seconds left out")
    receiver: str = Field("p0e0h0", description="the incast's receiver")
    victim_src: str = Field("p1e0h1", description="the victim flow's sender")
    victim_dst: str = Field("p0e0h1", description="the victim flow's receiver (beside the "
                                                  "incast's receiver)")
    conditions: list[Literal["lossy", "pfc", "pfc+ecn"]] = Field(
        default_factory=lambda: list(CONDITIONS), min_length=1, description="runs to make")
    pfc_reaction_time_s: float = Field(DEFAULT_PFC_REACTION_TIME_S, ge=0, le=1,
                                       allow_inf_nan=False,
                                       description="pause reaction time sizing the PFC "
                                                   "headroom")

    @field_validator("conditions")
    @classmethod
    def _distinct(cls, values: list[str]) -> list[str]:
        return distinct(values, "a run")


class PfcDemo(Experiment):
    name = "pfc-demo"
    title = "PFC's costs"
    Params = PfcDemoParams
    captions = {
        "pfc-demo.png": ("Under PFC the victim's throughput falls beside the incast "
                         "(head-of-line blocking) and pauses reach switches hops away; ECN "
                         "should cut both."),
    }
    default_rate_mbit = 20.0
    default_mtu_bytes = 1500
    sections = frozenset()  # every run sets its own queue and hosts on the k=4 fat-tree
    cli_aliases = {"--seconds": "contention_s", "--omit": "omit_s", "--condition": "conditions"}

    # -- plans ------------------------------------------------------------------------------
    def incast_senders(self) -> list[str]:
        """Every host but the receiver and the victim's two ends."""
        p = self.params
        skip = {p.receiver, p.victim_src, p.victim_dst}
        return [h.name for h in self.fabric().hosts if h.name not in skip]

    def condition_queue(self, condition: str) -> tuple[QueueConfig, dict]:
        """Every port's queue in ``condition``, and the record of its scaling."""
        p = self.params
        record: dict = {"buffer_bytes": p.buffer_bytes, "per_class": True}
        if condition == LOSSY:
            return QueueConfig(p.buffer_bytes, class_queues=True), record
        pfc, record["pfc"] = pfc_thresholds(self.rate_mbit, self.mtu_bytes, p.buffer_bytes,
                                            reaction_time_s=p.pfc_reaction_time_s,
                                            fan_in=switch_fan_in(self.fabric()))
        ecn = None
        if condition == PFC_ECN:
            ecn, k_record = dctcp_step(self.rate_mbit, self.mtu_bytes)
            record["ecn"] = [k_record]
        return QueueConfig(p.buffer_bytes, ecn=ecn, pfc=pfc), record

    def problems(self) -> list[Problem]:
        p = self.params
        problems = []
        if self.rate_mbit > MAX_RATE_MBIT:
            problems.append(Problem(("link_rate_mbit",), f"pfc-demo runs at most "
                                    f"{MAX_RATE_MBIT:g} Mbit/s, got {self.rate_mbit:g}"))
        if p.buffer_bytes < MIN_BUFFER_FRAMES * self.mtu_bytes:
            problems.append(Problem(("params", "buffer_bytes"), f"must hold at least "
                                    f"{MIN_BUFFER_FRAMES} frames of the {self.mtu_bytes}-byte "
                                    f"MTU, got {p.buffer_bytes}"))
        if p.omit_s > min(p.alone_s, p.contention_s) - 1:
            problems.append(Problem(("params", "omit_s"), f"must leave at least a second of "
                                    f"alone_s ({p.alone_s}) and contention_s "
                                    f"({p.contention_s}) to measure, got {p.omit_s}"))
        hosts = [h.name for h in self.fabric().hosts]
        for name in ("receiver", "victim_src", "victim_dst"):
            if getattr(p, name) not in hosts:
                problems.append(Problem(("params", name), f"must be a host of the "
                                        f"k={FAT_TREE_K} fat-tree ({hosts[0]} .. {hosts[-1]}), "
                                        f"got {getattr(p, name)!r}"))
        if len({p.receiver, p.victim_src, p.victim_dst}) != 3:
            problems.append(Problem(("params", "victim_dst"), "receiver, victim_src and "
                                    "victim_dst must be three different hosts (the victim must "
                                    "not use the receiver's port)"))
        return problems

    def setups(self) -> list[Setup]:
        fabric = self.fabric()
        setups = []
        for condition in self.params.conditions:
            try:
                queue, record = self.condition_queue(condition)
            except ConfigError as err:
                raise ConfigError("params.buffer_bytes", f"{self.params.buffer_bytes} B per "
                                  f"class cannot hold the {condition} queue: {err.field}: "
                                  f"{err.problem}") from None
            tcp = mode_tcp(condition == PFC_ECN, self.platform)
            setups.append(Setup(condition, fabric, "ecmp", queue, record, tcp,
                                description=f"{condition}: hosts {tcp.congestion_control} "
                                f"with ECN {'on' if tcp.ecn else 'off'}"))
        return setups

    def headline(self) -> str:
        p = self.params
        return (f"{self.title} on the k={FAT_TREE_K} fat-tree at {self.rate_mbit:g} Mbit/s: "
                f"{len(self.incast_senders())}:1 incast into {p.receiver}, victim "
                f"{p.victim_src} -> {p.victim_dst}; runs {', '.join(p.conditions)}")

    # -- on a running fabric ----------------------------------------------------------------
    def measure(self, run: SetupRun) -> dict:
        """The victim alone, then beside the incast, every counter read around the second."""
        p, net = self.params, run.net
        victim = (p.victim_src, p.victim_dst)
        rates, errors = run_flows(net, [victim], p.alone_s, p.omit_s, tos=LOSSLESS_TOS)
        alone_mbit = rates[0]
        run.log(f"{run.setup.name}: victim {victim[0]} -> {victim[1]} alone: "
                f"{alone_mbit:.1f} Mbit/s")
        senders = self.incast_senders()
        pairs = [victim, *((s, p.receiver) for s in senders)]
        edge, _ = net.fabric.host_attachment(p.receiver)
        drops_before = net.queue_drops()
        pfc_before = net.pause_counters() if net.lossless else None
        lossless_before = net.pfc_summary()["lossless_drops"] if net.lossless else None
        report: dict = {}
        run.log(f"{run.setup.name}: victim beside {len(senders)} incast flows into "
                f"{p.receiver} for {p.contention_s} s")
        with run.watch() as watch:
            with run.queues(report):
                t0 = time.monotonic()
                rates, more_errors = run_flows(net, pairs, p.contention_s, p.omit_s,
                                               tos=LOSSLESS_TOS)
                t1 = time.monotonic()
            queued = net.wait_switches_drained()
        # the measured part of the flows: after the servers' start and the omitted seconds
        start, stop = watch.window_s(t0 + SERVER_START_S + p.omit_s, t1)
        window = (start, min(start + p.contention_s, stop))
        bottleneck = f"{edge}->{p.receiver}"
        result = {
            "victim_alone_mbit": alone_mbit, "victim_mbit": rates[0], "incast_mbit": rates[1:],
            "queue_drops": net.queue_drops() - drops_before,
            "ce_marks": report["ecn"]["totals"].get("marks") if "ecn" in report else None,
            "lossless_drops": None, "pause_frames_sent": 0, "paused_s": 0.0,
            "pause_storms": 0, "longest_pause_s": 0.0, "by_hop": [], "max_paused_hops": None,
            "errors": errors + more_errors, "bottleneck": bottleneck, "window_s": list(window),
            "window_monotonic_s": [t0, t1],
            "fidelity": watch.verdict(window, bottleneck=bottleneck).to_dict(),
            "packets": {"switches": watch.switches, "emulator_lost": watch.emulator_lost(),
                        "still_queued_packets": queued},
        }
        if net.lossless:
            time.sleep(EVENTS_SETTLE_S)
            result.update(self.pauses(run, pfc_before, lossless_before, edge, t0, t1))
        run.log(f"{run.setup.name}: {condition_line(result)}")
        return result

    def pauses(self, run: SetupRun, pfc_before: dict, lossless_before: int, edge: str,
               t0: float, t1: float) -> dict:
        """What the pause agent did between ``t0`` and ``t1``: pause frames, port-seconds
        paused, storms, and where the pauses went; the paused-ports series goes to a file."""
        net = run.net
        summary = net.pfc_summary()
        after = net.pause_counters()
        deltas = counter_deltas(pfc_before, after)
        events = in_window(net.pause_events(), t0, t1)
        ts, counts = paused_ports_series(events, t0)
        (run.workdir / PAUSED_SERIES_FILE).write_text(json.dumps({"t_s": ts, "ports": counts}))
        by_hop = spreading(events, deltas, net.fabric, edge)
        return {
            "lossless_drops": summary["lossless_drops"] - lossless_before,
            "pause_frames_sent": int(sum(d["xoff_sent"] + d["xon_sent"] for d in deltas.values())),
            "paused_s": round(sum(d["paused_s"] for d in deltas.values()), 6),
            "pause_storms": int(sum(d["storms"] for d in deltas.values())),
            # the victim alone paused nothing, so the longest pause so far is the incast's
            "longest_pause_s": max((c.get("longest_pause_s", 0.0) for c in after.values()),
                                   default=0.0),
            "by_hop": by_hop, "max_paused_hops": max_paused_hops(by_hop),
            "pause_agent_running": summary["agent_running"],
        }

    # -- judging and showing ----------------------------------------------------------------
    def checks(self, results):
        return demo_checks(results)

    def rows(self, results):
        rows = [Row(condition, condition_line(results[condition]),
                    *condition_numbers(results[condition]))
                for condition in CONDITIONS if condition in results]
        rows += [(f"{condition}: flow error", error) for condition, r in results.items()
                 for error in r["errors"]]
        return rows

    def plots(self, results, folder: Path, title: str) -> list[Path]:
        p = self.params
        what = (f"{len(self.incast_senders())}:1 incast into {p.receiver}, victim "
                f"{p.victim_src} -> {p.victim_dst}")
        return [plot_demo(results, title, what, folder / "pfc-demo.png")]


def condition_numbers(r: dict) -> list[Number]:
    """``condition_line``'s numbers: the victim's rates, the incast's, drops, marks and
    pauses (those the run measured)."""
    numbers = [Number("victim beside the incast", r["victim_mbit"], "Mbit/s"),
               Number("victim alone", r["victim_alone_mbit"], "Mbit/s"),
               Number("incast", sum(r["incast_mbit"]), "Mbit/s"),
               Number("queue drops", r["queue_drops"], "")]
    if r["ce_marks"] is not None:
        numbers.append(Number("CE marks", r["ce_marks"], ""))
    if r["lossless_drops"] is not None:
        numbers += [Number("lossless drops", r["lossless_drops"], ""),
                    Number("pause frames", r["pause_frames_sent"], ""),
                    Number("paused", r["paused_s"], "port-s"),
                    Number("pauses reach", r["max_paused_hops"], "hops")]
    return numbers


def condition_line(r: dict) -> str:
    """One run in a line: the victim's rates, the incast's, drops, marks and pauses."""
    line = (f"victim {r['victim_mbit']:.2f} Mbit/s beside the incast (alone "
            f"{r['victim_alone_mbit']:.1f}), incast {sum(r['incast_mbit']):.1f} Mbit/s, "
            f"{r['queue_drops']} queue drops")
    if r["ce_marks"] is not None:
        line += f", {r['ce_marks']} CE marks"
    if r["lossless_drops"] is not None:
        hops = r["max_paused_hops"]
        reach = "no port paused" if hops is None else f"pauses up to {hops} hops away"
        line += (f", {r['lossless_drops']} lossless drops, {r['pause_frames_sent']} pause "
                 f"frames, {r['paused_s']:.2f} port-s paused, {reach}")
    return line
