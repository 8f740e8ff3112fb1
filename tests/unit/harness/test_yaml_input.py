"""YAML a user wrote: YAML 1.2's core scalars (no 1.1 surprises), and hostile documents (alias
bombs, deep nesting, huge files) refused in milliseconds, before anything is built."""
from __future__ import annotations

import math
import time

import pytest

from testbed.harness.yaml_input import (
    MAX_ALIAS_NODES,
    MAX_BYTES,
    MAX_DEPTH,
    YamlInputError,
    load_text,
)

FAST_S = 0.5  # "well under a second" on a 2-core machine, with room for a busy moment


@pytest.mark.parametrize(("text", "value"), [
    ("1e9", 1e9), ("1.5E-3", 1.5e-3), ("-2.5", -2.5), ("10", 10), ("010", 10), ("0o17", 15),
    ("0x1f", 31), ("1_000", 1000), ("+7", 7), ("true", True), ("False", False), ("~", None),
    ("null", None), ("", None), (".inf", math.inf), ("-.inf", -math.inf),
])
def test_core_schema_scalars_are_typed(text, value):
    assert load_text(f"v: {text}\n")["v"] == value


@pytest.mark.parametrize("text", ["yes", "no", "on", "off", "Yes", "y", "2024-01-01",
                                  "1:20", "0b101", "1e", ".5.5", "12:30:00"])
def test_yaml_1_1_forms_stay_strings(text):
    """``iters: yes`` is the string it looks like, not True; a date is a string, not a
    datetime that no field takes; ``1:20`` is not 80."""
    assert load_text(f"v: {text}\n")["v"] == text


def test_nan_is_a_float():
    assert math.isnan(load_text("v: .nan\n")["v"])


@pytest.mark.parametrize("text", ["v: !!binary aGVsbG8=", "v: !!timestamp 2024-01-01",
                                  "v: !!set {a, b}", "v: !!python/name:os.system x",
                                  "v: !!int abc", "v: !!float x", "v: !!bool maybe",
                                  "v: !custom 1"])
def test_other_tags_and_bad_tagged_values_are_one_error(text):
    with pytest.raises(YamlInputError) as info:
        load_text(text)
    assert "\n" not in str(info.value) and info.value.line == 1


def alias_bomb(levels: int, width: int = 9) -> str:
    """The classic "billion laughs": each level a list of ``width`` aliases of the one before."""
    lines = ["a0: &a0 [lol, lol, lol, lol, lol, lol, lol, lol, lol]"]
    for i in range(1, levels):
        lines.append(f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * width)}]")
    return "\n".join(lines) + "\n"


@pytest.mark.parametrize("levels", [5, 9, 30])
def test_an_alias_bomb_is_refused_fast(levels):
    text = alias_bomb(levels)
    assert len(text) < 4000
    t0 = time.monotonic()
    with pytest.raises(YamlInputError) as info:
        load_text(text)
    assert time.monotonic() - t0 < FAST_S
    assert "alias" in str(info.value)


def test_a_few_aliases_are_fine():
    data = load_text("base: &b {k: 4}\none: *b\ntwo: {<<: *b, x: 1}\n")
    assert data == {"base": {"k": 4}, "one": {"k": 4}, "two": {"k": 4, "x": 1}}
    assert MAX_ALIAS_NODES >= 1000


def test_a_recursive_alias_is_refused():
    with pytest.raises(YamlInputError) as info:
        load_text("a: &a [1, *a]\n")
    assert "refers to itself" in str(info.value)


@pytest.mark.parametrize("text", ["[" * 5000 + "]" * 5000, "a:\n" + "".join(
    f"{' ' * (i + 1)}b{i}:\n" for i in range(200)), "{a: " * 3000 + "1" + "}" * 3000])
def test_deep_nesting_is_refused_fast(text):
    t0 = time.monotonic()
    with pytest.raises(YamlInputError) as info:
        load_text(text)
    assert time.monotonic() - t0 < FAST_S
    assert f"deeper than {MAX_DEPTH}" in str(info.value)


def test_deep_nesting_through_aliases_is_refused():
    lines = ["a0: &a0 [[[[[[[[1]]]]]]]]"]
    lines += [f"a{i}: &a{i} [[[[[[[[*a{i - 1}]]]]]]]]" for i in range(1, 20)]
    with pytest.raises(YamlInputError) as info:
        load_text("\n".join(lines))
    assert "deeper than" in str(info.value)


def test_text_beyond_the_size_bound_is_refused_before_parsing():
    text = "a: 1\n" + "#" * MAX_BYTES
    t0 = time.monotonic()
    with pytest.raises(YamlInputError) as info:
        load_text(text)
    assert time.monotonic() - t0 < FAST_S
    assert "bytes" in str(info.value)


@pytest.mark.parametrize("text", ["a: [1, 2", "a: b: c", "\x00", "a: '\x07'", "? [a]\n: 1",
                                  "*undefined", "a: &x 1\nb: *y", "{[1]: 2}", "- \t- x"])
def test_malformed_text_is_one_error_with_a_line(text):
    with pytest.raises(YamlInputError) as info:
        load_text(text)
    assert "\n" not in str(info.value)


def test_a_huge_integer_is_an_error_not_a_crash():
    with pytest.raises(YamlInputError):
        load_text("v: " + "9" * 6000)
