"""The ``testbed`` command on input it must reject before touching the machine, and ``topo``,
which never touches it. ``run_experiment`` is replaced in every test here, so no test can start
an emulation."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

import testbed.experiments.allreduce.report
import testbed.experiments.allreduce.run
from testbed.cli import SCENARIO_FLAGS, main, parse_params
from testbed.errors import ConfigError
from testbed.experiments.allreduce.run import RunConfig

REPO = Path(__file__).resolve().parents[2]
REPO_SCENARIO = REPO / "scenarios" / "fattree-allreduce.yaml"
USAGE_ERROR_STATUS = 2


@pytest.fixture(autouse=True)
def no_experiments(monkeypatch):
    """Record configs instead of running them."""
    started: list[RunConfig] = []

    def fake_run(config, log=print):
        started.append(config)
        return {"workload": {"verified": True}}

    monkeypatch.setattr(testbed.experiments.allreduce.run, "run_experiment", fake_run)
    monkeypatch.setattr(testbed.experiments.allreduce.report, "format_summary", lambda summary: "SUMMARY TABLE")
    return started


def one_line_error(capsys) -> str:
    out, err = capsys.readouterr()
    assert out == ""
    lines = err.splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("testbed: error: ")
    return lines[0]


# --- parse_params ------------------------------------------------------------------------------


def test_parse_params_yaml_scalars():
    assert parse_params(["k=4", "rate=10.5", "name=leaf", "on=true", "empty=", "eq=a=b"]) == {
        "k": 4, "rate": 10.5, "name": "leaf", "on": True, "empty": None, "eq": "a=b"}


def test_parse_params_empty_and_last_wins():
    assert parse_params([]) == {}
    assert parse_params(["k=4", "k=6"]) == {"k": 6}


@pytest.mark.parametrize("item", ["k", "=4", ""])
def test_parse_params_needs_key_and_equals(item):
    with pytest.raises(ConfigError) as info:
        parse_params([item])
    assert info.value.field == item
    assert "expected key=value" in str(info.value)


@pytest.mark.parametrize("item", ["k=@", "k=[4", "k='4"])
def test_parse_params_invalid_yaml_value_is_a_config_error(item):
    with pytest.raises(ConfigError):
        parse_params([item])


def test_topo_with_unparsable_value_is_a_usage_error(capsys):
    assert main(["topo", "fattree", "k=@"]) == USAGE_ERROR_STATUS


# --- errors before anything runs ----------------------------------------------------------------


def test_run_negative_rate(capsys, no_experiments):
    assert main(["run", "--rate-mbit", "-1"]) == USAGE_ERROR_STATUS
    line = one_line_error(capsys)
    assert "link_rate_mbit" in line and "-1" in line
    assert no_experiments == []


def test_run_missing_scenario(capsys, no_experiments, tmp_path):
    missing = tmp_path / "missing.yaml"
    assert main(["run", str(missing)]) == USAGE_ERROR_STATUS
    line = one_line_error(capsys)
    assert str(missing) in line and "cannot read" in line
    assert no_experiments == []


@pytest.mark.parametrize(("argv", "words"), [
    (["run", "--param", "k=3"], "k: "),
    (["run", "--topology", "nosuch"], "topology: "),
    (["run", "--routing", "x"], "routing: "),
    (["run", "--routing", "ugal"], "routing: 'ugal' routes dragonfly fabrics only"),
    (["run", "--size-bytes", "1023"], "size_bytes: "),
    (["run", "--channels", "0"], "channels: "),
    (["run", "--param", "k"], "k: expected key=value"),
    (["run", str(REPO_SCENARIO), "--iters", "0"], "iters: "),
])
def test_run_rejects_bad_flags(capsys, no_experiments, argv, words):
    assert main(argv) == USAGE_ERROR_STATUS
    assert words in one_line_error(capsys)
    assert no_experiments == []


def test_run_bad_scenario_field(capsys, no_experiments, tmp_path):
    path = tmp_path / "s.yaml"
    path.write_text("iters: many\n")
    assert main(["run", str(path)]) == USAGE_ERROR_STATUS
    assert "iters: must be int" in one_line_error(capsys)
    assert no_experiments == []


def test_topo_odd_k(capsys):
    assert main(["topo", "fattree", "k=3"]) == USAGE_ERROR_STATUS
    line = one_line_error(capsys)
    assert line.startswith("testbed: error: k: must be an even integer")


def test_topo_unknown_name(capsys):
    assert main(["topo", "nosuch"]) == USAGE_ERROR_STATUS
    line = one_line_error(capsys)
    assert line.startswith("testbed: error: topology: unknown topology 'nosuch'")


def test_topo_unknown_parameter(capsys):
    assert main(["topo", "fattree", "radix=4"]) == USAGE_ERROR_STATUS
    assert "radix" in one_line_error(capsys)


# --- flags and scenario merged into one config --------------------------------------------------


def test_run_merges_flags_over_the_scenario(capsys, no_experiments):
    status = main(["run", str(REPO_SCENARIO), "--rate-mbit", "8", "--param", "k=2",
                   "--routing", "single", "--iters", "2", "--name", "merged"])
    assert status == 0
    assert no_experiments == [RunConfig(
        name="merged", topology="fattree", topology_params={"k": 2}, link_rate_mbit=8.0,
        mtu_bytes=9000, routing="single", workload="allreduce", size_bytes=2 * 1024 * 1024,
        channels=4, warmup=1, iters=2)]
    assert "SUMMARY TABLE" in capsys.readouterr().out


def test_run_with_flags_only_uses_defaults(no_experiments):
    assert main(["run", "--channels", "2"]) == 0
    assert no_experiments == [RunConfig(channels=2)]


def test_run_same_topology_flag_keeps_the_scenarios_parameters(no_experiments, tmp_path):
    path = tmp_path / "s.yaml"
    path.write_text("topology: {name: fattree, k: 2}\n")
    assert main(["run", str(path), "--topology", "fattree"]) == 0
    assert no_experiments[0].topology_params == {"k": 2}


def test_run_other_topology_starts_from_its_own_parameters(no_experiments, capsys, tmp_path):
    path = tmp_path / "s.yaml"
    path.write_text("topology: {name: fattree, k: 3}\n")  # k=3 would be rejected if kept
    assert main(["run", str(path), "--topology", "nosuch"]) == USAGE_ERROR_STATUS
    assert "unknown topology 'nosuch'" in one_line_error(capsys)


def test_run_exit_status_follows_verification(monkeypatch, capsys):
    monkeypatch.setattr(testbed.experiments.allreduce.run, "run_experiment",
                        lambda config, log=print: {"workload": {"verified": False}})
    assert main(["run", str(REPO_SCENARIO)]) == 1


def test_every_scenario_flag_maps_to_a_config_field():
    assert set(SCENARIO_FLAGS.values()) <= set(RunConfig.__dataclass_fields__)


# --- topo --------------------------------------------------------------------------------------


def test_topo_fattree_k4(capsys):
    assert main(["topo", "fattree", "k=4"]) == 0
    out, err = capsys.readouterr()
    assert err == ""
    rows = {line.split("  ")[0]: line.split() for line in out.splitlines()}
    assert rows["hosts"][1:] == ["16", "(formula:", "16)"]
    assert rows["switches"][1:] == ["20", "(formula:", "20)"]
    assert rows["links"][1:] == ["48", "(formula:", "48)"]
    assert out.splitlines()[5].split()[-3:] == ["4", "(formula:", "4)"]


def test_topo_fattree_k4_json(capsys):
    assert main(["topo", "fattree", "k=4", "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["topology"] == "fattree"
    assert info["params"]["k"] == 4
    assert (info["hosts"], info["switches"], info["links"]) == (16, 20, 48)
    assert info["equal_cost_paths"] == 4
    assert info["formula"] == {"hosts": 16, "switches": 20, "links": 48, "equal_cost_paths": 4,
                               "switch_links": 32, "max_switch_ports": 4,
                               "max_switch_hops_between_hosts": 4,
                               "bisection_bandwidth_mbit": 800.0}
    assert info["switches_by_role"] == {"core": 4, "aggregation": 8, "edge": 8}
    assert info["bisection_bandwidth_mbit"] == 800.0
    assert info["oversubscription"] is None


def test_topo_default_k_and_rate_parameter(capsys):
    assert main(["topo", "fattree", "host_rate_mbit=25", "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["params"] == {"k": 4, "host_rate_mbit": 25, "fabric_rate_mbit": 25}


def test_topo_draw_writes_the_default_png(capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main(["topo", "spineleaf", "leaves=2", "--draw"]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[-1] == "drawing: results/topo-spineleaf.png"
    png = tmp_path / "results" / "topo-spineleaf.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_topo_draw_to_a_path_keeps_json_on_stdout(capsys, tmp_path):
    target = tmp_path / "sub" / "df.png"
    assert main(["topo", "dragonfly", "--json", "--draw", str(target)]) == 0
    out, err = capsys.readouterr()
    assert json.loads(out)["hosts"] == 72
    assert err == f"drawing: {target}\n"
    assert target.stat().st_size > 10_000


def test_topo_draw_swallowing_a_parameter_is_a_usage_error(capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main(["topo", "fattree", "--draw", "k=4"]) == USAGE_ERROR_STATUS
    assert "--draw: expected a PNG path, got 'k=4'" in one_line_error(capsys)
    assert not (tmp_path / "results").exists()


def test_no_command_is_a_one_line_usage_error(capsys):
    with pytest.raises(SystemExit) as info:
        main([])
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("testbed: error: ") and err.count("\n") == 1
    assert "command" in err


def test_bad_flag_type_is_a_one_line_error_naming_the_flag(capsys):
    with pytest.raises(SystemExit) as info:
        main(["run", "--rate-mbit", "abc"])
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--rate-mbit" in err and "'abc'" in err
