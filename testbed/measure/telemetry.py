"""Samplers that run beside an experiment: link byte counters, CPU and the ports' queues, as
time series.

Counters are read from the switch-side interfaces in the root namespace
(/sys/class/net/IF/statistics), so sampling never enters a host. For a link a->b the bytes
sent are the TX counter of a's interface when a is a switch, otherwise the RX counter of b's.
"""
from __future__ import annotations

import bisect
import os
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import NamedTuple

from testbed.model.topology.base import Fabric, Link

CLOCK_TICKS_PER_S = os.sysconf("SC_CLK_TCK")


@dataclass(frozen=True)
class Direction:
    """One direction of a link, and where its byte count is read."""

    src: str
    dst: str
    rate_mbit: float
    counter_path: str

    @property
    def label(self) -> str:
        return f"{self.src}->{self.dst}"


def counted_directions(fabric: Fabric) -> Iterator[tuple[str, str, Link, int, str]]:
    """(src, dst, link, end, counter) for both directions of every link: the bytes src sends
    are counted at ``end`` (0: link.a, 1: link.b) of the link by ``counter``, always on a
    switch's side (the root namespace, or the switch's OpenFlow port counters)."""
    switches = {s.name for s in fabric.switches}
    for link in fabric.links:
        for src_end in (0, 1):
            src, dst = (link.a, link.b) if src_end == 0 else (link.b, link.a)
            if src in switches:
                yield src, dst, link, src_end, "tx_bytes"
            else:
                yield src, dst, link, 1 - src_end, "rx_bytes"


def link_directions(fabric: Fabric) -> list[Direction]:
    """Both directions of every link, each with the root-namespace counter that measures it."""
    return [Direction(src, dst, link.rate_mbit,
                      f"/sys/class/net/{link.intf(end)}/statistics/{counter}")
            for src, dst, link, end, counter in counted_directions(fabric)]


def read_int(path: str) -> int:
    try:
        with open(path) as fh:
            return int(fh.read())
    except (OSError, ValueError):
        return 0


class CpuTimes(NamedTuple):
    """Jiffies of the whole machine since boot, from /proc/stat: ``busy`` counts everything
    but idle and iowait, steal included (time the hypervisor ran something else while a vCPU
    of this machine had work: no more use to the emulator than a busy CPU); ``steal`` is that
    part alone."""

    busy: int
    total: int
    steal: int


STEAL_FIELD = 7  # /proc/stat's cpu line: user nice system idle iowait irq softirq steal ...


def cpu_times() -> CpuTimes:
    """The machine's CPU time so far (``CpuTimes``)."""
    with open("/proc/stat") as fh:
        fields = [int(x) for x in fh.readline().split()[1:]]
    idle = fields[3] + fields[4]  # idle + iowait
    total = sum(fields[:8])  # guest time is already counted in user
    return CpuTimes(total - idle, total, fields[STEAL_FIELD])


def process_cpu_ticks(pids: list[int]) -> int:
    """CPU time (user + system clock ticks) used so far by the processes ``pids``, summed."""
    total = 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as fh:
                parts = fh.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += int(parts[11]) + int(parts[12])  # utime + stime
    return total


def thread_ticks(pids: list[int]) -> dict[tuple[int, int], tuple[str, int]]:
    """(pid, tid) -> (thread name, user + system clock ticks so far) of every thread of
    ``pids``; threads that end meanwhile are left out."""
    found = {}
    for pid in pids:
        try:
            tids = os.listdir(f"/proc/{pid}/task")
        except OSError:
            continue
        for tid in tids:
            try:
                with open(f"/proc/{pid}/task/{tid}/stat") as fh:
                    text = fh.read()
            except OSError:
                continue
            name = text[text.index("(") + 1:text.rindex(")")]
            parts = text.rsplit(")", 1)[1].split()
            found[(pid, int(tid))] = (name, int(parts[11]) + int(parts[12]))
    return found


NEW_THREAD_SLACK_TICKS = 2  # tick rounding of a thread first seen in this interval


