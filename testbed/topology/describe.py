"""What a topology is, computed from its description alone: sizes, diameter, path diversity,
and, where a published formula exists, the formula's value beside the computed one."""
from __future__ import annotations

import networkx as nx

from testbed.topology.base import Fabric


def describe(fabric: Fabric) -> dict:
    graph = fabric.graph()
    hosts = fabric.hosts
    roles: dict[str, int] = {}
    for node in fabric.switches:
        roles[node.role] = roles.get(node.role, 0) + 1
    switch_graph = graph.subgraph(s.name for s in fabric.switches)
    first, last = hosts[0].name, hosts[-1].name
    info = {
        "topology": fabric.kind,
        "params": fabric.params,
        "hosts": len(hosts),
        "switches": len(fabric.switches),
        "switches_by_role": roles,
        "links": len(fabric.links),
        "switch_diameter_hops": nx.diameter(switch_graph) if len(switch_graph) > 1 else 0,
        "host_pair": [first, last],
        "equal_cost_paths": sum(1 for _ in nx.all_shortest_paths(graph, first, last)),
        "host_pair_hops": nx.shortest_path_length(graph, first, last),
    }
    if fabric.kind == "fattree":
        k = fabric.params["k"]
        info["formula"] = {"hosts": k ** 3 // 4, "switches": 5 * k * k // 4,
                           "links": 3 * k ** 3 // 4, "equal_cost_paths": (k // 2) ** 2}
    return info


def format_description(info: dict) -> str:
    formula = info.get("formula", {})
    rows = [("topology", f"{info['topology']} {info['params']}")]
    for key in ("hosts", "switches", "links", "equal_cost_paths"):
        extra = f"   (formula: {formula[key]})" if key in formula else ""
        label = key.replace("_", " ")
        if key == "equal_cost_paths":
            label = f"equal-cost paths {info['host_pair'][0]} -> {info['host_pair'][1]}"
        rows.append((label, f"{info[key]}{extra}"))
    rows.insert(3, ("switches by role", ", ".join(f"{v} {k}" for k, v in info["switches_by_role"].items())))
    rows.append(("switch diameter", f"{info['switch_diameter_hops']} hops"))
    width = max(len(k) for k, _ in rows)
    return "\n".join(f"{k:<{width}}  {v}" for k, v in rows)
