"""RoCE traffic on a running fabric (testbed.apply.network.FabricNetwork), shared by the RoCE
experiments: the user-space RoCEv2 host program (``python -m testbed.traffic.roce.host``)
started as servers and senders inside the hosts, its JSON collected; a capture of RoCE
packets kept in the run folder; and a switch port's real queue sampled. The iperf3 (TCP)
counterpart is testbed.drive.flows; the fabrics and queues the RoCE experiments run on are
testbed.experiments.roce_common.roce_setups.

Every receiving host runs one ``serve`` for all the senders that send to it (one UDP port,
one QP per sender, as an incast onto one NIC); every sender runs one ``send``. A server
waits for its senders on the TCP side channel, and a sender retries its connection until the
server listens, so all start at once. Each program's standard error goes to a file in the
setup's folder, its JSON result to another (``roce-<src>-<dst>.json``), and the results'
lean part to the caller.
"""
from __future__ import annotations

import json
import subprocess
import sys
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path

from testbed.apply import modules
from testbed.errors import TestbedError
from testbed.measure.backlog import PortBacklog, backlog_divergence
from testbed.measure.capture import HostCapture, capture_argv as host_capture_argv
from testbed.measure.generators import GeneratorCpu, frame_time_us, with_generators
from testbed.measure.pauses import counter_deltas
from testbed.measure.queues import queue_sampling
from testbed.measure.roce import (
    cc_series,
    decode_capture,
    sampled_fraction,
    scaling_rows,
    window_queue,
)
from testbed.measure.stats import jain_index
from testbed.plan.ecn_plan import ECN_PATH_EBPF
from testbed.system.counters import counter_delta

HOST_MODULE = "testbed.traffic.roce.host"
RXE_MODULE = "testbed.traffic.roce.rxe"
ENGINE, RXE = "engine", "rxe"  # the user-space RoCEv2 engine, or the kernel's softRoCE
RXE_FIRST_PORT = 18515   # perftest serves one client per port: one port per flow
RXE_SERVER_START_S = 2.0  # perftest's client does not retry: its server listens first
GRACE_S = 30.0           # beyond a sender's own time and timeout, before it counts as hung
SERVER_EXIT_S = 15.0     # a server ends this long after its last sender at most
CAPTURE_FILE = "roce-sample.pcap"
CAPTURE_LOG = "roce-capture.log"
CAPTURE_PACKETS = 300    # a sample: tcpdump stops by itself after this many
ROCE_UDP_PORT = 4791


@dataclass(frozen=True)
class RoceSettings:
    """What every sender of a run does (the host program's flags): the opcode, message size,
    RoCE path MTU, congestion control (with the link rate it paces at and scales DCQCN by),
    how long or how many messages, and the transport's timers. ``seed`` is the first
    sender's (each next sender adds one). ``transport`` rxe runs perftest over the kernel's
    softRoCE instead of the engine (testbed.traffic.roce.rxe: RDMA WRITE for a duration, no
    congestion control, no data check)."""

    opcode: str = "write"
    message_bytes: int = 65536
    mtu_bytes: int = 1024
    cc: str = "none"
    link_rate_mbit: float | None = None
    duration_s: float | None = None
    count: int | None = None
    cc_params: dict[str, float] = field(default_factory=dict)
    ack_timeout_s: float | None = None
    queue_depth: int = 16
    max_outstanding: int = 128
    timeout_s: float = 60.0
    seed: int = 1
    transport: str = ENGINE

    def __post_init__(self):
        if (self.duration_s is None) == (self.count is None):
            raise ValueError("give a RoCE flow either duration_s or count")
        if self.transport not in (ENGINE, RXE):
            raise ValueError(f"transport must be {ENGINE} or {RXE}, got {self.transport!r}")
        if self.transport == RXE and (self.duration_s is None or self.cc != "none"):
            raise ValueError("the rxe path runs for a duration without congestion control")


def rxe_argv(role: str, bind_ip: str, settings: RoceSettings, port: int,
             peer_ip: str | None = None, python: str = sys.executable) -> list[str]:
    """The softRoCE host program's command line (testbed.traffic.roce.rxe)."""
    argv = [python, "-m", RXE_MODULE, role, "--bind", bind_ip, "--side-port", str(port),
            "--duration-s", f"{settings.duration_s:g}", "--size", str(settings.message_bytes),
            "--mtu", str(settings.mtu_bytes)]
    return argv + (["--peer", peer_ip] if peer_ip else [])


