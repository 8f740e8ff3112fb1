"""Forwarding after failures: the routes of testbed.controllers.routing.ecmp recomputed on what survives,
and the difference to the state the switches already hold, so that a controller sends only
that difference.

Three steps, all pure:
  1. ``resolve_failures`` names what is down (links by their Link or by either (node, port)
     end; switches by name) and ``surviving_fabric`` returns a copy of the fabric without it.
     A failed switch stays in the copy without any link, so it gets empty rules; a host cabled
     to a failed link or switch is left out, so no switch keeps a route toward it.
  2. ``recompute_rules`` runs ``routing.compute_rules`` on that copy (same shortest-path ECMP,
     same loop freedom) and renumbers the new groups against the previous ones
     (``stable_group_ids``), because ``SwitchRules.group_for`` numbers groups 1, 2, ... in the
     order destinations first use them: after a failure the same number can name another
     bucket set.
  3. ``rule_diff`` compares two rule sets group id by group id and route by destination.
     The controller sends such a difference make before break (testbed.controllers.routing.forwarding,
     ``update_plan``: groups added and modified, flows added and modified, barrier, flows
     deleted, groups deleted, barrier).

Group numbering after a recomputation, per switch:
  - a bucket set the switch already had keeps its id (no message at all);
  - a new bucket set whose routes mostly used one group that is going away inherits that id:
    one OFPGC_MODIFY then moves every route using it at once (an ECMP group losing one
    uplink is the common case);
  - any other new bucket set gets an id no previous group used, so adding it never disturbs
    a group still referenced by installed flows (make before break).
"""
from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field, replace

from testbed.controllers.routing.ecmp import (
    ECMP,
    PortRoute,
    Route,
    SwitchRules,
    compute_rules,
)
from testbed.model.topology.base import Fabric, Link

LinkRef = Link | tuple[str, int]


@dataclass(frozen=True)
class Failures:
    """What is down: links (as the fabric's Link objects) and switches (by name)."""

    links: frozenset[Link] = frozenset()
    switches: frozenset[str] = frozenset()


def resolve_failures(fabric: Fabric, links: Iterable[LinkRef] = (),
                     switches: Iterable[str] = ()) -> Failures:
    """Failures in the fabric's own terms. A link is given as a Link or as either of its
    (node, port) ends; unknown ends and names that are not switches are ValueErrors."""
    by_end = {}
    for link in fabric.links:
        by_end[(link.a, link.a_port)] = link
        by_end[(link.b, link.b_port)] = link
    failed_links = set()
    for ref in links:
        end = (ref.a, ref.a_port) if isinstance(ref, Link) else tuple(ref)
        if end not in by_end:
            raise ValueError(f"no link ends at {end}")
        failed_links.add(by_end[end])
    failed_switches = frozenset(switches)
    for name in failed_switches:
        node = fabric.nodes.get(name)
        if node is None or node.is_host:
            raise ValueError(f"{name!r} is not a switch of this fabric")
    return Failures(frozenset(failed_links), failed_switches)


def surviving_fabric(fabric: Fabric, failures: Failures) -> Fabric:
    """A copy of the fabric without the failed links, without every link of a failed switch,
    and without the hosts those took off the fabric. Failed switches stay, unlinked."""
    links = [link for link in fabric.links
             if link not in failures.links
             and link.a not in failures.switches and link.b not in failures.switches]
    cabled = {name for link in links for name in (link.a, link.b)}
    nodes = {name: node for name, node in fabric.nodes.items()
             if not node.is_host or name in cabled}
    return Fabric(kind=fabric.kind, params=dict(fabric.params), nodes=nodes, links=links,
                  mtu_bytes=fabric.mtu_bytes)


def stable_group_ids(previous: SwitchRules, current: SwitchRules) -> SwitchRules:
    """``current`` with its groups renumbered against ``previous`` (see the module docstring):
    same buckets, same id; a successor inherits the id of the group it replaces; anything
    else takes an id unused by both."""
    current_sets = set(current.groups.values())
    kept = {ports: gid for gid, ports in previous.groups.items() if ports in current_sets}
    retiring = set(previous.groups) - set(kept.values())
    before = {route.dst_ip: route.group_id for route in previous.routes}
    followers: dict[tuple[int, ...], Counter] = defaultdict(Counter)
    for route in current.routes:
        if route.group_id is None:
            continue
        ports = current.groups[route.group_id]
        if ports not in kept and before.get(route.dst_ip) in retiring:
            followers[ports][before[route.dst_ip]] += 1
    new_id = dict(kept)
    # the bucket set followed by the most routes claims its predecessor first
    for ports, votes in sorted(followers.items(), key=lambda kv: (-sum(kv[1].values()), kv[0])):
        predecessor = min(votes, key=lambda gid: (-votes[gid], gid))
        if predecessor not in new_id.values():
            new_id[ports] = predecessor
    taken = set(previous.groups) | set(new_id.values())
    fresh = (gid for gid in range(1, len(taken) + len(current.groups) + 2) if gid not in taken)
    for ports in current.groups.values():
        if ports not in new_id:
            new_id[ports] = next(fresh)
    renumber = {gid: new_id[ports] for gid, ports in current.groups.items()}
    return replace(
        current,
        groups={renumber[gid]: ports for gid, ports in sorted(current.groups.items(),
                                                             key=lambda kv: renumber[kv[0]])},
        routes=[r if r.group_id is None else replace(r, group_id=renumber[r.group_id])
                for r in current.routes])


