"""``testbed up``, ``status``, ``exec``, ``cli`` and ``down`` on the command line, with the
holder, the machine's lock and root replaced: what they refuse before anything is made, what
they hand the holder, what they print, and their exit statuses. The state file lives in a
temporary folder; the only process signalled is one the test starts."""
from __future__ import annotations

import io
import json
import os
import signal
import sys
from contextlib import nullcontext

import pytest
from tests.unit.interactive.test_session import WAIT_S, child, state_for  # noqa: F401 (a fixture)
from tests.unit.interactive.test_shell import StandInAttached

import testbed.apply.network
import testbed.apply.state
import testbed.cli
import testbed.interactive.attach as attach
import testbed.interactive.session as session
from testbed.apply.state import process_start_ticks
from testbed.cli import EXIT_OK, EXIT_RUN_FAILED, EXIT_USAGE, EXIT_VERDICT, main


@pytest.fixture
def machine(tmp_path, monkeypatch):
    """Root (and Mininet) granted, the run lock always free, the state file in tmp_path; the
    holder is never started: ``started`` records what it would have been handed."""
    monkeypatch.setattr(testbed.cli, "check_root", lambda: None)
    monkeypatch.setattr(testbed.cli, "check_can_build", lambda: None)
    monkeypatch.setattr(testbed.cli, "RunLock", lambda run_id: nullcontext())
    monkeypatch.setattr(attach, "SESSION_PATH", tmp_path / "state" / "session.json")
    monkeypatch.setattr(testbed.apply.state, "LEDGER_PATH", tmp_path / "state" / "state.json")
    started: list[dict] = []

    def no_holder(spec, log_path):
        started.append(spec)
        raise AssertionError("the holder must not start in this test")

    monkeypatch.setattr(session, "start_holder", no_holder)
    return started


class Holder:
    """What cmd_up keeps of a started holder."""

    def __init__(self):
        self.terminated = self.waited = False
        self.returncode = 3

    def terminate(self):
        self.terminated = True

    def wait(self, timeout=None):
        self.waited = True
        return self.returncode


def holder_reporting(monkeypatch, tmp_path, report: dict, started: list):
    """start_holder replaced by one whose pipe carries ``report``; ready means the state
    file names this process as the holder."""
    holder = Holder()

    def start(spec, log_path):
        started.append(spec)
        log_path.write_text("[12:00:00] holder pid 1: bringing up\n")
        if report.get("ready"):
            state_for(os.getpid(), process_start_ticks(os.getpid()), tmp_path,
                      run_id=spec["run_id"]).save()
        read_fd, write_fd = os.pipe()
        os.write(write_fd, (json.dumps(report) + "\n").encode())
        os.close(write_fd)
        return holder, read_fd

    monkeypatch.setattr(session, "start_holder", start)
    return holder


# --- testbed up --------------------------------------------------------------------------------


def test_up_refuses_bad_input_before_anything_is_made(machine, tmp_path, capsys):
    assert main(["up", "no-such-scenario", "--results", str(tmp_path / "r")]) == EXIT_USAGE
    assert main(["up", "--topology", "fattree", "--param", "k=3",
                 "--results", str(tmp_path / "r")]) == EXIT_USAGE
    assert "topology.k" in capsys.readouterr().err
    assert machine == [] and not (tmp_path / "r").exists()


def test_up_hands_the_holder_the_scenario_and_prints_how_to_use_it(machine, tmp_path,
                                                                   monkeypatch, capsys):
    holder = holder_reporting(monkeypatch, tmp_path, {"ready": True}, machine)
    results = tmp_path / "r"
    assert main(["up", "fattree-allreduce", "--rate-mbit", "12", "--results",
                 str(results)]) == EXIT_OK
    (spec,) = machine
    assert spec["source"] == "fattree-allreduce" and spec["setup"] == "fabric"
    assert spec["overrides"] == {"link_rate_mbit": 12.0, "results_dir": str(results)}
    assert spec["workdir"] == str((results / spec["run_id"]).resolve())
    out = capsys.readouterr().out
    assert "bringing up fattree-allreduce: fattree k=4, 16 hosts, 20 switches" in out
    assert "[12:00:00] holder pid 1: bringing up" in out  # the holder's log, followed
    assert "testbed exec p0e0h0 -- ping -c1 10.3.1.3" in out and "testbed down" in out
    assert not holder.terminated


def test_up_reports_a_failed_bring_up_after_the_holder_took_it_down(machine, tmp_path,
                                                                    monkeypatch, capsys):
    holder = holder_reporting(monkeypatch, tmp_path, {"error": "controller died (1)"}, machine)
    assert main(["up", "--results", str(tmp_path / "r")]) == EXIT_RUN_FAILED
    err = capsys.readouterr().err
    assert err.startswith("testbed: error: the fabric did not come up: controller died (1)")
    assert err.count("\n") == 1 and holder.waited and not holder.terminated


# --- testbed status ------------------------------------------------------------------------------


def test_status_without_a_fabric(machine, capsys):
    assert main(["status"]) == EXIT_VERDICT
    assert capsys.readouterr().out == "no fabric is up: start one with `testbed up SCENARIO`\n"


def test_status_of_a_fabric_whose_holder_died(machine, tmp_path, capsys):
    state_for(os.getpid(), process_start_ticks(os.getpid()) + 1, tmp_path).save()
    assert main(["status"]) == EXIT_VERDICT
    assert "lost its holder (pid" in capsys.readouterr().out


