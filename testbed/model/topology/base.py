"""The fabric description every layer shares: nodes with roles and coordinates, numbered ports,
links with rates, and the addresses derived from them.

A Fabric is plain data. The Mininet network is built from it (testbed.apply.network), the controller
reads it as JSON and computes its routes from it (testbed.controllers.routing.ecmp), and reports name its
links with it, so names, ports, DPIDs, MACs and IPs agree everywhere without discovery.
Host interfaces are port 0 (``eth0``); switch ports count from 1.
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field

import networkx as nx

HOST = "host"

# Switch roles, one name per job a switch does; the fat-tree keeps its paper's names.
EDGE, AGGREGATION, CORE = "edge", "aggregation", "core"
LEAF, SPINE, SUPERSPINE = "leaf", "spine", "superspine"
ROUTER, NVSWITCH = "router", "nvswitch"
SWITCH = "switch"  # a switch of an explicit topology, with no tier of its own
ROLE_CODES = {EDGE: 1, AGGREGATION: 2, CORE: 3, LEAF: 4, SPINE: 5, SUPERSPINE: 6, ROUTER: 7,
              NVSWITCH: 8, SWITCH: 9}


@dataclass(frozen=True)
class Node:
    """A host or a switch. Switches carry a DPID; hosts an IPv4 address (/8) and a MAC."""

    name: str
    role: str
    coords: tuple[int, ...] = ()
    dpid: int | None = None
    ip: str | None = None
    mac: str | None = None

    @property
    def is_host(self) -> bool:
        return self.role == HOST


@dataclass(frozen=True)
class Link:
    """A full-duplex cable between port ``a_port`` of ``a`` and port ``b_port`` of ``b``;
    ``rate_mbit=None`` is an unshaped link (as fast as the machine forwards)."""

    a: str
    a_port: int
    b: str
    b_port: int
    rate_mbit: float | None

    def intf(self, end: int) -> str:
        """Name of the interface at end 0 (a) or end 1 (b), as Mininet names it."""
        node, port = (self.a, self.a_port) if end == 0 else (self.b, self.b_port)
        return intf_name(node, port)


LINUX_IFNAMSIZ_CHARS = 15  # IFNAMSIZ (16) minus the terminating NUL: every name must fit


def intf_name(node: str, port: int) -> str:
    return f"{node}-eth{port}"


@dataclass
class Fabric:
    """A named topology instance: nodes in a stable order and the links between them."""

    kind: str
    params: dict
    nodes: dict[str, Node] = field(default_factory=dict)
    links: list[Link] = field(default_factory=list)
    mtu_bytes: int = 9000

    def add_node(self, node: Node) -> Node:
        if node.name in self.nodes:
            raise ValueError(f"duplicate node {node.name}")
        self.nodes[node.name] = node
        return node

    def add_link(self, a: str, a_port: int, b: str, b_port: int, rate_mbit: float | None) -> Link:
        link = Link(a, a_port, b, b_port, rate_mbit)
        self.links.append(link)
        return link

    @property
    def hosts(self) -> list[Node]:
        return [n for n in self.nodes.values() if n.is_host]

    @property
    def switches(self) -> list[Node]:
        return [n for n in self.nodes.values() if not n.is_host]

    def graph(self) -> nx.Graph:
        """The fabric as an undirected graph; edge attribute ``ports`` maps node -> its port."""
        g = nx.Graph()
        for node in self.nodes.values():
            g.add_node(node.name, role=node.role)
        for link in self.links:
            g.add_edge(link.a, link.b, ports={link.a: link.a_port, link.b: link.b_port},
                       rate_mbit=link.rate_mbit)
        return g

    def host_link(self, host: str) -> tuple[Link, int]:
        """The link a host is cabled with, and which end (0 or 1) is the host's."""
        for link in self.links:
            if link.a == host:
                return link, 0
            if link.b == host:
                return link, 1
        raise KeyError(host)

    def host_attachment(self, host: str) -> tuple[str, int]:
        """The (switch, port) a host's eth0 is cabled to."""
        link, end = self.host_link(host)
        return (link.b, link.b_port) if end == 0 else (link.a, link.a_port)

    def switch_ends(self) -> list[tuple[str, int, str, Link]]:
        """(switch, port, interface, link) for every link end on a switch: the interfaces that
        live in the root namespace."""
        ends = []
        for link in self.links:
            for end, (node, port) in enumerate(((link.a, link.a_port), (link.b, link.b_port))):
                if not self.nodes[node].is_host:
                    ends.append((node, port, link.intf(end), link))
        return ends

    def interface_names(self) -> list[str]:
        return [link.intf(end) for link in self.links for end in (0, 1)]

    def label(self) -> str:
        """``fattree k=4``: the family and the parameters that shape it (rates left out)."""
        shown = [f"{k}={v}" for k, v in self.params.items()
                 if not k.endswith(("_mbit", "ratio", "subscription")) and v is not None]
        return " ".join([self.kind, *shown])

    def to_dict(self) -> dict:
        return {
            "kind": self.kind,
            "params": self.params,
            "mtu_bytes": self.mtu_bytes,
            "nodes": [asdict(n) for n in self.nodes.values()],
            "links": [asdict(link) for link in self.links],
        }

    @classmethod
    def from_dict(cls, data: dict) -> Fabric:
        fabric = cls(kind=data["kind"], params=dict(data["params"]), mtu_bytes=data["mtu_bytes"])
        for n in data["nodes"]:
            fabric.add_node(Node(**{**n, "coords": tuple(n["coords"])}))
        for link in data["links"]:
            fabric.links.append(Link(**link))
        return fabric

    def dump_json(self, path) -> None:
        with open(path, "w") as fh:
            json.dump(self.to_dict(), fh, indent=1)

    @classmethod
    def load_json(cls, path) -> Fabric:
        with open(path) as fh:
            return cls.from_dict(json.load(fh))


def switch_dpid(role: str, high: int, low: int) -> int:
    """DPID 0x00RR_HHHH_LLLL: role code, then two 16-bit coordinates (e.g. pod and index)."""
    for part in (high, low):
        if not 0 <= part <= 0xFFFF:
            raise ValueError(f"DPID coordinate {part} out of range")
    return (ROLE_CODES[role] << 32) | (high << 16) | low


def host_address(a: int, b: int, c: int) -> tuple[str, str]:
    """IPv4 address 10.a.b.c and a locally administered MAC carrying the same coordinates."""
    for octet in (a, b, c):
        if not 0 <= octet <= 255:
            raise ValueError(f"address coordinate {octet} out of range")
    return f"10.{a}.{b}.{c}", f"02:00:0a:{a:02x}:{b:02x}:{c:02x}"
