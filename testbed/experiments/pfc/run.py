"""``testbed pfc-demo``: what a lossless fabric costs, shown on the k=4 fat-tree.

PFC keeps a class lossless by pausing whoever feeds a full queue, and the pauses reach flows
that never use that queue: head-of-line blocking, and congestion that spreads hop by hop
back towards the senders (Guo et al., "RDMA over Commodity Ethernet at Scale", SIGCOMM
2016). End-to-end rate control driven by ECN keeps queues below XOFF, so the fabric pauses
far less (Zhu et al., "Congestion Control for Large-Scale RDMA Deployments" (DCQCN),
SIGCOMM 2015).

Three runs, each on a fresh fabric whose every port has the same per-class buffers:

- ``lossy``: drop-tail class queues, no PFC; hosts cubic (reno without it), ECN off;
- ``pfc``: PFC on the lossless class (``testbed.plan.scaling.pfc_thresholds``, headroom per
  feeding port), no ECN; hosts as in lossy;
- ``pfc+ecn``: the same PFC plus step marking at DCTCP's K scaled to the link rate; hosts
  with ECN (dctcp where the kernel has it, else cubic with ECN).

In each, all traffic is TCP in the lossless class (DSCP 26). A **victim** flow from
``victim_src`` (another pod) to ``victim_dst`` (beside the receiver, on its edge switch)
runs alone, then beside an **incast**: every other host sends one long flow to
``receiver``. The victim never uses the receiver's port, where the incast congests; it only
shares the aggregation-to-edge links that carry the incast to that switch.

Shown, each with a named tolerance:

1. head-of-line blocking: the victim's rate beside the incast under PFC against the lossy
   run, where nothing pauses it;
2. congestion spreading: the lossless queues that crossed XOFF and the ports that were
   paused, by hop distance from the receiver's edge switch (from the pause agent's events);
   more than one hop means paused ports two or more hops away;
3. ECN cuts the pause time: port-seconds paused under pfc+ecn against pfc;

plus lossless drops (must be 0 with PFC), pause storms, CE marks and whether the emulator
kept up (CPU, packet conservation, the receiver's link delivering its rate). Results go to
``results/<run-id>/``: summary.json, one folder per run (its pause events and queues) and
pfc-demo.png.
"""
from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import networkx as nx

from testbed.apply.marking import ecn_monitoring, object_is_current
from testbed.apply.pfc_agent import EVENTS_FILE
from testbed.capabilities import detect
from testbed.errors import ConfigError, TestbedError
from testbed.experiments.incast.run import (
    DROPTAIL,
    ECN,
    LOSSLESS_DSCP,
    mode_tcp,
    queue_description,
)
from testbed.harness.flows import SERVER_START_S, run_flows
from testbed.harness.run import interrupts_as_exceptions, machine, new_run_id
from testbed.measure.fidelity import emulator_losses, judge
from testbed.measure.telemetry import (
    Sampler,
    link_directions,
    window_mean,
    window_rates_mbit,
)
from testbed.model.records import read_json_lines
from testbed.model.topology.base import Fabric
from testbed.model.topology.checks import check_count, check_rate
from testbed.model.topology.fattree import fat_tree
from testbed.plan.ecn_plan import choose_ecn_path
from testbed.plan.pfc import PAUSE, RESUME, switch_fan_in
from testbed.plan.profiles import U32_MAX, QueueConfig
from testbed.plan.scaling import DEFAULT_PFC_REACTION_TIME_S, dctcp_step, pfc_thresholds
from testbed.plan.settings import EcnSettings, TcpSettings

LOSSY, PFC, PFC_ECN = "lossy", "pfc", "pfc+ecn"
CONDITIONS = (LOSSY, PFC, PFC_ECN)
FAT_TREE_K = 4
LOSSLESS_TOS = LOSSLESS_DSCP << 2
CONGESTED = "congested"
EVENTS_SETTLE_S = 0.5  # the agent writes its events every 0.2 s
MAX_SECONDS = 600
MIN_MTU_BYTES, MAX_MTU_BYTES = 576, 9000
MAX_RATE_MBIT = 1000.0
# Named tolerances of the verdict.
VICTIM_SLOWED_BY = 0.5    # HOL blocking shown: the victim under PFC at most half its lossy rate
SPREAD_MIN_HOPS = 2       # "more than one hop": ports paused two or more hops away
PAUSE_CUT_BY = 0.5        # ECN cuts the pause time: at most half of PFC alone's


