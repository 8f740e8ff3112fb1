"""A fabric kept up between commands (testbed.interactive.session): the state file its holder
publishes, how a holder is recognised (PID and start time), signalled and waited for, the
pipe it reports readiness on, and the holder's life around a stand-in fabric, from bring-up
to the SIGTERM that ends it. The processes signalled here are ones these tests start."""
from __future__ import annotations

import datetime
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

import testbed.api
import testbed.interactive.attach as attach
import testbed.interactive.session as session
from testbed import errors
from testbed.apply.state import process_start_ticks
from testbed.interactive.attach import SessionState
from testbed.interactive.session import HolderSpec, LogFollower
from testbed.model.topology.fattree import fat_tree

WAIT_S = 10.0  # for a child process of these tests to start or end


def state_for(pid: int, ticks: int | None, workdir: Path, **changes) -> SessionState:
    fabric = fat_tree(4, host_rate_mbit=6.0)
    fabric.dump_json(workdir / "fabric.json")
    fields = dict(
        run_id="20261130-120000-fattree-allreduce-ab12", scenario="fattree-allreduce",
        source="fattree-allreduce", setup="fabric", workdir=str(workdir), holder_pid=pid,
        holder_start_ticks=ticks, hosts={h.name: pid for h in fabric.hosts},
        host_start_ticks={h.name: ticks for h in fabric.hosts},
        ips={h.name: h.ip for h in fabric.hosts}, switches=[s.name for s in fabric.switches],
        datapath="user", ovs_rundir="/run/testbed/ovs", controller_port=6653,
        started_at="2026-11-30T12:00:00+00:00")
    return SessionState(**{**fields, **changes})


@pytest.fixture
def session_file(tmp_path, monkeypatch) -> Path:
    path = tmp_path / "state" / "session.json"
    monkeypatch.setattr(attach, "SESSION_PATH", path)
    return path


@pytest.fixture
def child():
    """A process of this test's own, to recognise, signal and wait for."""
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    deadline = time.monotonic() + WAIT_S
    while process_start_ticks(proc.pid) is None and time.monotonic() < deadline:
        time.sleep(0.01)
    yield proc
    if proc.poll() is None:
        proc.kill()
    proc.wait()


# --- the state file ------------------------------------------------------------------------------


def test_the_state_round_trips_through_its_file(tmp_path, session_file):
    state = state_for(os.getpid(), process_start_ticks(os.getpid()), tmp_path)
    state.save()
    assert json.loads(session_file.read_text())["hosts"]["p0e0h0"] == os.getpid()
    assert SessionState.load() == state
    SessionState.discard()
    assert SessionState.load() is None and not session_file.exists()


@pytest.mark.parametrize("text", ["", "{not json", '{"run_id": "x"}', "[]"])
def test_a_torn_or_foreign_state_file_is_no_state(session_file, text):
    session_file.parent.mkdir(parents=True)
    session_file.write_text(text)
    assert SessionState.load() is None


def test_the_holder_is_recognised_by_pid_and_start_time(tmp_path, child):
    ticks = process_start_ticks(child.pid)
    assert state_for(child.pid, ticks, tmp_path).holder_alive()
    assert not state_for(child.pid, ticks + 1, tmp_path).holder_alive()  # a reused PID
    assert state_for(child.pid, ticks, tmp_path).live_hosts()[:1] == ["p0e0h0"]
    child.kill()
    child.wait()
    assert not state_for(child.pid, ticks, tmp_path).holder_alive()
    assert state_for(child.pid, ticks, tmp_path).live_hosts() == []


def test_the_state_leads_back_to_the_fabric_and_its_private_ovs(tmp_path):
    state = state_for(os.getpid(), 1, tmp_path)
    attached = state.attach()
    assert attached.fabric.to_dict() == fat_tree(4, host_rate_mbit=6.0).to_dict()
    assert attached.switchd.bridge_target("p0e0") == "unix:/run/testbed/ovs/p0e0.mgmt"
    assert attached.host_pids["p3e1h1"] == os.getpid()
    kernel = state_for(os.getpid(), 1, tmp_path, datapath="kernel", ovs_rundir=None).attach()
    assert kernel.switchd.bridge_target("p0e0") == "p0e0"  # the machine's OVS, by name


