"""Two-tier spine-leaf fabric: every leaf connects to every spine.

         s0            s1                 spine s{j}: port 1+i goes to leaf i
        / | \\        / | \\
      l0  l1  l2 ... (every leaf to every spine)
     /  \\                                leaf l{i}: ports 1..H hosts, H+1+j to spine j
  l0h0  l0h1 ...                          host l{i}h{n}: 10.0.i.(n+2)

With L leaves, S spines and H hosts per leaf: hosts L*H, switches L+S, S*L leaf-spine links,
any two leaves 2 switch hops apart (leaf-spine-leaf) over S equal-cost paths, and
oversubscription = (H * host rate) / (S * uplink rate); 1 means non-blocking.
For an even L the natural halving (leaves 0..L/2-1 against the rest) has a cut of
L/2 * min(H * host rate, S * uplink rate).

DPIDs are 0x00RR_0000_IIII (role code, index); coordinates travel in names, DPIDs, MACs and
IPs as in the fat-tree. ``add_leaf_spine_pod`` also builds the pods of the 5-stage Clos.
"""
from __future__ import annotations

from testbed.model.topology.base import (
    HOST,
    LEAF,
    SPINE,
    Fabric,
    Node,
    host_address,
    switch_dpid,
)
from testbed.model.topology.checks import check_count, check_mtu, check_rate

TIER_LETTERS = {LEAF: "l", SPINE: "s"}


def spine_leaf(leaves: int = 4, spines: int = 2, hosts_per_leaf: int = 4,
               host_rate_mbit: float = 100.0, uplink_rate_mbit: float | None = None,
               mtu_bytes: int = 9000) -> Fabric:
    """Build the description of a spine-leaf fabric; uplinks default to the host rate."""
    check_count("leaves", leaves)
    check_count("spines", spines)
    check_count("hosts_per_leaf", hosts_per_leaf)
    check_rate("host_rate_mbit", host_rate_mbit)
    uplink_rate_mbit = host_rate_mbit if uplink_rate_mbit is None else uplink_rate_mbit
    check_rate("uplink_rate_mbit", uplink_rate_mbit)
    check_mtu(mtu_bytes)
    fabric = Fabric(kind="spineleaf", mtu_bytes=mtu_bytes, params={
        "leaves": leaves, "spines": spines, "hosts_per_leaf": hosts_per_leaf,
        "host_rate_mbit": host_rate_mbit, "uplink_rate_mbit": uplink_rate_mbit,
        "oversubscription": oversubscription(hosts_per_leaf, host_rate_mbit, spines,
                                             uplink_rate_mbit)})
    add_leaf_spine_pod(fabric, leaves, spines, hosts_per_leaf, host_rate_mbit, uplink_rate_mbit)
    return fabric


def oversubscription(hosts: int, host_rate_mbit: float, uplinks: int,
                     uplink_rate_mbit: float) -> float:
    """Offered host bandwidth over uplink capacity at one switch; 1.0 is non-blocking."""
    return (hosts * host_rate_mbit) / (uplinks * uplink_rate_mbit)


def add_leaf_spine_pod(fabric: Fabric, leaves: int, spines: int, hosts_per_leaf: int,
                       host_rate_mbit: float, uplink_rate_mbit: float,
                       pod: int | None = None) -> tuple[list[str], list[str]]:
    """Add spines, then each leaf followed by its hosts, all cabled; return (leaves, spines).

    ``pod=None`` names them ``s{j}``, ``l{i}``, ``l{i}h{n}`` (hosts 10.0.i.(n+2)); a pod number
    P prefixes ``p{P}`` to every name and coordinate (hosts 10.P.i.(n+2)). Spine ports
    1..leaves go down, so a caller can number further uplinks from leaves+1.
    """
    prefix, at = ("", ()) if pod is None else (f"p{pod}", (pod,))
    high = 0 if pod is None else pod
    spine_names = [fabric.add_node(tier_switch(SPINE, j, pod)).name for j in range(spines)]
    leaf_names = []
    for i in range(leaves):
        leaf = fabric.add_node(tier_switch(LEAF, i, pod))
        leaf_names.append(leaf.name)
        for n in range(hosts_per_leaf):
            ip, mac = host_address(high, i, n + 2)
            host = fabric.add_node(Node(f"{leaf.name}h{n}", HOST, at + (i, n), ip=ip, mac=mac))
            fabric.add_link(host.name, 0, leaf.name, n + 1, host_rate_mbit)
    cable_leaves_to_spines(fabric, leaf_names, spine_names, hosts_per_leaf + 1, uplink_rate_mbit)
    return leaf_names, spine_names


def tier_switch(role: str, index: int, pod: int | None = None) -> Node:
    """Leaf ``l{i}`` or spine ``s{j}`` (``p{P}l{i}`` in pod P); DPID 0x00RR_PPPP_IIII."""
    prefix, at = ("", ()) if pod is None else (f"p{pod}", (pod,))
    return Node(f"{prefix}{TIER_LETTERS[role]}{index}", role, at + (index,),
                dpid=switch_dpid(role, 0 if pod is None else pod, index))


def cable_leaves_to_spines(fabric: Fabric, leaf_names: list[str], spine_names: list[str],
                           first_uplink_port: int, uplink_rate_mbit: float) -> None:
    """Every leaf to every spine: leaf i's port first_uplink_port+j to spine j's port 1+i."""
    for i, leaf in enumerate(leaf_names):
        for j, spine in enumerate(spine_names):
            fabric.add_link(leaf, first_uplink_port + j, spine, 1 + i, uplink_rate_mbit)
