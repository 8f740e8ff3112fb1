"""Bring a Fabric description to life: OVS switches, Mininet hosts, shaped links, a controller.

This is the thin layer that applies plain data to the machine. The pure functions below turn
the fabric description into plans (each host's set-up script, the root namespace's tc batch,
one OVS transaction); ``FabricNetwork`` applies them in as few steps as possible:

- hosts are Mininet hosts (a shell in its own network namespace), started together;
- links are veth pairs made over netlink (pyroute2), the host end created directly inside
  the host's namespace, never one ``ip`` process per interface;
- every host configures its end (address, MTU, offloads, and its port's whole queue plan,
  ``testbed.plan.port_queue``) in one command, all hosts in parallel; that end is then
  registered as the host's Mininet ``Intf`` (without touching it again), so ``IP()``,
  ``MAC()``, ``defaultIntf()``, ``intfNames()``, ``cmd()`` and ``popen()`` answer as on any
  Mininet host;
- every switch end's whole queue plan (rate, buffer or class queues, ECN marking,
  impairment) is one ``tc -batch`` for all of them (and, on the eBPF marking path, one
  ``bpftool batch`` filling the marker's maps); all bridges, ports and controller settings
  are one ``ovs-vsctl`` transaction (ports with the ``linux-noop`` QoS, so OVS keeps the
  qdiscs);
- with the userspace datapath the switches live in the run's own ovs-vswitchd
  (testbed.apply.ovs.PrivateSwitchd), so tear-down is stopping two daemons and one netlink request
  for every interface (veth ends and bridge taps share the run's link group).

``FabricNetwork`` is a context manager: everything it creates is written to the run ledger
before it exists, and leaving the ``with`` block (normally, by exception or by Ctrl-C) tears it
all down. Userspace-datapath notes (docs/platforms.md): OVS forwards in ``ovs-vswitchd`` when the
kernel module is missing; checksum and segmentation offloads must be off on every veth end
or TCP stalls on unfinished partial checksums; jumbo frames cut the per-packet cost.
"""
from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from testbed.apply import ovs
from testbed.apply.backlogs import PortBacklogs, shaped_ports
from testbed.apply.controller import ControllerProcess
from testbed.apply.loss import LinkLoss
from testbed.apply.marking import EcnMarking, machine_ecn_path, read_ifindex
from testbed.apply.modules import fabric_modules, load_modules
from testbed.apply.pfc_runtime import PauseAgentProcess, pfc_totals
from testbed.apply.state import (
    STATE_DIR,
    Ledger,
    kill_processes,
    netns_inode,
    process_cmdline,
    process_start_ticks,
    processes_in_netns,
)
from testbed.capabilities import ECN_PATH_RED
from testbed.errors import TestbedError, UsageError
from testbed.model.topology.base import Fabric
from testbed.plan.bring_up import (
    HOST_PREFIX_LEN,
    fping_argv,
    host_script,
    link_ends,
    link_interfaces,
    machine_resolvers,
    ovs_transaction,
    setup_command,
)
from testbed.plan.loss_plan import Cut, Loss, loss_counters_total
from testbed.plan.port_queue import Impairment, impairment_change_argv, switch_queue_plan
from testbed.plan.profiles import QueueConfig
from testbed.plan.settings import SYSCTL_TCP_CC, queue_record
from testbed.plan.shards import CpuLayout, cpu_layout, partition, shard_count
from testbed.system import counters
from testbed.system.process import run_tool
from testbed.system.sockets import read_listening_ports

OVS_TIMEOUT_S = 120
DRAIN_TIMEOUT_S = 5.0  # after traffic stops, for paused queues to empty (wait_switches_drained)
DRAIN_POLL_S = 0.05
# Interface group of every root-namespace veth end a run makes: one netlink request then
# deletes them all in a single batched unregister instead of one RCU wait per interface.
LINK_GROUP = 0x7E57
HOST_START_THREADS = 16
RESOLV_CONF = "/etc/resolv.conf"  # hosts share the machine's mount namespace, so its file
HOST_PORT = 0  # a host's only interface is its port 0, eth0, as in Mininet
# Feature names (ethtool -k) that testbed.plan.bring_up.OFFLOADS_OFF turns off: checksums,
# segmentation, GRO.
OFFLOAD_FEATURE_PREFIXES = ("tx-checksum", "rx-checksum", "tx-tcp", "tx-udp-segmentation",
                            "tx-generic-segmentation", "rx-gro")
