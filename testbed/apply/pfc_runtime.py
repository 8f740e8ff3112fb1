"""PFC on a running fabric: starts the pause agent (``testbed.apply.pfc_agent``) once the
class queues are in place, stops it by PID, and reads its results back as the run's ``pfc``
summary (drops in the lossless queues are ``testbed.system.counters.lossless_drops``).
``testbed.apply.network.FabricNetwork`` owns one when its queue has PFC thresholds.
"""
from __future__ import annotations

import json
import time
from collections.abc import Iterable, Sequence
from pathlib import Path

from testbed.apply.agent_process import AgentProcess
from testbed.apply.pfc_agent import (
    COUNTERS_FILE,
    EVENTS_FILE,
    NETNS_FILE,
    QUEUE_SAMPLE_S,
    QUEUES_FILE,
    READY_FILE,
    SNAPSHOT_S,
)
from testbed.apply.state import Ledger
from testbed.model.records import read_json_lines
from testbed.model.topology.base import Fabric
from testbed.plan.pfc import PAUSE as PAUSE_EVENT
from testbed.plan.pfc import RESUME as RESUME_EVENT
from testbed.plan.pfc import agent_plan
from testbed.plan.profiles import QueueConfig

PLAN_FILE = "pfc-plan.json"
LOG_FILE = "pfc-agent.log"
# How often the agent reads the switches' lossless backlogs (one batch of netlink requests,
# one per lossless queue). On a k=4 fat-tree under incast, every 1 ms took about a whole
# core and starved ovs-vswitchd; every 2 ms took 0.6-0.7 (most of it the agent's own Python
# parsing one netlink reply per queue), and with the agent beside the hosts the fan-in 13
# pfc-demo left the 2-core VM 96-98% busy (untrusted); every 4 ms takes 0.36-0.44 and left
# it 90% busy, 0 lossless drops, polls p99 9 ms apart. A queue crossing XOFF is seen a poll
# later at most: within the 20 ms the PFC headroom covers per end
# (testbed.plan.scaling.DEFAULT_PFC_REACTION_TIME_S).
DEFAULT_POLL_S = 0.004


class PauseAgentProcess(AgentProcess):
    """The pause agent of one fabric, as a process recorded in the run's ledger."""

    module = "testbed.apply.pfc_agent"
    title = "the PFC pause agent"
    plan_file, log_file, ready_file, counters_file = PLAN_FILE, LOG_FILE, READY_FILE, COUNTERS_FILE

    def __init__(self, fabric: Fabric, queue: QueueConfig, workdir: Path, ledger: Ledger,
                 poll_s: float = DEFAULT_POLL_S, routing: str = "ecmp", log=print):
        super().__init__(workdir, ledger, log)
        self.plan = agent_plan(fabric, queue, poll_s, routing)
        self.queue = queue

    def start(self, host_pids: dict[str, int], cpus: Sequence[int] = ()) -> None:
        """Launch the agent; ``host_pids`` names a process in each host's namespace, ``cpus``
        (the hosts' CPUs of the fabric's CPU layout; empty: any) where it runs.

        Beside the hosts, not on ovs-vswitchd's CPU and not free: the agent runs at a
        real-time priority, and wherever the kernel put it on the 2-core VM it took
        ovs-vswitchd's CPU at times. The switches then fell behind their ports (up to 6.5 MB
        of frames waiting in their receive sockets, 726 KB at the 99th percentile), frames
        already past a paused port kept arriving for tens of ms beyond PFC's headroom, and
        the fan-in 13 pfc-demo lost 21-148 lossless packets a run, often with every trust
        check passing. On the hosts' CPU 141 KB waited at the 99th percentile; the runs lost
        0, 0 and 167, and the machine read 98% busy in each, which the verdict names (the
        agent's 0.6-0.7 of a core polling every 2 ms, and the hosts' traffic, on one CPU;
        every 4 ms, ``DEFAULT_POLL_S``, it takes 0.36-0.44). Beside ovs-vswitchd its
        polls waited for the forwarding thread's kernel work (this kernel is PREEMPT_NONE),
        up to 41 ms apart, and the 6:1 RoCE incast lost 53 (docs/capacity.md)."""
        (self.workdir / NETNS_FILE).write_text(json.dumps(
            {host: f"/proc/{pid}/ns/net" for host, pid in host_pids.items()}))
        self.launch(self.plan.to_json(), cpus, stale=(EVENTS_FILE,))
        rates = self.queue.by_rate
        thresholds = "; ".join(f"XOFF {q.pfc.xoff_bytes} B, XON {q.pfc.xon_bytes} B"
                               + (f" at {q.rate_mbit:g} Mbit/s" if len(rates) > 1 else "")
                               for q in rates)
        self.log(f"PFC: pause agent watching {sum(map(len, self.plan.switch_ports.values()))} "
                 f"switch ports every {self.plan.poll_s * 1000:g} ms ({thresholds})"
                 + (f", on CPU {','.join(map(str, cpus))} with the hosts" if cpus else ""))

    def events(self) -> list[dict]:
        """The agent's pause and resume events so far (written every ``SNAPSHOT_S``, so the
        last fraction of a second may not be in yet); a line still being written is left
        out."""
        try:
            lines = (self.workdir / EVENTS_FILE).read_text().splitlines()
        except OSError:
            return []
        events = []
        for line in lines:
            try:
                events.append(json.loads(line))
            except ValueError:
                continue  # a line the agent is still writing
        return events

    def paused_spans(self, t0_monotonic: float,
                     t1_monotonic: float) -> dict[str, list[tuple[float, float]]]:
        """When each interface's lossless class was paused within the interval, from the
        agent's events (a pause still open at the end counts up to it)."""
        return paused_within(self.events(), t0_monotonic, t1_monotonic)

    def empty_spans(self, t0_monotonic: float,
                    t1_monotonic: float) -> dict[str, list[tuple[float, float]]]:
        """When each switch port's lossless queues all read empty within the interval, from
        the agent's queue log (flushed every ``SNAPSHOT_S``: the last two flushes' worth of
        time is not known yet and counts as not empty)."""
        ports = [intf for intfs in self.plan.switch_ports.values() for intf in intfs]
        return empty_within(read_json_lines(self.workdir / QUEUES_FILE), ports,
                            QUEUE_SAMPLE_S, t0_monotonic,
                            min(t1_monotonic, time.monotonic() - 2 * SNAPSHOT_S))


