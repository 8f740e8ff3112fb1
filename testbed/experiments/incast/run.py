"""Incast on the k=4 fat-tree: N synchronised senders answering one receiver, under three
switch queue modes.

Partition/aggregate (a query fanned out to N workers, whose answers all come back at once)
overflows the receiver's switch queue; with drop-tail queues, the losses that hit a flow's
last packets can only be repaired by a TCP retransmission timeout (at least 200 ms on
Linux), so query completion times jump by orders of magnitude (Vasudevan et al., "Safe and
effective fine-grained TCP retransmissions for datacenter communication", SIGCOMM 2009).
ECN marking with DCTCP keeps the queue short enough to avoid the losses (Alizadeh et al.,
SIGCOMM 2010); PFC pauses the upstream ports instead of dropping, so a lossless class loses
nothing (IEEE 802.1Qbb), at the price of pausing.

Modes, each on a fresh fabric whose every switch port gets the same byte buffer:

- ``droptail``: the buffer alone; hosts run cubic (reno without it), ECN off;
- ``ecn``: DCTCP step marking at K (``testbed.plan.scaling``, scheme dctcp, scaled to the
  link rate); hosts ``tcp_cc: auto`` (dctcp where the kernel has it, else cubic with ECN);
- ``pfc``: PFC on the lossless class (``testbed.plan.scaling.pfc_thresholds``), no ECN; the
  traffic is in that class (DSCP 26 by default); hosts as in drop-tail.

For each mode and fan-in, ``testbed.traffic.incast`` runs a server on each sender and a client on the
receiver, which sends every round's requests at the same instant. Measured per fan-in:
query (round) and per-flow completion times, TCP retransmission timeouts (TcpExt
TCPTimeouts) and retransmitted segments (Tcp RetransSegs) read in every participant's
namespace before and after, drops at every emulated queue, ECN marks, PFC pauses
(``FabricNetwork.pfc_summary``), goodput, and packet conservation at the switches (as
``testbed.measure.fidelity`` checks it). Results go to ``results/<run-id>/``: summary.json, one
folder per mode with each client's raw output, incast.png and, for a fan-in sweep,
incast-fanin.png.
"""
from __future__ import annotations

import json
import math
import subprocess
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path

from testbed.apply.marking import ecn_monitoring, object_is_current
from testbed.apply.network import FabricNetwork, default_buffer_bytes
from testbed.capabilities import Platform, detect, missing_capabilities
from testbed.errors import ConfigError, TestbedError
from testbed.harness.flows import counter_deltas, read_tcp_counters
from testbed.harness.run import interrupts_as_exceptions, machine, new_run_id
from testbed.measure.fidelity import MAX_EMULATOR_LOSS_FRACTION, emulator_losses
from testbed.measure.stats import percentile
from testbed.model.topology.base import Fabric
from testbed.model.topology.checks import check_count, check_rate, is_int
from testbed.model.topology.fattree import fat_tree
from testbed.plan.ecn_plan import choose_ecn_path
from testbed.plan.profiles import DEFAULT_CLASSES, U32_MAX, QueueConfig
from testbed.plan.scaling import DEFAULT_PFC_REACTION_TIME_S as PAUSE_REACTION_TIME_S
from testbed.plan.scaling import pfc_thresholds, scaled_queue_config
from testbed.plan.settings import (
    TCP_CC_AUTO,
    EcnSettings,
    TcpSettings,
    queue_record,
    tcp_settings,
)
from testbed.traffic.incast import DEFAULT_CONNECT_TIMEOUT_S, MAX_DSCP

DROPTAIL, ECN, PFC = "droptail", "ecn", "pfc"
MODES = (DROPTAIL, ECN, PFC)
FAT_TREE_K = 4
HOSTS = FAT_TREE_K ** 3 // 4
MAX_FANIN = HOSTS - 1
DEFAULT_FANIN = MAX_FANIN
SWEEP_EXAMPLE = (1, 3, 7, 15)
LOSSLESS_DSCP = next(tc.dscp[0] for tc in DEFAULT_CLASSES if tc.lossless)  # 26: RoCE's class
BASE_PORT = 5600  # fan-in i of a mode listens on BASE_PORT + i
MAX_RESPONSE_BYTES = 1 << 30
MAX_ROUNDS = 1000
MAX_GAP_S = 60.0
MIN_MTU_BYTES, MAX_MTU_BYTES = 576, 9000
MAX_RATE_MBIT = 10000.0
MIN_BUFFER_FRAMES = 2  # a buffer must hold a frame in service and one behind it
# Congestion control of the modes without ECN: Linux's default before bbr, and what the
# incast and DCTCP papers compared against as "TCP". Reno where the kernel lacks cubic.
BASE_CC, FALLBACK_CC = "cubic", "reno"
CLIENT_GRACE_S = 30.0  # beyond the rounds' own time limits, before the client counts as hung
SERVER_EXIT_S = 5.0  # servers exit once the client closes its connections
PFC_SUMMARY_KEYS = ("pause_frames_sent", "pause_frames_received", "paused_time_s",
                    "lossless_drops")
