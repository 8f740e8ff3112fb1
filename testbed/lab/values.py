"""A value at a path in a run's summary.json, and the small arithmetic a self-check item
computes from such values. Both are pure: a path is text, a summary is plain data.

A path is the keys from the top of summary.json, dotted: ``results.fabric.busbw_mbit_s``. A
key with a dot in it is quoted: ``results."loss-0.01".roce``. A list is entered by position,
``[0]`` or ``[-1]``, or filtered by its items' fields, ``[model=gpt2_small]``, which keeps
the matching items (a list again, so a position may follow: ``runs[model=resnet50][-1]``).

A path may start with a run's name and a colon, ``ring:results.fabric.busbw_mbit_s``: the
value is then read from that run's summary (a lab's check can compare its runs).

An expression is Python's arithmetic, comparisons and ``and``/``or``/``not`` over the
item's named values, numbers and a few functions (``abs``, ``min``, ``max``, ``len``,
``sum``, ``round``, ``all``, ``any``); nothing else is evaluated (no attributes, no
calls beyond those, no imports).
"""
from __future__ import annotations

import ast
import operator
import re
from dataclasses import dataclass

KEY = "key"
INDEX = "index"
FILTER = "filter"
PLAIN_KEY = re.compile(r"[^.\[\]\"]+")
FUNCTIONS = {"abs": abs, "min": min, "max": max, "len": len, "sum": sum, "round": round,
             "all": all, "any": any}
BINARY = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul,
          ast.Div: operator.truediv, ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod,
          ast.Pow: operator.pow}
UNARY = {ast.USub: operator.neg, ast.UAdd: operator.pos, ast.Not: operator.not_}
COMPARE = {ast.Lt: operator.lt, ast.LtE: operator.le, ast.Gt: operator.gt,
           ast.GtE: operator.ge, ast.Eq: operator.eq, ast.NotEq: operator.ne,
           ast.In: lambda a, b: a in b, ast.NotIn: lambda a, b: a not in b}


class PathError(ValueError):
    """A path that cannot be parsed."""


class Missing(LookupError):
    """A path the summary does not hold; the message says where it stopped."""


@dataclass(frozen=True)
class Step:
    """One step of a path: a key, a list position, or a filter on list items' fields."""

    kind: str
    key: str = ""
    index: int = 0
    match: tuple[tuple[str, str], ...] = ()


RUN_PREFIX = re.compile(r"^([a-z0-9][a-z0-9-]*):(?=.)")


def split_run(path: str) -> tuple[str | None, str]:
    """``ring:results.x`` -> ("ring", "results.x"); a path without a run -> (None, path)."""
    match = RUN_PREFIX.match(path)
    return (match.group(1), path[match.end():]) if match else (None, path)


def parse_path(path: str) -> tuple[Step, ...]:
    """``results."loss-0.01".runs[model=x][-1]`` -> its steps (a run prefix left out);
    PathError when malformed."""
    path = split_run(path)[1]
    steps: list[Step] = []
    i, n = 0, len(path)
    while i < n:
        if path[i] == ".":
            if i == 0 or i == n - 1 or path[i + 1] == ".":
                raise PathError(f"an empty key in {path!r}")
            i += 1
        if path[i] == '"':
            end = path.find('"', i + 1)
            if end < 0:
                raise PathError(f"an unclosed quote in {path!r}")
            steps.append(Step(KEY, key=path[i + 1:end]))
            i = end + 1
        elif path[i] == "[":
            end = path.find("]", i)
            if end < 0:
                raise PathError(f"an unclosed [ in {path!r}")
            steps.append(_bracket(path[i + 1:end].strip(), path))
            i = end + 1
        else:
            match = PLAIN_KEY.match(path, i)
            if match is None:
                raise PathError(f"cannot read {path!r} at character {i + 1}")
            steps.append(Step(KEY, key=match.group(0)))
            i = match.end()
        if i < n and path[i] not in ".[":
            raise PathError(f"expected . or [ after {path[:i]!r} in {path!r}")
    if not steps:
        raise PathError("an empty path")
    return tuple(steps)