def send_argv(bind_ip: str, peer_ip: str, settings: RoceSettings, seed: int,
              python: str = sys.executable) -> list[str]:
    """A sender's command line."""
    s = settings
    argv = [python, "-m", HOST_MODULE, "send", "--bind", bind_ip, "--peer", peer_ip,
            "--opcode", s.opcode, "--size", str(s.message_bytes), "--mtu", str(s.mtu_bytes),
            "--cc", s.cc, "--queue-depth", str(s.queue_depth), "--max-outstanding",
            str(s.max_outstanding), "--timeout-s", f"{s.timeout_s:g}", "--seed", str(seed)]
    argv += (["--duration-s", f"{s.duration_s:g}"] if s.duration_s is not None
             else ["--count", str(s.count)])
    if s.link_rate_mbit is not None:
        argv += ["--link-rate-mbit", f"{s.link_rate_mbit:g}"]
    if s.ack_timeout_s is not None:
        argv += ["--ack-timeout-s", f"{s.ack_timeout_s:g}"]
    for name, value in sorted(s.cc_params.items()):
        argv += ["--cc-param", f"{name}={value!r}"]
    return argv


def serve_argv(bind_ip: str, connections: int, settings: RoceSettings,
               python: str = sys.executable) -> list[str]:
    """A server's command line: ``connections`` senders on one engine. It gives up after
    ``--timeout-s`` without news on its side channels, and its senders report only at the
    end: so it waits their whole run beyond the timeout."""
    idle_s = settings.timeout_s + (settings.duration_s or 0.0)
    argv = [python, "-m", HOST_MODULE, "serve", "--bind", bind_ip, "--connections",
            str(connections), "--timeout-s", f"{idle_s:g}"]
    if settings.ack_timeout_s is not None:
        argv += ["--ack-timeout-s", f"{settings.ack_timeout_s:g}"]
    return argv


def parse_host_output(text: str, who: str) -> dict:
    """The host program's one JSON line (the last line of its output)."""
    lines = [line for line in text.splitlines() if line.strip()]
    if not lines:
        raise TestbedError(f"{who}: the RoCE host program printed nothing")
    try:
        return json.loads(lines[-1])
    except ValueError:
        raise TestbedError(f"{who}: the RoCE host program printed no JSON: "
                           f"{lines[-1][-200:]}") from None


def flow_summary(result: dict) -> dict:
    """A sender's JSON without its series and counters tables: what a setup's results keep."""
    keep = ("messages", "bytes_delivered", "elapsed_s", "goodput_mbit", "packets_sent",
            "retransmitted_packets", "naks", "timeouts", "cnps_received",
            "cnps_sent_by_receiver", "data_verified", "errors", "window_monotonic_s")
    return {key: result.get(key) for key in keep}


@dataclass
class RoceRun:
    """What one batch of RoCE flows did: per flow (src, dst) its sender's JSON (None when
    the sender failed), per receiving host its server's JSON, the errors, and the monotonic
    interval from the first sender's start to the last one's end."""

    pairs: list[tuple[str, str]]
    senders: list[dict | None]
    servers: dict[str, dict | None]
    errors: list[str]
    window_monotonic_s: tuple[float, float] | None

    @property
    def all_sending_monotonic_s(self) -> tuple[float, float] | None:
        """The monotonic interval in which every flow was sending: from the last sender's
        start to the first one's end (each keeps its queue of work requests full until it
        stops posting, then drains it, so flows end at different times). None when a
        sender failed or the flows never overlapped."""
        windows = [r.get("window_monotonic_s") if r else None for r in self.senders]
        if not windows or None in windows:
            return None
        start, end = max(w[0] for w in windows), min(w[1] for w in windows)
        return (start, end) if start < end else None

    def goodputs_mbit(self) -> list[float]:
        """Each flow's goodput (0 for a sender that failed)."""
        return [(r or {}).get("goodput_mbit") or 0.0 for r in self.senders]

    def all_verified(self) -> bool | None:
        """Every flow's data verified (None when every flow's transport is rxe, whose perftest
        does not check it)."""
        if self.senders and all(r is not None and r.get("transport") == "rxe"
                                for r in self.senders):
            return None
        return bool(self.senders) and all(r is not None and bool(r.get("data_verified"))
                                          for r in self.senders)

    def summary(self) -> dict:
        return {"flows": [{"src": src, "dst": dst, **(flow_summary(r) if r else {})}
                          for (src, dst), r in zip(self.pairs, self.senders)],
                "errors": self.errors, "window_monotonic_s": self.window_monotonic_s,
                "data_verified": self.all_verified()}


