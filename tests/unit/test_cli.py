"""The ``testbed`` command on input it must reject before touching the machine, what the flags
make of a scenario, exit statuses, and ``topo``, ``schema``, ``report`` and ``--version``,
which never touch it. ``run_scenario`` is replaced in every test here, so no test can start an
emulation."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from tests.unit.summaries import UNTRUSTED, write_run

import testbed
import testbed.cli
import testbed.harness.run
from testbed.cli import EXIT_OK, EXIT_USAGE, EXIT_VERDICT, main, parse_params
from testbed.errors import ConfigError
from testbed.experiments.registry import EXPERIMENTS, experiment_classes
from testbed.harness.run import Outcome
from testbed.model.verdict import Verdict, at_least

REPO = Path(__file__).resolve().parents[2]
REPO_SCENARIO = REPO / "scenarios" / "fattree-allreduce.yaml"


def fake_summary(resolved, status="complete") -> dict:
    return {"run_id": "r1", "title": "t", "headline": "h", "status": status, "error": None,
            "results_dir": "results/r1", "rows": [], "verdict": None, "link_rate_mbit": 1.0,
            "experiment": resolved.experiment.name}


class Runs(list):
    """The scenarios a test started, and the verdict the fake run gives them."""

    def __init__(self):
        super().__init__()
        self.verdicts = [Verdict(trust=[at_least("cpu", 0.5, 0.1, "")])]


@pytest.fixture(autouse=True)
def no_runs(monkeypatch):
    """Record resolved scenarios instead of running them; their verdict is ``verdicts[0]``."""
    started = Runs()
    verdicts = started.verdicts

    def fake_run(resolved, log=print, progress=None):
        started.append(resolved)
        summary = fake_summary(resolved)
        summary["verdict"] = verdicts[0].to_dict()
        return Outcome(summary, Path("results/r1"), verdicts[0])

    monkeypatch.setattr(testbed.cli, "run_scenario", fake_run)  # where main looks it up
    return started


def error_lines(capsys) -> list[str]:
    """What a command printed on stderr: one or more ``testbed: error:`` lines, no traceback."""
    out, err = capsys.readouterr()
    lines = err.splitlines()
    assert lines and all(line.startswith("testbed: error: ") for line in lines), err
    assert "Traceback" not in err
    return lines


# --- parse_params ------------------------------------------------------------------------------


def test_parse_params_yaml_scalars():
    assert parse_params(["k=4", "rate=10.5", "name=leaf", "on=true", "empty=", "eq=a=b"]) == {
        "k": 4, "rate": 10.5, "name": "leaf", "on": True, "empty": None, "eq": "a=b"}


@pytest.mark.parametrize("item", ["k", "=4", ""])
def test_parse_params_needs_key_and_equals(item):
    with pytest.raises(ConfigError) as info:
        parse_params([item])
    assert info.value.field == item and "expected key=value" in str(info.value)


# --- testbed run: errors before anything runs -----------------------------------------------


@pytest.mark.parametrize(("argv", "words"), [
    (["run", "--rate-mbit", "-1"], "link_rate_mbit: Input should be greater than 0"),
    (["run", "--param", "k=3"], "topology.k: must be an even integer"),
    (["run", "--topology", "nosuch"], "topology.name: unknown family 'nosuch'"),
    (["run", "--routing", "ugal"], "routing: 'ugal' routes dragonfly fabrics only"),
    (["run", "--size-bytes", "1023"], "params.size_bytes: "),
    (["run", "--channels", "0"], "params.channels: "),
    (["run", "--param", "k"], "k: expected key=value"),
    (["run", str(REPO_SCENARIO), "--iters", "0"], "params.iters: "),
    (["run", "--set", "params.nosuch=1"], "params.nosuch: unknown field"),
    (["allreduce", "--size-bytes", "7"], "params.size_bytes"),
])
def test_run_rejects_bad_input_naming_the_field(capsys, no_runs, argv, words):
    assert main(argv) == EXIT_USAGE
    assert any(words in line for line in error_lines(capsys))
    assert no_runs == []


def test_every_problem_is_one_line(capsys, no_runs):
    assert main(["run", "--size-bytes", "1023", "--param", "k=3", "--rate-mbit", "-2"]) == EXIT_USAGE
    lines = error_lines(capsys)
    assert lines[0] == "testbed: error: fattree-allreduce: 3 problems"
    assert len(lines) == 4


def test_missing_scenario(capsys, no_runs, tmp_path):
    assert main(["run", str(tmp_path / "missing.yaml")]) == EXIT_USAGE
    assert "no such scenario file" in error_lines(capsys)[0]


# --- flags and scenario merged ----------------------------------------------------------------


def test_run_merges_flags_over_the_scenario(no_runs):
    assert main(["run", str(REPO_SCENARIO), "--rate-mbit", "8", "--param", "k=2",
                 "--routing", "single", "--iters", "2", "--name", "merged",
                 "--set", "params.channels=3"]) == EXIT_OK
    (resolved,) = no_runs
    s, p = resolved.scenario, resolved.experiment.params
    assert (s.name, s.link_rate_mbit, s.routing) == ("merged", 8.0, "single")
    assert s.topology.params == {"k": 2} and (p.iters, p.channels) == (2, 3)
    assert p.size_bytes == 2 * 1024 * 1024  # from the file


def test_run_without_a_scenario_runs_the_default(no_runs):
    assert main(["run", "--channels", "2"]) == EXIT_OK
    assert no_runs[0].scenario.name == "fattree-allreduce"
    assert no_runs[0].experiment.params.channels == 2


def test_an_experiment_subcommand_builds_its_scenario_from_flags(no_runs):
    assert main(["allreduce", "--size-bytes", "4096", "--iters", "2", "--rate-mbit", "5"]) == 0
    (resolved,) = no_runs
    assert resolved.experiment.name == "allreduce"
    assert resolved.experiment.params.size_bytes == 4096
    assert resolved.experiment.rate_mbit == 5


def test_a_literal_field_takes_its_values_typed_and_refuses_others(no_runs, capsys):
    argv = ["roce-dctcp", "--roce-mtu-bytes", "2048", "--mtu", "9000", "--rate-mbit", "20"]
    assert main(argv) == 0
    assert no_runs[0].experiment.params.roce_mtu_bytes == 2048
    with pytest.raises(SystemExit) as info:
        main(["roce-dctcp", "--roce-mtu-bytes", "3000"])
    assert info.value.code == 2 and "invalid choice" in capsys.readouterr().err


def test_every_experiment_has_a_subcommand_with_help(capsys):
    for name in experiment_classes():
        with pytest.raises(SystemExit) as info:
            main([name, "--help"])
        assert info.value.code == 0
        assert "--accept-untrusted" in capsys.readouterr().out


def test_the_registry_names_every_experiment_folder():
    folders = {p.name for p in (REPO / "testbed" / "experiments").iterdir()
               if (p / "experiment.py").exists()}
    modules = {path.split(":")[0].split(".")[2] for path in EXPERIMENTS.values()}
    assert folders == modules
    assert set(experiment_classes()) == set(EXPERIMENTS)


# --- exit status --------------------------------------------------------------------------------


def test_a_failed_check_exits_1_unless_accepted(no_runs):
    no_runs.verdicts[0] = Verdict([at_least("busbw", 0.5, 0.9, "")],
                                  [at_least("cpu", 0.5, 0.1, "")])
    assert main(["run"]) == EXIT_VERDICT
    assert main(["run", "--accept-failed"]) == EXIT_OK


def test_an_untrusted_run_exits_1_unless_accepted(no_runs):
    no_runs.verdicts[0] = Verdict([], [at_least("delivery", 0.5, 0.85, "")])
    assert main(["run"]) == EXIT_VERDICT
    assert main(["run", "--accept-untrusted"]) == EXIT_OK


def test_a_run_with_nothing_judging_trust_is_not_trusted(no_runs):
    no_runs.verdicts[0] = Verdict()
    assert main(["run"]) == EXIT_VERDICT


# --- topo, schema, report, version ---------------------------------------------------------------


def test_topo_fattree_k4(capsys):
    assert main(["topo", "fattree", "k=4"]) == 0
    out, err = capsys.readouterr()
    rows = {line.split("  ")[0]: line.split() for line in out.splitlines()}
    assert rows["hosts"][1:] == ["16", "(formula:", "16)"]
    assert rows["links"][1:] == ["48", "(formula:", "48)"]


def test_topo_errors_name_the_parameter(capsys):
    assert main(["topo", "fattree", "k=3"]) == EXIT_USAGE
    assert error_lines(capsys)[0].startswith("testbed: error: k: must be an even integer")


@pytest.mark.parametrize(("suffix", "magic"), [("png", b"\x89PNG"), ("svg", b"<?xml"),
                                               ("pdf", b"%PDF")])
def test_topo_draw_writes_the_format_the_suffix_names(capsys, tmp_path, suffix, magic):
    target = tmp_path / f"t.{suffix}"
    assert main(["topo", "spineleaf", "leaves=2", "--draw", str(target)]) == 0
    assert target.read_bytes().startswith(magic)


def test_topo_draw_refuses_an_unknown_suffix(capsys, tmp_path):
    assert main(["topo", "spineleaf", "--draw", str(tmp_path / "t.jpg")]) == EXIT_USAGE
    assert "cannot draw jpg" in error_lines(capsys)[0]


def test_topo_json_into_a_closed_pipe_ends_quietly():
    """`testbed topo ... --json | head -1`: no BrokenPipe traceback, exit 0."""
    proc = subprocess.run(f"{sys.executable} -m testbed topo fattree k=8 --json | head -1",
                          shell=True, capture_output=True, text=True, check=False)
    assert proc.stdout == "{\n" and "Traceback" not in proc.stderr, proc.stderr


def test_schema_prints_json(capsys):
    assert main(["schema"]) == 0
    assert "allreduce" in json.loads(capsys.readouterr().out)["properties"]["experiment"]["enum"]


def test_schema_summary_prints_the_summary_json_schema(capsys):
    assert main(["schema", "--summary"]) == EXIT_OK
    schema = json.loads(capsys.readouterr().out)
    assert schema["title"] == "summary.json" and "RunSummary" in schema["$defs"]


def test_version_names_the_version_and_commit(capsys):
    with pytest.raises(SystemExit) as info:
        main(["--version"])
    assert info.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith(f"testbed {testbed.__version__}")
    assert "(commit " in out  # this is a git checkout


def test_report_compares_runs(capsys, tmp_path):
    for name, measured in (("a", 0.95), ("b", 0.5)):
        write_run(tmp_path / name, checks=[at_least("busbw", measured, 0.9, "fraction")])
    assert main(["report", str(tmp_path / "a"), str(tmp_path / "b")]) == 0
    out = capsys.readouterr().out
    assert "0.95 PASS" in out and "0.5 FAIL" in out


def test_report_gates_on_every_run_passing_when_asked(capsys, tmp_path):
    good = write_run(tmp_path / "good", checks=[at_least("busbw", 0.95, 0.9, "fraction")])
    failed = write_run(tmp_path / "failed", checks=[at_least("busbw", 0.5, 0.9, "fraction")])
    untrusted = write_run(tmp_path / "untrusted", trust=UNTRUSTED)
    stopped = write_run(tmp_path / "stopped", status="failed", error="no fabric")
    assert main(["report", str(good), "--require-pass"]) == EXIT_OK
    assert main(["report", str(good), str(failed)]) == EXIT_OK  # no gate asked for
    capsys.readouterr()
    for bad, why in ((failed, "check failed: busbw"), (untrusted, "emulator not trusted"),
                     (stopped, "failed: no fabric")):
        assert main(["report", str(good), str(bad), "--require-pass"]) == EXIT_VERDICT
        out = capsys.readouterr().out
        assert f"not passed: run {bad.name}" in out and why in out


def test_report_refuses_a_summary_of_a_newer_schema_in_one_line(capsys, tmp_path):
    run = write_run(tmp_path / "new")
    summary = json.loads((run / "summary.json").read_text())
    (run / "summary.json").write_text(json.dumps({**summary, "schema_version": 99}))
    assert main(["report", str(run)]) == EXIT_USAGE
    (line,) = error_lines(capsys)
    assert "schema version 99; this testbed reads versions 1, 2" in line


def test_no_command_is_a_one_line_usage_error(capsys):
    with pytest.raises(SystemExit) as info:
        main([])
    assert info.value.code == EXIT_USAGE
    err = capsys.readouterr().err
    assert err.startswith("testbed: error: ") and err.count("\n") == 1
