"""Rank programs on a running fabric: one process per rank (testbed.traffic.collectives and
testbed.traffic.training programs), each started in its host's namespace, followed through
rank 0's progress lines, and collected as the one JSON object each prints.

``rank_argv`` and ``launches`` build the ranks' command lines (pure); ``start_ranks`` starts
them with stdout and stderr in files of the setup's folder (``<prefix><rank>.json`` and
``.err``), so a large output never fills a pipe; ``collect_ranks`` waits for them and parses
their output; ``run_ranks`` does both, with each process's CPU watched
(testbed.measure.generators). ``RankWatch`` is what a measurement watches around its ranks:
the emulator (the fidelity Watch) and the generators, judged together by ``fidelity``.
``host_problems`` refuses more ranks than hosts.
"""
from __future__ import annotations

import json
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from testbed.apply.state import exit_description, process_state
from testbed.errors import TestbedError
from testbed.harness.scenario import Problem
from testbed.measure.generators import GeneratorCpu, frame_time_us, with_generators
from testbed.traffic.collectives.program import DEFAULT_PORT, PROGRESS_PREFIX

RANK_PORT = DEFAULT_PORT
RANK_TIMEOUT_S = 600.0
POLL_S = 0.5


def rank_argv(module: str, rank: int, addresses: list[str], port: int = RANK_PORT,
              args: list[str] | tuple = ()) -> list[str]:
    """``python -m module --rank R --hosts ip,ip,... --port P args...``."""
    return [sys.executable, "-m", module, "--rank", str(rank), "--hosts", ",".join(addresses),
            "--port", str(port), *map(str, args)]


@dataclass(frozen=True)
class Launch:
    """One rank: the host it runs on, its command line and extra environment."""

    host: str
    argv: list[str]
    env: dict[str, str] | None = None


def launches(module: str, hosts: list[str], ips: list[str], args: list[str] | tuple = (),
             port: int = RANK_PORT) -> list[Launch]:
    """Every rank of a program on ``hosts`` (rank order), the same ``args`` for each."""
    return [Launch(host, rank_argv(module, rank, ips, port, args))
            for rank, host in enumerate(hosts)]


def rank_progress(path: Path) -> int:
    """How far rank 0 is, from its last progress line (0 before the first)."""
    try:
        lines = Path(path).read_text(errors="replace").splitlines()
    except OSError:
        return 0
    done = [json.loads(line[len(PROGRESS_PREFIX):])["done"] for line in lines
            if line.startswith(PROGRESS_PREFIX)]
    return max(done, default=0)


def start_ranks(net, ranks: list[Launch], workdir: Path, prefix: str = "rank") -> list:
    """Start every rank in its host (``net.popen``), stdout to ``<prefix><rank>.json`` and
    stderr to ``<prefix><rank>.err`` in ``workdir``."""
    procs = []
    for rank, launch in enumerate(ranks):
        env = None if launch.env is None else {**os.environ, **launch.env}
        with open(workdir / f"{prefix}{rank}.json", "wb") as out, \
                open(workdir / f"{prefix}{rank}.err", "wb") as err:
            procs.append(net.popen(launch.host, launch.argv, stdout=out, stderr=err, env=env))
    return procs


def parse_rank_output(text: str, rank: int, returncode: int | None, err_tail: str) -> dict:
    """A rank's JSON object; an error naming the rank when it failed (an exit status other
    than 0 or 1 (1: ran but did not verify), no output, or an ``error`` it reported)."""
    if returncode not in (0, 1) or not text.strip():
        raise TestbedError(f"rank {rank} failed (exit {returncode}): {err_tail}")
    try:
        result = json.loads(text.strip().splitlines()[-1])
    except ValueError:
        raise TestbedError(f"rank {rank} printed no JSON object: {text.strip()[-200:]}") from None
    if "error" in result:
        raise TestbedError(f"rank {rank} failed: {result['error']}")
    return result


def casualty(returncodes: list[int | None]) -> int | None:
    """The first rank ended by a signal (killed from outside: the harness kills ranks only
    after it has failed the run), None when there is none. Its peers then fail too, on a
    broken connection, and naming one of them would hide what died."""
    return next((rank for rank, code in enumerate(returncodes)
                 if code is not None and code < 0), None)


def died(what: str, procs) -> TestbedError | None:
    """The error naming a rank killed from outside, if one was."""
    rank = casualty([p.poll() for p in procs])
    if rank is None:
        return None
    return TestbedError(f"{what}: rank {rank} died: {exit_description(procs[rank].returncode)}")


def unfinished(what: str, states: dict[int, str | None], timeout_s: float) -> str:
    """The one line for ranks still running at the deadline (``states``: rank -> its
    /proc state letter): a rank stopped by a signal (SIGSTOP) is named as stopped first, as
    the likeliest reason the others wait."""
    stopped = [rank for rank, state in states.items() if state == "T"]
    if stopped:
        others = len(states) - 1
        return (f"{what}: rank {stopped[0]} was stopped (SIGSTOP) and "
                + (f"it and {others} other{'s' if others != 1 else ''}" if others else "it")
                + f" did not finish in {timeout_s:.0f} s")
    return f"{what}: ranks {list(states)[:4]} did not finish in {timeout_s:.0f} s"