# Buffers of the packet sockets OVS's userspace datapath uses. Receive (one per port): the
# kernel default (~13 jumbo frames) overflows whenever ovs-vswitchd is descheduled for a few
# tens of ms on a busy 2-core machine. Send (one socket for all ports, opened on the first
# packet sent): every frame waiting in any port's egress queue is charged to it, so with the
# default 208 KiB, congested switch queues make the kernel refuse frames before they reach
# the emulated queue (measured: 3.6% of a dragonfly ring's packets, uncounted anywhere).
PORT_SOCKET_BUFFER_BYTES = 16 * 1024 * 1024
SOCKET_DEFAULTS = ("/proc/sys/net/core/rmem_default", "/proc/sys/net/core/wmem_default")
ALLOWED_CC = "/proc/sys/net/ipv4/tcp_allowed_congestion_control"
# Expedited RCU grace periods while the fabric comes up and goes down. Binding and closing a
# packet socket (one per OVS port) and moving or deleting an interface each wait for an RCU
# grace period (synchronize_net); normal grace periods cost tens of ms each on these
# machines, so a k=8 fat-tree's 256 ports cost seconds. Restored before any workload runs.
FAST_RCU = {"/sys/kernel/rcu_expedited": "1"}
# IPv6 off on every interface the bring-up creates in the root namespace (switch ends, and a
# kernel datapath's bridge ports): new interfaces take the namespace's default. Left on, the
# root namespace's own stack sends router solicitations, MLD reports and DAD probes out of
# the switch ports into the emulated fabric: on a stock kernel 7 of 340 packets of a ping
# test, sent by a switch port that never received them, which packet conservation then
# reads as the switches making packets. (The hosts turn IPv6 off in their own namespaces.)
ROOT_IPV6_DEFAULT = "/proc/sys/net/ipv6/conf/default/disable_ipv6"


def bring_up_settings() -> dict[str, str]:
    """Kernel settings held while the fabric comes up (restored after): fast RCU, and IPv6
    off for the interfaces it creates where the kernel has IPv6."""
    settings = dict(FAST_RCU)
    if os.path.exists(ROOT_IPV6_DEFAULT):
        settings[ROOT_IPV6_DEFAULT] = "1"
    return settings


# Every root-namespace kernel setting a fabric changes for a while (and puts back).
ROOT_SETTINGS = (*FAST_RCU, ROOT_IPV6_DEFAULT, *SOCKET_DEFAULTS, ALLOWED_CC)
# A program a failure schedule may stop or kill in a host -> what its command line holds.
HOST_PROGRAMS = {"traffic": "testbed.traffic.", "iperf3": "iperf3"}


def allowed_congestion_control(host_sysctls: dict[str, str]) -> dict[str, str]:
    """The root namespace's allowed list with the hosts' congestion control added, while the
    hosts set it: a network namespace other than the first may only make an *allowed*
    algorithm its default (the kernel answers EPERM, seen as an I/O error, otherwise)."""
    wanted = host_sysctls.get(SYSCTL_TCP_CC)
    if wanted is None:
        return {}
    allowed = Path(ALLOWED_CC).read_text().split()
    return {} if wanted in allowed else {ALLOWED_CC: " ".join([*allowed, wanted])}


def available_cpus() -> list[int]:
    """The CPUs this process may run on (its affinity: a cpuset or container may narrow it)."""
    return sorted(os.sched_getaffinity(0))


def socket_buffer_settings(nbytes: int) -> dict[str, str]:
    """Default socket buffers of ``nbytes``: raised while OVS opens its port sockets."""
    return {path: str(nbytes) for path in SOCKET_DEFAULTS}


@dataclass
class Timings:
    """Seconds spent: building (hosts, links, switches, configuration, all overlapped),
    then waiting until the controller has programmed every switch, and tearing down."""

    build_s: float = 0.0
    programmed_s: float = 0.0
    stop_s: float = 0.0


# -- apply ----------------------------------------------------------------------------------

