"""YAML a user wrote (scenario files, ``--set`` values, topology parameters): read as YAML
1.2's core schema, within stated bounds, or refused with one error that says where.

PyYAML reads YAML 1.1, whose implicit types surprise: ``1e9`` is a string, ``yes``, ``on``
and ``off`` are booleans, ``2024-01-01`` is a date (which no field takes), ``010`` is 8 and
``1:20`` is 80. Here only the core schema's forms are typed: ``true``/``false``, ``null``/``~``
(and nothing), integers (decimal, ``0o``, ``0x``; ``_`` between digits), floats with a point
or an exponent, ``.inf`` and ``.nan``; every other plain scalar is a string. Explicit tags
other than the core ones (``!!binary``, ``!!timestamp``, ``!!set``, application tags) are
refused, and so is a tagged value that is not of its tag (``!!int abc``). Merge keys
(``<<: *base``) work as in PyYAML.

Bounds, checked on the text and on the parsed node graph before any value is built, so a
hostile document is refused in milliseconds instead of expanding into gigabytes:
MAX_BYTES of text, MAX_DEPTH levels of nesting (counted through aliases), at most
MAX_ALIAS_NODES nodes added by expanding aliases (a "billion laughs" of a few hundred bytes
expands to billions), and no alias inside the node it names.
"""
from __future__ import annotations

import re

import yaml
from yaml.composer import ComposerError
from yaml.constructor import ConstructorError
from yaml.events import AliasEvent
from yaml.nodes import MappingNode, Node, SequenceNode

from testbed.errors import short

MAX_BYTES = 256 * 1024  # a scenario is a few KB; an explicit fabric of 1000 links about 40 KB
MAX_DEPTH = 32  # a scenario nests about 5 levels
MAX_ALIAS_NODES = 10_000  # nodes that expanding aliases may add: a few shared sections' worth

CORE = "tag:yaml.org,2002:"
# The core schema's plain scalars (YAML 1.2.2, 10.3.2), with ``_`` allowed between digits.
CORE_RESOLVERS = [
    ("bool", r"^(?:true|True|TRUE|false|False|FALSE)$", "tTfF"),
    ("null", r"^(?:~|null|Null|NULL|)$", ["~", "n", "N", ""]),
    ("int", r"^(?:[-+]?[0-9](?:_?[0-9])*|0o[0-7](?:_?[0-7])*|0x[0-9a-fA-F](?:_?[0-9a-fA-F])*)$",
     "-+0123456789"),
    ("float", r"^(?:[-+]?(?:\.[0-9](?:_?[0-9])*|[0-9](?:_?[0-9])*(?:\.(?:[0-9](?:_?[0-9])*)?)?)"
              r"(?:[eE][-+]?[0-9]+)?|[-+]?\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN))$",
     "-+.0123456789"),
    ("merge", r"^<<$", "<"),
]


class YamlInputError(ValueError):
    """Text that is not YAML this reader takes: ``problem`` says why, ``line`` (1-based) where,
    when known."""

    def __init__(self, problem: str, line: int | None = None):
        super().__init__(f"line {line}: {problem}" if line else problem)
        self.problem = problem
        self.line = line


class BoundedLoader(yaml.SafeLoader):
    """PyYAML's safe loader with the core schema's scalars and a nesting bound while it
    composes (the composer recurses once per level)."""

    def __init__(self, stream):
        super().__init__(stream)
        self.depth = 0

    def compose_node(self, parent, index):
        if self.check_event(AliasEvent):
            return super().compose_node(parent, index)
        self.depth += 1
        try:
            if self.depth > MAX_DEPTH:
                raise ComposerError(None, None, f"nested deeper than {MAX_DEPTH} levels",
                                    self.peek_event().start_mark)
            return super().compose_node(parent, index)
        finally:
            self.depth -= 1

    def construct_core_int(self, node) -> int:
        text = self.construct_scalar(node).replace("_", "")
        sign = -1 if text.startswith("-") else 1
        digits = text.lstrip("+-")
        base = {"0o": 8, "0x": 16}.get(digits[:2].lower(), 10)
        try:
            return sign * int(digits[2:] if base != 10 else digits, base)
        except ValueError:
            raise ConstructorError(None, None, f"{short(text)} is not an integer",
                                   node.start_mark) from None

    def construct_core_float(self, node) -> float:
        text = self.construct_scalar(node).replace("_", "")
        special = {".inf": "inf", "+.inf": "inf", "-.inf": "-inf", ".nan": "nan"}
        try:
            return float(special.get(text.lower(), text))
        except ValueError:
            raise ConstructorError(None, None, f"{short(text)} is not a number",
                                   node.start_mark) from None

    def construct_core_bool(self, node) -> bool:
        text = self.construct_scalar(node)
        if text.lower() not in ("true", "false"):
            raise ConstructorError(None, None, f"{short(text)} is not true or false",
                                   node.start_mark)
        return text.lower() == "true"

    def construct_refused(self, node):
        raise ConstructorError(None, None, f"the tag {node.tag!r} is not taken here (only "
                               "plain values, lists and mappings)", node.start_mark)