PFC_MISSING = ("pfc mode needs PFC pause enforcement in the fabric (FabricNetwork.pfc_summary), "
               f"which this testbed does not have yet; run the other modes with --mode {DROPTAIL} "
               f"--mode {ECN}")
# Named tolerances of the verdict.
FASTER_BY = 0.10  # a mode's p99 completion "below drop-tail's": at least 10% lower


@dataclass
class IncastConfig:
    """What to run. ``fanins``: the numbers of senders to measure (one value, or a sweep
    such as 1,3,7,15), each at most ``MAX_FANIN``; ``response_bytes``: what each sender
    answers per query; ``warmup_rounds``: queries before the recorded ``rounds`` (the first
    exchanges meet cold caches, such as the userspace datapath's flow cache, that are the
    emulator's and not the network's); ``buffer_bytes``: every switch port's egress
    buffer, None for ``testbed.apply.network.default_buffer_bytes`` at the link rate; ``dscp``:
    the traffic class of every incast packet in every mode (26, the lossless class, by
    default, so that only the queue differs between modes); ``pfc_reaction_time_s``: the
    pause path's reaction time that sizes the PFC headroom (``testbed.plan.scaling``), by
    default the emulated path's (``testbed.apply.pfc_runtime``), not a hardware switch's."""

    fanins: tuple[int, ...] = (DEFAULT_FANIN,)
    response_bytes: int = 64 * 1024
    rounds: int = 20
    warmup_rounds: int = 1
    gap_s: float = 0.2
    rate_mbit: float = 10.0
    mtu_bytes: int = 1500
    buffer_bytes: int | None = None
    modes: tuple[str, ...] = MODES
    dscp: int = LOSSLESS_DSCP
    pfc_reaction_time_s: float = PAUSE_REACTION_TIME_S
    round_timeout_s: float = 60.0
    receiver: str = "p0e0h0"
    results_dir: str = "results"

    def port_buffer_bytes(self) -> int:
        if self.buffer_bytes is None:
            return default_buffer_bytes(self.rate_mbit, self.mtu_bytes)
        return self.buffer_bytes

    def fabric(self) -> Fabric:
        return fat_tree(FAT_TREE_K, host_rate_mbit=self.rate_mbit, mtu_bytes=self.mtu_bytes)

    def validate(self) -> None:
        """Every field, and each mode's queue, checked: a one-line ConfigError naming the
        field for the first problem."""
        _check_choices("fanins", self.fanins, lambda n: is_int(n) and 1 <= n <= MAX_FANIN,
                       f"integers in [1, {MAX_FANIN}] (the k={FAT_TREE_K} fat-tree has "
                       f"{HOSTS} hosts)")
        _check_choices("modes", self.modes, lambda m: m in MODES, f"among {', '.join(MODES)}")
        check_count("response_bytes", self.response_bytes, 1, MAX_RESPONSE_BYTES)
        check_count("rounds", self.rounds, 1, MAX_ROUNDS)
        check_count("warmup_rounds", self.warmup_rounds, 0, MAX_ROUNDS)
        _check_seconds("gap_s", self.gap_s, MAX_GAP_S, zero_ok=True)
        _check_seconds("round_timeout_s", self.round_timeout_s, math.inf)
        _check_seconds("pfc_reaction_time_s", self.pfc_reaction_time_s, 1.0, zero_ok=True)
        check_rate("rate_mbit", self.rate_mbit)
        if self.rate_mbit > MAX_RATE_MBIT:
            raise ConfigError("rate_mbit", f"must be at most {MAX_RATE_MBIT:g}, "
                                           f"got {self.rate_mbit!r}")
        check_count("mtu_bytes", self.mtu_bytes, MIN_MTU_BYTES, MAX_MTU_BYTES)
        if self.buffer_bytes is not None:
            check_count("buffer_bytes", self.buffer_bytes, MIN_BUFFER_FRAMES * self.mtu_bytes,
                        U32_MAX)
        check_count("dscp", self.dscp, 0, MAX_DSCP)
        hosts = [h.name for h in self.fabric().hosts]
        if self.receiver not in hosts:
            raise ConfigError("receiver", f"must be a host of the k={FAT_TREE_K} fat-tree "
                                          f"({hosts[0]} .. {hosts[-1]}), got {self.receiver!r}")
        for mode in self.modes:
            queue, _ = mode_queue(mode, self)
            if mode == PFC and queue.priority_for_dscp(self.dscp) not in queue.lossless_priorities:
                raise ConfigError("dscp", f"pfc mode needs the traffic in a lossless class "
                                          f"(DSCP {LOSSLESS_DSCP}), got {self.dscp}")