class FabricNetwork:
    """A running emulation of ``fabric``; use as ``with FabricNetwork(...) as net:``. Once up it
    is a testbed.system.running.RunningFabric, the interface experiments, the drivers and
    measurement use; the rest (hosts, switchd, controller, marking, pfc) is for the harness
    and the interactive tools on this machine."""

    def __init__(self, fabric: Fabric, workdir: Path, ledger: Ledger, datapath: str = "user",
                 routing: str = "ecmp", log=print, queue: QueueConfig | None = None,
                 ecn_path: str | None = None, host_sysctls: dict[str, str] | None = None,
                 impairments: Mapping[str, Impairment] | None = None,
                 losses: Sequence[tuple[Cut, Loss]] = (), userspace_tso: bool = False,
                 switchd_shards: int | None = None, pin_cpus: bool = True,
                 min_host_cpus: int = 1):
        """``queue``: the queue every shaped switch port gets (buffer or class queues, ECN
        marking) on ``ecn_path`` (as decided by the caller; None: this machine's choice,
        decided here once); ``host_sysctls``: set in every host; ``impairments``: interface
        -> Impairment (``testbed.plan.port_queue.link_impairments``), switch and host ends
        alike; ``losses``: link directions lost by the eBPF loss program instead of netem
        (``testbed.plan.loss_plan``: where each is cut, and how it loses); ``userspace_tso``:
        the userspace datapath passes segmentation-offloaded packets
        (testbed.apply.ovs.PrivateSwitchd), so every veth end keeps its checksum and
        segmentation offloads instead of turning them off; ``switchd_shards``: how many
        ovs-vswitchd processes share the switches (userspace datapath; None: as
        testbed.plan.shards.shard_count decides for this machine); ``pin_cpus``: give the
        ovs-vswitchd processes CPUs of their own and the hosts the rest
        (testbed.plan.shards.cpu_layout) when that leaves the hosts ``min_host_cpus`` or
        more, or leave every placement to the scheduler."""
        self.fabric = fabric
        user, cpus = datapath == "user", available_cpus()
        self.switchd_shards = (shard_count(len(fabric.switch_ends()), len(cpus), switchd_shards)
                               if user else 1)
        self.cpu_layout = (cpu_layout(cpus, self.switchd_shards, min_host_cpus)
                           if user and pin_cpus else CpuLayout())
        self.pin_cpus, self.min_host_cpus = pin_cpus, min_host_cpus
        self.workdir = workdir
        self.ledger = ledger
        self.datapath = datapath
        self.routing = routing
        self.log = log
        self.hosts: dict[str, object] = {}  # name -> mininet.node.Host
        self.controller: ControllerProcess | None = None
        self.userspace_tso = userspace_tso and datapath == "user"
        self.switchd: ovs.Switchd = (ovs.PrivateSwitchd(ledger, STATE_DIR / "ovs", log=log,
                                                        userspace_tso=self.userspace_tso,
                                                        cpus=self.cpu_layout.switchd_cpus)
                                     if datapath == "user" else ovs.SystemSwitchd(ledger, log))
        self.timings = Timings()
        self.host_sysctls = dict(host_sysctls or {})
        self.queue = queue
        self.impairments = dict(impairments or {})
        self.ecn_path = None if queue is None else ecn_path or machine_ecn_path()
        self.marking = (EcnMarking(fabric, queue, ledger, self.ecn_path, log=log,
                                   workdir=workdir)
                        if queue is not None else None)
        self.loss = None
        if losses:
            self.loss = LinkLoss(losses, ledger, self.pid, log=log)
        self.pfc = (PauseAgentProcess(fabric, queue, workdir, ledger, routing=routing,
                                      log=log)
                    if queue is not None and queue.pfc is not None else None)
        self.shaped_ports = shaped_ports(fabric)
        # packets lost to links and switches the run cut, per failure window (monotonic s)
        self._failure_losses: list[dict] = []
        self._failures_open: set[tuple] = set()
        self._failure_since: tuple[float, dict] | None = None
        self._backlogs: PortBacklogs | None = None  # opened on first use

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
        self.workdir.mkdir(parents=True, exist_ok=True)
        load_modules(self.kernel_modules(), self.log)
        fabric_json = self.workdir / "fabric.json"
        self.fabric.dump_json(fabric_json)
        self.ledger.add_names(interfaces=self.fabric.interface_names())
        with self.ledger.kernel_settings(bring_up_settings()):
            self.switchd.start(self.workdir, self.switch_groups)
            # The controller imports while the hosts and links are made; OVS needs it later.
            self.controller = ControllerProcess(fabric_json, self.workdir, routing=self.routing)
            self.ledger.add_process(self.controller.launch())

            t0 = time.monotonic()
            self._start_hosts()
            self._create_links()
            self.controller.wait_listening()
            with self.ledger.kernel_settings(socket_buffer_settings(PORT_SOCKET_BUFFER_BYTES)):
                # --no-wait: ovs-vswitchd builds the switches and the controller programs them
                # while the hosts and ports are configured here; wait_programmed joins them.
                self.switchd.configure(lambda switches, datapath_type: ovs_transaction(
                    self.fabric, datapath_type, self.controller.port, switches), OVS_TIMEOUT_S)
                self._configure_hosts()
                self._register_host_interfaces()
                if not self.offloads_on:
                    self._disable_switch_offloads()
                self._queue_switch_ports()
                if self.loss is not None:
                    self.loss.apply()  # after the queues: its filter goes before the marker's
                if self.marking is not None:  # the ECN anchor agent, where ports mark by eBPF
                    self.marking.start_anchoring(self.cpu_layout.host_cpus, self.impairments)
                if self.pfc is not None:
                    self.pfc.start({name: host.pid for name, host in self.hosts.items()},
                                   self.cpu_layout.host_cpus)
                self.timings.build_s = time.monotonic() - t0
                self.timings.programmed_s = self.controller.wait_programmed(set(self.bridges))
                self._group_bridge_taps()
                self._first_packet()

    def _first_packet(self) -> None:
        """One ping across the fabric, so the datapath opens its send socket now."""
        a, b = self.fabric.hosts[0], self.fabric.hosts[-1]
        self.hosts[a.name].cmd("ping", "-c1", "-W2", b.ip)

    def kernel_modules(self) -> list[str]:
        """The kernel modules this fabric's paths need (testbed.apply.modules)."""
        return fabric_modules(kernel_datapath=self.datapath != "user",
                              red_marking=self.marking is not None
                              and self.ecn_path == ECN_PATH_RED,
                              netem=bool(self.impairments),
                              congestion=self.host_sysctls.get(SYSCTL_TCP_CC))

    @property
    def offloads_on(self) -> bool:
        """Whether veth ends keep their offloads: only when the userspace datapath passes
        offloaded packets; otherwise partial checksums would leave it unfinished and TCP
        would stall."""
        return self.userspace_tso

    @property
    def bridges(self) -> list[str]:
        return [s.name for s in self.fabric.switches]

    @property
    def switch_groups(self) -> list[list[str]]:
        """The bridges of each ovs-vswitchd (testbed.plan.shards): one group unless the
        userspace datapath spreads the switches over several processes."""
        if self.switchd_shards <= 1:  # always so for the kernel datapath
            return [self.bridges]
        ports = {name: 0 for name in self.bridges}
        for switch, _, _, _ in self.fabric.switch_ends():
            ports[switch] += 1
        return partition(ports, self.switchd_shards)

    def _group_bridge_taps(self) -> None:
        """Put the bridges' own tap devices (userspace datapath) into the run's link group."""
        from pyroute2 import IPRoute

        with IPRoute() as ipr:
            for tap in self.switchd.taps():
                found = ipr.link_lookup(ifname=tap)
                if found:
                    ipr.link("set", index=found[0], group=LINK_GROUP)

    def _start_hosts(self) -> None:
        """One Mininet host (a shell in a new network namespace) per fabric host, started
        by a pool of threads: each start is two round trips to a new shell."""
        from mininet.node import Host

        def start(name: str):
            host = Host(name)
            self.hosts[name] = host
            return host

        with ThreadPoolExecutor(HOST_START_THREADS) as pool:
            futures = [pool.submit(start, node.name) for node in self.fabric.hosts]
            for future in futures:
                host = future.result()
                self.ledger.processes[host.pid] = process_start_ticks(host.pid)
                if self.cpu_layout.host_cpus:  # and so every command its shell runs
                    os.sched_setaffinity(host.pid, self.cpu_layout.host_cpus)
        for host in self.hosts.values():
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
                # Root-namespace ends are born with their MTU and in the run's link group, and
                # then all come up with one request for the whole group. Host ends get their
                # MTU and come up in the host's own script.
                peer = {"ifname": peer_intf}
                if self.fabric.nodes[peer_node].is_host:
                    peer["net_ns_pid"] = self.hosts[peer_node].pid
                else:
                    peer.update(mtu=self.fabric.mtu_bytes, group=LINK_GROUP)
                ipr.link("add", ifname=root_intf, kind="veth", peer=peer,
                         mtu=self.fabric.mtu_bytes, group=LINK_GROUP)
            ipr.link("set", index=0, group=LINK_GROUP, state="up")

    def pid(self, name: str) -> int:
        """The PID of a host's shell, whose namespaces the host's processes share."""
        return self.hosts[name].pid

    def root_interfaces(self) -> list[str]:
        """Interfaces in the root namespace: the switch ends of every link."""
        return [intf for _, _, intf, _ in self.fabric.switch_ends()]

    def _configure_hosts(self) -> None:
        """Every host runs its set-up script; all hosts at once. Scripts go through files:
        a host shell reads commands from a terminal, whose lines are capped at 4 KiB."""
        scripts = self.workdir / "host-setup"
        scripts.mkdir(exist_ok=True)
        failed = []
        try:
            resolvers = machine_resolvers(Path(RESOLV_CONF).read_text())
        except OSError:
            resolvers = []
        with self.ledger.kernel_settings(allowed_congestion_control(self.host_sysctls)):
            for name, host in self.hosts.items():
                path = scripts / f"{name}.sh"
                path.write_text(host_script(self.fabric, name, self.host_sysctls, self.queue,
                                            self.impairments, self.offloads_on,
                                            self.cpu_layout.host_cpus_mask, resolvers))
                host.sendCmd(setup_command(path))
            for name, host in self.hosts.items():
                out = host.waitOutput()
                if "rc=0" not in out:
                    failed.append(f"{name}: {out.strip()[-200:]}")
        if failed:
            raise TestbedError(f"host set-up failed on {len(failed)} hosts; first: {failed[0]}")

    def _register_host_interfaces(self) -> None:
        """Each host's configured eth0 as its Mininet Intf (``register_host_interface``)."""
        for node in self.fabric.hosts:
            link, end = self.fabric.host_link(node.name)
            register_host_interface(self.hosts[node.name], link.intf(end), node.ip, node.mac)

    def _disable_switch_offloads(self) -> None:
        """Offloads off on every switch end (what ``ethtool -K`` with OFFLOADS_OFF does), over
        the ethtool ioctl from this process: about a millisecond per port."""
        from pyroute2.ethtool import Ethtool

        ethtool = Ethtool()
        try:
            for name in self.root_interfaces():
                features = ethtool.get_features(name)
                for feature, state in features.features.items():
                    if feature.startswith(OFFLOAD_FEATURE_PREFIXES):
                        state.enable = False
                ethtool.set_features(name, features)
        finally:
            ethtool.close()

    def _queue_switch_ports(self) -> None:
        """Every switch end's whole queue (``testbed.plan.port_queue``) from one ``tc -batch``,
        then, on the eBPF marking path, the marker's map entries from one ``bpftool batch``."""
        plan = switch_queue_plan(self.fabric, self.queue, self.ecn_path, self.impairments,
                                 read_ifindex if self.marking is not None else None)
        if self.marking is not None:
            self.marking.prepare(plan.ports)  # before tc pins the marker's maps
        if plan.tc:
            run_tool(["tc", "-batch", "-"], plan.tc_batch(), "tc could not queue the switch ports")
        if plan.bpftool:
            run_tool(["bpftool", "batch", "file", "-"], plan.bpftool_batch(),
                     "bpftool could not configure the ECN marker's ports")
        if self.marking is not None:
            self.log(f"queues on {len(plan.ports)} switch ports by {self.ecn_path}: "
                     f"{queue_record(self.queue)}")

    # -- use --------------------------------------------------------------------------------
    def host(self, name: str):
        return self.hosts[name]

    def link_interfaces(self, a: str, b: str) -> list[str]:
        """The root-namespace interfaces of the link between nodes ``a`` and ``b``."""
        return link_interfaces(self.fabric, a, b)

    def set_link(self, a: str, b: str, up: bool) -> float:
        """Take the link between ``a`` and ``b`` down or up (its root-namespace ends: the
        switches see the port change, as on a cut cable); returns the monotonic time just
        before."""
        key = ("link", *sorted((a, b)))
        if not up:
            self._failure_starts(key)
        t = time.monotonic()
        set_interfaces(self.link_interfaces(a, b), up)
        if up:
            self._failure_healed(key)
        return t

    def set_switch(self, name: str, up: bool) -> float:
        """Fail a switch or bring it back: every one of its ports down (or up), and its
        OpenFlow connection dropped (or restored), as a switch that dies and reboots does."""
        key = ("switch", name)
        if not up:
            self._failure_starts(key)
        t = time.monotonic()
        intfs = [intf for switch, _, intf, _ in self.fabric.switch_ends() if switch == name]
        if up:
            set_interfaces(intfs, True)
            self.switchd.vsctl(["set-controller", name,
                                f"tcp:127.0.0.1:{self.controller.port}"], bridge=name)
            self._failure_healed(key)
        else:
            self.switchd.vsctl(["del-controller", name], bridge=name)
            set_interfaces(intfs, False)
        return t

    def _failure_starts(self, key: tuple) -> None:
        """Before the first of overlapping failures: the switches' counters, so that what
        the failures lose can be told apart from what the emulator loses."""
        if not self._failures_open:
            self._failure_since = (time.monotonic(), self.switch_counters())
        self._failures_open.add(key)

    def _failure_healed(self, key: tuple) -> None:
        """When the last open failure heals: the packets the switches received and neither
        sent nor dropped in a queue meanwhile were lost to the cut links and switches (sent
        to a port that was down: a real switch loses them too), recorded in
        ``failure_losses``."""
        self._failures_open.discard(key)
        if self._failures_open or self._failure_since is None:
            return
        start, before = self._failure_since
        after = self.switch_counters()
        change = {k: after[k] - before[k] for k in after}
        lost = max(0, change["rx_packets"] - change["tx_packets"] - change["queue_drops"]
                   - change["impairment_drops"])
        self._failure_losses.append({"start_s": start, "end_s": time.monotonic(),
                                    "lost_packets": lost})
        self._failure_since = None

    def failure_losses(self) -> list[dict]:
        """Packets lost to the links and switches the run cut, one record per window of
        overlapping failures (start_s, end_s, lost_packets; see ``_failure_healed``)."""
        return list(self._failure_losses)

    def restart_controller(self) -> float:
        """Stop the controller and start a new one on the same port and files; returns the
        seconds until it had programmed every switch again."""
        old = self.controller
        old.stop()
        new = ControllerProcess(old.fabric_json, self.workdir, port=old.port,
                                routing=old.routing)
        self.ledger.add_process(new.start())
        self.controller = new
        return new.wait_programmed(set(self.bridges))

    def impair_link(self, a: str, b: str, impairment: Impairment | None) -> float:
        """Start a scheduled impairment of the link between ``a`` and ``b`` (both directions),
        or end it (None: back to what the scenario's own impairments set there), on ports
        the bring-up prepared for it: netem's settings changed in place (its queue below
        kept), or the loss program's configuration; returns the monotonic time just before."""
        t = time.monotonic()
        ends = link_ends(self.fabric, a, b)
        if all(intf in self.impairments for intf, _, _ in ends):
            for intf, host, rate_mbit in ends:
                argv = impairment_change_argv(intf, rate_mbit, impairment or self.impairments[intf])
                run_tool(self.in_namespace(host, argv), what=f"tc could not change {intf}'s netem")
        elif self.loss is not None and self.loss.has([intf for intf, _, _ in ends]):
            loss = None if impairment is None else Loss(impairment.loss_percent / 100)
            self.loss.set_loss([intf for intf, _, _ in ends], loss)
        else:
            raise TestbedError(f"the link {a}-{b} was not prepared for an impairment")
        return t

    def in_namespace(self, host: str | None, argv: list[str]) -> list[str]:
        """``argv`` run in ``host``'s network namespace (None: the root namespace)."""
        return argv if host is None else ["nsenter", f"--net=/proc/{self.pid(host)}/ns/net", *argv]

    def daemon_pids(self, daemon: str, host: str | None = None) -> list[int]:
        """The live processes of ``daemon``: the controller, the run's own ovs-vswitchd, the
        pause agent, or a program of HOST_PROGRAMS running in ``host``."""
        if daemon == "controller":
            proc = self.controller.proc if self.controller is not None else None
            return [proc.pid] if proc is not None and proc.poll() is None else []
        if daemon == "ovs-vswitchd":
            if self.datapath != "user":
                raise TestbedError("ovs-vswitchd is the machine's Open vSwitch here (kernel "
                                   "datapath): only the run's own may be stopped or killed")
            return list(self.switchd.pids)
        if daemon == "pause-agent":
            if self.pfc is None:
                raise TestbedError("this fabric runs no pause agent (its queue has no PFC)")
            return [self.pfc.pid] if self.pfc.alive() else []
        shell = self.pid(host)
        return sorted(pid for pid in processes_in_netns({netns_inode(shell)})
                      if pid != shell and HOST_PROGRAMS[daemon] in process_cmdline(pid))

    def signal_daemon(self, daemon: str, host: str | None, sig: int) -> tuple[float, list[int]]:
        """Send ``sig`` to every process of a daemon (``daemon_pids``); the monotonic time
        just before, and the PIDs. None found is an error naming the daemon."""
        pids = self.daemon_pids(daemon, host)
        if not pids:
            raise TestbedError(f"no {daemon} process{' in ' + host if host else ''} to signal")
        t = time.monotonic()
        for pid in pids:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        return t, pids

    def vital_daemons(self) -> list[tuple[str, subprocess.Popen]]:
        """The processes a workload cannot go on without (testbed.apply.watchdog): the run's
        own ovs-vswitchd, and the pause agent where the queues are lossless."""
        vital = [("ovs-vswitchd", proc) for proc in self.switchd.forwarders()]
        if self.pfc is not None and self.pfc.proc is not None:
            vital.append((self.pfc.title, self.pfc.proc))
        return vital

    def host_processes(self) -> dict[int, int]:
        """Every process in a host's namespace but the hosts' shells (what their commands
        started): PID -> start ticks."""
        shells = {h.pid for h in self.hosts.values()}
        inodes = {netns_inode(pid) for pid in shells} - {None}
        return {pid: t for pid, t in processes_in_netns(inodes).items() if pid not in shells}

    def end_workload(self) -> None:
        """Kill everything the hosts run (ranks, flows, servers), keeping the hosts."""
        kill_processes(self.host_processes(), self.log)

    def popen(self, host: str, argv: list[str], **kwargs) -> subprocess.Popen:
        """Start a process inside a host's namespace, recorded in the ledger."""
        if self.cpu_layout.host_cpus:  # off the forwarding CPUs (testbed.plan.shards)
            argv = ["taskset", "-c", ",".join(map(str, self.cpu_layout.host_cpus)), *argv]
        proc = self.hosts[host].popen(argv, **kwargs)
        self.ledger.add_process(proc.pid)
        return proc

    def cmd(self, host: str, *args: object) -> str:
        """Run a command line in ``host``'s shell to its end; its output."""
        return self.hosts[host].cmd(*args)

    def listening_ports(self, host: str) -> set[int]:
        """The TCP ports listening in ``host`` now (testbed.system.sockets)."""
        return read_listening_ports(self.pid(host))

    def netns(self, host: str) -> str:
        """The path of ``host``'s network namespace (its shell's)."""
        return f"/proc/{self.pid(host)}/ns/net"

    def set_interface(self, intf: str, up: bool) -> float:
        """``ip link set intf up|down`` on a switch port; returns the monotonic time just
        before (the failover measures time the controller's reaction from it)."""
        t = time.monotonic()
        subprocess.run(["ip", "link", "set", intf, "up" if up else "down"], check=True)
        return t

    def ping_all(self, timeout_ms: int = 1000, retries: int = 3) -> tuple[int, int]:
        """Prove every pair of hosts reachable, both ways; returns (probes, answered).

        Each host pings the next half of the host list (cyclically): an answered echo proves
        the route there and the route back, so n*(n-1)/2 probes, about, cover all n*(n-1)
        ordered pairs. All hosts probe at once, paced (fping -i) so that the fabric-wide
        probe rate stays within PROBE_RATE_PPS (testbed.plan.bring_up): above it the userspace
        datapath, busy with each new flow's first packet, loses probes and fping's retries cost
        whole seconds."""
        hosts = self.fabric.hosts
        ips = [h.ip for h in hosts]
        reach = len(hosts) // 2
        targets = {}
        for i, node in enumerate(hosts):
            targets[node.name] = [ips[(i + d) % len(hosts)] for d in range(1, reach + 1)]
            if not targets[node.name]:
                continue
            self.hosts[node.name].sendCmd(*fping_argv(targets[node.name], len(hosts),
                                                      timeout_ms, retries))
        sent = received = 0
        for node in hosts:
            if not targets[node.name]:
                continue
            alive = set(self.hosts[node.name].waitOutput().split())
            sent += len(targets[node.name])
            received += len(alive & set(targets[node.name]))
        return sent, received

    def queue_drops(self) -> int:
        """Packets dropped so far by the emulated egress queues, hosts and switches."""
        total = self.switch_counters()["queue_drops"]
        for host in self.hosts.values():
            total += counters.queue_drops(counters.read_host_qdiscs(host))
        return total

    def port_backlogs(self) -> dict[str, int]:
        """Bytes queued now at every shaped egress port, by the link direction it sends on
        (``src->dst``), read from the kernel's qdiscs (``testbed.apply.backlogs``)."""
        if self._backlogs is None:
            self._backlogs = PortBacklogs(self.shaped_ports,
                                          lambda host: f"/proc/{self.pid(host)}/ns/net")
        return self._backlogs.read()

    def marker_backlogs(self) -> dict[str, int]:
        """What the eBPF ECN marker believes is queued now at every switch port it marks,
        by link direction; empty where no eBPF marker marks (no queue, the RED path, or a
        queue without ECN)."""
        if self.marking is None or not self.marking.models_queue:
            return {}
        by_intf = {p.intf: p.label for p in self.shaped_ports}
        return {by_intf[intf]: depth for intf, depth in self.marking.queue_depths().items()}

    def paused_spans(self, t0_monotonic: float,
                     t1_monotonic: float) -> dict[str, list[tuple[float, float]]]:
        """When each egress port's lossless class was paused by PFC within the interval
        (CLOCK_MONOTONIC spans), by link direction; only ports that were paused."""
        if self.pfc is None:
            return {}
        by_intf = {p.intf: p.label for p in self.shaped_ports}
        return {by_intf[intf]: spans for intf, spans in
                self.pfc.paused_spans(t0_monotonic, t1_monotonic).items() if intf in by_intf}

    def empty_spans(self, t0_monotonic: float,
                    t1_monotonic: float) -> dict[str, list[tuple[float, float]]]:
        """When each egress port's lossless queues read empty within the interval (the pause
        agent's samples), by link direction; empty without PFC."""
        if self.pfc is None:
            return {}
        by_intf = {p.intf: p.label for p in self.shaped_ports}
        return {by_intf[intf]: spans for intf, spans in
                self.pfc.empty_spans(t0_monotonic, t1_monotonic).items() if intf in by_intf}

    def pause_events(self) -> list[dict]:
        """The pause agent's events so far (testbed.apply.pfc_runtime.PfcRuntime.events);
        empty without PFC."""
        return self.pfc.events() if self.pfc is not None else []

    def port_queue_drops(self) -> dict[str, int]:
        """Packets each switch port's egress queue dropped so far, by interface."""
        return counters.port_queue_drops(counters.read_qdiscs(), self.root_interfaces())

    def marked_ports(self) -> list[str]:
        """The switch ports whose queues the marking covers, by interface."""
        return [p.intf for p in self.marking.ports] if self.marking is not None else []

    def ecn_counters(self) -> dict[str, dict]:
        """Every marked port's counters so far (testbed.system.counters.port_counters)."""
        return self.marking.counters() if self.marking is not None else {}

    def marker_depths(self) -> dict[str, int]:
        """Every marked port's queue in bytes now as the marking sees it: the eBPF marker's
        model, or the RED qdisc's backlog (testbed.apply.marking.EcnMarking.queue_depths)."""
        return self.marking.queue_depths() if self.marking is not None else {}

    def ecn_anchoring(self) -> dict | None:
        """How the eBPF marker's anchoring went (testbed.apply.marking.EcnMarking.anchoring)."""
        return self.marking.anchoring() if self.marking is not None else None

    @property
    def lossless(self) -> bool:
        """Whether the queues run PFC on a lossless class (a pause agent runs)."""
        return self.pfc is not None

    def pause_counters(self) -> dict[str, dict]:
        """The pause agent's counters so far, by interface (empty without PFC)."""
        return self.pfc.counters().get("interfaces", {}) if self.pfc is not None else {}

    def pause_agent_running(self) -> bool:
        return self.pfc is not None and self.pfc.alive()

    def emulator_processes(self) -> dict[str, list[int]]:
        """The processes emulating this fabric, by name: ovs-vswitchd, and the pause agent
        and the ECN anchor agent where they run."""
        processes = {"ovs-vswitchd": list(self.switchd.pids)}
        if self.pfc is not None and self.pfc.proc is not None:
            processes["pause agent"] = [self.pfc.proc.pid]
        anchor_pids = self.marking.anchor_pids if self.marking is not None else []
        if anchor_pids:
            processes["ECN anchor agent"] = list(anchor_pids)
        return processes

    def pfc_summary(self) -> dict:
        """PFC so far: pause frames sent and received, time paused, storms (from the pause
        agent) and drops in the lossless queues, switches and hosts (which must stay 0)."""
        if self.pfc is None:
            raise TestbedError("this fabric runs without PFC (its queue has no pfc thresholds)")
        summary = pfc_totals(self.pfc.counters())
        drops = counters.lossless_drops(counters.read_qdiscs(), self.queue)
        for host in self.hosts.values():
            drops += counters.lossless_drops(counters.read_host_qdiscs(host), self.queue)
        summary["lossless_drops"] = drops
        summary["agent_running"] = self.pfc.alive()
        return summary

    def wait_switches_drained(self, timeout_s: float = DRAIN_TIMEOUT_S) -> int:
        """Wait until the switches' egress buffers are empty (a paused queue can hold its
        packets for a while after the traffic stops), at most ``timeout_s``; returns the
        packets still queued. Read before ``switch_counters``, so that packets in flight do
        not count as lost in packet conservation."""
        deadline = time.monotonic() + timeout_s
        while True:
            queued = counters.queued_packets(counters.read_qdiscs())
            if queued == 0 or time.monotonic() >= deadline:
                return queued
            time.sleep(DRAIN_POLL_S)

    def switch_counters(self) -> dict[str, int]:
        """Packets received and sent by all switch ports, dropped by their egress queues and
        by impairments: the inputs of the packet-conservation check
        (testbed.measure.fidelity.emulator_losses; ``counters.switch_totals``)."""
        totals = counters.switch_totals(counters.read_interface_counters(self.root_interfaces()),
                                        counters.read_qdiscs())
        totals["impairment_drops"] += self.loss_counters()["dropped"]
        return totals

    def lose(self, losses: Sequence[tuple[Cut, Loss]]) -> None:
        """Start losing packets on a running fabric: ``losses`` as for the constructor, by
        the eBPF loss program; once per fabric (its counters then count from here)."""
        if self.loss is not None:
            raise TestbedError("this fabric already loses packets by the eBPF loss program")
        self.loss = LinkLoss(losses, self.ledger, self.pid, log=self.log)
        self.loss.apply()

    def loss_counters(self) -> dict:
        """What the eBPF loss program did so far: packets it applied to and dropped, in
        total and per interface (zeros without it)."""
        per_intf = self.loss.counters() if self.loss is not None else {}
        return {**loss_counters_total(per_intf), "interfaces": per_intf}

    # -- tear-down --------------------------------------------------------------------------
    def stop(self) -> None:
        """Remove everything this network created; safe to call at any point of bring-up."""
        t0 = time.monotonic()
        with self.ledger.kernel_settings(FAST_RCU):
            self._tear_down()
        self.timings.stop_s = time.monotonic() - t0

    def _tear_down(self) -> None:
        if self._backlogs is not None:  # its sockets keep the hosts' namespaces alive
            self._backlogs.close()
            self._backlogs = None
        if self.pfc is not None:
            self.pfc.stop()  # first: its sockets in the hosts' namespaces keep them alive
        if self.marking is not None:
            self.marking.remove()  # its anchor agent reads the ports' queues: before they go
        shells = {h.pid: process_start_ticks(h.pid) for h in self.hosts.values()}
        # Hosts first, with whatever their commands left running: their namespaces then take
        # the host links along, in one batch per namespace.
        self.end_workload()
        for host in self.hosts.values():
            host.terminate()
        kill_processes({pid: t for pid, t in shells.items() if t is not None}, self.log)
        self.hosts = {}
        self.switchd.stop()
        if self.loss is not None:
            self.loss.remove()
        self._delete_root_interfaces()
        if self.controller is not None:
            self.controller.stop()
            self.controller = None

    def _delete_root_interfaces(self) -> None:
        """Delete the switch ends (and with them their peers) and any bridge taps left by a
        stopped private ovs-vswitchd: the whole link group in one request when it holds only
        ours, else one by one."""
        from pyroute2 import IPRoute
        from pyroute2.netlink.exceptions import NetlinkError

        ours = set(self.root_interfaces()) | set(self.switchd.taps())
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


