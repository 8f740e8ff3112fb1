"""The ECN anchor agent: grounds the eBPF marker's virtual FIFOs in the real queues, as one
process beside the switches (``python -m testbed.apply.ecn_anchor PLAN WORKDIR``; started and
stopped by PID by ``testbed.apply.marking.EcnMarking``).

Every ``poll_s`` (``testbed.plan.anchoring.ANCHOR_POLL_S``), for every marked port at once:

1. the bytes each port's virtual FIFO has accepted so far (the marker's ``ecn_qdepth``,
   one BPF_MAP_LOOKUP_BATCH call; kept raw until step 3);
2. right after, the real backlog of each port's HTB tree (and a delayed port's netem line):
   one batch of rtnetlink requests, which the kernel answers while the send call runs, so
   the readings are timed by the clock read around that call;
3. each port's anchor (``anchoring.anchor_values``: backlog, time, accepted bytes, a new
   seq), written into the marker's ``ecn_anchor`` in one BPF_MAP_UPDATE_BATCH call, in place
   under each entry's lock (BPF_F_LOCK). The marker applies it at the port's next packet.

Reading the accepted bytes before the backlog counts the packets that arrive between the two
reads twice (in the backlog, and again as accepted since); the other order would lose them.
The window is a system call's return, microseconds.

The agent runs at a real-time priority (``agent_process.realtime_priority``), records its
polls, the gaps between their starts (p50, p99, max), the time a poll's work took and its own
CPU seconds in ``ecn-anchor-counters.json`` (rewritten every ``SNAPSHOT_S`` and at exit),
writes ``ecn-anchor.ready`` once it polls, and stops on SIGTERM or SIGINT. A failing read or
write ends it with the error in its counters and log and a non-zero exit: a marker left
unanchored drifts, and the run must say so.
"""
from __future__ import annotations

import sys
import threading
import time
from pathlib import Path

from testbed.apply.agent_process import (
    Histogram,
    agent_arguments,
    realtime_priority,
    stop_on_signals,
    write_json,
)
from testbed.apply.bpf_syscall import BPF_F_LOCK, PinnedMap
from testbed.plan.anchoring import FIRST_SEQ, AnchorPlan, accepted_bytes, anchor_values
from testbed.plan.bpf_maps import layout_struct
from testbed.plan.ecn_plan import ANCHOR_LAYOUT, QDEPTH_LAYOUT
from testbed.system.netlink import QdiscBacklogs

PLAN_FILE = "ecn-anchor-plan.json"
LOG_FILE = "ecn-anchor.log"
READY_FILE = "ecn-anchor.ready"
COUNTERS_FILE = "ecn-anchor-counters.json"
SNAPSHOT_S = 1.0
# Resolution of the recorded times (histograms: a snapshot never sorts the run's history,
# which would hold up the real-time loop for milliseconds)
GAP_BIN_MS = 0.05
WORK_BIN_MS = 0.01
READ_BIN_US = 1.0


class AnchorAgent:
    """The anchor agent of one running fabric's marked ports."""

    def __init__(self, plan: AnchorPlan, workdir: Path):
        self.plan = plan
        self.workdir = workdir
        self.stop_event = threading.Event()
        self.qdepth = PinnedMap(plan.qdepth_pin, layout_struct(QDEPTH_LAYOUT).size)
        self.anchors = PinnedMap(plan.anchor_pin, layout_struct(ANCHOR_LAYOUT).size)
        self.backlogs = QdiscBacklogs(plan.backlog_keys())
        self.wanted = set(plan.ifindexes())
        self.seq = FIRST_SEQ
        self.polls = 0
        self.gaps_ms = Histogram(GAP_BIN_MS)  # between the starts of successive polls
        self.work_ms = Histogram(WORK_BIN_MS)  # what a poll took, reads and write
        self.read_window_us = Histogram(READ_BIN_US)  # the rtnetlink send: backlogs read then
        self.scheduling = "normal"
        self.error: str | None = None

    def poll(self) -> None:
        """One reading of every marked port, and its anchors written."""
        raw = self.qdepth.items()
        t0 = time.monotonic_ns()
        pending = self.backlogs.send()
        t1 = time.monotonic_ns()
        backlogs = self.backlogs.receive(pending)
        accepted = accepted_bytes({k: v for k, v in raw.items() if k in self.wanted})
        values = anchor_values(self.plan, accepted, backlogs, (t0 + t1) // 2, self.seq)
        self.anchors.update_many(values, BPF_F_LOCK)
        self.read_window_us.add((t1 - t0) / 1000)
        self.seq += 1
        self.polls += 1

    def run(self) -> int:
        self.scheduling = realtime_priority()
        last_start = None
        try:
            self.poll()  # the maps and the qdiscs answer before the agent says it is ready
            (self.workdir / READY_FILE).write_text(str(self.plan.poll_s))
            next_snapshot = time.monotonic() + SNAPSHOT_S
            while not self.stop_event.is_set():
                start = time.monotonic()
                if last_start is not None:
                    self.gaps_ms.add((start - last_start) * 1000)
                last_start = start
                self.poll()
                done = time.monotonic()
                self.work_ms.add((done - start) * 1000)
                if done >= next_snapshot:
                    self.snapshot()
                    next_snapshot = done + SNAPSHOT_S
                self.stop_event.wait(max(0.0, self.plan.poll_s - (time.monotonic() - start)))
        except Exception as exc:  # recorded for the run, then the agent ends
            self.error = f"{type(exc).__name__}: {exc}"
            raise
        finally:
            self.snapshot()
            self.qdepth.close()
            self.anchors.close()
        return 0

    def snapshot(self) -> None:
        write_json(self.workdir / COUNTERS_FILE, {
            "t": round(time.monotonic(), 6), "poll_s": self.plan.poll_s,
            "ports": [port.intf for port in self.plan.ports], "polls": self.polls,
            "seq": self.seq - 1, "poll_gap_ms": self.gaps_ms.quantiles(),
            "poll_work_ms": self.work_ms.quantiles(),
            "read_window_us": self.read_window_us.quantiles(),
            "scheduling": self.scheduling, "cpu_s": round(time.process_time(), 3),
            "error": self.error})


def main(argv: list[str] | None = None) -> int:
    args = agent_arguments("testbed.apply.ecn_anchor", sys.argv[1:] if argv is None else argv)
    if args is None:
        return 2
    plan, workdir = args
    agent = AnchorAgent(AnchorPlan.from_json(plan), workdir)
    stop_on_signals(agent.stop_event)
    return agent.run()


if __name__ == "__main__":
    sys.exit(main())
