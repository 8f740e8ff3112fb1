"""The run lock and the ledger, in a temporary state folder; process clean-up on children this
test starts itself."""
from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

import testbed.apply.state as state
import testbed.errors as errors
from testbed.apply.state import Ledger, RunLock, kill_processes, process_start_ticks
from testbed.errors import BusyError

REPO = Path(__file__).resolve().parents[3]
CHILD_READY_TIMEOUT_S = 20.0
CHILD_EXIT_TIMEOUT_S = 10.0
SHORT_GRACE_S = 0.5  # kill_processes' wait between SIGTERM and SIGKILL, shortened for tests


@pytest.fixture(autouse=True)
def state_dir(tmp_path, monkeypatch) -> Path:
    """Point the module at a temporary folder, never at the real /run/testbed."""
    folder = tmp_path / "state"
    monkeypatch.setenv("TESTBED_STATE_DIR", str(folder))
    monkeypatch.setattr(state, "STATE_DIR", folder)
    monkeypatch.setattr(state, "LOCK_PATH", folder / "lock")
    monkeypatch.setattr(state, "LEDGER_PATH", folder / "state.json")
    return folder


def start_ticks_from_proc(pid: int) -> int:
    """Field 22 (starttime) of /proc/PID/stat, counting fields after the parenthesised comm."""
    text = Path(f"/proc/{pid}/stat").read_text()
    after_comm = text[text.rindex(")") + 2:].split()
    return int(after_comm[22 - 3])


@pytest.fixture
def children():
    """Start child processes; whatever is still alive at the end is killed and reaped."""
    started: list[subprocess.Popen] = []

    def start(argv, **kwargs) -> subprocess.Popen:
        proc = subprocess.Popen(argv, **kwargs)
        started.append(proc)
        return proc

    yield start
    for proc in started:
        if proc.poll() is None:
            proc.kill()
        try:
            proc.wait(timeout=CHILD_EXIT_TIMEOUT_S)
        except ChildProcessError:
            pass


def is_running(proc: subprocess.Popen) -> bool:
    return proc.poll() is None and process_start_ticks(proc.pid) is not None


def wait_gone(pid: int, ticks: int, timeout_s: float = CHILD_EXIT_TIMEOUT_S) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process_start_ticks(pid) != ticks:
            return True
        time.sleep(0.02)
    return False


# --- paths -------------------------------------------------------------------------------------


def test_state_paths_follow_the_environment(state_dir):
    code = "import testbed.apply.state as s; print(s.STATE_DIR, s.LOCK_PATH, s.LEDGER_PATH)"
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True,
                         env={**os.environ, "TESTBED_STATE_DIR": str(state_dir)},
                         timeout=CHILD_EXIT_TIMEOUT_S, check=True).stdout
    assert out.split() == [str(state_dir), str(state_dir / "lock"), str(state_dir / "state.json")]


# --- ledger ------------------------------------------------------------------------------------


def test_ledger_round_trip(state_dir):
    ledger = Ledger("20260101-000000-x-abcd", 4242, processes={101: 5000, 202: 6000},
                    bridges=["p0e0", "c0"], interfaces=["p0e0-eth1"], ovs_started=True)
    ledger.save()
    assert (state_dir / "state.json").is_file()
    assert not (state_dir / "state.tmp").exists()
    loaded = Ledger.load()
    assert loaded == ledger
    assert all(isinstance(pid, int) for pid in loaded.processes)


def test_the_ledger_names_the_phase_a_run_is_in_and_when_it_began(state_dir):
    ledger = Ledger("r", os.getpid())
    ledger.save()
    assert Ledger.load().phase == "" and Ledger.load().phase_t_monotonic_s is None
    for phase in state.PHASES:
        before = time.monotonic()
        ledger.set_phase(phase)
        loaded = Ledger.load()  # saved at once: a watcher of the file sees it
        assert loaded.phase == phase
        assert before - 1e-6 <= loaded.phase_t_monotonic_s <= time.monotonic()
    assert state.PHASES == ("bring-up", "workload", "tear-down")


def test_a_ledger_written_before_phases_existed_still_loads(state_dir):
    (state_dir).mkdir(parents=True, exist_ok=True)
    (state_dir / "state.json").write_text('{"run_id": "old", "owner_pid": 1, "processes": {}, '
                                          '"bridges": [], "interfaces": [], "netns_inodes": [], '
                                          '"ovs_started": false, "settings": {}, "pinned": []}')
    assert Ledger.load().run_id == "old" and Ledger.load().phase == ""


def test_how_a_process_ended_and_what_state_it_is_in(children):
    assert state.exit_description(-9) == "killed by SIGKILL"
    assert state.exit_description(-15) == "killed by SIGTERM"
    assert state.exit_description(3) == "exited with status 3"
    assert state.exit_description(None) == "still running"
    child = children([sys.executable, "-c", "import time; time.sleep(30)"])
    deadline = time.monotonic() + CHILD_EXIT_TIMEOUT_S
    while not state.process_cmdline(child.pid) and time.monotonic() < deadline:
        time.sleep(0.02)  # empty for a moment while the child execs
    assert "time.sleep(30)" in state.process_cmdline(child.pid)
    os.kill(child.pid, signal.SIGSTOP)
    while state.process_state(child.pid) != "T" and time.monotonic() < deadline:
        time.sleep(0.02)
    assert state.process_state(child.pid) == "T"
    child.kill()
    child.wait()
    assert state.process_state(child.pid) is None and state.process_cmdline(child.pid) == ""


