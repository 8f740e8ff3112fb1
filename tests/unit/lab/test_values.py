"""Paths into a summary and the arithmetic of the checks: what a path reads, how a quoted key,
a position and a filter read, what a malformed path says, and that an expression evaluates
arithmetic, comparisons and a few functions but nothing else."""
from __future__ import annotations

import pytest

from testbed.lab.values import (
    Missing,
    PathError,
    evaluate,
    lookup,
    parse_expression,
    parse_path,
    split_run,
)

SUMMARY = {"results": {"loss-0.01": {"goodput": 18.7},
                       "fabric": {"runs": [{"model": "a", "workers": 2, "eff": 0.9},
                                           {"model": "b", "workers": 2, "eff": 0.5},
                                           {"model": "a", "workers": 8, "eff": 0.7}]}},
           "params": {"stages": 4}}


@pytest.mark.parametrize(("path", "value"), [
    ("params.stages", 4),
    ('results."loss-0.01".goodput', 18.7),
    ("results.fabric.runs[0].eff", 0.9),
    ("results.fabric.runs[-1].workers", 8),
    ("results.fabric.runs[model=a][-1].eff", 0.7),
    ("results.fabric.runs[model=a,workers=2][0].eff", 0.9),
    ("results.fabric.runs[model=c]", []),
    ("run-1:params.stages", 4),  # a run prefix is left to the caller
])
def test_paths_read_keys_positions_and_filters(path, value):
    assert lookup(SUMMARY, path) == value


@pytest.mark.parametrize(("path", "where"), [
    ("params.layers", "no 'layers' under params"),
    ("results.fabric.runs[3]", "no item [3] in results.fabric.runs"),
    ("params.stages.x", "no 'x' under params.stages"),
    ("params[0]", "no item [0] in params"),
])
def test_a_missing_value_says_where_the_path_stopped(path, where):
    with pytest.raises(Missing, match=where.replace("[", r"\[").replace("]", r"\]")):
        lookup(SUMMARY, path)


@pytest.mark.parametrize("path", ["", ".a", "a..b", "a.", 'a."b', "a[0", "a[=1]", "a]b",
                                  "a[x]"])
def test_a_malformed_path_is_refused(path):
    with pytest.raises(PathError):
        parse_path(path)


def test_a_run_prefix_names_a_run_only_before_a_path():
    assert split_run("ring:results.fabric.x") == ("ring", "results.fabric.x")
    assert split_run("results.fabric.x") == (None, "results.fabric.x")
    assert split_run('results."a:b"') == (None, 'results."a:b"')


@pytest.mark.parametrize(("expr", "values", "result"), [
    ("a / b", {"a": 3, "b": 4}, 0.75),
    ("abs(b - (p - 1) / (m + p - 1)) / ((p - 1) / (m + p - 1))",
     {"b": 0.3, "p": 4, "m": 8}, pytest.approx(0.1)),
    ("a > 0 and b * 100 < a", {"a": 500, "b": 4}, True),
    ("1 < a < 3", {"a": 3}, False),
    ("t == 'roce'", {"t": "roce"}, True),
    ("max(a, b) - min([a, b])", {"a": 2, "b": 5}, 3),
    ("not a", {"a": False}, True),
])
def test_expressions_evaluate_arithmetic_and_comparisons(expr, values, result):
    assert evaluate(expr, values) == result


@pytest.mark.parametrize(("expr", "problem"), [
    ("__import__('os')", "only abs, min, max"),
    ("a.real", "Attribute is not allowed"),
    ("[x for x in a]", "ListComp is not allowed"),
    ("b + 1", "unknown name 'b'"),
    ("a +", "cannot parse"),
    ("lambda: 1", "Lambda is not allowed"),
])
def test_anything_else_is_refused_before_it_runs(expr, problem):
    with pytest.raises(ValueError, match=problem.replace("(", r"\(")):
        parse_expression(expr, {"a": 1})
