"""The Python API (testbed.api) around a stand-in network (tests/unit/stand_ins.py): what
``up`` makes of a scenario or a topology, which setup comes up, the hosts as Mininet hosts,
commands, failures, an experiment measured on the fabric kept up (and refused when it needs
fabrics of its own), link rates from counters, and everything down at the end."""
from __future__ import annotations

import os

import pytest
from tests.unit.stand_ins import StandInExperiment, StandInFabric, standins  # noqa: F401 (a fixture)

from testbed import errors
from testbed.harness.experiment import Setup
from testbed.interactive.live import (
    LiveFabric,
    choose_setup,
    link_rates_mbit,
    resolve_scenario,
    scenario_data,
    setup_differences,
    up,
)

RATE_TOLERANCE_MBIT = 1e-9


def resolved_standin(tmp_path, experiment: str = "standin", **fields):
    return resolve_scenario(None, {"topology": {"name": "fattree", "k": 4},
                                   "experiment": experiment, "results_dir": str(tmp_path),
                                   **fields})


# --- what up() brings up -----------------------------------------------------------------------


def test_the_keywords_become_scenario_fields():
    assert scenario_data("fattree-allreduce", rate_mbit=12, routing="single",
                         results_dir="/tmp/r", overrides={"params.iters": 1}) == (
        "fattree-allreduce", {"params.iters": 1, "link_rate_mbit": 12, "routing": "single",
                              "results_dir": "/tmp/r"})
    assert scenario_data(topology="spineleaf") == (None, {"topology": {"name": "spineleaf"}})
    assert scenario_data(topology={"name": "fattree", "k": 6}, mtu_bytes=1500) == (
        None, {"topology": {"name": "fattree", "k": 6}, "mtu_bytes": 1500})


def test_something_must_be_brought_up():
    with pytest.raises(errors.ConfigError, match="give a scenario or a topology"):
        scenario_data(rate_mbit=6)


def test_a_topology_alone_is_a_scenario_named_after_it(tmp_path):
    resolved = resolve_scenario(None, {"topology": {"name": "fattree", "k": 4},
                                       "link_rate_mbit": 12.0})
    assert resolved.scenario.name == "fattree"
    (setup,) = resolved.setups
    assert (len(setup.fabric.hosts), len(setup.fabric.switches)) == (16, 20)
    assert {link.rate_mbit for link in setup.fabric.links} == {12.0}


def test_a_bundled_scenario_with_overrides(tmp_path):
    resolved = resolve_scenario("fattree-allreduce", {"link_rate_mbit": 3.0})
    assert resolved.scenario.name == "fattree-allreduce"
    assert {link.rate_mbit for link in resolved.setups[0].fabric.links} == {3.0}


def test_a_bad_topology_is_refused_naming_the_field():
    with pytest.raises(errors.ConfigError) as info:
        resolve_scenario(None, {"topology": {"name": "fattree", "k": 3}})
    assert "topology.k" in str(info.value)


def test_the_setup_is_the_only_one_or_the_one_named(tmp_path, standins):
    single = resolved_standin(tmp_path)
    assert choose_setup(single) is single.setups[0]
    two = resolved_standin(tmp_path, "standin-two")
    assert choose_setup(two, "wide").name == "wide"
    with pytest.raises(errors.ConfigError, match="name one with setup=; .* has narrow, wide"):
        choose_setup(two)
    with pytest.raises(errors.ConfigError, match="no setup 'medium'"):
        choose_setup(two, "medium")


def test_an_experiment_measures_here_only_on_an_equal_fabric(tmp_path, standins):
    live = resolved_standin(tmp_path).setups[0]
    assert setup_differences([live], live) == []
    assert setup_differences([Setup("fabric", live.fabric, "single", tcp=live.tcp)], live) == [
        "its routing differs"]
    two = resolved_standin(tmp_path, "standin-two").setups
    assert setup_differences(two, live) == ["it measures on 2 fabrics of its own (narrow, wide)"]


def test_link_rates_from_two_counter_readings():
    rates = link_rates_mbit({"a->b": 1_000, "b->a": 0}, {"a->b": 1_251_000, "b->a": 500_000}, 2.0)
    assert rates["a->b"] == pytest.approx(5.0, abs=RATE_TOLERANCE_MBIT)  # 1.25 MB * 8 / 2 s
    assert rates["b->a"] == pytest.approx(2.0, abs=RATE_TOLERANCE_MBIT)


# --- a fabric kept up --------------------------------------------------------------------------