@dataclass
class PfcDemoConfig:
    """What to run: the link rate and MTU of the k=4 fat-tree, every port's buffer per class,
    how long the victim runs alone and beside the incast (``omit_s`` of each not counted:
    slow start), the three hosts that matter and the runs (``CONDITIONS``)."""

    rate_mbit: float = 20.0
    mtu_bytes: int = 1500
    buffer_bytes: int = 600_000
    alone_s: int = 5
    contention_s: int = 10
    omit_s: int = 1
    receiver: str = "p0e0h0"
    victim_src: str = "p1e0h1"
    victim_dst: str = "p0e0h1"
    conditions: tuple[str, ...] = CONDITIONS
    pfc_reaction_time_s: float = DEFAULT_PFC_REACTION_TIME_S
    results_dir: str = "results"

    def fabric(self) -> Fabric:
        return fat_tree(FAT_TREE_K, host_rate_mbit=self.rate_mbit, mtu_bytes=self.mtu_bytes)

    def validate(self) -> None:
        """Every field checked: a one-line ConfigError naming the first bad one."""
        check_rate("rate_mbit", self.rate_mbit)
        if self.rate_mbit > MAX_RATE_MBIT:
            raise ConfigError("rate_mbit", f"must be at most {MAX_RATE_MBIT:g}, "
                                           f"got {self.rate_mbit!r}")
        check_count("mtu_bytes", self.mtu_bytes, MIN_MTU_BYTES, MAX_MTU_BYTES)
        check_count("buffer_bytes", self.buffer_bytes, 4 * self.mtu_bytes, U32_MAX)
        check_count("alone_s", self.alone_s, 2, MAX_SECONDS)
        check_count("contention_s", self.contention_s, 2, MAX_SECONDS)
        check_count("omit_s", self.omit_s, 0, min(self.alone_s, self.contention_s) - 1)
        if not self.conditions or any(c not in CONDITIONS for c in self.conditions) \
                or len(set(self.conditions)) != len(self.conditions):
            raise ConfigError("conditions", f"must be distinct values among "
                                            f"{', '.join(CONDITIONS)}, got {self.conditions!r}")
        hosts = [h.name for h in self.fabric().hosts]
        for name in ("receiver", "victim_src", "victim_dst"):
            if getattr(self, name) not in hosts:
                raise ConfigError(name, f"must be a host of the k={FAT_TREE_K} fat-tree "
                                        f"({hosts[0]} .. {hosts[-1]}), got {getattr(self, name)!r}")
        if len({self.receiver, self.victim_src, self.victim_dst}) != 3:
            raise ConfigError("victim_dst", "receiver, victim_src and victim_dst must be three "
                                            "different hosts (the victim must not use the "
                                            "receiver's port)")
        for condition in self.conditions:
            self.queue(condition)

    def queue(self, condition: str) -> tuple[QueueConfig, dict]:
        """Every port's queue in ``condition``, and the record of its scaling."""
        record: dict = {"buffer_bytes": self.buffer_bytes, "per_class": True}
        if condition == LOSSY:
            return QueueConfig(self.buffer_bytes, class_queues=True), record
        pfc, record["pfc"] = pfc_thresholds(self.rate_mbit, self.mtu_bytes, self.buffer_bytes,
                                            reaction_time_s=self.pfc_reaction_time_s,
                                            fan_in=switch_fan_in(self.fabric()))
        ecn = None
        if condition == PFC_ECN:
            ecn, k_record = dctcp_step(self.rate_mbit, self.mtu_bytes)
            record["ecn"] = [k_record]
        return QueueConfig(self.buffer_bytes, ecn=ecn, pfc=pfc), record

    def incast_senders(self) -> list[str]:
        """Every host but the receiver and the victim's two ends."""
        skip = {self.receiver, self.victim_src, self.victim_dst}
        return [h.name for h in self.fabric().hosts if h.name not in skip]


# --- pure: where the pauses went --------------------------------------------------------------


def hop_distances(fabric: Fabric, origin: str) -> dict[str, int]:
    """Hops from ``origin`` to every node of the fabric (hosts included)."""
    return dict(nx.single_source_shortest_path_length(fabric.graph(), origin))