def test_running_session_names_what_is_wrong(tmp_path, session_file, child):
    with pytest.raises(errors.TestbedError, match="no fabric is up"):
        session.running_session()
    state_for(child.pid, process_start_ticks(child.pid) + 1, tmp_path).save()
    with pytest.raises(errors.TestbedError, match="lost its holder.*testbed clean"):
        session.running_session()
    alive = state_for(child.pid, process_start_ticks(child.pid), tmp_path)
    alive.save()
    assert session.running_session() == alive


def test_status_lines_say_what_is_up_since_when(tmp_path):
    state = state_for(42, 1, tmp_path, started_at="2026-11-30T12:00:00+00:00")
    fabric = fat_tree(4, host_rate_mbit=6.0)
    now = datetime.datetime(2026, 11, 30, 13, 2, 5, tzinfo=datetime.timezone.utc)
    lines = session.describe(state, fabric, 15, now)
    assert lines[0] == ("fabric up: run 20261130-120000-fattree-allreduce-ab12 (scenario "
                        "fattree-allreduce, setup fabric), up 1h02m05s since "
                        "2026-11-30T12:00:00+00:00")
    assert lines[1] == "  fattree k=4: 16 hosts (15 shells alive), 20 switches, 48 links"
    assert "/run/testbed/ovs" in lines[2] and "127.0.0.1:6653" in lines[2]
    assert "p0e0h0=10.0.0.2" in lines[4]


def test_usage_names_a_real_host_pair_switch_and_uplink(tmp_path):
    state = state_for(42, 1, tmp_path)
    text = "\n".join(session.usage_lines(state, state.fabric()))
    assert "testbed exec p0e0h0 -- ping -c1 10.3.1.3" in text
    assert "p0e0h0 ping p3e1h1" in text and "dump-groups p0e0" in text
    assert "link down p0e0 p0a0" in text  # p0e0h0's switch and its first uplink
    assert f"{tmp_path}/holder.log" in text


# --- the holder: signalled, waited for, reporting on its pipe ---------------------------------


def test_the_holder_is_signalled_by_pid_checked_and_waited_for(tmp_path, child):
    state = state_for(child.pid, process_start_ticks(child.pid), tmp_path)
    session.signal_holder(state)
    assert session.wait_gone(state, timeout_s=WAIT_S)
    assert child.wait(WAIT_S) == -signal.SIGTERM
    with pytest.raises(errors.TestbedError, match="is gone"):
        session.signal_holder(state)


def test_waiting_for_a_holder_that_stays_gives_up(tmp_path, child):
    state = state_for(child.pid, process_start_ticks(child.pid), tmp_path)
    t0 = time.monotonic()
    assert not session.wait_gone(state, timeout_s=0.3)
    assert 0.3 <= time.monotonic() - t0 < WAIT_S


def test_the_spec_travels_as_one_argument():
    spec = HolderSpec("scenarios/x.yaml", {"link_rate_mbit": 12.0}, None, "r1", "/tmp/r1", 9)
    argv = spec.argv()
    assert argv[:3] == [sys.executable, "-m", "testbed.interactive.session"] and len(argv) == 4
    assert HolderSpec.from_argv(argv[3:]) == spec


def test_the_report_is_read_from_the_pipe():
    read_fd, write_fd = os.pipe()
    os.write(write_fd, b'{"ready": true}\n')
    os.close(write_fd)
    assert session.read_report(read_fd, WAIT_S) == {"ready": True}


def test_a_pipe_closed_without_a_report_means_the_holder_died():
    read_fd, write_fd = os.pipe()
    os.close(write_fd)
    assert session.read_report(read_fd, WAIT_S) is None


def test_no_report_in_time_is_an_error_and_waiting_shows_progress():
    read_fd, write_fd = os.pipe()
    calls = []
    try:
        with pytest.raises(errors.TestbedError, match="not up after 0 s"):
            session.read_report(read_fd, 0.3, lambda: calls.append(1))
    finally:
        os.close(write_fd)
    assert len(calls) >= 2  # called while waiting, about every POLL_S


def test_the_holder_runs_the_same_testbed_package_as_its_parent(monkeypatch):
    monkeypatch.setenv("PYTHONPATH", "/elsewhere")
    root = str(Path(testbed.api.__file__).resolve().parents[1])
    assert session.holder_environment()["PYTHONPATH"] == f"{root}{os.pathsep}/elsewhere"


