"""iperf3 through libiperf's Python binding, as the flow drivers run it
(testbed.traffic.iperf3_flow in each host's namespace), reports what ``iperf3 -J`` reports for
the same flow: the same document (its sections, the test's parameters, one interval per
second), and the same received rate within a tolerance, on a real fabric. Also the driver
itself (testbed.drive.flows.run_flows) reads its rate from that report."""
from __future__ import annotations

import json
import subprocess
import time

import pytest

from testbed.apply.network import FabricNetwork
from testbed.drive.flows import (
    SERVER_START_S,
    client_argv,
    run_flows,
    server_argv,
    wait_servers,
)
from testbed.model.topology import build

RATE_MBIT = 6.0
SRC, DST = "p0e0h0", "p3e1h1"   # in different pods: the flow crosses a core switch
SECONDS, OMIT_S, STREAMS, TOS = 4, 1, 2, 0x20
PORT = 5600
RATE_REL_TOLERANCE = 0.05       # two runs of one TCP flow on an idle shaped path
MIN_DELIVERY = 0.85             # a lone flow's goodput vs the link rate (test_fattree_fabric)
FLOW_TIMEOUT_S = SECONDS + OMIT_S + 30


@pytest.fixture(scope="module")
def net(ledger, tmp_path_factory):
    fabric = build("fattree", k=4, host_rate_mbit=RATE_MBIT)
    with FabricNetwork(fabric, tmp_path_factory.mktemp("iperf3"), ledger,
                       log=lambda m: None) as running:
        yield running


def one_flow(net, server: list[str], client: list[str]) -> dict:
    """Start ``server`` in DST, then ``client`` in SRC; the client's JSON report."""
    srv = net.popen(DST, server, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    time.sleep(SERVER_START_S)
    wait_servers(net, [(DST, PORT)], [srv])
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


def test_the_binding_reports_what_iperf3_json_reports(net):
    ip = net.fabric.nodes[DST].ip
    binding = one_flow(net, server_argv(PORT),
                       client_argv(ip, PORT, SECONDS, OMIT_S, STREAMS, TOS))
    cli = one_flow(net, ["iperf3", "-s", "-1", "-p", str(PORT)],
                   ["iperf3", "-c", ip, "-p", str(PORT), "-t", str(SECONDS), "-O", str(OMIT_S),
                    "-P", str(STREAMS), "-S", str(TOS), "-J"])
    assert "error" not in binding and "error" not in cli
    assert binding.keys() == cli.keys()
    assert binding["start"].keys() == cli["start"].keys()
    assert binding["start"]["test_start"] == cli["start"]["test_start"]
    assert binding["start"]["test_start"]["tos"] == TOS
    assert binding["start"]["version"] == cli["start"]["version"]  # one libiperf
    assert len(binding["intervals"]) == len(cli["intervals"]) == SECONDS + OMIT_S
    assert binding["end"].keys() == cli["end"].keys()
    assert len(binding["end"]["streams"]) == len(cli["end"]["streams"]) == STREAMS
    got = binding["end"]["sum_received"]["bits_per_second"]
    want = cli["end"]["sum_received"]["bits_per_second"]
    assert got == pytest.approx(want, rel=RATE_REL_TOLERANCE)
    assert got / 1e6 >= MIN_DELIVERY * RATE_MBIT


def test_the_flow_driver_reads_the_rate_from_the_binding(net):
    rates, errors = run_flows(net, [(SRC, DST)], SECONDS, OMIT_S)
    assert errors == []
    assert MIN_DELIVERY * RATE_MBIT <= rates[0] <= RATE_MBIT
