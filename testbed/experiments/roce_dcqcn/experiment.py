"""``roce-dcqcn``: DCQCN flows sharing one bottleneck converge to a fair share with the queue
held between the marking thresholds; without congestion control the queue fills (Zhu et al.,
"Congestion Control for Large-Scale RDMA Deployments", SIGCOMM 2015).

For every N in ``senders`` (2 to 4), N RoCE QPs (RDMA WRITE, testbed.traffic.roce) send into
one receiver through one switch port (testbed.experiments.roce_common.roce_setups draws the bench), each
under DCQCN: the receiver's notification point answers CE-marked packets with CNPs (at most
one per CNP interval per QP), the sender's reaction point cuts and recovers its rate. The
paper's parameters are scaled to the emulated link by the transport
(testbed.traffic.roce.cc.dcqcn.params_for_link: rates by link/40G, times by 40G/link), and
the scaling goes into the results. Every port's queue is a DCQCN deployment's: traffic
classes by DSCP (RoCE data 26 lossless, CNPs 48), PFC on the lossless class, RED-ECN marking
between Kmin = 5 KB and Kmax = 200 KB with Pmax = 1% (bytes unchanged: see roce_setups).
A last setup, ``n<max>-none``, runs the largest N with no congestion control (line rate).

Measured over the judged window (from ``settle_s`` after the flows start to their end): the
bottleneck's real queue (its lossless class's backlog over rtnetlink, every 10 ms;
testbed.measure.backlog) and, on the eBPF marking path, the marker's model beside it with
their divergence; each flow's goodput and their Jain index; utilisation; marks and pauses;
each QP's rate, alpha and CNPs over time; a sample of the RoCE packets; whether the emulator
kept up.
"""
from __future__ import annotations

from typing import Annotated

from pydantic import Field

from testbed.experiments.roce_common.roce_experiment import (
    BottleneckExperiment,
    BottleneckParams,
    Distinct,
)
from testbed.experiments.roce_common.roce_setups import dcqcn_red_bytes, lossless_queue
from testbed.experiments.roce_dcqcn.checks import dcqcn_checks, dcqcn_rows
from testbed.harness.experiment import Setup
from testbed.model.bench import bench_fabric
from testbed.plan.profiles import U32_MAX
from testbed.plan.scaling import DEFAULT_PFC_REACTION_TIME_S

DCQCN, NONE = "dcqcn", "none"


class RoceDcqcnParams(BottleneckParams):
    """Sender counts (each a setup), how long the flows run and the part left out while
    they converge, the port's buffer per class, and whether the largest count also runs
    without congestion control."""

    senders: Annotated[list[Annotated[int, Field(ge=2, le=4)]], Distinct] = Field(
        [2, 4], min_length=1, description="DCQCN flows into the bottleneck, e.g. 2,4")
    seconds: int = Field(80, ge=5, le=600, description="seconds the flows run")
    settle_s: float = Field(55.0, ge=0, le=600, description="seconds left out while the "
                            "rates converge (55 s at 20 Mbit/s; DCQCN's timers scale with "
                            "40 Gbit/s / link, so its convergence takes 20/rate as long)")
    buffer_bytes: int = Field(1_000_000, ge=1, le=U32_MAX, description="every port's buffer "
                              "per class (holds Kmax and PFC's headroom)")
    no_cc_setup: bool = Field(True, description="also run the largest count without "
                              "congestion control")
    pfc_reaction_time_s: float = Field(DEFAULT_PFC_REACTION_TIME_S, ge=0, le=1,
                                       allow_inf_nan=False,
                                       description="pause reaction time sizing the PFC "
                                                   "headroom")


def setup_name(senders: int, cc: str) -> str:
    return f"n{senders}-{cc}"


class RoceDcqcn(BottleneckExperiment):
    name = "roce-dcqcn"
    title = "DCQCN fairness and queue"
    Params = RoceDcqcnParams

    def setup_plan(self) -> list[tuple[int, str]]:
        p = self.params
        plan = [(n, DCQCN) for n in p.senders]
        if p.no_cc_setup:
            plan.append((max(p.senders), NONE))
        return plan

    def cc_of(self, setup: Setup) -> str:
        return setup.name.rsplit("-", 1)[1]

    def setups(self) -> list[Setup]:
        p = self.params
        ecn, ecn_record = dcqcn_red_bytes(self.rate_mbit)
        setups = []
        for n, cc in self.setup_plan():
            fabric = bench_fabric(n, self.rate_mbit, self.mtu_bytes)
            queue, record = lossless_queue(fabric, self.rate_mbit, self.mtu_bytes,
                                           p.buffer_bytes, ecn, p.pfc_reaction_time_s)
            record["ecn"] = ecn_record
            setups.append(Setup(setup_name(n, cc), fabric, queue=queue, queue_record=record,
                                description=f"{n} RoCE QPs -> 1 receiver, cc {cc}, RED-ECN "
                                f"{ecn.kmin_bytes}-{ecn.kmax_bytes} B, PFC"))
        return setups

    def headline(self) -> str:
        p = self.params
        return (f"{self.title}: {', '.join(map(str, p.senders))} DCQCN QPs -> 1 receiver at "
                f"{self.rate_mbit:g} Mbit/s for {p.seconds} s"
                + (f", then {max(p.senders)} without congestion control" if p.no_cc_setup
                   else ""))

    def checks(self, results):
        return dcqcn_checks(results)

    def rows(self, results):
        return dcqcn_rows(results)