def result_file(folder: Path, src: str, dst: str) -> Path:
    return folder / f"roce-{src}-{dst}.json"


def run_roce_flows(net, pairs: list[tuple[str, str]], settings: RoceSettings,
                   folder: Path, cpu=None) -> RoceRun:
    """One RoCE flow per (source, destination) pair, all at once, each to a server on its
    destination (one per destination); waits for every program and returns their results.
    A program that fails or hangs is an error of the run, not an exception: what the others
    measured is kept. ``cpu`` (testbed.measure.generators.GeneratorCpu) watches every
    program's CPU, each sender judged over the window it measured in and each server over
    the windows of the flows it served."""
    fabric = net.fabric
    ip = {name: fabric.nodes[name].ip for pair in pairs for name in pair}
    servers = {}
    if settings.transport == RXE:  # one perftest server per flow, listening before its client

        modules.load_modules([modules.RXE_MODULE], log=lambda m: None)
        for i, (src, dst) in enumerate(pairs):
            with open(folder / f"roce-serve-{dst}-{i}.err", "wb") as err:
                servers[f"{dst}-{i}"] = net.popen(dst, rxe_argv("serve", ip[dst], settings,
                                                                RXE_FIRST_PORT + i),
                                                  stdout=subprocess.PIPE, stderr=err)
        time.sleep(RXE_SERVER_START_S)
    else:
        for dst, n in Counter(dst for _, dst in pairs).items():
            with open(folder / f"roce-serve-{dst}.err", "wb") as err:
                servers[dst] = net.popen(dst, serve_argv(ip[dst], n, settings),
                                         stdout=subprocess.PIPE, stderr=err)
    if cpu is not None:
        for name, proc in servers.items():
            cpu.add(f"server {name}", proc.pid)
    start = time.monotonic()
    senders = []
    for i, (src, dst) in enumerate(pairs):
        argv = (rxe_argv("send", ip[src], settings, RXE_FIRST_PORT + i, ip[dst])
                if settings.transport == RXE
                else send_argv(ip[src], ip[dst], settings, settings.seed + i))
        with open(folder / f"roce-{src}-{dst}.err", "wb") as err:
            senders.append(net.popen(src, argv, stdout=subprocess.PIPE, stderr=err))
        if cpu is not None:
            cpu.add(f"sender {src}->{dst}", senders[-1].pid)
    limit_s = (settings.duration_s or 0.0) + settings.timeout_s + GRACE_S
    errors: list[str] = []
    results: list[dict | None] = []
    ends = []
    try:
        for (src, dst), proc in zip(pairs, senders):
            result = _collect(proc, f"sender {src} -> {dst}", max(1.0, start + limit_s
                                                                 - time.monotonic()), errors)
            if result is not None:
                result_file(folder, src, dst).write_text(json.dumps(result))
                if result.get("window_monotonic_s"):
                    ends.append(result["window_monotonic_s"][1])
                    if cpu is not None:
                        cpu.measured(f"sender {src}->{dst}", result["window_monotonic_s"])
                errors += [f"{src} -> {dst}: {e}" for e in result.get("errors", [])]
                if result.get("data_verified") is False:
                    errors.append(f"{src} -> {dst}: data not verified ({result['errors']})")
            results.append(result)
        served = {dst: _collect(proc, f"server {dst}", SERVER_EXIT_S, errors)
                  for dst, proc in servers.items()}
    finally:
        for proc in [*senders, *servers.values()]:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    for dst, result in served.items():
        if result is not None:
            (folder / f"roce-serve-{dst}.json").write_text(json.dumps(result))
            errors += [f"server {dst}: {e}" for e in result.get("errors", [])]
    if cpu is not None:
        keys = [f"{dst}-{i}" if settings.transport == RXE else dst
                for i, (_, dst) in enumerate(pairs)]
        for key, window_s in served_windows(keys, results).items():
            cpu.measured(f"server {key}", window_s)
    starts = [r["window_monotonic_s"][0] for r in results if r and r.get("window_monotonic_s")]
    window = (min(starts), max(ends)) if starts else None
    return RoceRun(list(pairs), results, served, errors, window)


def served_windows(servers: list[str], results: list[dict | None]
                   ) -> dict[str, tuple[float, float]]:
    """The window each server measured in: from the first start to the last end of the
    windows of the flows it served (``servers[i]`` served flow i, whose sender reported
    ``results[i]``), not its start-up before them or its checks after them."""
    windows: dict[str, tuple[float, float]] = {}
    for server, result in zip(servers, results):
        w = result.get("window_monotonic_s") if result else None
        if w:
            was = windows.get(server, (w[0], w[1]))
            windows[server] = (min(was[0], w[0]), max(was[1], w[1]))
    return windows


