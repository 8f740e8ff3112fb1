"""How big a fabric this machine can emulate: a guard the run layer calls before it builds
anything, so an oversized topology fails in a second instead of after minutes of bring-up.

The limits are estimates scaled from measurements on the reference machine (2 cores, 24 GiB,
OVS userspace datapath): the testbed brings a k=8 fat-tree (128 hosts, 384 links = 768 veth
ends) up in about 12 s and proves all 16256 host pairs reachable in 11 s more, and bring-up
grows with the interface count. The defaults allow twice the measured host count and about
2.6 times its interfaces; beyond that the CPU-bound forwarding budget, shared by every hop of
every packet, leaves no room for traffic worth measuring.
"""
from __future__ import annotations

from testbed.errors import ConfigError
from testbed.model.topology.base import Fabric

MAX_HOSTS = 256          # 2 x the 128 hosts of the measured k=8 fat-tree
MAX_VETH_ENDS = 2000     # interfaces (2 per link); the k=8 fat-tree has 768


def needs(fabric: Fabric) -> tuple[int, int]:
    """(hosts, interfaces) the fabric takes: one namespace per host, two veth ends per link."""
    return len(fabric.hosts), 2 * len(fabric.links)


def check_fits(fabric: Fabric, max_interfaces: int = MAX_VETH_ENDS,
               max_hosts: int = MAX_HOSTS) -> None:
    """Raise ConfigError("topology", ...) when the fabric exceeds either estimate."""
    hosts, interfaces = needs(fabric)
    if hosts > max_hosts or interfaces > max_interfaces:
        raise ConfigError("topology", f"{fabric.kind} {fabric.params} needs {hosts} hosts / "
                          f"{interfaces} interfaces; this machine holds about {max_hosts} hosts "
                          f"/ {max_interfaces} interfaces (estimate)")
