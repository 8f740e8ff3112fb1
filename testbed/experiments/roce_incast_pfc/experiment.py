"""``roce-incast-pfc``: RoCE incast on the lossless class stays lossless with PFC, and DCQCN
cuts the pauses PFC alone needs (Zhu et al., SIGCOMM 2015; Guo et al., "RDMA over Commodity
Ethernet at Scale", SIGCOMM 2016).

``senders`` RoCE QPs (RDMA WRITE, testbed.traffic.roce) send at once into one receiver
through one switch port (testbed.harness.roce_setups draws the bench). Every port has
traffic classes by DSCP with PFC on the lossless class (RoCE's DSCP 26; the pause agent,
testbed.apply.pfc_agent, sends real 802.1Qbb frames). Two setups, each on a fabric of its
own:

- ``pfc``: PFC alone; the senders have no congestion control (line rate), so the port's
  lossless queue reaches XOFF and pauses its feeders, the senders' NICs;
- ``pfc+dcqcn``: the same PFC, RED-ECN marking between Kmin = 5 KB and Kmax = 200 KB
  (bytes unchanged, see roce_setups) and DCQCN on every QP (its parameters scaled to the
  link by the transport): marks reach the senders before the queue reaches XOFF.

Measured per setup over the judged window: drops in the lossless queues (switches and
hosts), pause frames sent and port-seconds paused (the pause agent's counters), the real
queue (the lossless class's backlog every 10 ms), goodputs and their Jain index, marks, each
QP's rate, alpha and CNPs over time, a sample of the RoCE packets, whether the emulator kept
up and whether the pause agent ran throughout. With ``transport: rxe`` (pfc only) the QPs
are the kernel's softRoCE driven by perftest (testbed.traffic.roce.rxe).
"""
from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field, field_validator

from testbed.experiments.roce_incast_pfc.checks import PFC, PFC_DCQCN, incast_checks, incast_rows
from testbed.harness.experiment import Experiment, Params, Setup, SetupRun
from testbed.harness.roce_flows import RoceSettings, bottleneck_result, measure_bottleneck
from testbed.harness.roce_setups import (
    LOSSLESS_QUEUE,
    ack_timeout_s,
    bench_fabric,
    dcqcn_red_bytes,
    lossless_queue,
    roce_bench,
    roce_frame_bytes,
    transport_problems,
)
from testbed.harness.scenario import Problem
from testbed.plan.profiles import U32_MAX
from testbed.plan.scaling import DEFAULT_PFC_REACTION_TIME_S

MAX_RATE_MBIT = 100.0
MAX_SENDERS = 15
MAX_SECONDS = 600
SAMPLE_S = 0.010
ROCE_TIMEOUT_S = 60.0
CC_OF = {PFC: "none", PFC_DCQCN: "dcqcn"}


class RoceIncastPfcParams(Params):
    """The incast's fan-in, how long it runs and the part left out at its start, the
    port's buffer per class, the RoCE flows' shape, and the setups to run."""

    senders: int = Field(6, ge=2, le=MAX_SENDERS, description="QPs sending at once")
    seconds: int = Field(20, ge=3, le=MAX_SECONDS, description="seconds the incast runs")
    settle_s: float = Field(5.0, ge=0, le=MAX_SECONDS, description="seconds left out first")
    buffer_bytes: int = Field(1_500_000, ge=1, le=U32_MAX, description="every port's buffer "
                              "per class (holds PFC's headroom for every feeding port)")
    message_bytes: int = Field(1 << 20, ge=4096, le=64 << 20)
    roce_mtu_bytes: Literal[1024, 2048, 4096] = 1024
    conditions: list[Literal["pfc", "pfc+dcqcn"]] = Field(
        default_factory=lambda: [PFC, PFC_DCQCN], min_length=1, description="setups to run")
    pfc_reaction_time_s: float = Field(DEFAULT_PFC_REACTION_TIME_S, ge=0, le=1,
                                       allow_inf_nan=False)
    capture: bool = Field(True, description="keep a sample of RoCE packets per setup")
    transport: Literal["engine", "rxe"] = Field("engine", description="the user-space RoCEv2 "
                                                "engine, or the kernel's softRoCE (rxe; pfc "
                                                "only: rxe has no DCQCN)")

    @field_validator("conditions")
    @classmethod
    def _distinct(cls, values: list[str]) -> list[str]:
        if len(set(values)) != len(values):
            raise ValueError(f"lists a setup twice: {values}")
        return values


