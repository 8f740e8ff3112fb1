"""RTT under load on a probe path, against the RTT when idle and against the queueing the
emulated queues themselves account for: an emulator that falls behind adds delay in places no
emulated queue measures (packet sockets, its own batches), and this is where it shows even
when it loses nothing and the machine has CPU to spare.

During a measurement one host pings another every ``interval_s``; meanwhile the real backlog of
every queue the probe can wait in (every switch egress port on any shortest path, both ways,
and the two hosts' NIC queues) is sampled over rtnetlink. For each answered probe

    excess = rtt - idle_rtt - explained,   explained = sum over the path's hops of the largest
                                           backlog of that hop's candidate ports / its rate

(largest over ECMP candidates, so the explanation is generous and the excess conservative).
The verdict flags a run whose median excess exceeds ``max(MIN_EXCESS_MS, idle share)`` plus,
per shaped hop, the longest a probe can wait for the packet the link is sending (which has
left the backlog; testbed.plan.port_queue.in_service_ms): at low rates with large frames
that is most of the limit, and the probe only catches gross delays there.
"""
from __future__ import annotations

import bisect
import re
import subprocess
import threading
import time
from dataclasses import dataclass, field

import networkx as nx

from testbed.measure.backlog import handle_major
from testbed.measure.stats import percentile
from testbed.model.topology.base import Fabric
from testbed.plan.port_queue import Handles, host_queue, in_service_ms
from testbed.system.counters import read_qdiscs
from testbed.system.netlink import QdiscBacklogs
from testbed.system.netns import in_netns

PING_LINE = re.compile(r"^\[(?P<t>\d+\.\d+)\].*icmp_seq=(?P<seq>\d+).*time=(?P<rtt>[\d.]+) ms")
IDLE_PINGS = 10
# A run is flagged when the median probe waited this much more than the idle RTT and every
# emulated queue on its path explain, and more than half the idle RTT again (the userspace
# datapath's own polling shows in the idle RTT and grows somewhat with load).
MIN_EXCESS_MS = 5.0
IDLE_SHARE = 0.5
MAX_SAMPLE_GAP_S = 0.2  # a probe farther than this from every queue sample is not judged


@dataclass(frozen=True)
class Hop:
    """One hop of the probe path: the switch egress ports it may leave by (ECMP), their rate."""

    ports: tuple[str, ...]
    rate_mbit: float | None


def path_hops(fabric: Fabric, src: str, dst: str) -> list[Hop]:
    """The switch egress hops from ``src`` to ``dst`` along every shortest path: hop i's
    candidate ports are the interfaces the i-th switch of any shortest path sends on."""
    graph = fabric.graph()
    ports_at: dict[int, set[str]] = {}
    rates: dict[int, float | None] = {}
    for path in nx.all_shortest_paths(graph, src, dst):
        for i, (a, b) in enumerate(zip(path[1:-1], path[2:])):
            port = graph.edges[a, b]["ports"][a]
            ports_at.setdefault(i, set()).add(f"{a}-eth{port}")
            rates[i] = graph.edges[a, b]["rate_mbit"]
    return [Hop(tuple(sorted(ports_at[i])), rates[i]) for i in sorted(ports_at)]


def parse_ping(text: str) -> list[tuple[float, int, float]]:
    """(unix time the reply arrived, sequence, rtt ms) of every answered probe in ``ping -D``
    output."""
    out = []
    for line in text.splitlines():
        m = PING_LINE.match(line.strip())
        if m:
            out.append((float(m["t"]), int(m["seq"]), float(m["rtt"])))
    return out


def explained_ms(hops: list[Hop], backlog_bytes: dict[str, int]) -> float:
    """The queueing delay the emulated switch queues account for on a path, in ms: per hop
    the largest backlog among its candidate ports, at the hop's rate."""
    total = 0.0
    for hop in hops:
        if hop.rate_mbit:
            worst = max(backlog_bytes.get(p, 0) for p in hop.ports)
            total += worst * 8 / (hop.rate_mbit * 1e6) * 1000
    return total


@dataclass
class RttResult:
    idle_ms: float | None
    samples: int
    p50_rtt_ms: float | None
    p50_excess_ms: float | None
    p95_excess_ms: float | None
    limit_ms: float | None
    path: list[list[str]] = field(default_factory=list)
    p50_explained_ms: float | None = None  # what the sampled queues accounted for
    judged: int = 0  # probes with a queue sample near enough to judge
    in_service_ms: float = 0.0  # packets being sent on the path, which no backlog shows

    def to_dict(self) -> dict:
        return dict(vars(self))


def excess_summary(idle_ms: float | None, probes: list[tuple[float, float]],
                   explained: list[tuple[float, float]], hops: list[Hop],
                   in_service_ms: float = 0.0) -> RttResult:
    """Probes (monotonic send time, rtt ms) against explained queueing samples (monotonic
    time, ms): each probe is charged the explanation sampled nearest its send time. A probe
    with no sample within MAX_SAMPLE_GAP_S is left out (a gap in the sampling explains
    nothing either way); with none left, nothing is judged. ``in_service_ms``: the longest
    the probe may wait, summed over its path, for packets being sent (no backlog shows
    them), added to the limit."""
    path = [list(h.ports) for h in hops]
    times = [t for t, _ in explained]
    excess, why = [], []
    for t_sent, rtt in probes if times else []:
        nearest = bisect.bisect_left(times, t_sent)
        near = min((i for i in (nearest - 1, nearest) if 0 <= i < len(times)),
                   key=lambda i: abs(times[i] - t_sent))
        if abs(times[near] - t_sent) <= MAX_SAMPLE_GAP_S and idle_ms is not None:
            why.append(explained[near][1])
            excess.append(rtt - idle_ms - why[-1])
    if not excess:
        return RttResult(idle_ms, len(probes), None, None, None, None, path)
    limit = max(MIN_EXCESS_MS, IDLE_SHARE * idle_ms) + in_service_ms
    return RttResult(idle_ms, len(probes), percentile([r for _, r in probes], 50),
                     percentile(excess, 50), percentile(excess, 95), limit, path,
                     percentile(why, 50), len(excess), in_service_ms)