def _check_choices(name: str, values, ok, what: str) -> None:
    if not isinstance(values, (tuple, list)) or not values:
        raise ConfigError(name, f"must be a non-empty list of {what}, got {values!r}")
    for value in values:
        if not ok(value):
            raise ConfigError(name, f"must hold {what}, got {value!r}")
    if len(set(values)) != len(values):
        raise ConfigError(name, f"lists a value twice: {list(values)}")


def _check_seconds(name: str, value, maximum: float, zero_ok: bool = False) -> None:
    """A finite number of seconds in [0 or above 0, maximum]."""
    number = not isinstance(value, bool) and isinstance(value, (int, float))
    if not number or not math.isfinite(value) or value > maximum \
            or not (value >= 0 if zero_ok else value > 0):
        bound = "[0" if zero_ok else "(0"
        top = f"{maximum:g}]" if maximum < math.inf else "inf)"
        raise ConfigError(name, f"must be a number of seconds in {bound}, {top}, got {value!r}")


def parse_int_list(name: str, text: str) -> tuple[int, ...]:
    """``"1,3,7,15"`` -> (1, 3, 7, 15); anything else is a ConfigError on ``name``."""
    try:
        return tuple(int(item) for item in text.split(","))
    except ValueError:
        raise ConfigError(name, f"expected comma-separated integers such as "
                                f"{','.join(map(str, SWEEP_EXAMPLE))}, got {text!r}") from None


# --- per mode: the queue and the hosts' TCP ---------------------------------------------------


def mode_queue(mode: str, config: IncastConfig) -> tuple[QueueConfig, dict]:
    """Every switch port's queue in ``mode``, and the record of how it was chosen."""
    buffer_bytes = config.port_buffer_bytes()
    if mode == DROPTAIL:
        return QueueConfig(buffer_bytes=buffer_bytes), {"buffer_bytes": buffer_bytes}
    if mode == ECN:
        return scaled_queue_config("dctcp", config.rate_mbit, config.mtu_bytes, buffer_bytes,
                                   pfc=False)
    if mode == PFC:
        pfc, record = pfc_thresholds(config.rate_mbit, config.mtu_bytes, buffer_bytes,
                                     reaction_time_s=config.pfc_reaction_time_s)
        return (QueueConfig(buffer_bytes=buffer_bytes, pfc=pfc),
                {"buffer_bytes": buffer_bytes, "pfc": record})
    raise ConfigError("modes", f"must hold values among {', '.join(MODES)}, got {mode!r}")


def mode_tcp(mode: str, platform: Platform) -> TcpSettings:
    """The hosts' TCP in ``mode``: ECN and the best congestion control for it in ecn mode;
    otherwise cubic (reno where it is missing) without ECN, the same in both other modes."""
    if mode == ECN:
        return tcp_settings(True, TCP_CC_AUTO, platform)
    cc = FALLBACK_CC if missing_capabilities(platform.capabilities, ["tcp_cubic"]) else BASE_CC
    return tcp_settings(False, cc, platform)


def queue_description(queue: QueueConfig) -> dict:
    """A queue as plain data: buffer, ECN profile and PFC thresholds."""
    return {**queue_record(queue), "pfc": asdict(queue.pfc) if queue.pfc is not None else None}


def sender_hosts(fabric: Fabric, receiver: str, fanin: int) -> list[str]:
    """The first ``fanin`` senders, taken from the pods in turn, starting with the pod after
    the receiver's and ending with its own: a fan-in of 3 comes from the 3 other pods, and
    every fan-in spreads over as many pods (and core paths) as it can."""
    k = fabric.params["k"]
    home = fabric.nodes[receiver].coords[0]
    by_pod: dict[int, list[str]] = {pod: [] for pod in range(k)}
    for host in fabric.hosts:
        if host.name != receiver:
            by_pod[host.coords[0]].append(host.name)
    pods = [(home + step) % k for step in range(1, k + 1)]
    deepest = max(len(hosts) for hosts in by_pod.values())
    order = [by_pod[pod][depth] for depth in range(deepest) for pod in pods
             if depth < len(by_pod[pod])]
    if fanin > len(order):
        raise ConfigError("fanins", f"{fanin} senders asked, the fabric has {len(order)} "
                                    f"besides {receiver}")
    return order[:fanin]


def bottleneck_port(fabric: Fabric, receiver: str) -> str:
    """The switch port that sends to the receiver: where incast queues build."""
    link, end = fabric.host_link(receiver)
    return link.intf(1 - end)


# --- counters ---------------------------------------------------------------------------------


def pfc_counters(net) -> dict:
    """The fabric's PFC counters so far (``FabricNetwork.pfc_summary``)."""
    summary = getattr(net, "pfc_summary", None)
    if summary is None:
        raise TestbedError(PFC_MISSING)
    values = summary()
    missing = [key for key in PFC_SUMMARY_KEYS if key not in values]
    if missing:
        raise TestbedError(f"FabricNetwork.pfc_summary() lacks {', '.join(missing)}")
    return values