def _bracket(inside: str, path: str) -> Step:
    if re.fullmatch(r"-?\d+", inside):
        return Step(INDEX, index=int(inside))
    pairs = []
    for part in inside.split(","):
        field, sep, value = part.partition("=")
        if not sep or not field.strip():
            raise PathError(f"[{inside}] in {path!r}: a position or field=value[,field=value]")
        pairs.append((field.strip(), value.strip()))
    return Step(FILTER, match=tuple(pairs))


def lookup(data, path: str):
    """The value at ``path`` (its run prefix left out) in ``data``; Missing when a key or
    position is not there."""
    value, walked = data, ""
    for step in parse_path(path):
        if step.kind == KEY:
            if not isinstance(value, dict) or step.key not in value:
                raise Missing(f"no {step.key!r} under {walked or 'the top'}")
            value = value[step.key]
            walked += ("." if walked else "") + step.key
        elif step.kind == INDEX:
            if not isinstance(value, list) or not -len(value) <= step.index < len(value):
                raise Missing(f"no item [{step.index}] in {walked}")
            value = value[step.index]
            walked += f"[{step.index}]"
        else:
            if not isinstance(value, list):
                raise Missing(f"{walked} is not a list")
            value = [item for item in value if isinstance(item, dict) and all(
                field in item and str(item[field]) == want for field, want in step.match)]
            walked += "[" + ",".join(f"{f}={w}" for f, w in step.match) + "]"
    return value


# --- expressions ---------------------------------------------------------------------------


def parse_expression(text: str, names) -> ast.Expression:
    """``text`` parsed, every node of it allowed and every name known (``names`` and the
    functions); ValueError saying what is not."""
    try:
        tree = ast.parse(text, mode="eval")
    except SyntaxError as exc:
        raise ValueError(f"cannot parse {text!r}: {exc.msg}") from None
    allowed = (ast.Expression, ast.BinOp, ast.UnaryOp, ast.BoolOp, ast.Compare, ast.Name,
               ast.Constant, ast.Call, ast.Load, ast.List, ast.Tuple, ast.IfExp,
               ast.And, ast.Or, *BINARY, *UNARY, *COMPARE)
    for node in ast.walk(tree):
        if not isinstance(node, allowed):
            raise ValueError(f"{text!r}: {type(node).__name__} is not allowed")
        if isinstance(node, ast.Name) and node.id not in names and node.id not in FUNCTIONS:
            raise ValueError(f"{text!r}: unknown name {node.id!r} (values: "
                             f"{', '.join(sorted(names)) or 'none'})")
        if isinstance(node, ast.Call) and (not isinstance(node.func, ast.Name)
                                           or node.func.id not in FUNCTIONS or node.keywords):
            raise ValueError(f"{text!r}: only {', '.join(FUNCTIONS)} may be called")
    return tree


def evaluate(text: str, values: dict):
    """The value of expression ``text`` with ``values`` bound to its names."""
    return _eval(parse_expression(text, values).body, values)


def _eval(node, values: dict):
    if isinstance(node, ast.Constant):
        return node.value
    if isinstance(node, ast.Name):
        return values[node.id] if node.id in values else FUNCTIONS[node.id]
    if isinstance(node, (ast.List, ast.Tuple)):
        return [_eval(e, values) for e in node.elts]
    if isinstance(node, ast.BinOp):
        return BINARY[type(node.op)](_eval(node.left, values), _eval(node.right, values))
    if isinstance(node, ast.UnaryOp):
        return UNARY[type(node.op)](_eval(node.operand, values))
    if isinstance(node, ast.BoolOp):
        results = (_eval(v, values) for v in node.values)
        return all(results) if isinstance(node.op, ast.And) else any(results)
    if isinstance(node, ast.Compare):
        left = _eval(node.left, values)
        for op, right_node in zip(node.ops, node.comparators):
            right = _eval(right_node, values)
            if not COMPARE[type(op)](left, right):
                return False
            left = right
        return True
    if isinstance(node, ast.IfExp):
        return _eval(node.body if _eval(node.test, values) else node.orelse, values)
    if isinstance(node, ast.Call):
        return FUNCTIONS[node.func.id](*(_eval(a, values) for a in node.args))
    raise ValueError(f"{type(node).__name__} is not allowed")  # parse_expression refused it
