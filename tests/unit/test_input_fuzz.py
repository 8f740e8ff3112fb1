"""Property-based fuzzing of everything a user hands the testbed: scenario files (as data and as
raw text), the flags of ``testbed run`` and of every experiment command, ``testbed topo``'s
parameters and ``testbed report``'s summary.json.

Whatever the input, the command line must answer with an exit status and never a traceback:
0 when the input is valid (the run itself is replaced by a stand-in, so nothing is built), 2
with one ``testbed: error:`` line per problem naming the field or flag (for report, the file
and the problem), never 4 (an internal error). Every example runs as an ordinary user, in an
empty working folder, with the testbed's state, cache and calibration paths pointing into
empty folders, and all of them must still be empty afterwards: validation creates nothing.

How many examples: tests/unit/conftest.py registers the profiles (``ci``, the default, and a
longer ``nightly`` one chosen by TESTBED_FUZZ_PROFILE=nightly)."""
from __future__ import annotations

import contextlib
import io
import json
import os
import tempfile
from pathlib import Path

import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st
from tests.unit.summaries import run_summary

import testbed.cli
import testbed.harness.run
from testbed.capabilities import detect
from testbed.cli import EXIT_OK, EXIT_USAGE, EXIT_VERDICT, main
from testbed.errors import shown
from testbed.experiments.registry import experiment_classes
from testbed.harness.scenario import SCENARIO_DIR
from testbed.model.topology import BUILDERS, parameters
from testbed.model.verdict import at_least

PLATFORM = detect()  # the machine does not change between examples; detect once
BASE_SCENARIO = yaml.safe_load((SCENARIO_DIR / "fattree-allreduce.yaml").read_text())
PREFIX = "testbed: error: "


class Answer:
    """What one command printed and how it exited."""

    def __init__(self, code: int, out: str, err: str, ran: list):
        self.code, self.out, self.err, self.ran = code, out, err, ran

    @property
    def lines(self) -> list[str]:
        return self.err.splitlines()


def refuse(*args, **kwargs):
    raise AssertionError("validation went on to build something")


def run_cli(argv: list[str]) -> Answer:
    """``testbed ARGV`` in-process as an ordinary user, in empty folders, with the run
    replaced by a stand-in; asserts nothing was created and no traceback was printed."""
    ran: list = []
    with tempfile.TemporaryDirectory() as top, pytest.MonkeyPatch.context() as mp:
        watched = {name: Path(top) / name for name in ("cwd", "state", "cache", "home")}
        for folder in watched.values():
            folder.mkdir()
        mp.chdir(watched["cwd"])
        mp.setenv("TESTBED_STATE_DIR", str(watched["state"]))
        mp.setenv("TESTBED_CACHE_DIR", str(watched["cache"]))
        mp.setenv("TESTBED_CALIBRATION", str(watched["state"] / "calibration.json"))
        mp.setenv("HOME", str(watched["home"]))
        mp.setattr(os, "geteuid", lambda: 1000)
        mp.setattr("testbed.capabilities.detect", lambda: PLATFORM)
        mp.setattr(testbed.cli, "execute", lambda resolved, args: ran.append(resolved) or 0)
        for target in ("RunLock", "bring_up", "machine"):
            mp.setattr(testbed.harness.run, target, refuse)
        out, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                code = main(argv)
            except SystemExit as exit_:  # argparse: usage errors, --help
                code = exit_.code if isinstance(exit_.code, int) else EXIT_USAGE
        made = {name: sorted(p.name for p in folder.iterdir())
                for name, folder in watched.items() if any(folder.iterdir())}
    answer = Answer(code, out.getvalue(), err.getvalue(), ran)
    assert "Traceback" not in answer.err, answer.err
    assert made == {}, f"{argv!r} created {made}"
    return answer


def assert_usage(answer: Answer, *names: str) -> None:
    """Exit 2, every line a ``testbed: error:`` line, and one of ``names`` (a field or a
    flag) in what was said."""
    assert answer.code == EXIT_USAGE, (answer.code, answer.err)
    assert answer.lines and all(line.startswith(PREFIX) for line in answer.lines), answer.err
    named = [name for name in names if name]  # an empty one would match anything
    assert any(name in answer.err for name in named), (names, answer.err)


def assert_valid_or_usage(answer: Answer, *names: str) -> None:
    """Either the input was valid (the stand-in ran, exit 0) or it was refused naming one of
    ``names``."""
    if answer.code == EXIT_OK and answer.ran:
        return
    assert_usage(answer, *names)


# --- values of every kind --------------------------------------------------------------------

scalars = (st.none() | st.booleans() | st.integers(-10**6, 10**6) | st.integers()
           | st.floats(allow_nan=True, allow_infinity=True) | st.text(max_size=20)
           | st.sampled_from(["yes", "no", "on", "1e9", ".nan", "2024-01-01", "0x10", "010",
                              "", "~", "p0e0h0", "x; rm -rf /", "$(id)", "a\nb", "café"]))
