"""Running ranks for tests: as threads over in-process transports, or as real processes of a
host program over TCP on 127.0.0.1. Shared by the collective and training-pattern tests."""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
from pathlib import Path

JOIN_TIMEOUT_S = 60.0     # a rank thread still alive after this is a deadlock
PROCESS_TIMEOUT_S = 120.0
REPO = Path(__file__).resolve().parents[2]


def run_ranks(world: int, target) -> list:
    """Run ``target(rank)`` in one thread per rank. Returns each rank's return value; raises
    the first rank's exception, or AssertionError naming the ranks still running after the
    join timeout (a deadlock)."""
    results: list = [None] * world
    errors: list[BaseException | None] = [None] * world

    def wrap(rank):
        try:
            results[rank] = target(rank)
        except BaseException as exc:
            errors[rank] = exc

    threads = [threading.Thread(target=wrap, args=(r,), daemon=True) for r in range(world)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(JOIN_TIMEOUT_S)
    stuck = [r for r, t in enumerate(threads) if t.is_alive()]
    assert not stuck, f"ranks {stuck} deadlocked"
    for exc in errors:
        if exc is not None:
            raise exc
    return results


def free_ports(n: int) -> list[int]:
    """``n`` TCP ports free on 127.0.0.1 right now (the kernel picks them)."""
    socks = []
    try:
        for _ in range(n):
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def loopback_hosts(world: int) -> str:
    """A --hosts argument: every rank on 127.0.0.1 with its own port."""
    return ",".join(f"127.0.0.1:{p}" for p in free_ports(world))


def run_rank_processes(module: str, world: int, args_for_rank) -> list[tuple[int, dict]]:
    """Start ``python -m module`` once per rank with ``args_for_rank(rank)``; returns each
    rank's (exit status, parsed JSON output)."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    procs = [subprocess.Popen([sys.executable, "-m", module, *args_for_rank(r)], cwd=REPO, env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE)
             for r in range(world)]
    out = []
    try:
        for p in procs:
            stdout, stderr = p.communicate(timeout=PROCESS_TIMEOUT_S)
            lines = stdout.decode().strip().splitlines()
            assert len(lines) == 1, f"expected one JSON line, got {stdout!r}; stderr {stderr[-2000:]!r}"
            out.append((p.returncode, json.loads(lines[0])))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    return out
