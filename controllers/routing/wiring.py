"""Checking the cabling against the fabric description: what every switch port should face,
the LLDP frame a port sends to say who it is, and a verdict per port. Plain data, no
OpenFlow: testbed.controllers.apps.lldp_app sends the frames, feeds in what the switches report and
writes the verdicts.

The description the network was built from (testbed.model.topology.base.Fabric) says where every
cable goes. Every port that should face another switch sends an LLDP frame naming itself
(chassis id: the switch's DPID, port id: the port number); the switch at the other end hands
it to the controller (the LLDP rule of testbed.controllers.routing.forwarding), and the port it came in on is
where that cable really arrives. Host-facing ports send nothing: hosts have no use for it.

Verdicts, for every switch port of the description and every port a switch reports beyond it:

    ok          up; received LLDP from the expected port (host-facing: up, and no LLDP)
    miswired    up; received LLDP from another port than the expected one (a host-facing
                port receiving any is miswired too: a switch is cabled where a host should be)
    missing     up and should face a switch, but no LLDP arrived before the check's deadline
    down        reported by its switch, but link down or administratively down
    absent      not in its switch's port list, or its switch is not connected
    unexpected  reported by its switch, but not in the description

A swapped pair of cables shows as four miswired ports: the two ports whose cables were
swapped and the two far ends, each receiving the other's neighbour.

When a check runs (``CheckSchedule``): any change (a switch programmed or gone, a port added,
removed, up or down) starts it again, since frames received before the change may describe
the cabling before it; it sends LLDP rounds at ``ROUND_DELAYS_S`` after its start, and is
judged ``DEADLINE_AFTER_LAST_ROUND_S`` after the last one. With the defaults a verdict comes
once the fabric has been quiet for 2.5 s, and a fabric coming up (hundreds of changes a
second) gets no LLDP until it has been quiet for 0.5 s. A cable moved between two ports that
stay up changes nothing a switch reports, so a periodic check also starts
``RECHECK_INTERVAL_S`` after the last verdict (0: never); the first one waits for a first
verdict, which the switches' connecting brings. Each check records its ``trigger``:
``change`` or ``periodic``.

The report file holds JSON lines: one ``wiring_port`` record per port, then one
``wiring_check`` record with the counts, written last, so a reader that sees it knows the
check is complete (``wiring_checks`` reads them back). A periodic check that finds every
verdict as the last check did writes its ``wiring_check`` record alone, naming in
``same_verdicts_as`` the check whose port records hold them: one line per quiet check.
"""
from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from os_ken.lib.dpid import dpid_to_str
from os_ken.lib.packet import ether_types, ethernet, lldp, packet

from testbed.model.topology.base import Fabric

End = tuple[str, int]  # (switch, port)
Sender = tuple[int, int]  # (dpid, port) an LLDP frame names

OK, MISWIRED, MISSING, DOWN, ABSENT, UNEXPECTED = (
    "ok", "miswired", "missing", "down", "absent", "unexpected")
STATUSES = (OK, MISWIRED, MISSING, DOWN, ABSENT, UNEXPECTED)
PORT_EVENT, CHECK_EVENT = "wiring_port", "wiring_check"
CHANGE, PERIODIC = "change", "periodic"  # what started a check: its ``trigger``
SAME_AS = "same_verdicts_as"  # a check record's field: the check whose port records it shares

# os-ken's own chassis id format (os_ken.topology.switches.LLDPPacket): "dpid:" + 16 hex digits.
CHASSIS_ID_PREFIX = "dpid:"
DPID_HEX_DIGITS = 16
LLDP_TTL_S = 10  # how long a receiver may trust a frame: every check sends fresh ones
ROUND_DELAYS_S = (0.5, 1.5)  # LLDP rounds, after a check (re)starts
DEADLINE_AFTER_LAST_ROUND_S = 1.0  # a port with no LLDP by then is missing its neighbour
RECHECK_INTERVAL_S = 10.0  # a periodic check this long after the last verdict (0: none)


@dataclass(frozen=True)
class Peer:
    """The far end of a cable: a switch port, or a host's eth0 (port 0, ``is_host``). A frame
    from a DPID the description does not know names its chassis id as ``node``."""

    node: str
    port: int
    is_host: bool = False

    def describe(self) -> str:
        return f"host {self.node}" if self.is_host else f"{self.node}:{self.port}"

    def to_dict(self) -> dict:
        return {"node": self.node, "port": self.port, "is_host": self.is_host}


