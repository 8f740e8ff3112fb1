"""ECN marking on a live fabric, on whichever path this machine takes (RED qdisc or the eBPF
marker): two TCP flows from l0h0 and l0h1 converge on l0h2 through one leaf port, l0-eth3,
shaped to 20 Mbit/s with a step at K = 30 KB (the Mininet-HiFi DCTCP set-up, scaled down).

    l0h0 --\\
            l0 --(l0-eth3, 20 Mbit/s, K = 30 KB)--> l0h2
    l0h1 --/

With ECN the port marks CE, the receiver counts CE-marked packets, and the queue stays near
K; the same flows without ECN (cubic, loss-based) fill the drop-tail buffer until it drops.
The queue is judged on the one the marking acts on, sampled every 10 ms: on the eBPF path
the marker's virtual FIFO, with the real buffer's backlog (testbed.measure.backlog.PortBacklog)
at the same instants (with ECN the two must agree, and the anchor agent,
testbed.apply.ecn_anchor, must have run beside the marker and anchored it; under drop-tail no
port marks, so none runs); on the RED path the RED qdisc is the buffer, so its own backlog,
read the same way. The hosts' flows run the congestion control chosen for them (``ss -ti`` in
a sender shows it: dctcp where the kernel has it). The fabric takes this machine's datapath.
Every tolerance is named below. Needs root; runs alone (one emulation per machine); part of
the stock-kernel suite (make vm-test)."""
from __future__ import annotations

import json
import os
import re
import time
from pathlib import Path

import pytest

from testbed.apply.marking import EcnMarking
from testbed.apply.network import FabricNetwork
from testbed.apply.state import process_start_ticks
from testbed.capabilities import detect, fabric_datapath
from testbed.measure.backlog import PortBacklog
from testbed.measure.queues import queue_sampling
from testbed.measure.stats import percentile
from testbed.model.topology import build
from testbed.plan.anchoring import ANCHOR_POLL_S
from testbed.plan.ecn_plan import ECN_PATH_EBPF, pinned_map_paths
from testbed.plan.port_queue import default_buffer_bytes, htb_burst_bytes
from testbed.plan.profiles import QueueConfig, StepEcn
from testbed.plan.settings import tcp_settings
from testbed.system.counters import counter_delta
from testbed.system.sockets import wait_listening

pytestmark = pytest.mark.stock_kernel

# In the stock-kernel guest under software emulation the RTT is several times the host's, so
# the senders' late reaction to a mark overshoots K by the rate times that RTT: at 20 Mbit/s
# the queue stood above K + 3 frames in 12% of the samples of one run, at 10 Mbit/s in 12%
# of another (RED's average, weight 1/4 per packet here, adds its own lag), with 4 drops in
# slow start from a 62.5 KB buffer. With ECN the guest runs at a quarter of the rate, which
# queues a quarter of the bytes, with the host's buffer. Without ECN it runs at 10 Mbit/s
# with that rate's buffer (62.5 KB): at 5 Mbit/s two cubic flows held 62.8 KB and never
# filled 125 KB in 12 s, and a 48 KB buffer left the queue under K + 3 frames in 78% of the
# samples.
IN_VM = os.environ.get("TESTBED_IN_VM") == "1"
RATE_MBIT = 5.0 if IN_VM else 20.0
DROPTAIL_RATE_MBIT = 10.0 if IN_VM else 20.0
MTU = 1500
K_BYTES = 30_000
BUFFER_BYTES = default_buffer_bytes(20.0, MTU)  # 50 ms at 20 Mbit/s: 125000 B
DROPTAIL_BUFFER_BYTES = default_buffer_bytes(DROPTAIL_RATE_MBIT, MTU)
SENDERS = ("l0h0", "l0h1")
RECEIVER = "l0h2"
BOTTLENECK = "l0-eth3"  # the leaf's port to the receiver
BASE_PORT = 5311
FLOW_S = 12
FLOW_TIMEOUT_S = FLOW_S + 20
SERVER_START_S = 0.5
LISTEN_TIMEOUT_S = 10.0
SS_AFTER_S = 3.0  # into the flows: connections are established and sending
SAMPLE_INTERVAL_S = 0.010  # queue depth every 10 ms, as mininet-tests/dctcp sampled
# Judged window: after slow start (whose overshoot past K comes before the first marks take
# effect, one RTT late) and before the flows wind down.
WARMUP_S = 3.0
END_MARGIN_S = 1.0
MIN_JUDGED_SAMPLES = 200  # of the ~800 the window holds at 10 ms: the sampler kept up
REAL = "real"  # the bottleneck's real backlog, sampled beside the model under this name
# The median real queue sits within an HTB bucket of the model's median (below it: a port
# with tokens sends at once, where the model queues; above it: a late wake-up leaves the port
# behind until its tokens catch it up), plus this: a few frames in flight between the
# marker and the qdisc when a sample is taken. Without the bucket's catch-up the real queue ran 45-57 KB
# above the model (docs/ecn.md).
MODEL_GAP_TOLERANCE_BYTES = 3 * MTU

