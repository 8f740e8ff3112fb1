"""``roce-loss``: goodput against random packet loss, RoCE's go-back-N against TCP on the same
path, showing why RoCE needs a lossless fabric.

    l0h0 ==(loss p, both directions)== l0 ---- l0h1

For every loss rate p in ``loss_percents`` one setup runs on a fabric of its own: one switch,
a sender and a receiver. The eBPF loss program (testbed/apply/bpf/loss.c, no netem needed)
loses each packet on the sender's link with probability p in both directions (data and
ACKs alike). On it, one after the other and for ``seconds`` each:

- one RoCE QP (testbed.traffic.roce, RDMA WRITE of ``message_bytes`` messages at RoCE path
  MTU ``roce_mtu_bytes``, no congestion control, unpaced, ``max_outstanding`` packets in
  flight as a NIC's send window): the window waits in the switch's queue (the port's
  buffer holds it: checked), so a loss is noticed only when the packets behind it arrive
  out of sequence, and go-back-N sends all of them again. Goodput falls roughly as
  1 / (1 + p * window), and a lost NAK or retransmission costs an ACK timeout;
- one TCP flow (iperf3, the hosts' default congestion control): SACK repairs a loss alone,
  and its window shrinks with loss, so its queue (and its repair cost) shrinks too.

On a real fabric the window in flight is the path's bandwidth-delay product (tens to
hundreds of packets at 100 Gbit/s); veth links have no propagation delay and this kernel
has no netem, so here the window sits in the queue instead.

Measured: each flow's goodput, RoCE's retransmissions, NAKs and timeouts, TCP's
retransmitted segments, the loss the program applied (its counters), a sample of the RoCE
packets (the first setup's receiver NIC, ``roce-sample.pcap``) decoded by tshark and checked
by scapy, and whether the emulator kept up (judged on the RoCE flow's window; bandwidth-bound
at zero loss only). With ``transport: rxe`` the RoCE flow is the kernel's softRoCE driven by
perftest (testbed.traffic.roce.rxe), where the kernel has rdma_rxe: the same go-back-N in the
kernel's RC implementation, its window its own.
"""
from __future__ import annotations

import json
import time
from contextlib import nullcontext
from pathlib import Path
from typing import Annotated

from pydantic import Field, field_validator

from testbed.drive.flows import flow_window, read_tcp_counters, run_flows
from testbed.drive.roce_flows import RoceCapture, RoceSettings, run_roce_flows, settings_record
from testbed.experiments.roce_common.roce_experiment import (
    RoceParams,
    TransportParams,
    roce_problems,
)
from testbed.experiments.roce_common.roce_setups import (
    ack_timeout_s,
    roce_frame_bytes,
    transport_problems,
)
from testbed.experiments.roce_loss.checks import loss_checks, loss_rows
from testbed.experiments.roce_loss.plots import plot_goodput
from testbed.harness.experiment import Experiment, Setup, SetupRun
from testbed.harness.scenario import Problem
from testbed.measure.generators import GeneratorCpu, frame_time_us, with_generators
from testbed.measure.roce import decode_capture
from testbed.model.bench import bench_fabric, bench_of
from testbed.plan.loss_plan import Loss, link_cuts
from testbed.plan.port_queue import default_buffer_bytes

MAX_RATE_MBIT = 200.0  # one userspace switch forwards this at MTU 1500 with room to spare
MAX_SECONDS = 600
ROCE_TIMEOUT_S = 60.0
SERIES_FILE = "roce-loss.json"


class RoceLossParams(RoceParams, TransportParams):
    """Loss rates (each a setup of its own; the first must be 0, the reference), how long
    each flow runs, and the RoCE flow's shape."""

    loss_percents: list[Annotated[float, Field(ge=0, lt=100)]] = Field(
        [0.0, 0.01, 0.1, 1.0], min_length=2, description="random loss per direction, in percent, "
                                                        "increasing from 0")
    seconds: int = Field(10, ge=2, le=MAX_SECONDS, description="seconds each flow runs")
    omit_s: int = Field(2, ge=0, le=60, description="TCP start-up seconds left out")
    max_outstanding: int = Field(64, ge=1, le=4096, description="RoCE packets in flight "
                                 "(the send window)")
    capture: bool = Field(True, description="keep a sample of RoCE packets (first setup)")

    @field_validator("loss_percents")
    @classmethod
    def _from_zero_up(cls, values: list[float]) -> list[float]:
        if values[0] != 0 or any(b <= a for a, b in zip(values, values[1:])):
            raise ValueError(f"must start at 0 and increase, got {values}")
        return values


def setup_name(loss_percent: float) -> str:
    """``loss-0``, ``loss-0.01``: a setup's name and folder."""
    return f"loss-{loss_percent:g}"


