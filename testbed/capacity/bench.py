"""``testbed bench``: this machine's emulation capacity, measured beside baselines in the same
invocation, written as JSON and printed as a table.

1. Forwarding lines, one TCP flow (iperf3, 5 s) each, at MTU 1500 and 9000: 2 unshaped OVS
   switches in a line (the run's own OVS, one MTU-sized packet at a time, and, where the
   userspace datapath can, passing segmentation-offloaded packets; where the kernel has the
   openvswitch module, the same line on the kernel datapath beside it, as a ratio), 2
   namespace routers forwarding in the kernel, and a direct veth pair.
2. The fabric's ceiling: for the k=4 (and k=8) fat-tree, the highest link rate at which the
   ring AllReduce is trusted and delivers 90% busbw (testbed.capacity.calibrate's search),
   and the fabric's aggregate forwarded switch-hop throughput at that rate, beside the
   kernel-forwarding line.
3. Fabric bring-up and tear-down of the k=4 and k=8 fat-trees: the testbed (OVS + controller
   programmed + every host pair proven reachable) beside plain Mininet building and starting
   the same topology (TCLink, OVS userspace datapath, no controller, no traffic).
4. Failover: an edge uplink of the k=4 fat-tree cut under single-path routing, the time until
   the controller rerouted (against the 1 s goal) and the probes lost (testbed.measure.failover).
5. Anycast switch-over: on the k=4 fat-tree a client probing an anycast service every 10 ms
   while its near replica's link is cut and restored (testbed.measure.anycast_failover).

Fabrics (2 to 5) take this machine's datapath: the kernel's where the module exists, unless
``--userspace-datapath`` (TESTBED_DATAPATH=user) forces the userspace one; ``--lines-only``
measures the lines alone.
"""
from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

from testbed.apply import ovs
from testbed.apply.controller import write_anycast
from testbed.apply.network import FabricNetwork
from testbed.capabilities import detect, fabric_datapath
from testbed.capacity.calibrate import (
    result_of,
    ring_topology,
    ring_world,
    search,
)
from testbed.drive.flows import start_iperf_server
from testbed.harness.calibration import machine_description
from testbed.harness.console import print_rows
from testbed.harness.experiment import Setup
from testbed.harness.fabric_checks import anycast_reachable
from testbed.harness.run import check_can_build, machine, new_run_id
from testbed.measure.anycast_failover import FAT_TREE_K4, anycast_cut_and_repair
from testbed.measure.failover import cut_and_repair
from testbed.model.topology import build

IPERF_SECONDS = 5
IPERF_PORT = 5201


def iperf_mbit(client, server_ip: str) -> float:
    out = client.cmd("iperf3", "-c", server_ip, "-p", str(IPERF_PORT), "-t", str(IPERF_SECONDS),
                     "-J")
    return json.loads(out)["end"]["sum_received"]["bits_per_second"] / 1e6


def forwarding_capacity(workdir: Path, ledger, mtu_bytes: int, switches: int, log,
                        userspace_tso: bool = False, datapath: str = "user") -> float:
    """TCP Mbit/s between the two hosts of a line of ``switches`` unshaped switches."""
    fabric = build("line", switches=switches, mtu_bytes=mtu_bytes)
    with FabricNetwork(fabric, workdir, ledger, datapath=datapath, log=log,
                       userspace_tso=userspace_tso) as net:
        server = net.host("h1")
        start_iperf_server(server, IPERF_PORT)
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
        start_iperf_server(h1, IPERF_PORT)
        return iperf_mbit(h0, "10.0.0.3")
    finally:
        net.stop()


def kernel_forwarding_capacity(ledger, mtu_bytes: int) -> float:
    """Baseline: the same flow through two namespace routers forwarding in the kernel
    (h0 - r0 - r1 - h1, one /24 per link, offloads as Linux sets them)."""
    from mininet.net import Mininet

    net = Mininet(controller=None, build=False)
    h0, r0, r1, h1 = (net.addHost(n, ip=None) for n in ("h0", "r0", "r1", "h1"))
    ledger.add_names(interfaces=["h0-eth0", "r0-eth0", "r0-eth1", "r1-eth0", "r1-eth1",
                                 "h1-eth0"])
    for a, b in ((h0, r0), (r0, r1), (r1, h1)):
        net.addLink(a, b)
    plan = {h0: [["addr", "add", "10.1.0.1/24", "dev", "h0-eth0"],
                 ["route", "add", "default", "via", "10.1.0.2"]],
            r0: [["addr", "add", "10.1.0.2/24", "dev", "r0-eth0"],
                 ["addr", "add", "10.2.0.1/24", "dev", "r0-eth1"],
                 ["route", "add", "10.3.0.0/24", "via", "10.2.0.2"]],
            r1: [["addr", "add", "10.2.0.2/24", "dev", "r1-eth0"],
                 ["addr", "add", "10.3.0.1/24", "dev", "r1-eth1"],
                 ["route", "add", "10.1.0.0/24", "via", "10.2.0.1"]],
            h1: [["addr", "add", "10.3.0.2/24", "dev", "h1-eth0"],
                 ["route", "add", "default", "via", "10.3.0.1"]]}
    try:
        net.build()
        for node, commands in plan.items():
            ledger.add_process(node.pid)
            for intf in node.intfNames():
                node.cmd("ip", "link", "set", "dev", intf, "mtu", str(mtu_bytes), "up")
            for argv in commands:
                node.cmd("ip", *argv)
        for router in (r0, r1):
            router.cmd("sysctl", "-qw", "net.ipv4.ip_forward=1")
        start_iperf_server(h1, IPERF_PORT)
        return iperf_mbit(h0, "10.3.0.2")
    finally:
        net.stop()


