"""The scenario's ``failures:`` entries (testbed.harness.scenario.FailureSpec): the old single
events load as before, the new fields (for_s, selectors, modes, impair, stop and kill of a
daemon) are checked one entry at a time with one clear problem each, and what a setup cannot
take is named with the field."""
from __future__ import annotations

from dataclasses import replace

import pytest
from pydantic import ValidationError

import testbed.experiments.registry
from testbed import capabilities
from testbed.experiments.registry import validate
from testbed.harness.scenario import FailureSpec, ScenarioError


def problem(item: dict) -> str:
    with pytest.raises(ValidationError) as info:
        FailureSpec.model_validate({"at_s": 1, **item})
    (error,) = info.value.errors()
    return error["msg"].removeprefix("Value error, ")


@pytest.mark.parametrize("item", [
    {"action": "link_down", "link": ["p0e0", "p0a0"]},
    {"action": "link_up", "link": ["p0e0", "p0a0"]},
    {"action": "switch_down", "switch": "p0a1"},
    {"action": "controller_restart"},
    {"action": "link_down", "for_s": 2, "links": {"role": "aggregation"}, "mode": "one"},
    {"action": "switch_down", "for_s": 2, "switches": {"role": "core"}, "mode": "percent",
     "value": 50},
    {"action": "switch_down", "for_s": 2, "switches": {"pod": 0}, "mode": "fixed", "value": 2},
    {"action": "impair", "for_s": 3, "link": ["p0e0", "p0a0"], "loss_percent": 1},
    {"action": "impair", "for_s": 3, "links": {}, "mode": "one", "delay_ms": 5, "jitter_ms": 1},
    {"action": "stop", "for_s": 60, "daemon": "traffic", "hosts": {}, "mode": "one"},
    {"action": "stop", "for_s": 1, "daemon": "ovs-vswitchd"},
    {"action": "kill", "daemon": "pause-agent"},
    {"action": "kill", "daemon": "iperf3", "host": "p0e0h0"},
])
def test_these_entries_are_valid(item):
    FailureSpec.model_validate({"at_s": 1, **item})


@pytest.mark.parametrize(("item", "message"), [
    ({"action": "link_down"}, "link_down needs link: [a, b]"),
    ({"action": "switch_up"}, "switch_up needs switch: NAME"),
    ({"action": "controller_restart", "switch": "p0e0"}, "controller_restart takes no switch"),
    ({"action": "link_down", "link": ["a", "b"], "links": {}}, "give one of link or links, not both"),
    ({"action": "link_up", "link": ["a", "b"], "for_s": 1},
     "link_up takes no for_s (only link_down, switch_down, impair, stop are healed)"),
    ({"action": "kill", "daemon": "traffic", "host": "h", "for_s": 1},
     "kill takes no for_s (only link_down, switch_down, impair, stop are healed)"),
    ({"action": "impair", "link": ["a", "b"], "loss_percent": 1},
     "impair needs for_s: how long it lasts (it is healed then, or when the run ends first)"),
    ({"action": "impair", "link": ["a", "b"], "for_s": 1}, "impair needs delay_ms or loss_percent"),
    ({"action": "impair", "link": ["a", "b"], "for_s": 1, "jitter_ms": 1, "loss_percent": 1},
     "jitter_ms needs delay_ms"),
    ({"action": "link_down", "link": ["a", "b"], "loss_percent": 1},
     "loss_percent is for action impair"),
    ({"action": "kill", "host": "h"}, "kill needs daemon: one of controller, ovs-vswitchd, "
     "pause-agent, or traffic or iperf3 with host: NAME (or hosts: a selector)"),
    ({"action": "kill", "daemon": "traffic"}, "daemon traffic runs in hosts: name one "
     "(host: NAME) or select them (hosts: a selector)"),
    ({"action": "kill", "daemon": "controller", "hosts": {}},
     "daemon controller runs beside the fabric, not in a host: leave out hosts"),
    ({"action": "link_down", "link": ["a", "b"], "mode": "one"},
     "mode and value choose among a selector's targets (links, switches or hosts)"),
    ({"action": "link_down", "links": {}, "mode": "fixed", "value": 1.5},
     "mode fixed needs value: a whole number of targets"),
    ({"action": "link_down", "links": {}, "mode": "percent"},
     "mode percent needs value: a percentage of the targets, at most 100"),
    ({"action": "link_down", "links": {}, "mode": "percent", "value": 150},
     "mode percent needs value: a percentage of the targets, at most 100"),
    ({"action": "link_down", "links": {}, "mode": "one", "value": 2}, "mode one takes no value"),
    ({"action": "switch_down", "switch": "s", "daemon": "traffic"}, "switch_down takes no daemon"),
])
def test_one_clear_problem_per_entry(item, message):
    assert problem(item) == message