def pfc_delta(before: dict, after: dict) -> dict:
    """The PFC counters' increase over a measurement, and the summary as read after it."""
    return {**{key: after[key] - before[key] for key in PFC_SUMMARY_KEYS}, "after": after}


# --- one measurement --------------------------------------------------------------------------


@dataclass
class IncastMeasurement:
    """One mode at one fan-in: the client's timings (seconds; ``flow_s`` per round, per
    sender in ``senders`` order; the warm-up rounds' apart) and the counters' increase over
    the measurement, which also covers connection set-up and the warm-up rounds.
    ``queue_drops`` counts every emulated queue (switch ports and host NICs), ``switches``
    the switch ports only; ``queues`` the marker's totals and the bottleneck port's own
    counters; ``tcp`` per host {"timeouts", "retransmits"}; ``pfc`` the pause counters."""

    mode: str
    fanin: int
    receiver: str
    senders: list[str]
    response_bytes: int
    round_s: list[float] = field(default_factory=list)
    flow_s: list[list[float]] = field(default_factory=list)
    send_spread_s: list[float] = field(default_factory=list)
    warmup_round_s: list[float] = field(default_factory=list)
    tcp: dict[str, dict[str, int]] = field(default_factory=dict)
    queue_drops: int = 0
    switches: dict[str, int] = field(default_factory=dict)
    queues: dict | None = None
    pfc: dict | None = None
    error: str | None = None


def client_argv(servers: list[str], port: int, config: IncastConfig) -> list[str]:
    return [sys.executable, "-m", "testbed.traffic.incast", "query", "--servers", ",".join(servers),
            "--port", str(port), "--response-bytes", str(config.response_bytes),
            "--rounds", str(config.rounds), "--warmup", str(config.warmup_rounds),
            "--gap-s", repr(config.gap_s), "--dscp", str(config.dscp),
            "--round-timeout-s", repr(config.round_timeout_s)]


def server_argv(port: int, dscp: int) -> list[str]:
    return [sys.executable, "-m", "testbed.traffic.incast", "serve", "--port", str(port),
            "--dscp", str(dscp), "--connections", "1"]


def client_limit_s(config: IncastConfig) -> float:
    """How long a client may take before it counts as hung."""
    rounds = config.warmup_rounds + config.rounds
    return (DEFAULT_CONNECT_TIMEOUT_S + rounds * (config.round_timeout_s + config.gap_s)
            + CLIENT_GRACE_S)


def run_programs(net: FabricNetwork, receiver: str, senders: list[str], port: int,
                 config: IncastConfig, outdir: Path) -> dict:
    """A server on every sender, the client on the receiver; the client's result."""
    ips = [net.fabric.nodes[s].ip for s in senders]
    procs = []
    try:
        for sender in senders:
            with open(outdir / f"{sender}.err", "wb") as err:
                procs.append(net.popen(sender, server_argv(port, config.dscp),
                                       stdout=subprocess.DEVNULL, stderr=err))
        with open(outdir / "client.err", "wb") as err:
            client = net.popen(receiver, client_argv(ips, port, config),
                               stdout=subprocess.PIPE, stderr=err)
        procs.append(client)
        try:
            out, _ = client.communicate(timeout=client_limit_s(config))
        except subprocess.TimeoutExpired:
            raise TestbedError(f"the incast client on {receiver} did not finish in "
                               f"{client_limit_s(config):.0f} s") from None
        (outdir / "client.json").write_bytes(out)
        if client.returncode not in (0, 1) or not out.strip():
            tail = (outdir / "client.err").read_text(errors="replace")[-400:].strip()
            raise TestbedError(f"the incast client on {receiver} failed "
                               f"(exit {client.returncode}): {tail}")
        for proc in procs[:-1]:
            try:
                proc.wait(timeout=SERVER_EXIT_S)
            except subprocess.TimeoutExpired:
                pass  # killed below
        return json.loads(out)
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
            proc.wait()


def measure(net: FabricNetwork, mode: str, fanin: int, port: int, config: IncastConfig,
            settings: EcnSettings, outdir: Path) -> IncastMeasurement:
    """``config.rounds`` queries (after the warm-up ones) from ``fanin`` senders to the
    receiver, with every counter read before and after."""
    receiver = config.receiver
    senders = sender_hosts(net.fabric, receiver, fanin)
    m = IncastMeasurement(mode, fanin, receiver, senders, config.response_bytes)
    outdir.mkdir(parents=True, exist_ok=True)
    hosts = [*senders, receiver]
    tcp_before = read_tcp_counters(net, hosts)
    drops_before = net.queue_drops()
    switches_before = net.switch_counters()
    pfc_before = pfc_counters(net) if mode == PFC else None
    report: dict = {}
    with ecn_monitoring(net.marking, settings, report):
        client = run_programs(net, receiver, senders, port, config, outdir)
    m.tcp = counter_deltas(tcp_before, read_tcp_counters(net, hosts))
    m.queue_drops = net.queue_drops() - drops_before
    m.switches = {k: v - switches_before[k] for k, v in net.switch_counters().items()}
    if pfc_before is not None:
        m.pfc = pfc_delta(pfc_before, pfc_counters(net))
    if "ecn" in report:
        intf = bottleneck_port(net.fabric, receiver)
        m.queues = {"path": report["ecn"]["path"], "totals": report["ecn"]["totals"],
                    "bottleneck_port": intf,
                    "bottleneck": report["ecn"]["ports"].get(intf)}
    rounds = client.get("rounds", [])
    m.round_s = [r["round_s"] for r in rounds]
    m.flow_s = [r["flow_s"] for r in rounds]
    m.send_spread_s = [r["send_spread_s"] for r in rounds]
    m.warmup_round_s = [r["round_s"] for r in client.get("warmup_rounds", [])]
    m.error = client.get("error")
    return m