BoundedLoader.yaml_implicit_resolvers = {}
for _name, _pattern, _first in CORE_RESOLVERS:
    BoundedLoader.add_implicit_resolver(CORE + _name, re.compile(_pattern), list(_first))
BoundedLoader.yaml_constructors = {
    tag: constructor for tag, constructor in yaml.SafeLoader.yaml_constructors.items()
    if tag in (CORE + "null", CORE + "str", CORE + "seq", CORE + "map")}
BoundedLoader.add_constructor(CORE + "int", BoundedLoader.construct_core_int)
BoundedLoader.add_constructor(CORE + "float", BoundedLoader.construct_core_float)
BoundedLoader.add_constructor(CORE + "bool", BoundedLoader.construct_core_bool)
BoundedLoader.add_constructor(None, BoundedLoader.construct_refused)


def children(node: Node) -> list[Node]:
    if isinstance(node, SequenceNode):
        return list(node.value)
    if isinstance(node, MappingNode):
        return [part for pair in node.value for part in pair]
    return []


def check_expansion(root: Node) -> None:
    """Refuse a node graph whose aliases, expanded, nest deeper than MAX_DEPTH, add more than
    MAX_ALIAS_NODES nodes, or refer to a node that holds them. Linear in the graph: each
    node's expanded size and depth are computed once."""
    expanded: dict[int, tuple[int, int]] = {}  # id(node) -> (nodes, depth) once expanded
    distinct: set[int] = set()
    open_nodes: set[int] = set()

    def walk(node: Node, level: int) -> tuple[int, int]:
        key = id(node)
        if key in open_nodes:
            raise YamlInputError("an alias refers to itself (the node it names holds it)",
                                 node.start_mark.line + 1)
        if key not in expanded:
            if level > MAX_DEPTH:
                raise YamlInputError(f"nested deeper than {MAX_DEPTH} levels once aliases "
                                     "are expanded", node.start_mark.line + 1)
            open_nodes.add(key)
            distinct.add(key)
            nodes, depth = 1, 1
            for child in children(node):
                child_nodes, child_depth = walk(child, level + 1)
                nodes, depth = nodes + child_nodes, max(depth, child_depth + 1)
                if nodes - len(distinct) > MAX_ALIAS_NODES:
                    raise YamlInputError(f"its aliases expand to more than {MAX_ALIAS_NODES} "
                                         "nodes", child.start_mark.line + 1)
            open_nodes.discard(key)
            expanded[key] = (nodes, depth)
        nodes, depth = expanded[key]
        if level + depth - 1 > MAX_DEPTH:
            raise YamlInputError(f"nested deeper than {MAX_DEPTH} levels once aliases are "
                                 "expanded", node.start_mark.line + 1)
        return nodes, depth

    total, _ = walk(root, 1)
    if total - len(distinct) > MAX_ALIAS_NODES:
        raise YamlInputError(f"its aliases expand to more than {MAX_ALIAS_NODES} nodes")


def yaml_error(exc: yaml.YAMLError) -> YamlInputError:
    """One YamlInputError from PyYAML's error: the problem, where the construct it broke
    began when that is another line, and the line of the problem."""
    mark = getattr(exc, "problem_mark", None)
    context = getattr(exc, "context_mark", None)
    what = getattr(exc, "problem", None) or "not valid YAML"
    if getattr(exc, "context", None) and context is not None and (
            mark is None or context.line != mark.line):
        what += f" ({exc.context} at line {context.line + 1})"
    return YamlInputError(" ".join(str(what).split()), mark.line + 1 if mark else None)


def compose(text: str) -> Node | None:
    """The node graph of one YAML document, within every bound; None for an empty one."""
    size = len(text.encode("utf-8", "surrogatepass"))
    if size > MAX_BYTES:
        raise YamlInputError(f"{size} bytes; at most {MAX_BYTES} are read")
    try:
        root = read_node(text)
    except yaml.reader.ReaderError as exc:  # a character YAML does not allow; no mark
        character = exc.character if isinstance(exc.character, str) else chr(exc.character)
        raise YamlInputError(f"the character {character!r} is not allowed in YAML",
                             text.count("\n", 0, exc.position) + 1) from None
    except yaml.YAMLError as exc:
        raise yaml_error(exc) from None
    if root is not None:
        check_expansion(root)
    return root


def read_node(text: str) -> Node | None:
    loader = BoundedLoader(text)  # reads the text's characters at once
    try:
        return loader.get_single_node()
    finally:
        loader.dispose()


def construct(root: Node | None):
    """The Python value of a node graph from ``compose``: dicts, lists, str, int, float,
    bool and None only."""
    if root is None:
        return None
    loader = BoundedLoader("")
    try:
        return loader.construct_document(root)
    except yaml.YAMLError as exc:
        raise yaml_error(exc) from None
    finally:
        loader.dispose()


def load_text(text: str):
    """``compose`` then ``construct``: the value of a YAML text, within every bound."""
    return construct(compose(text))
