"""``roce-dctcp``: the DCTCP-style window on RoCE QPs holds the real queue near K at full
utilisation (Alizadeh et al., SIGCOMM 2010; RFC 8257), on kernels that have no tcp_dctcp.

For every N in ``senders``, N RoCE QPs (RDMA WRITE, testbed.traffic.roce) send into one
receiver through one switch port (testbed.experiments.roce_common.roce_setups draws the bench) whose byte
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

from pydantic import Field

from testbed.experiments.roce_common.roce_experiment import (
    BottleneckExperiment,
    BottleneckParams,
    SenderCounts,
)
from testbed.experiments.roce_dctcp.checks import dctcp_checks, dctcp_rows
from testbed.harness.experiment import Setup
from testbed.model.bench import bench_fabric
from testbed.plan.port_queue import default_buffer_bytes
from testbed.plan.profiles import QueueConfig
from testbed.plan.scaling import dctcp_step


class RoceDctcpParams(BottleneckParams):
    """Sender counts (each a setup), how long the flows run and the part left out at their
    start."""

    senders: SenderCounts = Field([2, 4], min_length=1,
                                  description="QPs into the bottleneck, e.g. 2,4")


def setup_name(senders: int) -> str:
    return f"n{senders}-dctcp"


class RoceDctcp(BottleneckExperiment):
    name = "roce-dctcp"
    title = "DCTCP-style window on RoCE"
    Params = RoceDctcpParams

    def cc_of(self, setup: Setup) -> str:
        return "dctcp"

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

    def checks(self, results):
        return dctcp_checks(results)

    def rows(self, results):
        return dctcp_rows(results)