class RttProbe:
    """Pings ``dst`` from ``src`` every ``interval_s`` while a measurement runs on ``net`` (a
    testbed.system.running.RunningFabric), sampling the probe path's real switch-port
    backlogs meanwhile; ``idle()`` first measures the RTT with nothing else on the fabric."""

    def __init__(self, net, src: str, dst: str, interval_s: float = 0.05):
        self.net, self.src, self.dst, self.interval_s = net, src, dst, interval_s
        self.hops = path_hops(net.fabric, src, dst) + path_hops(net.fabric, dst, src)
        self.handles = sorted(Handles.buffers(net.queue))
        self.host_handles = sorted(Handles.buffers(host_queue(net.queue)))
        self.host_readers: list[tuple[object, float | None]] = []
        self.idle_ms: float | None = None
        self.samples: list[tuple[float, float]] = []
        self.proc = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def idle(self) -> float | None:
        """The median RTT of a few probes on the quiet fabric."""
        out = self.net.cmd(self.src, "ping", "-n", "-D", "-c", str(IDLE_PINGS), "-i", "0.02",
                           "-W", "1", self.net.fabric.nodes[self.dst].ip)
        rtts = [rtt for _, _, rtt in parse_ping(out)]
        self.idle_ms = percentile(rtts, 50) if rtts else None
        return self.idle_ms

    def __enter__(self) -> RttProbe:
        self.t_offset = time.time() - time.monotonic()
        self.proc = self.net.popen(self.src, [
            "ping", "-n", "-D", "-i", str(self.interval_s), "-W", "2",
            self.net.fabric.nodes[self.dst].ip], stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL, text=True)
        for host in (self.src, self.dst):
            self.host_readers.append(self._host_reader(host))
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()
        return self

    def _host_reader(self, host: str) -> tuple[object, float | None]:
        """A netlink reader of ``host``'s NIC queue, made inside its namespace, and the
        NIC's rate."""
        import socket

        link, end = self.net.fabric.host_link(host)
        netns = self.net.netns(host)
        index = in_netns(netns, lambda: socket.if_nametoindex(link.intf(end)))
        wanted = {(index, handle_major(h)) for h in self.host_handles}
        return in_netns(netns, lambda: QdiscBacklogs(wanted)), link.rate_mbit

    def _switch_reader(self) -> tuple[object, dict[tuple[int, int], str]]:
        """A netlink reader of every buffer on the probe path's switch ports (root
        namespace; the ports' qdiscs listed once by tc), and which port each (ifindex,
        handle major) is."""
        import socket

        ports = {p for hop in self.hops for p in hop.ports}
        port_of = {(socket.if_nametoindex(q["dev"]), handle_major(q["handle"])): q["dev"]
                   for q in read_qdiscs()
                   if q.get("dev") in ports and q.get("handle") in self.handles}
        return QdiscBacklogs(set(port_of)), port_of

    def _sample(self) -> None:
        switches, port_of = self._switch_reader()
        try:
            while not self._stop.wait(self.interval_s):
                t = time.monotonic()
                try:
                    queues = switches.read()
                    hosts_ms = sum(sum(reader.read().values()) * 8 / (rate * 1e6) * 1000
                                   for reader, rate in self.host_readers if rate)
                except Exception:  # a failed read leaves a gap, never a wrong number
                    continue
                backlog: dict[str, int] = {}
                for key, nbytes in queues.items():
                    backlog[port_of[key]] = backlog.get(port_of[key], 0) + nbytes
                self.samples.append((t, explained_ms(self.hops, backlog) + hosts_ms))
        finally:
            switches.sock.close()

    def __exit__(self, *exc) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        for reader, _ in self.host_readers:
            reader.sock.close()
        self.proc.terminate()
        out, _ = self.proc.communicate(timeout=5)
        # ping -D stamps the line when the reply arrives: the probe left rtt earlier
        self.probes = [(t - self.t_offset - rtt / 1000, rtt) for t, _, rtt in parse_ping(out)]

    def result(self, window_monotonic_s: tuple[float, float] | None = None) -> RttResult:
        probes = [(t, r) for t, r in self.probes
                  if window_monotonic_s is None
                  or window_monotonic_s[0] <= t <= window_monotonic_s[1]]
        return excess_summary(self.idle_ms, probes, self.samples, self.hops,
                              self.in_service_ms())

    def in_service_ms(self) -> float:
        """Summed over the path's shaped hops (switch ports both ways and the two hosts'
        NICs): the longest a packet waits for the one its link is sending."""
        fabric, offloads = self.net.fabric, bool(getattr(self.net, "offloads_on", False))
        rates = [hop.rate_mbit for hop in self.hops]
        rates += [fabric.host_link(h)[0].rate_mbit for h in (self.src, self.dst)]
        return sum(in_service_ms(rate, fabric.mtu_bytes, offloads) for rate in rates)