def collect_ranks(procs, workdir: Path, progress, total: int | None = None,
                  what: str = "rank programs", prefix: str = "rank",
                  timeout_s: float = RANK_TIMEOUT_S) -> list[dict]:
    """Every rank's JSON result, following rank 0's progress lines meanwhile (``total``:
    what they count up to); a rank that fails or outlives ``timeout_s`` is an error naming
    it (a rank killed from outside before the peers it broke; a stopped one as stopped),
    and every rank still running is then killed. Output piped by the caller is written to
    ``<prefix><rank>.json`` here."""
    deadline = time.monotonic() + timeout_s
    err0 = workdir / f"{prefix}0.err"
    try:
        with progress.phase(what, total=total) as phase:
            while any(p.poll() is None for p in procs):
                phase.update(rank_progress(err0))
                error = died(what, procs)
                if error is not None:  # at once: its peers may wait for it until the deadline
                    raise error
                if time.monotonic() > deadline:
                    states = {r: process_state(p.pid) for r, p in enumerate(procs)
                              if p.poll() is None}
                    raise TestbedError(unfinished(what, states, timeout_s))
                time.sleep(POLL_S)
            phase.update(rank_progress(err0))
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    for rank, proc in enumerate(procs):
        if proc.stdout is not None:
            (workdir / f"{prefix}{rank}.json").write_bytes(proc.communicate()[0])
    error = died(what, procs)
    if error is not None:
        raise error
    results = []
    for rank, proc in enumerate(procs):
        path = workdir / f"{prefix}{rank}.json"
        tail = (workdir / f"{prefix}{rank}.err").read_text(errors="replace")[-400:].strip()
        results.append(parse_rank_output(path.read_text(errors="replace"), rank,
                                         proc.returncode, tail))
    return results


def run_ranks(run, ranks: list[Launch], what: str, total: int | None = None,
              prefix: str = "rank", cpu=None, timeout_s: float = RANK_TIMEOUT_S) -> list[dict]:
    """Start every rank on a running setup (testbed.harness.experiment.SetupRun), watch
    each process's CPU in ``cpu`` (testbed.measure.generators.GeneratorCpu) under the name
    ``<prefix><rank>``, judged over the window it reports measuring in
    (``timed_window_monotonic_s``), and collect their results."""
    run.log(f"{what}: {len(ranks)} ranks on {', '.join(dict.fromkeys(r.host for r in ranks))}")
    procs = start_ranks(run.net, ranks, run.workdir, prefix)
    if cpu is not None:
        for rank, proc in enumerate(procs):
            cpu.add(f"{prefix}{rank}", proc.pid)
    results = collect_ranks(procs, run.workdir, run.progress, total, what, prefix, timeout_s)
    if cpu is not None:
        for rank, result in enumerate(results):
            window = window_of([result])
            if window is not None:
                cpu.measured(f"{prefix}{rank}", window)
    return results


def window_of(results: list[dict], key: str = "timed_window_monotonic_s") -> list[float] | None:
    """The span of every rank's ``key`` window (CLOCK_MONOTONIC): the first start, the last
    end; None when no rank reports one."""
    windows = [r[key] for r in results if r.get(key) and None not in r[key]]
    if not windows:
        return None
    return [min(w[0] for w in windows), max(w[1] for w in windows)]


def all_ranks_window(results: list[dict],
                     key: str = "timed_window_monotonic_s") -> list[float] | None:
    """The part of the ranks' ``key`` windows where every rank was timing (the last start,
    the first end): a collective moves data only while all its ranks take part, so ranks
    that started early (no warm-up; Python ranks import at different speeds) do not stretch
    the window the links are judged over. The span of all windows (``window_of``) when they
    do not overlap."""
    windows = [r[key] for r in results if r.get(key) and None not in r[key]]
    if not windows:
        return None
    start, end = max(w[0] for w in windows), min(w[1] for w in windows)
    return [start, end] if start < end else window_of(results, key)


class RankWatch:
    """What a rank-program measurement watches on a running setup: the emulator (the
    harness's fidelity Watch) and the generators' own CPU (GeneratorCpu), for the whole
    block. ``run_ranks`` starts and collects ranks with their CPU watched; ``fidelity``
    judges a window of it, generators included (testbed.measure.generators
    .with_generators)."""

    def __init__(self, run):
        self.run = run
        self.watch = run.watch()
        self.cpu = GeneratorCpu()

    def __enter__(self) -> RankWatch:
        self.watch.__enter__()
        self.cpu.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self.cpu.__exit__(*exc)
        self.watch.__exit__(*exc)

    def run_ranks(self, ranks: list[Launch], what: str, total: int | None = None,
                  prefix: str = "rank", timeout_s: float = RANK_TIMEOUT_S) -> list[dict]:
        return run_ranks(self.run, ranks, what, total, prefix, self.cpu, timeout_s)

    def fidelity(self, window_monotonic_s=None, bandwidth_bound: bool = False,
                 bottleneck: str | None = None) -> dict:
        """The emulator's verdict over ``window_monotonic_s`` (default: the whole watch),
        with the generators' checks over the whole watch (every rank program it ran)."""
        window = self.watch.window_s(*window_monotonic_s) if window_monotonic_s else None
        verdict = self.watch.verdict(window, bottleneck=bottleneck,
                                     bandwidth_bound=bandwidth_bound).to_dict()
        return with_generators(verdict, self.cpu.summary(),
                               frame_us=frame_time_us(self.run.net.fabric))


def host_problems(fabric, field: str, needed: int, what: str = "ranks") -> list:
    """A problem on ``params.<field>`` when ``needed`` ranks (one per host) are more than
    the fabric's hosts."""
    hosts = len(fabric.hosts)
    if needed <= hosts:
        return []
    return [Problem(("params", field), f"{needed} {what} need {needed} hosts; the fabric has "
                    f"{hosts}")]
