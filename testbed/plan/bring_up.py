"""What bringing a fabric up runs, as plain data: each host's set-up script (address, MTU,
offloads, static ARP, its NIC's queue plan), the one ``ovs-vsctl`` transaction that makes every
bridge and port, the reachability probe's command line, and a link's interfaces (those in the
root namespace, or both ends with the namespace that holds each). ``testbed.apply.network.FabricNetwork`` applies them."""
from __future__ import annotations

import ipaddress
import math
import shlex
from collections.abc import Mapping, Sequence
from pathlib import Path

from testbed.errors import TestbedError
from testbed.model.topology.base import Fabric, Link
from testbed.plan.port_queue import Impairment, gso_max_bytes, host_queue, port_plan
from testbed.plan.profiles import QueueConfig
from testbed.plan.settings import sysctl_lines

OFFLOADS_OFF = ["tx", "off", "rx", "off", "tso", "off", "gso", "off", "gro", "off"]
PROBE_RATE_PPS = 4000  # fabric-wide reachability probes per second (see ping_all)
HOST_PREFIX_LEN = 8  # every host address is in 10.0.0.0/8 (testbed.model.topology.base)


def host_script(fabric: Fabric, host: str, sysctls: dict[str, str] | None = None,
                queue: QueueConfig | None = None,
                impairments: Mapping[str, Impairment] | None = None,
                offloads_on: bool = False, rx_cpus_mask: str | None = None,
                unreachable_ips: Sequence[str] = ()) -> str:
    """Everything one host does to its end of its link, as a shell script of three processes
    (``ip -batch``, ``ethtool``, ``tc -batch``): a k=8 fat-tree's 128 hosts run theirs at once.
    ``sysctls`` (e.g. TCP congestion control and ECN) are set in the host's own namespace,
    so they go away with it. Its NIC's queue is the port plan of ``queue`` at the link's rate
    (class queues only with traffic classes, ``port_queue.host_queue``; no marking), the link's
    impairment from ``impairments`` (interface -> Impairment). Its offloads are turned off
    unless ``offloads_on`` (the datapath passes offloaded packets); then its GSO packets are
    kept to about a millisecond of its link (``port_queue.gso_max_bytes``), and since only
    hosts make them, so is every packet on the fabric. ``rx_cpus_mask``: the CPUs its NIC
    steers receive processing to (RPS, ``shards.CpuLayout``), written through a sysfs
    mounted in a private mount namespace: the machine's /sys shows the root namespace's
    interfaces, not the host's. ``unreachable_ips``: addresses outside the fabric the host
    must never look for on its link (the machine's DNS resolvers, ``machine_resolvers``):
    routed as unreachable, a lookup fails at once instead of sending ARP requests into the
    fabric that no one answers."""
    node = fabric.nodes[host]
    fabric_ips = {h.ip for h in fabric.hosts}
    link, end = fabric.host_link(host)
    intf = link.intf(end)
    # Static ARP for every other host (Mininet's --arp): the fabric never floods, and a large
    # fabric's first packets do not all queue at the controller at once.
    ip_batch = [
        "link set lo up",
        f"link set dev {intf} address {node.mac} mtu {fabric.mtu_bytes}",
        f"addr add {node.ip}/{HOST_PREFIX_LEN} dev {intf}",
        *(f"route add unreachable {ip}/32" for ip in unreachable_ips if ip not in fabric_ips),
        *([f"link set dev {intf} gso_max_size {gso_max_bytes(link.rate_mbit, fabric.mtu_bytes)}"]
          if offloads_on else []),
        f"link set dev {intf} up",
        *(f"neigh replace {h.ip} lladdr {h.mac} dev {intf} nud permanent"
          for h in fabric.hosts if h.name != host),
    ]
    tc_batch = port_plan(intf, link.rate_mbit, fabric.mtu_bytes, host_queue(queue),
                         impairment=(impairments or {}).get(intf)).tc
    lines = [
        "set -e",
        # IPv6 off before the link comes up: no DAD or router solicitations on the fabric.
        "echo 1 > /proc/sys/net/ipv6/conf/all/disable_ipv6",
        "echo 1 > /proc/sys/net/ipv6/conf/default/disable_ipv6",
        *sysctl_lines(sysctls or {}),
        "ip -batch - <<'EOF'", *ip_batch, "EOF",
        *([] if offloads_on else
          [f"ethtool -K {intf} {' '.join(OFFLOADS_OFF)} >/dev/null 2>&1 || true"]),
        *(["tc -batch - <<'EOF'", *tc_batch, "EOF"] if tc_batch else []),
        *([f"unshare -m sh -c 'umount -l /sys && mount -t sysfs sysfs /sys && echo "
           f"{rx_cpus_mask} > /sys/class/net/{intf}/queues/rx-0/rps_cpus'"]
          if rx_cpus_mask else []),
    ]
    return "\n".join(lines) + "\n"


