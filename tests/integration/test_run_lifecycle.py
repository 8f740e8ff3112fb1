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

from tests.integration.conftest import REPO, assert_clean, leftovers

from testbed.apply.state import RunLock
from testbed.harness.summary_schema import SCHEMA_VERSION, read_summary

TESTBED = [sys.executable, "-m", "testbed"]
# A short ring: 256 KiB in one iteration is too short to reach 90% of the link (its first
# and last steps dominate), so the busbw expectation is lowered; the lifecycle is under test.
SMALL_RUN = ["run", "scenarios/fattree-allreduce.yaml", "--size-bytes", "262144", "--iters", "1",
             "--warmup", "0", "--set", "params.expect_busbw_fraction=0.5"]
# What the interrupt tests start: the same ring for 40 iterations (about 30 s), so that a
# signal sent when the ring starts lands mid-run even when this test process, starved by the
# ranks, reads the run's output seconds late (teardown ignores Ctrl-C by design).
INTERRUPTED_RUN = [*SMALL_RUN[:SMALL_RUN.index("--iters") + 1], "40",
                   *SMALL_RUN[SMALL_RUN.index("--iters") + 2:]]
STARTUP_TIMEOUT_S = 60
NOBODY = 65534  # a uid and gid that are not root's


def interruptible() -> None:
    """Ctrl-C's default action in the run, as in a terminal: a run started from a background
    job inherits SIGINT ignored (the shell's rule without job control), and Python keeps it so."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def start_run(results: Path) -> subprocess.Popen:
    return subprocess.Popen([*TESTBED, *INTERRUPTED_RUN, "--results", str(results)], cwd=REPO,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True, preexec_fn=interruptible)


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
    assert summary["schema_version"] == SCHEMA_VERSION and summary["status"] == "complete"
    assert summary == read_summary(run_dir)  # as its schema describes it
    prov = summary["provenance"]
    assert prov["kernel"] and prov["ovs_version"] and prov["mininet_version"]
    assert prov["command_line"][:2] == ["__main__.py", "run"]  # python -m testbed run ...
    result = summary["results"]["fabric"]
    assert result["verified"] is True
    ready = result["bring_up"]
    assert (ready["probes"], ready["answered"], ready["ordered_pairs"]) == (128, 128, 240)
    assert summary["verdict"]["emulator_trusted"], summary["verdict"]["reasons"]
    outcomes = {c["name"]: c["outcome"] for c in summary["verdict"]["checks"]}
    # 256 KiB on 16 ranks runs one channel: one flow per ring neighbour, no ECMP spread to judge
    assert outcomes.pop("ECMP spread flows over group uplinks") == "n/a"
    assert set(outcomes.values()) == {"PASS"}
    for name in ("config.json", "controller.log", "report.md", "report.html"):
        assert (run_dir / name).exists(), name
    assert len(list((run_dir / "plots").glob("*.png"))) >= 2
    assert (run_dir / "plots" / "topology.png").exists()
    assert all(plot["caption"] for plot in summary["plots"])
    assert "busbw" in out.stdout and "emulator TRUSTED" in out.stdout
    assert_clean()


def test_a_sudo_run_belongs_to_the_user_who_ran_sudo(tmp_path):
    results = tmp_path / "results"  # made by the run, as root
    env = {**os.environ, "SUDO_UID": str(NOBODY), "SUDO_GID": str(NOBODY)}
    out = subprocess.run([*TESTBED, *SMALL_RUN, "--results", str(results), "--quiet",
                          "--accept-untrusted", "--accept-failed"], cwd=REPO, capture_output=True, text=True,
                         timeout=300, env=env)
    assert out.returncode == 0, out.stdout + out.stderr
    (run_dir,) = results.iterdir()
    owners = {(p.stat().st_uid, p.stat().st_gid) for p in [results, run_dir,
                                                            *run_dir.rglob("*")]}
    assert owners == {(NOBODY, NOBODY)}
    assert_clean()


def test_ctrl_c_mid_run_leaves_nothing(tmp_path):
    proc = start_run(tmp_path)
    wait_for_line(proc, "ring AllReduce: ")
    os.killpg(proc.pid, signal.SIGINT)  # what a terminal's Ctrl-C does
    rest, _ = proc.communicate(timeout=60)
    assert proc.returncode == 130, rest
    assert_clean()


def test_sigkill_mid_run_is_recovered_by_clean(tmp_path):
    proc = start_run(tmp_path)
    wait_for_line(proc, "ring AllReduce: ")
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
    assert out.returncode == 3  # the run failed: the machine was busy
    assert out.stderr.count("\n") == 1 and "another testbed run is active" in out.stderr
    assert "holder-for-test" in out.stderr
    assert not any(tmp_path.iterdir())  # refused before creating anything
