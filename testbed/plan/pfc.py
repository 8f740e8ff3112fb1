"""What the ports of a PFC fabric decide, as plain state machines, and the plan the pause
agent (``testbed.apply.pfc_agent``) runs from.

Two sides of every link take part:

- a **switch** watches the lossless queue of each of its egress ports (``QueueWatch``):
  above XOFF the port is congested until it falls to XON. While a queue is congested, the
  switch asks the neighbour on every port that can feed it to stop sending the class
  (``PauseSender``). It sends XOFF with the configured quanta, repeats it before the pause
  would run out, and sends XON when that port feeds no congested queue any more;
- a **port that receives** a pause (a switch port or a host's NIC) stops sending the class
  for the quanta, or until XON (``PauseTimer``), and accounts the time it spends paused;
  a pause longer than the storm threshold in one go is a pause storm.

Which neighbours a switch pauses: a hardware switch counts each queued packet against the
port it came in on and pauses the ingress ports whose share crosses XOFF. A software switch
does not know, per queued packet, its ingress port (the userspace datapath sends every frame
from one socket), so the plan works it out from the routing instead (``feeding_ports``):
an ingress port feeds an egress queue when some destination that the switch forwards out of
that queue can arrive on it, i.e. a host port, or a neighbour switch whose shortest-path
next hops for that destination include this switch. Under shortest-path routing (ECMP,
single path) traffic never turns back up, so an aggregation switch does not pause the
cores for its uplink queues, which only edges feed, and the pause dependencies stay
acyclic, as up/down routing keeps them. With the dragonfly's own modes (minimal, Valiant,
UGAL), whose paths the plan does not derive, there are no feeders and a switch pauses all
its other ports: more pausing than a hardware switch would do, never less.
"""
from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from testbed.controllers.routing.ecmp import compute_rules
from testbed.model.topology.base import Fabric, intf_name
from testbed.plan.pfc_frames import pause_duration_s, refresh_interval_s
from testbed.plan.profiles import QueueConfig

XOFF, XON = "xoff", "xon"
PAUSE, RESUME = "pause", "resume"


@dataclass
class QueueWatch:
    """Whether one egress queue is congested, with XOFF/XON hysteresis."""

    xoff_bytes: int
    xon_bytes: int
    congested: bool = False

    def update(self, backlog_bytes: int) -> bool:
        """Take a backlog sample; returns whether the congestion state changed."""
        was = self.congested
        if was:
            self.congested = backlog_bytes > self.xon_bytes
        else:
            self.congested = backlog_bytes >= self.xoff_bytes
        return self.congested != was


def ports_to_pause(switch_ports: Iterable[str], congested: set[str],
                   feeders: dict[str, Iterable[str]] | None = None) -> dict[str, bool]:
    """For every port of a switch: whether its neighbour must be paused, i.e. whether it feeds
    a congested queue of another port (``feeders``: egress port -> the ingress ports that
    can feed it, ``feeding_ports``; None: every other port feeds every queue)."""
    if feeders is None:
        return {port: bool(congested - {port}) for port in switch_ports}
    feeding = {port for queue in congested for port in feeders.get(queue, ())}
    return {port: port in feeding for port in switch_ports}


@dataclass
class PauseSender:
    """The pause frames one port sends its neighbour for one class."""

    refresh_s: float
    asking: bool = False  # an XOFF is in force at the neighbour (as far as we know)
    last_xoff_s: float = float("-inf")

    def frame(self, want_pause: bool, now_s: float) -> str | None:
        """XOFF, XON or nothing to send now, given whether the neighbour should be paused."""
        if want_pause:
            if not self.asking or now_s - self.last_xoff_s >= self.refresh_s:
                self.asking = True
                self.last_xoff_s = now_s
                return XOFF
            return None
        if self.asking:
            self.asking = False
            return XON
        return None


