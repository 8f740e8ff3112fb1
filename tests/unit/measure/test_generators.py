"""The traffic generators' own CPU (testbed.measure.generators): reading a process's threads
from /proc, the summary over a window computed by hand, the trust checks passing and
failing, and a real process sampled while it runs."""
from __future__ import annotations

import subprocess
import sys
import time

import pytest

from testbed.measure.fidelity import MAX_THREAD_CORES, judge
from testbed.measure.generators import (
    MAX_WAITING_THREADS,
    MAX_WAKEUP_DELAY_FRAMES,
    GeneratorCpu,
    Sample,
    ThreadTimes,
    generator_checks,
    frame_time_us,
    generator_summary,
    process_summary,
    read_threads,
    spanning,
    with_generators,
)
from testbed.measure.telemetry import CLOCK_TICKS_PER_S

S = 1_000_000_000  # ns


def write_thread(proc, pid: int, tid: int, utime: int, stime: int, schedstat: str | None):
    task = proc / str(pid) / "task" / str(tid)
    task.mkdir(parents=True)
    fields = ["S", *(str(i) for i in range(1, 11)), str(utime), str(stime), "0", "0"]
    (task / "stat").write_text(f"{tid} (python3 rank) " + " ".join(fields) + "\n")
    if schedstat is not None:
        (task / "schedstat").write_text(schedstat + "\n")


def test_threads_are_read_with_their_ticks_and_schedstat(tmp_path):
    write_thread(tmp_path, 42, 42, 7, 3, "500000000 100000000 12")
    write_thread(tmp_path, 42, 43, 1, 0, None)  # a kernel without schedstat for it
    assert read_threads(42, str(tmp_path)) == {42: ThreadTimes(10, 500000000, 100000000, 12),
                                               43: ThreadTimes(1, None, None, None)}
    assert read_threads(99, str(tmp_path)) == {}  # gone