def interface_nodes(fabric: Fabric) -> dict[str, str]:
    """Every interface of the fabric and the node it belongs to."""
    return {link.intf(end): (link.a, link.b)[end] for link in fabric.links for end in (0, 1)}


def in_window(events: list[dict], t0_s: float, t1_s: float) -> list[dict]:
    return [e for e in events if t0_s <= e["t"] <= t1_s]


def counter_deltas(before: dict, after: dict) -> dict[str, dict[str, float]]:
    """Per interface, the pause agent's counters' increase between two readings (its
    ``interfaces`` section; an interface absent before counts from zero)."""
    keys = ("xoff_sent", "xon_sent", "frames_received", "pauses", "paused_s", "storms")
    return {intf: {k: c.get(k, 0) - before.get(intf, {}).get(k, 0) for k in keys}
            for intf, c in after.items()}


def spreading(events: list[dict], deltas: dict[str, dict[str, float]], fabric: Fabric,
              origin: str) -> list[dict]:
    """By hop distance from ``origin`` (the congested switch): the lossless queues that
    crossed XOFF, the ports that were paused and their port-seconds paused. ``events`` are
    the pause agent's, already cut to the measurement window."""
    distance = hop_distances(fabric, origin)
    node_of = interface_nodes(fabric)
    rows: dict[int, dict] = {}

    def row(intf: str) -> dict:
        hops = distance[node_of[intf]]
        return rows.setdefault(hops, {"hops": hops, "congested_queues": set(),
                                      "paused_ports": set(), "paused_s": 0.0})
    for e in events:
        if e["event"] == CONGESTED:
            row(e["intf"])["congested_queues"].add(e["intf"])
        elif e["event"] == PAUSE:
            row(e["intf"])["paused_ports"].add(e["intf"])
    for intf, delta in deltas.items():
        if delta["paused_s"] > 0:
            row(intf)["paused_ports"].add(intf)
            row(intf)["paused_s"] += delta["paused_s"]
    return [{**r, "congested_queues": sorted(r["congested_queues"]),
             "paused_ports": sorted(r["paused_ports"]), "paused_s": round(r["paused_s"], 6)}
            for _, r in sorted(rows.items())]


def paused_ports_series(events: list[dict], t0_s: float) -> tuple[list[float], list[int]]:
    """How many ports were paused over time (seconds from ``t0_s``), as a step series from
    the pause and resume events."""
    paused: set[str] = set()
    ts, counts = [0.0], [0]
    for e in sorted(events, key=lambda e: e["t"]):
        key = f"{e['intf']}/{e.get('priority')}"
        if e["event"] == PAUSE:
            paused.add(key)
        elif e["event"] == RESUME:
            paused.discard(key)
        else:
            continue
        ts.append(e["t"] - t0_s)
        counts.append(len(paused))
    return ts, counts


# --- one run ----------------------------------------------------------------------------------


@dataclass
class ConditionResult:
    """One run: the victim's rate alone and beside the incast (Mbit/s), the incast's, drops,
    marks, pauses (totals and by hop distance) and the emulator's fidelity."""

    condition: str
    queue: dict
    scaling: dict
    host_tcp: dict
    victim_alone_mbit: float = 0.0
    victim_mbit: float = 0.0
    incast_mbit: list[float] = field(default_factory=list)
    queue_drops: int = 0
    lossless_drops: int | None = None
    ce_marks: int | None = None
    pause_frames_sent: int = 0
    paused_s: float = 0.0
    pause_storms: int = 0
    longest_pause_s: float = 0.0
    by_hop: list[dict] = field(default_factory=list)
    paused_series: tuple[list[float], list[int]] = ((), ())
    fidelity: dict = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)

    @property
    def max_paused_hops(self) -> int | None:
        return max((r["hops"] for r in self.by_hop if r["paused_ports"]), default=None)


