"""A failure schedule expanded on a fabric (testbed.plan.fault_schedule): old single events
mean what they meant, a fault with for_s brings its heal, selectors pick by role, pod and
name, modes pick one, all, a fixed number or a percentage with the seed (the same seed, the
same pick), targets a fabric lacks are named, and applied events pair into fault windows."""
from __future__ import annotations

import pytest

from testbed.harness.scenario import FailureSpec
from testbed.model.topology import build
from testbed.plan.fault_schedule import (
    FailureEvent,
    entry_problems,
    fault_windows,
    has_pods,
    impaired_links,
    node_pod,
    pick_count,
    schedule_events,
)
from testbed.plan.port_queue import Impairment

SEED = 7


def fat_tree():
    return build("fattree", k=4, host_rate_mbit=6.0)


def entries(*items: dict) -> list[FailureSpec]:
    return [FailureSpec.model_validate(item) for item in items]


def test_old_single_events_expand_to_the_events_they_always_were():
    events = schedule_events(entries(
        {"at_s": 5, "action": "link_up", "link": ["p0e0", "p0a0"]},
        {"at_s": 2, "action": "link_down", "link": ["p0e0", "p0a0"]},
        {"at_s": 7, "action": "controller_restart"},
        {"at_s": 1, "action": "switch_down", "switch": "p0a1"}), fat_tree(), SEED)
    assert [(e.at_s, e.action, e.link, e.switch, e.heal) for e in events] == [
        (1, "switch_down", None, "p0a1", False), (2, "link_down", ("p0e0", "p0a0"), None, False),
        (5, "link_up", ("p0e0", "p0a0"), None, False), (7, "controller_restart", None, None, False)]
    assert [e.describe() for e in events] == [
        "switch_down p0a1", "link_down p0e0-p0a0", "link_up p0e0-p0a0", "controller_restart"]


@pytest.mark.parametrize(("item", "heal"), [
    ({"action": "link_down", "link": ["p0e0", "p0a0"]}, "link_up"),
    ({"action": "switch_down", "switch": "c0"}, "switch_up"),
    ({"action": "impair", "link": ["p0e0", "p0a0"], "loss_percent": 1.0}, "unimpair"),
    ({"action": "stop", "daemon": "traffic", "host": "p0e0h0"}, "resume"),
])
def test_a_fault_with_for_s_is_healed_for_s_later_on_the_same_target(item, heal):
    start, end = schedule_events(entries({"at_s": 2, "for_s": 3.5, **item}), fat_tree(), SEED)
    assert (start.at_s, start.action, start.heal) == (2, item["action"], False)
    assert (end.at_s, end.action, end.heal) == (5.5, heal, True)
    assert end.target == start.target and end.fault == start.fault == 0
    assert end.impairment is None


def test_an_impairment_event_carries_its_settings_and_the_links_it_needs_prepared():
    events = schedule_events(entries(
        {"at_s": 1, "for_s": 2, "action": "impair", "link": ["p0e0", "p0a0"],
         "delay_ms": 5, "jitter_ms": 1, "loss_percent": 2}), fat_tree(), SEED)
    assert events[0].impairment == Impairment(5, 1, 2)
    assert events[0].describe() == "impair p0e0-p0a0 (loss 2%, delay 5 ms +- 1 ms)"
    assert impaired_links(events) == [("p0e0", "p0a0")]


@pytest.mark.parametrize(("mode", "value", "available", "count"), [
    (None, None, 4, 4), ("all", None, 4, 4), ("one", None, 4, 1), ("one", None, 0, 0),
    ("fixed", 3, 4, 3), ("fixed", 9, 4, 4), ("percent", 50, 4, 2), ("percent", 10, 4, 1),
    ("percent", 100, 4, 4), ("percent", 60, 5, 3),
])
def test_a_mode_takes_one_all_a_number_or_a_percentage_rounded_down_but_at_least_one(
        mode, value, available, count):
    assert pick_count(mode, value, available) == count


def test_half_the_core_switches_are_picked_by_the_seed_the_same_each_time():
    spec = entries({"at_s": 1, "for_s": 1, "action": "switch_down", "switches": {"role": "core"},
                    "mode": "percent", "value": 50})
    picks = {seed: tuple(e.switch for e in schedule_events(spec, fat_tree(), seed) if not e.heal)
             for seed in range(20)}
    assert all(len(p) == 2 and set(p) <= {"c0", "c1", "c2", "c3"} for p in picks.values())
    assert picks[3] == tuple(e.switch for e in schedule_events(spec, fat_tree(), 3)
                             if not e.heal)
    assert len(set(picks.values())) > 1  # the seed does choose


def test_an_entrys_pick_does_not_change_when_another_entry_comes_before_it():
    flap = {"at_s": 4, "action": "kill", "daemon": "traffic", "hosts": {}, "mode": "one"}
    alone = schedule_events(entries(flap), fat_tree(), SEED)
    with_another = schedule_events(entries({"at_s": 1, "action": "controller_restart"}, flap),
                                   fat_tree(), SEED)
    # the entry's position is part of its generator's seed: first of one, second of two
    assert alone[0].host in {h.name for h in fat_tree().hosts}
    assert with_another[1].host in {h.name for h in fat_tree().hosts}
    assert schedule_events(entries(flap), fat_tree(), SEED) == alone