def empty_within(samples: list[dict], interfaces: Iterable[str], sample_s: float,
                 t0: float, t1: float) -> dict[str, list[tuple[float, float]]]:
    """The spans within [t0, t1] in which each interface's lossless queues all read empty,
    from the pause agent's queue log: a sample (``t``, ``q``: "intf/priority" -> backlog
    bytes, non-zero ones only) every ``sample_s`` while any queue holds something, none
    while all are empty. An interface is empty from a sample that leaves it out until the
    next sample; one that names it holds it busy until the next sample, or for ``sample_s``
    when the next comes more than two samples later (the samples between read all empty).
    Only interfaces empty at some point of the interval."""
    if t1 <= t0:
        return {}
    lines = sorted((s for s in samples if s["t"] < t1), key=lambda s: s["t"])
    busy_in = [(s["t"], {key.rsplit("/", 1)[0] for key in s.get("q", {})}) for s in lines]
    out: dict[str, list[tuple[float, float]]] = {}
    for intf in interfaces:
        spans: list[tuple[float, float]] = []
        empty_from = t0  # before the first sample every queue was empty
        for i, (t, busy) in enumerate(busy_in):
            if intf not in busy:
                continue
            if t > empty_from:
                spans.append((empty_from, t))
            end = busy_in[i + 1][0] if i + 1 < len(busy_in) else t1
            empty_from = max(empty_from, end if end - t <= 2 * sample_s else t + sample_s)
        if t1 > empty_from:
            spans.append((empty_from, t1))
        clipped = [(max(a, t0), min(b, t1)) for a, b in spans if min(b, t1) > max(a, t0)]
        if clipped:
            out[intf] = clipped
    return out


def paused_within(events: list[dict], t0: float,
                  t1: float) -> dict[str, list[tuple[float, float]]]:
    """The disjoint spans within [t0, t1] in which each interface had any lossless priority
    paused, from the pause agent's ``pause`` and ``resume`` events (monotonic ``t``,
    ``intf``, ``priority``); only interfaces paused at some point of the interval."""
    open_at: dict[tuple[str, int], float] = {}
    spans: dict[str, list[tuple[float, float]]] = {}
    for event in sorted(events, key=lambda e: e["t"]):
        key = (event.get("intf"), event.get("priority"))
        if event.get("event") == PAUSE_EVENT:
            open_at.setdefault(key, event["t"])
        elif event.get("event") == RESUME_EVENT and key in open_at:
            spans.setdefault(key[0], []).append((open_at.pop(key), event["t"]))
    for (intf, _), start in open_at.items():
        spans.setdefault(intf, []).append((start, t1))
    out: dict[str, list[tuple[float, float]]] = {}
    for intf, intervals in spans.items():
        union, reach = [], t0
        for start, end in sorted(intervals):  # union of the priorities' pauses
            start, end = max(start, reach), min(end, t1)
            if end > start:
                if union and union[-1][1] == start:
                    union[-1] = (union[-1][0], end)
                else:
                    union.append((start, end))
                reach = end
        if union:
            out[intf] = union
    return out


def pfc_totals(counters: dict) -> dict:
    """The fabric-wide figures of the agent's per-interface counters."""
    per_intf = counters.get("interfaces", {})
    paused = {i: c for i, c in per_intf.items() if c["pauses"]}
    return {
        "pause_frames_sent": sum(c["xoff_sent"] + c["xon_sent"] for c in per_intf.values()),
        "xoff_sent": sum(c["xoff_sent"] for c in per_intf.values()),
        "xon_sent": sum(c["xon_sent"] for c in per_intf.values()),
        "pause_frames_received": sum(c["frames_received"] for c in per_intf.values()),
        "pauses": sum(c["pauses"] for c in per_intf.values()),
        "paused_time_s": round(sum(c["paused_s"] for c in per_intf.values()), 6),
        "longest_pause_s": max((c["longest_pause_s"] for c in per_intf.values()), default=0.0),
        "pause_storms": sum(c["storms"] for c in per_intf.values()),
        "max_lossless_backlog_bytes": max((c.get("max_backlog_bytes", 0)
                                           for c in per_intf.values()), default=0),
        "paused_interfaces": {i: {"node": c["node"], "pauses": c["pauses"],
                                  "paused_s": c["paused_s"]} for i, c in sorted(paused.items())},
        "pause_apply_ms": counters.get("pause_apply_ms", {}),
        "sample_gap_ms": counters.get("sample_gap_ms", {}),
        "poll_s": counters.get("poll_s"),
        "agent_cpu_s": counters.get("cpu_s"),
    }