# With ECN:
NEAR_K_TOLERANCE_BYTES = 3 * MTU  # senders react one RTT after a mark: a few frames above K
NEAR_K_FRACTION = 0.85  # of judged samples at or under K + tolerance ("most of the time"; a
                        # stock-kernel guest under software emulation, RED marking, held 0.889:
                        # its coarse timing delivers ACKs, and so the senders' bursts, in clumps)
REACHES_K_TOLERANCE_BYTES = 3 * MTU  # p99 of the queue gets this close to K: marking did
                                     # not start far below it
CE_DELIVERED_FRACTION = 0.90  # of the marks at the port, CE packets counted by the receiver
ECT_FRACTION = 0.95  # of the packets offered to the port, ECT ones (eBPF path counts them):
                     # all data; SYNs, retransmissions and the control connection's pure
                     # ACKs go out Not-ECT
GOODPUT_FRACTION = 0.85  # both flows together keep the bottleneck this busy
ECN_FIFO_DROPS_MAX = 0  # marking, not dropping, holds the queue
# Without ECN:
ABOVE_K_FRACTION_DROPTAIL = 0.25  # of judged samples above K + tolerance (ECN: <= 10%); cubic
# saws between a full buffer and half of it, so a third to a half of the samples sit above K
FULL_BUFFER_TOLERANCE_BYTES = MTU  # the marker's peak virtual queue is within a frame of
                                   # the buffer (eBPF path: a frame that does not fit drops)
# Anchoring (eBPF path, with ECN): the agent polled at about its interval, at the median
# (its p99 and maximum are recorded, not judged here: the verdict checks its thread)
ANCHOR_GAP_P50_MAX_MS = 2 * ANCHOR_POLL_S * 1000


def fabric(rate_mbit: float):
    return build("spineleaf", leaves=1, spines=1, hosts_per_leaf=3, host_rate_mbit=rate_mbit,
                 mtu_bytes=MTU)


def netstat_counter(text: str, group: str, name: str) -> int:
    """One counter of /proc/net/netstat (pairs of lines: ``Group: names``, ``Group: values``)."""
    lines = [line.split() for line in text.splitlines() if line.startswith(f"{group}:")]
    names, values = lines[0][1:], lines[1][1:]
    return int(values[names.index(name)])


def received_ce(net) -> int:
    """IP packets the receiver has taken in with CE set (its own namespace's IpExt counters)."""
    return netstat_counter(net.host(RECEIVER).cmd("cat", "/proc/net/netstat"), "IpExt",
                           "InCEPkts")


def run_flows(net, marking: EcnMarking) -> dict:
    """Both flows for FLOW_S with the bottleneck's queue sampled; counters over the flows."""
    receiver_ip = net.fabric.nodes[RECEIVER].ip
    server = net.host(RECEIVER)
    for i, _ in enumerate(SENDERS):
        server.cmd("iperf3", "-s", "-D", "-1", "-p", str(BASE_PORT + i))
    time.sleep(SERVER_START_S)
    wait_listening(net.pid(RECEIVER), [BASE_PORT + i for i in range(len(SENDERS))],
                   LISTEN_TIMEOUT_S, f"iperf3 server in {RECEIVER}")
    before, ce_before = marking.counters(), received_ce(net)

    def both() -> dict[str, int]:  # the queue marked by (the model, or RED's), and the real one
        real = backlog.read()
        marked = marking.queue_depths()[BOTTLENECK] if marking.path == ECN_PATH_EBPF else real
        return {BOTTLENECK: marked, REAL: real}

    with PortBacklog(BOTTLENECK) as backlog, \
            queue_sampling(both, [BOTTLENECK, REAL], SAMPLE_INTERVAL_S) as series:
        clients = [net.popen(sender, ["iperf3", "-c", receiver_ip, "-p", str(BASE_PORT + i),
                                      "-t", str(FLOW_S), "-J"])
                   for i, sender in enumerate(SENDERS)]
        time.sleep(SS_AFTER_S)
        sender_ss = net.host(SENDERS[0]).cmd("ss", "-tin", "dst", receiver_ip)
        receiver_ss = server.cmd("ss", "-tin", "src", receiver_ip)
        outputs = [proc.communicate(timeout=FLOW_TIMEOUT_S)[0] for proc in clients]
    counters = counter_delta(before, marking.counters())[BOTTLENECK]
    judged, real_judged = ([d for t, d in zip(series.t_s, series.depth_bytes[name])
                            if WARMUP_S <= t <= FLOW_S - END_MARGIN_S]
                           for name in (BOTTLENECK, REAL))
    mbit = sum(json.loads(out)["end"]["sum_received"]["bits_per_second"] / 1e6
               for out in outputs)
    return {"counters": counters, "ce_received": received_ce(net) - ce_before,
            "judged": judged, "sampler_error": series.error, "mbit": mbit,
            "real_judged": real_judged,
            "sender_ss": sender_ss, "receiver_ss": receiver_ss}


def pins_left() -> list[Path]:
    return [Path(p) for p in pinned_map_paths() if Path(p).exists()]


