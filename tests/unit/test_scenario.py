"""Scenario files: what loads, and which field every rejection names."""
from __future__ import annotations

from pathlib import Path

import pytest

from testbed.errors import ConfigError
from testbed.experiments.allreduce.run import RunConfig
from testbed.harness.scenario import config_from_dict, load_scenario, read_scenario

REPO = Path(__file__).resolve().parents[2]
REPO_SCENARIO = REPO / "scenarios" / "fattree-allreduce.yaml"

GOOD = """\
name: small-ring
topology:
  name: fattree
  k: 2
link_rate_mbit: 8.5
mtu_bytes: 1500
routing: single
workload: allreduce
size_bytes: 4096
channels: 2
warmup: 0
iters: 5
seed: 42
results_dir: out
"""


def write(tmp_path: Path, text: str, name: str = "scenario.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def config_error(tmp_path: Path, text: str) -> ConfigError:
    with pytest.raises(ConfigError) as info:
        load_scenario(write(tmp_path, text))
    return info.value


def test_good_file(tmp_path):
    config = load_scenario(write(tmp_path, GOOD))
    assert config == RunConfig(
        name="small-ring", topology="fattree", topology_params={"k": 2}, link_rate_mbit=8.5,
        mtu_bytes=1500, routing="single", workload="allreduce", size_bytes=4096, channels=2,
        warmup=0, iters=5, seed=42, results_dir="out")


def test_repo_scenario():
    config = load_scenario(REPO_SCENARIO)
    assert config == RunConfig(
        name="fattree-allreduce", topology="fattree", topology_params={"k": 4},
        link_rate_mbit=6, mtu_bytes=9000, routing="ecmp", workload="allreduce",
        size_bytes=2 * 1024 * 1024, channels=4, warmup=1, iters=3)
    assert len(config.fabric().hosts) == 16


def test_accepts_a_string_path(tmp_path):
    assert load_scenario(str(write(tmp_path, "iters: 2\n"))).iters == 2


def test_missing_fields_keep_their_defaults(tmp_path):
    assert load_scenario(write(tmp_path, "name: only-a-name\n")) == RunConfig(name="only-a-name")


def test_integer_for_a_float_field(tmp_path):
    config = load_scenario(write(tmp_path, "link_rate_mbit: 7\n"))
    assert config.link_rate_mbit == 7


def test_unknown_field(tmp_path):
    error = config_error(tmp_path, "name: x\nlink_rate: 6\n")
    assert error.field == "link_rate"
    assert "unknown field" in str(error)
    assert "link_rate_mbit" in str(error)  # the known fields are listed
    assert "topology_params" not in error.problem


def test_topology_params_is_not_a_scenario_field(tmp_path):
    assert config_error(tmp_path, "topology_params: {k: 4}\n").field == "topology_params"


@pytest.mark.parametrize(("text", "field"), [
    ("link_rate_mbit: '6'\n", "link_rate_mbit"),
    ("link_rate_mbit: fast\n", "link_rate_mbit"),
    ("link_rate_mbit: true\n", "link_rate_mbit"),
    ("iters: true\n", "iters"),
    ("iters: 3.0\n", "iters"),
    ("size_bytes: 1e6\n", "size_bytes"),   # YAML 1.1 reads this as a string
    ("channels: [1, 2]\n", "channels"),
    ("routing: 1\n", "routing"),
    ("name: 12\n", "name"),
])
def test_wrong_type_names_the_field(tmp_path, text, field):
    error = config_error(tmp_path, text)
    assert error.field == field
    assert "must be" in error.problem


def test_bad_value_names_the_field(tmp_path):
    assert config_error(tmp_path, "size_bytes: 1023\n").field == "size_bytes"
    assert config_error(tmp_path, "routing: spray\n").field == "routing"


def test_invalid_yaml_names_the_line(tmp_path):
    path = write(tmp_path, "name: x\nchannels: 4\niters: 3: 4\nwarmup: 1\n")
    with pytest.raises(ConfigError) as info:
        load_scenario(path)
    assert info.value.field == str(path)
    assert "not valid YAML at line 3" in str(info.value)


@pytest.mark.parametrize("text", ["- a\n- b\n", "just words\n", "42\n", ""])
def test_non_mapping(tmp_path, text):
    path = write(tmp_path, text)
    with pytest.raises(ConfigError) as info:
        load_scenario(path)
    assert info.value.field == str(path)
    assert "mapping" in info.value.problem


def test_missing_file(tmp_path):
    path = tmp_path / "missing.yaml"
    with pytest.raises(ConfigError) as info:
        load_scenario(path)
    assert info.value.field == str(path)
    assert "cannot read" in info.value.problem


def test_topology_as_a_name(tmp_path):
    config = load_scenario(write(tmp_path, "topology: fattree\n"))
    assert config.topology == "fattree"
    assert config.topology_params == {}
    assert len(config.fabric().hosts) == 16  # the builder's default k=4


def test_topology_as_a_mapping(tmp_path):
    config = load_scenario(write(tmp_path, "topology: {name: fattree, k: 6}\n"))
    assert config.topology == "fattree"
    assert config.topology_params == {"k": 6}
    assert len(config.fabric().hosts) == 54


@pytest.mark.parametrize("text", ["topology: {k: 4}\n", "topology: [fattree]\n",
                                  "topology: 4\n"])
def test_topology_without_a_name(tmp_path, text):
    assert config_error(tmp_path, text).field == "topology"


@pytest.mark.parametrize(("text", "field"), [
    ("topology: {name: fattree, k: 3}\n", "k"),
    ("topology: {name: fattree, k: 0}\n", "k"),
    ("topology: {name: fattree, k: true}\n", "k"),
    ("topology: {name: fattree, k: 4, fabric_rate_mbit: -1}\n", "fabric_rate_mbit"),
    ("topology: {name: fattree, radix: 4}\n", "topology"),
    ("topology: {name: torus, k: 4}\n", "topology"),
])
def test_bad_topology_parameter(tmp_path, text, field):
    assert config_error(tmp_path, text).field == field


@pytest.mark.parametrize("param", ["host_rate_mbit: 10", "mtu_bytes: 1500"])
def test_topology_parameter_that_duplicates_a_run_field(tmp_path, param):
    error = config_error(tmp_path, f"topology: {{name: fattree, k: 4, {param}}}\n")
    assert error.field == f"topology.{param.split(':')[0]}"


def test_file_that_is_not_text(tmp_path):
    path = tmp_path / "binary.yaml"
    path.write_bytes(b"\xff\xfe\x00name: x\n")
    with pytest.raises(ConfigError):
        load_scenario(path)


def test_read_scenario_returns_the_raw_mapping(tmp_path):
    assert read_scenario(write(tmp_path, GOOD))["topology"] == {"name": "fattree", "k": 2}


def test_config_from_dict_does_not_modify_its_input():
    data = {"topology": {"name": "fattree", "k": 2}, "iters": 2}
    config_from_dict(data)
    assert data == {"topology": {"name": "fattree", "k": 2}, "iters": 2}


def test_config_from_dict_names_its_source_in_unknown_field_errors():
    with pytest.raises(ConfigError) as info:
        config_from_dict({"bogus": 1}, "flags")
    assert "unknown field in flags" in str(info.value)