def measure_condition(net, condition: str, config: PfcDemoConfig, settings: EcnSettings,
                      result: ConditionResult, log) -> None:
    """The victim alone, then beside the incast, every counter read around the second."""
    victim = (config.victim_src, config.victim_dst)
    rates, errors = run_flows(net, [victim], config.alone_s, config.omit_s, tos=LOSSLESS_TOS)
    result.victim_alone_mbit, result.errors = rates[0], errors
    log(f"  victim {victim[0]} -> {victim[1]} alone: {rates[0]:.1f} Mbit/s")
    senders = config.incast_senders()
    pairs = [victim, *((s, config.receiver) for s in senders)]
    edge, _ = net.fabric.host_attachment(config.receiver)
    bottleneck = f"{edge}->{config.receiver}"
    drops_before = net.queue_drops()
    switches_before = net.switch_counters()
    pfc_before = net.pfc.counters().get("interfaces", {}) if net.pfc is not None else None
    lossless_before = net.pfc_summary()["lossless_drops"] if net.pfc is not None else None
    report: dict = {}
    log(f"  victim beside {len(senders)} incast flows into {config.receiver} for "
        f"{config.contention_s} s")
    with Sampler(link_directions(net.fabric), net.switchd.pids) as sampler:
        with ecn_monitoring(net.marking, settings, report):
            t0 = time.monotonic()
            rates, errors = run_flows(net, pairs, config.contention_s, config.omit_s,
                                      tos=LOSSLESS_TOS)
            t1 = time.monotonic()
    result.victim_mbit, result.incast_mbit = rates[0], rates[1:]
    result.errors += errors
    queued = net.wait_switches_drained()
    result.queue_drops = net.queue_drops() - drops_before
    switches = {k: v - switches_before[k] for k, v in net.switch_counters().items()}
    if "ecn" in report:
        result.ce_marks = report["ecn"]["totals"].get("marks")
    # the measured part of the flows: after the servers' start and the omitted seconds
    start = sampler.since_start_s(t0 + SERVER_START_S + config.omit_s)
    end = min(start + config.contention_s, sampler.since_start_s(t1))
    delivered = window_rates_mbit(sampler.series, start, end)[bottleneck] / config.rate_mbit
    lost = emulator_losses(switches["rx_packets"], switches["tx_packets"],
                           switches["queue_drops"])
    verdict = judge(window_mean(sampler.series.cpu_busy_fraction, sampler.series, start, end),
                    window_mean(sampler.series.vswitchd_cores, sampler.series, start, end),
                    delivered, lost / max(switches["rx_packets"], 1))
    result.fidelity = {**verdict.to_dict(), "switch_packets": switches, "emulator_lost": lost,
                       "still_queued_packets": queued, "bottleneck": bottleneck}
    if net.pfc is None:
        return
    time.sleep(EVENTS_SETTLE_S)
    summary = net.pfc_summary()
    after = net.pfc.counters().get("interfaces", {})
    deltas = counter_deltas(pfc_before, after)
    events = in_window(read_json_lines(net.workdir / EVENTS_FILE), t0, t1)
    result.lossless_drops = summary["lossless_drops"] - lossless_before
    result.pause_frames_sent = int(sum(d["xoff_sent"] + d["xon_sent"] for d in deltas.values()))
    result.paused_s = round(sum(d["paused_s"] for d in deltas.values()), 6)
    result.pause_storms = int(sum(d["storms"] for d in deltas.values()))
    # the victim alone paused nothing, so the longest pause so far is the incast's
    result.longest_pause_s = max((c.get("longest_pause_s", 0.0) for c in after.values()),
                                 default=0.0)
    result.by_hop = spreading(events, deltas, net.fabric, edge)
    result.paused_series = paused_ports_series(events, t0)
    if not summary["agent_running"]:
        result.errors.append("the pause agent died during the run")


def condition_line(r: ConditionResult) -> str:
    line = (f"  victim {r.victim_mbit:.2f} Mbit/s beside the incast (alone "
            f"{r.victim_alone_mbit:.1f}), incast {sum(r.incast_mbit):.1f} Mbit/s, "
            f"{r.queue_drops} queue drops")
    if r.ce_marks is not None:
        line += f", {r.ce_marks} CE marks"
    if r.lossless_drops is not None:
        reach = ("no port paused" if r.max_paused_hops is None
                 else f"pauses up to {r.max_paused_hops} hops away")
        line += (f", {r.lossless_drops} lossless drops, {r.pause_frames_sent} pause frames, "
                 f"{r.paused_s:.2f} port-s paused, {reach}")
    return line