def expected_neighbours(fabric: Fabric) -> dict[End, Peer]:
    """(switch, port) -> what its cable should reach, for every switch port of the fabric, in
    the fabric's switch order and then by port. ValueError for a port cabled twice."""
    expected: dict[End, Peer] = {}
    for link in fabric.links:
        ends = ((link.a, link.a_port), (link.b, link.b_port))
        for (node, port), (peer, peer_port) in (ends, ends[::-1]):
            if fabric.nodes[node].is_host:
                continue
            if (node, port) in expected:
                raise ValueError(f"{node}:{port} is cabled twice in the description")
            expected[(node, port)] = Peer(peer, peer_port, fabric.nodes[peer].is_host)
    order = {name: index for index, name in enumerate(fabric.nodes)}
    return dict(sorted(expected.items(), key=lambda item: (order[item[0][0]], item[0][1])))


def lldp_ports(expected: Mapping[End, Peer], switch: str, ports_up: Mapping[int, bool]
               ) -> list[int]:
    """The ports of ``switch`` that send LLDP: up, and not expected to face a host (a port the
    description does not have sends too, so that its far end tells where it goes)."""
    return sorted(port for port, up in ports_up.items()
                  if up and not faces_host(expected, (switch, port)))


def faces_host(expected: Mapping[End, Peer], end: End) -> bool:
    peer = expected.get(end)
    return peer is not None and peer.is_host


# --- LLDP frames -----------------------------------------------------------------------------

def lldp_frame(dpid: int, port: int, src_mac: str) -> bytes:
    """The Ethernet frame switch ``dpid`` sends out of ``port`` (its MAC ``src_mac``): LLDP to
    the nearest-bridge group address, chassis id "dpid:<16 hex digits>", port id the port
    number in decimal, both locally assigned."""
    frame = packet.Packet()
    frame.add_protocol(ethernet.ethernet(dst=lldp.LLDP_MAC_NEAREST_BRIDGE, src=src_mac,
                                         ethertype=ether_types.ETH_TYPE_LLDP))
    frame.add_protocol(lldp.lldp((
        lldp.ChassisID(subtype=lldp.ChassisID.SUB_LOCALLY_ASSIGNED,
                       chassis_id=(CHASSIS_ID_PREFIX + dpid_to_str(dpid)).encode("ascii")),
        lldp.PortID(subtype=lldp.PortID.SUB_LOCALLY_ASSIGNED, port_id=str(port).encode("ascii")),
        lldp.TTL(ttl=LLDP_TTL_S),
        lldp.End())))
    frame.serialize()
    return bytes(frame.data)


def parse_lldp(data: bytes) -> Sender | None:
    """(dpid, port) of the switch port that sent the Ethernet frame ``data``; None when it is
    not an LLDP frame in ``lldp_frame``'s format (a host's own LLDP daemon, say)."""
    try:
        frame = packet.Packet(data).get_protocol(lldp.lldp)
    except Exception:  # os-ken's parsers raise what they meet first on malformed input
        return None
    if frame is None or len(frame.tlvs) < 2:
        return None
    chassis, port = frame.tlvs[0], frame.tlvs[1]
    if (not isinstance(chassis, lldp.ChassisID) or not isinstance(port, lldp.PortID)
            or chassis.subtype != lldp.ChassisID.SUB_LOCALLY_ASSIGNED
            or port.subtype != lldp.PortID.SUB_LOCALLY_ASSIGNED):
        return None
    chassis_id = chassis.chassis_id.decode("ascii", errors="replace")
    port_id = port.port_id.decode("ascii", errors="replace")
    digits = chassis_id[len(CHASSIS_ID_PREFIX):]
    if (not chassis_id.startswith(CHASSIS_ID_PREFIX) or len(digits) != DPID_HEX_DIGITS
            or any(c not in "0123456789abcdefABCDEF" for c in digits)
            or not (port_id.isascii() and port_id.isdigit())):
        return None
    return int(digits, 16), int(port_id)


# --- verdicts --------------------------------------------------------------------------------