def _collect(proc, who: str, timeout_s: float, errors: list[str]) -> dict | None:
    """A program's JSON, or None with the reason added to ``errors``."""
    try:
        out, _ = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        errors.append(f"{who}: still running after {timeout_s:.0f} s, killed")
        return None
    try:
        return parse_host_output(out.decode(errors="replace"), who)
    except TestbedError as err:
        errors.append(f"{str(err)} (exit {proc.returncode})")
        return None


# --- a sample of RoCE packets ------------------------------------------------------------------


def capture_argv(interface: str, path: Path, packets: int = CAPTURE_PACKETS) -> list[str]:
    """tcpdump keeping the first ``packets`` RoCEv2 packets (UDP port 4791) seen on
    ``interface``, whole, each written as it comes."""
    return host_capture_argv(interface, path, ["udp", "port", str(ROCE_UDP_PORT)], packets)


class RoceCapture(HostCapture):
    """A sample of the RoCE packets on ``host``'s NIC while the block runs, kept as
    ``folder``/roce-sample.pcap (testbed.measure.roce decodes it); tcpdump stops by itself
    after ``packets``."""

    def __init__(self, net, host: str, folder: Path, packets: int = CAPTURE_PACKETS):
        link, end = net.fabric.host_link(host)
        self.interface = link.intf(end)
        self.packets = packets
        path = (folder / CAPTURE_FILE).absolute()
        super().__init__(net, host, capture_argv(self.interface, path, packets), path,
                         folder / CAPTURE_LOG)

    def record(self) -> dict:
        return {"pcap": str(self.path), "host": self.host, "interface": self.interface,
                "asked_packets": self.packets}


def settings_record(settings: RoceSettings) -> dict:
    return asdict(settings)


# --- flows through the bench's bottleneck, with its real queue sampled --------------------------

QDISC, MARKER = "qdisc", "marker"  # the sampled series: the real backlog, the marker's model
QUEUE_FILE = "queue.json"
PFC_SETTLE_S = 0.5  # the pause agent writes its counters every 0.2 s
CC_FILE = "cc-series.json"


@dataclass
class BottleneckRun:
    """RoCE flows from every sender of a bench into its receiver, measured: the flows, the
    bottleneck's real queue (and, on the eBPF marking path, the marker's model of it at the
    same instants) in CLOCK_MONOTONIC seconds, the fidelity watch, the marks and pauses
    over the flows, and the packet sample."""

    roce: RoceRun
    t_s: list[float]
    qdisc_bytes: list[int]
    marker_bytes: list[int] | None
    sampler_error: str | None
    watch: object  # testbed.measure.fidelity.Watch
    marks: int | None
    pfc: dict | None
    capture: dict | None
    generators: dict | None = None  # testbed.measure.generators.generator_summary


def measure_bottleneck(run, bench, settings: RoceSettings, queue_handle: str,
                       sample_s: float, capture: bool = True) -> BottleneckRun:
    """Run ``bench``'s flows on a running setup (testbed.harness.experiment.SetupRun) with
    the bottleneck's qdisc ``queue_handle`` sampled every ``sample_s``; the raw series go to
    the setup's folder (queue.json, cc-series.json and each program's JSON)."""
    from contextlib import nullcontext

    net, intf = run.net, bench.bottleneck_intf
    marking = net.ecn_path is not None
    model = net.ecn_path == ECN_PATH_EBPF
    marks_before = net.ecn_counters() if marking else None
    pfc_before = net.pause_counters() if net.lossless else None
    lossless_before = net.pfc_summary()["lossless_drops"] if net.lossless else None
    sample = RoceCapture(net, bench.receiver, run.workdir) if capture else nullcontext()
    with run.watch() as watch, PortBacklog(intf, handle=queue_handle) as backlog:
        def read() -> dict[str, int]:
            depths = {MARKER: net.marker_depths()[intf]} if model else {}
            depths[QDISC] = backlog.read()  # right after the model, at the same instant
            return depths

        t0 = time.monotonic()
        with queue_sampling(read, [QDISC, MARKER] if model else [QDISC], sample_s) as series, \
                sample, GeneratorCpu() as cpu:
            roce = run_roce_flows(net, bench.pairs(), settings, run.workdir, cpu)
    t_s = [t0 + t for t in series.t_s]
    marks = None
    if marking:
        marks = counter_delta(marks_before, net.ecn_counters()).get(intf, {}).get("marks")
    pfc = None
    if net.lossless:
        time.sleep(PFC_SETTLE_S)
        deltas = counter_deltas(pfc_before, net.pause_counters())
        summary = net.pfc_summary()
        pfc = {"pause_frames_sent": int(sum(d["xoff_sent"] + d["xon_sent"]
                                            for d in deltas.values())),
               "paused_s": round(sum(d["paused_s"] for d in deltas.values()), 6),
               "lossless_drops": summary["lossless_drops"] - lossless_before,
               "pause_agent_running": summary["agent_running"]}
    (run.workdir / QUEUE_FILE).write_text(json.dumps({
        "t_s": t_s, "qdisc_bytes": series.depth_bytes[QDISC],
        "marker_bytes": series.depth_bytes.get(MARKER), "read_s": series.read_s}))
    (run.workdir / CC_FILE).write_text(json.dumps({
        f"{src}->{dst}": cc_series(r) for (src, dst), r in zip(roce.pairs, roce.senders) if r}))
    record = ({**sample.record(), **decode_capture(sample.path)} if capture else None)
    return BottleneckRun(roce, t_s, series.depth_bytes[QDISC], series.depth_bytes.get(MARKER),
                         series.error, watch, marks, pfc, record, cpu.summary())