def test_selectors_pick_by_role_pod_and_name_and_a_link_by_either_end():
    f = fat_tree()
    pod1 = schedule_events(entries({"at_s": 1, "action": "switch_down",
                                    "switches": {"pod": 1}}), f, SEED)
    assert sorted(e.switch for e in pod1) == ["p1a0", "p1a1", "p1e0", "p1e1"]
    aggs = schedule_events(entries({"at_s": 1, "action": "switch_down",
                                    "switches": {"role": "aggregation", "pod": 0}}), f, SEED)
    assert sorted(e.switch for e in aggs) == ["p0a0", "p0a1"]
    links = schedule_events(entries({"at_s": 1, "action": "link_down",
                                     "links": {"names": ["c0"]}}), f, SEED)
    assert len(links) == 4 and all("c0" in e.link for e in links)  # k=4: a core has 4 pods
    hosts = schedule_events(entries({"at_s": 1, "action": "kill", "daemon": "iperf3",
                                     "hosts": {"pod": 3}}), f, SEED)
    assert sorted(e.host for e in hosts) == ["p3e0h0", "p3e0h1", "p3e1h0", "p3e1h1"]


def test_pods_are_the_fat_trees_the_five_stage_clos_and_the_dragonflys_groups():
    f = fat_tree()
    assert (node_pod(f, "p2e1h0"), node_pod(f, "p2a1"), node_pod(f, "c3")) == (2, 2, None)
    clos = build("clos", stages=5, host_rate_mbit=6.0)
    leaf = next(n.name for n in clos.switches if n.role == "leaf" and n.coords[0] == 1)
    assert node_pod(clos, leaf) == 1
    assert all(node_pod(clos, n.name) is None for n in clos.switches if n.role == "superspine")
    dragonfly = build("dragonfly", p=1, a=2, h=1, host_rate_mbit=6.0)
    assert {node_pod(dragonfly, n.name) for n in dragonfly.switches} == {0, 1, 2}
    for family, params in (("spineleaf", {}), ("clos", {"stages": 3})):
        assert not has_pods(build(family, host_rate_mbit=6.0, **params)), family


@pytest.mark.parametrize(("item", "problem"), [
    ({"action": "link_down", "link": ["p0e0", "p3a0"]},
     ("link", "p0e0 and p3a0 are not cabled together")),
    ({"action": "switch_down", "switch": "s99"}, ("switch", "no switch s99")),
    ({"action": "kill", "daemon": "traffic", "host": "h9"}, ("host", "no host h9")),
    ({"action": "switch_down", "switches": {"role": "spine"}},
     ("switches.role", "no node has role spine; roles here: aggregation, core, edge, host")),
    ({"action": "switch_down", "switches": {"pod": 9}}, ("switches", "matches nothing on "
                                                         "this fabric")),
    ({"action": "switch_down", "switches": {"names": ["c0", "x1"]}},
     ("switches.names", "no node x1")),
    ({"action": "switch_down", "switches": {"role": "core"}, "mode": "fixed", "value": 5},
     ("value", "5 switches wanted, the selector matches 4")),
])
def test_what_a_fabric_lacks_is_named(item, problem):
    (spec,) = entries({"at_s": 1, **item})
    assert entry_problems(spec, fat_tree()) == [problem]


def test_a_pod_on_a_fabric_without_pods_is_named():
    (spec,) = entries({"at_s": 1, "action": "link_down", "links": {"pod": 0}})
    leaf_spine = build("spineleaf", host_rate_mbit=6.0)
    assert entry_problems(spec, leaf_spine) == [
        ("links.pod", "a spineleaf fabric has no pods (fat-trees, 5-stage Clos fabrics and "
                      "dragonflies (groups) have)")]


def record(event: FailureEvent, t: float, **more) -> dict:
    return {"at_s": event.at_s, "event": event.describe(), "action": event.action,
            "target": event.target, "t_monotonic_s": t, **more}


def test_applied_events_pair_into_windows_healed_or_not():
    down = FailureEvent(1, "link_down", ("a", "b"), fault=0)
    up = FailureEvent(3, "link_up", ("a", "b"), fault=0, heal=True)
    stop = FailureEvent(2, "stop", daemon="traffic", host="h1", fault=1)
    restart = FailureEvent(2.5, "controller_restart", fault=2)
    never = FailureEvent(4, "switch_down", switch="s1", fault=3)
    failed = FailureEvent(4.5, "switch_down", switch="s2", fault=4)
    applied = [record(down, 101.0), record(stop, 102.0), record(restart, 102.5),
               record(up, 103.0), record(never, 104.0),
               {**record(failed, 104.5), "error": "no such switch"},
               record(FailureEvent(5, "resume", daemon="traffic", host="h1", fault=1,
                                   heal=True), 105.0, at_exit=True)]
    del applied[5]["t_monotonic_s"]  # a step that failed has no time
    assert fault_windows(applied) == [
        {"fault": "link_down a-b", "start_monotonic_s": 101.0, "end_monotonic_s": 103.0},
        {"fault": "stop traffic on h1", "start_monotonic_s": 102.0, "end_monotonic_s": 105.0},
        {"fault": "controller_restart", "start_monotonic_s": 102.5, "end_monotonic_s": 102.5},
        {"fault": "switch_down s1", "start_monotonic_s": 104.0, "end_monotonic_s": None},
    ]


def test_an_explicit_later_heal_closes_an_old_style_fault_too():
    applied = [record(FailureEvent(1, "link_down", ("a", "b")), 10.0),
               record(FailureEvent(2, "link_up", ("a", "b")), 12.0)]
    assert fault_windows(applied) == [
        {"fault": "link_down a-b", "start_monotonic_s": 10.0, "end_monotonic_s": 12.0}]