def measure(ledger, workdir: Path, queue: QueueConfig, tcp,
            rate_mbit: float = RATE_MBIT) -> tuple[dict, dict]:
    """Bring the fabric up with ``queue`` on its switch ports and ``tcp`` on its hosts, run
    the flows, tear it down; returns the bottleneck's counters and a context for messages.
    Checks what every run must: the pins are gone and the samplers kept up."""
    platform = detect()
    with FabricNetwork(fabric(rate_mbit), workdir, ledger,
                       datapath=fabric_datapath(platform.paths), log=lambda m: None,
                       queue=queue, host_sysctls=tcp.sysctls()) as net:
        result = run_flows(net, net.marking)
        result["path"] = net.marking.path
        result["anchoring"] = net.marking.anchoring()
        result["anchor_pids"] = {pid: process_start_ticks(pid)
                                 for pid in net.marking.anchor_pids}
    assert result["path"] == platform.paths.ecn_marking, result["path"]
    model_p50, real_p50 = percentile(result["judged"], 50), percentile(result["real_judged"], 50)
    context = {"tcp": tcp.congestion_control, "model_p50_bytes": model_p50,
               "real_p50_bytes": real_p50, **{k: v for k, v in result.items()
                                              if k not in ("judged", "real_judged")}}
    assert pins_left() == [], context
    # the anchor agent went with the fabric
    assert all(process_start_ticks(pid) != ticks
               for pid, ticks in result["anchor_pids"].items()), context
    assert result["sampler_error"] is None, context
    assert len(result["judged"]) >= MIN_JUDGED_SAMPLES, context
    return result, context


def test_ecn_marks_near_k_and_the_receiver_sees_ce(ledger, tmp_path):
    tcp = tcp_settings(True, "auto", detect())  # dctcp where the kernel has it, else cubic
    result, context = measure(ledger, tmp_path, QueueConfig(BUFFER_BYTES, StepEcn(K_BYTES)), tcp)
    c, judged = result["counters"], result["judged"]
    # CE marks made, delivered to the receiver (IpExtInCEPkts) and echoed back to the senders
    # (ss's delivered_ce: data the peer acknowledged with ECE), so ECN was negotiated
    echoed = sum(int(n) for n in re.findall(r"delivered_ce:(\d+)", result["sender_ss"]))
    assert echoed > 0, context
    # the sender's connections run the congestion control chosen for the hosts
    assert re.search(rf"\b{tcp.congestion_control}\b", result["sender_ss"]), context
    assert c["marks"] > 0, context
    assert CE_DELIVERED_FRACTION * c["marks"] <= result["ce_received"] <= c["marks"], context
    if result["path"] == ECN_PATH_EBPF:
        assert c["ect_packets"] >= ECT_FRACTION * c["offered_packets"], context
        # the queue the senders met is the one the marker modelled and marked by (under
        # drop-tail the model only counts, and drifts: docs/ecn.md)
        gap_bytes = htb_burst_bytes(RATE_MBIT, MTU) + MODEL_GAP_TOLERANCE_BYTES
        assert abs(context["real_p50_bytes"] - context["model_p50_bytes"]) <= gap_bytes, context
        # anchored all along: the agent ran, and the marker applied its readings
        anchoring = result["anchoring"]
        assert anchoring["running"] and anchoring["error"] is None, context
        assert anchoring["polls"] > 0 and c["anchors"] > 0, context
        assert anchoring["poll_gap_ms"]["p50"] <= ANCHOR_GAP_P50_MAX_MS, context
    # the queue stays near K, and gets there: marking starts at K, not below it
    near_k = sum(d <= K_BYTES + NEAR_K_TOLERANCE_BYTES for d in judged) / len(judged)
    assert near_k >= NEAR_K_FRACTION, (near_k, context)
    assert percentile(judged, 99) >= K_BYTES - REACHES_K_TOLERANCE_BYTES, context
    # by marking instead of dropping, at full speed
    assert c["fifo_drops"] <= ECN_FIFO_DROPS_MAX, context
    assert result["mbit"] >= GOODPUT_FRACTION * RATE_MBIT, context


def test_drop_tail_without_ecn_fills_the_buffer(ledger, tmp_path):
    tcp = tcp_settings(False, "cubic", detect())  # loss-based, no ECN
    result, context = measure(ledger, tmp_path, QueueConfig(DROPTAIL_BUFFER_BYTES), tcp,
                              DROPTAIL_RATE_MBIT)
    c, judged = result["counters"], result["judged"]
    assert c["marks"] == 0 and result["ce_received"] == 0, context
    assert c["fifo_drops"] > 0, context  # a bfifo drops only when full
    above = sum(d > K_BYTES + NEAR_K_TOLERANCE_BYTES for d in judged) / len(judged)
    assert above >= ABOVE_K_FRACTION_DROPTAIL, (above, context)
    if result["path"] == ECN_PATH_EBPF:
        assert c["ect_packets"] == 0, context
        assert c["max_queue_bytes"] >= DROPTAIL_BUFFER_BYTES - FULL_BUFFER_TOLERANCE_BYTES, \
            context
        # nothing marks, so nothing is anchored: the model only counts, and drifts
        assert result["anchoring"] is None and c["anchors"] == 0, context
