"""A scenario's failure schedule as plain data: each entry of ``failures:``
(testbed.harness.scenario.FailureSpec) expanded, on one fabric, into the timed events the
harness applies (testbed.apply.failures.FailureSchedule), and the applied events paired back
into fault windows for the plots.

    at_s                       at_s + for_s
      |---- link_down p0a0-c1 ----|  link_up p0a0-c1 (implied; also applied when the run
                                     ends first, however it ends)

An entry names one target (``link``, ``switch``, a ``daemon``, a daemon in one ``host``) or
selects several (``links``, ``switches``, ``hosts``: by role, pod or names) and picks among
them by ``mode``, as Chaos Mesh's selectors do: ``one``, ``all``, a ``fixed`` number or a
``percent`` (rounded down, at least one). The pick uses a random generator seeded with the
scenario's seed and the entry's position, so a run is repeatable and one entry's pick does
not change when another entry is added. Pods are the fat-tree's and the 5-stage Clos' pods
and a dragonfly's groups: nodes carry them as their first coordinate; other families have
none.
"""
from __future__ import annotations

import math
import random
from dataclasses import dataclass, replace

from testbed.model.topology.base import (
    AGGREGATION,
    EDGE,
    HOST,
    LEAF,
    ROUTER,
    SPINE,
    Fabric,
)
from testbed.plan.port_queue import Impairment

LINK_DOWN, LINK_UP, SWITCH_DOWN, SWITCH_UP = "link_down", "link_up", "switch_down", "switch_up"
CONTROLLER_RESTART, IMPAIR, STOP, KILL = "controller_restart", "impair", "stop", "kill"
UNIMPAIR, RESUME = "unimpair", "resume"  # the heals of impair and stop
HEAL_OF = {LINK_DOWN: LINK_UP, SWITCH_DOWN: SWITCH_UP, IMPAIR: UNIMPAIR, STOP: RESUME}
HEALS = frozenset(HEAL_OF.values())
# Roles that belong to a pod, by family (the pod is the node's first coordinate).
POD_ROLES = {"fattree": frozenset({EDGE, AGGREGATION, HOST}),
             "clos": frozenset({LEAF, SPINE, HOST}),
             "dragonfly": frozenset({ROUTER, HOST})}


@dataclass(frozen=True)
class FailureEvent:
    """One timed step of a schedule: ``action`` at ``at_s`` on ``link`` (a, b), ``switch``,
    a ``daemon`` (in ``host`` for a host's program), with the ``impairment`` an ``impair``
    sets. ``fault`` is the index of the schedule entry it came from, ``heal`` marks the step
    that ends that entry's fault."""

    at_s: float
    action: str
    link: tuple[str, str] | None = None
    switch: str | None = None
    daemon: str | None = None
    host: str | None = None
    impairment: Impairment | None = None
    fault: int | None = None
    heal: bool = False

    @property
    def target(self) -> str:
        if self.link:
            return "-".join(self.link)
        if self.switch:
            return self.switch
        if self.daemon:
            return self.daemon + (f" on {self.host}" if self.host else "")
        return ""

    def describe(self) -> str:
        """``link_down p0e0-p0a0``, ``controller_restart``, ``kill traffic on p1e0h1``,
        ``impair p0a0-c0 (loss 1%, delay 5 ms)``."""
        text = f"{self.action} {self.target}".strip()
        if self.impairment is not None:
            i = self.impairment
            parts = [f"loss {i.loss_percent:g}%"] if i.loss_percent else []
            if i.delay_ms:
                parts.append(f"delay {i.delay_ms:g} ms" + (f" +- {i.jitter_ms:g} ms"
                                                             if i.jitter_ms else ""))
            text += f" ({', '.join(parts)})"
        return text


# --- pods and selectors -----------------------------------------------------------------------


