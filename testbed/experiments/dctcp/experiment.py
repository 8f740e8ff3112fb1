"""The DCTCP micro-benchmark: N long TCP flows into one receiver through one switch port,
drop-tail against ECN marking at K, with the port's queue sampled every 10 ms.

For every N in ``senders`` two setups run, each on a fabric of its own
(testbed.experiments.dctcp.bench draws it), each with its own queue and host TCP:

- ``nN-droptail``: the port's byte buffer alone; hosts run loss-based TCP (``droptail_cc``,
  cubic by default) with ECN off (net.ipv4.tcp_ecn=0);
- ``nN-ecn``: the same buffer with a step mark at K (``k_bytes``, or DCTCP's anchors scaled
  to the link rate by testbed.plan.scaling); hosts run the best congestion control the
  kernel has with ECN (``ecn_cc`` auto: dctcp where it exists, else cubic with classic ECN;
  the results record which).

Measured per setup, over the judged window (after ``omit_s`` seconds of TCP start-up, until
just before the flows end): the bottleneck's real queue (its bfifo's backlog over rtnetlink,
testbed.measure.backlog) and, on the eBPF marking path, the marker's model of it at the same
instants, with their divergence; median, p95 and max in bytes and in MTU-sized packets; the
bottleneck's utilisation; marks and drops at the port; each flow's goodput (iperf3) and their
Jain index; and whether the emulator kept up. The checks (testbed.experiments.dctcp.checks)
are judged on the real queue.
"""
from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated, Literal

from pydantic import Field, field_validator

from testbed.drive.flows import SERVER_START_S, run_flows
from testbed.errors import ConfigError
from testbed.experiments.dctcp.bench import (
    DROPTAIL,
    DROPTAIL_CCS,
    DROPTAIL_SYSCTLS,
    ECN,
    QUEUEINGS,
    QUEUE_FILE,
    QUEUE_SAMPLE_MS,
    judged_window_s,
    parse_ping_rtt_ms,
    setup_name,
    summarise_queue,
    tcp_label,
    window_samples,
    write_queue_samples,
)
from testbed.experiments.dctcp.checks import dctcp_checks, setup_row, summary_rows
from testbed.experiments.dctcp.plots import plot_queues
from testbed.harness.experiment import Experiment, Params, Setup, SetupRun
from testbed.harness.scenario import FamilyTopology, Problem
from testbed.measure.backlog import PortBacklog, backlog_divergence
from testbed.measure.queues import queue_sampling
from testbed.measure.stats import jain_index
from testbed.model.bench import Bench, bench_fabric, bench_of
from testbed.plan.ecn_plan import ECN_PATH_EBPF
from testbed.plan.port_queue import default_buffer_bytes
from testbed.plan.profiles import U32_MAX, QueueConfig
from testbed.plan.settings import (
    TCP_CC_CHOICES,
    EcnSettings,
    TcpSettings,
    ecn_settings,
    tcp_settings,
)
from testbed.system.counters import counter_delta
from testbed.system.running import RunningFabric

# Rates up to the Mininet-HiFi reproduction's 100 Mbit/s, well inside what one TCP flow gets
# through two userspace switches at MTU 1500 (testbed bench; docs/capacity.md): N senders'
# bursts arrive at up to N times the port rate, and every sampled read of the queue costs CPU
# too.
MAX_RATE_MBIT = 100.0
# Two iperf3 processes per flow on a 2-core machine, one host link each on the one switch.
MAX_SENDERS = 32
MIN_SECONDS, MAX_SECONDS = 5, 600
MAX_OMIT_S = 60
MAX_RTT_S = 10.0
MIN_BUFFER_FRAMES = 4  # a buffer of fewer full frames leaves no room between K and full
PROGRESS_EVERY_S = 1.0
PING_COUNT = 5
PING_INTERVAL_S = 0.2
QDISC, MARKER = "qdisc", "marker"  # the two sampled series: the real queue, the model
BUFFER_RULE = "50 ms at the link rate, at least 8 frames"


