"""The queues the RoCE experiments run on the one-switch bench (testbed.model.bench), as plain
data (pure). The bench puts every sender's flow through one switch port, the only queue that
builds. Its queue for DCQCN is what RoCE deployments run (Zhu et al., SIGCOMM 2015; Guo et
al., SIGCOMM 2016): traffic classes by DSCP (RoCE data 26 lossless, CNPs 48 ahead of it),
PFC on the lossless class, and RED-ECN marking between Kmin and Kmax with Pmax.

DCQCN's thresholds keep their bytes: the reaction point's timers are scaled by 40 Gbit/s /
link and its rates by link / 40 Gbit/s (testbed.traffic.roce.cc.dcqcn.params_for_link), so a
quantity of bytes (a rate times a time) means the same at both ends, which is why its byte
counter stays 10 MB. Kmin = 5 KB and Kmax = 200 KB then last the same multiple of the CNP
interval and of the rate timer as on the paper's 40 Gbit/s links (Kmax drains in 40 us there,
in 80 ms at 20 Mbit/s, against a CNP interval of 50 us there and 100 ms here). Scaling them
with the rate instead (testbed.plan.scaling.dcqcn_red, which keeps their queueing delay)
would put Kmax three orders of magnitude below one CNP interval of link time, under the
two-frame floor. The port's buffer must then hold Kmax and PFC's headroom above XOFF.
"""
from __future__ import annotations

import math

from testbed.errors import ConfigError
from testbed.harness.scenario import Problem
from testbed.model.topology.base import Fabric
from testbed.plan.pfc import switch_fan_in
from testbed.plan.port_queue import Handles
from testbed.plan.profiles import DEFAULT_CLASSES, QueueConfig, RedEcn
from testbed.plan.scaling import (
    DCQCN_ANCHOR_RATE_MBIT,
    DCQCN_KMAX_BYTES,
    DCQCN_KMIN_BYTES,
    DCQCN_PMAX,
    pfc_thresholds,
)

LOSSLESS_PRIORITY = next(tc.priority for tc in DEFAULT_CLASSES if tc.lossless)
LOSSLESS_QUEUE = Handles.leaf(LOSSLESS_PRIORITY)  # the lossless class's qdisc (its backlog)
ROCE_HEADERS_BYTES = 60    # BTH, RETH, ICRC, IPv4 and UDP around a full payload
ETHERNET_HEADER_BYTES = 14
# The local ACK timeout: perftest's default (67 ms), or long enough for a full buffer to
# drain several times over, so a queued (or paused) window never times out spuriously.
MIN_ACK_TIMEOUT_S = 0.067
ACK_TIMEOUT_DRAINS = 4
KMAX_RULE = ("bytes unchanged: the reaction point scales times by 40G/link and rates by "
             "link/40G (testbed.traffic.roce.cc.dcqcn), so bytes keep their meaning, as its "
             "10 MB byte counter does")


def roce_frame_bytes(roce_mtu_bytes: int) -> int:
    """A full RoCE data packet on the wire (Ethernet header on)."""
    return roce_mtu_bytes + ROCE_HEADERS_BYTES + ETHERNET_HEADER_BYTES


def incast_outstanding(buffer_bytes: int, senders: int, frame_bytes: int) -> int:
    """Packets each QP of an incast may have in flight so that together they hold one and a
    half port buffers: a NIC sends at line rate with far more outstanding than any switch
    buffers, so the queue reaches XOFF (and pauses) rather than the QPs' window first, while
    each QP's share (at most three quarters of a buffer from two senders up) still fits in
    its own NIC's lossless queue when paused."""
    return max(1, math.ceil(1.5 * buffer_bytes / (senders * frame_bytes)))


def ack_timeout_s(buffer_bytes: int, rate_mbit: float) -> float:
    """A local ACK timeout that outlasts ``ACK_TIMEOUT_DRAINS`` drains of a full buffer."""
    return max(MIN_ACK_TIMEOUT_S, ACK_TIMEOUT_DRAINS * buffer_bytes * 8 / (rate_mbit * 1e6))


def dcqcn_red_bytes(rate_mbit: float) -> tuple[RedEcn, list[dict]]:
    """DCQCN's RED-ECN profile for the RoCE experiments (module docstring: bytes unchanged),
    with a record per parameter."""
    ecn = RedEcn(DCQCN_KMIN_BYTES, DCQCN_KMAX_BYTES, DCQCN_PMAX)
    anchor = (f"DCQCN Kmin = 5 KB, Kmax = 200 KB, Pmax = 1% at "
              f"{DCQCN_ANCHOR_RATE_MBIT / 1000:g} Gbit/s")
    records = [{"parameter": name, "anchor": anchor, "anchor_rate_mbit": DCQCN_ANCHOR_RATE_MBIT,
                "anchor_value": value, "emulated_rate_mbit": rate_mbit, "value": value,
                "rule": KMAX_RULE if name != "pmax" else "unchanged (a probability)",
                "link_time_s": None if name == "pmax" else value * 8 / (rate_mbit * 1e6)}
               for name, value in (("kmin_bytes", ecn.kmin_bytes), ("kmax_bytes", ecn.kmax_bytes),
                                   ("pmax", ecn.pmax))]
    return ecn, records


def lossless_queue(fabric: Fabric, rate_mbit: float, mtu_bytes: int, buffer_bytes: int,
                   ecn: RedEcn | None, reaction_time_s: float) -> tuple[QueueConfig, dict]:
    """Every port's queue: traffic classes with PFC on the lossless one (headroom for every
    port of the switch that feeds it, testbed.plan.scaling.pfc_thresholds) and ``ecn``
    marking; and the record of how it was chosen. Errors name ``params.buffer_bytes``."""
    record: dict = {"buffer_bytes": buffer_bytes, "per_class": True}
    try:
        pfc, record["pfc"] = pfc_thresholds(rate_mbit, mtu_bytes, buffer_bytes,
                                            reaction_time_s=reaction_time_s,
                                            fan_in=switch_fan_in(fabric))
        queue = QueueConfig(buffer_bytes, ecn=ecn, pfc=pfc)
    except ConfigError as err:
        raise ConfigError("params.buffer_bytes", f"{buffer_bytes} B per class cannot hold "
                          f"the lossless queue: {err.field}: {err.problem}") from None
    return queue, record


RXE_TOOLS = ("rdma", "ib_write_bw")  # iproute2's rdma makes the device, perftest drives it


def transport_problems(transport: str, platform, which=None) -> list:
    """Why ``transport`` cannot run here: rxe needs the kernel's rdma_rxe and the tools that
    make and drive its devices (``which``: shutil.which unless given)."""
    import shutil

    if transport != "rxe":
        return []
    which = which or shutil.which
    rxe = platform.capabilities.get("rdma_rxe")
    problems = []
    if rxe is None or not rxe.available:
        problems.append(Problem(("params", "transport"), "rxe needs the kernel's rdma_rxe ("
                                + (rxe.detail if rxe is not None else "not probed")
                                + "); transport: engine runs everywhere"))
    missing = [tool for tool in RXE_TOOLS if which(tool) is None]
    if missing:
        problems.append(Problem(("params", "transport"), f"rxe needs {', '.join(missing)} "
                                "(Debian: iproute2, perftest)"))
    return problems