def run_condition(condition: str, config: PfcDemoConfig, platform, ecn_path: str, ledger,
                  workdir: Path, log) -> ConditionResult:
    from testbed.apply.network import FabricNetwork

    queue, record = config.queue(condition)
    tcp: TcpSettings = mode_tcp(ECN if condition == PFC_ECN else DROPTAIL, platform)
    result = ConditionResult(condition, queue_description(queue), record, tcp.to_dict())
    log(f"{condition}: k={FAT_TREE_K} fat-tree at {config.rate_mbit:g} Mbit/s, "
        f"{config.buffer_bytes} B per class"
        + (f", XOFF {queue.pfc.xoff_bytes} B, XON {queue.pfc.xon_bytes} B" if queue.pfc else "")
        + (f", ECN at K = {queue.ecn.start_bytes} B" if queue.ecn else "")
        + f"; hosts {tcp.congestion_control or 'kernel default'} with ECN "
          f"{'on' if tcp.ecn else 'off'}")
    outdir = workdir / condition.replace("+", "-")
    outdir.mkdir()
    datapath = "kernel" if platform.paths.ovs_datapath == "kernel" else "user"
    settings = EcnSettings(queue, record, ecn_path, sample_ms=0.0)
    with FabricNetwork(config.fabric(), outdir, ledger, datapath=datapath, log=log,
                       queue=queue, ecn_path=ecn_path, host_sysctls=tcp.sysctls()) as net:
        sent, answered = net.ping_all()
        if answered != sent:
            raise TestbedError(f"{condition}: only {answered}/{sent} reachability probes were "
                               f"answered; see {outdir}/controller.log")
        measure_condition(net, condition, config, settings, result, log)
    log(condition_line(result))
    return result


# --- verdict, plots, the run ------------------------------------------------------------------


def verdict(results: dict[str, ConditionResult]) -> dict:
    """The three demonstrations and the lossless promise, each stated from the measurement
    (None where a run it needs was not made)."""
    lossy, pfc, both = (results.get(c) for c in CONDITIONS)
    checks: dict[str, bool | None] = dict.fromkeys(
        ("head_of_line_blocking", "spreading_beyond_one_hop", "ecn_cuts_pause_time",
         "lossless"))
    statements = []
    if lossy and pfc:
        bound = lossy.victim_mbit * (1 - VICTIM_SLOWED_BY)
        checks["head_of_line_blocking"] = pfc.victim_mbit <= bound
        statements.append(
            f"head-of-line blocking: the victim, which never uses the congested port, got "
            f"{pfc.victim_mbit:.2f} Mbit/s under PFC against {lossy.victim_mbit:.2f} in the "
            f"lossy run ({'' if checks['head_of_line_blocking'] else 'NOT '}at most "
            f"{1 - VICTIM_SLOWED_BY:.0%} of it); alone it got {pfc.victim_alone_mbit:.2f}")
    if pfc:
        hops = pfc.max_paused_hops
        checks["spreading_beyond_one_hop"] = hops is not None and hops >= SPREAD_MIN_HOPS
        where = ", ".join(f"{len(r['paused_ports'])} at {r['hops']} hops"
                          for r in pfc.by_hop if r["paused_ports"])
        reach = "more than one hop" if checks["spreading_beyond_one_hop"] else "NOT beyond one hop"
        if hops is None:
            statements.append("congestion spreading: under PFC no port was paused; NOT beyond "
                              "one hop")
        else:
            statements.append(
                f"congestion spreading: under PFC ports were paused up to {hops} hops from the "
                f"congested switch ({where}); {reach}")
    if pfc and both and pfc.paused_s == 0:
        checks["ecn_cuts_pause_time"] = False
        statements.append("ECN cuts the pause time: NOT shown, PFC alone paused nothing")
    elif pfc and both:
        checks["ecn_cuts_pause_time"] = both.paused_s <= pfc.paused_s * (1 - PAUSE_CUT_BY)
        statements.append(
            f"ECN cuts the pause time: {both.paused_s:.2f} port-s paused with ECN against "
            f"{pfc.paused_s:.2f} with PFC alone ({'' if checks['ecn_cuts_pause_time'] else 'NOT '}"
            f"at most {1 - PAUSE_CUT_BY:.0%}); {both.ce_marks} CE marks")
    lossless = [r for r in (pfc, both) if r]
    if lossless:
        checks["lossless"] = all(r.lossless_drops == 0 for r in lossless)
        statements.append("lossless class drops: " + ", ".join(
            f"{r.condition} {r.lossless_drops}" for r in lossless)
            + "; pause storms (a port paused over the threshold in one go): "
            + ", ".join(f"{r.condition} {r.pause_storms} (longest pause {r.longest_pause_s:.3f} s)"
                        for r in lossless))
    for r in results.values():
        f = r.fidelity
        if f and not f["trustworthy"]:
            statements.append(f"{r.condition}: the emulator may not have kept up: "
                              + "; ".join(f["reasons"]))
        for error in r.errors:
            statements.append(f"{r.condition}: {error}")
    return {"checks": checks, "statements": statements,
            "tolerances": {"victim_slowed_by": VICTIM_SLOWED_BY,
                           "spread_min_hops": SPREAD_MIN_HOPS, "pause_cut_by": PAUSE_CUT_BY},
            "emulator_trusted": bool(results) and all(r.fidelity.get("trustworthy", False)
                                                      for r in results.values())}