def busiest_thread(before: dict, after: dict, dt_s: float) -> tuple[str, float]:
    """The thread that used the most CPU between two ``thread_ticks`` readings, and the
    cores it used (1.0: a whole core)."""
    best = ("", 0.0)
    for key, (name, ticks) in after.items():
        if key in before:
            earlier = before[key][1]
        elif ticks <= dt_s * CLOCK_TICKS_PER_S + NEW_THREAD_SLACK_TICKS:
            earlier = 0  # a thread started meanwhile
        else:  # it used more than the interval holds: older, its earlier reading missed
            continue
        cores = (ticks - earlier) / CLOCK_TICKS_PER_S / dt_s
        if cores > best[1]:
            best = (name, cores)
    return best


@dataclass
class Series:
    """Samples at times ``t_s`` (seconds since start)."""

    t_s: list[float] = field(default_factory=list)
    link_bytes: dict[str, list[int]] = field(default_factory=dict)
    cpu_busy_fraction: list[float] = field(default_factory=list)  # of all cores, per interval
    cpu_stolen_fraction: list[float] = field(default_factory=list)  # of all cores, per interval
    vswitchd_cores: list[float] = field(default_factory=list)  # cores used, per interval
    # per watched process (ovs-vswitchd, the pause agent): its busiest thread's cores and
    # name, per interval: a saturated forwarding thread shows here when the machine does not
    thread_cores: dict[str, list[float]] = field(default_factory=dict)
    thread_names: dict[str, list[str]] = field(default_factory=dict)
    # every shaped port's backlog (bytes, by link direction) at times queue_t_s, and, where an
    # eBPF marker marks by a model of the queue, that model read just before and just after
    # it: model_bytes is the midpoint of the two readings, model_swing_bytes half their
    # difference (how much the model moved while the kernel's queue was being read)
    queue_t_s: list[float] = field(default_factory=list)
    queue_index: list[int] = field(default_factory=list)  # the t_s sample of the same pass
    backlog_bytes: dict[str, list[int]] = field(default_factory=dict)
    model_bytes: dict[str, list[int]] = field(default_factory=dict)
    model_swing_bytes: dict[str, list[int]] = field(default_factory=dict)
    queue_error: str | None = None  # why queue sampling stopped early


class QueueReaders(NamedTuple):
    """Readers of a running fabric's queues: ``backlogs()`` -> {link direction: bytes queued
    at its egress port}; ``models()`` -> the same for the ports an eBPF marker marks by a
    model of the queue, as the model has it (empty without one)."""

    backlogs: Callable[[], Mapping[str, int]]
    models: Callable[[], Mapping[str, int]]


