"""The run lifecycle of testbed.harness.run around a stand-in network: what ``run_scenario``
logs, measures and writes for one setup, and what a failing measurement leaves; and the
pieces the Python API and ``testbed up`` keep a fabric up with (``bring_up``,
``measure_setup``). The machine's lock and ledger and the network are stand-ins, so nothing
here touches the machine."""
from __future__ import annotations

import errno
import json
import os
from pathlib import Path
from types import SimpleNamespace

import pytest
from tests.unit.stand_ins import (  # noqa: F401 (standins: a fixture)
    StandInExperiment,
    StandInFabric,
    StandInLedger,
    standins,
)

import testbed.harness.progress
from testbed import errors
from testbed.capabilities import detect
from testbed.harness.experiment import Resolved
from testbed.harness.run import (
    FAILED,
    bring_up,
    measure_setup,
    results_write_error,
    run_scenario,
)
from testbed.harness.scenario import FailureSpec, Scenario

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
    (net,) = StandInFabric.made
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
    (net,) = StandInFabric.made
    assert net.stopped
    (run_dir,) = tmp_path.iterdir()
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == FAILED and summary["error"] == "the workload broke"
    assert summary["results"] == {}


def test_a_setup_kept_up_is_measured_on_and_taken_down_only_at_the_end(tmp_path, standins):
    resolved = resolved_for(tmp_path)
    setup = resolved.setups[0]
    with bring_up(resolved, setup, "ledger", tmp_path, log=lambda m: None) as live:
        assert live.net is StandInFabric.made[0] and live.ecn is None
        assert live.bring_up["answered"] == PROBES
        for _ in range(2):  # the same fabric, measured twice
            result = measure_setup(resolved, setup, live, tmp_path, lambda m: None,
                                   testbed.harness.progress.QuietProgress())
            assert result["value"] == 7 and result["bring_up"] == live.bring_up
        assert not live.net.stopped
    assert live.net.stopped and len(StandInFabric.made) == 1
    assert [r.net for r in StandInExperiment.runs] == [live.net, live.net]


def test_an_unreachable_pair_stops_the_bring_up(tmp_path, standins, monkeypatch):
    monkeypatch.setattr(StandInFabric, "ping_all", lambda self: (PROBES, PROBES - 1))
    resolved = resolved_for(tmp_path)
    answered = f"only {PROBES - 1}/{PROBES} reachability probes"
    with pytest.raises(errors.TestbedError, match=answered):
        with bring_up(resolved, resolved.setups[0], "ledger", tmp_path, log=lambda m: None):
            pytest.fail("the fabric must not be handed over")
    assert StandInFabric.made[0].stopped


# --- phases, a results folder that refuses writes, the watchdog, the failure schedule ---------


def test_the_ledger_follows_the_run_through_its_phases(tmp_path, standins, monkeypatch):
    run_scenario(resolved_for(tmp_path), log=lambda m: None)
    assert StandInLedger.phases == ["bring-up", "bring-up", "workload", "tear-down"]
    StandInLedger.phases.clear()
    monkeypatch.setattr(StandInExperiment, "fail_with", "the workload broke")
    with pytest.raises(errors.TestbedError):
        run_scenario(resolved_for(tmp_path), log=lambda m: None)
    assert StandInLedger.phases[-1] == "tear-down"  # the fabric goes down as marked


def refuse_writes_of(monkeypatch, name: str, code: int = errno.ENOSPC,
                     named: bool = True) -> None:
    """Writing a file called ``name`` fails as on a full (or read-only) file system (the
    error naming the file, or not, as when the write fails at its flush)."""
    write_text = Path.write_text

    def refusing(self, *args, **kwargs):
        if self.name == name:
            raise OSError(code, os.strerror(code), *([str(self)] if named else []))
        return write_text(self, *args, **kwargs)
    monkeypatch.setattr(Path, "write_text", refusing)


@pytest.mark.parametrize("named", [True, False])  # a failed flush names no file
def test_a_results_folder_that_refuses_the_first_write_is_one_line_before_any_fabric(
        tmp_path, standins, monkeypatch, named):
    refuse_writes_of(monkeypatch, "config.json", named=named)
    with pytest.raises(errors.TestbedError) as info:
        run_scenario(resolved_for(tmp_path), log=lambda m: None)
    message = str(info.value)
    assert "\n" not in message
    assert message.startswith(f"cannot write the run's results in {tmp_path}/")
    assert message.endswith(": No space left on device (config.json)")
    assert StandInFabric.made == [] and list(tmp_path.iterdir()) == []  # nothing made, nothing left


