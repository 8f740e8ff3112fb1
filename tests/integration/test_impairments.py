"""Impairments on a live fabric, where the kernel has netem: one leaf, two hosts, the link to
l0h1 impaired in both directions (netem at the root of each end, the port's HTB and buffer
under it, testbed.plan.port_queue).

    l0h0 --- l0 ==(delay, loss; both ends)== l0h1

- delay: a ping from l0h0 to l0h1 crosses the impaired link once each way, so its round
  trip is at least twice the delay, and not much more on an idle fabric;
- loss: echo requests are lost on l0's end, replies on l0h1's, so a fraction
  (1 - p)^2 of the pings come back; the switches' counters put the lost packets under
  ``impairment_drops``, not under the queues' drops, and packet conservation at the
  switches holds once they are taken out.

Where the kernel lacks netem (the development VMs) such a scenario is refused before
anything is built; that branch checks the refusal instead. The fabrics take this machine's
datapath. Needs root; runs alone; part of the stock-kernel suite (make vm-test), where netem
is the path."""
from __future__ import annotations

import re

import pytest

from testbed.apply.network import FabricNetwork
from testbed.capabilities import detect, fabric_datapath
from testbed.errors import ConfigError
from testbed.experiments.registry import load
from testbed.model.topology import build
from testbed.plan.port_queue import Impairment, link_impairments

pytestmark = pytest.mark.stock_kernel

RATE_MBIT = 20.0
MTU = 1500
IMPAIRED = ["l0h1", "l0"]
DELAY_MS = 20.0
PINGS_DELAY = 20
RTT_EXTRA_MS = 10.0  # above 2 * DELAY_MS on an idle fabric: forwarding and scheduling
LOSS_PERCENT = 20.0
PINGS_LOSS = 400
PING_INTERVAL_S = 0.02
DELIVERY_TOLERANCE = 0.08  # binomial: 400 pings at p = 0.64 have a standard deviation of 0.024
CONSERVATION_TOLERANCE_PACKETS = 2  # packets in flight when the counters are read


def fabric():
    return build("spineleaf", leaves=1, spines=1, hosts_per_leaf=2, host_rate_mbit=RATE_MBIT,
                 mtu_bytes=MTU)


def ping(net, count: int, interval_s: float) -> str:
    return net.host("l0h0").cmd("ping", "-c", str(count), "-i", str(interval_s), "-W", "2",
                                net.fabric.nodes["l0h1"].ip)


def received(out: str) -> int:
    return int(re.search(r"(\d+) received", out).group(1))


def min_rtt_ms(out: str) -> float:
    return float(re.search(r"= ([\d.]+)/", out).group(1))


def test_netem_delays_and_drops_under_the_ports_queue(ledger, tmp_path):
    platform = detect()
    netem, datapath = platform.capabilities["sch_netem"], fabric_datapath(platform.paths)
    if not netem.available:
        scenario = tmp_path / "impaired.yaml"
        scenario.write_text("name: impaired\ntopology: {name: spineleaf, leaves: 1, spines: 1, "
                            f"hosts_per_leaf: 2}}\nimpairments: [{{link: {IMPAIRED}, "
                            f"delay_ms: {DELAY_MS}}}]\n")
        try:
            load(scenario)
        except ConfigError as err:
            assert "netem" in str(err) and netem.detail in str(err), err
            return
        raise AssertionError("a kernel without netem took a scenario with impairments")

    delayed = link_impairments(fabric(), [(IMPAIRED, Impairment(delay_ms=DELAY_MS))])
    with FabricNetwork(fabric(), tmp_path / "delay", ledger, datapath=datapath,
                       log=lambda m: None, impairments=delayed) as net:
        out = ping(net, PINGS_DELAY, PING_INTERVAL_S * 5)
    assert received(out) == PINGS_DELAY, out
    assert 2 * DELAY_MS <= min_rtt_ms(out) <= 2 * DELAY_MS + RTT_EXTRA_MS, out

    lossy = link_impairments(fabric(), [(IMPAIRED, Impairment(loss_percent=LOSS_PERCENT))])
    with FabricNetwork(fabric(), tmp_path / "loss", ledger, datapath=datapath,
                       log=lambda m: None, impairments=lossy) as net:
        before = net.switch_counters()
        out = ping(net, PINGS_LOSS, PING_INTERVAL_S)
        after = net.switch_counters()
    change = {key: after[key] - before[key] for key in after}
    expected = (1 - LOSS_PERCENT / 100) ** 2
    assert abs(received(out) / PINGS_LOSS - expected) <= DELIVERY_TOLERANCE, out
    assert change["queue_drops"] == 0, change
    assert change["impairment_drops"] > 0, change
    lost = (change["rx_packets"] - change["tx_packets"] - change["queue_drops"]
            - change["impairment_drops"])
    assert abs(lost) <= CONSERVATION_TOLERANCE_PACKETS, change