class Sampler:
    """Samples counters every ``interval_s`` in a thread until stopped."""

    def __init__(self, directions: list[Direction], vswitchd_pids: list[int],
                 interval_s: float = 0.25, threads: dict[str, list[int]] | None = None,
                 queues: QueueReaders | None = None):
        """``threads``: process name -> PIDs whose threads are watched one by one (by default
        ovs-vswitchd's); ``queues``: how to read the ports' backlogs and the marker's model
        of them (none: not sampled)."""
        self.directions = directions
        self.queues = queues
        self.vswitchd_pids = list(vswitchd_pids)
        self.interval_s = interval_s
        self.threads = dict(threads) if threads is not None else {
            "ovs-vswitchd": list(vswitchd_pids)}
        self.series = Series(link_bytes={d.label: [] for d in directions},
                             thread_cores={name: [] for name in self.threads},
                             thread_names={name: [] for name in self.threads})
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def since_start_s(self, monotonic_s: float) -> float:
        """A CLOCK_MONOTONIC instant (any process's) as seconds since sampling started."""
        return monotonic_s - self._t0

    def __enter__(self) -> Sampler:
        self._t0 = time.monotonic()
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        s = self.series
        last_cpu = cpu_times()
        last_vsw = process_cpu_ticks(self.vswitchd_pids)
        last_threads = {name: thread_ticks(pids) for name, pids in self.threads.items()}
        last_t = time.monotonic()
        while True:
            now = time.monotonic()
            opening = not s.t_s  # the first sample ends no interval worth the name
            for d in self.directions:  # the counters before their instant: a reader
                s.link_bytes[d.label].append(read_int(d.counter_path))  # sees whole samples
            s.t_s.append(now - self._t0)
            cpu = cpu_times()
            vsw = process_cpu_ticks(self.vswitchd_pids)
            dt = max(now - last_t, 1e-6)
            cpu_ticks = max(cpu.total - last_cpu.total, 1)
            s.cpu_busy_fraction.append(0.0 if opening else
                                       (cpu.busy - last_cpu.busy) / cpu_ticks)
            s.cpu_stolen_fraction.append(0.0 if opening else
                                         (cpu.steal - last_cpu.steal) / cpu_ticks)
            s.vswitchd_cores.append(0.0 if opening else
                                    (vsw - last_vsw) / CLOCK_TICKS_PER_S / dt)
            for name, pids in self.threads.items():
                ticks = thread_ticks(pids)
                thread, cores = ("", 0.0) if opening else \
                    busiest_thread(last_threads[name], ticks, dt)
                s.thread_cores[name].append(cores)
                s.thread_names[name].append(thread)
                last_threads[name] = ticks
            if len(s.t_s) == 2:  # the opening sample takes the first real interval's values:
                # microseconds after the baseline, one clock tick read as hundreds of cores
                s.cpu_busy_fraction[0] = s.cpu_busy_fraction[1]
                s.cpu_stolen_fraction[0] = s.cpu_stolen_fraction[1]
                s.vswitchd_cores[0] = s.vswitchd_cores[1]
                for name in self.threads:
                    s.thread_cores[name][0] = s.thread_cores[name][1]
                    s.thread_names[name][0] = s.thread_names[name][1]
            last_cpu, last_vsw, last_t = cpu, vsw, now
            if self.queues is not None and s.queue_error is None:
                self._sample_queues(now)
            if self._stop.wait(self.interval_s):
                break

    def _sample_queues(self, now: float) -> None:
        """One reading of every port's real backlog between two readings of the marker's
        model: the model at the moment the kernel's queue was read lies between the two, so a
        queue that moves while it is read is not taken for a model that left it."""
        s = self.series
        try:
            before = self.queues.models()
            real = self.queues.backlogs()
            after = self.queues.models() if before else {}
        except Exception as exc:  # a thread has no caller to raise to: record it
            s.queue_error = f"{type(exc).__name__}: {exc}"
            return
        model = {label: (value + after.get(label, value)) // 2
                 for label, value in before.items()}
        swing = {label: abs(value - after.get(label, value)) // 2
                 for label, value in before.items()}
        for series, reading in ((s.backlog_bytes, real), (s.model_bytes, model),
                                (s.model_swing_bytes, swing)):
            for label, value in reading.items():
                series.setdefault(label, [0] * len(s.queue_t_s)).append(value)
            for label, values in series.items():
                if label not in reading:
                    values.append(0)
        s.queue_t_s.append(now - self._t0)
        s.queue_index.append(len(s.t_s) - 1)


def counter_at(t_s: list[float], counts: list[int], at_s: float) -> float:
    """A cumulative counter at ``at_s``, linear between the samples around it (clamped to the
    first and last sample)."""
    i = bisect.bisect_left(t_s, at_s)
    if i == 0:
        return counts[0]
    if i >= len(t_s):
        return counts[-1]
    t0, t1 = t_s[i - 1], t_s[i]
    share = (at_s - t0) / (t1 - t0) if t1 > t0 else 1.0
    return counts[i - 1] + (counts[i] - counts[i - 1]) * share


def window_rates_mbit(series: Series, start_s: float, end_s: float) -> dict[str, float]:
    """Mean rate of every link direction over [start_s, end_s], its byte counter interpolated
    at both ends: a window shorter than a few sampling intervals is not over- or under-counted
    by the samples that happen to fall inside it."""
    # Read while the sampler runs, a sample may be in t_s before every link's counter of it:
    # only the samples every series holds count.
    n = min([len(series.t_s), *(len(b) for b in series.link_bytes.values())])
    t_s = series.t_s[:n]
    start_s = max(start_s, t_s[0]) if t_s else start_s
    end_s = min(end_s, t_s[-1]) if t_s else end_s
    if len(t_s) < 2 or end_s <= start_s:
        return {label: 0.0 for label in series.link_bytes}
    dt = end_s - start_s
    return {label: (counter_at(t_s, b[:n], end_s) - counter_at(t_s, b[:n], start_s))
            * 8 / dt / 1e6 for label, b in series.link_bytes.items()}


def window_mean(values: list[float], series: Series, start_s: float, end_s: float) -> float:
    sel = [v for v, t in zip(values, series.t_s) if start_s <= t <= end_s]
    return sum(sel) / len(sel) if sel else 0.0
