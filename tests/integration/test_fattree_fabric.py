"""A k=4 fat-tree comes up with the controller's ECMP groups, every host reaches every other,
ARP never floods, the controller listens on loopback only, and traffic flows at the link rate."""
from __future__ import annotations

import json
import re
import subprocess

import pytest

from testbed.apply.network import FabricNetwork
from testbed.controllers.routing.ecmp import compute_rules
from testbed.harness.experiment import SetupRun
from testbed.drive.flows import start_iperf_server
from testbed.harness.progress import QuietProgress
from testbed.experiments.registry import validate
from testbed.model.topology import build

RATE_MBIT = 6.0
MIN_TCP_DELIVERY = 0.85  # a lone TCP flow's goodput vs the configured link rate


@pytest.fixture(scope="module")
def net(ledger, tmp_path_factory):
    fabric = build("fattree", k=4, host_rate_mbit=RATE_MBIT)
    with FabricNetwork(fabric, tmp_path_factory.mktemp("fattree"), ledger,
                       log=lambda m: None) as running:
        yield running


def test_every_host_pair_is_reachable(net):
    sent, received = net.ping_all()
    assert (sent, received) == (128, 128)  # 16 hosts x the next 8: every pair, both ways


def test_ovs_holds_the_groups_and_routes_the_controller_computed(net):
    rules = compute_rules(net.fabric)
    for name, sw in rules.items():
        groups = net.switchd.dump_groups(name)
        found = {int(g): sorted(int(p) for p in re.findall(r"actions=output:(\d+)", rest))
                 for g, rest in re.findall(r"group_id=(\d+),type=select,(.*)", groups)}
        assert found == {gid: sorted(ports) for gid, ports in sw.groups.items()}, name
        flows = net.switchd.dump_flows(name)
        assert flows.count("priority=100,ip,nw_dst=") == len(net.fabric.hosts), name
        assert "priority=200,arp actions=CONTROLLER" in flows, name
    edge_groups = [g for name, sw in rules.items() if "e" in name[2:] for g in sw.groups.values()]
    assert edge_groups and all(len(ports) == 2 for ports in edge_groups)  # k/2 uplinks


def test_arp_is_answered_by_the_controller_without_flooding(net):
    src, dst = net.host("p0e0h0"), net.fabric.nodes["p3e1h1"]
    src.cmd("ip neigh flush all")
    assert " 0% packet loss" in src.cmd("ping", "-c1", "-W2", dst.ip)
    neigh = src.cmd("ip", "neigh", "show", dst.ip)
    assert dst.mac in neigh
    # No flood rules anywhere: ARP goes only to the controller.
    for sw in net.fabric.switches:
        assert "FLOOD" not in net.switchd.dump_flows(sw.name).upper()


def test_controller_listens_on_loopback_only(net):
    listening = subprocess.run(["ss", "-Hltn", f"sport = :{net.controller.port}"],
                               capture_output=True, text=True).stdout.split("\n")
    addrs = [line.split()[3] for line in listening if line.strip()]
    assert addrs == [f"127.0.0.1:{net.controller.port}"]


def test_tcp_flow_across_pods_reaches_the_link_rate(net):
    server, client = net.host("p3e1h1"), net.host("p0e0h0")
    start_iperf_server(server, 5301)
    server_ip = net.fabric.nodes["p3e1h1"].ip
    out = json.loads(client.cmd("iperf3", "-c", server_ip, "-p", "5301", "-t", "4", "-J"))
    mbit = out["end"]["sum_received"]["bits_per_second"] / 1e6
    assert mbit >= MIN_TCP_DELIVERY * RATE_MBIT
    assert mbit <= 1.05 * RATE_MBIT  # the shaper holds the configured rate


def test_allreduce_result_is_verified_on_every_rank(net, tmp_path):
    resolved = validate({"name": "t", "link_rate_mbit": RATE_MBIT,
                         "params": {"size_bytes": 256 * 1024, "iters": 1, "warmup": 0}})
    run = SetupRun(net, resolved.setups[0], tmp_path, lambda m: None, QuietProgress())
    summary = resolved.experiment.measure(run)
    assert summary["fidelity"]["trustworthy"], summary["fidelity"]["reasons"]
    assert summary["verified"] and summary["verified_ranks"] == 16
    assert summary["tcp"]["segments_sent"] > 0
    # Ring traffic left every host: each host uplink carried data.
    hosts = {h.name for h in net.fabric.hosts}
    assert all(v > 0 for k, v in summary["link_utilisation"].items() if k.split("->")[0] in hosts)