values = st.recursive(scalars, lambda inner: st.lists(inner, max_size=3)
                      | st.dictionaries(st.text(max_size=8), inner, max_size=3), max_leaves=6)
# Counts a topology takes: small enough to build fast when valid, with the edges around them.
counts = st.integers(-3, 12)

SCENARIO_FIELDS = ["name", "description", "experiment", "topology", "topology.name",
                   "topology.k", "link_rate_mbit", "mtu_bytes", "routing", "queue",
                   "queue.buffer_bytes", "queue.classes", "queue.ecn", "queue.pfc",
                   "queue.path", "queue.sample_ms", "hosts", "hosts.tcp_cc", "hosts.tcp_ecn",
                   "anycast", "failures", "impairments", "params", "params.size_bytes",
                   "params.channels", "params.warmup", "params.iters", "seed", "results_dir",
                   "unknown_field"]


def with_field(data: dict, dotted: str, value) -> dict:
    """A copy of ``data`` with the dotted field set to ``value`` (parents made mappings)."""
    data = json.loads(json.dumps(data))
    target = data
    *parents, last = dotted.split(".")
    for key in parents:
        if not isinstance(target.get(key), dict):
            target[key] = {}
        target = target[key]
    target[last] = value
    return data


def scenario_file(folder: Path, text: str) -> Path:
    path = folder / "scenario.yaml"
    path.write_text(text, encoding="utf-8")
    return path


# --- the scenario schema ----------------------------------------------------------------------


@given(field=st.sampled_from(SCENARIO_FIELDS), value=values | counts)
def test_a_scenario_with_any_value_in_any_field(field, value):
    data = with_field(BASE_SCENARIO, field, value)
    with tempfile.TemporaryDirectory() as inputs:
        path = scenario_file(Path(inputs), yaml.safe_dump(data, allow_unicode=True))
        answer = run_cli(["run", str(path)])
    if field == "experiment":  # another experiment finds the params of this one wrong
        assert_valid_or_usage(answer, "experiment", "params")
    else:
        assert_valid_or_usage(answer, field.split(".")[0])


yaml_pieces = st.sampled_from([
    "name: x\n", "a: &a [1, 2]\n", "b: *a\n", "c: {<<: *a}\n", "- 1\n", "? [a]\n: b\n",
    "k: !!binary aGk=\n", "k: !!python/object:os.system {}\n", "&x [*x]\n", "[[[[[[[[",
    "}\n", "'\n", '"\\u0000"\n', "\t\n", "---\n", "...\n", "%YAML 1.1\n", "k: 1e400\n",
    "k: " + "9" * 5000 + "\n", "name: fattree-allreduce\nparams: {iters: yes}\n",
    "topology: {name: fattree, k: 1000000}\n", "link_rate_mbit: .inf\n", "\x00", "\ufeff",
])


@given(st.lists(yaml_pieces | st.text(max_size=30), max_size=8).map("".join))
def test_any_text_as_a_scenario_file(text):
    with tempfile.TemporaryDirectory() as inputs:
        path = scenario_file(Path(inputs), text)
        answer = run_cli(["run", str(path)])
    if answer.code != EXIT_OK:
        assert_usage(answer, str(path))


# --- the flags of `testbed run` and of every experiment command ------------------------------

RUN_FLAGS = ["--set", "--topology", "--param", "--rate-mbit", "--mtu", "--routing",
             "--size-bytes", "--iters", "--warmup", "--channels", "--seed", "--results",
             "--name"]
flag_text = st.text(max_size=12) | st.sampled_from(["-1", "0", "1e9", "nan", "inf", "yes",
                                                    "ture", "p0e0h0", "$(id)", "a\nb", "1,2"])
dotted_keys = st.sampled_from(SCENARIO_FIELDS) | st.text(max_size=10)


@st.composite
def run_flag(draw) -> tuple[str, str, list[str]]:
    """One flag of ``testbed run`` with a value of any kind: (flag, what names it, argv)."""
    flag = draw(st.sampled_from(RUN_FLAGS))
    if flag in ("--set", "--param"):
        key = draw(dotted_keys if flag == "--set" else st.sampled_from(["k", "radix", ""])
                   | st.text(max_size=6))
        value = draw(flag_text | counts.map(str))
        return flag, f"{flag} {key}" if key else flag, [f"{flag}={key}={value}"]
    if flag == "--topology":  # a family and its parameters come from flags alone
        return flag, flag, [f"--topology={draw(flag_text | st.sampled_from(sorted(BUILDERS)))}"]
    return flag, flag, [f"{flag}={draw(flag_text)}"]


@given(run_flag(), st.sampled_from([[], ["fattree-allreduce"], ["incast"]]))
def test_run_with_any_flag_value(flag_case, scenario):
    flag, named, argv = flag_case
    answer = run_cli(["run", *scenario, *argv])
    if flag in ("--set", "--topology"):  # a field it sets may make others wrong
        assert_valid_or_usage(answer, flag, "line ")
    else:
        assert_valid_or_usage(answer, flag, named)


