"""PFC on a live fabric: 15:1 incast on the k=4 fat-tree at 20 Mbit/s, every sender running
one TCP flow in the lossless class (DSCP 26, priority 3) and one in best effort (DSCP 0),
all into one receiver. The pause agent sends real 802.1Qbb frames; the lossless queues
must not drop while the best-effort queues on the same links do, and a capture on a
sender's NIC must hold pause frames that scapy and tshark decode.

Thresholds come from ``testbed.plan.scaling.pfc_thresholds`` (headroom per feeding port at
the default reaction time) with a 600 KB buffer per class. Needs root; runs alone."""
from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

from scapy.contrib.mac_control import MACControlClassBasedFlowControl
from scapy.utils import rdpcap

from testbed.apply.network import FabricNetwork
from testbed.drive.flows import wait_servers
from testbed.model.topology import build
from testbed.plan.pfc import switch_fan_in
from testbed.plan.pfc_frames import PFC_ETHERTYPE
from testbed.plan.port_queue import Handles
from testbed.plan.profiles import QueueConfig
from testbed.plan.scaling import pfc_thresholds
from testbed.system.counters import read_host_qdiscs, read_qdiscs

RATE_MBIT = 20.0
MTU = 1500
BUFFER_BYTES = 600_000
LOSSLESS_TOS = 26 << 2
BEST_EFFORT_TOS = 0
LOSSLESS_PRIORITY = 3
FLOW_S = 8
BASE_PORT = 5400
SERVER_START_S = 0.5
CLIENT_GRACE_S = 30
CAPTURE_START_S = 1.0
# Tolerances
LOSSLESS_DROPS_MAX = 0  # the point of PFC
BEST_EFFORT_DROPS_MIN = 1  # 15 loss-based flows into one best-effort queue must overflow it
PAUSE_FRAMES_CAPTURED_MIN = 1  # the receiver's edge pauses the senders beside it
LOSSLESS_GOODPUT_FRACTION_MIN = 0.10  # the lossless flows still get through (of the link)


def fabric():
    return build("fattree", k=4, host_rate_mbit=RATE_MBIT, mtu_bytes=MTU)


def pfc_queue(fab) -> QueueConfig:
    pfc, _ = pfc_thresholds(RATE_MBIT, MTU, BUFFER_BYTES, fan_in=switch_fan_in(fab))
    return QueueConfig(buffer_bytes=BUFFER_BYTES, pfc=pfc)


def leaf_drops(qdiscs: list[dict], priority: int) -> int:
    handle = Handles.leaf(priority)
    return sum(q.get("drops", 0) for q in qdiscs if q.get("handle") == handle)


def fabric_drops(net, priority: int) -> int:
    total = leaf_drops(read_qdiscs(), priority)
    for name in net.hosts:
        total += leaf_drops(read_host_qdiscs(net.host(name)), priority)
    return total


def loss_based_cc() -> str:
    """cubic where the kernel has it, else reno (always built in): congestion controls that
    grow until the queue drops. The machine's default may be BBR, which paces below the
    bottleneck and may never overflow the best-effort buffer."""
    available = Path("/proc/sys/net/ipv4/tcp_available_congestion_control").read_text().split()
    return "cubic" if "cubic" in available else "reno"


def incast(net, receiver: str, senders: list[str]) -> dict[int, float]:
    """Two iperf3 flows per sender (lossless and best effort) into ``receiver``, both with a
    loss-based congestion control; returns Mbit/s received per TOS."""
    rip = net.fabric.nodes[receiver].ip
    jobs = [(s, tos, BASE_PORT + 2 * i + j) for i, s in enumerate(senders)
            for j, tos in enumerate((LOSSLESS_TOS, BEST_EFFORT_TOS))]
    servers = [net.popen(receiver, ["iperf3", "-s", "-1", "-p", str(port)],
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
               for _, _, port in jobs]
    time.sleep(SERVER_START_S)
    wait_servers(net, [(receiver, port) for _, _, port in jobs], servers)
    cc = loss_based_cc()
    clients = [net.popen(s, ["iperf3", "-c", rip, "-p", str(port), "-t", str(FLOW_S),
                             "-S", str(tos), "-C", cc, "-J"],
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
               for s, tos, port in jobs]
    received = {LOSSLESS_TOS: 0.0, BEST_EFFORT_TOS: 0.0}
    try:
        for (_, tos, _), client in zip(jobs, clients):
            out, _ = client.communicate(timeout=FLOW_S + CLIENT_GRACE_S)
            end = json.loads(out).get("end", {}).get("sum_received")
            received[tos] += end["bits_per_second"] / 1e6 if end else 0.0
    finally:
        for proc in clients + servers:
            if proc.poll() is None:
                proc.kill()
            proc.wait()
    return received


def test_lossless_class_survives_15_to_1_incast_while_best_effort_drops(ledger, tmp_path: Path):
    fab = fabric()
    hosts = [h.name for h in fab.hosts]
    receiver, senders = hosts[0], hosts[1:]
    neighbour = senders[0]  # on the receiver's edge switch: paused by it directly
    neighbour_intf = fab.host_link(neighbour)[0].intf(fab.host_link(neighbour)[1])
    pcap = tmp_path / "pfc.pcap"
    with FabricNetwork(fab, tmp_path, ledger, queue=pfc_queue(fab)) as net:
        capture = net.popen(neighbour, ["tcpdump", "-i", neighbour_intf, "-w", str(pcap), "-U",
                                        "ether", "proto", f"{PFC_ETHERTYPE:#06x}"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(CAPTURE_START_S)
        received = incast(net, receiver, senders)
        capture.terminate()
        capture.wait(timeout=10)
        summary = net.pfc_summary()
        lossless_drops = fabric_drops(net, LOSSLESS_PRIORITY)
        best_effort_drops = fabric_drops(net, 0)
        assert summary["agent_running"], "the pause agent died during the run"
    print(f"\nlossless {received[LOSSLESS_TOS]:.1f} Mbit/s, best effort "
          f"{received[BEST_EFFORT_TOS]:.1f} Mbit/s; drops lossless {lossless_drops}, best effort "
          f"{best_effort_drops}; pause frames sent {summary['pause_frames_sent']}, paused "
          f"{summary['paused_time_s']:.2f} s, max lossless backlog "
          f"{summary['max_lossless_backlog_bytes']} B, apply {summary['pause_apply_ms']}")
    assert lossless_drops <= LOSSLESS_DROPS_MAX
    assert summary["lossless_drops"] == lossless_drops
    assert best_effort_drops >= BEST_EFFORT_DROPS_MIN
    assert summary["pause_frames_sent"] > 0 and summary["pause_frames_received"] > 0
    assert summary["max_lossless_backlog_bytes"] <= BUFFER_BYTES
    assert received[LOSSLESS_TOS] >= LOSSLESS_GOODPUT_FRACTION_MIN * RATE_MBIT

    frames = [p for p in rdpcap(str(pcap)) if MACControlClassBasedFlowControl in p]
    assert len(frames) >= PAUSE_FRAMES_CAPTURED_MIN
    pfc = frames[0][MACControlClassBasedFlowControl]
    assert getattr(pfc, f"c{LOSSLESS_PRIORITY}_enabled") == 1
    assert frames[0].dst == "01:80:c2:00:00:01"
    decoded = subprocess.run(["tshark", "-r", str(pcap), "-c", "1", "-V"], capture_output=True,
                             text=True, timeout=60)
    assert decoded.returncode == 0, decoded.stderr
    assert "MAC Control" in decoded.stdout and "Class Enable Vector" in decoded.stdout