def register_host_interface(host, intf: str, ip: str, mac: str):
    """Make ``intf``, already in ``host``'s namespace and configured by its set-up script, the
    host's Mininet interface (port 0) without creating, moving or configuring it again: Mininet
    then answers ``host.IP()``, ``MAC()``, ``defaultIntf()`` and ``intfNames()`` from it, as for
    an interface it made itself. Returns the mininet.link.Intf."""
    from mininet.link import Intf

    # moveIntfFn: the interface was born in the namespace; up=None: it is up already (Intf
    # would otherwise run ifconfig), and no ip/mac given to Intf, which would set them again.
    registered = Intf(intf, node=host, port=HOST_PORT, moveIntfFn=_born_in_namespace, up=None)
    registered.ip, registered.prefixLen, registered.mac = ip, HOST_PREFIX_LEN, mac
    return registered


def _born_in_namespace(intf: str, node) -> None:
    """Mininet's moveIntfFn for an interface created inside the node's namespace: no move."""


def set_interfaces(intfs: list[str], up: bool) -> None:
    """Root-namespace interfaces administratively up or down, over netlink."""
    from pyroute2 import IPRoute

    with IPRoute() as ipr:
        for intf in intfs:
            found = ipr.link_lookup(ifname=intf)
            if not found:
                raise TestbedError(f"no interface {intf}: is the fabric up?")
            ipr.link("set", index=found[0], state="up" if up else "down")


def check_root() -> None:
    """Refuse a user who is not root, before anything is made (exit status 2)."""
    if os.geteuid() != 0:
        raise UsageError("this needs root (network namespaces, OVS): run it with sudo")