def testbed_fabric_times(workdir: Path, ledger, k: int, log, userspace_tso: bool = False,
                         datapath: str = "user") -> dict:
    fabric = build("fattree", k=k, host_rate_mbit=100)
    t0 = time.monotonic()
    net = FabricNetwork(fabric, workdir, ledger, datapath=datapath, log=log,
                        userspace_tso=userspace_tso)
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


def failover_times(workdir: Path, ledger, log, datapath: str = "user") -> dict:
    """An edge uplink of the k=4 fat-tree cut under single-path routing (only the controller
    can save the flow) while a host probes a host in another pod; see testbed.measure.failover."""
    fabric = build("fattree", k=4, host_rate_mbit=6.0)
    (workdir / "failover").mkdir(exist_ok=True)
    with FabricNetwork(fabric, workdir / "failover", ledger, datapath=datapath,
                       routing="single", log=log) as net:
        return cut_and_repair(net, "p0e0-eth3", "p0e0h0", "p3e1h1").to_dict()


def anycast_times(workdir: Path, ledger, log, datapath: str = "user") -> dict:
    """A client of an anycast service on the k=4 fat-tree moved off its near replica by a
    link cut, then back by the repair; see testbed.measure.anycast_failover."""
    fabric = build("fattree", k=4, host_rate_mbit=6.0)
    rundir = workdir / "anycast"
    rundir.mkdir(exist_ok=True)
    write_anycast(rundir, FAT_TREE_K4.service.to_dict())  # read by the controller at start
    setup = Setup("anycast", fabric, "ecmp", anycast=FAT_TREE_K4.service.to_dict())
    with FabricNetwork(fabric, rundir, ledger, datapath=datapath, routing="ecmp",
                       log=log) as net:
        anycast_reachable(net, setup, log)
        return anycast_cut_and_repair(net, FAT_TREE_K4).to_dict()


def failover_and_anycast(result: dict, workdir: Path, ledger, log, datapath: str) -> None:
    """The failover and anycast switch-over measures, into ``result``."""
    failover = failover_times(workdir, ledger, log, datapath)
    result["failover_k4_single_path"] = {**failover, "goal_s": FAILOVER_GOAL_S,
                                         "applied_vs_goal": failover["down_applied_s"]
                                         / FAILOVER_GOAL_S}
    log(f"failover, k=4 edge uplink cut: rerouted after "
        f"{failover['down_applied_s'] * 1000:.0f} ms; {failover['probes_lost']} probes lost")
    anycast = anycast_times(workdir, ledger, log, datapath)
    result["anycast_k4"] = {**anycast, "goal_s": FAILOVER_GOAL_S,
                            "to_far_vs_goal": anycast["to_far_s"] / FAILOVER_GOAL_S}
    log(f"anycast, k=4: served by the far replica after {anycast['to_far_s'] * 1000:.0f} "
        f"ms, back {anycast['back_to_near_s'] * 1000:.0f} ms after the repair")


def forwarding_lines(workdir: Path, ledger, log, tso_path: bool,
                     kernel_datapath: bool = False) -> dict:
    """One TCP flow through each line, at MTU 1500 and 9000; the two switches on the
    userspace datapath, and with ``kernel_datapath`` also on the kernel's, with the ratio."""
    lines = {}
    for mtu in (1500, 9000):
        row = {"direct_veth": direct_capacity(ledger, mtu),
               "kernel_forwarding_2_routers": kernel_forwarding_capacity(ledger, mtu),
               "ovs_2_switches": forwarding_capacity(workdir, ledger, mtu, 2, log)}
        if tso_path:
            row["ovs_2_switches_offloaded"] = forwarding_capacity(workdir, ledger, mtu, 2, log,
                                                                  userspace_tso=True)
        if kernel_datapath:
            row["ovs_2_switches_kernel"] = forwarding_capacity(workdir, ledger, mtu, 2, log,
                                                               datapath="kernel")
            row["kernel_vs_userspace"] = row["ovs_2_switches_kernel"] / row["ovs_2_switches"]
        lines[f"mtu{mtu}"] = row
        log(f"lines, MTU {mtu}: " + ", ".join(f"{k} {v:.0f} Mbit/s" for k, v in row.items()
                                              if k != "kernel_vs_userspace"))
    return lines


