"""What the command line answers to bad input, to a machine it cannot run on and to its own
bugs: one line and exit 2 for the first two (nothing made), a code of its own for the last."""
from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest
from tests.unit.summaries import UNTRUSTED, run_summary
from tests.unit.test_cli import error_lines

import testbed.cli
import testbed.harness.run
from testbed.cli import EXIT_INTERNAL, EXIT_OK, EXIT_USAGE, EXIT_VERDICT, main
from testbed.harness.summary_schema import READABLE_VERSIONS
from testbed.harness.yaml_input import MAX_BYTES
from testbed.model.verdict import at_least

FAST_S = 1.0


def one_error(capsys) -> str:
    lines = error_lines(capsys)
    assert len(lines) == 1, lines
    return lines[0]


@pytest.fixture
def runs_refused(monkeypatch):
    """Fail the test if anything would be built: the run lock, the fabric, a holder."""
    def refuse(*args, **kwargs):
        raise AssertionError("validation went on to build something")

    monkeypatch.setattr(testbed.harness.run, "RunLock", refuse)
    monkeypatch.setattr(testbed.harness.run, "bring_up", refuse)
    monkeypatch.setattr("testbed.interactive.session.start_holder", refuse)


@pytest.fixture
def no_runs(monkeypatch):
    """Record resolved scenarios instead of running them."""
    started = []

    def record(resolved, args):
        started.append(resolved)
        return EXIT_OK

    monkeypatch.setattr(testbed.cli, "execute", record)
    return started


# --- scenario values: precise messages ---------------------------------------------------------


@pytest.mark.parametrize(("text", "words"), [
    ("link_rate_mbit: 1e9", "link_rate_mbit: Input should be less than or equal to 10000, "
                            "got 1000000000.0"),
    ("link_rate_mbit: .nan", "link_rate_mbit: Input should be a finite number"),
    ("link_rate_mbit: -.inf", "link_rate_mbit: Input should be a finite number"),
    ("params: {iters: yes}", "params.iters: Input should be a valid integer, got 'yes'"),
    ("seed: 2024-01-01", "seed: Input should be a valid integer, got '2024-01-01'"),
])
def test_a_bad_value_is_named_as_written(tmp_path, capsys, no_runs, text, words):
    path = tmp_path / "s.yaml"
    path.write_text(f"name: s\n{text}\n")
    assert main(["run", str(path)]) == EXIT_USAGE
    line = one_error(capsys)
    assert words in line and "line 2" in line
    assert no_runs == []


def test_a_name_with_a_non_ascii_letter_says_ascii(tmp_path, capsys, no_runs):
    path = tmp_path / "s.yaml"
    path.write_text("name: café\n")
    assert main(["run", str(path)]) == EXIT_USAGE
    line = one_error(capsys)
    assert "name: must be ASCII letters" in line and "got 'café'" in line


def test_an_alias_bomb_is_refused_in_well_under_a_second(tmp_path, capsys, runs_refused):
    lines = ["a0: &a0 [lol, lol, lol, lol, lol, lol, lol, lol, lol]"]
    lines += [f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 9)}]" for i in range(1, 9)]
    path = tmp_path / "bomb.yaml"
    path.write_text("\n".join(["name: bomb", *lines]) + "\n")
    t0 = time.monotonic()
    assert main(["run", str(path)]) == EXIT_USAGE
    assert time.monotonic() - t0 < FAST_S
    assert "alias" in one_error(capsys)


def test_a_file_beyond_the_size_bound_is_refused_unread(tmp_path, capsys, runs_refused):
    path = tmp_path / "big.yaml"
    with path.open("w") as f:
        f.write("name: big\n")
        f.truncate(64 * 1024 * 1024)  # sparse: reading it would take seconds
    t0 = time.monotonic()
    assert main(["run", str(path)]) == EXIT_USAGE
    assert time.monotonic() - t0 < FAST_S
    assert f"at most {MAX_BYTES}" in one_error(capsys)


def test_what_is_not_a_regular_file_is_refused_unread(capsys, runs_refused):
    assert main(["run", "/dev/zero"]) == EXIT_USAGE
    assert "not a regular file" in one_error(capsys)


# --- flags: strict, and named in their errors ------------------------------------------------


@pytest.mark.parametrize("value", ["ture", "2", "", "y e s"])
def test_a_boolean_flag_takes_true_or_false_only(capsys, no_runs, value):
    with pytest.raises(SystemExit) as info:
        main(["incast", "--capture-pauses", value])
    assert info.value.code == EXIT_USAGE
    assert "--capture-pauses" in one_error(capsys)
    assert no_runs == []


@pytest.mark.parametrize(("value", "expected"), [("true", True), ("False", False),
                                                 ("yes", True), ("0", False)])
def test_a_boolean_flag_reads_its_spellings(no_runs, value, expected):
    assert main(["incast", "--capture-pauses", value, "--modes", "pfc"]) == EXIT_OK
    assert no_runs[0].experiment.params.capture_pauses is expected


