"""Bring a Fabric description to life: OVS switches, Mininet hosts, shaped links, a controller.

This is the thin layer that applies plain data to the machine. The pure functions below turn
the fabric description into plans (each host's set-up script, the root namespace's tc batch,
one OVS transaction); ``FabricNetwork`` applies them in as few steps as possible:

- hosts are Mininet hosts (a shell in its own network namespace), started together;
- links are veth pairs made over netlink (pyroute2), the host end created directly inside
  the host's namespace, never one ``ip`` process per interface;
- every host configures its end (address, MTU, offloads, HTB rate, byte buffer) in one
  command, all hosts in parallel;
- all bridges, ports and controller settings are one ``ovs-vsctl`` transaction, and only then
  do the switch ends get their tc, from one ``tc -batch`` (OVS clears the root qdisc of a
  port it takes over).

``FabricNetwork`` is a context manager: everything it creates is written to the run ledger
before it exists, and leaving the ``with`` block (normally, by exception or by Ctrl-C) tears it
all down. Userspace-datapath notes (PLATFORM.md): OVS forwards in ``ovs-vswitchd`` when the
kernel module is missing; checksum and segmentation offloads must be off on every veth end
or TCP stalls on unfinished partial checksums; jumbo frames cut the per-packet cost.
"""
from __future__ import annotations

import json
import os
import subprocess
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from testbed import ovs
from testbed.controller import ControllerProcess
from testbed.errors import TestbedError
from testbed.state import (Ledger, kill_processes, netns_inode, process_start_ticks,
                           processes_in_netns)
from testbed.topology.base import Fabric

BUFFER_HANDLE = "10:"  # the per-port drop-tail buffer's tc handle
OFFLOADS_OFF = ["tx", "off", "rx", "off", "tso", "off", "gso", "off", "gro", "off"]
OVS_TIMEOUT_S = 120
# Interface group of every root-namespace veth end a run makes: one netlink request then
# deletes them all in a single batched unregister instead of one RCU wait per interface.
LINK_GROUP = 0x7E57
PING_WAVE_HOSTS = 16  # hosts probing at once: all-pairs pings must not outrun the datapath
# Buffers of the packet sockets OVS's userspace datapath uses. Receive (one per port): the
# kernel default (~13 jumbo frames) overflows whenever ovs-vswitchd is descheduled for a few
# tens of ms on a busy 2-core machine. Send (one socket for all ports, opened on the first
# packet sent): every frame waiting in any port's egress queue is charged to it, so with the
# default 208 KiB, congested switch queues make the kernel refuse frames before they reach
# the emulated queue (measured: 3.6% of a dragonfly ring's packets, uncounted anywhere).
PORT_SOCKET_BUFFER_BYTES = 16 * 1024 * 1024
SOCKET_DEFAULTS = ("/proc/sys/net/core/rmem_default", "/proc/sys/net/core/wmem_default")


@contextmanager
def socket_buffer_defaults(nbytes: int):
    """Raise the default socket buffers while OVS opens its sockets, then restore them."""
    old = {}
    for path in SOCKET_DEFAULTS:
        with open(path) as fh:
            old[path] = fh.read().strip()
    try:
        for path in SOCKET_DEFAULTS:
            with open(path, "w") as fh:
                fh.write(str(nbytes))
        yield
    finally:
        for path, value in old.items():
            with open(path, "w") as fh:
                fh.write(value)


# -- plans: pure functions of the description ------------------------------------------------

def default_buffer_bytes(rate_mbit: float, mtu_bytes: int) -> int:
    """Egress buffer of a port: 50 ms at the link rate, and never under 8 full frames."""
    return max(8 * mtu_bytes, int(rate_mbit * 1e6 / 8 * 0.050))


def shaping_commands(intf: str, rate_mbit: float | None, mtu_bytes: int) -> list[str]:
    """tc commands (without the leading ``tc``) giving ``intf`` an HTB rate and a byte-sized
    drop-tail buffer; none for an unshaped link."""
    if rate_mbit is None:
        return []
    burst = 2 * mtu_bytes
    quantum = mtu_bytes + 64  # at least one frame per round, so jumbo frames are not starved
    return [
        f"qdisc replace dev {intf} root handle 5: htb default 1",
        f"class replace dev {intf} parent 5: classid 5:1 htb rate {rate_mbit}mbit "
        f"burst {burst} cburst {burst} quantum {quantum}",
        f"qdisc replace dev {intf} parent 5:1 handle {BUFFER_HANDLE} bfifo "
        f"limit {default_buffer_bytes(rate_mbit, mtu_bytes)}",
    ]


