"""The lifecycle every agent beside a fabric shares (testbed.apply.agent_process): started on
its ready file and recorded in the ledger, stopped by PID, failing with its log's tail,
shown with a stand-in agent process; and the poll statistics agents report."""
from __future__ import annotations

import json
import os
import time

import pytest

import testbed.apply.state as state
import testbed.errors as errors
from testbed.apply.agent_process import AgentProcess, Histogram, quantiles
from testbed.apply.state import Ledger

AGENT_WAIT_S = 10.0  # for a stand-in agent process to start or stop


def test_quantiles():
    assert quantiles([]) == {"count": 0}
    values = [float(v) for v in range(1, 101)]
    assert quantiles(values) == {"count": 100, "p50": 51.0, "p99": 100.0, "max": 100.0}
    assert quantiles([2.5]) == {"count": 1, "p50": 2.5, "p99": 2.5, "max": 2.5}


def test_a_histogram_gives_the_quantiles_of_its_values_to_a_bin():
    values = [2.0 + 0.01 * i for i in range(100)] + [41.0]
    h = Histogram(width=0.05)
    for value in values:
        h.add(value)
    exact = quantiles(sorted(values))
    got = h.quantiles()
    assert got["count"] == exact["count"] and got["max"] == exact["max"]
    for q in ("p50", "p99"):
        assert exact[q] <= got[q] <= exact[q] + h.width
    assert Histogram(1.0).quantiles() == {"count": 0}
    wide = Histogram(1.0, bins=10)
    wide.add(500.0)  # past the last bin: still counted, its maximum exact
    assert wide.quantiles() == {"count": 1, "p50": 10.0, "p99": 10.0, "max": 500.0}


# --- the agent process's lifecycle --------------------------------------------------------------

STAND_IN_AGENT = '''
import json, signal, sys, threading
from pathlib import Path

plan, workdir = json.loads(Path(sys.argv[1]).read_text()), Path(sys.argv[2])
if plan.get("fail"):
    print("the stand-in agent cannot start: asked to fail", flush=True)
    sys.exit(1)
stop = threading.Event()
signal.signal(signal.SIGTERM, lambda *_: stop.set())
(workdir / "stand-in.ready").write_text("ready")
stop.wait(60)
(workdir / "stand-in-counters.json").write_text(json.dumps({"stopped": True}))
'''


class StandInAgentProcess(AgentProcess):
    module = "stand_in_agent"
    title = "the stand-in agent"
    plan_file, log_file = "stand-in-plan.json", "stand-in.log"
    ready_file, counters_file = "stand-in.ready", "stand-in-counters.json"


@pytest.fixture
def agent_env(tmp_path, monkeypatch):
    """The ledger in a temporary folder; the stand-in agent's module importable by the
    child."""
    folder = tmp_path / "state"
    monkeypatch.setattr(state, "STATE_DIR", folder)
    monkeypatch.setattr(state, "LEDGER_PATH", folder / "state.json")
    modules = tmp_path / "modules"
    modules.mkdir()
    (modules / "stand_in_agent.py").write_text(STAND_IN_AGENT)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(
        [str(modules), *filter(None, [os.environ.get("PYTHONPATH")])]))
    workdir = tmp_path / "run"
    workdir.mkdir()
    ledger = Ledger("run-1", os.getpid())
    ledger.save()
    return workdir, ledger


def test_an_agent_starts_on_its_ready_file_is_recorded_and_stops_by_pid(agent_env):
    workdir, ledger = agent_env
    (workdir / "stand-in-counters.json").write_text("{\"from\": \"an earlier start\"}")
    agent = StandInAgentProcess(workdir, ledger, log=lambda m: None)
    agent.launch({"fail": False})
    try:
        assert agent.alive() and agent.counters() == {}  # the earlier file went first
        assert json.loads((workdir / "stand-in-plan.json").read_text()) == {"fail": False}
        assert agent.pid in Ledger.load().processes  # clean can end it after a crash
        assert os.getpgid(agent.pid) == agent.pid  # a session of its own
    finally:
        agent.stop()
    assert not agent.alive() and agent.counters() == {"stopped": True}


def test_an_agent_that_exits_before_it_is_ready_fails_with_its_log(agent_env):
    workdir, ledger = agent_env
    agent = StandInAgentProcess(workdir, ledger, log=lambda m: None)
    started = time.monotonic()
    with pytest.raises(errors.TestbedError) as err:
        agent.launch({"fail": True})
    assert time.monotonic() - started < AGENT_WAIT_S
    assert "the stand-in agent exited (1)" in str(err.value)
    assert "asked to fail" in str(err.value)
