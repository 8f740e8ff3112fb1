"""How big a fabric this machine can emulate: a guard the run layer calls before it builds
anything, so an oversized topology fails in a second instead of after minutes of bring-up.

The limits are estimates scaled from measurements on the reference machine (2 cores, 24 GiB,
plain Mininet, OVS userspace datapath; see the platform notes): a k=8 fat-tree (128 hosts,
384 links = 768 veth ends) builds and starts in about 104 s, most of it one process per
interface, so bring-up time grows with the interface count. The defaults allow twice the
measured host count and about 2.6 times its interfaces (roughly 4-5 minutes of bring-up);
beyond that set-up dominates a run and the CPU-bound forwarding budget, shared by every hop
of every packet, would make results untrustworthy.
"""
from __future__ import annotations

from testbed.errors import ConfigError
from testbed.topology.base import Fabric

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