def plot(results: dict[str, ConditionResult], config: PfcDemoConfig, path: Path) -> None:
    """Three panels: the victim's rate alone and beside the incast per run; port-seconds
    paused by hop distance; paused ports over time."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = list(results.values())
    fig, (victim, hops, series) = plt.subplots(1, 3, figsize=(15, 4))
    xs = range(len(runs))
    victim.bar([x - 0.2 for x in xs], [r.victim_alone_mbit for r in runs], 0.4, label="alone")
    victim.bar([x + 0.2 for x in xs], [r.victim_mbit for r in runs], 0.4, label="beside incast")
    victim.set_xticks(list(xs), [r.condition for r in runs])
    victim.set_ylabel("victim throughput (Mbit/s)")
    victim.set_title("head-of-line blocking")
    victim.legend()
    paused = [r for r in runs if r.lossless_drops is not None]  # the runs with PFC
    levels = sorted({row["hops"] for r in paused for row in r.by_hop})
    width = 0.8 / max(len(paused), 1)
    for i, r in enumerate(paused):
        per_hop = {row["hops"]: row["paused_s"] for row in r.by_hop}
        hops.bar([h + (i - (len(paused) - 1) / 2) * width for h in levels],
                 [per_hop.get(h, 0.0) for h in levels], width, label=r.condition)
        t, n = r.paused_series
        series.step(t, n, where="post", label=r.condition)
    hops.set_xticks(levels)
    hops.set_xlabel("hops from the congested switch")
    hops.set_ylabel("port-seconds paused")
    hops.set_title("congestion spreading")
    series.set_xlabel("time since the incast started (s)")
    series.set_ylabel("ports paused")
    series.set_title("pauses over time")
    for ax in (hops, series):
        if paused:
            ax.legend()
    fig.suptitle(f"PFC on the k={FAT_TREE_K} fat-tree, {config.rate_mbit:g} Mbit/s links, "
                 f"{len(config.incast_senders())}:1 incast into {config.receiver}, victim "
                 f"{config.victim_src} -> {config.victim_dst}")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def run_pfc_demo(config: PfcDemoConfig, log=print) -> dict:
    """Every condition on its own fabric; summary.json, pfc-demo.png and the verdict. A run
    that stops part-way leaves what it measured in summary.json."""
    config.validate()
    platform = detect()
    ecn_path = choose_ecn_path(platform, None, object_built=object_is_current())
    run_id = new_run_id("pfc-demo")
    workdir = Path(config.results_dir) / run_id
    results: dict[str, ConditionResult] = {}

    def summary(complete: bool) -> dict:
        return {"complete": complete, "config": asdict(config), "marking_path": ecn_path,
                "results": {c: {**asdict(r), "max_paused_hops": r.max_paused_hops}
                            for c, r in results.items()},
                "verdict": verdict(results)}
    try:
        with interrupts_as_exceptions(), machine(run_id, log) as ledger:
            workdir.mkdir(parents=True, exist_ok=True)
            for condition in config.conditions:
                results[condition] = run_condition(condition, config, platform, ecn_path,
                                                   ledger, workdir, log)
    except BaseException:
        if results:
            (workdir / "summary.json").write_text(json.dumps(summary(False), indent=1))
            log(f"the run stopped; what it measured is in {workdir / 'summary.json'}")
        raise
    out = summary(True)
    (workdir / "summary.json").write_text(json.dumps(out, indent=1))
    plot(results, config, workdir / "pfc-demo.png")
    for line in out["verdict"]["statements"]:
        log(line)
    log(f"results in {workdir}: summary.json, pfc-demo.png")
    return out
