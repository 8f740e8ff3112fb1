"""The switches spread over two ovs-vswitchd (testbed.plan.shards): each process holds its
half of the bridges in its own database, the controller programs all of them, every host
reaches every other, a TCP flow across pods runs at the link rate, and nothing
of either process is left after the fabric goes down. Needs root; runs alone."""
from __future__ import annotations

import json
import os
import subprocess

from testbed.apply.network import FabricNetwork
from testbed.drive.flows import wait_servers
from testbed.model.topology import build

RATE_MBIT = 20.0
MIN_TCP_DELIVERY = 0.85  # a lone TCP flow's goodput vs the configured link rate
SHARDS = 2
PORT = 5301


def test_two_processes_share_the_fabric_and_forward_every_pair(ledger, tmp_path):
    fabric = build("fattree", k=4, host_rate_mbit=RATE_MBIT)
    with FabricNetwork(fabric, tmp_path, ledger, log=lambda m: None,
                       switchd_shards=SHARDS) as net:
        pids = list(net.switchd.pids)
        assert len(pids) == SHARDS and net.switchd.datapath_type == "dummy"
        held = []
        for index, group in enumerate(net.switchd.groups):
            out = subprocess.run(
                ["ovs-vsctl", f"--db=unix:{net.switchd.shard_dir(index) / 'db.sock'}",
                 "list-br"], capture_output=True, text=True, check=True)
            assert sorted(out.stdout.split()) == sorted(group)
            held += group
        assert sorted(held) == sorted(s.name for s in fabric.switches)
        assert net.switchd.taps() == []  # the dummy datapath's bridge ports are in-process
        sent, received = net.ping_all()
        assert (sent, received) == (128, 128)
        a, b = fabric.hosts[0], fabric.hosts[-1]  # different pods: five switches apart
        server = net.popen(b.name, ["iperf3", "-s", "-1", "-p", str(PORT)],
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait_servers(net, [(b.name, PORT)], [server])
        try:
            out = net.host(a.name).cmd("iperf3", "-c", b.ip, "-p", str(PORT), "-t", "4", "-J",
                                       "--connect-timeout", "3000")
        finally:
            if server.poll() is None:
                server.kill()
            server.wait()
        report = json.loads(out)
        assert "error" not in report, report["error"]
        mbit = report["end"]["sum_received"]["bits_per_second"] / 1e6
        assert mbit >= MIN_TCP_DELIVERY * RATE_MBIT, mbit
    for pid in pids:
        assert not os.path.exists(f"/proc/{pid}"), f"ovs-vswitchd {pid} outlived the fabric"
