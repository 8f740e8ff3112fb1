"""``testbed bench``: this machine's emulation capacity, measured beside a baseline in the
same invocation, written as JSON.

1. Forwarding capacity: one TCP flow (iperf3, 5 s) across a line of 2 unshaped OVS switches,
   at MTU 1500 and 9000; the baseline is the same flow over one veth pair with no switch.
2. Fabric bring-up and tear-down of the k=4 and k=8 fat-trees: the testbed (OVS + controller
   programmed + every host pair proven reachable) beside plain Mininet building and starting
   the same topology (TCLink, OVS userspace datapath, no controller, no traffic), with the
   ratio of the two.
3. Failover: an edge uplink of the k=4 fat-tree cut under single-path routing, the time until
   the controller rerouted (against the 1 s goal) and the probes lost (testbed.measure.failover).
4. Anycast switch-over: on the k=4 fat-tree (ECMP, hosts at 6 Mbit/s) a client probing an
   anycast service every 10 ms while its near replica's link is cut and restored; the time
   until the far replica answered (against the same 1 s goal), the time until the near one
   answered again, and the requests lost (testbed.experiments.anycast.failover).
"""
from __future__ import annotations

import json
import time
from pathlib import Path

from testbed.apply import ovs
from testbed.apply.controller import write_anycast
from testbed.apply.network import FabricNetwork
from testbed.harness.experiment import Setup
from testbed.harness.fabric_checks import anycast_reachable
from testbed.harness.run import machine, new_run_id
from testbed.model.topology import build

IPERF_SECONDS = 5


def iperf_mbit(client, server_ip: str) -> float:
    out = client.cmd("iperf3", "-c", server_ip, "-t", str(IPERF_SECONDS), "-J")
    return json.loads(out)["end"]["sum_received"]["bits_per_second"] / 1e6


def forwarding_capacity(workdir: Path, ledger, mtu_bytes: int, switches: int, log) -> float:
    """TCP Mbit/s between the two hosts of a line of ``switches`` unshaped switches."""
    fabric = build("line", switches=switches, mtu_bytes=mtu_bytes)
    with FabricNetwork(fabric, workdir, ledger, log=log) as net:
        server = net.host("h1")
        server.cmd("iperf3", "-s", "-D", "-1")
        time.sleep(0.3)
        return iperf_mbit(net.host("h0"), fabric.nodes["h1"].ip)


def direct_capacity(ledger, mtu_bytes: int) -> float:
    """Baseline: the same flow over one veth pair between two namespaces, no switch."""
    from mininet.net import Mininet

    net = Mininet(controller=None, build=False)
    h0, h1 = net.addHost("h0", ip="10.0.0.2/8"), net.addHost("h1", ip="10.0.0.3/8")
    ledger.add_names(interfaces=["h0-eth0", "h1-eth0"])
    net.addLink(h0, h1)
    try:
        net.build()
        for h in (h0, h1):
            ledger.add_process(h.pid)
            h.cmd(f"ip link set dev {h.defaultIntf()} mtu {mtu_bytes}")
        h1.cmd("iperf3", "-s", "-D", "-1")
        time.sleep(0.3)
        return iperf_mbit(h0, "10.0.0.3")
    finally:
        net.stop()


def testbed_fabric_times(workdir: Path, ledger, k: int, log) -> dict:
    fabric = build("fattree", k=k, host_rate_mbit=100)
    t0 = time.monotonic()
    net = FabricNetwork(fabric, workdir, ledger, log=log)
    with net:
        sent, received = net.ping_all()
        up_s = time.monotonic() - t0
    return {"up_s": up_s, "down_s": net.timings.stop_s, "build_s": net.timings.build_s,
            "programmed_s": net.timings.programmed_s,
            "probes_answered": received, "probes": sent,
            "ordered_pairs_covered": len(fabric.hosts) * (len(fabric.hosts) - 1)}


