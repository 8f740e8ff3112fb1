"""``roce-dcqcn``: DCQCN flows sharing one bottleneck converge to a fair share with the queue
held between the marking thresholds; without congestion control the queue fills (Zhu et al.,
"Congestion Control for Large-Scale RDMA Deployments", SIGCOMM 2015).

For every N in ``senders`` (2 to 4), N RoCE QPs (RDMA WRITE, testbed.traffic.roce) send into
one receiver through one switch port (testbed.harness.roce_setups draws the bench), each
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

from pathlib import Path
from typing import Annotated

from pydantic import Field, field_validator

from testbed.experiments.roce_dcqcn.checks import dcqcn_checks, dcqcn_rows
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
)
from testbed.harness.scenario import Problem
from testbed.plan.profiles import U32_MAX
from testbed.plan.scaling import DEFAULT_PFC_REACTION_TIME_S

MAX_RATE_MBIT = 100.0
MAX_SECONDS = 600
SAMPLE_S = 0.010  # the queue every 10 ms, as mininet-tests/dctcp sampled it
ROCE_TIMEOUT_S = 60.0
DCQCN, NONE = "dcqcn", "none"


class RoceDcqcnParams(Params):
    """Sender counts (each a setup), how long the flows run and the part left out while
    they converge, the port's buffer per class, the RoCE flows' shape, and whether the
    largest count also runs without congestion control."""

    senders: list[Annotated[int, Field(ge=2, le=4)]] = Field(
        [2, 4], min_length=1, description="DCQCN flows into the bottleneck, e.g. 2,4")
    seconds: int = Field(40, ge=5, le=MAX_SECONDS, description="seconds the flows run")
    settle_s: float = Field(15.0, ge=0, le=MAX_SECONDS, description="seconds left out "
                            "while the rates converge")
    buffer_bytes: int = Field(1_000_000, ge=1, le=U32_MAX, description="every port's buffer "
                              "per class (holds Kmax and PFC's headroom)")
    message_bytes: int = Field(1 << 20, ge=4096, le=64 << 20)
    roce_mtu_bytes: int = Field(1024, description="RoCE path MTU")
    no_cc_setup: bool = Field(True, description="also run the largest count without "
                              "congestion control")
    pfc_reaction_time_s: float = Field(DEFAULT_PFC_REACTION_TIME_S, ge=0, le=1,
                                       allow_inf_nan=False)
    capture: bool = Field(True, description="keep a sample of RoCE packets per setup")

    @field_validator("senders")
    @classmethod
    def _once_each(cls, value: list[int]) -> list[int]:
        if len(set(value)) != len(value):
            raise ValueError(f"lists a count twice: {value}")
        return value

    @field_validator("roce_mtu_bytes")
    @classmethod
    def _path_mtu(cls, value: int) -> int:
        if value not in (1024, 2048, 4096):
            raise ValueError(f"must be 1024, 2048 or 4096, got {value}")
        return value


def setup_name(senders: int, cc: str) -> str:
    return f"n{senders}-{cc}"


class RoceDcqcn(Experiment):
    name = "roce-dcqcn"
    title = "DCQCN fairness and queue"
    Params = RoceDcqcnParams
    reproduces = ("DCQCN (Zhu et al., SIGCOMM 2015): flows sharing a bottleneck converge to a "
                  "fair share with the queue between Kmin and Kmax; without it the queue fills")
    default_rate_mbit = 20.0
    default_mtu_bytes = 1500
    sections = frozenset()  # every setup has its own bench, queue and congestion control

    def problems(self) -> list[Problem]:
        p = self.params
        problems = []
        if self.rate_mbit > MAX_RATE_MBIT:
            problems.append(Problem(("link_rate_mbit",), f"roce-dcqcn runs at most "
                                    f"{MAX_RATE_MBIT:g} Mbit/s, got {self.rate_mbit:g}"))
        if p.settle_s >= p.seconds - 1:
            problems.append(Problem(("params", "settle_s"), f"must leave at least a second of "
                                    f"the {p.seconds} s to judge, got {p.settle_s:g}"))
        if roce_frame_bytes(p.roce_mtu_bytes) - 14 > self.mtu_bytes:
            problems.append(Problem(("params", "roce_mtu_bytes"), f"{p.roce_mtu_bytes}-byte "
                                    f"RoCE payloads do not fit the {self.mtu_bytes}-byte MTU"))
        return problems

    def setup_plan(self) -> list[tuple[int, str]]:
        p = self.params
        plan = [(n, DCQCN) for n in p.senders]
        if p.no_cc_setup:
            plan.append((max(p.senders), NONE))
        return plan

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

    def settings(self, cc: str) -> RoceSettings:
        p = self.params
        return RoceSettings(message_bytes=p.message_bytes, mtu_bytes=p.roce_mtu_bytes, cc=cc,
                            link_rate_mbit=self.rate_mbit, duration_s=float(p.seconds),
                            ack_timeout_s=ack_timeout_s(p.buffer_bytes, self.rate_mbit),
                            timeout_s=ROCE_TIMEOUT_S, seed=self.scenario.seed)

    def measure(self, run: SetupRun) -> dict:
        p = self.params
        n, cc = next((n, cc) for n, cc in self.setup_plan() if setup_name(n, cc) == run.setup.name)
        bench = roce_bench(run.net.fabric)
        settings = self.settings(cc)
        run.log(f"{run.setup.name}: {n} RoCE QPs (cc {cc}) into {bench.receiver} for "
                f"{p.seconds} s; real queue of {bench.bottleneck_intf} every "
                f"{SAMPLE_S * 1000:g} ms")
        measured = measure_bottleneck(run, bench, settings, LOSSLESS_QUEUE, SAMPLE_S, p.capture)
        result = bottleneck_result(measured, bench, settings, p.settle_s,
                                   roce_frame_bytes(p.roce_mtu_bytes), SAMPLE_S,
                                   bandwidth_bound=True, setup=run.setup.name)
        ecn = run.setup.queue.ecn
        result.update(kmin_bytes=ecn.kmin_bytes, kmax_bytes=ecn.kmax_bytes,
                      xoff_bytes=run.setup.queue.pfc.xoff_bytes, rate_mbit=self.rate_mbit)
        run.log(f"{run.setup.name}: median queue {result['queue']['median_bytes']} B, Jain "
                f"{result['jain'] if result['jain'] is None else round(result['jain'], 3)}, "
                f"{len(result['errors'])} errors")
        return result

    def checks(self, results):
        return dcqcn_checks(results)

    def trust(self, results):
        from testbed.measure.pauses import agent_alive_checks

        return agent_alive_checks(results)

    def rows(self, results):
        return dcqcn_rows(results)

    def plots(self, results, folder: Path, title: str) -> list[Path]:
        from testbed.harness.roce_plots import plot_setup_series

        return [path for name, r in results.items() if "queue" in r
                for path in plot_setup_series(name, r, {"Kmin": r["kmin_bytes"],
                                                        "Kmax": r["kmax_bytes"],
                                                        "XOFF": r["xoff_bytes"]},
                                              title, folder)]

