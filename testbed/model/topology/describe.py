"""What a topology is, computed from its description alone: sizes, diameter, path diversity,
bisection bandwidth, and, where a published formula exists, the formula's value beside the
computed one. ``draw`` renders the fabric by tier (PNG, SVG or PDF), its node roles by marker
shape, and as a weathermap its links by utilisation.

Hop counts are switch-to-switch links: leaf-spine-leaf is 2 hops. The bisection bandwidth is
the minimum cut (max-flow, every link's rate as its capacity in each direction) between the
first and the second half of the hosts in fabric order, joined to a super-source and a
super-sink. That is the cut for this natural halving (pods, leaves and groups come in
order), which equals the bisection bandwidth for these symmetric topologies when the halving
falls on a pod, leaf or group boundary; an odd count (a 9-group dragonfly) splits one of
them, and the value is then that split's cut.
"""
from __future__ import annotations

import math
import textwrap
from pathlib import Path

import networkx as nx

from testbed.errors import ConfigError
from testbed.model.topology.base import HOST, Fabric

_SOURCE, _SINK = ("cut", "source"), ("cut", "sink")  # tuples never clash with node names


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
        "switch_links": switch_graph.number_of_edges(),
        "max_switch_ports": max((graph.degree(s.name) for s in fabric.switches), default=0),
        "max_switch_hops_between_hosts": max_switch_hops_between_hosts(fabric),
        "bisection_bandwidth_mbit": bisection_bandwidth_mbit(fabric),
        "oversubscription": fabric.params.get("oversubscription"),
    }
    formula = formulas(fabric.kind, fabric.params)
    if formula:
        info["formula"] = formula
    return info


def max_switch_hops_between_hosts(fabric: Fabric) -> int:
    """The longest shortest path between two hosts, counted in switch-to-switch links."""
    graph = fabric.graph()
    switch_graph = graph.subgraph(s.name for s in fabric.switches)
    attached = {fabric.host_attachment(h.name)[0] for h in fabric.hosts}
    longest = 0
    for switch in attached:
        dist = nx.single_source_shortest_path_length(switch_graph, switch)
        longest = max([longest] + [dist[other] for other in attached if other in dist])
    return longest


def bisection_bandwidth_mbit(fabric: Fabric) -> float | None:
    """Min cut between the first and second half of the hosts (fabric order), in Mbit/s;
    None with fewer than two hosts or with an unshaped link (no capacity to cut)."""
    hosts = fabric.hosts
    if len(hosts) < 2 or any(link.rate_mbit is None for link in fabric.links):
        return None
    flow = nx.DiGraph()
    for link in fabric.links:
        for u, v in ((link.a, link.b), (link.b, link.a)):
            if flow.has_edge(u, v):  # parallel cables add up
                flow.edges[u, v]["capacity"] += link.rate_mbit
            else:
                flow.add_edge(u, v, capacity=link.rate_mbit)
    half = len(hosts) // 2
    for host in hosts[:half]:
        flow.add_edge(_SOURCE, host.name)  # no capacity attribute: unbounded
    for host in hosts[half:]:
        flow.add_edge(host.name, _SINK)
    return nx.minimum_cut_value(flow, _SOURCE, _SINK)


# --- published formulas, from the parameters alone ------------------------------------------


def formulas(kind: str, params: dict) -> dict:
    """Formula values for the family, keyed like ``describe``'s computed ones; {} if none."""
    family = _FORMULAS.get(kind)
    return family(params) if family else {}


