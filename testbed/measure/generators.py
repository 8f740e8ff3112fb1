"""The traffic generators' own CPU, as part of whether a run can be trusted.

The rank programs a run starts inside the emulated hosts share the machine's cores with the
emulator. A generator whose threads often wanted a core and had to wait for one (runnable but
queued: the scheduler's run delay, /proc/PID/task/TID/schedstat) or whose busiest thread never
idled (a Python rank holding its interpreter lock the whole time) times itself, not the
network. ``GeneratorCpu`` samples the processes by PID while they run, each judged over the
window it measured in; ``generator_summary`` reduces the samples (pure); ``generator_checks``
judges the result with named tolerances and ``with_generators`` adds those checks to a
fidelity verdict (testbed.measure.fidelity.FidelityVerdict.to_dict()), so the harness counts them in
the emulator's trust.
"""
from __future__ import annotations

import os
import threading
import time
from bisect import bisect_left, bisect_right
from dataclasses import dataclass, field

from testbed.measure.fidelity import MAX_THREAD_CORES
from testbed.measure.telemetry import CLOCK_TICKS_PER_S
from testbed.model.verdict import at_most

# A generator's events happen late by its run-queue wait each time it is woken (schedstat:
# wait per switch onto a CPU). The network's own resolution is a frame: the time the fastest
# shaped link takes to send one MTU frame. A mean wait per wake-up under one frame time moves
# a generator's sends and replies by less than the wire can tell apart; beyond it the
# scheduler decides when they happen, not the network. Measured on a 2-core VM (RoCE incast
# at 20 Mbit/s, MTU 1500: a 600 us frame): 100-300 us per wake-up while the machine had idle
# CPU (docs/fidelity.md).
MAX_WAKEUP_DELAY_FRAMES = 1.0
# Threads of one generator waiting on a run queue, on average over its measured window (its
# run-queue wait per second): judged only where no link is shaped, so no frame time exists.
# This counts how often a generator waited rather than how long each wait moved it: a
# RoCE receiver woken 1,670 times a second read 0.31 on 183 us waits, under a third of its
# link's 600 us frame.
MAX_WAITING_THREADS = 0.25
# Below this much demand (run + wait) the share of demand spent waiting is not reported.
MIN_DEMAND_S = 0.02
SAMPLE_INTERVAL_S = 0.25


@dataclass(frozen=True)
class ThreadTimes:
    """One thread's CPU so far: clock ticks (user + system) and, where the kernel keeps
    schedstat, nanoseconds on a CPU, nanoseconds waiting on a run queue and how many times it
    was switched onto a CPU (each switch-in ends one wait, of zero length when it found a core
    free)."""

    ticks: int
    run_ns: int | None = None
    wait_ns: int | None = None
    switches: int | None = None


def read_threads(pid: int, proc: str = "/proc") -> dict[int, ThreadTimes]:
    """tid -> ThreadTimes of every live thread of ``pid`` (empty once it is gone)."""
    try:
        tids = os.listdir(f"{proc}/{pid}/task")
    except OSError:
        return {}
    out = {}
    for tid in tids:
        base = f"{proc}/{pid}/task/{tid}"
        try:
            with open(f"{base}/stat") as fh:
                parts = fh.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        run_ns = wait_ns = switches = None
        try:
            with open(f"{base}/schedstat") as fh:
                run_ns, wait_ns, switches = (int(x) for x in fh.read().split()[:3])
        except (OSError, ValueError):
            pass
        out[int(tid)] = ThreadTimes(int(parts[11]) + int(parts[12]), run_ns, wait_ns, switches)
    return out


@dataclass
class Sample:
    """Every watched process's threads at one instant (``t_s``: CLOCK_MONOTONIC)."""

    t_s: float
    processes: dict[str, dict[int, ThreadTimes]] = field(default_factory=dict)


class GeneratorCpu:
    """Samples the CPU of named processes every ``interval_s`` in a thread, from ``add``
    until the block ends: ``with GeneratorCpu() as cpu: cpu.add("rank0", proc.pid)``."""

    def __init__(self, interval_s: float = SAMPLE_INTERVAL_S, proc: str = "/proc"):
        self.interval_s = interval_s
        self.proc = proc
        self.pids: dict[str, int] = {}
        self.windows: dict[str, tuple[float, float]] = {}
        self.samples: list[Sample] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def add(self, name: str, pid: int) -> None:
        with self._lock:
            self.pids[name] = pid
        self.sample()  # its start, so a short process is seen at least twice

    def measured(self, name: str, window_s: tuple[float, float]) -> None:
        """Judge process ``name`` over ``window_s`` (CLOCK_MONOTONIC) only: the part of its
        life that measured (not its start-up)."""
        with self._lock:
            self.windows[name] = (window_s[0], window_s[1])

    def sample(self) -> None:
        with self._lock:
            pids = dict(self.pids)
        sample = Sample(time.monotonic(), {name: read_threads(pid, self.proc)
                                           for name, pid in pids.items()})
        with self._lock:
            self.samples.append(sample)

    def __enter__(self) -> GeneratorCpu:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
        self.sample()

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.sample()

    def summary(self) -> dict:
        with self._lock:
            samples, windows = list(self.samples), dict(self.windows)
        return generator_summary(samples, windows)