class DctcpParams(Params):
    """Sender counts (each runs drop-tail, then ECN, on a fabric of its own), how long the
    flows run, K and the buffer (None: K from DCTCP's anchors scaled to the link rate, the
    buffer 50 ms at it), and the hosts' TCP."""

    senders: list[Annotated[int, Field(ge=1, le=MAX_SENDERS)]] = Field(
        [2, 8], min_length=1, description="sender counts to run, e.g. 2,8")
    seconds: int = Field(30, ge=MIN_SECONDS, le=MAX_SECONDS,
                         description="measured seconds per setup")
    omit_s: int = Field(5, ge=0, le=MAX_OMIT_S, description="TCP start-up seconds left out")
    k_bytes: int | None = Field(None, ge=1, le=U32_MAX, description="marking threshold K in "
                                "bytes (None: DCTCP's anchors scaled to the link rate)")
    buffer_bytes: int | None = Field(None, ge=1, le=U32_MAX, description="the port's buffer "
                                     "in bytes (None: 50 ms at the link rate)")
    rtt_s: float | None = Field(None, gt=0, le=MAX_RTT_S, allow_inf_nan=False,
                                description="path RTT in seconds; a scaled K then also "
                                            "satisfies K > C*RTT/7")
    droptail_cc: Literal[DROPTAIL_CCS] = Field("cubic", description="drop-tail hosts' TCP "
                                               "(loss-based)")
    ecn_cc: Literal[TCP_CC_CHOICES] = Field("auto", description="ECN hosts' TCP (auto: dctcp "
                                            "where the kernel has it, else cubic with ECN)")

    @field_validator("senders")
    @classmethod
    def _once_each(cls, value: list[int]) -> list[int]:
        if len(set(value)) != len(value):
            raise ValueError(f"lists a count twice: {value}")
        return value


