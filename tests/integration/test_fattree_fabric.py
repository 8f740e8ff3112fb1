"""A k=4 fat-tree comes up with the controller's ECMP groups, every host reaches every other,
ARP never floods, the controller listens on loopback only, and traffic flows at the link rate.
iperf3 through libiperf's Python binding, as the flow drivers run it
(testbed.traffic.iperf3_flow in each host's namespace), reports what ``iperf3 -J`` reports for
the same flow: the same document (its sections, the test's parameters, one interval per
second, a summary per stream) and the same received rate within a tolerance; the driver
(testbed.drive.flows.run_flows) reads its rate from that report."""
from __future__ import annotations

import json
import re
import subprocess
import time

import pytest

from testbed.apply.network import FabricNetwork
from testbed.controllers.routing.ecmp import compute_rules
from testbed.harness.experiment import SetupRun
from testbed.drive.flows import (
    SERVER_START_S,
    client_argv,
    run_flows,
    server_argv,
    start_iperf_server,
    wait_servers,
)
from testbed.harness.progress import QuietProgress
from testbed.experiments.registry import validate
from testbed.model.topology import build

RATE_MBIT = 6.0
MIN_TCP_DELIVERY = 0.85  # a lone TCP flow's goodput vs the configured link rate
SRC, DST = "p0e0h0", "p3e1h1"  # in different pods: their traffic crosses a core switch
FLOW_SECONDS, FLOW_OMIT_S, FLOW_STREAMS, FLOW_TOS = 4, 1, 2, 0x20
BINDING_PORT = 5600
RATE_REL_TOLERANCE = 0.05  # two runs of one TCP flow on an idle shaped path
FLOW_TIMEOUT_S = FLOW_SECONDS + FLOW_OMIT_S + 30


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


def one_flow(net, server: list[str], client: list[str]) -> dict:
    """Start ``server`` in DST, then ``client`` in SRC; the client's JSON report."""
    srv = net.popen(DST, server, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    time.sleep(SERVER_START_S)
    wait_servers(net, [(DST, BINDING_PORT)], [srv])
    cli = net.popen(SRC, client, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        out, err = cli.communicate(timeout=FLOW_TIMEOUT_S)
        srv.wait(timeout=FLOW_TIMEOUT_S)
    finally:
        for proc in (cli, srv):
            if proc.poll() is None:
                proc.kill()
            proc.wait()
    assert cli.returncode == 0, (client, out[-500:], err[-500:])
    return json.loads(out)


def test_the_iperf3_binding_reports_what_iperf3_json_reports(net):
    ip = net.fabric.nodes[DST].ip
    binding = one_flow(net, server_argv(BINDING_PORT),
                       client_argv(ip, BINDING_PORT, FLOW_SECONDS, FLOW_OMIT_S, FLOW_STREAMS,
                                   FLOW_TOS))
    cli = one_flow(net, ["iperf3", "-s", "-1", "-p", str(BINDING_PORT)],
                   ["iperf3", "-c", ip, "-p", str(BINDING_PORT), "-t", str(FLOW_SECONDS),
                    "-O", str(FLOW_OMIT_S), "-P", str(FLOW_STREAMS), "-S", str(FLOW_TOS), "-J"])
    assert "error" not in binding and "error" not in cli
    assert binding.keys() == cli.keys()
    assert binding["start"].keys() == cli["start"].keys()
    assert binding["start"]["test_start"] == cli["start"]["test_start"]
    assert binding["start"]["test_start"]["tos"] == FLOW_TOS
    assert binding["start"]["version"] == cli["start"]["version"]  # one libiperf
    assert len(binding["intervals"]) == len(cli["intervals"]) == FLOW_SECONDS + FLOW_OMIT_S
    assert binding["end"].keys() == cli["end"].keys()
    assert len(binding["end"]["streams"]) == len(cli["end"]["streams"]) == FLOW_STREAMS
    got = binding["end"]["sum_received"]["bits_per_second"]
    want = cli["end"]["sum_received"]["bits_per_second"]
    assert got == pytest.approx(want, rel=RATE_REL_TOLERANCE)
    assert got / 1e6 >= MIN_TCP_DELIVERY * RATE_MBIT


def test_the_flow_driver_reads_its_rate_from_the_binding(net):
    rates, errors = run_flows(net, [(SRC, DST)], FLOW_SECONDS, FLOW_OMIT_S)
    assert errors == []
    assert MIN_TCP_DELIVERY * RATE_MBIT <= rates[0] <= 1.05 * RATE_MBIT
