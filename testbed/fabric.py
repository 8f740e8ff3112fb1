"""Bring a Fabric description to life: OVS switches, Mininet hosts, shaped links, a controller.

This is the thin layer that applies the plain data of testbed.topology and
controllers.routing to the machine. ``FabricNetwork`` is a context manager: everything it
creates is written to the run ledger before it exists, and leaving the ``with`` block (normally,
by exception or by Ctrl-C) tears it all down.

Userspace-datapath notes (see PLATFORM.md): OVS forwards in ``ovs-vswitchd`` when the kernel
module is missing; checksum and segmentation offloads must be off on every veth end or TCP
stalls on unfinished partial checksums; jumbo frames cut the per-packet cost.
"""
from __future__ import annotations

import subprocess
import time
from dataclasses import dataclass
from functools import partial
from pathlib import Path

from testbed import ovs
from testbed.controller import ControllerProcess
from testbed.errors import TestbedError
from testbed.state import (Ledger, kill_processes, netns_inode, process_start_ticks,
                           processes_in_netns)
from testbed.topology.base import Fabric

BUFFER_HANDLE = "10:"  # the per-port drop-tail buffer's tc handle
OFFLOADS_OFF = ["tx", "off", "rx", "off", "tso", "off", "gso", "off", "gro", "off"]


def mininet_topo(fabric: Fabric):
    """A Mininet Topo with the fabric's names, ports, DPIDs, addresses and link rates."""
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


def default_buffer_bytes(rate_mbit: float, mtu_bytes: int) -> int:
    """Egress buffer of a port: 50 ms at the link rate, and never under 8 full frames."""
    return max(8 * mtu_bytes, int(rate_mbit * 1e6 / 8 * 0.050))


def queue_command(intf: str, buffer_bytes: int) -> list[str]:
    """Drop-tail byte buffer under the HTB rate class Mininet's TCLink makes (class 5:1)."""
    return ["tc", "qdisc", "replace", "dev", intf, "parent", "5:1", "handle", BUFFER_HANDLE,
            "bfifo", "limit", str(buffer_bytes)]


def qdisc_drops(tc_json: str) -> int:
    """Packets dropped by the link buffers in ``tc -s -j qdisc show`` output (the HTB parent
    repeats its children's drops, so only the buffers themselves are counted)."""
    import json

    return sum(q.get("drops", 0) for q in json.loads(tc_json or "[]")
               if q.get("handle") == BUFFER_HANDLE)


def host_setup_commands(intf: str, mtu_bytes: int) -> str:
    """Shell line run once in each host: MTU, offloads off, no IPv6 chatter."""
    return (f"ip link set dev {intf} mtu {mtu_bytes} && "
            f"ethtool -K {intf} {' '.join(OFFLOADS_OFF)} >/dev/null 2>&1; "
            "sysctl -qw net.ipv6.conf.all.disable_ipv6=1 net.ipv6.conf.default.disable_ipv6=1")


@dataclass
class Timings:
    build_s: float = 0.0
    start_s: float = 0.0
    programmed_s: float = 0.0
    stop_s: float = 0.0


