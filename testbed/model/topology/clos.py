"""Folded Clos fabrics of 3 or 5 stages (a packet crosses 3 or 5 switch stages at most).

5 stages: P pods, each a leaf-spine full mesh of L leaves and S spines; S planes of X
super-spines. Spine i of every pod connects to every super-spine of plane i.

      ss0   ss1        ss2   ss3          super-spine ss{i*X + j} = plane i, number j:
       | \\ / |          | \\ / |            port 1+P goes to spine i of pod P
     plane 0           plane 1
      /      \\         /      \\
   p0s0      p1s0   p0s1      p1s1        spine p{P}s{i}: ports 1..L leaves,
     |  \\   /  \\     /  |                  L+1+j to super-spine j of plane i
   p0l0  p0l1 ...   p1l0  p1l1            leaf p{P}l{i}: ports 1..H hosts, H+1+j to spine j
   /  \\
p0l0h0 p0l0h1 ...                         host p{P}l{i}h{n}: 10.P.i.(n+2)

  hosts P*L*H; switches P*(L+S) + S*X; links P*L*H + P*L*S + P*S*X
  switch hops between hosts: 2 inside a pod, 4 across pods (leaf-spine-superspine-spine-leaf);
  S*X equal-cost paths between pods, S inside a pod.

3 stages: a single pod of L leaves and S spines, named like the spine-leaf fabric (l{i},
s{j}, l{i}h{n}: 10.0.i.(n+2)); ``pods`` must then be omitted or 1 and
``superspines_per_plane`` omitted or 0. Hosts L*H, switches L+S, links L*H + L*S, 2 switch
hops between leaves.

Oversubscription, counted from the hosts up: at a leaf r_leaf = H*host rate / (S*fabric rate);
for a whole pod (5 stages) r_pod = L*H*host rate / (S*X*fabric rate). ``oversubscription`` in
params is the worst of them, max(r_leaf, r_pod); 1 means non-blocking.

``radix=R`` (even) instead of counts derives the non-blocking design of R-port switches:
5 stages: H = L = S = X = R/2 and P = R (the sizes of a fat-tree with k = R: R^3/4 hosts);
3 stages: L = R, S = R/2, H = R/2 (R^2/2 hosts). Giving radix and any count is an error.
Count defaults when neither is given: pods 2 (1 for 3 stages), leaves_per_pod 2,
spines_per_pod 2, superspines_per_plane 2 (0 for 3 stages), hosts_per_leaf 2.

DPIDs are 0x00RR_HHHH_LLLL: leaf and spine (role, pod, index), super-spine (role, plane, j).
"""
from __future__ import annotations

from testbed.errors import ConfigError
from testbed.model.topology.base import SUPERSPINE, Fabric, Node, switch_dpid
from testbed.model.topology.checks import (
    MAX_COUNT,
    check_count,
    check_mtu,
    check_rate,
    is_int,
)
from testbed.model.topology.spineleaf import add_leaf_spine_pod, oversubscription

COUNTS = ("pods", "leaves_per_pod", "spines_per_pod", "superspines_per_plane", "hosts_per_leaf")
DEFAULT_COUNT = 2


def clos(stages: int = 5, pods: int | None = None, leaves_per_pod: int | None = None,
         spines_per_pod: int | None = None, superspines_per_plane: int | None = None,
         hosts_per_leaf: int | None = None, host_rate_mbit: float = 100.0,
         fabric_rate_mbit: float | None = None, mtu_bytes: int = 9000,
         radix: int | None = None) -> Fabric:
    """Build the description of a 3- or 5-stage folded Clos; fabric links default to the host
    rate. Counts left as None take the defaults in the module docstring."""
    if not is_int(stages) or stages not in (3, 5):
        raise ConfigError("stages", f"must be 3 or 5, got {stages!r}")
    given = {name: value for name, value in zip(COUNTS, (
        pods, leaves_per_pod, spines_per_pod, superspines_per_plane, hosts_per_leaf))
        if value is not None}
    if radix is not None:
        if given:
            counts = ", ".join(f"{k}={v!r}" for k, v in given.items())
            raise ConfigError("radix", f"give radix or explicit counts, not both; got "
                              f"radix={radix!r} and {counts}")
        if not is_int(radix) or not 2 <= radix <= MAX_COUNT or radix % 2:
            raise ConfigError("radix", f"must be an even integer in [2, {MAX_COUNT}], "
                              f"got {radix!r}")
        half = radix // 2
        counts = ({"pods": radix, "leaves_per_pod": half, "spines_per_pod": half,
                   "superspines_per_plane": half, "hosts_per_leaf": half} if stages == 5 else
                  {"pods": 1, "leaves_per_pod": radix, "spines_per_pod": half,
                   "superspines_per_plane": 0, "hosts_per_leaf": half})
    else:
        counts = {name: DEFAULT_COUNT for name in COUNTS}
        if stages == 3:
            counts.update(pods=1, superspines_per_plane=0)
            for name, single in (("pods", 1), ("superspines_per_plane", 0)):
                if given.get(name, single) != single:
                    raise ConfigError(name, f"a 3-stage Clos is one pod without super-spines: "
                                      f"omit {name} or set {single}, got {given[name]!r}")
        counts.update(given)
        for name in COUNTS:
            if stages == 5 or name not in ("pods", "superspines_per_plane"):
                check_count(name, counts[name])
    check_rate("host_rate_mbit", host_rate_mbit)
    fabric_rate_mbit = host_rate_mbit if fabric_rate_mbit is None else fabric_rate_mbit
    check_rate("fabric_rate_mbit", fabric_rate_mbit)
    check_mtu(mtu_bytes)

    n_pods, leaves, spines = counts["pods"], counts["leaves_per_pod"], counts["spines_per_pod"]
    supers, hosts = counts["superspines_per_plane"], counts["hosts_per_leaf"]
    leaf_ratio = oversubscription(hosts, host_rate_mbit, spines, fabric_rate_mbit)
    worst = leaf_ratio
    if stages == 5:
        worst = max(leaf_ratio, oversubscription(leaves * hosts, host_rate_mbit, spines * supers,
                                                 fabric_rate_mbit))
    fabric = Fabric(kind="clos", mtu_bytes=mtu_bytes, params={
        "stages": stages, **counts, "radix": radix, "host_rate_mbit": host_rate_mbit,
        "fabric_rate_mbit": fabric_rate_mbit, "oversubscription": worst})
    if stages == 3:
        add_leaf_spine_pod(fabric, leaves, spines, hosts, host_rate_mbit, fabric_rate_mbit)
        return fabric

    for plane in range(spines):
        for j in range(supers):
            fabric.add_node(Node(f"ss{plane * supers + j}", SUPERSPINE, (plane, j),
                                 dpid=switch_dpid(SUPERSPINE, plane, j)))
    for pod in range(n_pods):
        _, spine_names = add_leaf_spine_pod(fabric, leaves, spines, hosts, host_rate_mbit,
                                            fabric_rate_mbit, pod=pod)
        for plane, spine in enumerate(spine_names):
            for j in range(supers):
                fabric.add_link(spine, leaves + 1 + j, f"ss{plane * supers + j}", 1 + pod,
                                fabric_rate_mbit)
    return fabric