@dataclass
class PauseTimer:
    """One port's pause state for one class, as its neighbour's frames set it."""

    rate_mbit: float
    storm_threshold_s: float
    paused_until_s: float | None = None
    paused_since_s: float | None = None
    paused_total_s: float = 0.0
    longest_pause_s: float = 0.0
    pauses: int = 0
    storms: int = 0
    storm_flagged: bool = False

    @property
    def paused(self) -> bool:
        return self.paused_until_s is not None

    def on_frame(self, quanta: int, now_s: float) -> str | None:
        """A frame for this class arrived: PAUSE (start holding), RESUME, or nothing to do
        (a refresh extends the pause in place)."""
        if quanta > 0:
            until = now_s + pause_duration_s(quanta, self.rate_mbit)
            started = not self.paused
            self.paused_until_s = until
            if started:
                self.paused_since_s = now_s
                self.pauses += 1
                return PAUSE
            return None
        return self._end(now_s) if self.paused else None

    def expire(self, now_s: float) -> str | None:
        """RESUME if the pause has run out by ``now_s``."""
        if self.paused and now_s >= self.paused_until_s:
            return self._end(min(now_s, self.paused_until_s))
        return None

    def check_storm(self, now_s: float) -> bool:
        """Whether the current pause has just become a storm (reported once per pause)."""
        if (self.paused and not self.storm_flagged
                and now_s - self.paused_since_s > self.storm_threshold_s):
            self.storm_flagged = True
            self.storms += 1
            return True
        return False

    def paused_time_s(self, now_s: float) -> float:
        """Time spent paused so far, the current pause included (up to its end, if it has run
        out and ``expire`` has not yet been called, as ``expire`` would count it)."""
        current = (min(now_s, self.paused_until_s) - self.paused_since_s) if self.paused else 0.0
        return self.paused_total_s + current

    def _end(self, now_s: float) -> str:
        length = max(0.0, now_s - self.paused_since_s)
        self.paused_total_s += length
        self.longest_pause_s = max(self.longest_pause_s, length)
        self.paused_until_s = None
        self.paused_since_s = None
        self.storm_flagged = False
        return RESUME


# --- the agent's plan -------------------------------------------------------------------------


@dataclass(frozen=True)
class AgentPlan:
    """Everything the pause agent needs, as JSON-able data: the pause frames' ``quanta`` and
    the storm threshold, every switch's ports, and every interface that obeys pauses (switch
    ports and host NICs) with its link rate, its lossless queue's byte limit
    (``buffer_bytes``), the interface at the other end and, on a switch, the XOFF and XON its
    queue is watched against: a port's own, sized for its link's rate
    (``QueueConfig.for_rate``)."""

    quanta: int
    storm_threshold_ms: float
    priorities: tuple[int, ...]
    mtu_bytes: int
    poll_s: float
    switch_ports: dict[str, list[str]]  # switch -> its interfaces
    # intf -> node, host?, rate_mbit, peer, buffer_bytes (+ xoff_bytes, xon_bytes on a switch)
    interfaces: dict[str, dict] = field(default_factory=dict)
    feeders: dict[str, list[str]] | None = None  # egress intf -> ingress intfs (feeding_ports)

    def switch_feeders(self, switch: str) -> dict[str, list[str]] | None:
        """The feeders of ``switch``'s queues, for ``ports_to_pause``."""
        if self.feeders is None:
            return None
        return {intf: self.feeders.get(intf, []) for intf in self.switch_ports[switch]}

    def to_json(self) -> dict:
        return {
            "quanta": self.quanta, "storm_threshold_ms": self.storm_threshold_ms,
            "priorities": list(self.priorities), "mtu_bytes": self.mtu_bytes,
            "poll_s": self.poll_s, "switch_ports": self.switch_ports,
            "interfaces": self.interfaces, "feeders": self.feeders,
        }

    @classmethod
    def from_json(cls, data: dict) -> AgentPlan:
        return cls(quanta=data["quanta"], storm_threshold_ms=data["storm_threshold_ms"],
                   priorities=tuple(data["priorities"]), mtu_bytes=data["mtu_bytes"],
                   poll_s=data["poll_s"], switch_ports=data["switch_ports"],
                   interfaces=data["interfaces"], feeders=data.get("feeders"))

    def refresh_s(self, intf: str) -> float:
        return refresh_interval_s(self.quanta, self.interfaces[intf]["rate_mbit"])