# --- statistics -------------------------------------------------------------------------------


def completion_stats(values: list[float]) -> dict:
    """Count, mean, median, p99 and max of completion times in seconds (None when empty)."""
    if not values:
        return {"count": 0, "mean_s": None, "median_s": None, "p99_s": None, "max_s": None}
    return {"count": len(values), "mean_s": sum(values) / len(values),
            "median_s": percentile(values, 50), "p99_s": percentile(values, 99),
            "max_s": max(values)}


def ideal_round_s(fanin: int, response_bytes: int, rate_mbit: float) -> float:
    """The time the receiver's link needs for a round's payload at its full rate: a lower
    bound (headers and the request's round trip not counted)."""
    return fanin * response_bytes * 8 / (rate_mbit * 1e6)


def summarize(m: IncastMeasurement, rate_mbit: float) -> dict:
    """One measurement's figures: completion statistics, goodput, losses, marks, pauses."""
    rounds = completion_stats(m.round_s)
    flows = completion_stats([t for r in m.flow_s for t in r])
    ideal = ideal_round_s(m.fanin, m.response_bytes, rate_mbit)
    goodput = [m.fanin * m.response_bytes * 8 / s / 1e6 for s in m.round_s if s > 0]
    median_goodput = percentile(goodput, 50) if goodput else None
    sender_tcp = [m.tcp[s] for s in m.senders if s in m.tcp]
    switch_drops = m.switches.get("queue_drops", 0)
    lost = emulator_losses(m.switches.get("rx_packets", 0), m.switches.get("tx_packets", 0),
                           switch_drops)
    totals = (m.queues or {}).get("totals") or {}
    pfc = m.pfc or {}
    return {
        "mode": m.mode, "fanin": m.fanin, "rounds_done": len(m.round_s), "error": m.error,
        "round": rounds, "flow": flows, "ideal_round_s": ideal,
        "median_over_ideal": rounds["median_s"] / ideal if rounds["median_s"] else None,
        "goodput_mbit": median_goodput,
        "goodput_fraction": median_goodput / rate_mbit if median_goodput is not None else None,
        "send_spread_max_s": max(m.send_spread_s, default=None),
        "warmup_round_s": m.warmup_round_s,
        "tcp_timeouts": sum(c["timeouts"] for c in m.tcp.values()),
        "tcp_retransmits": sum(c["retransmits"] for c in m.tcp.values()),
        "sender_timeouts": sum(c["timeouts"] for c in sender_tcp),
        "queue_drops": m.queue_drops, "switch_queue_drops": switch_drops,
        "host_queue_drops": m.queue_drops - switch_drops,
        "ce_marks": totals.get("marks"), "max_queue_bytes": totals.get("max_queue_bytes"),
        "pause_frames_sent": pfc.get("pause_frames_sent"),
        "paused_time_s": pfc.get("paused_time_s"),
        "lossless_drops": pfc.get("lossless_drops"),
        "emulator_lost_packets": lost,
        "emulator_loss_fraction": lost / max(m.switches.get("rx_packets", 0), 1),
    }


# --- the run ----------------------------------------------------------------------------------


@dataclass
class IncastResult:
    """The config, each mode's set-up (queue, its scaling record, hosts' TCP) and every
    measurement, in the order they ran."""

    config: dict
    modes: dict[str, dict] = field(default_factory=dict)
    measurements: list[IncastMeasurement] = field(default_factory=list)


def require_pfc_support(network_class=FabricNetwork) -> None:
    """Refuse pfc mode before anything is built when the fabric cannot pause."""
    if not hasattr(network_class, "pfc_summary"):
        raise TestbedError(PFC_MISSING)