def mininet_topo(fabric):
    """A Mininet Topo with the fabric's names, ports, DPIDs, addresses and link rates: the
    same network, for plain Mininet to build as the baseline."""
    from mininet.topo import Topo

    topo = Topo()
    for node in fabric.nodes.values():
        if node.is_host:
            topo.addHost(node.name, ip=f"{node.ip}/8", mac=node.mac)
        else:
            topo.addSwitch(node.name, dpid=f"{node.dpid:016x}")
    for link in fabric.links:
        shaping = {} if link.rate_mbit is None else {"bw": link.rate_mbit}
        topo.addLink(link.a, link.b, port1=link.a_port, port2=link.b_port, **shaping)
    return topo


def plain_mininet_times(ledger, k: int) -> dict:
    """Plain Mininet builds, starts and stops the same k=4 fat-tree topology."""
    from mininet.link import TCLink
    from mininet.net import Mininet
    from mininet.node import OVSSwitch

    class UserOVSSwitch(OVSSwitch):
        """OVS with the userspace datapath, as `mn --switch ovs,datapath=user` makes it (a
        subclass, so Mininet's batched start-up applies)."""

        def __init__(self, name, **params):
            super().__init__(name, datapath="user", **params)

    fabric = build("fattree", k=k, host_rate_mbit=100)
    ledger.add_names(bridges=[s.name for s in fabric.switches],
                     interfaces=fabric.interface_names())
    started = not ovs.is_running()
    if started:  # plain Mininet uses the machine's OVS service; the testbed runs its own
        ledger.ovs_started = True
        ledger.save()
        ovs.start()
    try:
        t0 = time.monotonic()
        net = Mininet(topo=mininet_topo(fabric), switch=UserOVSSwitch,
                      link=TCLink, controller=None, autoSetMacs=False, waitConnected=False)
        for node in net.hosts + net.switches:
            ledger.add_process(node.pid)
        build_s = time.monotonic() - t0
        net.start()
        up_s = time.monotonic() - t0
        t1 = time.monotonic()
        net.stop()
        down_s = time.monotonic() - t1
    finally:
        if started:  # its userspace datapath's tap would block the testbed's own OVS
            ovs.stop()
            ledger.ovs_started = False
            ledger.save()
    return {"up_s": up_s, "build_s": build_s, "start_s": up_s - build_s,
            "down_s": down_s}


FAILOVER_GOAL_S = 1.0  # the controller's budget to route around a failed link (and anycast)


def failover_times(workdir: Path, ledger, log) -> dict:
    """An edge uplink of the k=4 fat-tree cut under single-path routing (only the controller
    can save the flow) while a host probes a host in another pod; see testbed.measure.failover."""
    from testbed.measure.failover import cut_and_repair

    fabric = build("fattree", k=4, host_rate_mbit=6.0)
    (workdir / "failover").mkdir(exist_ok=True)
    with FabricNetwork(fabric, workdir / "failover", ledger, routing="single", log=log) as net:
        return cut_and_repair(net, "p0e0-eth3", "p0e0h0", "p3e1h1").to_dict()


def anycast_times(workdir: Path, ledger, log) -> dict:
    """A client of an anycast service on the k=4 fat-tree moved off its near replica by a
    link cut, then back by the repair; see testbed.experiments.anycast.failover."""
    from testbed.experiments.anycast.failover import FAT_TREE_K4, cut_and_repair

    fabric = build("fattree", k=4, host_rate_mbit=6.0)
    rundir = workdir / "anycast"
    rundir.mkdir(exist_ok=True)
    write_anycast(rundir, FAT_TREE_K4.service.to_dict())  # read by the controller at start
    setup = Setup("anycast", fabric, "ecmp", anycast=FAT_TREE_K4.service.to_dict())
    with FabricNetwork(fabric, rundir, ledger, routing="ecmp", log=log) as net:
        anycast_reachable(net, setup, log)
        return cut_and_repair(net, FAT_TREE_K4).to_dict()


