"""Queues sized per link rate on a live fabric: a spine-leaf whose uplinks run at four times
the host rate, with one queue section (DCTCP's K scaled to each rate, bound by the RTT so it
grows with the rate; PFC; the default buffer of 50 ms at each rate).

    l0h0 --20-- l0 ==80== s0 ==80== l1 --20-- l1h0      (Mbit/s; one host and spine each,
                                                          so every queue has one feeder and
                                                          PFC's headroom fits the default
                                                          buffer at either rate)

What the kernel holds at every switch port must be sized for that port's own link: its best-
effort class queue's byte limit (and K on the RED path), the eBPF marker's entry (its rate,
limit and K), and the pause agent's XOFF and XON. Nothing is measured: the test reads back
what the bring-up configured. Needs root; runs alone."""
from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

from testbed.apply.marking import read_ifindex
from testbed.apply.network import FabricNetwork
from testbed.apply.pfc_runtime import PLAN_FILE
from testbed.harness.plans import queue_plan
from testbed.harness.scenario import QueueSpec
from testbed.model.topology import build
from testbed.plan.ecn_plan import (
    ECN_PATH_EBPF,
    ECN_PATH_RED,
    marker_config,
)
from testbed.plan.port_queue import Handles
from testbed.plan.profiles import DEFAULT_PRIORITY
from testbed.system.counters import read_qdiscs
from testbed.system.process import run_tool

HOST_RATE_MBIT = 20.0
UPLINK_RATE_MBIT = 4 * HOST_RATE_MBIT
MTU = 1500
RTT_S = 0.010  # K > C * RTT / 7: 3.6 KB at the host rate, 14.3 KB at the uplinks'


def test_every_switch_port_holds_the_queue_of_its_own_rate(ledger, tmp_path: Path):
    fab = build("spineleaf", leaves=2, spines=1, hosts_per_leaf=1,
                host_rate_mbit=HOST_RATE_MBIT, uplink_rate_mbit=UPLINK_RATE_MBIT, mtu_bytes=MTU)
    queue, _ = queue_plan(QueueSpec(ecn={"scheme": "dctcp", "rtt_s": RTT_S}, pfc=True),
                          HOST_RATE_MBIT, MTU, fab)
    assert {q.rate_mbit for q in queue.by_rate} == {HOST_RATE_MBIT, UPLINK_RATE_MBIT}
    with FabricNetwork(fab, tmp_path, ledger, queue=queue) as net:
        path = net.ecn_path
        qdiscs = read_qdiscs()
        ifindex = {intf: read_ifindex(intf) for intf in net.root_interfaces()}
        marker = net.marking.read_map("ecn_config") if path == ECN_PATH_EBPF else None
        agent = json.loads((tmp_path / PLAN_FILE).read_text())["interfaces"]
        assert net.pfc.alive()
    checked = set()
    for _, _, intf, link in fab.switch_ends():
        own = queue.for_rate(link.rate_mbit)
        (best_effort,) = [q for q in qdiscs if q.get("dev") == intf
                          and q.get("handle") == Handles.leaf(DEFAULT_PRIORITY)]
        assert best_effort["options"]["limit"] == own.buffer_bytes, intf
        if path == ECN_PATH_RED:
            assert best_effort["kind"] == "red" and \
                best_effort["options"]["min"] == own.ecn.k_bytes, intf
        else:
            assert marker[ifindex[intf]] == asdict(marker_config(link.rate_mbit, own)), intf
        assert (agent[intf]["xoff_bytes"], agent[intf]["xon_bytes"]) == \
            (own.pfc.xoff_bytes, own.pfc.xon_bytes), intf
        assert agent[intf]["buffer_bytes"] == own.buffer_bytes, intf
        checked.add(link.rate_mbit)
    assert checked == {HOST_RATE_MBIT, UPLINK_RATE_MBIT}
    print(f"\n{path}: " + "; ".join(f"{q.rate_mbit:g} Mbit/s buffer {q.buffer_bytes} B, K "
                                     f"{q.ecn.k_bytes} B, XOFF {q.pfc.xoff_bytes} B"
                                     for q in queue.by_rate))