READINGS = [
    (0.0, {1: ThreadTimes(0, 0, 0, 0), 2: ThreadTimes(0, 0, 0, 0)}),
    (1.0, {1: ThreadTimes(50, S // 2, S // 10, 400), 2: ThreadTimes(10, S // 10, S // 20, 100)}),
    (2.0, {1: ThreadTimes(100, S, S // 5, 800), 2: ThreadTimes(10, S // 10, S // 20, 100),
           3: ThreadTimes(5, S // 20, S // 20, 200)}),  # thread 3 started in the second interval
]


def test_a_process_summary_by_hand():
    s = process_summary(READINGS)
    # CPU: 0.5 + 0.1 in the first second, 0.5 + 0 + 0.05 in the second: 1.15 s over 2 s
    assert s["cpu_s"] == pytest.approx(1.15) and s["span_s"] == 2.0
    assert s["mean_cores"] == pytest.approx(0.575)
    assert s["busiest_thread_cores"] == pytest.approx(0.5)  # thread 1, both seconds
    # waits: 0.1 + 0.05, then 0.1 + 0 + 0.05: 0.3 s, 0.15 threads waiting on average
    assert s["wait_s"] == pytest.approx(0.3) and s["waiting_threads"] == pytest.approx(0.15)
    assert s["runqueue_wait_fraction"] == pytest.approx(0.3 / 1.45)
    # switches onto a CPU: 400 + 100, then 400 + 0 + 200: 0.3 s over 1100 wake-ups
    assert s["switches"] == 1100 and s["wait_per_switch_us"] == pytest.approx(0.3e6 / 1100)
    # demand, the busiest thread's run + wait: thread 1's 0.5 + 0.1 in both seconds
    assert s["busiest_thread_demand"] == pytest.approx(0.6)


def test_without_schedstat_cpu_comes_from_ticks_and_waits_are_unknown():
    readings = [(t, {tid: ThreadTimes(x.ticks) for tid, x in threads.items()})
                for t, threads in READINGS]
    s = process_summary(readings)
    assert s["cpu_s"] == pytest.approx((100 + 10 + 5) / CLOCK_TICKS_PER_S)
    assert s["wait_s"] is None and s["waiting_threads"] is None
    assert s["runqueue_wait_fraction"] is None
    assert s["switches"] is None and s["wait_per_switch_us"] is None
    assert s["busiest_thread_demand"] is None


def test_one_reading_is_no_summary():
    assert process_summary(READINGS[:1]) is None
    assert process_summary([(0.0, {}), (1.0, {})]) is None  # the process was gone


def test_each_process_is_judged_over_its_own_window():
    samples = [Sample(t, {"rank0": threads, "rank1": threads}) for t, threads in READINGS]
    # rank1's window holds the first two readings only: 0.6 s of CPU over 1 s
    s = generator_summary(samples, {"rank1": (0.0, 1.0)})
    assert s["processes"] == 2
    assert s["per_process"]["rank0"]["cpu_s"] == pytest.approx(1.15)
    assert s["per_process"]["rank1"]["cpu_s"] == pytest.approx(0.6)
    assert s["busiest_thread"]["cores"] == pytest.approx(0.5)
    assert s["runqueue_wait"]["waiting_threads"] == pytest.approx(0.15)
    # rank1's first second: 0.15 s over 500 wake-ups, more per wake-up than rank0's whole run
    assert s["wakeup_delay"] == {"process": "rank1", "wait_per_switch_us": 300.0,
                                 "switches": 500}
    assert s["busiest_demand"]["cores"] == pytest.approx(0.6)
    assert s["schedstat"] is True
    assert s["cpu_s"] == pytest.approx(1.75)


def summary(cores: float, waiting: float | None, delay_us: float | None = None,
            demand: float | None = None) -> dict:
    return {"busiest_thread": {"process": "rank3", "cores": cores},
            "busiest_demand": None if demand is None else {"process": "rank4", "cores": demand},
            "runqueue_wait": None if waiting is None else {"process": "rank5",
                                                           "waiting_threads": waiting},
            "wakeup_delay": None if delay_us is None else {
                "process": "rank6", "wait_per_switch_us": delay_us, "switches": 900}}


def test_a_thread_that_never_slept_fails_though_it_ran_half_the_time():
    """Run 0.5 of a core and waited the rest: the CPU limited it, whatever it got."""
    [hungry] = generator_checks(summary(0.5, None, None, demand=1.0))
    assert (hungry.name, hungry.outcome, hungry.unit) == (
        "generator busiest thread", "FAIL", "cores run or waited for")
    assert "rank4" in hungry.statement
    [fed] = generator_checks(summary(0.5, None, None, demand=0.7))
    assert fed.outcome == "PASS"


def test_a_frame_time_is_one_mtu_at_the_fastest_shaped_link():
    from testbed.model.topology import line, spine_leaf

    fabric = spine_leaf(leaves=2, spines=1, hosts_per_leaf=1, host_rate_mbit=20,
                        uplink_rate_mbit=40, mtu_bytes=1500)
    assert frame_time_us(fabric) == pytest.approx(1500 * 8 / 40)  # 300 us
    assert frame_time_us(line(2, host_rate_mbit=None)) is None  # nothing shaped


def test_generator_checks_pass_and_fail():
    good = generator_checks(summary(0.5, 0.05), "fabric")
    assert [(c.name, c.outcome, c.setup) for c in good] == [
        ("generator busiest thread", "PASS", "fabric"),
        ("generator wait for a core", "PASS", "fabric")]
    bad = generator_checks(summary(MAX_THREAD_CORES + 0.01, MAX_WAITING_THREADS + 0.01))
    assert [c.outcome for c in bad] == ["FAIL", "FAIL"]
    assert "rank3" in bad[0].statement and "rank5" in bad[1].statement
    assert generator_checks(summary(0.5, None))[0].name == "generator busiest thread"
    assert len(generator_checks(summary(0.5, None))) == 1  # no schedstat: no wait judged
    assert generator_checks({"busiest_thread": None, "runqueue_wait": None}) == []


def test_with_a_frame_time_the_wait_per_wake_up_is_judged():
    """Many short waits (0.6 threads waiting, the load measure's FAIL) pass when each moved
    the generator by less than a frame time; long ones fail however rare."""
    frame_us = 600.0
    short = generator_checks(summary(0.5, 0.6, 180.0), "pfc", frame_us)
    assert [(c.name, c.outcome, c.unit) for c in short][1] == (
        "generator wait for a core", "PASS", "us per wake-up")
    assert short[1].expected == f"<= {MAX_WAKEUP_DELAY_FRAMES * frame_us:g}"
    assert "rank6" in short[1].statement and "900 wake-ups" in short[1].statement
    late = generator_checks(summary(0.5, 0.05, MAX_WAKEUP_DELAY_FRAMES * frame_us + 1),
                            "pfc", frame_us)
    assert late[1].outcome == "FAIL"
    # a frame time but no switch counts (no schedstat): nothing of the wait to judge
    assert len(generator_checks(summary(0.5, None, None), "pfc", frame_us)) == 1


def test_the_generators_join_the_fidelity_verdict():
    fidelity = judge(0.3, 1.0, 0.98, 0.0).to_dict()
    kept = with_generators(fidelity, summary(0.5, 0.05))
    assert kept["trustworthy"] is True and kept["reasons"] == fidelity["reasons"]
    assert len(kept["checks"]) == len(fidelity["checks"]) + 2
    assert kept["generators"] == summary(0.5, 0.05)
    starved = with_generators(fidelity, summary(0.5, 0.6))
    assert starved["trustworthy"] is False
    assert starved["reasons"] == ["generator wait for a core: 0.6 threads waiting, on average "
                                  "(limit <= 0.25)"]
    late = with_generators(fidelity, summary(0.5, 0.05, 2000.0), frame_us=600.0)
    assert late["reasons"] == ["generator wait for a core: 2000.0 us per wake-up "
                               "(limit <= 600)"]
    untrusted = judge(0.99, 1.0, 0.98, 0.0).to_dict()
    both = with_generators(untrusted, summary(1.0, 0.05))
    assert both["reasons"][0].startswith("generator busiest thread")
    assert both["reasons"][1:] == untrusted["reasons"]


BUSY = "import time\nend = time.monotonic() + 0.8\nwhile time.monotonic() < end: pass\n"


def test_a_running_process_is_sampled_until_it_ends():
    with GeneratorCpu(interval_s=0.05) as cpu:
        busy = subprocess.Popen([sys.executable, "-c", BUSY])
        idle = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(0.8)"])
        cpu.add("busy", busy.pid)
        cpu.add("idle", idle.pid)
        busy.wait()
        idle.wait()
    s = cpu.summary()
    assert set(s["per_process"]) == {"busy", "idle"}
    assert s["per_process"]["busy"]["cpu_s"] > s["per_process"]["idle"]["cpu_s"]
    assert s["busiest_thread"]["process"] == "busy"


HOG = ("import os, time\nos.sched_setaffinity(0, {0})\nend = time.monotonic() + 1.0\n"
       "while time.monotonic() < end: pass\n")


def test_two_busy_processes_on_one_cpu_each_run_half_and_never_sleep():
    """Real processes: each gets about half of the one CPU they share and waits for it the
    rest of the time, so its demand reads near a whole core (schedstat's run + wait)."""
    with GeneratorCpu(interval_s=0.05) as cpu:
        hogs = [subprocess.Popen([sys.executable, "-c", HOG]) for _ in range(2)]
        time.sleep(0.2)  # both pinned and spinning
        cpu.add("hog", hogs[0].pid)
        for hog in hogs:
            hog.wait()
    s = cpu.summary()["per_process"]["hog"]
    assert s["busiest_thread_cores"] < 0.8  # it had to share
    assert s["busiest_thread_demand"] > 0.9  # and never slept: limited by the CPU
    assert s["wait_per_switch_us"] > 0


def test_a_window_shorter_than_the_sampling_interval_is_judged_over_the_samples_around_it():
    samples = [Sample(t, {"rank0": threads}) for t, threads in READINGS]
    times = [t for t, _ in READINGS]
    # no reading falls inside: the two around it stand for the window
    short = generator_summary(samples, {"rank0": (times[0] + 0.01, times[1] - 0.01)})
    whole = generator_summary(samples[:2])
    assert short["processes"] == 1
    assert short["per_process"]["rank0"] == whole["per_process"]["rank0"]
    # a window past every reading keeps the last one alone: no summary, as before
    late = generator_summary(samples, {"rank0": (times[-1] + 1, times[-1] + 2)})
    assert late["processes"] == 0


def test_spanning_keeps_the_samples_inside_when_there_are_two():
    samples = [(t, t) for t in (0.0, 0.25, 0.5, 0.75, 1.0)]
    assert spanning(samples, 0.2, 0.8) == samples[1:4]
    assert spanning(samples, 0.3, 0.4) == samples[1:3]
    assert spanning(samples, -1, 0.1) == samples[0:2]
