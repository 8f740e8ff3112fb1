"""The pause agent: the PFC logic of every emulated port, run as one process beside the
switches (``python -m testbed.apply.pfc_agent PLAN WORKDIR``; started and stopped by PID by
``testbed.apply.pfc_runtime``).

Two threads, the two sides of ``testbed.plan.pfc``:

- the **watcher** reads the backlog of every switch port's lossless queues every ``poll_s``,
  asking rtnetlink for exactly those qdiscs in one batch of requests; when a switch has a congested port
  it sends real 802.1Qbb frames (``testbed.plan.pfc_frames``, built with scapy) out of its other
  ports, on packet sockets that bypass the egress queue, as a MAC sends control frames;
- the **listener** reads the frames that arrive on every interface that obeys pauses
  (switch ports in the root namespace, host NICs in their hosts' namespaces), decodes them
  with scapy and pauses or resumes the class's queue there (a tbf whose rate it changes,
  ``testbed.plan.port_queue``; over ``testbed.system.netlink``), and resumes it when the
  quanta run out.

Resuming needs a kick. While paused, the tbf's next send is due seconds away (a packet at
the paused rate), and changing its rate does not make the kernel service the queue again:
that only happens on the next enqueue to the interface. If every port that feeds the queue
is itself paused (the queue was congested), no enqueue comes, and the queue would wait for
an unrelated packet. So after each resume the agent sends one small frame through the
interface's queue (``testbed.plan.pfc_frames.kick_frame``; its receiver drops it), which runs the
qdisc at once.

A frame is acted on only once it has crossed the link; the agent never shortcuts from the
congested queue to the paused one. Output, in WORKDIR: ``pfc-events.jsonl`` (XOFF/XON sent,
pause/resume applied, storms; monotonic seconds), ``pfc-queues.jsonl`` (lossless backlogs
every ``QUEUE_SAMPLE_S`` while any is non-zero) and ``pfc-counters.json`` (per-interface
totals, rewritten every ``SNAPSHOT_S`` and at exit; ``testbed.apply.pfc_runtime`` reads it).
"""
from __future__ import annotations

import json
import os
import select
import socket
import struct
import sys
import threading
import time
from pathlib import Path

from testbed.apply.agent_process import (
    agent_arguments,
    quantiles,
    realtime_priority,
    stop_on_signals,
    write_json,
)
from testbed.plan.pfc import (
    PAUSE,
    RESUME,
    XOFF,
    AgentPlan,
    PauseSender,
    PauseTimer,
    QueueWatch,
    ports_to_pause,
)
from testbed.plan.pfc_frames import (
    PFC_ETHERTYPE,
    decode_pfc_frame,
    kick_frame,
    xoff_frame,
    xon_frame,
)
from testbed.plan.port_queue import Handles, paused_tbf, running_tbf
from testbed.system.netlink import QdiscBacklogs, QdiscChanger
from testbed.system.netns import in_netns

EVENTS_FILE = "pfc-events.jsonl"
QUEUES_FILE = "pfc-queues.jsonl"
COUNTERS_FILE = "pfc-counters.json"
READY_FILE = "pfc-agent.ready"
NETNS_FILE = "pfc-netns.json"  # host -> path of its network namespace, written by the runtime
SNAPSHOT_S = 0.2
QUEUE_SAMPLE_S = 0.010
SOL_PACKET = 263
PACKET_QDISC_BYPASS = 20
IDLE_WAKE_MS = 10
SIOCGIFHWADDR = 0x8927
SWITCH_INTERVAL_S = 0.0005  # let the listener in quickly while the watcher parses


def packet_socket(intf: str) -> socket.socket:
    """A socket that receives the PFC frames arriving on ``intf`` and sends frames straight
    to its driver, past the egress qdisc (a paused or full queue never holds a pause)."""
    sock = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(PFC_ETHERTYPE))
    sock.bind((intf, PFC_ETHERTYPE))
    sock.setsockopt(SOL_PACKET, PACKET_QDISC_BYPASS, 1)
    sock.setblocking(False)
    return sock


def queued_socket(intf: str) -> socket.socket:
    """A socket that sends frames into ``intf``'s egress queue, like any traffic, and
    receives nothing."""
    sock = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, 0)
    sock.bind((intf, 0))
    sock.setblocking(False)
    return sock