def measurement_line(s: dict) -> str:
    """One progress line for a measurement's summary."""
    r = s["round"]
    times = (f"median {r['median_s']:.3f} s, p99 {r['p99_s']:.3f} s, max {r['max_s']:.3f} s"
             if r["count"] else "no round completed")
    extra = ""
    if s["ce_marks"] is not None:
        extra += f", {s['ce_marks']} CE marks"
    if s["pause_frames_sent"] is not None:
        extra += f", {s['pause_frames_sent']} pauses sent, {s['lossless_drops']} lossless drops"
    line = (f"  fan-in {s['fanin']:2d}: {s['rounds_done']} rounds, {times} (ideal "
            f"{s['ideal_round_s']:.3f} s); {s['queue_drops']} queue drops, "
            f"{s['tcp_timeouts']} TCP timeouts, {s['tcp_retransmits']} retransmits{extra}")
    return line + (f"; STOPPED: {s['error']}" if s["error"] else "")


def run_mode(mode: str, queue: QueueConfig, record: dict, tcp: TcpSettings,
             config: IncastConfig, ledger, workdir: Path, datapath: str, ecn_path: str,
             result: IncastResult, log=print) -> None:
    """One mode: its fabric up, reachability proved, every fan-in measured in turn (each
    measurement joins ``result`` as soon as it is done)."""
    result.modes[mode] = {"queue": queue_description(queue), "scaling": record,
                          "host_tcp": tcp.to_dict(), "marking_path": ecn_path}
    log(f"{mode}: k={FAT_TREE_K} fat-tree, {config.rate_mbit:g} Mbit/s links, MTU "
        f"{config.mtu_bytes}, queue {queue_description(queue)}, hosts "
        f"{tcp.congestion_control or 'kernel default'} with ECN {'on' if tcp.ecn else 'off'}, "
        f"traffic in DSCP {config.dscp}")
    outdir = workdir / mode
    outdir.mkdir()
    settings = EcnSettings(queue, record, ecn_path, sample_ms=0.0)
    with FabricNetwork(config.fabric(), outdir, ledger, datapath=datapath, routing="ecmp",
                       log=log, queue=queue, ecn_path=ecn_path,
                       host_sysctls=tcp.sysctls()) as net:
        sent, answered = net.ping_all()
        log(f"  fabric up in {net.timings.build_s:.1f} s, programmed "
            f"{net.timings.programmed_s:.1f} s later; {answered}/{sent} probes answered")
        if answered != sent:
            raise TestbedError(f"{mode}: only {answered}/{sent} reachability probes were "
                               f"answered; see {outdir}/controller.log")
        for index, fanin in enumerate(config.fanins):
            log(f"  fan-in {fanin:2d}: {config.rounds} rounds of {config.response_bytes} B "
                f"from each of {fanin} senders to {config.receiver}")
            m = measure(net, mode, fanin, BASE_PORT + index, config, settings,
                        outdir / f"fanin{fanin}")
            result.measurements.append(m)
            log(measurement_line(summarize(m, config.rate_mbit)))


def run_incast(config: IncastConfig, log=print) -> IncastResult:
    """Every mode on its own fabric, every fan-in on it; results, table, plots, verdict.
    A run that fails part-way still leaves what it measured in summary.json."""
    config.validate()
    if PFC in config.modes:
        require_pfc_support()
    platform = detect()
    datapath = "kernel" if platform.paths.ovs_datapath == "kernel" else "user"
    ecn_path = choose_ecn_path(platform, None, object_built=object_is_current())
    plans = {mode: (*mode_queue(mode, config), mode_tcp(mode, platform)) for mode in config.modes}
    result = IncastResult(config=asdict(config))
    run_id = new_run_id("incast")
    workdir = Path(config.results_dir) / run_id
    try:
        with interrupts_as_exceptions(), machine(run_id, log) as ledger:
            workdir.mkdir(parents=True, exist_ok=True)
            (workdir / "config.json").write_text(json.dumps(asdict(config), indent=1))
            for mode, (queue, record, tcp) in plans.items():
                run_mode(mode, queue, record, tcp, config, ledger, workdir, datapath, ecn_path,
                         result, log)
    except BaseException:
        if result.measurements:
            partial = {"complete": False, "result": asdict(result), "summaries": summaries(result)}
            (workdir / "summary.json").write_text(json.dumps(partial, indent=1))
            log(f"the run stopped; what it measured is in {workdir / 'summary.json'}")
        raise
    for path in write_incast_results(result, workdir):
        log(f"wrote {path}")
    log(format_table(result))
    for line in verdict(result)["statements"]:
        log(line)
    log(f"results in {workdir}")
    return result


# --- verdict, table, plots --------------------------------------------------------------------


def summaries(result: IncastResult) -> list[dict]:
    rate_mbit = result.config["rate_mbit"]
    return [summarize(m, rate_mbit) for m in result.measurements]


def timeout_onset(rows: list[dict], mode: str) -> int | None:
    """The smallest fan-in at which ``mode`` saw a TCP retransmission timeout."""
    fanins = [s["fanin"] for s in rows if s["mode"] == mode and s["tcp_timeouts"] > 0]
    return min(fanins, default=None)


