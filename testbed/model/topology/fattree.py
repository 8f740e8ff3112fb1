"""k-ary fat-tree (Al-Fares, Loukissas, Vahdat, SIGCOMM 2008).

k pods, each with k/2 edge and k/2 aggregation switches; (k/2)^2 core switches; every edge
switch serves k/2 hosts. Hosts k^3/4, switches 5k^2/4, links 3k^3/4, and (k/2)^2 equal-cost
paths between hosts in different pods. ``hosts_per_edge`` (1..k/2) cables fewer hosts to each
edge switch: the same switches and paths for a smaller world (the k=8 tree's 80 switches with
one rank per edge switch, say).

            c0    c1    c2    c3            core: c{i*k/2 + j} joins aggregation i of every pod
             \\ \\  / /   \\ \\  / /
          p0a0  p0a1 ...  p3a0  p3a1        aggregation: ports 1..k/2 down, k/2+1..k up
           |  \\/  |        |  \\/  |
          p0e0  p0e1 ...  p3e0  p3e1        edge: ports 1..h hosts (h = k/2), h+1..h+k/2 up
          /  \\   /  \\
     p0e0h0 p0e0h1 ...                      host p{pod}e{edge}h{i}: 10.pod.edge.(i+2)

Coordinates are carried in names, DPIDs (0x00RR_PPPP_IIII: role, pod, index or core number),
MACs and IPs (as in ripl), so a controller can derive roles without discovery.
"""
from __future__ import annotations

from testbed.errors import ConfigError
from testbed.model.topology.base import (
    AGGREGATION,
    CORE,
    EDGE,
    HOST,
    Fabric,
    Node,
    host_address,
    switch_dpid,
)
from testbed.model.topology.checks import check_count, check_mtu, check_rate

__all__ = ["AGGREGATION", "CORE", "EDGE", "fat_tree", "switch_dpid"]


def fat_tree(k: int = 4, host_rate_mbit: float = 100.0, fabric_rate_mbit: float | None = None,
             mtu_bytes: int = 9000, hosts_per_edge: int | None = None) -> Fabric:
    """Build the description of a k-ary fat-tree; fabric links default to the host rate, and
    each edge switch serves k/2 hosts unless ``hosts_per_edge`` says fewer."""
    if not isinstance(k, int) or isinstance(k, bool) or k < 2 or k % 2:
        raise ConfigError("k", f"must be an even integer >= 2, got {k!r}")
    if k > 64:
        raise ConfigError("k", f"{k} gives {k ** 3 // 4} hosts; addresses support k <= 64")
    check_rate("host_rate_mbit", host_rate_mbit)
    fabric_rate_mbit = host_rate_mbit if fabric_rate_mbit is None else fabric_rate_mbit
    check_rate("fabric_rate_mbit", fabric_rate_mbit)
    check_mtu(mtu_bytes)
    half = k // 2
    hosts_per_edge = half if hosts_per_edge is None else check_count("hosts_per_edge",
                                                                      hosts_per_edge, 1, half)
    params = {"k": k, "host_rate_mbit": host_rate_mbit, "fabric_rate_mbit": fabric_rate_mbit}
    if hosts_per_edge != half:
        params["hosts_per_edge"] = hosts_per_edge
    fabric = Fabric(kind="fattree", mtu_bytes=mtu_bytes, params=params)

    for n in range(half * half):
        fabric.add_node(Node(f"c{n}", CORE, (n,), dpid=switch_dpid(CORE, 0, n)))
    for pod in range(k):
        for i in range(half):
            fabric.add_node(Node(f"p{pod}a{i}", AGGREGATION, (pod, i),
                                 dpid=switch_dpid(AGGREGATION, pod, i)))
        for e in range(half):
            edge = fabric.add_node(Node(f"p{pod}e{e}", EDGE, (pod, e),
                                        dpid=switch_dpid(EDGE, pod, e)))
            for h in range(hosts_per_edge):
                ip, mac = host_address(pod, e, h + 2)
                host = fabric.add_node(Node(f"{edge.name}h{h}", HOST, (pod, e, h), ip=ip, mac=mac))
                fabric.add_link(host.name, 0, edge.name, h + 1, host_rate_mbit)

    for pod in range(k):
        for e in range(half):
            for a in range(half):
                fabric.add_link(f"p{pod}e{e}", hosts_per_edge + 1 + a, f"p{pod}a{a}", 1 + e,
                                fabric_rate_mbit)
        for a in range(half):
            for j in range(half):
                core = a * half + j
                fabric.add_link(f"p{pod}a{a}", half + 1 + j, f"c{core}", 1 + pod, fabric_rate_mbit)
    return fabric