def _delta(before: dict[int, ThreadTimes], after: dict[int, ThreadTimes]
           ) -> tuple[dict[int, float], dict[int, float] | None, int | None]:
    """Between two readings of one process: CPU seconds per thread (schedstat's nanoseconds
    where the kernel keeps them, else clock ticks), run-queue wait seconds per thread and the
    threads' switches onto a CPU (both None without schedstat). A thread that appeared
    meanwhile counts from 0; one that ended is in neither reading's sum."""
    sched = all(None not in (t.run_ns, t.wait_ns, t.switches) for t in after.values())
    cpu, wait, switches = {}, {}, 0
    for tid, now in after.items():
        was = before.get(tid, ThreadTimes(0, 0, 0, 0))
        if sched:
            cpu[tid] = (now.run_ns - (was.run_ns or 0)) / 1e9
            wait[tid] = (now.wait_ns - (was.wait_ns or 0)) / 1e9
            switches += now.switches - (was.switches or 0)
        else:
            cpu[tid] = (now.ticks - was.ticks) / CLOCK_TICKS_PER_S
    return cpu, (wait if sched else None), (switches if sched else None)


def process_summary(readings: list[tuple[float, dict[int, ThreadTimes]]]) -> dict | None:
    """One process over consecutive readings (time, threads): its CPU seconds and mean
    cores; the mean over intervals of its busiest thread's cores, and of its busiest thread's
    demand (cores it ran or waited to run: 1 is a thread that never slept, limited by the CPU
    whether or not it got one); its run-queue wait: seconds, threads waiting on average
    (wait / time), the share of its threads' demand spent waiting (None with too little
    demand), its switches onto a CPU and the mean wait per switch-in in microseconds (demand
    and waits None without schedstat)."""
    readings = [(t, threads) for t, threads in readings if threads]
    if len(readings) < 2:
        return None
    cpu_s, wait_s, switches, busiest, demand, sched = 0.0, 0.0, 0, [], [], True
    for (t0, before), (t1, after) in zip(readings, readings[1:]):
        dt = max(t1 - t0, 1e-6)
        cpu, wait, switched = _delta(before, after)
        cpu_s += sum(cpu.values())
        busiest.append(max(cpu.values(), default=0.0) / dt)
        if wait is None:
            sched = False
        else:
            wait_s += sum(wait.values())
            switches += switched
            demand.append(max((cpu[tid] + wait[tid] for tid in cpu), default=0.0) / dt)
    span = readings[-1][0] - readings[0][0]
    demand_s = cpu_s + wait_s
    return {"cpu_s": cpu_s, "span_s": span, "mean_cores": cpu_s / span if span > 0 else 0.0,
            "busiest_thread_cores": sum(busiest) / len(busiest),
            "busiest_thread_demand": sum(demand) / len(demand) if sched else None,
            "wait_s": wait_s if sched else None,
            "waiting_threads": wait_s / span if sched and span > 0 else None,
            "runqueue_wait_fraction": (wait_s / demand_s
                                       if sched and demand_s >= MIN_DEMAND_S else None),
            "switches": switches if sched else None,
            "wait_per_switch_us": wait_s / switches * 1e6 if sched and switches else None}


def spanning(samples: list[tuple[float, object]], lo: float, hi: float) -> list:
    """The time-sorted ``(t, reading)`` samples inside [lo, hi]; when fewer than two are,
    those that span it: from the last at or before ``lo`` (the first if none is) to the first
    at or after ``hi`` (the last if none is)."""
    times = [t for t, _ in samples]
    inside = samples[bisect_left(times, lo):bisect_right(times, hi)]
    if len(inside) >= 2:
        return inside
    start = max(0, bisect_right(times, lo) - 1)
    return samples[start:bisect_left(times, hi) + 1]