def experiment_flags() -> list[tuple[str, str, str]]:
    """(experiment, flag, field) for every flag of every experiment command."""
    cases = []
    for name, cls in sorted(experiment_classes().items()):
        for field in cls.Params.model_fields:
            cases.append((name, "--" + field.replace("_", "-"), f"params.{field}"))
        for flag in ("--rate-mbit", "--mtu", "--results", "--name", "--seed"):
            cases.append((name, flag, flag))
    return cases


BASELINES: dict[str, Answer] = {}


def baseline(experiment: str) -> Answer:
    """The experiment command without flags (some need what only a scenario gives)."""
    if experiment not in BASELINES:
        BASELINES[experiment] = run_cli([experiment])
    return BASELINES[experiment]


@given(st.sampled_from(experiment_flags()), flag_text)
def test_every_experiment_flag_with_any_value(case, value):
    experiment, flag, field = case
    answer = run_cli([experiment, f"{flag}={value}"])
    if answer.code == EXIT_USAGE and answer.err == baseline(experiment).err:
        return  # refused for what the flag does not touch, as without it
    # a value checked against the experiment's other parameters names the parameters
    assert_valid_or_usage(answer, flag, field, "params")


# --- testbed topo ------------------------------------------------------------------------------


@st.composite
def topo_argv(draw) -> tuple[list[str], list[str]]:
    """``topo FAMILY key=value ...``: (argv, the names an error may name)."""
    family = draw(st.sampled_from(sorted(BUILDERS)) | st.text(max_size=8))
    known = list(parameters(BUILDERS[family], {})) if family in BUILDERS else []
    keys = draw(st.lists(st.sampled_from(known) | st.text(max_size=6) if known
                         else st.text(max_size=6), max_size=3, unique=True))
    items = [f"{key}={draw(counts.map(str) | flag_text)}" for key in keys]
    # a family that looks like an option leaves argparse without the positional ``name``
    return ["topo", family, *items], ["topology", "name", family, *keys, *map(shown, keys),
                                      *(shown(item) for item in items)]


@given(topo_argv())
def test_topo_with_any_parameters(case):
    argv, names = case
    answer = run_cli(argv)
    if answer.code != EXIT_OK:
        assert_usage(answer, *names)


# --- testbed report ------------------------------------------------------------------------------


def a_summary() -> dict:
    return run_summary(checks=[at_least("busbw", 0.95, 0.9, "")],
                       rows=[("busbw", "1", {"name": "busbw", "value": 1, "unit": "Mbit/s"})])


SUMMARY_FIELDS = ["schema_version", "kind", "run_id", "title", "headline", "status", "error",
                  "results_dir", "experiment", "link_rate_mbit", "rows", "rows.0",
                  "rows.0.numbers.0.value", "verdict", "verdict.checks", "verdict.checks.0",
                  "verdict.checks.0.name", "verdict.checks.0.measured", "verdict.counts",
                  "verdict.emulator_trusted", "verdict.reasons", "provenance", "plots"]


def set_path(data, dotted: str, value):
    """``data`` with the field at ``dotted`` (list indices as numbers) replaced."""
    *parents, last = dotted.split(".")
    target = data
    for key in parents:
        target = target[int(key)] if isinstance(target, list) else target[key]
    if isinstance(target, list):
        target[int(last)] = value
    else:
        target[last] = value
    return data


json_values = st.recursive(st.none() | st.booleans() | st.integers() | st.text(max_size=12)
                           | st.floats(allow_nan=False, allow_infinity=False),
                           lambda inner: st.lists(inner, max_size=3)
                           | st.dictionaries(st.text(max_size=6), inner, max_size=3),
                           max_leaves=6)
summary_texts = (
    st.builds(lambda field, value: json.dumps(set_path(a_summary(), field, value)),
              st.sampled_from(SUMMARY_FIELDS), json_values)
    | json_values.map(json.dumps)
    | st.builds(lambda cut: json.dumps(a_summary())[:cut], st.integers(0, 400))
    | st.text(max_size=40)
    | st.sampled_from(["[" * 50_000, '{"schema_version": ' + "9" * 5000 + "}", "\ufeff{}",
                       '{"schema_version": true}', '{"schema_version": 1.0}']))


@given(summary_texts, st.booleans())
def test_report_on_any_summary(text, name_the_file):
    with tempfile.TemporaryDirectory() as inputs:
        folder = Path(inputs) / "run"
        folder.mkdir()
        (folder / "summary.json").write_text(text, encoding="utf-8")
        target = folder / "summary.json" if name_the_file else folder
        answer = run_cli(["report", str(target)])
        assert sorted(p.name for p in folder.iterdir()) == ["summary.json"]
    if answer.code in (EXIT_OK, EXIT_VERDICT):
        return
    assert_usage(answer, str(folder / "summary.json"))
    assert len(answer.lines) == 1, answer.err
