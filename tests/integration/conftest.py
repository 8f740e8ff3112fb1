"""Integration tests build real namespaces, OVS switches and an os-ken controller. They need
root and run one at a time; without root they fail (they are never silently skipped)."""
from __future__ import annotations

import os
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path

import pytest

from testbed.chaos.leftovers import OURS  # the testbed's command lines, one pattern
from testbed.harness.run import machine
from testbed.interactive.session import SessionState

REPO = Path(__file__).resolve().parents[2]
TESTBED = [sys.executable, "-m", "testbed"]
UP_TIMEOUT_S = 300
EXIT_GRACE_S = 5.0
COMMAND_TIMEOUT_S = 120


HERE = Path(__file__).resolve().parent


def pytest_collection_modifyitems(items):
    """Mark this folder's tests only: a session may collect the unit tests too."""
    for item in items:
        if Path(item.fspath).resolve().is_relative_to(HERE):
            item.add_marker(pytest.mark.root)


@pytest.fixture(scope="session", autouse=True)
def require_root():
    if os.geteuid() != 0:
        pytest.fail("integration tests need root (run `sudo make test`)", pytrace=False)


def run_testbed(*args: str, stdin: str | None = None, timeout: float = COMMAND_TIMEOUT_S):
    """``testbed ARGS`` from the checkout, its output captured."""
    return subprocess.run([*TESTBED, *args], cwd=REPO, input=stdin, capture_output=True,
                          text=True, timeout=timeout)


@contextmanager
def kept_up(scenario: str, results: Path):
    """``testbed up`` of ``scenario``: (its output, the published state) for the block; down
    (or cleaned) at the end, whatever the block did."""
    out = run_testbed("up", scenario, "--results", str(results), timeout=UP_TIMEOUT_S)
    assert out.returncode == 0, out.stdout + out.stderr
    try:
        yield out.stdout, SessionState.load()
    finally:
        if run_testbed("down").returncode != 0:
            run_testbed("clean")


@pytest.fixture(scope="module")
def ledger():
    """The run lock and ledger for one test module; everything is swept when it ends."""
    with machine("integration-test", log=lambda m: None) as ledger:
        yield ledger




def running_processes():
    """(pid, command line) of every live process; zombies (already dead, waiting to be
    reaped by PID 1) are not running and are left out."""
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as fh:
                state = fh.read().rsplit(")", 1)[1].split()[0]
            with open(f"/proc/{entry}/cmdline", "rb") as fh:
                cmdline = fh.read().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if state != "Z" and int(entry) != os.getpid():
            yield int(entry), cmdline


def interfaces_of_type(kind: str) -> list[str]:
    out = subprocess.run(["ip", "-o", "link", "show", "type", kind], capture_output=True,
                         text=True).stdout.strip()
    return out.splitlines() if out else []


def leftovers() -> dict:
    """What a testbed run could leave behind on this machine: veths, tap devices (bridges of
    a userspace datapath), bridges in the machine's OVS, processes, named namespaces."""
    bridges = subprocess.run(["ovs-vsctl", "--timeout=3", "list-br"], capture_output=True,
                             text=True).stdout.split()
    procs = [f"{pid} {cmdline[:120]}" for pid, cmdline in running_processes()
             if OURS.search(cmdline)]
    return {"veths": interfaces_of_type("veth"), "taps": interfaces_of_type("tun"),
            "bridges": bridges, "processes": procs,
            "netns": subprocess.run(["ip", "netns", "list"], capture_output=True,
                                    text=True).stdout.split()}


def assert_clean():
    """Nothing of ours left, once the processes a run just ended have had
    ``EXIT_GRACE_S`` to finish exiting (a host's last process is signalled as its
    namespace goes)."""
    clean = {"veths": [], "taps": [], "bridges": [], "processes": [], "netns": []}
    deadline = time.monotonic() + EXIT_GRACE_S
    left = leftovers()
    while left != clean and not any(left[k] for k in clean if k != "processes") \
            and time.monotonic() < deadline:
        time.sleep(0.2)
        left = leftovers()
    assert left == clean, left

