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

Modes, each a setup of its own (a fresh fabric whose every switch port gets the same byte
buffer; the pfc mode may get a larger one, ``pfc_buffer_bytes``, as a switch reserves PFC's
headroom beside the shared buffer):

- ``droptail``: the buffer alone; hosts run cubic (reno without it), ECN off;
- ``ecn``: DCTCP step marking at K (``testbed.plan.scaling``, scheme dctcp, scaled to the
  link rate); hosts with ECN (dctcp where the kernel has it, else cubic with ECN);
- ``pfc``: PFC on the lossless class (``testbed.plan.scaling.pfc_thresholds``), no ECN; the
  traffic is in that class (DSCP 26 by default); hosts as in drop-tail. With
  ``capture_pauses``, tcpdump keeps the pause frames reaching the receiver's neighbour as
  pause-frames.pcap, and tshark decodes them (testbed.measure.pauses).

For each mode and fan-in, testbed.traffic.incast runs a server on each sender and a client on
the receiver, which sends every round's requests at the same instant. Measured per fan-in:
query (round) and per-flow completion times, TCP timer recoveries (TcpExt TCPTimeouts and
TCPLossProbeRecovery) and retransmitted segments (Tcp RetransSegs) in every participant's
namespace, drops at every
emulated queue, ECN marks, PFC pauses (``FabricNetwork.pfc_summary``) and goodput; around all
of a mode's fan-ins, whether the emulator kept up (testbed.measure.fidelity.Watch).
"""
from __future__ import annotations

import time
from contextlib import nullcontext
from dataclasses import asdict
from pathlib import Path
from typing import Literal

from pydantic import Field, field_validator

from testbed.capabilities import missing_capabilities
from testbed.drive.flows import counter_deltas, read_tcp_counters
from testbed.errors import ConfigError, TestbedError
from testbed.experiments.incast.checks import DROPTAIL, ECN, MODES, PFC, incast_checks
from testbed.experiments.incast.plots import plot_completion, plot_fanin_sweep
from testbed.experiments.incast.summary import (
    measurement_line,
    summarize,
    timeout_onset,
)
from testbed.experiments.incast.workload import (
    IncastMeasurement,
    Queries,
    bottleneck_port,
    run_programs,
    sender_hosts,
)
from testbed.harness.experiment import Experiment, Params, Setup, SetupRun, distinct
from testbed.harness.scenario import Problem
from testbed.measure.pauses import (
    PauseCapture,
    capture_point,
    capture_summary,
    counter_deltas as agent_deltas,
)
from testbed.plan.modes import LOSSLESS_DSCP, mode_tcp
from testbed.plan.port_queue import default_buffer_bytes
from testbed.plan.profiles import U32_MAX, QueueConfig
from testbed.plan.scaling import DEFAULT_PFC_REACTION_TIME_S, pfc_thresholds, scaled_queue_config
from testbed.traffic.incast import MAX_DSCP

FAT_TREE_K = 4
HOSTS = FAT_TREE_K ** 3 // 4
MAX_FANIN = HOSTS - 1
BASE_PORT = 5600  # fan-in i of a mode listens on BASE_PORT + i
MAX_RESPONSE_BYTES = 1 << 30
MAX_ROUNDS = 1000
MAX_GAP_S = 60.0
MIN_BUFFER_FRAMES = 2  # a buffer must hold a frame in service and one behind it
PFC_SETTLE_S = 0.5  # the pause agent rewrites its counters every 0.2 s
PFC_SUMMARY_KEYS = ("pause_frames_sent", "pause_frames_received", "paused_time_s",
                    "pause_storms", "lossless_drops")
CAPTURE_TOOLS = ("tcpdump", "tshark")


class IncastParams(Params):
    """What to run: the fan-ins (one, or a sweep such as 1,3,7,15), what each sender answers
    per query, the recorded rounds after the warm-up ones (the first exchanges meet cold
    caches, such as the userspace datapath's flow cache, that are the emulator's and not the
    network's), every switch port's buffer (default 50 ms at the link rate), the traffic
    class of every incast packet in every mode (26, the lossless class, so that only the
    queue differs), the pause path's reaction time that sizes the PFC headroom (the emulated
    path's by default), the receiver, and whether to capture the pause frames."""

    fanins: list[int] = Field(default_factory=lambda: [MAX_FANIN], min_length=1,
                              description=f"numbers of senders to measure, each 1..{MAX_FANIN}")
    modes: list[Literal["droptail", "ecn", "pfc"]] = Field(
        default_factory=lambda: list(MODES), min_length=1, description="queue modes to run")
    response_bytes: int = Field(64 * 1024, ge=1, le=MAX_RESPONSE_BYTES,
                                description="bytes each sender answers per query")
    rounds: int = Field(20, ge=1, le=MAX_ROUNDS, description="recorded queries per fan-in")
    warmup_rounds: int = Field(1, ge=0, le=MAX_ROUNDS,
                               description="queries before the recorded ones")
    gap_s: float = Field(0.2, ge=0, le=MAX_GAP_S, allow_inf_nan=False,
                         description="pause between queries")
    buffer_bytes: int | None = Field(None, ge=1, le=U32_MAX,
                                     description="every port's buffer in bytes (none: 50 "
                                                 "ms at the link rate)")
    pfc_buffer_bytes: int | None = Field(None, ge=1, le=U32_MAX,
                                         description="every port's buffer in the pfc mode "
                                                     "(none: buffer_bytes); PFC needs its "
                                                     "headroom above XOFF, which a switch "
                                                     "reserves beside the shared buffer")
    dscp: int = Field(LOSSLESS_DSCP, ge=0, le=MAX_DSCP,
                      description="DSCP of the incast traffic (26: the lossless class)")
    pfc_reaction_time_s: float = Field(DEFAULT_PFC_REACTION_TIME_S, ge=0, le=1,
                                       allow_inf_nan=False,
                                       description="pause reaction time sizing the PFC "
                                                   "headroom")
    round_timeout_s: float = Field(60.0, gt=0, allow_inf_nan=False,
                                   description="a query's time limit")
    receiver: str = Field("p0e0h0", description="the receiving host")
    capture_pauses: bool = Field(False, description="keep the pfc mode's pause frames as "
                                                    "pause-frames.pcap, decoded by tshark")

    @field_validator("fanins")
    @classmethod
    def _fanins(cls, values: list[int]) -> list[int]:
        for value in values:
            if not 1 <= value <= MAX_FANIN:
                raise ValueError(f"each must be in [1, {MAX_FANIN}] (the k={FAT_TREE_K} "
                                 f"fat-tree has {HOSTS} hosts), got {value}")
        return distinct(values)

    @field_validator("modes")
    @classmethod
    def _modes(cls, values: list[str]) -> list[str]:
        return distinct(values)


class Incast(Experiment):
    name = "incast"
    title = "incast"
    Params = IncastParams
    captions = {
        "incast.png": ("Drop-tail's completion times carry retransmission timeouts (the long "
                       "tail); ECN and PFC should stay near the ideal line."),
        "incast-fanin.png": ("As fan-in grows, drop-tail's p99 should jump away from the ideal "
                             "line while ECN and PFC follow it."),
    }
    default_rate_mbit = 10.0
    default_mtu_bytes = 1500
    sections = frozenset()  # every mode sets its own queue and hosts on the k=4 fat-tree
    cli_aliases = {"--fanin": "fanins", "--sweep": "fanins", "--mode": "modes",
                   "--warmup": "warmup_rounds"}

    # -- plans ------------------------------------------------------------------------------
    def buffer_bytes(self, mode: str = DROPTAIL) -> int:
        """Every switch port's buffer in ``mode``."""
        if mode == PFC and self.params.pfc_buffer_bytes is not None:
            return self.params.pfc_buffer_bytes
        if self.params.buffer_bytes is None:
            return default_buffer_bytes(self.rate_mbit, self.mtu_bytes)
        return self.params.buffer_bytes

    def buffer_field(self, mode: str) -> str:
        """The parameter that sets ``mode``'s buffer."""
        pfc_own = mode == PFC and self.params.pfc_buffer_bytes is not None
        return "params.pfc_buffer_bytes" if pfc_own else "params.buffer_bytes"

    def queries(self) -> Queries:
        p = self.params
        return Queries(p.response_bytes, p.rounds, p.warmup_rounds, p.gap_s, p.dscp,
                       p.round_timeout_s)

    def mode_queue(self, mode: str) -> tuple[QueueConfig, dict]:
        """Every switch port's queue in ``mode``, and the record of how it was chosen."""
        buffer_bytes = self.buffer_bytes(mode)
        if mode == DROPTAIL:
            return QueueConfig(buffer_bytes=buffer_bytes), {"buffer_bytes": buffer_bytes}
        if mode == ECN:
            return scaled_queue_config("dctcp", self.rate_mbit, self.mtu_bytes, buffer_bytes,
                                       pfc=False)
        pfc, record = pfc_thresholds(self.rate_mbit, self.mtu_bytes, buffer_bytes,
                                     reaction_time_s=self.params.pfc_reaction_time_s)
        return (QueueConfig(buffer_bytes=buffer_bytes, pfc=pfc),
                {"buffer_bytes": buffer_bytes, "pfc": record})

    def problems(self) -> list[Problem]:
        p = self.params
        problems = []
        hosts = [h.name for h in self.fabric().hosts]
        if p.receiver not in hosts:
            problems.append(Problem(("params", "receiver"), f"must be a host of the "
                                    f"k={FAT_TREE_K} fat-tree ({hosts[0]} .. {hosts[-1]}), "
                                    f"got {p.receiver!r}"))
        for field in ("buffer_bytes", "pfc_buffer_bytes"):
            value = getattr(p, field)
            if value is not None and value < MIN_BUFFER_FRAMES * self.mtu_bytes:
                problems.append(Problem(("params", field), f"must hold at least "
                                        f"{MIN_BUFFER_FRAMES} frames of the "
                                        f"{self.mtu_bytes}-byte MTU, got {value}"))
        if PFC in p.modes:
            queue = QueueConfig(buffer_bytes=self.buffer_bytes(PFC))
            if queue.priority_for_dscp(p.dscp) not in queue.lossless_priorities:
                problems.append(Problem(("params", "dscp"), f"the pfc mode needs the traffic "
                                        f"in a lossless class (DSCP {LOSSLESS_DSCP}), got "
                                        f"{p.dscp}"))
        if p.capture_pauses:
            if PFC not in p.modes:
                problems.append(Problem(("params", "capture_pauses"), "only the pfc mode "
                                        "sends pause frames; add pfc to modes"))
            for cap in missing_capabilities(self.platform.capabilities, CAPTURE_TOOLS):
                problems.append(Problem(("params", "capture_pauses"), f"needs {cap.name}, "
                                        f"which this machine lacks ({cap.detail}; "
                                        "scripts/install.sh installs it)"))
        return problems

    def setups(self) -> list[Setup]:
        fabric = self.fabric()
        setups = []
        for mode in self.params.modes:
            try:
                queue, record = self.mode_queue(mode)
            except ConfigError as err:
                raise ConfigError(self.buffer_field(mode), f"{self.buffer_bytes(mode)} B "
                                  f"cannot hold the {mode} queue: {err.field}: "
                                  f"{err.problem}") from None
            tcp = mode_tcp(mode == ECN, self.platform)
            setups.append(Setup(mode, fabric, "ecmp", queue, record, tcp,
                                description=f"{mode} queues, hosts "
                                f"{tcp.congestion_control} with ECN "
                                f"{'on' if tcp.ecn else 'off'}"))
        return setups

    def headline(self) -> str:
        p = self.params
        return (f"{self.title} on the k={FAT_TREE_K} fat-tree at {self.rate_mbit:g} Mbit/s: "
                f"fan-in {','.join(map(str, p.fanins))}, {p.response_bytes} B per response, "
                f"{p.rounds} queries each; modes {', '.join(p.modes)}")

    # -- on a running fabric ----------------------------------------------------------------
    def measure(self, run: SetupRun) -> dict:
        p = self.params
        mode = run.setup.name
        point = capture_point(run.net.fabric, p.receiver) \
            if mode == PFC and p.capture_pauses else None
        agent_before = run.net.pause_counters() if point else {}
        measurements = []
        with run.watch() as watch:
            with (PauseCapture(run.net, point, run.workdir) if point
                  else nullcontext()) as capture:
                with run.progress.phase(f"{mode}: fan-ins", total=len(p.fanins)) as phase:
                    for index, fanin in enumerate(p.fanins):
                        run.log(f"{mode}: fan-in {fanin}: {p.rounds} queries of "
                                f"{p.response_bytes} B from each of {fanin} senders to "
                                f"{p.receiver}, DSCP {p.dscp}")
                        m = self.measure_fanin(run, fanin, BASE_PORT + index)
                        measurements.append(m)
                        run.log(f"{mode}: {measurement_line(summarize(m, self.rate_mbit))}")
                        phase.advance()
                queued = run.net.wait_switches_drained()
        result = {"measurements": [asdict(m) for m in measurements],
                  "summaries": [summarize(m, self.rate_mbit) for m in measurements],
                  "fidelity": watch.verdict(bandwidth_bound=False).to_dict(),
                  "packets": {"switches": watch.switches, "emulator_lost": watch.emulator_lost(),
                              "still_queued_packets": queued},
                  "window_monotonic_s": [watch.t_start, watch.t_end]}
        if run.net.lossless:
            result["pause_agent_running"] = run.net.pause_agent_running()
        if point is not None:
            result["pause_capture"] = capture_summary(
                point, capture, agent_deltas(agent_before, run.net.pause_counters()))
            run.log(f"{mode}: pause capture: {capture_cell(result['pause_capture'])}")
        return result

    def measure_fanin(self, run: SetupRun, fanin: int, port: int) -> IncastMeasurement:
        """The queries (after the warm-up ones) from ``fanin`` senders to the receiver, with
        every counter read when the warm-up is over (the client waits meanwhile) and after
        the last query, so that they count the recorded queries only (the ECN marks and
        queue depths of the queue report include the warm-up); raw output in fanin<N>/."""
        net, receiver = run.net, self.params.receiver
        senders = sender_hosts(net.fabric, receiver, fanin)
        m = IncastMeasurement(run.setup.name, fanin, receiver, senders,
                              self.params.response_bytes)
        outdir = run.workdir / f"fanin{fanin}"
        outdir.mkdir(parents=True, exist_ok=True)
        hosts = [*senders, receiver]
        before: dict = {}

        def warmed() -> None:
            before["tcp"] = read_tcp_counters(net, hosts)
            before["drops"] = net.queue_drops()
            before["switches"] = net.switch_counters()
            before["pfc"] = net.pfc_summary() if net.lossless else None

        report: dict = {}
        with run.queues(report):
            try:
                client = run_programs(net, receiver, senders, port, self.queries(), outdir,
                                      warmed)
            except TestbedError as err:  # a hung or failed client: the other fan-ins go on
                client = {"error": str(err)}
        if not before:  # the client stopped before its warm-up ended: count from now
            warmed()
        tcp_before, drops_before = before["tcp"], before["drops"]
        switches_before, pfc_before = before["switches"], before["pfc"]
        if pfc_before is not None:  # paused queues drain, and the agent writes its counters
            net.wait_switches_drained()
            time.sleep(PFC_SETTLE_S)
            after = net.pfc_summary()
            m.pfc = {key: round(after[key] - pfc_before[key], 6) for key in PFC_SUMMARY_KEYS}
        m.tcp = counter_deltas(tcp_before, read_tcp_counters(net, hosts))
        m.queue_drops = net.queue_drops() - drops_before
        m.switches = {k: v - switches_before[k] for k, v in net.switch_counters().items()}
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

    # -- judging and showing ----------------------------------------------------------------
    def checks(self, results):
        return incast_checks(results, self.params.rounds)

    def rows(self, results):
        rows = []
        for mode in MODES:
            for s in sorted(results.get(mode, {}).get("summaries", []),
                            key=lambda s: s["fanin"]):
                rows.append((f"{mode}, fan-in {s['fanin']}", summary_cell(s)))
        onsets = {mode: timeout_onset(r["summaries"]) for mode, r in results.items()}
        rows.append(("first fan-in waiting on a timer", ", ".join(
            f"{mode} {'none' if n is None else n}" for mode, n in onsets.items())))
        capture = results.get(PFC, {}).get("pause_capture")
        if capture is not None:
            rows.append(("pause capture", capture_cell(capture)))
        return rows

    def plots(self, results, folder: Path, title: str) -> list[Path]:
        if not any(r["measurements"] for r in results.values()):
            return []
        p = self.params
        paths = [plot_completion(results, p.response_bytes, self.rate_mbit, title,
                                 folder / "incast.png")]
        sweep = plot_fanin_sweep(results, p.response_bytes, self.rate_mbit, title,
                                 folder / "incast-fanin.png")
        return paths + ([sweep] if sweep is not None else [])


def _seconds(value) -> str:
    return "-" if value is None else f"{value:.3f}"


def summary_cell(s: dict) -> str:
    """One mode at one fan-in, in a line: completion, goodput, losses, marks, pauses."""
    r = s["round"]
    goodput = "-" if s["goodput_fraction"] is None else f"{s['goodput_fraction']:.0%}"
    cell = (f"{s['rounds_done']} queries: median {_seconds(r['median_s'])} s, p99 "
            f"{_seconds(r['p99_s'])} s, max {_seconds(r['max_s'])} s (ideal "
            f"{s['ideal_round_s']:.3f} s), goodput {goodput}; {s['queue_drops']} drops, "
            f"{s['tcp_timeouts']} RTOs, {s['tcp_probe_recoveries']} TLP recoveries, "
            f"{s['tcp_retransmits']} retransmits")
    if s["ce_marks"] is not None:
        cell += f", {s['ce_marks']} CE marks"
    if s["pause_frames_sent"] is not None:
        cell += (f", {s['pause_frames_sent']} pause frames, {s['lossless_drops']} lossless "
                 "drops")
    return cell + (f"; stopped: {s['error']}" if s["error"] else "")


def capture_cell(capture: dict) -> str:
    if capture["error"]:
        return f"{capture['pcap']}: {capture['error']}"
    return (f"{capture['pfc_frames']} of {capture['frames']} frames decoded as PFC by tshark "
            f"({capture['xoff_frames']} pause, {capture['xon_frames']} resume) in "
            f"{capture['pcap']}, on {capture['host']} ({capture['interface']}); the pause agent "
            f"sent {capture['agent_sent']} on that link")
