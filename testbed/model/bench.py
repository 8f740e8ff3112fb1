"""The one-switch bench the DCTCP and RoCE experiments measure on: ``senders`` hosts sending
into one receiver through one switch, whose port toward the receiver is the bottleneck and
the only queue that builds.

    sender l0h0     --\\
    sender l0h1     ---+-- l0 --(l0-eth{N+1}: the bottleneck)--> l0h{N} receiver
    ...                |
    sender l0h{N-1} --/    (l0's uplink to spine s0 carries nothing)

The switch is testbed.model.topology.spineleaf with one leaf and one spine: a non-blocking
single switch.
"""
from __future__ import annotations

from dataclasses import dataclass

from testbed.model.topology.base import Fabric, intf_name
from testbed.model.topology.spineleaf import spine_leaf


@dataclass(frozen=True)
class Bench:
    """A bench fabric and the roles in it."""

    fabric: Fabric
    senders: tuple[str, ...]
    receiver: str
    bottleneck_intf: str  # the switch port toward the receiver
    bottleneck_label: str  # its direction, as testbed.measure.telemetry labels it

    def pairs(self) -> list[tuple[str, str]]:
        """(sender, receiver) for every sender."""
        return [(s, self.receiver) for s in self.senders]


def bench_fabric(senders: int, rate_mbit: float, mtu_bytes: int) -> Fabric:
    """One leaf (and the spine the family needs) with ``senders`` + 1 hosts."""
    return spine_leaf(leaves=1, spines=1, hosts_per_leaf=senders + 1, host_rate_mbit=rate_mbit,
                      mtu_bytes=mtu_bytes)


def bench_of(fabric: Fabric) -> Bench:
    """The roles in a bench fabric (``bench_fabric``): the last host receives, the others
    send."""
    hosts = [h.name for h in fabric.hosts]
    receiver = hosts[-1]
    switch, port = fabric.host_attachment(receiver)
    return Bench(fabric, tuple(hosts[:-1]), receiver, intf_name(switch, port),
                 f"{switch}->{receiver}")