class FabricNetwork:
    """A running emulation of ``fabric``; use as ``with FabricNetwork(...) as net:``."""

    def __init__(self, fabric: Fabric, workdir: Path, ledger: Ledger, datapath: str = "user",
                 routing: str = "ecmp", log=print):
        self.fabric = fabric
        self.workdir = workdir
        self.ledger = ledger
        self.datapath = datapath
        self.routing = routing
        self.log = log
        self.net = None
        self.controller: ControllerProcess | None = None
        self.timings = Timings()

    # -- bring-up ---------------------------------------------------------------------------
    def __enter__(self) -> FabricNetwork:
        try:
            self._start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def _start(self) -> None:
        from mininet.link import TCLink
        from mininet.log import setLogLevel
        from mininet.net import Mininet
        from mininet.node import OVSSwitch, RemoteController

        setLogLevel("critical")  # tc's HTB quantum notices are not errors; results are checked
        if not ovs.is_running():
            self.ledger.ovs_started = True
            self.ledger.save()
            self.log("starting Open vSwitch")
            ovs.start()
        fabric_json = self.workdir / "fabric.json"
        self.fabric.dump_json(fabric_json)
        self.ledger.add_names(bridges=[s.name for s in self.fabric.switches],
                              interfaces=self.fabric.interface_names())

        self.controller = ControllerProcess(fabric_json, self.workdir, routing=self.routing)
        self.ledger.add_process(self.controller.start())

        t0 = time.monotonic()
        switch = partial(OVSSwitch, datapath=self.datapath, protocols="OpenFlow13",
                         failMode="secure")
        self.net = Mininet(topo=mininet_topo(self.fabric), switch=switch, link=TCLink,
                           controller=None, autoSetMacs=False, waitConnected=False, build=False)
        self.net.addController(RemoteController("c0", ip="127.0.0.1", port=self.controller.port))
        self.net.build()
        for node in self.mininet_nodes():
            self.ledger.add_process(node.pid)
        for host in self.net.hosts:
            self.ledger.add_netns(host.pid)
        self._configure_interfaces()
        self.timings.build_s = time.monotonic() - t0

        t0 = time.monotonic()
        self.net.start()
        self._configure_queues()  # after start: OVS start-up re-applies Mininet's tc config
        self.timings.start_s = time.monotonic() - t0
        switches = {s.name for s in self.fabric.switches}
        self.timings.programmed_s = self.controller.wait_programmed(switches)

    def _configure_interfaces(self) -> None:
        """Jumbo MTU and offloads off on both ends of every link, before OVS opens the ports."""
        mtu = str(self.fabric.mtu_bytes)
        for host in self.net.hosts:
            host.cmd(host_setup_commands(host.defaultIntf().name, self.fabric.mtu_bytes))
        for sw in self.net.switches:
            for intf in sw.intfList():
                if intf.name == "lo":
                    continue
                subprocess.run(["ip", "link", "set", "dev", intf.name, "mtu", mtu], check=True)
                subprocess.run(["ethtool", "-K", intf.name, *OFFLOADS_OFF], capture_output=True)

    def _configure_queues(self) -> None:
        """An explicit byte buffer at both ends of every link, sized from the link rate."""
        for link in self.fabric.links:
            if link.rate_mbit is None:
                continue  # unshaped: the interface keeps its default queue
            buffer_bytes = default_buffer_bytes(link.rate_mbit, self.fabric.mtu_bytes)
            for end, node in ((0, link.a), (1, link.b)):
                argv = queue_command(link.intf(end), buffer_bytes)
                if self.fabric.nodes[node].is_host:
                    self.net.get(node).cmd(*argv)
                else:
                    subprocess.run(argv, check=True, capture_output=True)

    def queue_drops(self) -> int:
        """Packets dropped so far by the emulated egress queues, hosts and switches."""
        root = subprocess.run(["tc", "-s", "-j", "qdisc", "show"], capture_output=True, text=True)
        total = qdisc_drops(root.stdout)
        for host in self.net.hosts:
            total += qdisc_drops(host.cmd("tc", "-s", "-j", "qdisc", "show"))
        return total

    def mininet_nodes(self) -> list:
        """Every Mininet node; each has a shell process (the controller entry too)."""
        return self.net.hosts + self.net.switches + self.net.controllers

    # -- use --------------------------------------------------------------------------------
    def host(self, name: str):
        return self.net.get(name)

    def popen(self, host: str, argv: list[str], **kwargs) -> subprocess.Popen:
        """Start a process inside a host's namespace, recorded in the ledger."""
        proc = self.net.get(host).popen(argv, **kwargs)
        self.ledger.add_process(proc.pid)
        return proc

    def ping_all(self, timeout_s: int = 2) -> tuple[int, int]:
        """Ping every ordered host pair once; returns (sent, received)."""
        hosts = self.net.hosts
        ips = [h.IP() for h in hosts]
        sent = received = 0
        for h in hosts:
            targets = [ip for ip in ips if ip != h.IP()]
            # All targets of one source at once; each ping prints one status line.
            script = " & ".join(f"ping -c1 -W{timeout_s} -q {ip} >/dev/null 2>&1 && echo ok {ip}"
                                for ip in targets) + " & wait"
            out = h.cmd(script)
            sent += len(targets)
            received += sum(1 for line in out.splitlines() if line.startswith("ok "))
        return sent, received

    # -- tear-down --------------------------------------------------------------------------
    def stop(self) -> None:
        t0 = time.monotonic()
        if self.net is not None:
            # End what the hosts' commands left running (servers, daemons) before the hosts
            # go; the hosts' own shells stay for Mininet to stop.
            inodes = {netns_inode(h.pid) for h in self.net.hosts} - {None}
            shells = {h.pid for h in self.net.hosts}
            kill_processes({pid: ticks for pid, ticks in processes_in_netns(inodes).items()
                            if pid not in shells}, self.log)
            nodes = {n.pid: process_start_ticks(n.pid) for n in self.mininet_nodes()}
            try:
                self.net.stop()
            except Exception as exc:  # keep tearing down; the ledger sweep below finishes it
                self.log(f"mininet stop: {exc}")
            # Mininet signals the node shells and moves on; wait until they have exited.
            kill_processes({pid: t for pid, t in nodes.items() if t is not None}, self.log)
            self.net = None
        if self.controller is not None:
            self.controller.stop()
            self.controller = None
        self.timings.stop_s = time.monotonic() - t0


def check_root() -> None:
    import os

    if os.geteuid() != 0:
        raise TestbedError("this needs root (network namespaces, OVS): run it with sudo")
