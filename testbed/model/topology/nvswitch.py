"""Multi-GPU nodes on any fabric: every host position becomes a node whose GPUs share an
NVSwitch, and whose single NIC is the node's link into the fabric.

                 fabric switch (edge/leaf/router ...)
                        | NIC: the base host's link and rate
                   p0e0h0nv                node switch, role "nvswitch": ports 1..G GPUs,
              /     |     |    \\               port G+1 the NIC
      p0e0h0g0  p0e0h0g1  ...  p0e0h0g{G-1}   GPU hosts, links at nvlink_ratio * NIC rate

Per node: G = gpus_per_node GPUs; NVLink rate = nvlink_ratio * NIC rate. H100 has 900 GB/s
NVLink per GPU against a 400 Gb/s (50 GB/s) NIC, so the default ratio is 18: scale the rates
down, keep the ratio. Hosts = base hosts * G; switches = base switches + base hosts.

Addresses: a base host 10.x.y.(j+2) (every builder numbers the j-th host of a switch so)
becomes a node whose GPU i gets 10.x.y.(16*(j+1) + i) -- in hex the last byte reads 0x{j+1}{i}:
high nibble the node's host index + 1, low nibble the GPU index -- and the MAC
02:00:0a:xx:yy:{j+1}{i}. Example: fat-tree p0e1h1 (10.0.1.3, j = 1), GPU 3 -> 10.0.1.35,
02:00:0a:00:01:23. So G <= 16 and j <= 14, and no GPU ever gets .0 to .15.
The node switch's DPID is 0x0008_XXXX_YYCC: role code 8, then the base host's octets x, y, c.

Every node here has one NIC shared by its GPUs. The rail-optimised layout
(testbed.model.topology.rail) builds the same nodes with G NICs each, NIC i on port G+1+i and cabled
to rail leaf i; GPUs stay single-homed, so no host needs several interfaces.
"""
from __future__ import annotations

from testbed.errors import ConfigError
from testbed.model.topology.base import (
    HOST,
    NVSWITCH,
    Fabric,
    Node,
    host_address,
    switch_dpid,
)
from testbed.model.topology.checks import (
    check_count,
    check_interface_names,
    check_rate,
)

MAX_GPUS = 16          # the GPU index is the low nibble of the address
MAX_HOST_INDEX = 14    # the node's host index + 1 is the high nibble
NODE_SUFFIX, GPU_PREFIX = "nv", "g"


def gpu_address(node_ip: str, gpu: int) -> tuple[str, str]:
    """IP and MAC of GPU ``gpu`` in the node that replaces the host at ``node_ip``."""
    x, y, c = (int(octet) for octet in node_ip.split(".")[1:])
    index = c - 2
    if not 0 <= index <= MAX_HOST_INDEX or not 0 <= gpu < MAX_GPUS:
        raise ValueError(f"no GPU address for host {node_ip} GPU {gpu}")
    return host_address(x, y, 16 * (index + 1) + gpu)


def nic_port(gpus_per_node: int, nic: int = 0) -> int:
    """The node switch's port for NIC ``nic``: GPUs hold ports 1..G, NICs follow from G+1."""
    return gpus_per_node + 1 + nic


def add_gpu_node(fabric: Fabric, name: str, coords: tuple[int, ...], node_ip: str,
                 gpus_per_node: int) -> str:
    """Add the node switch ``{name}nv`` and the GPUs ``{name}g{i}`` of the node that takes the
    host address ``node_ip`` (10.x.y.c): DPID 0x0008_XXXX_YYCC, GPU addresses from
    ``gpu_address``, GPU i at coordinates ``coords + (i,)``. Returns the node switch's name."""
    x, y, c = (int(octet) for octet in node_ip.split(".")[1:])
    node_switch = fabric.add_node(Node(name + NODE_SUFFIX, NVSWITCH, coords,
                                       dpid=switch_dpid(NVSWITCH, x, (y << 8) | c))).name
    for i in range(gpus_per_node):
        ip, mac = gpu_address(node_ip, i)
        fabric.add_node(Node(f"{name}{GPU_PREFIX}{i}", HOST, coords + (i,), ip=ip, mac=mac))
    return node_switch


def add_nvlinks(fabric: Fabric, name: str, gpus_per_node: int,
                nvlink_rate_mbit: float | None) -> None:
    """Cable GPU i of node ``name`` to port i+1 of its node switch."""
    for i in range(gpus_per_node):
        fabric.add_link(f"{name}{GPU_PREFIX}{i}", 0, name + NODE_SUFFIX, i + 1, nvlink_rate_mbit)


def nvswitch_nodes(base: Fabric, gpus_per_node: int = 4, nvlink_ratio: float = 18.0) -> Fabric:
    """The base fabric with every host replaced by an NVSwitch node of ``gpus_per_node`` GPUs."""
    check_count("gpus_per_node", gpus_per_node, maximum=MAX_GPUS)
    check_rate("nvlink_ratio", nvlink_ratio)
    fabric = Fabric(kind="nvswitch", mtu_bytes=base.mtu_bytes, params={
        "base": base.kind, **base.params, "gpus_per_node": gpus_per_node,
        "nvlink_ratio": nvlink_ratio, "nodes": len(base.hosts)})
    for node in base.nodes.values():
        if not node.is_host:
            fabric.add_node(node)
            continue
        index = int(node.ip.split(".")[3]) - 2
        if not 0 <= index <= MAX_HOST_INDEX:
            raise ConfigError("base", f"host {node.name} ({node.ip}) is host {index} of "
                              f"its switch; GPU addresses allow 0..{MAX_HOST_INDEX}")
        add_gpu_node(fabric, node.name, node.coords, node.ip, gpus_per_node)
    for link in base.links:
        a, b = base.nodes[link.a], base.nodes[link.b]
        if not (a.is_host or b.is_host):
            fabric.links.append(link)
            continue
        host, switch, port = (a, link.b, link.b_port) if a.is_host else (b, link.a, link.a_port)
        fabric.add_link(host.name + NODE_SUFFIX, nic_port(gpus_per_node), switch, port,
                        link.rate_mbit)
        nvlink = None if link.rate_mbit is None else nvlink_ratio * link.rate_mbit
        add_nvlinks(fabric, host.name, gpus_per_node, nvlink)
    check_interface_names(fabric, "base", "use a smaller base fabric")
    return fabric