def qdisc_drops(tc_json: str) -> int:
    """Packets dropped by the link buffers in ``tc -s -j qdisc show`` output (the HTB parent
    repeats its children's drops, so only the buffers themselves are counted)."""
    return sum(q.get("drops", 0) for q in json.loads(tc_json or "[]")
               if q.get("handle") == BUFFER_HANDLE)


def host_script(fabric: Fabric, host: str) -> str:
    """Everything one host does to its end of its link, as a shell script."""
    node = fabric.nodes[host]
    link, end = fabric.host_link(host)
    intf = link.intf(end)
    # Static ARP for every other host (Mininet's --arp): the fabric never floods, and a large
    # fabric's first packets do not all queue at the controller at once.
    neighbours = "\n".join(f"neigh replace {h.ip} lladdr {h.mac} dev {intf} nud permanent"
                           for h in fabric.hosts if h.name != host)
    lines = [
        "set -e",
        "ip link set lo up",
        f"ip link set dev {intf} address {node.mac}",
        f"ip addr add {node.ip}/8 dev {intf}",
        f"ip link set dev {intf} mtu {fabric.mtu_bytes}",
        f"ethtool -K {intf} {' '.join(OFFLOADS_OFF)} >/dev/null 2>&1 || true",
        "sysctl -qw net.ipv6.conf.all.disable_ipv6=1 net.ipv6.conf.default.disable_ipv6=1",
        f"ip link set dev {intf} up",
        f"ip -batch - <<'EOF'\n{neighbours}\nEOF" if neighbours else "",
        *(f"tc {cmd}" for cmd in shaping_commands(intf, link.rate_mbit, fabric.mtu_bytes)),
    ]
    return "\n".join(line for line in lines if line) + "\n"


def switch_tc_batch(fabric: Fabric) -> str:
    """``tc -batch`` input shaping every switch-side interface (root namespace)."""
    lines = [cmd for _, _, intf, link in fabric.switch_ends()
             for cmd in shaping_commands(intf, link.rate_mbit, fabric.mtu_bytes)]
    return "\n".join(lines) + "\n"


def ovs_transaction(fabric: Fabric, datapath_type: str, controller_port: int) -> list[str]:
    """One ``ovs-vsctl`` argument list creating every bridge, port and controller setting."""
    ports: dict[str, list[tuple[int, str]]] = {s.name: [] for s in fabric.switches}
    for switch, port, intf, _ in fabric.switch_ends():
        ports[switch].append((port, intf))
    args: list[str] = []
    for sw in fabric.switches:
        args += ["--", "--if-exists", "del-br", sw.name, "--", "add-br", sw.name,
                 "--", "set", "bridge", sw.name, f"datapath_type={datapath_type}",
                 "protocols=OpenFlow13", "fail_mode=secure",
                 f"other-config:datapath-id={sw.dpid:016x}", f"other-config:dp-desc={sw.name}",
                 "other-config:disable-in-band=true",
                 "--", "set-controller", sw.name, f"tcp:127.0.0.1:{controller_port}"]
        for port, intf in sorted(ports[sw.name]):
            args += ["--", "add-port", sw.name, intf,
                     "--", "set", "interface", intf, f"ofport_request={port}"]
    return args[1:]  # drop the leading "--"


@dataclass
class Timings:
    build_s: float = 0.0
    start_s: float = 0.0
    programmed_s: float = 0.0
    stop_s: float = 0.0


