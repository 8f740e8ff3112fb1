"""Queues on fabrics whose links have rates of their own (spine-leaf uplinks, NVSwitch nodes'
NVLinks): every shaped port's queue, planned from the scenario's one queue section, must be
sized for the rate its own HTB sends at, in the switch ports' plans, the hosts' NIC queues and
the pause agent's plan."""
from __future__ import annotations

import pytest

from testbed.apply.network import host_script
from testbed.harness.plans import queue_plan
from testbed.harness.scenario import QueueSpec
from testbed.model.topology import build
from testbed.model.topology.spineleaf import spine_leaf
from testbed.plan.ecn_plan import ECN_PATH_EBPF, ECN_PATH_RED
from testbed.plan.pfc import agent_plan, switch_fan_in
from testbed.plan.port_queue import default_buffer_bytes, port_plan, switch_queue_plan
from testbed.plan.profiles import QueueConfig
from testbed.plan.scaling import dctcp_step, pfc_thresholds

MTU = 1500
HOST_RATE_MBIT = 20.0
UPLINK_RATE_MBIT = 4 * HOST_RATE_MBIT
# Holds PFC's headroom at the uplink rate for every port that can feed a queue.
PFC_BUFFER_BYTES = 2_000_000
POLL_S = 0.004
RTT_S = 0.010  # DCTCP's K > C * RTT / 7 then grows with the rate above the frame floor

DEFECT = ("queue_plan sizes one queue from the scenario's rate and every shaped port gets it, "
          "while each port's HTB sends at its own link's rate")


def fast_uplinks():
    """A spine-leaf whose uplinks run at four times the host rate."""
    return spine_leaf(leaves=2, spines=2, hosts_per_leaf=2, host_rate_mbit=HOST_RATE_MBIT,
                      uplink_rate_mbit=UPLINK_RATE_MBIT, mtu_bytes=MTU)


def uplink_ends(fabric) -> list[str]:
    """The switch interfaces of the uplinks (both ends)."""
    ends = [intf for _, _, intf, link in fabric.switch_ends()
            if link.rate_mbit == UPLINK_RATE_MBIT]
    assert ends, "the fabric has uplinks at their own rate"
    return ends


def fake_ifindex(intf: str) -> int:
    return 100 + sum(map(ord, intf))


def port_lines(plan, intf: str) -> list[str]:
    return [line for line in plan.tc if f" dev {intf} " in line]


@pytest.mark.xfail(strict=True, reason=DEFECT)
@pytest.mark.parametrize("path", [ECN_PATH_RED, ECN_PATH_EBPF])
def test_an_uplink_port_gets_the_buffer_and_k_of_its_own_rate(path):
    fabric = fast_uplinks()
    queue, _ = queue_plan(QueueSpec(ecn={"scheme": "dctcp", "rtt_s": RTT_S}), HOST_RATE_MBIT, MTU, fabric)
    plan = switch_queue_plan(fabric, queue, path, ifindex=fake_ifindex)
    sized = QueueConfig(buffer_bytes=default_buffer_bytes(UPLINK_RATE_MBIT, MTU),
                        ecn=dctcp_step(UPLINK_RATE_MBIT, MTU, RTT_S)[0])
    for intf in uplink_ends(fabric):
        own = port_plan(intf, UPLINK_RATE_MBIT, MTU, sized, path, ifindex=fake_ifindex(intf))
        assert port_lines(plan, intf) == own.tc
        for command in own.bpftool:
            assert command in plan.bpftool


@pytest.mark.xfail(strict=True, reason=DEFECT)
def test_the_pause_agent_watches_an_uplink_port_against_the_thresholds_of_its_rate():
    fabric = fast_uplinks()
    queue, _ = queue_plan(QueueSpec(buffer_bytes=PFC_BUFFER_BYTES, pfc=True), HOST_RATE_MBIT,
                          MTU, fabric)
    plan = agent_plan(fabric, queue, POLL_S)
    pfc, _ = pfc_thresholds(UPLINK_RATE_MBIT, MTU, PFC_BUFFER_BYTES,
                            fan_in=switch_fan_in(fabric))
    for intf in uplink_ends(fabric):
        entry = plan.interfaces[intf]
        assert (entry["xoff_bytes"], entry["xon_bytes"]) == (pfc.xoff_bytes, pfc.xon_bytes)


@pytest.mark.xfail(strict=True, reason=DEFECT)
def test_a_gpu_nic_queues_with_the_buffer_of_its_nvlink():
    fabric = build("nvswitch", base="spineleaf", leaves=1, spines=1, hosts_per_leaf=1,
                   gpus_per_node=2, host_rate_mbit=HOST_RATE_MBIT, mtu_bytes=MTU)
    queue, _ = queue_plan(QueueSpec(classes=True), HOST_RATE_MBIT, MTU, fabric)
    gpu = fabric.hosts[0].name
    link, end = fabric.host_link(gpu)
    assert link.rate_mbit != HOST_RATE_MBIT
    buffer_bytes = default_buffer_bytes(link.rate_mbit, MTU)
    script = host_script(fabric, gpu, queue=queue)
    assert f"dev {link.intf(end)} parent 5:10 handle 20: bfifo limit {buffer_bytes}" in script