def _fat_tree(params: dict) -> dict:
    """Al-Fares et al.: k^3/4 hosts, 5k^2/4 switches, 3k^3/4 links, (k/2)^2 paths between
    pods; a non-blocking tree's bisection is hosts/2 times the host rate. With h hosts per
    edge switch: k^2 h/2 hosts, and the halving cuts the smaller of their links and the k^3/8
    core links."""
    k = params["k"]
    hosts = k * k * params.get("hosts_per_edge", k // 2) // 2
    switch_links = k ** 3 // 2
    return {"hosts": hosts, "switches": 5 * k * k // 4, "links": hosts + switch_links,
            "equal_cost_paths": (k // 2) ** 2, "switch_links": switch_links,
            "max_switch_ports": k, "max_switch_hops_between_hosts": 4,
            "bisection_bandwidth_mbit": min(hosts / 2 * params["host_rate_mbit"],
                                            k ** 3 / 8 * params["fabric_rate_mbit"])}


def _two_tier(leaves: int, spines: int, hosts_per_leaf: int, host_rate: float,
              uplink_rate: float) -> dict:
    """Spine-leaf: S*L switch links, leaves 2 hops apart over S paths; the natural halving of
    an even number of leaves cuts L/2 * min(H * host rate, S * uplink rate)."""
    several = leaves > 1
    out = {"hosts": leaves * hosts_per_leaf, "switches": leaves + spines,
           "links": leaves * hosts_per_leaf + spines * leaves, "switch_links": spines * leaves,
           "max_switch_ports": max(leaves, hosts_per_leaf + spines),
           "max_switch_hops_between_hosts": 2 if several else 0,
           "equal_cost_paths": spines if several else 1,
           "oversubscription": hosts_per_leaf * host_rate / (spines * uplink_rate)}
    if leaves % 2 == 0:
        out["bisection_bandwidth_mbit"] = leaves / 2 * min(hosts_per_leaf * host_rate,
                                                           spines * uplink_rate)
    return out


def _spine_leaf(params: dict) -> dict:
    return _two_tier(params["leaves"], params["spines"], params["hosts_per_leaf"],
                     params["host_rate_mbit"], params["uplink_rate_mbit"])


def _clos(params: dict) -> dict:
    """3 stages: a spine-leaf pod. 5 stages: P pods of L leaves and S spines, S planes of X
    super-spines; hosts P*L*H, 4 switch hops and S*X paths between pods."""
    n_pods, leaves, spines = params["pods"], params["leaves_per_pod"], params["spines_per_pod"]
    supers, hosts = params["superspines_per_plane"], params["hosts_per_leaf"]
    host_rate, fabric_rate = params["host_rate_mbit"], params["fabric_rate_mbit"]
    if params["stages"] == 3:
        return _two_tier(leaves, spines, hosts, host_rate, fabric_rate)
    pod_up = min(leaves * min(hosts * host_rate, spines * fabric_rate),
                 spines * supers * fabric_rate)
    out = {"hosts": n_pods * leaves * hosts,
           "switches": n_pods * (leaves + spines) + spines * supers,
           "links": n_pods * (leaves * hosts + leaves * spines + spines * supers),
           "switch_links": n_pods * (leaves * spines + spines * supers),
           "max_switch_ports": max(hosts + spines, leaves + supers, n_pods),
           "max_switch_hops_between_hosts": 4 if n_pods > 1 else (2 if leaves > 1 else 0),
           "equal_cost_paths": spines * supers if n_pods > 1 else (spines if leaves > 1 else 1),
           "oversubscription": max(hosts * host_rate / (spines * fabric_rate),
                                   leaves * hosts * host_rate / (spines * supers * fabric_rate))}
    if n_pods % 2 == 0:
        out["bisection_bandwidth_mbit"] = n_pods / 2 * pod_up
    return out


def _dragonfly(params: dict) -> dict:
    """Kim et al.: N = a*p*g hosts, a*g routers of radix k = p+a+h-1, one global link per
    pair of groups, minimal routes of at most 3 router hops."""
    p, a, h, g = params["p"], params["a"], params["h"], params["g"]
    local, global_ = g * a * (a - 1) // 2, g * (g - 1) // 2
    return {"hosts": a * p * g, "switches": a * g, "links": a * p * g + local + global_,
            "switch_links": local + global_,
            "max_switch_ports": p + a - 1 + min(h, g - 1),  # = k unless g <= h
            "max_switch_hops_between_hosts": 3 if a > 1 else 1}


def _nvswitch(params: dict) -> dict:
    """Each base host becomes a node switch with G GPUs: G times the hosts, one more switch and
    G more links per node, 2 more hops between GPUs of different nodes; the NIC cut of the
    base fabric stays the cut while NVLink (G * ratio * NIC) is the faster side."""
    nodes, gpus = params["nodes"], params["gpus_per_node"]
    base = formulas(params["base"], params)
    out = {"hosts": nodes * gpus}
    added = {"switches": nodes, "links": nodes * gpus, "switch_links": nodes,
             "max_switch_hops_between_hosts": 2, "equal_cost_paths": 0}
    for key, extra in added.items():
        if key in base:
            out[key] = base[key] + extra
    if "max_switch_ports" in base:
        out["max_switch_ports"] = max(base["max_switch_ports"], gpus + 1)
    if "bisection_bandwidth_mbit" in base and gpus * params["nvlink_ratio"] >= 1:
        out["bisection_bandwidth_mbit"] = base["bisection_bandwidth_mbit"]
    return out


def _rail(params: dict) -> dict:
    """Rail-optimised nodes: N*G GPUs, N node switches + G rail leaves + S spines, N*G NVLinks,
    N*G NICs and G*S leaf-spine links; GPUs of two nodes 2 hops apart over G paths (one per
    rail leaf; the controller uses the source GPU's own). The halving of an even N by nodes
    cuts each of those nodes' G NICs, or its G NVLinks if slower."""
    nodes, gpus, spines = params["nodes"], params["gpus_per_node"], params["spines"]
    several = nodes > 1
    out = {"hosts": nodes * gpus, "switches": nodes + gpus + spines,
           "links": 2 * nodes * gpus + gpus * spines,
           "switch_links": nodes * gpus + gpus * spines,
           "max_switch_ports": max(2 * gpus, nodes + spines),
           "max_switch_hops_between_hosts": 2 if several else 0,
           "equal_cost_paths": gpus if several else 1,
           "oversubscription": nodes * params["host_rate_mbit"] / (
               spines * params["uplink_rate_mbit"])}
    if nodes % 2 == 0:
        out["bisection_bandwidth_mbit"] = (nodes / 2 * gpus * params["host_rate_mbit"]
                                           * min(1.0, params["nvlink_ratio"]))
    return out


_FORMULAS = {"fattree": _fat_tree, "spineleaf": _spine_leaf, "clos": _clos,
             "dragonfly": _dragonfly, "nvswitch": _nvswitch, "rail": _rail}


# --- rows for people ------------------------------------------------------------------------------------


def _number(value) -> str:
    return f"{value:g}" if isinstance(value, float) else str(value)


def description_rows(info: dict) -> list[tuple[str, str]]:
    """``describe``'s figures as (what, value) rows for people, each computed value beside its
    formula's where there is one (``testbed topo`` prints them as a table)."""
    formula = info.get("formula", {})

    def with_formula(key: str, unit: str = "") -> str:
        extra = f"   (formula: {_number(formula[key])}{unit})" if key in formula else ""
        return f"{_number(info[key])}{unit}{extra}"

    first, last = info["host_pair"]
    rows = [("topology", f"{info['topology']} {info['params']}"),
            ("hosts", with_formula("hosts")),
            ("switches", with_formula("switches")),
            ("switches by role", ", ".join(f"{v} {k}" for k, v in
                                           info["switches_by_role"].items())),
            ("links", with_formula("links")),
            (f"equal-cost paths {first} -> {last}", with_formula("equal_cost_paths")),
            ("switch diameter", f"{info['switch_diameter_hops']} hops"),
            ("switch-to-switch links", with_formula("switch_links")),
            ("max switch ports", with_formula("max_switch_ports")),
            ("max switch hops host-host", with_formula("max_switch_hops_between_hosts"))]
    if info["bisection_bandwidth_mbit"] is None:
        rows.append(("bisection bandwidth", "n/a (unshaped links or one host)"))
    else:
        rows.append(("bisection bandwidth", with_formula("bisection_bandwidth_mbit", " Mbit/s")))
    if info["oversubscription"] is not None:
        rows.append(("oversubscription", with_formula("oversubscription", ":1")))
    return rows


# --- drawing ---------------------------------------------------------------------------------

# Node roles are told apart by marker shape first and by a neutral grey second, so the
# drawing reads the same without colour vision; colour is left to the links (a weathermap's
# sequential colormap). Roles a fabric combines (rail: nvswitch, leaf, spine) never share a
# shape. Tiers nearer the hosts are lighter.
ROLE_STYLES = {HOST: ("o", "white"), "edge": ("s", "0.82"), "leaf": ("s", "0.82"),
               "aggregation": ("^", "0.58"), "spine": ("^", "0.58"),
               "core": ("D", "0.3"), "superspine": ("D", "0.3"), "router": ("p", "0.6"),
               "nvswitch": ("h", "0.95"), "line": ("s", "0.7"), "switch": ("s", "0.7")}
SPARE_MARKERS = ("v", "P", "X", "*", "<", ">")  # for roles without a style of their own
# Sequential, perceptually uniform and readable with colour blindness; no grey anywhere along
# it, so no link takes a node's colour.
UTILISATION_CMAP = "viridis"
GLOBAL_LINK_COLOR = "#7b3294"  # a dragonfly's links between groups (purple, and dashed)
IDLE_LINK_COLOR = "0.55"
UNMEASURED_LINK = {"color": "0.7", "linestyle": ":"}
LABEL_NODES_UP_TO = 160  # above this, names would overlap: draw without them


def tier_layout(fabric: Fabric) -> dict[str, tuple[float, float]]:
    """Hosts on row 0, then one row per switch role, ordered by its hop distance from the
    hosts; each row spread evenly over the full width, in fabric order."""
    graph = fabric.graph()
    hosts = [h.name for h in fabric.hosts]
    dist = nx.multi_source_dijkstra_path_length(graph, hosts) if hosts else {}
    rows: dict[str, list[str]] = {}
    for node in fabric.nodes.values():
        rows.setdefault(node.role, []).append(node.name)
    order = sorted(rows, key=lambda role: (role != HOST,
                                           min(dist.get(n, math.inf) for n in rows[role])))
    widest = max(len(names) for names in rows.values())
    pos = {}
    for y, role in enumerate(order):
        names = rows[role]
        step = widest / len(names)
        for x, name in enumerate(names):
            pos[name] = ((x + 0.5) * step, float(y))
    return pos


def group_layout(fabric: Fabric) -> dict[str, tuple[float, float]]:
    """Dragonfly: groups around a circle, each group's routers on a small circle, every
    router's hosts fanned outside it."""
    groups = sorted({n.coords[0] for n in fabric.switches})
    per_group = max(1, sum(1 for n in fabric.switches if n.coords[0] == groups[0]))
    radius = max(3.0, len(groups) * 0.9)
    pos = {}
    for node in fabric.switches:
        group, r = node.coords
        centre = 2 * math.pi * group / len(groups)
        cx, cy = radius * math.cos(centre), radius * math.sin(centre)
        angle = centre + 2 * math.pi * r / per_group
        pos[node.name] = (cx + math.cos(angle), cy + math.sin(angle))
        hosts = [n for n in fabric.hosts if n.coords[:2] == node.coords]
        for i, host in enumerate(hosts):
            fan = angle + (i - (len(hosts) - 1) / 2) * 0.35
            pos[host.name] = (cx + 1.8 * math.cos(fan), cy + 1.8 * math.sin(fan))
    return pos


DRAWING_FORMATS = ("png", "svg", "pdf")


def drawing_format(path) -> str:
    """The image format a drawing's file name asks for (by its suffix)."""
    suffix = Path(path).suffix.lower().lstrip(".")
    if suffix not in DRAWING_FORMATS:
        raise ConfigError("--draw", f"cannot draw {suffix or 'a file without a suffix'}: use "
                          f"{', '.join('.' + f for f in DRAWING_FORMATS)}")
    return suffix


def link_utilisation(fabric: Fabric, by_direction: dict[str, float | None]) -> list:
    """Per link (in fabric order) the busier of its two directions' utilisation, None where
    neither was measured."""
    out = []
    for link in fabric.links:
        values = [v for v in (by_direction.get(f"{link.a}->{link.b}"),
                              by_direction.get(f"{link.b}->{link.a}")) if v is not None]
        out.append(max(values) if values else None)
    return out


def role_style(role: str, index: int) -> tuple[str, str]:
    """(marker, fill) of a node role: its own, or a spare marker in mid grey."""
    return ROLE_STYLES.get(role, (SPARE_MARKERS[index % len(SPARE_MARKERS)], "0.5"))


def draw(fabric: Fabric, path, utilisation: dict[str, float | None] | None = None,
         title: str | None = None) -> Path:
    """Write a drawing of the fabric (PNG, SVG or PDF by the file's suffix): nodes by role
    (marker shape and grey level), link width by rate. With ``utilisation`` (link direction
    "a->b" -> fraction of its rate) it is a weathermap: each link coloured by the busier of
    its directions on a sequential colormap, dotted where neither was measured."""
    fmt = drawing_format(path)
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.collections import LineCollection
    from matplotlib.lines import Line2D

    circular = fabric.kind == "dragonfly"
    pos = group_layout(fabric) if circular else tier_layout(fabric)
    xs = [x for x, _ in pos.values()]
    ys = [y for _, y in pos.values()]
    span_x, span_y = max(xs) - min(xs) + 1, max(ys) - min(ys) + 1
    if circular:
        size = min(18.0, max(8.0, span_x * 0.45))
        figsize = (size, size)
    else:
        figsize = (min(40.0, max(8.0, span_x * 0.3 + 2)), max(4.0, span_y * 1.3 + 1.5))
    fig, ax = plt.subplots(figsize=figsize)
    rates = [link.rate_mbit for link in fabric.links if link.rate_mbit]
    top = max(rates, default=1.0)
    segments, widths, colors, styles = [], [], [], []
    extra_legend = []
    for link in fabric.links:
        segments.append([pos[link.a], pos[link.b]])
        share = (link.rate_mbit or top) / top
        widths.append(0.4 + 1.6 * math.sqrt(share))
        a, b = fabric.nodes[link.a], fabric.nodes[link.b]
        crosses_groups = circular and not (a.is_host or b.is_host) and a.coords[0] != b.coords[0]
        colors.append(GLOBAL_LINK_COLOR if crosses_groups else IDLE_LINK_COLOR)
        styles.append("--" if crosses_groups else "-")
    if circular and utilisation is None:
        extra_legend.append(Line2D([], [], color=GLOBAL_LINK_COLOR, linestyle="--",
                                   label="global link (between groups)"))
    if utilisation is not None:
        cmap = plt.get_cmap(UTILISATION_CMAP)
        norm = matplotlib.colors.Normalize(vmin=0.0, vmax=1.0)
        busier = link_utilisation(fabric, utilisation)
        colors = [UNMEASURED_LINK["color"] if u is None else cmap(norm(min(u, 1.0)))
                  for u in busier]
        styles = [UNMEASURED_LINK["linestyle"] if u is None else "-" for u in busier]
        bar = fig.colorbar(matplotlib.cm.ScalarMappable(norm=norm, cmap=cmap), ax=ax,
                           fraction=0.025, pad=0.01)
        bar.set_label("utilisation of the busier direction (fraction of the link rate)",
                      fontsize=7)
        if any(u is None for u in busier):
            extra_legend.append(Line2D([], [], label="not measured", **UNMEASURED_LINK))
    ax.add_collection(LineCollection(segments, linewidths=widths, colors=colors,
                                     linestyles=styles,
                                     alpha=0.5 if circular and utilisation is None else 0.9,
                                     zorder=1))
    many = len(fabric.nodes) > LABEL_NODES_UP_TO
    roles: dict[str, list[str]] = {}
    for node in fabric.nodes.values():
        roles.setdefault(node.role, []).append(node.name)
    for index, (role, names) in enumerate(roles.items()):
        marker, fill = role_style(role, index)
        ax.scatter([pos[n][0] for n in names], [pos[n][1] for n in names],
                   s=22 if role == HOST else 80, marker=marker, color=fill,
                   edgecolors="black", linewidths=0.6, zorder=2,
                   label=f"{role} ({len(names)})")
        if many:
            continue
        below = role == HOST and not circular
        # names wider than the gap to the next node in their row are written upright
        upright = not circular and len(names) * max(map(len, names)) * 0.06 > span_x * 0.3
        for name in names:
            ax.annotate(name, pos[name], xytext=(0, -5 if below else 5),
                        textcoords="offset points", rotation=90 if upright else 0,
                        ha="center", va="top" if below else "bottom",
                        fontsize=5 if below or circular else 6)
    params = textwrap.fill(", ".join(f"{k}={_number(v)}" for k, v in fabric.params.items()),
                           width=int(figsize[0] * 14))  # about 14 characters an inch at 8 pt
    heading = f"{title}\n{'weathermap' if utilisation is not None else 'topology'}: " \
        if title else ""
    ax.set_title(f"{heading}{fabric.kind}: {len(fabric.hosts)} hosts, {len(fabric.switches)} "
                 f"switches, {len(fabric.links)} links\n{params}", fontsize=8)
    handles, _ = ax.get_legend_handles_labels()
    ax.legend(handles=handles + extra_legend, loc="upper left",
              bbox_to_anchor=(1.08 if utilisation is not None else 1.0, 1.0), fontsize=7)
    ax.margins(0.05, 0.12)
    ax.set_aspect("equal" if circular else "auto")
    ax.axis("off")
    fig.tight_layout()
    path = Path(path)  # in a folder that exists: the caller's, or a run's plots/
    try:
        fig.savefig(path, dpi=150, format=fmt, bbox_inches="tight")
    finally:
        plt.close(fig)
    return path