# -- apply ----------------------------------------------------------------------------------

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
        self.hosts: dict[str, object] = {}  # name -> mininet.node.Host
        self.controller: ControllerProcess | None = None
        self.timings = Timings()

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
        self._start_hosts()
        self._create_links()
        self._configure_hosts()
        self._disable_switch_offloads()
        self.timings.build_s = time.monotonic() - t0

        t0 = time.monotonic()
        datapath_type = "netdev" if self.datapath == "user" else "system"
        with socket_buffer_defaults(PORT_SOCKET_BUFFER_BYTES):
            out = subprocess.run(["ovs-vsctl", f"--timeout={OVS_TIMEOUT_S}",
                                  *ovs_transaction(self.fabric, datapath_type,
                                                   self.controller.port)],
                                 capture_output=True, text=True)
            if out.returncode != 0:
                raise TestbedError("ovs-vsctl could not create the switches: "
                                   f"{out.stderr.strip()[-300:]}")
            self._shape_switch_ends()  # after OVS: taking a port over clears its root qdisc
            self.timings.start_s = time.monotonic() - t0
            switches = {s.name for s in self.fabric.switches}
            self.timings.programmed_s = self.controller.wait_programmed(switches)
            self._first_packet()

    def _first_packet(self) -> None:
        """One ping across the fabric, so the datapath opens its send socket now."""
        a, b = self.fabric.hosts[0], self.fabric.hosts[-1]
        self.hosts[a.name].cmd("ping", "-c1", "-W2", b.ip)

    def _start_hosts(self) -> None:
        from mininet.node import Host

        for node in self.fabric.hosts:
            host = Host(node.name)
            self.hosts[node.name] = host
            self.ledger.processes[host.pid] = process_start_ticks(host.pid)
            self.ledger.add_netns(host.pid)  # also saves the ledger

    def _create_links(self) -> None:
        """veth pairs over netlink; a host's end is born inside the host's namespace."""
        from pyroute2 import IPRoute

        with IPRoute() as ipr:
            for link in self.fabric.links:
                ends = [(link.intf(0), link.a), (link.intf(1), link.b)]
                if self.fabric.nodes[link.a].is_host:
                    ends.reverse()  # the root-namespace end is created, its peer is moved
                (root_intf, _), (peer_intf, peer_node) = ends
                peer = {"ifname": peer_intf}
                if self.fabric.nodes[peer_node].is_host:
                    peer["net_ns_pid"] = self.hosts[peer_node].pid
                ipr.link("add", ifname=root_intf, kind="veth", peer=peer)
            for name in self.root_interfaces():
                ipr.link("set", index=ipr.link_lookup(ifname=name)[0],
                         mtu=self.fabric.mtu_bytes, group=LINK_GROUP, state="up")

    def root_interfaces(self) -> list[str]:
        """Interfaces in the root namespace: the switch ends of every link."""
        return [intf for _, _, intf, _ in self.fabric.switch_ends()]

    def _configure_hosts(self) -> None:
        """Every host runs its set-up script; all hosts at once. Scripts go through files:
        a host shell reads commands from a terminal, whose lines are capped at 4 KiB."""
        scripts = self.workdir / "host-setup"
        scripts.mkdir(exist_ok=True)
        for name, host in self.hosts.items():
            path = scripts / f"{name}.sh"
            path.write_text(host_script(self.fabric, name))
            host.sendCmd(f"sh {path}; echo rc=$?")
        failed = []
        for name, host in self.hosts.items():
            out = host.waitOutput()
            if "rc=0" not in out:
                failed.append(f"{name}: {out.strip()[-200:]}")
        if failed:
            raise TestbedError(f"host set-up failed on {len(failed)} hosts; first: {failed[0]}")

    def _disable_switch_offloads(self) -> None:
        """Offloads off on every switch end: one ethtool per port, all in parallel."""
        script = ('for i in "$@"; do ethtool -K "$i" ' + " ".join(OFFLOADS_OFF) +
                  ' >/dev/null 2>&1 & done; wait')
        subprocess.run(["sh", "-c", script, "sh", *self.root_interfaces()], check=True)

    def _shape_switch_ends(self) -> None:
        """Rates and buffers on every switch end, from one ``tc -batch``."""
        out = subprocess.run(["tc", "-batch", "-"], input=switch_tc_batch(self.fabric),
                             capture_output=True, text=True)
        if out.returncode != 0:
            raise TestbedError(f"tc could not shape the switch ports: {out.stderr.strip()[-300:]}")

    # -- use --------------------------------------------------------------------------------
    def host(self, name: str):
        return self.hosts[name]

    def popen(self, host: str, argv: list[str], **kwargs) -> subprocess.Popen:
        """Start a process inside a host's namespace, recorded in the ledger."""
        proc = self.hosts[host].popen(argv, **kwargs)
        self.ledger.add_process(proc.pid)
        return proc

    def ping_all(self, timeout_ms: int = 1000, retries: int = 3) -> tuple[int, int]:
        """Every host pings every other (fping), a wave of hosts at a time; returns
        (pairs tried, pairs that answered)."""
        ips = [h.ip for h in self.fabric.hosts]
        nodes = self.fabric.hosts
        sent = received = 0
        for first in range(0, len(nodes), PING_WAVE_HOSTS):
            wave = nodes[first:first + PING_WAVE_HOSTS]
            for node in wave:
                targets = " ".join(ip for ip in ips if ip != node.ip)
                self.hosts[node.name].sendCmd(f"fping -a -q -r {retries} -t {timeout_ms} {targets}")
            for node in wave:
                out = self.hosts[node.name].waitOutput()
                sent += len(ips) - 1
                received += sum(1 for line in out.split() if line in ips)
        return sent, received

    def queue_drops(self) -> int:
        """Packets dropped so far by the emulated egress queues, hosts and switches."""
        total = self.switch_counters()["queue_drops"]
        for host in self.hosts.values():
            total += qdisc_drops(host.cmd("tc", "-s", "-j", "qdisc", "show"))
        return total

    def switch_counters(self) -> dict[str, int]:
        """Packets received and sent by all switch ports, and dropped by their egress queues:
        the inputs of the packet-conservation check (testbed.fidelity.emulator_losses)."""
        totals = {"rx_packets": 0, "tx_packets": 0}
        for name in self.root_interfaces():
            for key in totals:
                with open(f"/sys/class/net/{name}/statistics/{key}") as fh:
                    totals[key] += int(fh.read())
        root = subprocess.run(["tc", "-s", "-j", "qdisc", "show"], capture_output=True, text=True)
        totals["queue_drops"] = qdisc_drops(root.stdout)
        return totals

    # -- tear-down --------------------------------------------------------------------------
    def stop(self) -> None:
        """Remove everything this network created; safe to call at any point of bring-up."""
        t0 = time.monotonic()
        shells = {h.pid: process_start_ticks(h.pid) for h in self.hosts.values()}
        inodes = {netns_inode(pid) for pid in shells} - {None}
        # Hosts first, with whatever their commands left running: their namespaces then take
        # the host links along, in one batch per namespace.
        kill_processes({pid: t for pid, t in processes_in_netns(inodes).items()
                        if pid not in shells}, self.log)
        for host in self.hosts.values():
            host.terminate()
        kill_processes({pid: t for pid, t in shells.items() if t is not None}, self.log)
        self.hosts = {}
        self._delete_root_interfaces()
        present = set(ovs.list_bridges()) if ovs.is_running() else set()
        ovs.delete_bridges([s.name for s in self.fabric.switches if s.name in present])
        if self.controller is not None:
            self.controller.stop()
            self.controller = None
        self.timings.stop_s = time.monotonic() - t0

    def _delete_root_interfaces(self) -> None:
        """Delete the switch ends (and with them their peers): the whole link group in one
        request when it holds only ours, else one by one."""
        from pyroute2 import IPRoute
        from pyroute2.netlink.exceptions import NetlinkError

        ours = set(self.root_interfaces())
        with IPRoute() as ipr:
            grouped = {link.get_attr("IFLA_IFNAME") for link in ipr.get_links()
                       if link.get_attr("IFLA_GROUP") == LINK_GROUP}
            if grouped and grouped <= ours:
                ipr.link("del", group=LINK_GROUP)
            for name in ours:
                found = ipr.link_lookup(ifname=name)
                if found:
                    try:
                        ipr.link("del", index=found[0])
                    except NetlinkError:
                        pass  # its peer went first and took it along


def check_root() -> None:
    if os.geteuid() != 0:
        raise TestbedError("this needs root (network namespaces, OVS): run it with sudo")
