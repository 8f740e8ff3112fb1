"""The pure parts of an experiment: fairness and ECMP spread from link rates, configuration
checks, run ids."""
from __future__ import annotations

import datetime
import re

import pytest

from testbed.errors import ConfigError
from testbed.experiments.allreduce.run import (
    DEFAULT_LINK_RATE_MBIT,
    DEFAULT_SIZE_BYTES,
    RunConfig,
    ecmp_spread,
    jain_index,
    new_run_id,
)
from testbed.measure.telemetry import link_directions
from testbed.model.topology.fattree import fat_tree

FLOAT_REL_TOL = 1e-12


# --- Jain's index ------------------------------------------------------------------------------


@pytest.mark.parametrize("n", [1, 2, 3, 8, 16])
def test_jain_equal_shares_is_one(n):
    assert jain_index([4.2] * n) == pytest.approx(1.0, rel=FLOAT_REL_TOL)


@pytest.mark.parametrize("n", [2, 3, 8, 16])
def test_jain_one_takes_all_is_one_over_n(n):
    assert jain_index([5.0] + [0.0] * (n - 1)) == pytest.approx(1 / n, rel=FLOAT_REL_TOL)


def test_jain_known_value():
    # (1 + 3)^2 / (2 * (1 + 9)) = 0.8
    assert jain_index([1.0, 3.0]) == pytest.approx(0.8, rel=FLOAT_REL_TOL)


def test_jain_all_zero_is_one():
    assert jain_index([0.0, 0.0, 0.0]) == 1.0


# --- ECMP spread -------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def fabric():
    return fat_tree(4, host_rate_mbit=10.0)


def zero_rates(fabric) -> dict[str, float]:
    return {d.label: 0.0 for d in link_directions(fabric)}


def test_no_traffic_no_spread(fabric):
    assert ecmp_spread(fabric, "ecmp", zero_rates(fabric)) == {
        "switches": {}, "jain_mean": None, "uplinks_used": 0, "uplinks_in_groups": 0,
        "spread": False}


def test_even_split_on_one_edge_switch(fabric):
    rates = zero_rates(fabric)
    rates["p0e0->p0a0"] = 3.0
    rates["p0e0->p0a1"] = 3.0
    rates["p0e0->p0e0h0"] = 50.0  # downlinks are not group ports and are ignored
    assert ecmp_spread(fabric, "ecmp", rates) == {
        "switches": {"p0e0": {"uplink_mbit": [3.0, 3.0], "jain": 1.0}},
        "jain_mean": 1.0, "uplinks_used": 2, "uplinks_in_groups": 2, "spread": True}


def test_all_on_one_uplink_is_no_spread(fabric):
    rates = zero_rates(fabric)
    rates["p1e1->p1a1"] = 6.0
    rates["p1a0->c1"] = 2.0
    rates["p1a0->c0"] = 0.2   # under the 0.5 Mbit/s "carried traffic" mark
    result = ecmp_spread(fabric, "ecmp", rates)
    assert result["switches"] == {
        "p1a0": {"uplink_mbit": [0.2, 2.0], "jain": round(jain_index([0.2, 2.0]), 3)},
        "p1e1": {"uplink_mbit": [0.0, 6.0], "jain": 0.5},
    }
    assert result["uplinks_used"] == 2
    assert result["uplinks_in_groups"] == 4
    assert result["jain_mean"] == round((0.5 + round(jain_index([0.2, 2.0]), 3)) / 2, 3)
    assert result["spread"] is False


def test_groups_with_negligible_load_are_left_out(fabric):
    threshold_mbit = 0.01 * fabric.params["host_rate_mbit"]
    rates = zero_rates(fabric)
    rates["p2e0->p2a0"] = threshold_mbit / 2
    rates["p2e0->p2a1"] = threshold_mbit / 2  # sum equals the threshold: not counted
    rates["p3a1->c2"] = threshold_mbit
    rates["p3a1->c3"] = threshold_mbit       # above it: counted
    result = ecmp_spread(fabric, "ecmp", rates)
    assert list(result["switches"]) == ["p3a1"]


