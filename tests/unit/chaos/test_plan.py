"""Planning a suite from a seed (testbed.chaos.plan): deterministic, every row on its
workloads, the SIGKILLs each phase needs, every scenario valid, faults inside their
workload's busy window, and the plan within its profile's time."""
from __future__ import annotations

import pytest

from testbed.apply.state import PHASES
from testbed.chaos.plan import (
    KILL_SPAN,
    PROFILES,
    STOPPED_FOR_S,
    WORKLOADS,
    plan_suite,
    trial_scenario,
)
from testbed.chaos.table import BASELINE, FAULTS, PASSES, RECOVERED, SETUPS
from testbed.experiments.registry import validate


@pytest.mark.parametrize("profile", sorted(PROFILES))
def test_the_same_seed_plans_the_same_suite_and_another_seed_another(profile):
    a, b = plan_suite(PROFILES[profile], 11), plan_suite(PROFILES[profile], 11)
    assert a == b
    c = plan_suite(PROFILES[profile], 12)
    assert [t.fault for t in c.trials] != [t.fault for t in a.trials] or \
        [t.failures for t in c.trials] != [t.failures for t in a.trials]


@pytest.mark.parametrize("profile", sorted(PROFILES))
def test_a_suite_starts_plain_covers_every_row_and_kills_in_every_phase(profile):
    p = PROFILES[profile]
    plan = plan_suite(p, 5)
    first, *rest = plan.trials
    assert (first.fault, first.expected, first.index) == (BASELINE, PASSES, 0)
    assert [t.index for t in plan.trials] == list(range(len(plan.trials)))
    assert {t.fault for t in rest} == {f.key for f in FAULTS}
    for phase in PHASES:
        kills = [t for t in rest if t.kill_phase == phase]
        assert sum(not t.spare for t in kills) == p.kills_per_phase
        assert sum(t.spare for t in kills) == p.spare_kills
        assert all(t.expected == RECOVERED and 0 <= t.kill_fraction < KILL_SPAN for t in kills)
    spares = [t.spare for t in plan.trials]
    assert spares == sorted(spares)  # spares last: run only when a phase still lacks kills
    for fault in FAULTS:
        if fault.expected == RECOVERED:
            continue
        workloads = [t.workload for t in rest if t.fault == fault.key]
        wanted = fault.workloads if p.every_workload else fault.workloads[:1]
        assert sorted(workloads) == sorted(p.substitutes.get(w, w) for w in wanted)


@pytest.mark.parametrize("profile", sorted(PROFILES))
def test_a_suite_is_planned_within_its_profiles_time(profile):
    plan = plan_suite(PROFILES[profile], 3)
    assert plan.estimate_s() <= PROFILES[profile].budget_s
    assert PROFILES["full"].budget_s == 30 * 60 and PROFILES["ci"].budget_s == 10 * 60


@pytest.mark.parametrize("profile", sorted(PROFILES))
def test_every_planned_run_is_a_valid_scenario(profile, monkeypatch):
    monkeypatch.setenv("TESTBED_DATAPATH", "user")  # what the vswitchd-kill run is given
    for trial in plan_suite(PROFILES[profile], 9).trials:
        resolved = validate(trial_scenario(trial), trial.name)
        assert resolved.scenario.name == f"chaos-{trial.fault}"
        assert resolved.scenario.seed == trial.seed
        assert len(resolved.scenario.failures) == len(trial.failures)


def test_faults_start_while_the_workload_is_busy_and_the_stopped_rank_outlasts_its_timeout():
    for profile in PROFILES.values():
        for trial in plan_suite(profile, 21).trials:
            workload = WORKLOADS[trial.workload]
            for entry in trial.failures:
                low, high = workload.fault_at_s
                assert low <= entry["at_s"] <= high, trial.name
                if trial.fault == "rank-stop":
                    assert entry["for_s"] == STOPPED_FOR_S > 10 * profile.rank_timeout_s
                    assert trial.settings["params.timeout_s"] == profile.rank_timeout_s
                    assert trial.within_s >= profile.rank_timeout_s
                elif "for_s" in entry:
                    assert workload.fault_for_s[0] <= entry["for_s"] <= workload.fault_for_s[1]
            if trial.fault == "vswitchd-kill":
                assert trial.env == {"TESTBED_DATAPATH": "user"}
            assert trial.setup == SETUPS.get(trial.fault)
            assert trial.hang_s > trial.within_s > 0


def test_a_switch_flap_takes_half_the_core_of_the_ring_and_one_aggregation_switch_elsewhere():
    plan = plan_suite(PROFILES["full"], 4)
    flaps = {t.workload: t.failures[0] for t in plan.trials if t.fault == "switch-flap"}
    assert flaps["allreduce"]["switches"] == {"role": "core"}
    assert (flaps["allreduce"]["mode"], flaps["allreduce"]["value"]) == ("percent", 50)
    assert flaps["roce"]["switches"] == {"role": "aggregation"}
    assert flaps["anycast"]["switches"] == {"role": "aggregation", "pod": 0}