def ring(failures: list[dict], **more) -> dict:
    return {"name": "x", "topology": {"name": "fattree", "k": 4}, "failures": failures, **more}


def problems_of(data: dict) -> list[str]:
    with pytest.raises(ScenarioError) as info:
        validate(data)
    return [str(p) for p in info.value.problems]


def test_the_old_failure_schedule_still_loads_as_it_was_written():
    resolved = validate(ring([{"at_s": 2, "action": "link_down", "link": ["p0e0", "p0a0"]},
                              {"at_s": 5, "action": "link_up", "link": ["p0e0", "p0a0"]},
                              {"at_s": 7, "action": "controller_restart"}]))
    assert [(f.at_s, f.action, f.link, f.for_s) for f in resolved.scenario.failures] == [
        (2, "link_down", ["p0e0", "p0a0"], None), (5, "link_up", ["p0e0", "p0a0"], None),
        (7, "controller_restart", None, None)]


def test_a_selector_that_matches_nothing_and_a_pause_agent_without_pfc_are_named():
    found = problems_of(ring([
        {"at_s": 1, "for_s": 1, "action": "switch_down", "switches": {"role": "spine"}},
        {"at_s": 1, "action": "kill", "daemon": "pause-agent"},
        {"at_s": 1, "action": "kill", "daemon": "traffic", "host": "p9e9h9"}]))
    assert found == ["failures.0.switches.role: no node has role spine; roles here: "
                     "aggregation, core, edge, host",
                     "failures.1.daemon: this fabric runs no pause agent: its queue has no PFC",
                     "failures.2.host: no host p9e9h9"]


def test_the_machines_own_open_vswitch_is_never_a_target(monkeypatch):
    platform = capabilities.detect()
    kernel = replace(platform, paths=replace(platform.paths, ovs_datapath="kernel"))
    monkeypatch.setattr(testbed.experiments.registry, "detect", lambda: kernel)
    found = problems_of(ring([{"at_s": 1, "action": "kill", "daemon": "ovs-vswitchd"}]))
    assert found == ["failures.0.daemon: the switches live in the machine's Open vSwitch here "
                     "(kernel datapath), which a run may not stop or kill; the run's own "
                     "ovs-vswitchd runs with TESTBED_DATAPATH=user"]


def test_a_scheduled_delay_needs_netem(monkeypatch):
    platform = capabilities.detect()
    if platform.capabilities["sch_netem"].available:
        pytest.fail("this test expects the CI kernel, which has no sch_netem")
    found = problems_of(ring([{"at_s": 1, "for_s": 2, "action": "impair",
                               "link": ["p0e0", "p0a0"], "delay_ms": 5}]))
    assert len(found) == 1 and found[0].startswith(
        "failures.0: delay needs the netem qdisc, which this kernel lacks")
    resolved = validate(ring([{"at_s": 1, "for_s": 2, "action": "impair",
                               "link": ["p0e0", "p0a0"], "loss_percent": 5}]))
    assert resolved.scenario.failures[0].loss_percent == 5