def machine_resolvers(resolv_conf: str) -> list[str]:
    """The IPv4 name servers of a resolv.conf text: programs in a host's namespace read the
    machine's resolv.conf, and would look for these on the fabric."""
    out = []
    for line in resolv_conf.splitlines():
        fields = line.split()
        if len(fields) >= 2 and fields[0] == "nameserver":
            try:
                address = ipaddress.ip_address(fields[1])
            except ValueError:
                continue
            if address.version == 4:
                out.append(str(address))
    return out


def setup_command(script: Path) -> str:
    """The line a host's shell runs for its set-up ``script``: the path quoted, so that no
    character of a results folder's name is read by the shell."""
    return f"sh {shlex.quote(str(script))}; echo rc=$?"


def ovs_transaction(fabric: Fabric, datapath_type: str, controller_port: int,
                    switches: Sequence[str] | None = None) -> list[str]:
    """One ``ovs-vsctl`` argument list creating every bridge of ``switches`` (None: all),
    with its ports and controller setting.

    Every port gets the ``linux-noop`` QoS: OVS then leaves the port's qdiscs alone. Without
    it, OVS deletes the root qdisc of each port it takes over, and the shaping could only
    be applied after OVS had finished, not while the fabric is being built."""
    ports: dict[str, list[tuple[int, str]]] = {s.name: [] for s in fabric.switches}
    for switch, port, intf, _ in fabric.switch_ends():
        ports[switch].append((port, intf))
    args: list[str] = ["--", "--id=@noop", "create", "qos", "type=linux-noop"]
    chosen = None if switches is None else set(switches)
    for sw in fabric.switches:
        if chosen is not None and sw.name not in chosen:
            continue
        args += ["--", "--if-exists", "del-br", sw.name, "--", "add-br", sw.name,
                 "--", "set", "bridge", sw.name, f"datapath_type={datapath_type}",
                 "protocols=OpenFlow13", "fail_mode=secure",
                 f"other-config:datapath-id={sw.dpid:016x}", f"other-config:dp-desc={sw.name}",
                 "other-config:disable-in-band=true",
                 "--", "set-controller", sw.name, f"tcp:127.0.0.1:{controller_port}"]
        for port, intf in sorted(ports[sw.name]):
            args += ["--", "add-port", sw.name, intf, "qos=@noop",
                     "--", "set", "interface", intf, f"ofport_request={port}"]
    return args[1:]  # drop the leading "--"


def fping_argv(targets: list[str], probing_hosts: int, timeout_ms: int = 1000,
               retries: int = 3) -> list[str]:
    """One host's fping of ``targets``, printing the ones that answered, paced so that
    ``probing_hosts`` probing at once stay within PROBE_RATE_PPS fabric-wide."""
    interval_ms = max(1, math.ceil(probing_hosts * 1000 / PROBE_RATE_PPS))
    return ["fping", "-a", "-q", "-i", str(interval_ms), "-r", str(retries), "-t",
            str(timeout_ms), *targets]


def root_ends(fabric: Fabric, link: Link) -> list[str]:
    """The root-namespace interfaces of ``link``: both ends of a switch-to-switch link, the
    switch's end of a host link."""
    return [link.intf(end) for end, node in enumerate((link.a, link.b))
            if not fabric.nodes[node].is_host]


def link_interfaces(fabric: Fabric, a: str, b: str) -> list[str]:
    """The root-namespace interfaces of the (first) link between nodes ``a`` and ``b``."""
    for link in fabric.links:
        if {link.a, link.b} == {a, b}:
            return root_ends(fabric, link)
    raise TestbedError(f"{a} and {b} are not cabled together")


def link_ends(fabric: Fabric, a: str, b: str) -> list[tuple[str, str | None, float | None]]:
    """Both ends of the link between ``a`` and ``b``: (interface, the host whose namespace
    holds it or None for the root namespace, the link's rate)."""
    for link in fabric.links:
        if {link.a, link.b} == {a, b}:
            return [(link.intf(end), node if fabric.nodes[node].is_host else None, link.rate_mbit)
                    for end, node in enumerate((link.a, link.b))]
    raise TestbedError(f"{a} and {b} are not cabled together")