def recompute_rules(fabric: Fabric, failures: Failures,
                    previous: dict[str, SwitchRules] | None = None,
                    mode: str = ECMP) -> dict[str, SwitchRules]:
    """Rules for every switch of ``fabric`` with ``failures`` taken out, group ids kept stable
    against ``previous`` (the rules the switches hold now) when given."""
    rules = compute_rules(surviving_fabric(fabric, failures), mode)
    if previous is None:
        return rules
    return {name: stable_group_ids(previous[name], r) if name in previous else r
            for name, r in rules.items()}


@dataclass
class SwitchDiff:
    """What one switch must change to go from its old rules to its new ones: groups by id
    (added, buckets changed, removed), routes by destination IPv4 address and port routes by
    input port (added or changed: the new route; removed: its key)."""

    name: str
    dpid: int
    groups_added: dict[int, tuple[int, ...]] = field(default_factory=dict)
    groups_modified: dict[int, tuple[int, ...]] = field(default_factory=dict)
    groups_removed: tuple[int, ...] = ()
    routes_added: tuple[Route, ...] = ()
    routes_changed: tuple[Route, ...] = ()
    routes_removed: tuple[str, ...] = ()
    port_routes_added: tuple[PortRoute, ...] = ()
    port_routes_changed: tuple[PortRoute, ...] = ()
    port_routes_removed: tuple[int, ...] = ()

    @property
    def message_count(self) -> int:
        """Group and flow modifications needed, one per changed group or route."""
        return sum(len(getattr(self, name)) for name in CHANGE_FIELDS)

    @property
    def is_empty(self) -> bool:
        return self.message_count == 0


CHANGE_FIELDS = ("groups_added", "groups_modified", "groups_removed", "routes_added",
                 "routes_changed", "routes_removed", "port_routes_added", "port_routes_changed",
                 "port_routes_removed")


def keyed_changes(old: dict, new: dict) -> tuple[dict, dict, tuple]:
    """(added, changed: key -> new value; removed keys) between two keyed tables."""
    return ({k: v for k, v in new.items() if k not in old},
            {k: v for k, v in new.items() if k in old and old[k] != v},
            tuple(k for k in old if k not in new))


def switch_diff(old: SwitchRules, new: SwitchRules) -> SwitchDiff:
    """The difference between two rule sets of one switch (compared id by id: give ``new``
    through ``stable_group_ids`` first, or ids that moved show up as modifications)."""
    groups = keyed_changes(old.groups, new.groups)
    routes = keyed_changes({r.dst_ip: r for r in old.routes}, {r.dst_ip: r for r in new.routes})
    port_routes = keyed_changes({r.in_port: r for r in old.port_routes},
                                {r.in_port: r for r in new.port_routes})
    return SwitchDiff(
        new.name, new.dpid,
        groups_added=groups[0], groups_modified=groups[1], groups_removed=groups[2],
        routes_added=tuple(routes[0].values()), routes_changed=tuple(routes[1].values()),
        routes_removed=routes[2],
        port_routes_added=tuple(port_routes[0].values()),
        port_routes_changed=tuple(port_routes[1].values()), port_routes_removed=port_routes[2])


def rule_diff(old: dict[str, SwitchRules],
              new: dict[str, SwitchRules]) -> dict[str, SwitchDiff]:
    """Per-switch differences, only for switches that have any; a switch missing on one side
    counts as having no rules there."""
    diffs = {}
    for name in list(old) + [n for n in new if n not in old]:
        before = old.get(name) or SwitchRules(name, new[name].dpid)
        after = new.get(name) or SwitchRules(name, old[name].dpid)
        diff = switch_diff(before, after)
        if not diff.is_empty:
            diffs[name] = diff
    return diffs