def link_identity(intf: str) -> tuple[int, str]:
    """(ifindex, MAC) of ``intf`` in the calling thread's namespace."""
    return socket.if_nametoindex(intf), _read_mac(intf)


def _read_mac(intf: str) -> str:
    # /sys shows the namespace of whoever mounted it; ask the kernel through a socket instead
    import fcntl
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        ifreq = fcntl.ioctl(sock.fileno(), SIOCGIFHWADDR, struct.pack("256s", intf.encode()[:15]))
    return ":".join(f"{b:02x}" for b in ifreq[18:24])


class Agent:
    """The pause agent of one running fabric."""

    def __init__(self, plan: AgentPlan, workdir: Path, netns: dict[str, str]):
        self.plan = plan
        self.workdir = workdir
        self.stop_event = threading.Event()
        self.lock = threading.Lock()
        self.events: list[dict] = []
        self.counters = {intf: {"xoff_sent": 0, "xon_sent": 0, "frames_received": 0}
                         for intf in plan.interfaces}
        self.send_times: dict[tuple[str, int], float] = {}  # (intf, prio) -> last XOFF sent
        self.apply_ms: list[float] = []
        self.sample_gaps_ms: list[float] = []  # between the starts of successive backlog reads
        self.sockets: dict[str, socket.socket] = {}
        self.kick_sockets: dict[str, socket.socket] = {}
        self.frames: dict[tuple[str, int, str], bytes] = {}
        self.max_backlog = {intf: 0 for intf in plan.interfaces}  # lossless, bytes
        self.switch_of = {intf: switch for switch, ports in plan.switch_ports.items()
                          for intf in ports}
        # Check for due refreshes four times per refresh interval: a pause is repeated
        # between half and five eighths of its length, never after it ran out.
        self.refresh_check_s = min((plan.refresh_s(i) for i in self.switch_of), default=1.0) / 4
        self.changers: dict[str | None, QdiscChanger] = {}
        self.ifindex: dict[str, int] = {}
        self.macs: dict[str, str] = {}
        for intf, info in plan.interfaces.items():
            path = netns.get(info["node"]) if info["host"] else None
            if path not in self.changers:
                self.changers[path] = in_netns(path, QdiscChanger)
            self.ifindex[intf], self.macs[intf] = in_netns(path, lambda i=intf: link_identity(i))
            self.sockets[intf] = in_netns(path, lambda i=intf: packet_socket(i))
            self.kick_sockets[intf] = in_netns(path, lambda i=intf: queued_socket(i))
        self.kicks = {intf: kick_frame(mac) for intf, mac in self.macs.items()}
        self.netns_of = {intf: (netns.get(info["node"]) if info["host"] else None)
                         for intf, info in plan.interfaces.items()}
        self.watches = {(intf, p): QueueWatch(plan.interfaces[intf]["xoff_bytes"],
                                              plan.interfaces[intf]["xon_bytes"])
                        for ports in plan.switch_ports.values() for intf in ports
                        for p in plan.priorities}
        self.senders = {(intf, p): PauseSender(plan.refresh_s(intf))
                        for ports in plan.switch_ports.values() for intf in ports
                        for p in plan.priorities}
        storm_s = plan.storm_threshold_ms / 1000
        self.timers = {(intf, p): PauseTimer(info["rate_mbit"], storm_s)
                       for intf, info in plan.interfaces.items() for p in plan.priorities}
        self.backlogs = QdiscBacklogs({(self.ifindex[i], Handles.leaf_major(p))
                                       for i, _ in self.watches for p in plan.priorities})
        self.intf_of_key = {(self.ifindex[i], Handles.leaf_major(p)): (i, p)
                            for i, p in self.watches}

    # -- the switch side ---------------------------------------------------------------------
    def watch(self) -> None:
        plan = self.plan
        next_snapshot = next_sample = next_refresh = time.monotonic()
        queue_log = open(self.workdir / QUEUES_FILE, "a")
        try:
            last_start = None
            while not self.stop_event.is_set():
                start = time.monotonic()
                if last_start is not None:
                    self.sample_gaps_ms.append((start - last_start) * 1000)
                last_start = start
                backlogs = self.backlogs.read()
                now = time.monotonic()
                to_decide = self._watch_queues(backlogs)
                if now >= next_refresh:  # pauses in force are repeated before they run out
                    to_decide |= {(self.switch_of[i], p) for (i, p), sender in self.senders.items()
                                  if sender.asking}
                    next_refresh = now + self.refresh_check_s
                for switch, prio in to_decide:
                    ports = plan.switch_ports[switch]
                    congested = {i for i in ports if self.watches[(i, prio)].congested}
                    for intf, want in ports_to_pause(ports, congested,
                                                     plan.switch_feeders(switch)).items():
                        frame = self.senders[(intf, prio)].frame(want, now)
                        if frame is not None:
                            self._send(intf, prio, frame, now)
                if now >= next_sample:
                    nonzero = {self.intf_of_key[k][0] + f"/{self.intf_of_key[k][1]}": v
                               for k, v in backlogs.items() if v}
                    if nonzero:
                        queue_log.write(json.dumps({"t": round(now, 6), "q": nonzero}) + "\n")
                    next_sample = now + QUEUE_SAMPLE_S
                if now >= next_snapshot:
                    queue_log.flush()
                    self.snapshot()
                    next_snapshot = now + SNAPSHOT_S
                self.stop_event.wait(max(0.0, plan.poll_s - (time.monotonic() - start)))
        finally:
            queue_log.close()

    def _frame_bytes(self, intf: str, prio: int, frame: str) -> bytes:
        """The frame's bytes, built with scapy once per port, class and kind."""
        key = (intf, prio, frame)
        if key not in self.frames:
            mac = self.macs[intf]
            self.frames[key] = (xoff_frame(mac, [prio], self.plan.quanta) if frame == XOFF
                                else xon_frame(mac, [prio]))
        return self.frames[key]

    def _watch_queues(self, backlogs: dict[tuple[int, int], int]) -> set[tuple[str, int]]:
        """Feed every lossless queue its new backlog; returns the (switch, priority) pairs
        where a queue became congested or drained, whose pauses must be decided again."""
        changed = set()
        for key, (intf, prio) in self.intf_of_key.items():
            backlog = backlogs.get(key, 0)
            if backlog > self.max_backlog[intf]:
                self.max_backlog[intf] = backlog
            watch = self.watches[(intf, prio)]
            if watch.update(backlog):
                changed.add((self.switch_of[intf], prio))
                self._event("congested" if watch.congested else "drained", intf, prio,
                            backlog_bytes=backlog)
        return changed

    def _send(self, intf: str, prio: int, frame: str, now: float) -> None:
        data = self._frame_bytes(intf, prio, frame)
        try:
            self.sockets[intf].send(data)
        except OSError as exc:
            self._event("send_failed", intf, prio, error=str(exc))
            return
        with self.lock:
            self.counters[intf][f"{frame}_sent"] += 1
            if frame == XOFF:
                self.send_times[(intf, prio)] = now
        self._event(f"{frame}_sent", intf, prio)

    # -- the receiving side ------------------------------------------------------------------
    def listen(self) -> None:
        poller = select.poll()
        by_fd = {}
        for intf, sock in self.sockets.items():
            poller.register(sock, select.POLLIN)
            by_fd[sock.fileno()] = intf
        while not self.stop_event.is_set():
            for fd, _ in poller.poll(self._next_wake_ms()):
                intf = by_fd[fd]
                while True:
                    try:
                        data = self.sockets[intf].recv(2048)
                    except BlockingIOError:
                        break
                    self._on_frame(intf, data)
            now = time.monotonic()
            for (intf, prio), timer in self.timers.items():
                if timer.expire(now) == RESUME:
                    self._apply(intf, prio, paused=False, why="expired")
                if timer.check_storm(now):
                    self._event("pause_storm", intf, prio,
                                paused_s=round(now - timer.paused_since_s, 6))

    def _next_wake_ms(self) -> int:
        """Poll timeout: the next pause expiry, or the next storm check (every millisecond
        while anything is paused), at most ``IDLE_WAKE_MS`` away."""
        return 1 if any(t.paused for t in self.timers.values()) else IDLE_WAKE_MS

    def _on_frame(self, intf: str, data: bytes) -> None:
        frame = decode_pfc_frame(data)
        if frame is None:
            return
        now = time.monotonic()
        with self.lock:
            self.counters[intf]["frames_received"] += 1
        for prio, quanta in frame.pause_quanta.items():
            timer = self.timers.get((intf, prio))
            if timer is None:
                continue  # not a lossless class here: nothing to pause
            action = timer.on_frame(quanta, now)
            if action is not None:
                self._apply(intf, prio, paused=action == PAUSE, why="frame")

    def _apply(self, intf: str, prio: int, paused: bool, why: str) -> None:
        plan = self.plan
        port = plan.interfaces[intf]
        params = (paused_tbf(plan.mtu_bytes, port["buffer_bytes"]) if paused else
                  running_tbf(port["rate_mbit"], plan.mtu_bytes, port["buffer_bytes"]))
        self.changers[self.netns_of[intf]].change_tbf(
            self.ifindex[intf], Handles.leaf_major(prio) << 16,
            Handles.class_id_number(prio), params)
        if not paused:
            try:
                self.kick_sockets[intf].send(self.kicks[intf])
            except OSError:
                pass  # the queue is full, so the kernel is servicing it anyway
        now = time.monotonic()
        extra = {"why": why}
        if paused:
            sent = self.send_times.get((plan.interfaces[intf]["peer"], prio))
            if sent is not None and why == "frame":
                extra["since_xoff_sent_ms"] = round((now - sent) * 1000, 3)
                self.apply_ms.append((now - sent) * 1000)
        self._event(PAUSE if paused else RESUME, intf, prio, **extra)

    # -- output ------------------------------------------------------------------------------
    def _event(self, kind: str, intf: str, prio: int, **extra) -> None:
        with self.lock:
            self.events.append({"t": round(time.monotonic(), 6), "event": kind, "intf": intf,
                                "priority": prio, **extra})

    def snapshot(self) -> None:
        now = time.monotonic()
        with self.lock:
            events, self.events = self.events, []
            per_intf = {}
            for intf, counts in self.counters.items():
                timers = [self.timers[(intf, p)] for p in self.plan.priorities]
                per_intf[intf] = {
                    **counts,
                    "node": self.plan.interfaces[intf]["node"],
                    "pauses": sum(t.pauses for t in timers),
                    "paused_s": round(sum(t.paused_time_s(now) for t in timers), 6),
                    "longest_pause_s": round(max(t.longest_pause_s for t in timers), 6),
                    "storms": sum(t.storms for t in timers),
                    "max_backlog_bytes": self.max_backlog[intf],
                }
            apply_ms = sorted(self.apply_ms)
            gaps_ms = sorted(self.sample_gaps_ms)
        if events:
            with open(self.workdir / EVENTS_FILE, "a") as fh:
                fh.writelines(json.dumps(e) + "\n" for e in events)
        summary = {"t": round(now, 6), "interfaces": per_intf,
                   "pause_apply_ms": quantiles(apply_ms), "poll_s": self.plan.poll_s,
                   "sample_gap_ms": quantiles(gaps_ms),
                   "scheduling": getattr(self, "scheduling", None),
                   "cpu_s": round(time.process_time(), 3)}
        write_json(self.workdir / COUNTERS_FILE, summary)

    def _listen_or_stop(self) -> None:
        """The listener; if it fails, the whole agent stops (a fabric whose pauses are not
        obeyed is not lossless), with the error in its log and a non-zero exit."""
        try:
            self.listen()
        except BaseException:
            self.failed = True
            self.stop_event.set()
            raise

    def run(self) -> int:
        sys.setswitchinterval(SWITCH_INTERVAL_S)
        self.scheduling = realtime_priority()
        self.failed = False
        listener = threading.Thread(target=self._listen_or_stop, name="listener", daemon=True)
        listener.start()
        (self.workdir / READY_FILE).write_text(str(os.getpid()))
        try:
            self.watch()
        finally:
            self.stop_event.set()
            listener.join(timeout=2)
            self.snapshot()
        return 1 if self.failed else 0


def main(argv: list[str] | None = None) -> int:
    args = agent_arguments("testbed.apply.pfc_agent", sys.argv[1:] if argv is None else argv)
    if args is None:
        return 2
    plan, workdir = args
    netns = json.loads((workdir / NETNS_FILE).read_text())
    agent = Agent(AgentPlan.from_json(plan), workdir, netns)
    stop_on_signals(agent.stop_event)
    return agent.run()


if __name__ == "__main__":
    sys.exit(main())
