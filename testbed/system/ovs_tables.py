"""What OVS reports, parsed into records: a switch's OpenFlow tables (``ovs-ofctl dump-groups``
/ ``dump-flows``), what the testbed compares with the tables the controller computed and what
``testbed cli`` shows; and rows of OVS's database as ``ovs-vsctl --format=json`` prints them
(bridges, ports, interfaces and their statistics), never its text formats."""
from __future__ import annotations

import json
from dataclasses import dataclass


@dataclass(frozen=True)
class GroupEntry:
    """One group: its id, type (select, all, indirect, fast_failover) and buckets (each the
    text of its properties and actions, e.g. ``weight:1,actions=output:3``)."""

    group_id: int
    type: str
    buckets: tuple[str, ...]


def parse_groups(text: str) -> list[GroupEntry]:
    """Every ``group_id=...`` line of ``ovs-ofctl -O OpenFlow13 dump-groups`` output."""
    groups = []
    for line in text.splitlines():
        line = line.strip()
        if not line.startswith("group_id="):
            continue
        head, *buckets = line.split(",bucket=")
        fields = dict(part.split("=", 1) for part in head.split(",") if "=" in part)
        groups.append(GroupEntry(int(fields["group_id"]), fields.get("type", ""),
                                 tuple(buckets)))
    return groups


@dataclass(frozen=True)
class FlowEntry:
    """One flow: table, priority, match (text), actions (text) and its counters."""

    table: int
    priority: int
    match: str
    actions: str
    packets: int
    bytes: int


def parse_flows(text: str) -> list[FlowEntry]:
    """Every flow line of ``ovs-ofctl -O OpenFlow13 dump-flows`` output."""
    flows = []
    for line in text.splitlines():
        line = line.strip()
        if " actions=" not in line and not line.startswith("actions="):
            continue
        head, _, actions = line.partition("actions=")
        fields, match = {}, []
        for part in head.replace(", ", ",").strip().strip(",").split(","):
            key, sep, value = part.strip().partition("=")
            if key in ("cookie", "duration", "table", "n_packets", "n_bytes", "priority",
                       "idle_age", "hard_age", "idle_timeout", "hard_timeout", "reset_counts"):
                fields[key] = value
            elif part.strip():
                match.append(part.strip() if sep else key)
        first = match[0].split(" ", 1) if match else [""]
        if len(first) > 1:  # "priority=10 ip" without a comma before the match
            match[0] = first[1]
        flows.append(FlowEntry(int(fields.get("table", 0)), int(fields.get("priority", 32768)),
                               ",".join(m for m in match if m), actions.strip(),
                               int(fields.get("n_packets", 0)), int(fields.get("n_bytes", 0))))
    return flows


def ovsdb_value(value):
    """One column's value in OVSDB's JSON notation (RFC 7047) as plain data: a set is a list,
    a map a dict, a UUID its string; an atom stays as it is (OVSDB writes a set of exactly one
    element as that element)."""
    if isinstance(value, list) and len(value) == 2 and isinstance(value[0], str):
        kind, inner = value
        if kind == "set":
            return [ovsdb_value(v) for v in inner]
        if kind == "map":
            return {ovsdb_value(k): ovsdb_value(v) for k, v in inner}
        if kind in ("uuid", "named-uuid"):
            return inner
    return value


def parse_vsctl_json(text: str) -> list[dict]:
    """``ovs-vsctl --format=json list TABLE`` (or ``find``) output -> one dict per row,
    keyed by column name."""
    if not text.strip():
        return []
    table = json.loads(text)
    return [dict(zip(table["headings"], map(ovsdb_value, row))) for row in table["data"]]