@pytest.mark.parametrize(("argv", "flag"), [
    (["run", "incast", "--rate-mbit", "-1"], "--rate-mbit"),
    (["incast", "--rate-mbit", "-1"], "--rate-mbit"),
    (["run", "incast", "--set", "params.rounds=0"], "--set params.rounds"),
    (["incast", "--rounds", "0"], "--rounds"),
    (["run", "--param", "k=3"], "--param k"),
    (["run", "--mtu", "100"], "--mtu"),
    (["run", "--name", "a b"], "--name"),
])
def test_an_error_in_a_flag_names_the_flag_not_a_line_of_the_file(capsys, no_runs, argv,
                                                                   flag):
    assert main(argv) == EXIT_USAGE
    line = one_error(capsys)
    assert flag in line and "line " not in line


# --- topo ----------------------------------------------------------------------------------------


def test_topo_lists_the_family_parameters_for_an_unknown_one(capsys):
    assert main(["topo", "fattree", "foo=1"]) == EXIT_USAGE
    line = one_error(capsys)
    assert "foo: not a parameter of fattree; valid: k," in line
    assert "unexpected keyword" not in line


@pytest.mark.parametrize(("argv", "field"), [
    (["topo", "line", "switches=3", "host_rate_mbit=abc"], "host_rate_mbit"),
    (["topo", "spineleaf", "leaves=[1]"], "leaves"),
    (["topo", "clos", "stages={a: 1}"], "stages"),
    (["topo", "dragonfly", "g=yes"], "g"),
])
def test_topo_names_a_parameter_of_the_wrong_type(capsys, argv, field):
    assert main(argv) == EXIT_USAGE
    line = one_error(capsys)
    assert line.startswith(f"testbed: error: {field}: ") and "not supported" not in line


def test_topo_refuses_to_draw_into_a_missing_folder(capsys, tmp_path):
    target = tmp_path / "nonexistent" / "dir" / "x.png"
    assert main(["topo", "spineleaf", "--draw", str(target)]) == EXIT_USAGE
    assert "--draw" in one_error(capsys)
    assert not (tmp_path / "nonexistent").exists()


def test_topo_refuses_an_unwritable_drawing_with_one_line(capsys, tmp_path):
    assert main(["topo", "spineleaf", "--draw", str(tmp_path)]) == EXIT_USAGE
    assert "--draw" in one_error(capsys)


def test_one_mtu_range_for_topologies_and_scenarios(capsys, no_runs):
    from testbed.harness.scenario import Scenario
    from testbed.model.topology.checks import MAX_MTU_BYTES, MIN_MTU_BYTES

    bounds = Scenario.model_json_schema()["properties"]["mtu_bytes"]["anyOf"][0]
    assert (bounds["minimum"], bounds["maximum"]) == (MIN_MTU_BYTES, MAX_MTU_BYTES)
    for mtu in (MIN_MTU_BYTES - 1, MAX_MTU_BYTES + 1):
        assert main(["topo", "fattree", "k=2", f"mtu_bytes={mtu}"]) == EXIT_USAGE
        assert main(["run", "--mtu", str(mtu)]) == EXIT_USAGE
    capsys.readouterr()
    for mtu in (MIN_MTU_BYTES, MAX_MTU_BYTES):
        assert main(["topo", "fattree", "k=2", f"mtu_bytes={mtu}"]) == EXIT_OK
        assert main(["run", "--mtu", str(mtu)]) == EXIT_OK


# --- report -----------------------------------------------------------------------------------


def summary(checks=(), trusted=True, **extra) -> dict:
    """A whole summary of one run (tests.unit.summaries), ``extra`` keys replaced."""
    return {**run_summary(checks=checks, **({} if trusted else {"trust": UNTRUSTED})), **extra}


def with_first_check_named(name) -> dict:
    data = summary([at_least("busbw", 0.95, 0.9, "")])
    data["verdict"]["checks"][0]["name"] = name
    return data


def run_folder(tmp_path: Path, content) -> Path:
    folder = tmp_path / "run"
    folder.mkdir()
    (folder / "summary.json").write_text(content if isinstance(content, str)
                                         else json.dumps(content))
    return folder


@pytest.mark.parametrize(("content", "words"), [
    ('{"run_id": "r1", "verdict": {"che', "not valid JSON"),
    ("\x00\x01garbage", "not valid JSON"),
    ("{}", "schema version None"),
    ("[1, 2]", "not a run summary"),
    ("[" * 100_000, "nested"),
    ('{"schema_version": 1, "run_id": 5}', "run_id"),
    (json.dumps(with_first_check_named(1)), "verdict.checks.0.name"),
])
def test_report_names_the_file_and_the_problem(tmp_path, capsys, content, words):
    folder = run_folder(tmp_path, content)
    assert main(["report", str(folder)]) == EXIT_USAGE
    line = one_error(capsys)
    assert str(folder / "summary.json") in line and words in line


