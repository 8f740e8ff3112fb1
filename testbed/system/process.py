"""Running the machine's tools to completion (tc, bpftool, clang) and stopping the processes a
run started: the two ways the testbed drives a process, for the machine layer and
measurement alike."""
from __future__ import annotations

import subprocess
from collections.abc import Sequence

from testbed.errors import TestbedError

TOOL_TIMEOUT_S = 120


def run_tool(argv: Sequence[str], stdin: str | None = None, what: str = "") -> str:
    """Run one tool (tc, bpftool, clang) to completion; its stdout, or a one-line error."""
    out = subprocess.run(list(argv), input=stdin, capture_output=True, text=True,
                         timeout=TOOL_TIMEOUT_S)
    if out.returncode != 0:
        raise TestbedError(f"{what or argv[0] + ' failed'}: {out.stderr.strip()[-300:]}")
    return out.stdout


def stop_process(proc: subprocess.Popen | None, timeout_s: float) -> None:
    """End a child we started: SIGTERM, then SIGKILL if it has not exited in ``timeout_s``."""
    if proc is None or proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
