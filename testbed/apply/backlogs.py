"""The backlog of every shaped egress port of a running fabric, read over rtnetlink: what the
fidelity verdict (``testbed.measure.fidelity``) judges a port's delivery and the ECN marker's
model by.

A port's backlog is that of its whole HTB tree (qdisc ``Handles.HTB``: its statistics count
every packet queued under it, in the one buffer or any class queue, a paused lossless tbf
included; under netem it is netem's child, so packets in netem's delay line are not counted).
Switch ends live in the root namespace, host NICs in their hosts' namespaces: one rtnetlink
socket per namespace, each asked for its ports' qdiscs in one batch of requests
(``testbed.system.netlink.QdiscBacklogs``). Ports are named by the link direction they send on
(``src->dst``, as ``testbed.measure.telemetry`` labels the byte counters), so the verdict
joins a port's backlog with its delivery and its rate without knowing interfaces.
"""
from __future__ import annotations

import socket
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from testbed.model.topology.base import Fabric
from testbed.plan.port_queue import Handles
from testbed.system.netlink import QdiscBacklogs
from testbed.system.netns import in_netns


@dataclass(frozen=True)
class ShapedPort:
    """A link direction's egress port: the interface of ``node`` that sends it, at ``rate_mbit``."""

    label: str
    intf: str
    node: str
    host: bool
    rate_mbit: float


def shaped_ports(fabric: Fabric) -> list[ShapedPort]:
    """Both egress ports of every shaped link (an unshaped link has no queue of its own)."""
    ports = []
    for link in fabric.links:
        if link.rate_mbit is None:
            continue
        for end, (src, dst) in enumerate(((link.a, link.b), (link.b, link.a))):
            ports.append(ShapedPort(f"{src}->{dst}", link.intf(end), src,
                                    fabric.nodes[src].is_host, link.rate_mbit))
    return ports


class PortBacklogs:
    """Reads the backlog of ``ports``; ``netns_of(node)`` is the path of a host's network
    namespace (``/proc/PID/ns/net``). Close it before the hosts go: its sockets keep their
    namespaces alive."""

    def __init__(self, ports: list[ShapedPort], netns_of: Callable[[str], str]):
        self.readers: list[tuple[QdiscBacklogs, dict[tuple[int, int], str]]] = []
        by_namespace: dict[str | None, list[ShapedPort]] = {}
        for port in ports:
            by_namespace.setdefault(netns_of(port.node) if port.host else None, []).append(port)
        try:
            for path, members in by_namespace.items():
                keys = in_netns(path, lambda m=members: {
                    (socket.if_nametoindex(p.intf), Handles.HTB_MAJOR): p.label for p in m})
                self.readers.append((in_netns(path, lambda k=keys: QdiscBacklogs(set(k))), keys))
        except BaseException:
            self.close()
            raise

    def read(self) -> dict[str, int]:
        """Every port's backlog in bytes now: ``{label: bytes}``."""
        out: dict[str, int] = {}
        for reader, keys in self.readers:
            backlogs: Mapping[tuple[int, int], int] = reader.read()
            out.update({label: backlogs.get(key, 0) for key, label in keys.items()})
        return out

    def close(self) -> None:
        for reader, _ in self.readers:
            reader.sock.close()
        self.readers = []