def test_report_refuses_a_schema_version_it_does_not_know(tmp_path, capsys):
    folder = run_folder(tmp_path, summary(schema_version=99))
    assert main(["report", str(folder)]) == EXIT_USAGE
    line = one_error(capsys)
    assert "schema version 99" in line
    assert f"reads versions {', '.join(map(str, READABLE_VERSIONS))}" in line
    assert "with the testbed that wrote it ('0.2.0')" in line


def test_report_takes_the_summary_file_itself(tmp_path, capsys):
    folder = run_folder(tmp_path, summary([at_least("busbw", 0.95, 0.9, "")]))
    assert main(["report", str(folder / "summary.json")]) == EXIT_OK


def test_report_refuses_another_file_with_one_line(tmp_path, capsys):
    other = tmp_path / "notes.txt"
    other.write_text("hello")
    assert main(["report", str(other)]) == EXIT_USAGE
    assert "not a run folder" in one_error(capsys)


def test_report_exits_as_the_run_did(tmp_path, capsys):
    passed = run_folder(tmp_path, summary([at_least("busbw", 0.95, 0.9, "")]))
    assert main(["report", str(passed)]) == EXIT_OK
    failed = tmp_path / "failed"
    failed.mkdir()
    (failed / "summary.json").write_text(json.dumps(summary([at_least("busbw", 0.5, 0.9,
                                                                         "")])))
    assert main(["report", str(failed)]) == EXIT_VERDICT
    untrusted = tmp_path / "untrusted"
    untrusted.mkdir()
    (untrusted / "summary.json").write_text(json.dumps(summary(trusted=False)))
    assert main(["report", str(untrusted)]) == EXIT_VERDICT


def test_report_prints_markup_in_a_summary_as_text(tmp_path, capsys):
    folder = run_folder(tmp_path, summary(run_id="[/bold]", headline="[red]x[/]",
                                          rows=[{"what": "[/]", "text": "[b]", "numbers": []}]))
    assert main(["report", str(folder)]) == EXIT_OK
    out = capsys.readouterr().out
    assert "[/bold]" in out and "[/]" in out


# --- not root, no Mininet ---------------------------------------------------------------------


@pytest.fixture
def not_root(monkeypatch):
    monkeypatch.setattr(os, "geteuid", lambda: 1000)


@pytest.mark.parametrize("argv", [["clean"], ["down"], ["cli"], ["calibrate"],
                                  ["exec", "p0e0h0", "--", "true"], ["up"], ["run"],
                                  ["bench", "--output", "OUT/bench.json"],
                                  ["chaos", "--seed", "1"]])
def test_root_commands_refuse_a_user_with_one_line_and_exit_2(capsys, not_root, runs_refused,
                                                              tmp_path, monkeypatch, argv):
    monkeypatch.chdir(tmp_path)
    assert main(argv) == EXIT_USAGE
    assert "needs root" in one_error(capsys)
    assert list(tmp_path.iterdir()) == []


def test_schema_write_goes_where_the_user_says(capsys, tmp_path):
    target = tmp_path / "schema.json"
    assert main(["schema", "--write", str(target)]) == EXIT_OK
    assert "allreduce" in json.loads(target.read_text())["properties"]["experiment"]["enum"]


def test_schema_write_refuses_an_unwritable_path_with_one_line(capsys, tmp_path):
    assert main(["schema", "--write", str(tmp_path / "missing" / "schema.json")]) == EXIT_USAGE
    assert "--write" in one_error(capsys)
    assert not (tmp_path / "missing").exists()


def test_schema_write_outside_a_checkout_refuses_site_packages(capsys, monkeypatch):
    monkeypatch.setattr(testbed.cli, "checkout_path", lambda path: None)
    assert main(["schema", "--write"]) == EXIT_USAGE
    assert "--write" in one_error(capsys)


def test_without_mininet_a_run_stops_before_the_lock(capsys, monkeypatch, runs_refused,
                                                     tmp_path):
    import sys

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    for name in [m for m in sys.modules if m == "mininet" or m.startswith("mininet.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "mininet", None)  # import mininet raises ImportError
    assert main(["run"]) == EXIT_USAGE
    assert "Mininet" in one_error(capsys)
    assert list(tmp_path.iterdir()) == []


# --- internal errors -----------------------------------------------------------------------------


def broken_doctor(monkeypatch):
    def boom():
        raise RuntimeError("a bug")

    monkeypatch.setattr("testbed.cli.detect", boom)


def test_an_internal_error_has_its_own_exit_code_and_one_line(capsys, monkeypatch):
    broken_doctor(monkeypatch)
    assert main(["doctor"]) == EXIT_INTERNAL
    line = one_error(capsys)
    assert "internal error" in line and "RuntimeError: a bug" in line and "--debug" in line


def test_debug_shows_an_internal_error_traceback(capsys, monkeypatch):
    broken_doctor(monkeypatch)
    assert main(["--debug", "doctor"]) == EXIT_INTERNAL
    err = capsys.readouterr().err
    assert "Traceback (most recent call last)" in err and "RuntimeError: a bug" in err
    assert EXIT_INTERNAL not in (0, 1, 2, 3, 130)
