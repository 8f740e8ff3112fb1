"""Loading a lab folder: what lab.yaml and check.yaml may say, and every problem reported at
once with its file, field and line, nothing run."""
from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from testbed.errors import ConfigError
from testbed.harness.scenario import ScenarioError
from testbed.lab.spec import find_lab, lab_folders, load_lab

SCENARIO = "name: t\nexperiment: allreduce\nlink_rate_mbit: 6\n"
MANIFEST = """\
title: a lab
runs:
  - {name: one, scenario: one.yaml, short: {params.iters: 1}}
  - {name: two, scenario: two.yaml}
"""
CHECKS = """\
items:
  - name: a check by name
    check: data verified on every rank
  - name: a value in a range
    run: two
    value: results.fabric.busbw_fraction_of_link
    min: 0.9
  - name: two runs compared
    values: {a: "one:results.x", b: "two:results.x"}
    expr: a - b
    max: 0.05
"""


def write_lab(root: Path, name: str = "01-test", manifest: str = MANIFEST,
              checks: str | None = CHECKS, scenarios=("one.yaml", "two.yaml")) -> Path:
    folder = root / name
    folder.mkdir(parents=True)
    (folder / "lab.yaml").write_text(manifest)
    if checks is not None:
        (folder / "check.yaml").write_text(checks)
    for scenario in scenarios:
        (folder / scenario).write_text(SCENARIO)
    return folder


def problems(exc: ScenarioError) -> list[str]:
    return [str(p) for p in exc.problems]


def test_a_lab_loads_with_its_runs_and_items(tmp_path):
    lab = load_lab(write_lab(tmp_path))
    assert (lab.number, lab.slug, lab.name, lab.title) == (1, "test", "01-test", "a lab")
    assert [r.name for r in lab.manifest.runs] == ["one", "two"]
    items = lab.checks.items
    assert [lab.run_for(i).name for i in items] == ["one", "two", "one"]
    assert items[1].names == {"value": "results.fabric.busbw_fraction_of_link"}
    assert items[2].other_runs() == {"one", "two"}


def test_labs_are_found_by_number(tmp_path):
    write_lab(tmp_path)
    write_lab(tmp_path, "03-other")
    (tmp_path / "teachers").mkdir()
    (tmp_path / "notes.md").write_text("")
    assert sorted(lab_folders(tmp_path)) == [1, 3]
    assert find_lab(3, tmp_path).slug == "other"
    with pytest.raises(ConfigError, match="no lab 2; labs: 1, 3"):
        find_lab(2, tmp_path)
    with pytest.raises(ConfigError, match="no labs folder"):
        lab_folders(tmp_path / "nowhere")


@pytest.mark.parametrize(("checks", "expected"), [
    ("items:\n  - name: x\n", ["line 2: items.0: give either check"]),
    ("items:\n  - {name: x, check: c, min: 1}\n", ["min, max and by_path bound a value"]),
    ("items:\n  - {name: x, value: a..b, min: 1}\n", ["an empty key in 'a..b'"]),
    ("items:\n  - {name: x, value: a, expr: 'value + y', min: 1}\n", ["unknown name 'y'"]),
    ("items:\n  - {name: x, values: {a: p}}\n", ["values need an expr"]),
    ("items:\n  - {name: x, value: a, by_path: [{when: {ecn_path: red-qdisc}, max: 1}]}\n",
     ["give min or max for the others"]),
    ("items:\n  - {name: x, value: a, min: 1, by_path: [{when: {kernel: x}, max: 1}]}\n",
     ["when: name paths by datapath, ecn_path, tcp_cc, rdma"]),
    ("items:\n  - {name: x, check: c, all: [{check: d}]}\n",
     ["an item with all: states its conditions there, not check"]),
    ("items:\n  - {name: x, check: c, setup: s, colour: red}\n", ["colour: unknown field"]),
    ("items: []\n", ["items: List should have at least 1 item"]),
])
def test_a_malformed_check_file_names_the_field_and_line(tmp_path, checks, expected):
    with pytest.raises(ScenarioError) as info:
        load_lab(write_lab(tmp_path, checks=checks))
    said = "\n".join(problems(info.value))
    for text in expected:
        assert text in said
    assert "check.yaml" in str(info.value)


def test_items_must_name_runs_the_lab_has(tmp_path):
    checks = ("items:\n  - {name: x, run: three, check: c}\n"
              "  - {name: y, values: {a: 'four:results.x'}, expr: a > 1}\n")
    with pytest.raises(ScenarioError) as info:
        load_lab(write_lab(tmp_path, checks=checks))
    assert problems(info.value) == ["items.0.run: no run 'three'; runs: one, two",
                                    "items.1: reads run 'four', which the lab does not run "
                                    "(one, two)"]


@pytest.mark.parametrize(("manifest", "expected"), [
    ("title: t\n", r"give either runs \(scenarios to run\) or replay"),
    ("title: t\nruns: [{name: a, scenario: one.yaml}]\nreplay: w.yaml\n", "give either runs"),
    ("title: t\nruns: [{name: a, scenario: one.yaml}, {name: a, scenario: two.yaml}]\n",
     "run names must differ: a, a"),
    ("title: t\nruns: [{name: A b, scenario: one.yaml}]\n", "runs.0.name"),
])
def test_a_malformed_manifest_is_refused(tmp_path, manifest, expected):
    with pytest.raises(ScenarioError, match=expected):
        load_lab(write_lab(tmp_path, manifest=manifest))


def test_missing_files_are_named(tmp_path):
    with pytest.raises(ScenarioError, match="runs.1.scenario: no file two.yaml in 01-test"):
        load_lab(write_lab(tmp_path, scenarios=("one.yaml",)))
    with pytest.raises(ConfigError, match="check.yaml: missing"):
        load_lab(write_lab(tmp_path, "02-nochecks", checks=None))
    with pytest.raises(ConfigError, match="a lab folder is named NN-slug"):
        load_lab(tmp_path)


def test_a_walkthrough_has_a_replay_file_and_no_check_file(tmp_path):
    folder = write_lab(tmp_path, "00-walk", "title: w\nreplay: steps.yaml\n", None, ())
    with pytest.raises(ScenarioError, match="replay: no file steps.yaml"):
        load_lab(folder)
    (folder / "steps.yaml").write_text(textwrap.dedent("""\
        steps:
          - {shell: testbed status, exit: 0}
        """))
    lab = load_lab(folder)
    assert lab.checks is None and lab.manifest.replay == "steps.yaml"