@dataclass(frozen=True)
class PortVerdict:
    """One switch port's verdict: ``expected`` is what the description cables it to (None for
    an unexpected port), ``seen`` the sender of the LLDP frame it received (None: none)."""

    switch: str
    port: int
    status: str
    expected: Peer | None = None
    seen: Peer | None = None

    @property
    def end(self) -> End:
        return self.switch, self.port

    def describe(self) -> str:
        """"p0e0:3 miswired: expected p0a0:1, saw p0a0:2"."""
        parts = []
        if self.expected is not None:
            parts.append(f"expected {self.expected.describe()}")
        if self.seen is not None:
            parts.append(f"saw {self.seen.describe()}")
        return f"{self.switch}:{self.port} {self.status}" + (": " + ", ".join(parts)
                                                               if parts else "")

    def to_dict(self) -> dict:
        return {"switch": self.switch, "port": self.port, "status": self.status,
                "expected": self.expected.to_dict() if self.expected else None,
                "seen": self.seen.to_dict() if self.seen else None}


def sender_peer(sender: Sender, names: Mapping[int, str]) -> Peer:
    """The port an LLDP frame names, by switch name when the description knows its DPID."""
    dpid, port = sender
    return Peer(names.get(dpid, CHASSIS_ID_PREFIX + dpid_to_str(dpid)), port)


def port_verdict(end: End, expected: Peer | None, ports_up: Mapping[int, bool] | None,
                 seen: Peer | None) -> PortVerdict:
    """The verdict on one port; ``ports_up`` is its switch's port list (None: not connected)."""
    switch, port = end
    if expected is None:
        return PortVerdict(switch, port, UNEXPECTED, None, seen)
    if ports_up is None or port not in ports_up:
        status = ABSENT
    elif not ports_up[port]:
        status = DOWN
    elif seen is None:
        status = OK if expected.is_host else MISSING
    else:
        status = OK if seen == expected else MISWIRED
    return PortVerdict(switch, port, status, expected, seen)


def judge(expected: Mapping[End, Peer], ports: Mapping[str, Mapping[int, bool]],
          received: Mapping[End, Sender], names: Mapping[int, str]) -> list[PortVerdict]:
    """Every port's verdict: the description's ports in its order, then the unexpected ones.

    ``ports``: switch -> {port number: up}, as the connected switches report them (a switch
    missing from it is not connected); ``received``: (switch, port) -> the (dpid, port) named
    by the LLDP frame received there during the check; ``names``: dpid -> switch name."""
    verdicts = []
    for end, peer in expected.items():
        sender = received.get(end)
        verdicts.append(port_verdict(end, peer, ports.get(end[0]),
                                     sender_peer(sender, names) if sender else None))
    reported = {(switch, port) for switch, up in ports.items() for port in up}
    for end in sorted((reported | set(received)) - set(expected)):
        sender = received.get(end)
        verdicts.append(port_verdict(end, None, ports.get(end[0]),
                                     sender_peer(sender, names) if sender else None))
    return verdicts


def status_counts(verdicts: Iterable[PortVerdict]) -> dict[str, int]:
    """How many ports got each verdict, every status present."""
    counts = Counter(v.status for v in verdicts)
    return {status: counts[status] for status in STATUSES}


# --- when a check runs -----------------------------------------------------------------------

@dataclass
class CheckSchedule:
    """When the running check sends its LLDP rounds and when it is judged, and when the next
    periodic check starts (module docstring). Times are CLOCK_MONOTONIC seconds; ``started_s``
    is None while no check runs, ``judged_s`` until the first verdict; ``trigger`` is what
    started the running (or the last) check, CHANGE or PERIODIC."""

    round_delays_s: tuple[float, ...] = ROUND_DELAYS_S
    deadline_s: float = DEADLINE_AFTER_LAST_ROUND_S
    recheck_interval_s: float = RECHECK_INTERVAL_S  # 0: no periodic check
    started_s: float | None = None
    trigger: str | None = None
    rounds_sent: int = 0
    judged_s: float | None = None

    def start(self, now_s: float, trigger: str = CHANGE) -> None:
        """Start a check, or start it again: something changed (CHANGE), or a periodic check
        is due (PERIODIC)."""
        self.started_s = now_s
        self.trigger = trigger
        self.rounds_sent = 0

    def round_due(self, now_s: float) -> bool:
        return (self.started_s is not None and self.rounds_sent < len(self.round_delays_s)
                and now_s >= self.started_s + self.round_delays_s[self.rounds_sent])

    def round_sent(self) -> None:
        self.rounds_sent += 1

    def judge_due(self, now_s: float) -> bool:
        return (self.started_s is not None and self.rounds_sent == len(self.round_delays_s)
                and now_s >= self.started_s + self.round_delays_s[-1] + self.deadline_s)

    def judged(self, now_s: float) -> None:
        self.started_s = None
        self.judged_s = now_s

    def recheck_due(self, now_s: float) -> bool:
        """A periodic check should start: periodic checks are on, no check runs, and the last
        verdict is ``recheck_interval_s`` old (before any verdict, none is due)."""
        return (self.recheck_interval_s > 0 and self.started_s is None
                and self.judged_s is not None
                and now_s >= self.judged_s + self.recheck_interval_s)


