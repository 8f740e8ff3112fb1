"""Controller restart: with fail_mode=secure the switches keep forwarding while no controller
is connected, and a new controller instance re-synchronises them: the same groups and flows
afterwards, none duplicated, none stale."""
from __future__ import annotations

import json
import re
import subprocess
import time

from testbed.apply.controller import ControllerProcess
from testbed.apply.network import FabricNetwork
from testbed.drive.flows import wait_servers
from testbed.measure.failover import ping_received
from testbed.model.topology import build

RATE_MBIT = 6.0
PROBES = 100
PROBE_INTERVAL_S = 0.02
RESYNC_TIMEOUT_S = 5.0  # a reconnected switch's wipe and program land well within this
MIN_FLOW_BYTES = 100_000  # 2 s at 6 Mbit/s is 1.5 MB: a flow that only got its SYN through has 0
# Fields that change with time or traffic, not with the rules themselves.
VOLATILE = re.compile(r"\b(cookie|duration|n_packets|n_bytes|idle_age|hard_age|ref_count|"
                      r"packet_count|byte_count)=[^,\s]+,?\s*")


def table(net: FabricNetwork) -> dict[str, tuple[list[str], list[str]]]:
    """Every switch's flows and groups with the volatile fields removed, sorted."""
    out = {}
    for bridge in net.bridges:
        flows = [VOLATILE.sub("", line).strip() for line in net.switchd.dump_flows(bridge).splitlines()
                 if "actions=" in line]
        groups = [VOLATILE.sub("", line).strip() for line in net.switchd.dump_groups(bridge).splitlines()
                  if "group_id=" in line]
        out[bridge] = (sorted(flows), sorted(groups))
    return out


def test_restart_keeps_forwarding_and_resynchronises(ledger, tmp_path):
    fabric = build("fattree", k=4, host_rate_mbit=RATE_MBIT)
    with FabricNetwork(fabric, tmp_path, ledger, log=lambda m: None) as net:
        before = table(net)
        src, dst = net.host("p0e0h0"), fabric.nodes["p3e1h1"].ip
        old = net.controller
        old.stop()
        # fail-secure: no controller, forwarding intact
        assert ping_received(src.cmd("ping", "-c", "5", "-i", "0.05", dst)) == 5
        assert table(net) == before

        src.sendCmd(f"ping -c {PROBES} -i {PROBE_INTERVAL_S} -W 1 {dst}")
        new = ControllerProcess(old.fabric_json, tmp_path, port=old.port, routing=old.routing)
        ledger.add_process(new.start())
        net.controller = new
        new.wait_programmed(set(net.bridges))
        lost = PROBES - ping_received(src.waitOutput())
        print(f"controller restart: {lost} of {PROBES} probes lost while it re-programmed")
        after = table(net)
        for bridge in net.bridges:
            flows, groups = after[bridge]
            assert len(flows) == len(set(flows)), bridge  # nothing duplicated
        assert after == before  # nothing stale, nothing missing
        assert ping_received(src.cmd("ping", "-c", "5", "-i", "0.05", dst)) == 5


def test_ugal_new_flows_still_flow_without_a_controller(ledger, tmp_path):
    """Per-flow UGAL sends each new inter-group flow's first packets to the controller; they
    also leave on the minimal route, so with the controller gone a new TCP connection to
    another group still carries data (testbed.controllers.routing.ugal, fail-secure for new flows)."""
    fabric = build("dragonfly", p=1, a=2, h=1, host_rate_mbit=RATE_MBIT)
    hosts = sorted(h.name for h in fabric.hosts)
    with FabricNetwork(fabric, tmp_path, ledger, routing="ugal", log=lambda m: None) as net:
        src, dst = hosts[0], hosts[-1]  # first and last group
        assert fabric.nodes[src].coords[0] != fabric.nodes[dst].coords[0]
        net.controller.stop()
        server = net.popen(dst, ["iperf3", "-s", "-1", "-p", "5301"],
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            wait_servers(net, [(dst, 5301)], [server])
            out = net.host(src).cmd("iperf3", "-c", fabric.nodes[dst].ip, "-p", "5301",
                                    "-t", "2", "-J")
        finally:
            if server.poll() is None:
                server.kill()
            server.wait()
        received = json.loads(out)["end"]["sum_received"]["bytes"]
        print(f"ugal without a controller: a new TCP flow {src} -> {dst} carried {received} B")
        assert received >= MIN_FLOW_BYTES


def test_a_switch_whose_controller_connection_flaps_is_resynchronised(ledger, tmp_path):
    """One switch loses its OpenFlow connection for a while (an overloaded switch process
    whose echo replies stop, say) and keeps forwarding with its rules, as fail_mode=secure
    says; the controller routes the others around it, and when it reconnects it is wiped and
    reprogrammed and the others are routed through it again: afterwards every switch holds
    exactly the rules it held before, and every pair of hosts reaches every other."""
    from testbed.apply.controller import EVENTS_FILE
    from testbed.measure.failover import wait_for_event

    fabric = build("fattree", k=4, host_rate_mbit=RATE_MBIT)
    events = tmp_path / EVENTS_FILE
    flapping = "p0a0"
    with FabricNetwork(fabric, tmp_path, ledger, log=lambda m: None) as net:
        before = table(net)
        src, dst = net.host("p0e0h0"), fabric.nodes["p3e1h1"].ip
        t_down = time.monotonic()
        net.switchd.vsctl(["del-controller", flapping], bridge=flapping)
        assert wait_for_event(events, "switch_down", t_down)
        assert table(net) != before  # the others were routed around it
        assert ping_received(src.cmd("ping", "-c", "5", "-i", "0.05", dst)) == 5
        t_up = time.monotonic()
        net.switchd.vsctl(["set-controller", flapping,
                           f"tcp:127.0.0.1:{net.controller.port}"], bridge=flapping)
        assert wait_for_event(events, "switch_up", t_up)
        # the event waits for the others' barriers; the returning switch's own program is
        # sent first on its new connection and may still be landing
        deadline = time.monotonic() + RESYNC_TIMEOUT_S
        while (after := table(net)) != before and time.monotonic() < deadline:
            time.sleep(0.2)
        for bridge in net.bridges:
            flows, _ = after[bridge]
            assert len(flows) == len(set(flows)), bridge  # nothing duplicated
        assert after == before  # nothing stale, nothing missing
        probes, answered = net.ping_all()
        assert answered == probes