def test_status_of_a_fabric_that_is_up(machine, tmp_path, capsys):
    state = state_for(os.getpid(), process_start_ticks(os.getpid()), tmp_path)
    state.save()
    assert main(["status"]) == EXIT_OK
    out = capsys.readouterr().out
    assert out.startswith(f"fabric up: run {state.run_id}")
    assert "16 hosts (16 shells alive)" in out
    assert main(["status", "--json"]) == EXIT_OK
    shown = json.loads(capsys.readouterr().out)
    assert shown["holder_pid"] == os.getpid() and len(shown["live_hosts"]) == 16


# --- testbed exec --------------------------------------------------------------------------------


@pytest.fixture
def execs(machine, tmp_path, monkeypatch):
    """The state of a fabric that is up (its hosts' shells are this process); the argv
    ``exec`` would become, instead of becoming it."""
    state_for(os.getpid(), process_start_ticks(os.getpid()), tmp_path).save()
    became: list[list[str]] = []
    monkeypatch.setattr(os, "execvp", lambda file, argv: became.append([file, *argv[1:]]))
    return became


@pytest.mark.parametrize("argv", [
    ["exec", "p0e0h0", "--", "ping", "-c1", "10.3.1.3"],
    ["exec", "p0e0h0", "ping", "-c1", "10.3.1.3"],
])
def test_exec_becomes_the_command_in_the_hosts_namespaces(execs, argv):
    main(argv)
    assert execs == [["mnexec", "-a", str(os.getpid()), "ping", "-c1", "10.3.1.3"]]


def test_exec_keeps_the_commands_own_arguments_and_double_dashes(execs):
    main(["exec", "p0e0h0", "--", "sh", "-c", "exit 7", "--", "x"])
    assert execs == [["mnexec", "-a", str(os.getpid()), "sh", "-c", "exit 7", "--", "x"]]


@pytest.mark.parametrize("argv, status, message", [
    (["exec", "p0e0h0"], EXIT_USAGE, "what should p0e0h0 run?"),
    (["exec", "p0e0h0", "--"], EXIT_USAGE, "what should p0e0h0 run?"),
    (["exec", "p9e9h9", "--", "true"], EXIT_USAGE, "p9e9h9: no such host; hosts: p0e0h0"),
])
def test_exec_refuses_what_it_cannot_run(execs, capsys, argv, status, message):
    assert main(argv) == status
    assert message in capsys.readouterr().err and execs == []


def test_exec_on_a_host_whose_shell_is_gone(machine, tmp_path, capsys, execs):
    state = session.SessionState.load()
    state.host_start_ticks["p0e0h0"] += 1  # the PID now belongs to another process
    state.save()
    assert main(["exec", "p0e0h0", "--", "true"]) == EXIT_RUN_FAILED
    assert "p0e0h0's shell" in capsys.readouterr().err and execs == []


def test_exec_without_a_fabric(machine, capsys):
    assert main(["exec", "p0e0h0", "--", "true"]) == EXIT_RUN_FAILED
    assert "no fabric is up" in capsys.readouterr().err


# --- testbed cli ---------------------------------------------------------------------------------


def test_cli_reads_commands_from_a_pipe_and_fails_when_one_did(machine, tmp_path, monkeypatch,
                                                               capsys):
    state_for(os.getpid(), process_start_ticks(os.getpid()), tmp_path).save()
    monkeypatch.setattr(session.SessionState, "attach", lambda self: StandInAttached())
    monkeypatch.setattr(sys, "stdin", io.StringIO("nodes\nlinks\n"))
    assert main(["cli"]) == EXIT_OK
    out = capsys.readouterr().out
    assert "testbed> nodes\nhosts: h1 h2 h3" in out and "s1-eth2<->s2-eth1 (up)" in out
    monkeypatch.setattr(sys, "stdin", io.StringIO("h1 false\nnodes\n"))
    assert main(["cli"]) == EXIT_VERDICT


# --- testbed down --------------------------------------------------------------------------------


def test_down_without_a_fabric(machine, capsys):
    assert main(["down"]) == EXIT_OK
    assert capsys.readouterr().out == "no fabric is up\n"


def test_down_signals_the_holder_and_waits_for_it(machine, tmp_path, child, capsys):
    state_for(child.pid, process_start_ticks(child.pid), tmp_path).save()
    assert main(["down"]) == EXIT_OK
    assert child.wait(WAIT_S) == -signal.SIGTERM
    assert "fabric down in" in capsys.readouterr().out


def test_down_says_when_the_holder_left_part_of_the_fabric(machine, tmp_path, child, capsys):
    state_for(child.pid, process_start_ticks(child.pid), tmp_path).save()
    # a ledger never swept: the holder was killed half-way through its clean-up
    testbed.apply.state.LEDGER_PATH.write_text(json.dumps({"run_id": "r1",
                                                           "owner_pid": child.pid}))
    assert main(["down"]) == EXIT_RUN_FAILED
    assert "leaving part of the fabric: run `testbed clean`" in capsys.readouterr().err


def test_down_after_the_holder_died_cleans_what_it_left(machine, tmp_path, monkeypatch,
                                                        capsys):
    cleaned = []
    monkeypatch.setattr(testbed.cli, "clean_machine", lambda: cleaned.append(True))
    state_for(os.getpid(), process_start_ticks(os.getpid()) + 1, tmp_path).save()
    assert main(["down"]) == EXIT_OK
    assert cleaned == [True] and "is gone: removing what it left" in capsys.readouterr().out