def run_bench(output: str, ks: tuple[int, ...] = (4, 8), log=print) -> dict:
    from mininet.log import setLogLevel

    setLogLevel("critical")
    run_id = new_run_id("bench")
    workdir = Path(output).parent / run_id
    workdir.mkdir(parents=True, exist_ok=True)
    result: dict = {"run_id": run_id, "forwarding_mbit": {}}
    with machine(run_id, log) as ledger:
        for mtu in (1500, 9000):
            direct = direct_capacity(ledger, mtu)
            via_ovs = forwarding_capacity(workdir, ledger, mtu, 2, log)
            result["forwarding_mbit"][f"mtu{mtu}"] = {
                "two_ovs_switches": via_ovs, "direct_veth_baseline": direct,
                "ratio_vs_baseline": via_ovs / direct}
            log(f"forwarding, MTU {mtu}: {via_ovs:.0f} Mbit/s through 2 OVS switches vs "
                f"{direct:.0f} Mbit/s direct veth = {via_ovs / direct:.3f}x")
        for k in ks:
            log(f"k={k} fat-tree: plain Mininet, then the testbed")
            plain = plain_mininet_times(ledger, k)
            ours = testbed_fabric_times(workdir, ledger, k, log)
            result[f"fabric_k{k}"] = {"testbed": ours, "plain_mininet": plain,
                                      "up_ratio_vs_plain": ours["up_s"] / plain["up_s"],
                                      "down_ratio_vs_plain": ours["down_s"] / plain["down_s"]}
            log(f"k={k} fat-tree up: testbed {ours['up_s']:.1f} s (programmed, "
                f"{ours['probes_answered']}/{ours['probes']} probes answered, covering all "
                f"{ours['ordered_pairs_covered']} ordered host pairs) vs plain Mininet "
                f"{plain['up_s']:.1f} s (no controller) = {ours['up_s'] / plain['up_s']:.2f}x")
            log(f"k={k} fat-tree down: testbed {ours['down_s']:.1f} s vs plain Mininet "
                f"{plain['down_s']:.1f} s = {ours['down_s'] / plain['down_s']:.2f}x")
        failover = failover_times(workdir, ledger, log)
        result["failover_k4_single_path"] = {**failover, "goal_s": FAILOVER_GOAL_S,
                                             "applied_vs_goal": failover["down_applied_s"]
                                             / FAILOVER_GOAL_S}
        log(f"failover, k=4 edge uplink cut: noticed after {failover['down_detected_s'] * 1000:.0f}"
            f" ms, rerouted after {failover['down_applied_s'] * 1000:.0f} ms = "
            f"{failover['down_applied_s'] / FAILOVER_GOAL_S:.2f}x the {FAILOVER_GOAL_S:g} s goal; "
            f"{failover['probes_lost']} probes lost ({failover['outage_s'] * 1000:.0f} ms); "
            f"repair applied after {failover['up_applied_s'] * 1000:.0f} ms")
        anycast = anycast_times(workdir, ledger, log)
        result["anycast_k4"] = {**anycast, "goal_s": FAILOVER_GOAL_S,
                                "to_far_vs_goal": anycast["to_far_s"] / FAILOVER_GOAL_S}
        log(f"anycast, k=4 near replica's link {anycast['interface']} cut: {anycast['client']} "
            f"served by {anycast['far']} after {anycast['to_far_s'] * 1000:.0f} ms = "
            f"{anycast['to_far_s'] / FAILOVER_GOAL_S:.2f}x the {FAILOVER_GOAL_S:g} s goal; "
            f"{anycast['requests_lost']} requests lost ({anycast['outage_s'] * 1000:.0f} ms); "
            f"back on {anycast['near']} {anycast['back_to_near_s'] * 1000:.0f} ms after the "
            f"repair")
    Path(output).write_text(json.dumps(result, indent=1))
    log(f"wrote {output}")
    return result