def test_single_path_routing_has_no_groups_to_spread(fabric):
    rates = {label: 5.0 for label in zero_rates(fabric)}
    result = ecmp_spread(fabric, "single", rates)
    assert result["switches"] == {} and result["spread"] is False
    assert result["jain_mean"] is None


def test_every_group_switch_reported_under_uniform_load(fabric):
    rates = {label: 5.0 for label in zero_rates(fabric)}
    result = ecmp_spread(fabric, "ecmp", rates)
    edges_and_aggs = {s.name for s in fabric.switches if s.role in ("edge", "aggregation")}
    assert set(result["switches"]) == edges_and_aggs
    assert all(v == {"uplink_mbit": [5.0, 5.0], "jain": 1.0} for v in result["switches"].values())
    assert result["uplinks_used"] == result["uplinks_in_groups"] == 2 * len(edges_and_aggs)
    assert result["jain_mean"] == 1.0 and result["spread"] is True


# --- RunConfig ---------------------------------------------------------------------------------


def test_defaults_validate():
    config = RunConfig()
    config.validate()
    assert config.link_rate_mbit == DEFAULT_LINK_RATE_MBIT
    assert config.size_bytes == DEFAULT_SIZE_BYTES
    fabric = config.fabric()
    assert len(fabric.hosts) == 16
    assert {link.rate_mbit for link in fabric.links} == {DEFAULT_LINK_RATE_MBIT}
    assert fabric.mtu_bytes == config.mtu_bytes


@pytest.mark.parametrize(("field", "value"), [
    ("link_rate_mbit", 0),
    ("link_rate_mbit", -1.0),
    ("link_rate_mbit", 10000.5),
    ("mtu_bytes", 575),
    ("mtu_bytes", 9001),
    ("routing", "x"),
    ("workload", "alltoall"),
    ("size_bytes", 1023),
    ("size_bytes", 1026),
    ("size_bytes", 0),
    ("channels", 0),
    ("channels", 17),
    ("warmup", -1),
    ("warmup", 101),
    ("iters", 0),
    ("iters", 1001),
])
def test_validate_names_the_field(field, value):
    config = RunConfig(**{field: value})
    with pytest.raises(ConfigError) as info:
        config.validate()
    assert info.value.field == field
    assert str(info.value).startswith(f"{field}: ")
    assert f"got {value!r}" in str(info.value)


@pytest.mark.parametrize(("field", "value"), [
    ("link_rate_mbit", 10000), ("mtu_bytes", 576), ("mtu_bytes", 9000), ("size_bytes", 1024),
    ("channels", 1), ("channels", 16), ("warmup", 0), ("warmup", 100), ("iters", 1),
    ("iters", 1000), ("routing", "single"),
])
def test_validate_accepts_the_limits(field, value):
    RunConfig(**{field: value}).validate()


def test_validate_checks_topology_parameters():
    with pytest.raises(ConfigError) as info:
        RunConfig(topology_params={"k": 3}).validate()
    assert info.value.field == "k"
    with pytest.raises(ConfigError) as info:
        RunConfig(topology="nosuch").validate()
    assert info.value.field == "topology"


def test_fabric_takes_rate_and_mtu_from_the_config():
    fabric = RunConfig(topology_params={"k": 2}, link_rate_mbit=12.5, mtu_bytes=1500).fabric()
    assert fabric.params["k"] == 2
    assert {link.rate_mbit for link in fabric.links} == {12.5}
    assert fabric.mtu_bytes == 1500


# --- run ids -----------------------------------------------------------------------------------


def test_new_run_id_format():
    before = datetime.datetime.now().replace(microsecond=0)
    run_id = new_run_id("fattree-allreduce")
    after = datetime.datetime.now()
    match = re.fullmatch(r"(\d{8}-\d{6})-fattree-allreduce-([0-9a-f]{4})", run_id)
    assert match, run_id
    stamp = datetime.datetime.strptime(match.group(1), "%Y%m%d-%H%M%S")
    assert before <= stamp <= after


def test_new_run_ids_differ():
    ids = {new_run_id("x") for _ in range(50)}
    assert len(ids) >= 45  # 16 random bits each: collisions in 50 draws are rare
