"""Rail-optimised layout of NVSwitch-like nodes, as current AI clusters are cabled: every node
has one NIC per GPU, and NIC i of every node goes to rail leaf i, so GPUs with the same index
share a rail one switch hop apart.

              s0              s1
               (every rail leaf to every spine)
       l0         l1         l2         l3        rail leaves, one per GPU index
       | \\        | \\        | \\        | \\
       |  n1nv    |  n1nv    |  n1nv    |  n1nv   NIC i of nodes 1, 2, ... likewise
      NIC0       NIC1       NIC2       NIC3       node 0's NICs
         \\__________\\____  ____/__________/
                         n0nv                     node switch
                   /    |     |    \\
                n0g0   n0g1  n0g2   n0g3          GPUs

  spine s{j}:      port 1+i to rail leaf l{i}
  rail leaf l{i}:  port 1+k to NIC i of node k, ports N+1+j to spine j
  node n{k}nv:     role "nvswitch", ports 1..G GPUs, port G+1+i NIC i (at the NIC rate)
  GPU n{k}g{i}:    single-homed to its node switch; NVLink at nvlink_ratio * NIC rate

With N nodes, G GPUs per node and S spines: hosts N*G, switches N+G+S, links N*G NVLinks +
N*G NICs + G*S leaf-spine. GPUs of two nodes are 2 switch hops apart (node switch, rail leaf,
node switch) over G equal-cost paths, one per rail; the controller pins GPU i's traffic to
rail i (testbed.controllers.routing.ecmp), and traffic for another GPU index crosses over NVLink inside the
destination node. Every rail leaf reaches every node directly, so no shortest path between
GPUs crosses a spine: spines join the rails for routes around a lost NIC link.
Oversubscription at a rail leaf = (N * NIC rate) / (S * uplink rate). For an even N the
halving by nodes cuts N/2 * G NICs: N/2 * G * NIC rate while NVLink is at least as fast as a
NIC (nvlink_ratio >= 1).

Addresses follow the NVSwitch scheme (testbed.model.topology.nvswitch): node k takes the place of
host 10.0.k.2, so GPU i gets 10.0.k.(16+i) and MAC 02:00:0a:00:kk:1i, and the node switch
DPID 0x0008_0000_KK02; rail leaf l{i} is 0x0004_0000_IIII and spine s{j} 0x0005_0000_JJJJ,
as in the spine-leaf.
"""
from __future__ import annotations

from collections import defaultdict

from testbed.model.topology.base import LEAF, NVSWITCH, SPINE, Fabric, host_address
from testbed.model.topology.checks import (
    check_count,
    check_interface_names,
    check_mtu,
    check_rate,
)
from testbed.model.topology.nvswitch import (
    MAX_GPUS,
    add_gpu_node,
    add_nvlinks,
    nic_port,
)
from testbed.model.topology.spineleaf import (
    cable_leaves_to_spines,
    oversubscription,
    tier_switch,
)

KIND = "rail"
NODE_PREFIX = "n"


def rail(nodes: int = 4, gpus_per_node: int = 4, spines: int = 2, host_rate_mbit: float = 100.0,
         uplink_rate_mbit: float | None = None, nvlink_ratio: float = 18.0,
         mtu_bytes: int = 9000) -> Fabric:
    """Build the description of a rail-optimised fabric: ``nodes`` nodes of ``gpus_per_node``
    GPUs, one rail leaf per GPU index, ``spines`` spines. NICs run at ``host_rate_mbit``,
    leaf-spine links at ``uplink_rate_mbit`` (default: the NIC rate)."""
    check_count("nodes", nodes)
    check_count("gpus_per_node", gpus_per_node, maximum=MAX_GPUS)
    check_count("spines", spines)
    check_rate("host_rate_mbit", host_rate_mbit)
    uplink_rate_mbit = host_rate_mbit if uplink_rate_mbit is None else uplink_rate_mbit
    check_rate("uplink_rate_mbit", uplink_rate_mbit)
    check_rate("nvlink_ratio", nvlink_ratio)
    check_mtu(mtu_bytes)
    fabric = Fabric(kind=KIND, mtu_bytes=mtu_bytes, params={
        "nodes": nodes, "gpus_per_node": gpus_per_node, "spines": spines,
        "host_rate_mbit": host_rate_mbit, "uplink_rate_mbit": uplink_rate_mbit,
        "nvlink_ratio": nvlink_ratio,
        "oversubscription": oversubscription(nodes, host_rate_mbit, spines, uplink_rate_mbit)})
    spine_names = [fabric.add_node(tier_switch(SPINE, j)).name for j in range(spines)]
    leaf_names = [fabric.add_node(tier_switch(LEAF, i)).name for i in range(gpus_per_node)]
    for k in range(nodes):
        name = f"{NODE_PREFIX}{k}"
        node_switch = add_gpu_node(fabric, name, (k,), host_address(0, k, 2)[0], gpus_per_node)
        add_nvlinks(fabric, name, gpus_per_node, nvlink_ratio * host_rate_mbit)
        for i, leaf in enumerate(leaf_names):
            fabric.add_link(node_switch, nic_port(gpus_per_node, i), leaf, 1 + k, host_rate_mbit)
    cable_leaves_to_spines(fabric, leaf_names, spine_names, nodes + 1, uplink_rate_mbit)
    check_interface_names(fabric, "nodes", "use fewer nodes")
    return fabric


def rail_ports(fabric: Fabric) -> dict[str, dict[int, int]]:
    """For every node switch of a rail fabric: GPU i's port -> the port of its NIC i, read from
    the links and coordinates. Only whole rails count: a rail leaf that lost a node's NIC no
    longer reaches every node in one hop, so pinning GPUs to it could send their traffic back
    through a node switch; its GPUs take shortest paths like any other traffic. Empty for every
    other kind of fabric."""
    if fabric.kind != KIND:
        return {}
    gpu_ports: dict[str, dict[int, int]] = defaultdict(dict)  # node switch -> rail -> port
    nic_ports: dict[str, dict[int, int]] = defaultdict(dict)
    for switch, port, _, link in fabric.switch_ends():
        if fabric.nodes[switch].role != NVSWITCH:
            continue
        peer = fabric.nodes[link.b if link.a == switch else link.a]
        if peer.is_host:
            gpu_ports[switch][peer.coords[-1]] = port
        elif peer.role == LEAF:
            nic_ports[switch][peer.coords[-1]] = port
    rails = [set(nic_ports[switch]) for switch in gpu_ports]
    whole = set.intersection(*rails) if rails else set()
    return {switch: {port: nic_ports[switch][i] for i, port in sorted(gpus.items()) if i in whole}
            for switch, gpus in gpu_ports.items()}