def test_a_holder_given_a_missing_scenario_reports_it_and_makes_nothing(tmp_path, monkeypatch):
    """The real entry point, in a process of its own: it fails reading the scenario, before
    the machine's lock is taken or anything is made."""
    monkeypatch.setenv("TESTBED_STATE_DIR", str(tmp_path / "state"))
    monkeypatch.chdir(tmp_path)  # the package is found from anywhere
    log = tmp_path / "holder.log"
    proc, read_fd = session.start_holder(
        {"source": str(tmp_path / "missing.yaml"), "overrides": {}, "setup": None,
         "run_id": "r1", "workdir": str(tmp_path / "r1")}, log)
    report = session.read_report(read_fd, 60)
    assert proc.wait(WAIT_S) == 3
    assert "missing.yaml: no such scenario file" in report["error"]
    assert "failed: " in log.read_text()
    assert not (tmp_path / "r1").exists() and not (tmp_path / "state").exists()


def test_the_log_is_followed_line_by_line(tmp_path):
    log = tmp_path / "holder.log"
    shown: list[str] = []
    follow = LogFollower(log, shown.append)
    follow()  # no file yet
    log.write_text("one\ntw")
    follow()
    with open(log, "a") as fh:
        fh.write("o\nthree\n")
    follow()
    assert shown == ["one", "two", "three"]


# --- the holder's life, around a stand-in fabric --------------------------------------------------


class StandInLiveFabric:
    """testbed.interactive.live.LiveFabric as the holder uses it: up on entering, down on
    leaving."""

    fail: str | None = None
    made: list[StandInLiveFabric] = []

    def __init__(self, resolved, setup=None, log=None, run_id=None, workdir=None):
        self.resolved, self.setup_name, self.run_id, self.workdir = resolved, setup, run_id, workdir
        self.closed = False
        StandInLiveFabric.made.append(self)

    def __enter__(self):
        if self.fail:
            raise errors.TestbedError(self.fail)
        return self

    def __exit__(self, *exc):
        self.closed = True

    def session_state(self, source):
        return state_for(os.getpid(), process_start_ticks(os.getpid()), self.workdir,
                         source=source, run_id=self.run_id)


@pytest.fixture
def holder(tmp_path, session_file, monkeypatch):
    """hold() around StandInLiveFabric; returns a function running it and the holder's log."""
    StandInLiveFabric.made, StandInLiveFabric.fail = [], None
    monkeypatch.setattr(session, "LiveFabric", StandInLiveFabric)
    monkeypatch.setattr(session, "load", lambda source, overrides: "resolved")

    def run(on_report) -> tuple[int, list[str], dict | None]:
        read_fd, write_fd = os.pipe()
        spec = HolderSpec("fattree-allreduce", {}, None, "r1", str(tmp_path), write_fd)
        reports: list[dict | None] = []

        def watch():
            reports.append(session.read_report(read_fd, WAIT_S))
            on_report(reports[0])

        watcher = threading.Thread(target=watch)
        watcher.start()
        lines: list[str] = []
        status = session.hold(spec, lines.append)
        watcher.join(WAIT_S)
        return status, lines, reports[0]

    return run


def test_the_holder_publishes_reports_ready_and_goes_down_at_sigterm(holder, session_file):
    seen = {}

    def on_report(report):
        seen["state"] = SessionState.load()  # published before "ready"
        os.kill(os.getpid(), signal.SIGTERM)  # what `testbed down` sends

    status, lines, report = holder(on_report)
    assert report == {"ready": True} and status == 0
    assert seen["state"].holder_pid == os.getpid() and seen["state"].run_id == "r1"
    (fab,) = StandInLiveFabric.made
    assert fab.closed and fab.run_id == "r1"
    assert not session_file.exists()  # the record goes with the fabric
    assert lines[-2:] == ["signal 15: taking the fabric down", "the fabric is down"]
    assert signal.getsignal(signal.SIGTERM) == signal.SIG_DFL  # restored


def test_a_failed_bring_up_is_reported_on_the_pipe(holder, session_file):
    StandInLiveFabric.fail = "OVS holds 3 select groups, the controller should have installed 4"
    status, lines, report = holder(lambda report: None)
    assert status == 3
    assert report == {"error": StandInLiveFabric.fail}
    assert not session_file.exists()