def node_pod(fabric: Fabric, name: str) -> int | None:
    """The pod ``name`` belongs to (a dragonfly's group), or None (a core switch, a
    super-spine, a family without pods)."""
    roles = POD_ROLES.get(fabric.kind)
    if roles is None or fabric.kind == "clos" and fabric.params.get("stages") != 5:
        return None
    node = fabric.nodes[name]
    return node.coords[0] if node.role in roles and node.coords else None


def has_pods(fabric: Fabric) -> bool:
    return any(node_pod(fabric, name) is not None for name in fabric.nodes)


def node_matches(fabric: Fabric, name: str, selector) -> bool:
    """Whether node ``name`` is one a selector (role, pod, names; all optional) picks."""
    node = fabric.nodes[name]
    return ((selector.role is None or node.role == selector.role)
            and (selector.pod is None or node_pod(fabric, name) == selector.pod)
            and (selector.names is None or name in selector.names))


def selected_links(fabric: Fabric, selector) -> list[tuple[str, str]]:
    """Every link with an end the selector picks, as (a, b) in the fabric's order."""
    return [(link.a, link.b) for link in fabric.links
            if node_matches(fabric, link.a, selector) or node_matches(fabric, link.b, selector)]


def selected_nodes(fabric: Fabric, selector, hosts: bool) -> list[str]:
    """The hosts (or switches) the selector picks, in the fabric's order."""
    nodes = fabric.hosts if hosts else fabric.switches
    return [node.name for node in nodes if node_matches(fabric, node.name, selector)]


def pick_count(mode: str | None, value: float | None, available: int) -> int:
    """How many of ``available`` targets a mode takes: one, all (the default), a fixed
    number, or a percentage rounded down but at least one."""
    if mode == "one":
        return min(1, available)
    if mode == "fixed":
        return min(int(value), available)
    if mode == "percent":
        return min(available, max(1, math.floor(available * value / 100)))
    return available


def pick(candidates: list, mode: str | None, value: float | None, rng: random.Random) -> list:
    """The targets a mode takes from ``candidates``, chosen by ``rng``, in their order."""
    count = pick_count(mode, value, len(candidates))
    if count == len(candidates):
        return list(candidates)
    chosen = set(rng.sample(range(len(candidates)), count))
    return [c for i, c in enumerate(candidates) if i in chosen]


def entry_rng(seed: int, index: int) -> random.Random:
    """The generator one schedule entry picks its targets with."""
    return random.Random(f"failures/{seed}/{index}")


def candidates(spec, fabric: Fabric) -> tuple[str, list]:
    """What an entry may hit: ("links", [(a, b)...]), ("switches", [...]), ("hosts", [...]),
    or ("fabric", [None]) for the controller or a fabric daemon."""
    if spec.link is not None:
        return "links", [tuple(spec.link)]
    if spec.links is not None:
        return "links", selected_links(fabric, spec.links)
    if spec.switch is not None:
        return "switches", [spec.switch]
    if spec.switches is not None:
        return "switches", selected_nodes(fabric, spec.switches, hosts=False)
    if spec.host is not None:
        return "hosts", [spec.host]
    if spec.hosts is not None:
        return "hosts", selected_nodes(fabric, spec.hosts, hosts=True)
    return "fabric", [None]


# --- expanding a schedule -------------------------------------------------------------------


def entry_impairment(spec) -> Impairment | None:
    if spec.action != IMPAIR:
        return None
    return Impairment(spec.delay_ms, spec.jitter_ms, spec.loss_percent)


def entry_events(spec, index: int, fabric: Fabric, seed: int) -> list[FailureEvent]:
    """One entry's events: its start on every target it picks, and each one's heal
    ``for_s`` later when it has one."""
    kind, found = candidates(spec, fabric)
    events = []
    for target in pick(found, spec.mode, spec.value, entry_rng(seed, index)):
        start = FailureEvent(
            spec.at_s, spec.action, link=target if kind == "links" else None,
            switch=target if kind == "switches" else None, daemon=spec.daemon,
            host=target if kind == "hosts" else None, impairment=entry_impairment(spec),
            fault=index)
        events.append(start)
        if spec.for_s is not None:
            events.append(replace(start, at_s=spec.at_s + spec.for_s,
                                  action=HEAL_OF[spec.action], impairment=None, heal=True))
    return events