class Dctcp(Experiment):
    name = "dctcp"
    title = "DCTCP micro-benchmark"
    Params = DctcpParams
    captions = {
        "queue_time.png": ("With ECN the queue should hover near K; drop-tail fills it to the "
                           "buffer line and saws down after losses."),
        "queue_cdf.png": ("The ECN curve should rise near K and well left of drop-tail's, "
                          "which reaches the buffer: DCTCP's short queue at full throughput."),
    }
    default_rate_mbit = 20.0
    default_mtu_bytes = 1500  # DCTCP counts K in packets of a standard Ethernet MTU
    sections = frozenset()  # every setup has its own fabric, queue and host TCP
    cli_aliases = {"--omit": "omit_s"}

    def default_topology(self):
        return FamilyTopology(name="spineleaf", leaves=1, spines=1)

    # -- what runs ------------------------------------------------------------------------------
    def problems(self) -> list[Problem]:
        p = self.params
        problems = []
        if self.rate_mbit > MAX_RATE_MBIT:
            problems.append(Problem(("link_rate_mbit",), f"must be at most {MAX_RATE_MBIT:g} "
                                    f"for dctcp (what one userspace switch forwards with room "
                                    f"to spare), got {self.rate_mbit:g}"))
        if p.buffer_bytes is not None and p.buffer_bytes < MIN_BUFFER_FRAMES * self.mtu_bytes:
            problems.append(Problem(("params", "buffer_bytes"), f"must hold at least "
                                    f"{MIN_BUFFER_FRAMES} frames of {self.mtu_bytes} B, got "
                                    f"{p.buffer_bytes}"))
        if p.rtt_s is not None and p.k_bytes is not None:
            problems.append(Problem(("params", "rtt_s"), "raises a K scaled from the anchors "
                                    "(K > C*RTT/7); it does not apply with k_bytes"))
        return problems

    def ecn_settings(self) -> EcnSettings:
        """The marked queue (testbed.plan.settings): a step at ``k_bytes``, or the dctcp
        scheme scaled to the rate; errors name this experiment's own parameters."""
        p = self.params
        buffer_bytes = p.buffer_bytes or default_buffer_bytes(self.rate_mbit, self.mtu_bytes)
        section: dict = {"buffer_bytes": buffer_bytes, "sample_ms": QUEUE_SAMPLE_MS}
        if p.k_bytes is not None:
            section.update(profile="step", k_bytes=p.k_bytes)
        else:
            section["scheme"] = "dctcp"
        if p.rtt_s is not None:
            section["rtt_s"] = p.rtt_s
        try:
            return ecn_settings(section, self.rate_mbit, self.mtu_bytes, buffer_bytes)
        except ConfigError as err:
            key = err.field.removeprefix("ecn.")
            field = f"params.{key}" if key in DctcpParams.model_fields else "params"
            raise ConfigError(field, err.problem) from None

    def host_tcp(self) -> dict[str, TcpSettings]:
        """The drop-tail and the ECN hosts' TCP on this machine."""
        p = self.params
        chosen = {}
        for queueing, ecn, cc, field in ((DROPTAIL, False, p.droptail_cc, "droptail_cc"),
                                         (ECN, True, p.ecn_cc, "ecn_cc")):
            try:
                chosen[queueing] = tcp_settings(ecn, cc, self.platform)
            except ConfigError as err:
                problem = err.problem.replace("tcp_cc: auto", f"{field}: auto")
                raise ConfigError(f"params.{field}", problem) from None
        return chosen

    def setups(self) -> list[Setup]:
        ecn = self.ecn_settings()
        tcp = self.host_tcp()
        buffer_bytes = ecn.queue.buffer_bytes
        record = {"buffer_bytes": buffer_bytes, "buffer_rule": "as configured"
                  if self.params.buffer_bytes else BUFFER_RULE}
        queues = {DROPTAIL: (QueueConfig(buffer_bytes), record),
                  ECN: (ecn.queue, {**record, "ecn": ecn.scaling})}
        setups = []
        for n in self.params.senders:
            fabric = bench_fabric(n, self.rate_mbit, self.mtu_bytes)
            for queueing in QUEUEINGS:
                queue, queue_record = queues[queueing]
                what = ("drop-tail" if queueing == DROPTAIL
                        else f"ECN at K = {ecn.queue.ecn.k_bytes} B")
                setups.append(Setup(
                    setup_name(n, queueing), fabric, queue=queue, queue_record=queue_record,
                    tcp=tcp[queueing], sysctls=DROPTAIL_SYSCTLS if queueing == DROPTAIL else {},
                    description=f"{n} senders -> 1 receiver, {what}, hosts "
                                f"{tcp_label(tcp[queueing].to_dict())}"))
        return setups

    def headline(self) -> str:
        ecn = self.ecn_settings()
        tcp = self.host_tcp()
        return (f"{self.title}: {', '.join(map(str, self.params.senders))} senders -> 1 "
                f"receiver at {self.rate_mbit:g} Mbit/s, buffer {ecn.queue.buffer_bytes} B, "
                f"K {ecn.queue.ecn.k_bytes} B; drop-tail hosts "
                f"{tcp_label(tcp[DROPTAIL].to_dict())}, ECN hosts "
                f"{tcp_label(tcp[ECN].to_dict())} ({tcp[ECN].decided_by})")

    # -- on a running fabric ----------------------------------------------------------------------
    def measure(self, run: SetupRun) -> dict:
        """Every sender's long flow into the receiver at once, with the bottleneck queue (the
        qdisc's backlog and the marker's model) sampled every 10 ms, link counters and CPU
        every 0.25 s, and the port's counters around it."""
        p = self.params
        net, setup = run.net, run.setup
        bench = bench_of(net.fabric)
        intf = bench.bottleneck_intf
        queueing = DROPTAIL if setup.queue.ecn is None else ECN
        mtu = net.fabric.mtu_bytes
        # On the eBPF path the marker keeps its own model of the queue; on the RED path the
        # qdisc is the one that marks, and the only queue there is.
        model = net.ecn_path == ECN_PATH_EBPF
        rtt = idle_rtt(net, bench)
        pairs = [(sender, bench.receiver) for sender in bench.senders]
        before = net.ecn_counters()
        run.log(f"{setup.name}: {len(pairs)} flows for {p.omit_s} + {p.seconds} s; idle RTT "
                f"{'-' if rtt is None else format(rtt['avg_ms'], '.2f')} ms; queue of {intf} "
                f"sampled every {QUEUE_SAMPLE_MS:g} ms "
                f"({'qdisc backlog and marker model' if model else 'qdisc backlog'})")
        with run.watch() as watch, PortBacklog(intf) as backlog:
            def read() -> dict[str, int]:
                depths = {MARKER: net.marker_depths()[intf]} if model else {}
                depths[QDISC] = backlog.read()  # right after the model, at the same instant
                return depths

            t_queue0 = time.monotonic()
            with queue_sampling(read, [QDISC, MARKER] if model else [QDISC],
                                QUEUE_SAMPLE_MS / 1000) as series:
                # run_flows starts the servers, waits SERVER_START_S, then every client
                t_flows = time.monotonic() + SERVER_START_S
                with flow_progress(run.progress, series, mtu, t_flows, p.omit_s + p.seconds):
                    rates, errors = run_flows(net, pairs, p.seconds, p.omit_s)
        counters = counter_delta(before, net.ecn_counters())[intf]

        window = judged_window_s(p.omit_s, p.seconds)
        t_rel = [t + t_queue0 - t_flows for t in series.t_s]
        qdisc = series.depth_bytes[QDISC]
        marker = series.depth_bytes[MARKER] if model else None
        write_queue_samples(run.workdir / QUEUE_FILE, t_rel, qdisc, marker, series.read_s)
        sampler_window = watch.window_s(t_flows + window[0], t_flows + window[1])
        utilisation = watch.utilisation(sampler_window)[bench.bottleneck_label]
        fidelity = watch.verdict(sampler_window, bottleneck=bench.bottleneck_label,
                                 # drop-tail TCP fills the port whatever happens: if the port
                                 # is not busy, the emulator held the traffic back. Under ECN a
                                 # short port is what the run measures, not a fault.
                                 bandwidth_bound=queueing == DROPTAIL, setup=setup.name)
        divergence = None
        if marker is not None:
            _, real_in = window_samples(t_rel, qdisc, window)
            _, model_in = window_samples(t_rel, marker, window)
            divergence = backlog_divergence(real_in, model_in, within_bytes=mtu)
        scaling = (setup.queue_record or {}).get("ecn") or {}
        result = {
            "senders": len(bench.senders), "queueing": queueing, "rate_mbit": self.rate_mbit,
            "mtu_bytes": mtu, "buffer_bytes": setup.queue.buffer_bytes,
            "k_bytes": None if setup.queue.ecn is None else setup.queue.ecn.start_bytes,
            "k_scaling": (scaling.get("ecn") or [None])[0], "tcp": setup.tcp.to_dict(),
            "ecn_path": net.ecn_path, "bottleneck": intf,
            "bottleneck_label": bench.bottleneck_label, "window_s": list(window),
            "window_monotonic_s": [t_flows + window[0], t_flows + window[1]],
            "queue_source": "qdisc backlog (rtnetlink)",
            "queue": summarise_queue(t_rel, qdisc, window, mtu),
            "marker_queue": None if marker is None else summarise_queue(t_rel, marker, window,
                                                                        mtu),
            "divergence": divergence,
            "utilisation": utilisation,
            "bottleneck_mbit": watch.rates_mbit(sampler_window)[bench.bottleneck_label],
            "flow_mbit": rates, "jain": jain_index(rates), "marks": counters.get("marks"),
            "fifo_drops": counters.get("fifo_drops") or 0,
            "virtual_fifo_drops": counters.get("virtual_fifo_drops"), "counters": counters,
            "fidelity": {**fidelity.to_dict(), "switch_packets": watch.switches,
                         "emulator_lost": watch.emulator_lost()},
            "idle_rtt": rtt, "sampler_error": series.error, "errors": errors,
        }
        run.log(": ".join(setup_row(setup.name, result)))
        return result

    # -- judging and showing --------------------------------------------------------------------
    def checks(self, results):
        return dctcp_checks(results)

    def rows(self, results):
        return summary_rows(results)

    def plots(self, results, folder: Path, title: str) -> list[Path]:
        return plot_queues(results, folder, title)


def idle_rtt(net: RunningFabric, bench: Bench) -> dict | None:
    """The RTT from the first sender to the receiver before any flow runs."""
    out = net.cmd(bench.senders[0], "ping", "-q", "-c", str(PING_COUNT), "-i",
                  str(PING_INTERVAL_S), net.fabric.nodes[bench.receiver].ip)
    return parse_ping_rtt_ms(out)


@contextmanager
def flow_progress(progress, series, mtu_bytes: int, t_flows: float,
                  total_s: float) -> Iterator[None]:
    """The flows' progress (seconds of ``total_s``) with the latest real queue, while they
    run (testbed.harness.progress)."""
    with progress.phase("flows", total=total_s) as phase:
        stop = threading.Event()

        def tick():
            while not stop.wait(PROGRESS_EVERY_S):
                depths = series.depth_bytes[QDISC] or [0]
                elapsed = min(total_s, max(0.0, time.monotonic() - t_flows))
                phase.update(round(elapsed), f"queue {depths[-1] / mtu_bytes:.1f} packets, "
                                             f"{len(depths)} samples")

        thread = threading.Thread(target=tick, daemon=True)
        thread.start()
        try:
            yield
        finally:
            stop.set()
            thread.join()