class RoceIncastPfc(Experiment):
    name = "roce-incast-pfc"
    title = "RoCE incast on the lossless class"
    Params = RoceIncastPfcParams
    reproduces = ("PFC keeps a RoCE incast lossless (IEEE 802.1Qbb); DCQCN's marks cut the "
                  "pauses it needs (Zhu et al., SIGCOMM 2015)")
    default_rate_mbit = 20.0
    default_mtu_bytes = 1500
    sections = frozenset()

    def problems(self) -> list[Problem]:
        p = self.params
        problems = []
        if self.rate_mbit > MAX_RATE_MBIT:
            problems.append(Problem(("link_rate_mbit",), f"roce-incast-pfc runs at most "
                                    f"{MAX_RATE_MBIT:g} Mbit/s, got {self.rate_mbit:g}"))
        if p.settle_s >= p.seconds - 1:
            problems.append(Problem(("params", "settle_s"), f"must leave at least a second of "
                                    f"the {p.seconds} s to judge, got {p.settle_s:g}"))
        problems += transport_problems(p.transport, self.platform)
        if p.transport == "rxe" and PFC_DCQCN in p.conditions:
            problems.append(Problem(("params", "conditions"), "pfc+dcqcn needs the engine's "
                                    "DCQCN; the rxe path runs pfc only"))
        return problems

    def setups(self) -> list[Setup]:
        p = self.params
        fabric = bench_fabric(p.senders, self.rate_mbit, self.mtu_bytes)
        setups = []
        for condition in p.conditions:
            ecn, ecn_record = dcqcn_red_bytes(self.rate_mbit) if condition == PFC_DCQCN \
                else (None, None)
            queue, record = lossless_queue(fabric, self.rate_mbit, self.mtu_bytes,
                                           p.buffer_bytes, ecn, p.pfc_reaction_time_s)
            if ecn_record:
                record["ecn"] = ecn_record
            setups.append(Setup(condition, fabric, queue=queue, queue_record=record,
                                description=f"{p.senders}:1 RoCE incast, PFC"
                                + (", RED-ECN and DCQCN" if ecn else ", no congestion control")))
        return setups

    def headline(self) -> str:
        p = self.params
        return (f"{self.title}: {p.senders}:1 at {self.rate_mbit:g} Mbit/s for {p.seconds} s; "
                f"{', '.join(p.conditions)}")

    def measure(self, run: SetupRun) -> dict:
        p = self.params
        bench = roce_bench(run.net.fabric)
        settings = RoceSettings(message_bytes=p.message_bytes, mtu_bytes=p.roce_mtu_bytes,
                                cc=CC_OF[run.setup.name], link_rate_mbit=self.rate_mbit,
                                duration_s=float(p.seconds),
                                ack_timeout_s=ack_timeout_s(p.buffer_bytes, self.rate_mbit),
                                timeout_s=ROCE_TIMEOUT_S, seed=self.scenario.seed,
                                transport=p.transport)
        run.log(f"{run.setup.name}: {p.senders}:1 RoCE incast into {bench.receiver} "
                f"(cc {settings.cc}) for {p.seconds} s")
        measured = measure_bottleneck(run, bench, settings, LOSSLESS_QUEUE, SAMPLE_S, p.capture)
        result = bottleneck_result(measured, bench, settings, p.settle_s,
                                   roce_frame_bytes(p.roce_mtu_bytes), SAMPLE_S,
                                   bandwidth_bound=True, setup=run.setup.name)
        queue = run.setup.queue
        result.update(condition=run.setup.name, rate_mbit=self.rate_mbit,
                      xoff_bytes=queue.pfc.xoff_bytes,
                      kmin_bytes=queue.ecn.kmin_bytes if queue.ecn else None,
                      kmax_bytes=queue.ecn.kmax_bytes if queue.ecn else None)
        pfc = result["pfc"]
        run.log(f"{run.setup.name}: {pfc['lossless_drops']} lossless drops, "
                f"{pfc['pause_frames_sent']} pause frames, {pfc['paused_s']:.2f} port-s paused")
        return result

    def checks(self, results):
        return incast_checks(results)

    def trust(self, results):
        from testbed.measure.pauses import agent_alive_checks

        return agent_alive_checks(results)

    def rows(self, results):
        return incast_rows(results)

    def plots(self, results, folder: Path, title: str) -> list[Path]:
        from testbed.harness.roce_plots import plot_setup_series

        paths = []
        for name, r in results.items():
            if "queue" not in r:
                continue
            marks = {"Kmin": r["kmin_bytes"], "Kmax": r["kmax_bytes"]} if r["kmin_bytes"] else {}
            paths += plot_setup_series(name, r, {**marks, "XOFF": r["xoff_bytes"]}, title,
                                       folder)
        return paths