def verdict(result: IncastResult) -> dict:
    """What the largest fan-in showed in each mode, against what the literature expects,
    stated from the measurement: ``checks`` (None where a mode did not run), ``statements``
    (one sentence each) and whether the emulator kept up (packet conservation)."""
    rows = summaries(result)
    if not rows:
        return {"fanin": None, "checks": {}, "statements": ["nothing was measured"],
                "timeout_onset_fanin": {}, "emulator_trusted": None}
    fanin = max(s["fanin"] for s in rows)
    top = {mode: next((s for s in rows if s["mode"] == mode and s["fanin"] == fanin), None)
           for mode in MODES}
    drop, ecn, pfc = top[DROPTAIL], top[ECN], top[PFC]
    checks: dict[str, bool | None] = dict.fromkeys(
        ("droptail_drops", "droptail_timeouts", "ecn_marked", "ecn_fewer_timeouts",
         "ecn_tail_below_droptail", "pfc_lossless", "pfc_paused", "pfc_tail_below_droptail"))
    statements = []
    if drop is not None:
        checks["droptail_drops"] = drop["queue_drops"] > 0
        checks["droptail_timeouts"] = drop["tcp_timeouts"] > 0
        agrees = "as" if checks["droptail_timeouts"] else "NOT as"
        statements.append(
            f"drop-tail, fan-in {fanin}: {drop['queue_drops']} queue drops, "
            f"{drop['tcp_timeouts']} TCP timeouts ({agrees} incast predicts: losses repaired "
            "only by retransmission timeouts)")
    if ecn is not None:
        checks["ecn_marked"] = bool(ecn["ce_marks"])
        line = (f"ECN, fan-in {fanin}: {ecn['ce_marks']} CE marks, {ecn['queue_drops']} queue "
                f"drops, {ecn['tcp_timeouts']} TCP timeouts")
        if drop is not None and drop["tcp_timeouts"] == 0:
            line += " (drop-tail had no timeouts for ECN to remove)"
        elif drop is not None:
            checks["ecn_fewer_timeouts"] = ecn["tcp_timeouts"] < drop["tcp_timeouts"]
            line += (f" ({'fewer' if checks['ecn_fewer_timeouts'] else 'NOT fewer'} than "
                     f"drop-tail's {drop['tcp_timeouts']})")
        statements.append(line)
    if pfc is not None:
        checks["pfc_lossless"] = pfc["lossless_drops"] == 0 and pfc["switch_queue_drops"] == 0
        checks["pfc_paused"] = bool(pfc["pause_frames_sent"])
        held = "lossless as 802.1Qbb promises" if checks["pfc_lossless"] else "NOT lossless"
        statements.append(
            f"PFC, fan-in {fanin}: {pfc['lossless_drops']} drops in the lossless class, "
            f"{pfc['switch_queue_drops']} at switch queues, {pfc['host_queue_drops']} at host "
            f"NICs; {pfc['pause_frames_sent']} pause frames sent, {pfc['paused_time_s']} s "
            f"paused ({held})")
    for mode, row in ((ECN, ecn), (PFC, pfc)):
        if row is None or drop is None:
            continue
        ours, theirs = row["round"]["p99_s"], drop["round"]["p99_s"]
        if ours is None or theirs is None:
            continue
        below = ours <= theirs * (1 - FASTER_BY)
        checks[f"{mode}_tail_below_droptail"] = below
        statements.append(f"p99 query completion at fan-in {fanin}: {mode} {ours:.3f} s vs "
                          f"drop-tail {theirs:.3f} s ({'' if below else 'NOT '}at least "
                          f"{FASTER_BY:.0%} lower)")
    onset = {mode: timeout_onset(rows, mode) for mode in MODES if top[mode] is not None}
    worst = max(rows, key=lambda s: s["emulator_loss_fraction"])
    trusted = worst["emulator_loss_fraction"] <= MAX_EMULATOR_LOSS_FRACTION
    statements.append(
        f"emulator: switches lost at most {worst['emulator_loss_fraction']:.3%} of packets "
        f"outside emulated queues ({worst['mode']}, fan-in {worst['fanin']}; limit "
        f"{MAX_EMULATOR_LOSS_FRACTION:.1%})" + ("" if trusted else
                                               ": drops and timeouts may be the emulator's"))
    if pfc is not None:
        statements.append("pfc: pause frames, where the fabric counts them on switch ports, "
                          "enter the packet-conservation figure")
    for s in rows:
        if s["error"]:
            statements.append(f"{s['mode']}, fan-in {s['fanin']}: stopped after "
                              f"{s['rounds_done']} rounds: {s['error']}")
    return {"fanin": fanin, "checks": checks, "statements": statements,
            "timeout_onset_fanin": onset, "emulator_trusted": trusted,
            "faster_by": FASTER_BY, "max_emulator_loss_fraction": MAX_EMULATOR_LOSS_FRACTION}


def _cell(value, fmt: str) -> str:
    return "-" if value is None else format(value, fmt)