def test_a_fabric_is_up_for_the_block_and_down_after(tmp_path, standins):
    with up(topology={"name": "fattree", "k": 4}, results_dir=tmp_path) as fab:
        (net,) = StandInFabric.made
        assert fab.net is net and not net.stopped
        assert standins == [fab.run_id] and fab.workdir == tmp_path / fab.run_id
        assert (fab.workdir / "config.json").exists()
        assert [h.name for h in fab.hosts] == [h.name for h in fab.description.hosts]
        assert fab.switches[:2] == ["c0", "c1"] and len(fab.switches) == 20
    assert net.stopped
    with pytest.raises(errors.TestbedError, match="not up"):
        fab.net
    fab.close()  # a second close does nothing


def test_hosts_as_mininet_names_them(tmp_path, standins):
    with LiveFabric(resolved_standin(tmp_path)) as fab:
        h1 = fab.get("p0e0h0")
        assert h1 is fab["p0e0h0"] is fab.host("p0e0h0") is fab.net.hosts["p0e0h0"]
        assert [h.name for h in fab.get("p0e0h0", "p3e1h1")] == ["p0e0h0", "p3e1h1"]
        assert "p0e0" in fab and "p0e0h0" in fab and "nowhere" not in fab
        with pytest.raises(KeyError, match="p0e0 is a switch"):
            fab.host("p0e0")
        with pytest.raises(KeyError, match="no host nowhere"):
            fab["nowhere"]


def test_commands_failures_and_the_published_state(tmp_path, standins):
    with LiveFabric(resolved_standin(tmp_path)) as fab:
        done = fab.exec(fab.get("p0e0h0"), ["echo", "hello"])
        assert (done.returncode, done.stdout) == (0, "p0e0h0 ran echo hello\n")
        assert fab.net.started == [("p0e0h0", ["echo", "hello"])]
        assert fab.link_down("p0e0", "p0a0") == 1.5
        fab.link_up("p0e0", "p0a0")
        assert fab.net.links_set == [("p0e0", "p0a0", False), ("p0e0", "p0a0", True)]
        state = fab.session_state("fattree-allreduce")
        assert (state.run_id, state.source, state.holder_pid) == (
            fab.run_id, "fattree-allreduce", os.getpid())
        assert state.hosts["p0e0h0"] == fab.get("p0e0h0").pid
        assert state.ips["p3e1h1"] == "10.3.1.3" and state.controller_port == 6653
        assert state.ovs_rundir == "/run/testbed/ovs" and state.switches == fab.switches


def test_an_experiment_runs_on_the_fabric_kept_up(tmp_path, standins):
    with LiveFabric(resolved_standin(tmp_path)) as fab:
        first = fab.run("standin")
        second = fab.run("standin")
        assert not fab.net.stopped
    (net,) = StandInFabric.made  # one fabric, measured twice
    assert [run.net for run in StandInExperiment.runs] == [net, net]
    for outcome in (first, second):
        assert outcome.status == "complete" and outcome.exit_status(accept_untrusted=True) == 0
        assert outcome.workdir.parent == fab.workdir / "runs"
        result = outcome.summary["results"]["fabric"]
        assert result["value"] == 7 and result["bring_up"]["answered"] == 128
        assert set(result["bring_up"]["timings_s"]) == {"build_s", "programmed_s", "stop_s"}
        assert "openflow" in result and outcome.summary["fabric_run_id"] == fab.run_id
        assert (outcome.workdir / "summary.json").exists()
    assert first.workdir != second.workdir


def test_an_experiment_that_needs_fabrics_of_its_own_is_refused(tmp_path, standins):
    with LiveFabric(resolved_standin(tmp_path)) as fab:
        with pytest.raises(errors.TestbedError, match="standin-two cannot measure on this "
                           "fabric: it measures on 2 fabrics of its own"):
            fab.run("standin-two")
        with pytest.raises(errors.ConfigError, match="params.size_bytes"):
            fab.run("allreduce", params={"size_bytes": 3})
    assert StandInExperiment.runs == []


def test_a_failing_measurement_leaves_the_fabric_up(tmp_path, standins, monkeypatch):
    monkeypatch.setattr(StandInExperiment, "fail_with", "the workload broke")
    with LiveFabric(resolved_standin(tmp_path)) as fab:
        with pytest.raises(errors.TestbedError, match="the workload broke"):
            fab.run("standin")
        assert not fab.net.stopped
        (folder,) = (fab.workdir / "runs").iterdir()
        assert '"status": "failed"' in (folder / "summary.json").read_text()


def test_the_api_names_the_live_fabric():
    import testbed.api
    import testbed.interactive.live as live

    assert (testbed.api.up, testbed.api.LiveFabric) == (live.up, live.LiveFabric)
    assert testbed.api.__all__ == ["LiveFabric", "up"]