# --- the report ------------------------------------------------------------------------------

def same_verdicts_as(trigger: str, verdicts: list[PortVerdict],
                     written: tuple[int, list[PortVerdict]] | None) -> int | None:
    """The check whose port records a check may name instead of writing its own, or None.
    ``written`` is (check, verdicts) of the last check that wrote port records (None: none
    yet). Only a periodic check refers back: a check a change started is written in full."""
    if trigger != PERIODIC or written is None:
        return None
    check, previous = written
    return check if previous == verdicts else None


def report_records(check: int, started_s: float, t_s: float, verdicts: list[PortVerdict],
                   trigger: str, same_as: int | None = None) -> list[dict]:
    """The report lines of one check: a record per port, then the check's own record; only
    the check's own record when ``same_as`` names a check whose port records hold the same
    verdicts (``same_verdicts_as``)."""
    common = {"t_monotonic_s": t_s, "check": check}
    closing = {**common, "event": CHECK_EVENT, "trigger": trigger,
               "started_monotonic_s": started_s, "ports_checked": len(verdicts),
               **status_counts(verdicts)}
    if same_as is not None:
        return [{**closing, SAME_AS: same_as}]
    return [{**common, "event": PORT_EVENT, **v.to_dict()} for v in verdicts] + [closing]


def wiring_checks(records: Iterable[dict]) -> list[dict]:
    """The complete checks in a report's records (JSON lines read back), oldest first: each
    its ``wiring_check`` record with ``verdicts``, its port records, added; a check that
    names another in ``same_verdicts_as`` gets that one's, as its own port records would
    have been. A check whose closing record is missing (the controller stopped mid-report) is
    left out, as is one naming a check not in the records. Records written before checks had
    a ``trigger`` read as started by a change."""
    ports: dict[int, list[dict]] = {}  # port records of checks not closed yet
    written: dict[int, list[dict]] = {}  # check -> its port records (the latest by that number)
    checks = []
    for record in records:
        if record.get("event") == PORT_EVENT:
            ports.setdefault(record["check"], []).append(record)
        elif record.get("event") != CHECK_EVENT:
            continue
        elif SAME_AS in record:
            if record[SAME_AS] not in written:
                continue
            own = {"t_monotonic_s": record["t_monotonic_s"], "check": record["check"]}
            checks.append({"trigger": CHANGE, **record,
                           "verdicts": [{**v, **own} for v in written[record[SAME_AS]]]})
        else:
            written[record["check"]] = ports.pop(record["check"], [])
            checks.append({"trigger": CHANGE, **record, "verdicts": written[record["check"]]})
    return checks


def wiring_summary(records: Iterable[dict]) -> dict | None:
    """The latest complete check, for a run's summary: its counts, what started it and a line
    per port that is not ok; None when no check completed."""
    checks = wiring_checks(records)
    if not checks:
        return None
    latest = checks[-1]
    problems = [PortVerdict(v["switch"], v["port"], v["status"],
                            Peer(**v["expected"]) if v["expected"] else None,
                            Peer(**v["seen"]) if v["seen"] else None).describe()
                for v in latest["verdicts"] if v["status"] != OK]
    return {"check": latest["check"], "checks": len(checks), "trigger": latest["trigger"],
            "ports_checked": latest["ports_checked"], **{s: latest[s] for s in STATUSES},
            "problems": problems}