class RoceLoss(Experiment):
    name = "roce-loss"
    title = "RoCE and TCP goodput under packet loss"
    Params = RoceLossParams
    captions = {
        "roce-loss.png": ("RoCE's go-back-N goodput should collapse as loss grows while TCP "
                          "keeps most of its loss-free goodput."),
    }
    default_rate_mbit = 20.0
    default_mtu_bytes = 1500  # RoCE path MTU 1024 in a standard Ethernet frame
    sections = frozenset()  # every setup is the same two-host fabric with its own loss

    def problems(self) -> list[Problem]:
        problems = roce_problems(self, MAX_RATE_MBIT)
        window = self.params.max_outstanding * roce_frame_bytes(self.params.roce_mtu_bytes)
        buffer = default_buffer_bytes(self.rate_mbit, self.mtu_bytes)
        if window > buffer:
            problems.append(Problem(("params", "max_outstanding"), f"{self.params.max_outstanding}"
                                    f" packets ({window} B) do not fit the switch port's "
                                    f"{buffer}-byte buffer: the flow would lose packets to "
                                    f"its own queue"))
        problems += transport_problems(self.params.transport, self.platform)
        if self.scenario.impairments:
            problems.append(Problem(("impairments",), "roce-loss loses packets on each setup "
                                    "itself (params.loss_percents); leave impairments out"))
        if self.params.omit_s >= self.params.seconds:
            problems.append(Problem(("params", "omit_s"), "must be below seconds"))
        return problems

    def setups(self) -> list[Setup]:
        fabric = bench_fabric(1, self.rate_mbit, self.mtu_bytes)
        return [Setup(setup_name(p), fabric, description=f"{p:g}% random loss each way on "
                      "the sender's link") for p in self.params.loss_percents]

    def headline(self) -> str:
        p = self.params
        return (f"{self.title}: one RoCE QP and one TCP flow, {p.seconds} s each, at "
                f"{self.rate_mbit:g} Mbit/s, loss {', '.join(f'{x:g}%' for x in p.loss_percents)}")

    def settings(self) -> RoceSettings:
        p = self.params
        return RoceSettings(message_bytes=p.message_bytes, mtu_bytes=p.roce_mtu_bytes,
                            duration_s=float(p.seconds), max_outstanding=p.max_outstanding,
                            ack_timeout_s=ack_timeout_s(p.max_outstanding * roce_frame_bytes(
                                p.roce_mtu_bytes), self.rate_mbit),
                            timeout_s=ROCE_TIMEOUT_S, seed=self.scenario.seed,
                            transport=p.transport)

    # -- on a running fabric ----------------------------------------------------------------
    def measure(self, run: SetupRun) -> dict:
        p, net = self.params, run.net
        loss_percent = p.loss_percents[[setup_name(x) for x in p.loss_percents]
                                       .index(run.setup.name)]
        bench = bench_of(net.fabric)
        src, dst = bench.senders[0], bench.receiver
        switch, _ = net.fabric.host_attachment(src)
        if loss_percent:
            net.lose([(cut, Loss(loss_percent / 100)) for cut in link_cuts(net.fabric, src,
                                                                            switch)])
        settings = self.settings()
        first = run.setup.name == setup_name(p.loss_percents[0])
        capture = RoceCapture(net, dst, run.workdir) if p.capture and first else nullcontext()
        run.log(f"{run.setup.name}: RoCE {src} -> {dst} for {p.seconds} s, then TCP")
        tcp_before = read_tcp_counters(net, [src])
        with run.watch() as watch:
            with capture, GeneratorCpu() as cpu:
                roce = run_roce_flows(net, [(src, dst)], settings, run.workdir, cpu)
            t_tcp = time.monotonic()
            tcp_mbit, tcp_errors = run_flows(net, [(src, dst)], p.seconds, p.omit_s)
        tcp_after = read_tcp_counters(net, [src])
        counters = net.loss_counters()
        window = (watch.window_s(*roce.window_monotonic_s) if roce.window_monotonic_s
                  else watch.window_s())
        fidelity = watch.verdict(window, bottleneck=f"{switch}->{dst}",
                                 bandwidth_bound=loss_percent == 0, setup=run.setup.name)
        sender = roce.senders[0] or {}
        tcp_window = flow_window(t_tcp, p.seconds, p.omit_s)
        result = {
            "loss_percent": loss_percent, "rate_mbit": self.rate_mbit,
            "roce": {**roce.summary()["flows"][0], "settings": settings_record(settings),
                     "qp": sender.get("qp")},
            "roce_goodput_mbit": sender.get("goodput_mbit"),
            "tcp_goodput_mbit": tcp_mbit[0] if tcp_mbit else None,
            "tcp_retransmitted_segments": tcp_after[src]["retransmits"]
            - tcp_before[src]["retransmits"],
            "tcp_window_monotonic_s": list(tcp_window),
            "applied_loss": {"matched": counters["matched"], "dropped": counters["dropped"],
                             "fraction": counters["dropped"] / counters["matched"]
                             if counters["matched"] else 0.0},
            "errors": roce.errors + tcp_errors,
            "window_monotonic_s": list(roce.window_monotonic_s or (0.0, 0.0)),
            "fidelity": with_generators(fidelity.to_dict(), cpu.summary(), run.setup.name,
                                        frame_time_us(run.net.fabric)),
        }
        if p.capture and first:
            result["capture"] = {**capture.record(), **decode_capture(capture.path)}
        (run.workdir / SERIES_FILE).write_text(json.dumps(result))
        run.log(f"{run.setup.name}: RoCE {result['roce_goodput_mbit'] or 0:.2f} Mbit/s "
                f"({sender.get('retransmitted_packets')} packets retransmitted), TCP "
                f"{result['tcp_goodput_mbit'] or 0:.2f} Mbit/s; the program dropped "
                f"{counters['dropped']} of {counters['matched']} packets")
        return result

    # -- judging and showing ----------------------------------------------------------------
    def checks(self, results):
        return loss_checks(results, self.rate_mbit)

    def rows(self, results):
        return loss_rows(results)

    def plots(self, results, folder: Path, title: str) -> list[Path]:
        return [plot_goodput(results, self.rate_mbit, title, folder / "roce-loss.png")]