def bottleneck_result(b: BottleneckRun, bench, settings: RoceSettings, settle_s: float,
                      frame_bytes: int, sample_s: float, bandwidth_bound: bool,
                      setup: str) -> dict:
    """A BottleneckRun as a setup's results: judged from ``settle_s`` after the flows start
    until the first flow ends (while every flow was sending; RoceRun.all_sending_monotonic_s),
    the real queue's statistics (and the marker model's, with their
    divergence), each flow's goodput (over its whole run) and each sender's rate over the
    window (its link's counters) with their Jain index, the bottleneck's utilisation,
    marks, pauses, the packet sample and the fidelity verdict."""
    roce, watch = b.roce, b.watch
    start, end = (roce.all_sending_monotonic_s or roce.window_monotonic_s
                  or (watch.t_start, watch.t_end))
    judged = (min(start + settle_s, end), end)
    queue = window_queue(b.t_s, b.qdisc_bytes, judged, frame_bytes)
    queue["sampled_fraction"] = sampled_fraction(queue["samples"], judged, sample_s)
    divergence = model = None
    if b.marker_bytes is not None:
        model = window_queue(b.t_s, b.marker_bytes, judged, frame_bytes)
        inside = [i for i, t in enumerate(b.t_s) if judged[0] <= t <= judged[1]]
        divergence = backlog_divergence([b.qdisc_bytes[i] for i in inside],
                                        [b.marker_bytes[i] for i in inside], frame_bytes)
    sampler_window = watch.window_s(*judged)
    goodputs = roce.goodputs_mbit()
    # Each sender runs one flow: its link's counters give the flow's rate over the window.
    link_mbit = watch.rates_mbit(sampler_window)
    sender_mbit = [link_mbit.get(f"{s}->{bench.fabric.host_attachment(s)[0]}")
                   for s in bench.senders]
    shares = sender_mbit if None not in sender_mbit else goodputs
    result = {
        "senders": len(bench.senders), "cc": settings.cc, "settings": settings_record(settings),
        "bottleneck": bench.bottleneck_intf, "bottleneck_label": bench.bottleneck_label,
        "frame_bytes": frame_bytes, "window_monotonic_s": list(judged),
        "flows_monotonic_s": [start, end],
        "queue_source": "qdisc backlog (rtnetlink)", "queue": queue, "marker_queue": model,
        "divergence": divergence, "sampler_error": b.sampler_error,
        "flows": roce.summary()["flows"], "goodput_mbit": goodputs,
        "sender_mbit": sender_mbit, "jain": jain_index(shares) if shares else None,
        "utilisation": watch.utilisation(sampler_window).get(bench.bottleneck_label),
        "cc_scaling": next((rows for rows in map(scaling_rows, filter(None, roce.senders))
                            if rows), []),
        "marks": b.marks, "pfc": b.pfc, "capture": b.capture, "errors": roce.errors,
        "fidelity": with_generators(
            watch.verdict(sampler_window, bottleneck=bench.bottleneck_label,
                          bandwidth_bound=bandwidth_bound, setup=setup).to_dict(),
            b.generators or {}, setup, frame_time_us(bench.fabric)),
    }
    if b.pfc is not None:  # testbed.measure.pauses.agent_alive_checks judges it
        result["pause_agent_running"] = b.pfc["pause_agent_running"]
    return result
