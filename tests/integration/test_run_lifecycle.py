"""The `testbed` command end to end: a run writes its results and leaves nothing behind;
Ctrl-C and SIGKILL mid-run are recovered; a second concurrent run is refused."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from conftest import REPO, assert_clean, leftovers

from testbed.apply.state import RunLock

TESTBED = [sys.executable, "-m", "testbed"]
SMALL_RUN = ["run", "scenarios/fattree-allreduce.yaml", "--size-bytes", "262144", "--iters", "1",
             "--warmup", "0"]
STARTUP_TIMEOUT_S = 60


def start_run(results: Path) -> subprocess.Popen:
    return subprocess.Popen([*TESTBED, *SMALL_RUN, "--results", str(results)], cwd=REPO,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)


def wait_for_line(proc: subprocess.Popen, needle: str) -> list[str]:
    deadline = time.monotonic() + STARTUP_TIMEOUT_S
    lines = []
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        lines.append(line)
        if needle in line:
            return lines
    raise AssertionError(f"never saw {needle!r}; output:\n{''.join(lines)}")


def test_run_writes_results_and_leaves_nothing(tmp_path):
    out = subprocess.run([*TESTBED, *SMALL_RUN, "--results", str(tmp_path)], cwd=REPO,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout + out.stderr
    (run_dir,) = tmp_path.iterdir()
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["workload"]["verified"] is True
    assert summary["reachability"] == {"probes": 128, "answered": 128, "ordered_pairs": 240}
    assert set(summary["workload"]["fidelity"]) >= {"trustworthy", "reasons"}
    assert (run_dir / "config.json").exists() and (run_dir / "controller.log").exists()
    assert len(list(run_dir.glob("*.png"))) >= 2
    assert "busbw" in out.stdout and "fidelity" in out.stdout
    assert_clean()


def test_ctrl_c_mid_run_leaves_nothing(tmp_path):
    proc = start_run(tmp_path)
    wait_for_line(proc, "ring AllReduce")
    os.killpg(proc.pid, signal.SIGINT)  # what a terminal's Ctrl-C does
    rest, _ = proc.communicate(timeout=60)
    assert proc.returncode == 130, rest
    assert_clean()


def test_sigkill_mid_run_is_recovered_by_clean(tmp_path):
    proc = start_run(tmp_path)
    wait_for_line(proc, "ring AllReduce")
    proc.kill()  # only the testbed process: its controller, hosts and ranks are orphaned
    proc.wait()
    left = leftovers()
    assert left["taps"] and left["processes"], "a killed run should have left something"
    out = subprocess.run([*TESTBED, "clean"], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert "removed what run" in out.stdout
    assert_clean()


def test_second_concurrent_run_is_refused(tmp_path):
    with RunLock("holder-for-test"):
        out = subprocess.run([*TESTBED, *SMALL_RUN, "--results", str(tmp_path)], cwd=REPO,
                             capture_output=True, text=True, timeout=60)
    assert out.returncode == 2
    assert out.stderr.count("\n") == 1 and "another testbed run is active" in out.stderr
    assert "holder-for-test" in out.stderr
    assert not any(tmp_path.iterdir())  # refused before creating anything
