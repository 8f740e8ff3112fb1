"""``roce-dctcp``: the DCTCP-style window on RoCE QPs holds the real queue near K at full
utilisation (Alizadeh et al., SIGCOMM 2010; RFC 8257), on kernels that have no tcp_dctcp.

For every N in ``senders``, N RoCE QPs (RDMA WRITE, testbed.traffic.roce) send into one
receiver through one switch port (testbed.harness.roce_setups draws the bench) whose byte
buffer marks CE above K (DCTCP's anchors scaled to the link rate, testbed.plan.scaling). The
receiver echoes the CE-marked bytes in its ACKs; each sender keeps RFC 8257's alpha
(g = 1/16) per window of data and cuts its window by alpha/2 once per window with marks
(testbed.traffic.roce.cc.dctcp). The window control's parameters do not depend on the link
rate; K does, and its scaling goes into the results.

Measured over the judged window (from ``settle_s`` after the flows start to their end): the
bottleneck's real queue (its buffer qdisc's backlog over rtnetlink every 10 ms) and, on the
eBPF marking path, the marker's model beside it with their divergence; the bottleneck's
utilisation; each flow's goodput; marks; each QP's window, alpha and marked fraction over
time; a sample of the RoCE packets; whether the emulator kept up.
"""
from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal

from pydantic import Field, field_validator

from testbed.experiments.roce_dctcp.checks import dctcp_checks, dctcp_rows
from testbed.harness.experiment import Experiment, Params, Setup, SetupRun
from testbed.harness.roce_flows import RoceSettings, bottleneck_result, measure_bottleneck
from testbed.harness.roce_setups import (
    ack_timeout_s,
    bench_fabric,
    roce_bench,
    roce_frame_bytes,
)
from testbed.harness.scenario import Problem
from testbed.plan.port_queue import Handles, default_buffer_bytes
from testbed.plan.profiles import QueueConfig
from testbed.plan.scaling import dctcp_step

MAX_RATE_MBIT = 100.0
MAX_SECONDS = 600
SAMPLE_S = 0.010
ROCE_TIMEOUT_S = 60.0


class RoceDctcpParams(Params):
    """Sender counts (each a setup), how long the flows run and the part left out at their
    start, and the RoCE flows' shape."""

    senders: list[Annotated[int, Field(ge=1, le=8)]] = Field(
        [2, 4], min_length=1, description="QPs into the bottleneck, e.g. 2,4")
    seconds: int = Field(20, ge=3, le=MAX_SECONDS, description="seconds the flows run")
    settle_s: float = Field(3.0, ge=0, le=MAX_SECONDS, description="seconds left out first")
    message_bytes: int = Field(1 << 20, ge=4096, le=64 << 20)
    roce_mtu_bytes: Literal[1024, 2048, 4096] = 1024
    capture: bool = Field(True, description="keep a sample of RoCE packets per setup")

    @field_validator("senders")
    @classmethod
    def _once_each(cls, value: list[int]) -> list[int]:
        if len(set(value)) != len(value):
            raise ValueError(f"lists a count twice: {value}")
        return value


def setup_name(senders: int) -> str:
    return f"n{senders}-dctcp"


class RoceDctcp(Experiment):
    name = "roce-dctcp"
    title = "DCTCP-style window on RoCE"
    Params = RoceDctcpParams
    reproduces = ("DCTCP (Alizadeh et al., SIGCOMM 2010; RFC 8257): marking at K and the "
                  "alpha-scaled window cut hold the queue near K at full utilisation")
    default_rate_mbit = 20.0
    default_mtu_bytes = 1500  # DCTCP counts K in packets of a standard Ethernet MTU
    sections = frozenset()

    def problems(self) -> list[Problem]:
        p = self.params
        problems = []
        if self.rate_mbit > MAX_RATE_MBIT:
            problems.append(Problem(("link_rate_mbit",), f"roce-dctcp runs at most "
                                    f"{MAX_RATE_MBIT:g} Mbit/s, got {self.rate_mbit:g}"))
        if p.settle_s >= p.seconds - 1:
            problems.append(Problem(("params", "settle_s"), f"must leave at least a second of "
                                    f"the {p.seconds} s to judge, got {p.settle_s:g}"))
        return problems

    def queue(self) -> tuple[QueueConfig, dict]:
        """The bottleneck's byte buffer (50 ms at the link rate) marking above K."""
        ecn, k_record = dctcp_step(self.rate_mbit, self.mtu_bytes)
        buffer_bytes = default_buffer_bytes(self.rate_mbit, self.mtu_bytes)
        return (QueueConfig(buffer_bytes, ecn=ecn),
                {"buffer_bytes": buffer_bytes, "buffer_rule": "50 ms at the link rate, at "
                 "least 8 frames", "ecn": [k_record]})

    def setups(self) -> list[Setup]:
        queue, record = self.queue()
        return [Setup(setup_name(n), bench_fabric(n, self.rate_mbit, self.mtu_bytes),
                      queue=queue, queue_record=record,
                      description=f"{n} RoCE QPs -> 1 receiver, DCTCP-style window, K "
                      f"{queue.ecn.k_bytes} B") for n in self.params.senders]

    def headline(self) -> str:
        p = self.params
        queue, _ = self.queue()
        return (f"{self.title}: {', '.join(map(str, p.senders))} QPs -> 1 receiver at "
                f"{self.rate_mbit:g} Mbit/s, K {queue.ecn.k_bytes} B, for {p.seconds} s")

    def measure(self, run: SetupRun) -> dict:
        p = self.params
        bench = roce_bench(run.net.fabric)
        queue = run.setup.queue
        settings = RoceSettings(message_bytes=p.message_bytes, mtu_bytes=p.roce_mtu_bytes,
                                cc="dctcp", duration_s=float(p.seconds),
                                ack_timeout_s=ack_timeout_s(queue.buffer_bytes, self.rate_mbit),
                                timeout_s=ROCE_TIMEOUT_S, seed=self.scenario.seed)
        run.log(f"{run.setup.name}: {len(bench.senders)} RoCE QPs (DCTCP-style) into "
                f"{bench.receiver} for {p.seconds} s; K = {queue.ecn.k_bytes} B")
        measured = measure_bottleneck(run, bench, settings, Handles.BUFFER, SAMPLE_S, p.capture)
        result = bottleneck_result(measured, bench, settings, p.settle_s,
                                   roce_frame_bytes(p.roce_mtu_bytes), SAMPLE_S,
                                   # short of the rate is what this run would show, not a fault
                                   bandwidth_bound=False, setup=run.setup.name)
        result.update(k_bytes=queue.ecn.k_bytes, buffer_bytes=queue.buffer_bytes,
                      rate_mbit=self.rate_mbit,
                      k_scaling=(run.setup.queue_record or {}).get("ecn", [None])[0])
        run.log(f"{run.setup.name}: median queue {result['queue']['median_bytes']} B against "
                f"K {queue.ecn.k_bytes}, utilisation {(result['utilisation'] or 0):.1%}")
        return result

    def checks(self, results):
        return dctcp_checks(results)

    def rows(self, results):
        return dctcp_rows(results)

    def plots(self, results, folder: Path, title: str) -> list[Path]:
        from testbed.harness.roce_plots import plot_setup_series

        return [path for name, r in results.items() if "queue" in r
                for path in plot_setup_series(name, r, {"K": r["k_bytes"],
                                                        "buffer": r["buffer_bytes"]},
                                              title, folder)]