def test_ledger_load_without_a_file_or_with_garbage(state_dir):
    assert Ledger.load() is None
    state_dir.mkdir(parents=True)
    (state_dir / "state.json").write_text("{not json")
    assert Ledger.load() is None


def test_ledger_discard(state_dir):
    Ledger("r", 1).save()
    Ledger.discard()
    assert Ledger.load() is None
    Ledger.discard()  # nothing left: no error


def test_add_process_records_start_ticks_of_this_process(state_dir):
    ledger = Ledger("r", os.getpid())
    ledger.add_process(os.getpid())
    assert ledger.processes == {os.getpid(): start_ticks_from_proc(os.getpid())}
    assert Ledger.load().processes == ledger.processes  # saved at once


def test_add_process_ignores_a_pid_that_does_not_exist(state_dir):
    pid_max = int(Path("/proc/sys/kernel/pid_max").read_text())
    ledger = Ledger("r", os.getpid())
    ledger.add_process(pid_max + 1)
    assert ledger.processes == {}
    assert Ledger.load() is None


def test_add_names_deduplicates_and_saves(state_dir):
    ledger = Ledger("r", 1)
    ledger.add_names(bridges=["s1", "s2"], interfaces=["s1-eth1"])
    ledger.add_names(bridges=["s2", "s3"], interfaces=["s1-eth1", "s2-eth1"])
    assert ledger.bridges == ["s1", "s2", "s3"]
    assert ledger.interfaces == ["s1-eth1", "s2-eth1"]
    assert Ledger.load() == ledger


def test_process_start_ticks(children):
    assert process_start_ticks(os.getpid()) == start_ticks_from_proc(os.getpid())
    child = children(["sleep", "30"])
    ticks = process_start_ticks(child.pid)
    assert ticks == start_ticks_from_proc(child.pid)
    assert ticks >= process_start_ticks(os.getpid())


# --- lock --------------------------------------------------------------------------------------


def test_second_lock_is_busy_and_names_the_holder(state_dir):
    with RunLock("first"):
        assert (state_dir / "lock").read_text() == f"pid {os.getpid()}, run first"
        with pytest.raises(BusyError) as info:
            with RunLock("second"):
                pytest.fail("two runs held the lock at once")
        assert f"pid {os.getpid()}, run first" in str(info.value)
        assert isinstance(info.value, errors.TestbedError)
    assert (state_dir / "lock").read_text() == ""
    with RunLock("third"):
        assert (state_dir / "lock").read_text() == f"pid {os.getpid()}, run third"


def test_lock_is_released_when_the_block_raises(state_dir):
    with pytest.raises(RuntimeError):
        with RunLock("first"):
            raise RuntimeError("boom")
    with RunLock("again"):
        pass


def test_lock_of_a_killed_holder_is_free(state_dir, children):
    holder_code = textwrap.dedent("""
        import sys
        from testbed.apply.state import RunLock
        with RunLock("child-run"):
            print("held", flush=True)
            sys.stdin.read()
    """)
    child = children([sys.executable, "-c", holder_code], cwd=REPO, stdin=subprocess.PIPE,
                     stdout=subprocess.PIPE, text=True,
                     env={**os.environ, "TESTBED_STATE_DIR": str(state_dir)})
    ready, _, _ = select.select([child.stdout], [], [], CHILD_READY_TIMEOUT_S)
    assert ready, "the child never took the lock"
    assert child.stdout.readline().strip() == "held"
    with pytest.raises(BusyError) as info:
        with RunLock("parent"):
            pytest.fail("the lock was not exclusive across processes")
    assert f"pid {child.pid}, run child-run" in str(info.value)
    child.kill()  # SIGKILL: no clean-up code runs in the holder
    child.wait(timeout=CHILD_EXIT_TIMEOUT_S)
    with RunLock("after"):
        pass


# --- killing recorded processes ----------------------------------------------------------------


@pytest.mark.parametrize("own_group", [False, True], ids=["plain", "group-leader"])
def test_kill_processes_kills_a_recorded_child(children, own_group):
    child = children(["sleep", "30"], start_new_session=own_group)
    ticks = process_start_ticks(child.pid)
    assert ticks is not None
    log = []
    kill_processes({child.pid: ticks}, log.append)
    assert wait_gone(child.pid, ticks)
    assert log == []


def test_kill_processes_spares_a_pid_whose_start_ticks_differ(children):
    child = children(["sleep", "30"])
    ticks = process_start_ticks(child.pid)
    kill_processes({child.pid: ticks + 1}, pytest.fail)
    time.sleep(0.1)
    assert is_running(child)
    assert process_start_ticks(child.pid) == ticks


def test_kill_processes_skips_pids_that_are_gone():
    pid_max = int(Path("/proc/sys/kernel/pid_max").read_text())
    kill_processes({pid_max + 1: 12345}, pytest.fail)


def test_kill_processes_escalates_to_sigkill(children, monkeypatch):
    monkeypatch.setattr(state, "KILL_GRACE_S", SHORT_GRACE_S)
    code = ("import signal, sys, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
            "print('ready', flush=True); time.sleep(30)")
    child = children([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    ready, _, _ = select.select([child.stdout], [], [], CHILD_READY_TIMEOUT_S)
    assert ready and child.stdout.readline().strip() == "ready"
    ticks = process_start_ticks(child.pid)
    t0 = time.monotonic()
    kill_processes({child.pid: ticks}, pytest.fail)
    assert wait_gone(child.pid, ticks)
    assert time.monotonic() - t0 >= SHORT_GRACE_S  # SIGTERM was ignored, SIGKILL ended it
    assert child.wait(timeout=CHILD_EXIT_TIMEOUT_S) in (-signal.SIGKILL, 0)