def schedule_events(specs, fabric: Fabric, seed: int) -> list[FailureEvent]:
    """Every entry's events on ``fabric``, in time order (entries in their order at equal
    times). An old single event (``link_down`` without ``for_s``) is one event, as before."""
    events = [e for index, spec in enumerate(specs) for e in entry_events(spec, index, fabric, seed)]
    return sorted(events, key=lambda e: e.at_s)


def impaired_links(events: list[FailureEvent]) -> list[tuple[str, str]]:
    """The links a schedule impairs: their ports get a netem (or the loss program) that does
    nothing until the fault, so starting one changes a setting instead of a queue."""
    return list(dict.fromkeys(e.link for e in events if e.action == IMPAIR))


def entry_problems(spec, fabric: Fabric) -> list[tuple[str, str]]:
    """(field, problem) for what an entry names that ``fabric`` lacks: links not cabled,
    unknown switches and hosts, a selector that matches nothing or fewer than a fixed
    number, a pod on a family without pods."""
    cabled = {frozenset((link.a, link.b)) for link in fabric.links}
    if spec.link is not None and frozenset(spec.link) not in cabled:
        return [("link", f"{spec.link[0]} and {spec.link[1]} are not cabled together")]
    if spec.switch is not None and spec.switch not in {s.name for s in fabric.switches}:
        return [("switch", f"no switch {spec.switch}")]
    if spec.host is not None and spec.host not in {h.name for h in fabric.hosts}:
        return [("host", f"no host {spec.host}")]
    if spec.selector is None:
        return []
    field = next(name for name in ("links", "switches", "hosts") if getattr(spec, name))
    selector = getattr(spec, field)
    if selector.pod is not None and not has_pods(fabric):
        return [(f"{field}.pod", f"a {fabric.kind} fabric has no pods (fat-trees, 5-stage "
                 "Clos fabrics and dragonflies (groups) have)")]
    roles = {n.role for n in (fabric.hosts if field == "hosts" else fabric.nodes.values())}
    if selector.role is not None and selector.role not in roles:
        return [(f"{field}.role", f"no node has role {selector.role}; roles here: "
                 f"{', '.join(sorted(roles))}")]
    unknown = [n for n in selector.names or () if n not in fabric.nodes]
    if unknown:
        return [(f"{field}.names", f"no node {unknown[0]}")]
    _, found = candidates(spec, fabric)
    if not found:
        return [(field, "matches nothing on this fabric")]
    if spec.mode == "fixed" and spec.value > len(found):
        return [("value", f"{spec.value:g} {field} wanted, the selector matches {len(found)}")]
    return []


# --- fault windows, for the plots -----------------------------------------------------------


def fault_windows(applied: list[dict]) -> list[dict]:
    """The applied schedule (FailureSchedule.applied: records with ``event``,
    ``t_monotonic_s``, ``action``, ``target``) as windows: a fault from its start to the heal
    of the same target (implied or given as a later event), ``end_monotonic_s`` None when it
    was never healed; an event without a heal (controller_restart, kill) is a window of its
    own with no length. Failed steps are left out."""
    windows: list[dict] = []
    open_by_target: dict[tuple[str, str], dict] = {}
    for record in sorted((r for r in applied if "t_monotonic_s" in r and "action" in r),
                         key=lambda r: r["t_monotonic_s"]):
        action, target, t = record["action"], record.get("target", ""), record["t_monotonic_s"]
        if action in HEALS:
            started = next((a for a, h in HEAL_OF.items() if h == action), None)
            window = open_by_target.pop((started, target), None)
            if window is not None:
                window["end_monotonic_s"] = t
            continue
        window = {"fault": record["event"], "start_monotonic_s": t,
                  "end_monotonic_s": None if action in HEAL_OF else t}
        windows.append(window)
        if action in HEAL_OF:
            open_by_target[(action, target)] = window
    return windows
