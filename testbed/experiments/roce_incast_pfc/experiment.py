"""``roce-incast-pfc``: RoCE incast on the lossless class stays lossless with PFC, and DCQCN
cuts the pauses PFC alone needs (Zhu et al., SIGCOMM 2015; Guo et al., "RDMA over Commodity
Ethernet at Scale", SIGCOMM 2016).

``senders`` RoCE QPs (RDMA WRITE, testbed.traffic.roce) send at once into one receiver
through one switch port (testbed.experiments.roce_common.roce_setups draws the bench). Every port has
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

from dataclasses import replace
from typing import Annotated, Literal

from pydantic import Field

from testbed.drive.roce_flows import RoceSettings
from testbed.experiments.roce_common.roce_experiment import (
    BottleneckExperiment,
    BottleneckParams,
    Distinct,
    TransportParams,
)
from testbed.experiments.roce_common.roce_setups import (
    dcqcn_red_bytes,
    incast_outstanding,
    lossless_queue,
    roce_frame_bytes,
    transport_problems,
)
from testbed.experiments.roce_incast_pfc.checks import PFC, PFC_DCQCN, incast_checks, incast_rows
from testbed.harness.experiment import Setup
from testbed.harness.scenario import Problem
from testbed.model.bench import bench_fabric
from testbed.plan.profiles import U32_MAX
from testbed.plan.scaling import DEFAULT_PFC_REACTION_TIME_S

CC_OF = {PFC: "none", PFC_DCQCN: "dcqcn"}


class RoceIncastPfcParams(BottleneckParams, TransportParams):
    """The incast's fan-in, how long it runs and the part left out at its start, the
    port's buffer per class, the setups to run and the RoCE implementation."""

    senders: int = Field(6, ge=2, le=15, description="QPs sending at once")
    seconds: int = Field(20, ge=3, le=600, description="seconds the incast runs")
    settle_s: float = Field(5.0, ge=0, le=600, description="seconds left out first")
    buffer_bytes: int = Field(1_500_000, ge=1, le=U32_MAX, description="every port's buffer "
                              "per class (holds PFC's headroom for every feeding port)")
    conditions: Annotated[list[Literal["pfc", "pfc+dcqcn"]], Distinct] = Field(
        default_factory=lambda: [PFC, PFC_DCQCN], min_length=1, description="setups to run")
    pfc_reaction_time_s: float = Field(DEFAULT_PFC_REACTION_TIME_S, ge=0, le=1,
                                       allow_inf_nan=False,
                                       description="pause reaction time sizing the PFC "
                                                   "headroom")


class RoceIncastPfc(BottleneckExperiment):
    name = "roce-incast-pfc"
    title = "RoCE incast on the lossless class"
    Params = RoceIncastPfcParams

    def cc_of(self, setup: Setup) -> str:
        return CC_OF[setup.name]

    def problems(self):
        p = self.params
        problems = super().problems() + transport_problems(p.transport, self.platform)
        if p.transport == "rxe" and PFC_DCQCN in p.conditions:
            problems.append(Problem(("params", "conditions"), "pfc+dcqcn needs the engine's "
                                    "DCQCN; the rxe path runs pfc only"))
        return problems

    def settings(self, setup: Setup) -> RoceSettings:
        """The base class's senders with the window of an incast: enough in flight to fill
        the port past XOFF (roce_setups.incast_outstanding)."""
        p = self.params
        return replace(super().settings(setup), max_outstanding=incast_outstanding(
            p.buffer_bytes, p.senders, roce_frame_bytes(p.roce_mtu_bytes)))

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

    def checks(self, results):
        return incast_checks(results)

    def rows(self, results):
        return incast_rows(results)