def generator_summary(samples: list[Sample], windows: dict[str, tuple[float, float]] | None = None
                      ) -> dict:
    """Every process's summary over its samples (those inside its window in ``windows``,
    CLOCK_MONOTONIC, where it has one; those spanning it when the window is shorter than the
    sampling interval), and the worst of them: the busiest thread by CPU and by demand, the
    most threads waiting for a core and the longest wait per wake-up."""
    windows = windows or {}
    names = dict.fromkeys(n for s in samples for n in s.processes)
    per = {}
    for name in names:
        own = sorted(((s.t_s, s.processes[name]) for s in samples if name in s.processes),
                     key=lambda item: item[0])
        summary = process_summary(spanning(own, *windows.get(name, (float("-inf"),
                                                                    float("inf")))))
        if summary is not None:
            per[name] = summary
    waits = {n: p["waiting_threads"] for n, p in per.items() if p["waiting_threads"] is not None}
    busiest = max(per, key=lambda n: per[n]["busiest_thread_cores"], default=None)
    demands = {n: p["busiest_thread_demand"] for n, p in per.items()
               if p["busiest_thread_demand"] is not None}
    hungriest = max(demands, key=demands.get, default=None)
    waiting = max(waits, key=waits.get, default=None)
    delays = {n: p["wait_per_switch_us"] for n, p in per.items()
              if p["wait_per_switch_us"] is not None}
    delayed = max(delays, key=delays.get, default=None)
    return {"processes": len(per),
            "cpu_s": round(sum(p["cpu_s"] for p in per.values()), 3),
            "mean_cores": round(sum(p["mean_cores"] for p in per.values()), 4),
            "busiest_thread": None if busiest is None else {
                "process": busiest, "cores": round(per[busiest]["busiest_thread_cores"], 4)},
            "busiest_demand": None if hungriest is None else {
                "process": hungriest, "cores": round(demands[hungriest], 4)},
            "runqueue_wait": None if waiting is None else {
                "process": waiting, "waiting_threads": round(waits[waiting], 4),
                "fraction_of_demand": per[waiting]["runqueue_wait_fraction"]},
            "wakeup_delay": None if delayed is None else {
                "process": delayed, "wait_per_switch_us": round(delays[delayed], 1),
                "switches": per[delayed]["switches"]},
            "schedstat": any(t.run_ns is not None for s in samples
                             for threads in s.processes.values() for t in threads.values()),
            "per_process": {n: {k: (round(v, 4) if isinstance(v, float) else v)
                                for k, v in p.items()} for n, p in per.items()}}


def frame_time_us(fabric) -> float | None:
    """Microseconds the fastest shaped link of ``fabric`` takes to send one MTU frame (None
    when no link is shaped): the time scale the generators' run-queue waits are judged
    against."""
    rates = [link.rate_mbit for link in fabric.links if link.rate_mbit]
    return fabric.mtu_bytes * 8 / max(rates) if rates else None


def generator_checks(summary: dict, setup: str | None = None,
                     frame_us: float | None = None) -> list:
    """The generators' trust checks: no generator's busiest thread saturated (running or
    waiting for a core the whole time, where schedstat says; running, where it does not),
    and none woken late by a frame time (``frame_us``, frame_time_us) or more on average; without a
    frame time, none waiting for a core much of the time (MAX_WAITING_THREADS). Waits are
    judged where the kernel keeps schedstat."""
    checks = []
    busiest, hungriest = summary.get("busiest_thread"), summary.get("busiest_demand")
    if hungriest is not None:
        checks.append(at_most("generator busiest thread", hungriest["cores"], MAX_THREAD_CORES,
                              "cores run or waited for", f"the traffic generators' busiest "
                              f"thread ({hungriest['process']}), counting the time it waited "
                              "for a core, had idle time left, so the CPU did not limit them",
                              setup))
    elif busiest is not None:
        checks.append(at_most("generator busiest thread", busiest["cores"], MAX_THREAD_CORES,
                              "cores", f"the traffic generators' busiest thread ("
                              f"{busiest['process']}) had idle time left, so they kept pace",
                              setup))
    delay, waiting = summary.get("wakeup_delay"), summary.get("runqueue_wait")
    if frame_us is not None and delay is not None:
        limit_us = round(MAX_WAKEUP_DELAY_FRAMES * frame_us, 1)
        checks.append(at_most("generator wait for a core", delay["wait_per_switch_us"],
                              limit_us, "us per wake-up",
                              f"the scheduler moved no traffic generator's events by a frame "
                              f"time ({frame_us:.0f} us at the fastest link) on average: the "
                              f"one that waited longest, {delay['process']}, waited "
                              f"{delay['wait_per_switch_us']:.0f} us per wake-up over "
                              f"{delay['switches']} wake-ups", setup))
    elif waiting is not None:
        checks.append(at_most("generator wait for a core", waiting["waiting_threads"],
                              MAX_WAITING_THREADS, "threads waiting, on average",
                              f"no traffic generator was starved of CPU (the one that waited "
                              f"most, {waiting['process']}, had "
                              f"{waiting['waiting_threads']:.2f} threads waiting for a core on "
                              "average; no link is shaped, so no frame time to judge waits "
                              "against)", setup))
    return checks


def with_generators(fidelity: dict, summary: dict, setup: str | None = None,
                    frame_us: float | None = None) -> dict:
    """A fidelity verdict (FidelityVerdict.to_dict()) with the generators' checks (generator_checks,
    waits judged against ``frame_us``) and summary added: not trustworthy when one of them
    fails."""
    checks = generator_checks(summary, setup, frame_us)
    failed = [c for c in checks if c.passed is False]
    reasons = list(fidelity.get("reasons", []))
    if failed:
        problems = [f"{c.name}: {c.measured} {c.unit} (limit {c.expected})" for c in failed]
        reasons = problems + (reasons if not fidelity.get("trustworthy") else [])
    return {**fidelity, "trustworthy": bool(fidelity.get("trustworthy")) and not failed,
            "reasons": reasons, "checks": [*fidelity.get("checks", []),
                                           *(c.to_dict() for c in checks)],
            "generators": summary}
