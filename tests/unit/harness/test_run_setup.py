"""The run lifecycle of testbed.harness.run around a stand-in network: what ``run_scenario``
logs, measures and writes for one setup, and what a failing measurement leaves; and the
pieces the Python API and ``testbed up`` keep a fabric up with (``bring_up``,
``measure_setup``). The machine's lock and ledger and the network are stand-ins, so nothing
here touches the machine."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from tests.unit.stand_ins import StandInExperiment, StandInNetwork, standins  # noqa: F401 (a fixture)

import testbed.harness.progress
from testbed import errors
from testbed.capabilities import detect
from testbed.harness.experiment import Resolved
from testbed.harness.run import FAILED, bring_up, measure_setup, run_scenario
from testbed.harness.scenario import Scenario

K = 4
HOSTS = K ** 3 // 4
PROBES = HOSTS * (HOSTS // 2)  # each host probes the next half of the hosts


def resolved_for(tmp_path: Path) -> Resolved:
    scenario = Scenario(name="standin-run", experiment="standin", link_rate_mbit=6.0,
                        results_dir=str(tmp_path))
    platform = detect()
    experiment = StandInExperiment(scenario, StandInExperiment.Params(), platform)
    return Resolved(scenario, experiment, platform, experiment.setups(), None)


def test_a_run_brings_the_setup_up_measures_and_writes_its_summary(tmp_path, standins):
    lines: list[str] = []
    resolved = resolved_for(tmp_path)
    outcome = run_scenario(resolved, log=lines.append)
    (net,) = StandInNetwork.made
    assert net.stopped and net.datapath in ("user", "kernel") and net.routing == "ecmp"
    (run,) = StandInExperiment.runs
    assert run.net is net and run.setup is resolved.setups[0] and run.workdir == outcome.workdir
    assert standins == [outcome.summary["run_id"]]
    fabric = resolved.setups[0].fabric
    groups = sum(len(t.groups) for t in net.switchd.tables.values())
    result = outcome.summary["results"]["fabric"]
    assert result["value"] == 7 and result["dir"] == str(outcome.workdir)
    assert result["bring_up"] == {
        "probes": PROBES, "answered": PROBES, "ordered_pairs": HOSTS * (HOSTS - 1),
        "select_groups": {"select_groups": groups},
        "timings_s": {"build_s": 1.0, "programmed_s": 0.5, "stop_s": 0.25},
        "switchd": {**net.switchd.describe(), "host_cpus": [1], "cpu_pinning": True,
                    "min_host_cpus": 1}}
    assert set(result["openflow"]) == {"events", "port_counters", "wiring"}
    assert "failures" not in result  # no schedule in the scenario
    assert outcome.status == "complete" and outcome.verdict.checks[0].passed
    written = json.loads((outcome.workdir / "summary.json").read_text())
    assert written["status"] == "complete"
    assert written["rows"] == [{"what": "value", "text": "7", "numbers": []}]
    assert json.loads((outcome.workdir / "config.json").read_text())["scenario"]["name"] == \
        "standin-run"
    assert lines[0].startswith(f"run {outcome.summary['run_id']}: stand-in")
    assert lines[1] == "link rate 6 Mbit/s: set by the scenario"
    assert lines[2].startswith(f"fabric: {fabric.label()}, {HOSTS} hosts, 20 switches, 48 links")
    assert lines[3] == ("fabric: 1 ovs-vswitchd (netdev datapath, 20 bridges), pinned to CPU 0, "
                        "hosts and their receive processing on CPU 1, allocator tcmalloc")
    assert lines[4] == ("fabric: fabric up: built in 1.0 s; all 20 switches programmed by the "
                        "controller 0.5 s later")
    assert lines[5].startswith(f"fabric: reachability: {PROBES}/{PROBES} probes answered, "
                               f"covering all {HOSTS * (HOSTS - 1)} ordered host pairs")
    assert len(lines) == 6


def test_a_failing_measurement_still_writes_the_summary_and_takes_the_fabric_down(
        tmp_path, standins, monkeypatch):
    monkeypatch.setattr(StandInExperiment, "fail_with", "the workload broke")
    resolved = resolved_for(tmp_path)
    with pytest.raises(errors.TestbedError, match="the workload broke"):
        run_scenario(resolved, log=lambda m: None)
    (net,) = StandInNetwork.made
    assert net.stopped
    (run_dir,) = tmp_path.iterdir()
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == FAILED and summary["error"] == "the workload broke"
    assert summary["results"] == {}


def test_a_setup_kept_up_is_measured_on_and_taken_down_only_at_the_end(tmp_path, standins):
    resolved = resolved_for(tmp_path)
    setup = resolved.setups[0]
    with bring_up(resolved, setup, "ledger", tmp_path, log=lambda m: None) as live:
        assert live.net is StandInNetwork.made[0] and live.ecn is None
        assert live.bring_up["answered"] == PROBES
        for _ in range(2):  # the same fabric, measured twice
            result = measure_setup(resolved, setup, live, tmp_path, lambda m: None,
                                   testbed.harness.progress.QuietProgress())
            assert result["value"] == 7 and result["bring_up"] == live.bring_up
        assert not live.net.stopped
    assert live.net.stopped and len(StandInNetwork.made) == 1
    assert [r.net for r in StandInExperiment.runs] == [live.net, live.net]


def test_an_unreachable_pair_stops_the_bring_up(tmp_path, standins, monkeypatch):
    monkeypatch.setattr(StandInNetwork, "ping_all", lambda self: (PROBES, PROBES - 1))
    resolved = resolved_for(tmp_path)
    answered = f"only {PROBES - 1}/{PROBES} reachability probes"
    with pytest.raises(errors.TestbedError, match=answered):
        with bring_up(resolved, resolved.setups[0], "ledger", tmp_path, log=lambda m: None):
            pytest.fail("the fabric must not be handed over")
    assert StandInNetwork.made[0].stopped