def agent_plan(fabric: Fabric, queue: QueueConfig, poll_s: float,
               routing: str = "ecmp") -> AgentPlan:
    """The pause agent's plan for ``fabric`` with ``queue`` (which must have PFC) on every
    shaped link, each port with the queue of its link's rate; unshaped links have no queue to
    pause and are left out. ``routing`` is the controller's mode: shortest-path modes get
    per-queue feeders (``feeding_ports``)."""
    if queue.pfc is None:
        raise ValueError("the queue has no PFC thresholds")
    pauses = {(q.pfc.quanta, q.pfc.storm_threshold_ms) for q in queue.by_rate}
    if len(pauses) != 1:
        raise ValueError("every rate's PFC must pause for the same quanta and storm threshold")
    switch_ports: dict[str, list[str]] = {s.name: [] for s in fabric.switches}
    interfaces: dict[str, dict] = {}
    for link in fabric.links:
        if link.rate_mbit is None:
            continue
        own = queue.for_rate(link.rate_mbit)
        for end in (0, 1):
            node = link.a if end == 0 else link.b
            is_host = fabric.nodes[node].is_host
            intf = link.intf(end)
            interfaces[intf] = {"node": node, "host": is_host, "rate_mbit": link.rate_mbit,
                                "peer": link.intf(1 - end), "buffer_bytes": own.buffer_bytes}
            if not is_host:
                interfaces[intf].update(xoff_bytes=own.pfc.xoff_bytes,
                                        xon_bytes=own.pfc.xon_bytes)
                switch_ports[node].append(intf)
    return AgentPlan(quanta=queue.pfc.quanta, storm_threshold_ms=queue.pfc.storm_threshold_ms,
                     priorities=queue.lossless_priorities, mtu_bytes=fabric.mtu_bytes,
                     poll_s=poll_s,
                     switch_ports={s: sorted(p) for s, p in switch_ports.items() if p},
                     interfaces=interfaces,
                     feeders=feeding_ports(fabric) if routing in SHORTEST_PATH_MODES else None)


SHORTEST_PATH_MODES = ("ecmp", "single")  # testbed.controllers.routing.ecmp's modes


def feeding_ports(fabric: Fabric) -> dict[str, list[str]]:
    """For every switch egress interface, the interfaces of the same switch whose incoming
    traffic shortest-path routing (``testbed.controllers.routing.ecmp.compute_rules``, ECMP's next hops:
    single path takes a subset) can send out of it."""
    rules = compute_rules(fabric)
    graph = fabric.graph()

    def ports_for(switch: str) -> dict[str, set[int]]:
        """Destination IP -> the ports ``switch`` sends it out of."""
        sw = rules[switch]
        return {r.dst_ip: set(sw.groups[r.group_id]) if r.group_id is not None else {r.port}
                for r in sw.routes}
    out_ports = {s.name: ports_for(s.name) for s in fabric.switches}
    feeders: dict[str, set[str]] = {}
    for switch in out_ports:
        for nbr in graph.neighbors(switch):
            ports = graph.edges[switch, nbr]["ports"]
            ingress = intf_name(switch, ports[switch])
            for dst_ip, egress in out_ports[switch].items():
                if fabric.nodes[nbr].is_host:
                    arrives = fabric.nodes[nbr].ip != dst_ip
                else:
                    arrives = ports[nbr] in out_ports[nbr].get(dst_ip, ())
                if arrives:
                    for port in egress - {ports[switch]}:
                        feeders.setdefault(intf_name(switch, port), set()).add(ingress)
    return {intf: sorted(ingress) for intf, ingress in sorted(feeders.items())}


def switch_fan_in(fabric: Fabric) -> int:
    """The most ports that can feed one switch egress queue: the largest switch degree less
    the queue's own port (``testbed.plan.scaling.pfc_headroom_bytes``'s ``fan_in``)."""
    degree: dict[str, int] = {}
    for switch, _, _, _ in fabric.switch_ends():
        degree[switch] = degree.get(switch, 0) + 1
    return max(1, max(degree.values(), default=1) - 1)