TABLE_COLUMNS = (  # header, width, summary key (None: round statistic), format
    ("fan-in", 6, "fanin", "d"), ("mode", 9, "mode", "s"), ("rounds", 6, "rounds_done", "d"),
    ("median s", 9, "median_s", ".3f"), ("p99 s", 8, "p99_s", ".3f"),
    ("max s", 8, "max_s", ".3f"), ("ideal s", 8, "ideal_round_s", ".3f"),
    ("goodput", 8, "goodput_fraction", ".0%"), ("drops", 6, "queue_drops", "d"),
    ("RTOs", 5, "tcp_timeouts", "d"), ("retrans", 7, "tcp_retransmits", "d"),
    ("marks", 6, "ce_marks", "d"), ("pauses", 6, "pause_frames_sent", "d"),
    ("lossless drops", 14, "lossless_drops", "d"),
)
ROUND_KEYS = ("median_s", "p99_s", "max_s")


def format_table(result: IncastResult) -> str:
    """A row per (fan-in, mode): query completion (s), goodput (fraction of the link),
    drops, TCP timeouts and retransmits, CE marks, pauses."""
    header = " ".join(f"{name:>{width}s}" for name, width, _, _ in TABLE_COLUMNS)
    lines = ["", header]
    for s in sorted(summaries(result), key=lambda s: (s["fanin"], MODES.index(s["mode"]))):
        cells = []
        for _, width, key, fmt in TABLE_COLUMNS:
            value = s["round"][key] if key in ROUND_KEYS else s[key]
            cells.append(f"{_cell(value, fmt):>{width}s}")
        lines.append(" ".join(cells))
    return "\n".join(lines)


def write_incast_results(result: IncastResult, workdir: Path) -> list[Path]:
    """summary.json, incast.png (query completion per mode at the largest fan-in: box plot,
    and the CDF of per-flow completion) and, with several fan-ins, incast-fanin.png
    (median and p99 query completion against fan-in, per mode, beside the ideal)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = summaries(result)
    summary = {"complete": True, "result": asdict(result), "summaries": rows,
               "verdict": verdict(result)}
    paths = [workdir / "summary.json"]
    paths[0].write_text(json.dumps(summary, indent=1))
    if not result.measurements:
        return paths
    rate_mbit = result.config["rate_mbit"]
    fanin = max(m.fanin for m in result.measurements)
    top = [m for m in result.measurements if m.fanin == fanin]
    fig, (box, cdf) = plt.subplots(1, 2, figsize=(10, 4))
    box.boxplot([m.round_s or [math.nan] for m in top], tick_labels=[m.mode for m in top])
    box.axhline(ideal_round_s(fanin, result.config["response_bytes"], rate_mbit),
                linestyle=":", color="grey", label="ideal (payload at link rate)")
    box.set_ylabel("query completion time (s)")
    box.set_title(f"fan-in {fanin}, {len(top[0].round_s)} rounds")
    box.legend(loc="upper right")
    for m in top:
        flows = sorted(t for r in m.flow_s for t in r)
        if flows:
            cdf.step(flows, [(i + 1) / len(flows) for i in range(len(flows))], where="post",
                     label=m.mode)
    cdf.set_xlabel("flow completion time (s)")
    cdf.set_ylabel("fraction of flows")
    cdf.set_title(f"per-flow completion, fan-in {fanin}")
    cdf.legend(loc="lower right")
    fig.suptitle(f"incast on the k={FAT_TREE_K} fat-tree, {rate_mbit:g} Mbit/s links, "
                 f"{result.config['response_bytes']} B per response")
    fig.tight_layout()
    paths.append(workdir / "incast.png")
    fig.savefig(paths[-1], dpi=120)
    plt.close(fig)
    fanins = sorted({m.fanin for m in result.measurements})
    if len(fanins) > 1:
        fig, ax = plt.subplots(figsize=(7, 4))
        for mode in MODES:
            own = sorted((s for s in rows if s["mode"] == mode and s["round"]["count"]),
                         key=lambda s: s["fanin"])
            if not own:
                continue
            xs = [s["fanin"] for s in own]
            line, = ax.plot(xs, [s["round"]["median_s"] for s in own], marker="o",
                            label=f"{mode} median")
            ax.plot(xs, [s["round"]["p99_s"] for s in own], marker="x", linestyle="--",
                    color=line.get_color(), label=f"{mode} p99")
        ax.plot(fanins, [ideal_round_s(n, result.config["response_bytes"], rate_mbit)
                         for n in fanins], linestyle=":", color="grey", label="ideal")
        ax.set_xlabel("fan-in (senders)")
        ax.set_ylabel("query completion time (s)")
        ax.set_xticks(fanins)
        ax.set_title(f"incast: completion vs fan-in, {rate_mbit:g} Mbit/s links")
        ax.legend(fontsize="small")
        fig.tight_layout()
        paths.append(workdir / "incast-fanin.png")
        fig.savefig(paths[-1], dpi=120)
        plt.close(fig)
    return paths