def test_a_complete_run_whose_summary_cannot_be_written_fails_in_one_line(
        tmp_path, standins, monkeypatch):
    refuse_writes_of(monkeypatch, "summary.json", errno.EROFS)
    with pytest.raises(errors.TestbedError, match=r"^cannot write the run's results in .*: "
                                                  r"Read-only file system \(summary.json\)$"):
        run_scenario(resolved_for(tmp_path), log=lambda m: None)
    assert StandInFabric.made[0].stopped


def test_a_failed_run_keeps_its_own_error_when_its_summary_cannot_be_written(
        tmp_path, standins, monkeypatch):
    refuse_writes_of(monkeypatch, "summary.json")
    monkeypatch.setattr(StandInExperiment, "fail_with", "the workload broke")
    lines = []
    with pytest.raises(errors.TestbedError, match="^the workload broke$"):
        run_scenario(resolved_for(tmp_path), log=lines.append)
    assert any("No space left on device (summary.json)" in line for line in lines)


def test_a_write_refused_mid_run_in_the_results_folder_is_one_line(tmp_path, standins,
                                                                    monkeypatch):
    def full(self, run):
        raise OSError(errno.ENOSPC, "No space left on device", str(run.workdir / "rank3.err"))
    monkeypatch.setattr(StandInExperiment, "measure", full)
    with pytest.raises(errors.TestbedError, match=r"No space left on device \(rank3.err\)$"):
        run_scenario(resolved_for(tmp_path), log=lambda m: None)


def test_only_a_refused_write_in_the_results_folder_is_the_results_folders_fault(tmp_path):
    workdir = tmp_path / "results" / "run-1"
    inside = OSError(errno.ENOSPC, "No space left on device", str(workdir / "x.json"))
    assert str(results_write_error(inside, workdir)) == (
        f"cannot write the run's results in {workdir}: No space left on device (x.json)")
    elsewhere = OSError(errno.ENOSPC, "No space left on device", "/var/cache/thing")
    assert results_write_error(elsewhere, workdir) is None
    assert results_write_error(OSError(errno.ENOENT, "gone", str(workdir)), workdir) is None
    assert results_write_error(ValueError("no"), workdir) is None
    # a full or read-only file system may say so without naming the file (a flush)
    unnamed = OSError(errno.ENOSPC, "No space left on device")
    assert str(results_write_error(unnamed, workdir)) == (
        "a write failed: No space left on device; is the results folder "
        f"{workdir.parent} full or read-only?")
    assert results_write_error(OSError(errno.EPERM, "Operation not permitted"), workdir) is None


def dead(name: str, pid: int, returncode: int) -> tuple:
    return name, SimpleNamespace(pid=pid, returncode=returncode, poll=lambda: returncode)


def test_a_vital_daemon_that_died_is_the_runs_error_even_over_what_it_broke(
        tmp_path, standins, monkeypatch):
    monkeypatch.setattr(StandInFabric, "vital_daemons",
                        lambda self: [dead("ovs-vswitchd", 812, -9)])
    monkeypatch.setattr(StandInExperiment, "fail_with", "rank 3 died: killed by SIGTERM")
    with pytest.raises(errors.TestbedError) as info:
        run_scenario(resolved_for(tmp_path), log=lambda m: None)
    assert str(info.value) == ("ovs-vswitchd (pid 812) died during the workload: killed by "
                               "SIGKILL; the switches stopped forwarding")
    monkeypatch.setattr(StandInExperiment, "fail_with", None)  # a workload that got through
    with pytest.raises(errors.TestbedError, match=r"^ovs-vswitchd \(pid 812\) died"):
        run_scenario(resolved_for(tmp_path), log=lambda m: None)


def test_a_failure_schedule_is_applied_healed_and_its_windows_kept(tmp_path, standins):
    resolved = resolved_for(tmp_path)
    resolved.scenario.failures = [FailureSpec.model_validate(
        {"at_s": 0.0, "for_s": 60, "action": "link_down", "link": ["p0e0", "p0a0"]})]
    outcome = run_scenario(resolved, log=lambda m: None)
    result = outcome.summary["results"]["fabric"]
    (net,) = StandInFabric.made
    assert net.links_set == [("p0e0", "p0a0", False), ("p0e0", "p0a0", True)]
    assert [(r["event"], r.get("at_exit", False)) for r in result["failures"]] == [
        ("link_down p0e0-p0a0", False), ("link_up p0e0-p0a0", True)]
    (window,) = result["fault_windows"]
    assert window["fault"] == "link_down p0e0-p0a0" and window["end_monotonic_s"] is not None