def ceiling(k: int, log, results_dir: str, kernel_line_mbit: float) -> dict:
    """The k-ary fat-tree ring's ceiling on this machine (the ring of
    testbed.capacity.calibrate.ring_topology) and what the fabric forwards there."""
    from dataclasses import asdict

    trials = search(k, log, start_mbit=25.0 if k == 4 else 10.0, results_dir=results_dir)
    best = result_of(trials)
    at_best = next((t for t in trials if t.rate_mbit == best), None)
    forwarded = at_best.forwarded_mbit if at_best else None
    topology = ring_topology(k)
    return {"ceiling_mbit": best, "topology": topology, "ranks": ring_world(topology),
            "forwarded_switch_hops_mbit": forwarded,
            "forwarded_vs_kernel_line": (forwarded / kernel_line_mbit
                                         if forwarded and kernel_line_mbit else None),
            "trials": [asdict(t) for t in trials]}


def ring_label(k: str, ceiling_result: dict) -> str:
    """``k=4 ring``, or ``k=8 ring of 32 ranks (1 per edge switch)`` for a thinned tree."""
    per_edge = (ceiling_result.get("topology") or {}).get("hosts_per_edge")
    if per_edge is None:
        return f"k={k} ring"
    return f"k={k} ring of {ceiling_result['ranks']} ranks ({per_edge} per edge switch)"


ROCE_BENCH_TIMEOUT_S = 900.0
ROCE_MIN_PPS_RATIO = 0.5  # the engine's packets per core against a plain UDP sender's


def roce_engine(log) -> dict:
    """The user-space RoCE engine on loopback (testbed.traffic.roce.bench, a process of its
    own, no fabric): its packets per CPU second beside a plain UDP sender's, and one QP's
    goodput between two engines."""
    log("RoCE engine on 127.0.0.1: packets per core against a plain UDP sender, one QP")
    out = subprocess.run([sys.executable, "-m", "testbed.traffic.roce.bench", "--sink",
                          "drained"], capture_output=True, text=True,
                         timeout=ROCE_BENCH_TIMEOUT_S)
    if out.returncode != 0:
        return {"error": out.stderr.strip()[-300:]}
    return json.loads(out.stdout)


def run_bench(output: str, ks: tuple[int, ...] = (4, 8), log=print,
              ceilings: bool = True, lines_only: bool = False) -> dict:
    check_can_build()  # before the output folder is made
    from mininet.log import setLogLevel

    setLogLevel("critical")
    platform = detect()
    tso_path = platform.paths.ovs_offload == "userspace-tso"
    datapath = fabric_datapath(platform.paths)
    run_id = new_run_id("bench")
    workdir = Path(output).parent / run_id
    workdir.mkdir(parents=True, exist_ok=True)
    result: dict = {"run_id": run_id, "machine": machine_description(platform),
                    "paths": vars(platform.paths)}
    with machine(run_id, log) as ledger:
        result["lines_mbit"] = forwarding_lines(workdir, ledger, log, tso_path,
                                                kernel_datapath=datapath == "kernel")
        if lines_only:
            ks, ceilings = (), False
        for k in ks:
            log(f"k={k} fat-tree: plain Mininet, then the testbed")
            plain = plain_mininet_times(ledger, k)
            ours = testbed_fabric_times(workdir, ledger, k, log, tso_path, datapath)
            result[f"fabric_k{k}"] = {"testbed": ours, "plain_mininet": plain,
                                      "up_ratio_vs_plain": ours["up_s"] / plain["up_s"],
                                      "down_ratio_vs_plain": ours["down_s"] / plain["down_s"]}
            log(f"k={k} fat-tree up: testbed {ours['up_s']:.1f} s (programmed, "
                f"{ours['probes_answered']}/{ours['probes']} probes answered, covering all "
                f"{ours['ordered_pairs_covered']} ordered host pairs) vs plain Mininet "
                f"{plain['up_s']:.1f} s (no controller); down {ours['down_s']:.1f} s vs "
                f"{plain['down_s']:.1f} s")
        if not lines_only:
            failover_and_anycast(result, workdir, ledger, log, datapath)
    if not lines_only:
        result["roce_engine"] = roce_engine(log)
    if ceilings:  # runs of their own: each takes the machine's lock
        kernel_line = result["lines_mbit"]["mtu9000"]["kernel_forwarding_2_routers"]
        for k in ks:
            result[f"ceiling_k{k}"] = ceiling(k, log, str(workdir / f"ceiling-k{k}"),
                                              kernel_line)
    Path(output).write_text(json.dumps(result, indent=1))
    print_bench(result)
    log(f"wrote {output}")
    return result


