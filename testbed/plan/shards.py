"""How a fabric's switches are spread over several ovs-vswitchd processes (userspace datapath).

Without the kernel module, each ovs-vswitchd forwards every packet in its main thread, and
every pass of that thread's loop polls every port and every bridge's listening socket it
owns: the cost of a pass grows with the switches a process holds, and one process uses one
core at most. Splitting the switches over ``shards`` processes makes each pass cheaper and
lets the forwarding use more than one core. Which switches go together does not matter to
the packets (a link between shards is a veth like any other); what matters is that the
shards carry equal work, so switches are dealt out by port count, busiest first.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

PORTS_PER_SHARD_MIN = 16   # fewer ports than this per process: one process polls them cheaply
SHARDS_MAX = 4             # above this, processes outnumber the cores of machines this targets


def shard_count(ports: int, cpus: int, requested: int | None = None) -> int:
    """How many ovs-vswitchd processes a fabric of ``ports`` switch ports gets on a machine
    of ``cpus`` CPUs: ``requested`` if given, else one per two CPUs (each process keeps a CPU
    to itself and the hosts get as many: testbed.plan.shards.cpu_layout) while every
    process keeps at least PORTS_PER_SHARD_MIN ports, at most SHARDS_MAX; never more than
    one per port. (On 2 CPUs, two processes left the hosts no CPU of their own: the machine
    ran at 99% busy and the fidelity verdict rejected every run; docs/capacity.md.)"""
    if requested is not None:
        if requested < 1:
            raise ValueError(f"switchd_shards must be at least 1, not {requested}")
        return max(1, min(requested, ports))
    return max(1, min(cpus // 2, SHARDS_MAX, ports // PORTS_PER_SHARD_MIN))


def partition(ports_by_switch: Mapping[str, int], shards: int) -> list[list[str]]:
    """The switches of each shard: the busiest switch first, each to the shard with the
    fewest ports so far (ties: the lower shard), keeping each shard's switches in the given
    order. Every shard gets at least one switch when there are enough."""
    shards = max(1, min(shards, len(ports_by_switch)))
    order = {name: i for i, name in enumerate(ports_by_switch)}
    load = [0] * shards
    members: list[list[str]] = [[] for _ in range(shards)]
    for name in sorted(ports_by_switch, key=lambda n: (-ports_by_switch[n], order[n])):
        target = min(range(shards), key=lambda s: (load[s], s))
        load[target] += ports_by_switch[name]
        members[target].append(name)
    return [sorted(m, key=order.__getitem__) for m in members if m]


@dataclass(frozen=True)
class CpuLayout:
    """Where forwarding runs (userspace datapath): ``switchd_cpus[i]`` is the CPU shard i's
    ovs-vswitchd is pinned to; ``host_cpus`` the CPUs every host's processes run on and its
    NIC steers its receive processing to (RPS). Both empty: the scheduler places everything.

    A packet a switch sends to a host is received (IP, TCP, waking the application) in the
    context of the thread that sent it, ovs-vswitchd's own, unless the host's NIC steers it
    to another CPU; and a host's process scheduled on a forwarding CPU preempts the switch.
    Keeping both off the forwarding CPUs leaves those CPUs to forwarding, as a switch's
    forwarding is not shared with the servers it connects."""

    switchd_cpus: tuple[int, ...] = ()
    host_cpus: tuple[int, ...] = ()

    @property
    def host_cpus_mask(self) -> str | None:
        """``host_cpus`` as the hex mask ``rps_cpus`` takes, or None."""
        return cpu_mask(self.host_cpus) if self.host_cpus else None


def cpu_layout(available: Sequence[int], shards: int, min_host_cpus: int = 1) -> CpuLayout:
    """One CPU per ovs-vswitchd and the rest for the hosts, when that leaves the hosts at
    least ``min_host_cpus``; otherwise no pinning at all."""
    cpus = sorted(set(available))
    if len(cpus) - shards < max(1, min_host_cpus):
        return CpuLayout()
    return CpuLayout(tuple(cpus[:shards]), tuple(cpus[shards:]))


def cpu_mask(cpus: Sequence[int]) -> str:
    """CPU numbers as a hex mask, as ``/sys/class/net/*/queues/rx-*/rps_cpus`` takes it."""
    mask = 0
    for cpu in cpus:
        if cpu < 0:
            raise ValueError(f"no CPU {cpu}")
        mask |= 1 << cpu
    return f"{mask:x}"
