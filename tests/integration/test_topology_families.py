"""Every topology family comes up on real OVS switches with the controller's routes, and
every host reaches every other (the balanced h=2 dragonfly included: 72 hosts, 36 routers)."""
from __future__ import annotations

import re

import pytest

from testbed.apply.network import FabricNetwork
from testbed.controllers.routing.ecmp import compute_rules
from testbed.drive.flows import start_iperf_server
from testbed.model.topology import build

RATE_MBIT = 6.0
FAMILIES = {
    "spineleaf": {"leaves": 4, "spines": 2, "hosts_per_leaf": 4},
    "clos-3": {"stages": 3, "leaves_per_pod": 4, "spines_per_pod": 2, "hosts_per_leaf": 2},
    "clos-5": {"stages": 5, "pods": 2, "leaves_per_pod": 2, "spines_per_pod": 2,
               "superspines_per_plane": 2, "hosts_per_leaf": 2},
    "dragonfly": {"p": 2, "a": 4, "h": 2},
    "nvswitch": {"base": "spineleaf", "leaves": 2, "spines": 2, "hosts_per_leaf": 2,
                 "gpus_per_node": 4},
    "rail": {"nodes": 3, "gpus_per_node": 4, "spines": 2},
}
RAIL_PINGS = 20
STRAY_PACKETS_MAX = 5  # other NICs' transmissions during the pings (not the pings: 20 each)


@pytest.mark.parametrize("family", FAMILIES)
def test_family_comes_up_with_all_pairs_reachable(family, ledger, tmp_path):
    fabric = build(family.split("-")[0], host_rate_mbit=RATE_MBIT, **FAMILIES[family])
    with FabricNetwork(fabric, tmp_path, ledger, log=lambda m: None) as net:
        n = len(fabric.hosts)
        assert net.ping_all() == (n * (n // 2), n * (n // 2))
        for name, rules in compute_rules(fabric).items():
            groups = re.findall(r"group_id=(\d+),type=select", net.switchd.dump_groups(name))
            assert sorted(int(g) for g in groups) == sorted(rules.groups), name


def test_switch_to_switch_links_are_shaped(ledger, tmp_path):
    """Between GPUs of two NVSwitch nodes the only slow links are the nodes' NICs, which are
    switch-to-switch links: a TCP flow there must run at the NIC rate, not the NVLink rate."""
    import json

    fabric = build("nvswitch", base="spineleaf", leaves=2, spines=2, hosts_per_leaf=2,
                   gpus_per_node=4, host_rate_mbit=RATE_MBIT)
    with FabricNetwork(fabric, tmp_path, ledger, log=lambda m: None) as net:
        server, client = net.host("l1h1g0"), net.host("l0h0g0")
        start_iperf_server(server, 5302)
        out = json.loads(client.cmd("iperf3", "-c", fabric.nodes["l1h1g0"].ip, "-p", "5302",
                                    "-t", "4", "-J"))
        mbit = out["end"]["sum_received"]["bits_per_second"] / 1e6
        assert 0.85 * RATE_MBIT <= mbit <= 1.05 * RATE_MBIT


def test_rail_gpu_traffic_leaves_on_its_own_nic(ledger, tmp_path):
    """Rail-optimised nodes: GPU i's packets for another node go out on NIC i (rail leaf i),
    whatever the destination GPU, counted at the node switch's NIC ports."""
    fabric = build("rail", nodes=2, gpus_per_node=4, spines=2, host_rate_mbit=RATE_MBIT)
    gpus = 4
    nic_intfs = [f"n0nv-eth{gpus + 1 + i}" for i in range(gpus)]  # NIC i is port G+1+i

    def nic_tx_packets():
        return [int(open(f"/sys/class/net/{intf}/statistics/tx_packets").read())
                for intf in nic_intfs]

    with FabricNetwork(fabric, tmp_path, ledger, log=lambda m: None) as net:
        for src, dst in [(2, 2), (1, 3)]:
            before = nic_tx_packets()
            out = net.host(f"n0g{src}").cmd("ping", "-c", str(RAIL_PINGS), "-i", "0.05", "-q",
                                           fabric.nodes[f"n1g{dst}"].ip)
            assert f"{RAIL_PINGS} received" in out, out
            sent = [after - b for after, b in zip(nic_tx_packets(), before)]
            assert sent[src] >= RAIL_PINGS, (src, dst, sent)
            assert all(n <= STRAY_PACKETS_MAX for i, n in enumerate(sent) if i != src), \
                (src, dst, sent)