def bench_rows(result: dict) -> list[list[str]]:
    """The bench as a table: measure, testbed, baseline, ratio."""
    rows = [["measure", "testbed", "baseline", "ratio"]]
    for mtu, line in result.get("lines_mbit", {}).items():
        kernel = line["kernel_forwarding_2_routers"]
        rows.append([f"TCP through 2 OVS switches, {mtu}", f"{line['ovs_2_switches']:.0f} Mbit/s",
                     f"{kernel:.0f} Mbit/s kernel-forwarding line",
                     f"{line['ovs_2_switches'] / kernel:.3f}"])
        if "ovs_2_switches_offloaded" in line:
            off = line["ovs_2_switches_offloaded"]
            rows.append([f"  ... passing offloaded packets, {mtu}", f"{off:.0f} Mbit/s",
                         f"{kernel:.0f} Mbit/s kernel-forwarding line", f"{off / kernel:.3f}"])
        if "ovs_2_switches_kernel" in line:
            rows.append([f"  ... on the kernel datapath, {mtu}",
                         f"{line['ovs_2_switches_kernel']:.0f} Mbit/s",
                         f"{line['ovs_2_switches']:.0f} Mbit/s userspace datapath",
                         f"{line['kernel_vs_userspace']:.3f}"])
        rows.append([f"direct veth pair, {mtu}", "", f"{line['direct_veth']:.0f} Mbit/s", ""])
    for key in sorted(k for k in result if k.startswith("ceiling_k")):
        c, k = result[key], key.removeprefix("ceiling_k")
        tried = sorted(t["rate_mbit"] for t in c.get("trials", []))
        held = (f"{c['ceiling_mbit']:g} Mbit/s" if c["ceiling_mbit"] is not None
                else f"none of {', '.join(f'{r:g}' for r in tried)} Mbit/s")
        rows.append([f"{ring_label(k, c)} trusted at >= 90% busbw", held, "", ""])
        if c.get("forwarded_switch_hops_mbit"):
            rows.append([f"{ring_label(k, c)}: switch-hop throughput at the ceiling",
                         f"{c['forwarded_switch_hops_mbit']:.0f} Mbit/s",
                         "kernel-forwarding line, MTU 9000",
                         f"{c['forwarded_vs_kernel_line']:.3f}"])
    for key in sorted(k for k in result if k.startswith("fabric_k")):
        f, k = result[key], key.removeprefix("fabric_k")
        rows.append([f"k={k} fat-tree up", f"{f['testbed']['up_s']:.1f} s",
                     f"{f['plain_mininet']['up_s']:.1f} s plain Mininet",
                     f"{f['up_ratio_vs_plain']:.2f}"])
        rows.append([f"k={k} fat-tree down", f"{f['testbed']['down_s']:.1f} s",
                     f"{f['plain_mininet']['down_s']:.1f} s plain Mininet",
                     f"{f['down_ratio_vs_plain']:.2f}"])
    if "failover_k4_single_path" in result:
        f = result["failover_k4_single_path"]
        rows.append(["failover: rerouted after an uplink cut",
                     f"{f['down_applied_s'] * 1000:.0f} ms", f"{f['goal_s']:g} s goal",
                     f"{f['applied_vs_goal']:.2f}"])
    if "anycast_k4" in result:
        a = result["anycast_k4"]
        rows.append(["anycast: served by the far replica", f"{a['to_far_s'] * 1000:.0f} ms",
                     f"{a['goal_s']:g} s goal", f"{a['to_far_vs_goal']:.2f}"])
    roce = result.get("roce_engine") or {}
    for row in roce.get("pps", []):
        rows.append([f"RoCE engine sender, {roce['mtu_bytes']} B packets",
                     f"{row['engine_pps_per_core']:.0f} pps/core",
                     f"{row['plain_pps_per_core']:.0f} pps/core plain UDP sender",
                     f"{row['ratio']:.2f} (goal {ROCE_MIN_PPS_RATIO:g})"])
    if "goodput" in roce:
        g = roce["goodput"]
        rows.append(["one RoCE QP on 127.0.0.1", f"{g['goodput_mbit']:.0f} Mbit/s",
                     f"data verified: {g['data_verified']}", ""])
    if "error" in roce:
        rows.append(["RoCE engine", "failed", roce["error"], ""])
    return rows


def print_bench(result: dict) -> None:
    print_rows(bench_rows(result), title=f"testbed bench {result['run_id']}")
