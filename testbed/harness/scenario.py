"""Scenarios: one typed, validated YAML schema for every experiment.

    name: fattree-allreduce
    experiment: allreduce              # testbed.experiments.registry
    topology: {name: fattree, k: 4}    # a family and its parameters, or explicit nodes/links
    link_rate_mbit: 6
    queue: {classes: true, pfc: true, ecn: {scheme: dctcp}}
    hosts: {tcp_cc: auto}
    failures: [{at_s: 2, action: link_down, link: [p0e0, p0a0]}]
    impairments: [{link: all, loss_percent: 0.1}]
    params: {size_bytes: 2097152}      # the experiment's own parameters

The structure is a pydantic model (``Scenario``; its JSON schema, with every experiment's
``params``, is published as testbed/scenarios/schema.json for editors). Loading
(``testbed.experiments.registry.load``, which knows the experiments) reports every problem at
once, each with its field path and, from a file, its line: structural ones from the schema,
then what needs more than one field or the machine (a topology's parameters, routing against
the topology, names of links and hosts, kernel features an impairment needs). This module
knows no experiment: the experiments import it.
"""
from __future__ import annotations

import inspect
import ipaddress
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal, Union

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Discriminator,
    Field,
    Tag,
    ValidationError,
    field_validator,
    model_validator,
)

from testbed.errors import ConfigError
from testbed.model.topology import BUILDERS

NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.+-]{0,63}$"
FAILURE_ACTIONS = ("link_down", "link_up", "switch_down", "switch_up", "controller_restart")
SCHEMA_PATH = Path(__file__).resolve().parents[1] / "scenarios" / "schema.json"
SCENARIO_DIR = SCHEMA_PATH.parent


Pair = Annotated[list[str], Field(min_length=2, max_length=2)]  # [a, b]: two node names


class Strict(BaseModel):
    """Unknown keys are errors, and values are taken as written: no bool where a number is
    meant, no "4" for 4."""

    model_config = ConfigDict(extra="forbid", strict=True)


class NodeSpec(Strict):
    """A node of an explicit topology: a host, or a switch (any switch role)."""

    name: str = Field(pattern=r"^[a-z][a-z0-9]{0,9}$")
    role: str = "switch"


class LinkSpec(Strict):
    """A cable of an explicit topology between two named nodes; ``rate_mbit`` overrides the
    run's link rate on this link."""

    ends: Pair
    rate_mbit: float | None = Field(None, gt=0, le=100_000)


class FamilyTopology(BaseModel):
    """A topology family by ``name`` with its parameters as further keys (``testbed topo
    NAME`` describes one; ``testbed topo NAME --help`` is not needed: a wrong key lists the
    valid ones)."""

    model_config = ConfigDict(extra="allow")
    name: str

    @property
    def family(self) -> str:
        return self.name

    @property
    def params(self) -> dict:
        return dict(self.model_extra or {})


class ExplicitTopology(Strict):
    """A topology node by node and cable by cable (testbed.model.topology.explicit)."""

    name: Literal["explicit"]
    nodes: list[NodeSpec] = Field(min_length=2)
    links: list[LinkSpec | Pair] = Field(min_length=1)

    @property
    def family(self) -> str:
        return "explicit"

    @property
    def params(self) -> dict:
        return {}


def topology_kind(value) -> str:
    return "explicit" if isinstance(value, dict) and value.get("name") == "explicit" else "family"


TopologySpec = Annotated[Union[Annotated[ExplicitTopology, Tag("explicit")],
                               Annotated[FamilyTopology, Tag("family")]],
                         Discriminator(topology_kind)]


class PfcSpec(Strict):
    """PFC on the lossless class: thresholds scaled from 802.1Qbb practice to the link rate
    (testbed.plan.scaling.pfc_thresholds), sized for ``reaction_time_s``."""

    reaction_time_s: float | None = Field(None, ge=0, le=1)


class QueueSpec(Strict):
    """Every shaped port's egress queue: its byte buffer (default 50 ms at the link rate),
    per-class queues by DSCP (26 lossless, 48 control, the rest best effort), ECN marking
    (``ecn``: {profile: step, k_bytes: K}, {profile: red, kmin_bytes, kmax_bytes, pmax},
    {scheme: dctcp} or {scheme: dcqcn}) and PFC on the lossless class (implies classes)."""

    buffer_bytes: int | None = Field(None, gt=0, le=2**32 - 1)
    classes: bool = False
    ecn: dict[str, Any] | None = None
    pfc: bool | PfcSpec = False
    path: Literal["ebpf", "red-qdisc"] | None = None
    sample_ms: float = Field(10.0, ge=0, le=10_000)


class HostsSpec(Strict):
    """The hosts' TCP: congestion control (``auto``: dctcp where the kernel has it, else
    cubic with ECN) and whether connections ask for ECN."""

    tcp_cc: Literal["auto", "dctcp", "cubic", "reno"] | None = None
    tcp_ecn: bool = False


class AnycastSpec(Strict):
    """A service address answered by the nearest live replica host."""

    service_ip: str
    replicas: list[str] = Field(min_length=1)

    @field_validator("service_ip")
    @classmethod
    def _ipv4(cls, value: str) -> str:
        ipaddress.IPv4Address(value)
        return value


class FailureSpec(Strict):
    """One event of a failure schedule, ``at_s`` seconds after the workload starts."""

    at_s: float = Field(ge=0, le=86_400)
    action: Literal["link_down", "link_up", "switch_down", "switch_up", "controller_restart"]
    link: Pair | None = None
    switch: str | None = None

    @model_validator(mode="after")
    def _target(self):
        wants_link = self.action.startswith("link_")
        wants_switch = self.action.startswith("switch_")
        if wants_link != (self.link is not None):
            raise ValueError(f"{self.action} needs link: [a, b]" if wants_link
                             else f"{self.action} takes no link")
        if wants_switch != (self.switch is not None):
            raise ValueError(f"{self.action} needs switch: NAME" if wants_switch
                             else f"{self.action} takes no switch")
        return self


class ImpairmentSpec(Strict):
    """Delay and loss on a link (both directions) or on every link (``link: all``): by netem
    where the kernel has it, else loss alone by the eBPF loss program (testbed.harness.plans)."""

    link: Pair | Literal["all"]
    delay_ms: float = Field(0.0, ge=0, le=10_000)
    jitter_ms: float = Field(0.0, ge=0, le=10_000)
    loss_percent: float = Field(0.0, ge=0, le=100)

    @model_validator(mode="after")
    def _something(self):
        if not (self.delay_ms or self.loss_percent):
            raise ValueError("needs delay_ms or loss_percent")
        if self.jitter_ms and not self.delay_ms:
            raise ValueError("jitter_ms needs delay_ms")
        return self


class Scenario(Strict):
    """A run: which experiment, on which fabric, with which queues, hosts, failures and
    impairments; ``params`` are the experiment's own (its Params model)."""

    name: str = Field(pattern=NAME_PATTERN)
    description: str = ""
    experiment: str = "allreduce"
    topology: TopologySpec | None = None
    link_rate_mbit: float | None = Field(None, gt=0, le=10_000)
    mtu_bytes: int | None = Field(None, ge=576, le=9000)
    routing: str = "ecmp"
    queue: QueueSpec | None = None
    hosts: HostsSpec = HostsSpec()
    anycast: AnycastSpec | None = None
    failures: list[FailureSpec] = []
    impairments: list[ImpairmentSpec] = []
    params: dict[str, Any] = {}
    seed: int = Field(1, ge=0, le=2**31 - 1)
    results_dir: str = "results"


# --- problems ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Problem:
    """One thing wrong with a scenario: where (a field path) and what."""

    path: tuple
    message: str
    line: int | None = None

    @property
    def field(self) -> str:
        return ".".join(str(p) for p in self.path) or "scenario"

    def __str__(self) -> str:
        where = f"line {self.line}: " if self.line else ""
        return f"{where}{self.field + ': ' if self.path else ''}{self.message}"


class ScenarioError(ConfigError):
    """Every problem of a scenario, one per line."""

    def __init__(self, source: str, problems: list[Problem]):
        self.problems = problems
        self.source = source
        head = f"{source}: {len(problems)} problem{'s' if len(problems) != 1 else ''}"
        super().__init__(problems[0].field if len(problems) == 1 else source,
                         str(problems[0].message) if len(problems) == 1 else head)
        self.args = ("\n".join([head, *(f"  {p}" for p in problems)]),)

    def __str__(self) -> str:
        return self.args[0]


def pydantic_problems(err: ValidationError, prefix: tuple = ()) -> list[Problem]:
    problems = []
    for e in err.errors():
        loc = tuple(p for i, p in enumerate(e["loc"]) if not (isinstance(p, str) and (
            p.startswith(("function-", "tuple[", "list[", "dict[", "literal[")) or p in
            ("LinkSpec", "str", "bool", "PfcSpec", "float", "int") or
            (p in ("explicit", "family") and i and e["loc"][i - 1] == "topology"))))
        message = e["msg"].removeprefix("Value error, ")
        if e["type"] == "extra_forbidden":
            message = "unknown field"
        elif e["type"] == "string_pattern_mismatch" and loc == ("name",):
            message = "must be letters, digits and _ . + - (no spaces), at most 64 characters"
        elif e["type"] == "missing":
            message = "is required"
        elif "input" in e and e["type"] not in ("model_type",) and not isinstance(
                e["input"], (dict, list)):
            message += f", got {e['input']!r}"
        problems.append(Problem(prefix + loc, message))
    return dedupe(problems)


def dedupe(problems: list[Problem]) -> list[Problem]:
    """One problem per field: the messages of a field that failed every alternative of a
    union (``pfc: true`` or a mapping) joined with "or"."""
    by_path: dict[tuple, Problem] = {}
    for p in problems:
        seen = by_path.get(p.path)
        if seen is None:
            by_path[p.path] = p
        elif p.message not in seen.message:
            by_path[p.path] = Problem(p.path, f"{seen.message}; or {p.message}",
                                      seen.line or p.line)
    return list(by_path.values())


def builder_parameters(builder, given: dict) -> list[str]:
    """The parameters a topology builder takes, beside the rate and MTU the scenario sets;
    a builder over a ``base`` family (nvswitch) takes that family's parameters too."""
    names, extended = [], False
    for name, parameter in inspect.signature(builder).parameters.items():
        if parameter.kind is inspect.Parameter.VAR_KEYWORD:
            extended = True
        elif name not in ("host_rate_mbit", "mtu_bytes"):
            names.append(name)
    if extended:
        base = given.get("base", inspect.signature(builder).parameters["base"].default)
        if base in BUILDERS:
            names += [n for n in builder_parameters(BUILDERS[base], {}) if n not in names]
    return names


def topology_problems(spec) -> list[Problem]:
    """Unknown families and parameters by name, with the valid ones; then the builder's own
    checks (testbed.model.topology)."""
    if spec.family == "explicit":
        return []
    builder = BUILDERS.get(spec.name)
    if builder is None:
        return [Problem(("topology", "name"), f"unknown family {spec.name!r}; known: "
                        f"{', '.join(sorted(BUILDERS))}")]
    valid = builder_parameters(builder, spec.params)
    problems = []
    for key in spec.params:
        if key in ("host_rate_mbit", "mtu_bytes"):
            problems.append(Problem(("topology", key), "set it as the scenario's "
                                    f"{'link_rate_mbit' if key == 'host_rate_mbit' else key}, "
                                    "not under topology"))
        elif key not in valid:
            problems.append(Problem(("topology", key), f"not a parameter of {spec.name}; valid: "
                                    f"{', '.join(valid)}"))
    if not problems:  # the builder's own checks of the values
        try:
            builder(**spec.params)
        except ConfigError as err:
            field = err.field.removeprefix("topology.")
            problems.append(Problem(("topology", *field.split(".")), err.problem))
    return problems


# --- reading files -------------------------------------------------------------------------------


def yaml_lines(text: str) -> dict[tuple, int]:
    """Field path -> the 1-based line where its value starts, for every mapping key and
    sequence item of a YAML document."""
    lines: dict[tuple, int] = {}

    def walk(node, path: tuple) -> None:
        if isinstance(node, yaml.MappingNode):
            for key, value in node.value:
                sub = (*path, key.value)
                lines[sub] = key.start_mark.line + 1
                walk(value, sub)
        elif isinstance(node, yaml.SequenceNode):
            for i, item in enumerate(node.value):
                lines[(*path, i)] = item.start_mark.line + 1
                walk(item, (*path, i))
    try:
        root = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.YAMLError:
        return lines
    if root is not None:
        walk(root, ())
    return lines


def duplicate_keys(text: str) -> list[Problem]:
    """Keys given twice in one mapping (YAML loaders silently keep the last)."""
    problems = []

    def walk(node, path: tuple) -> None:
        if isinstance(node, yaml.MappingNode):
            seen = set()
            for key, value in node.value:
                if key.value in seen:
                    problems.append(Problem((*path, key.value), "given twice",
                                            key.start_mark.line + 1))
                seen.add(key.value)
                walk(value, (*path, key.value))
        elif isinstance(node, yaml.SequenceNode):
            for i, item in enumerate(node.value):
                walk(item, (*path, i))
    try:
        root = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.YAMLError:
        return []
    if root is not None:
        walk(root, ())
    return problems


def parse_yaml(text: str, source: str) -> dict:
    """The mapping a scenario's text holds; a syntax error names the line where the
    problem is and, when the parser knows it, where the construct it broke began."""
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        context = getattr(exc, "context_mark", None)
        what = getattr(exc, "problem", None) or "not valid YAML"
        message = f"not valid YAML: {what}"
        if context is not None and getattr(exc, "context", None) and (
                mark is None or context.line != mark.line):
            message += f" ({exc.context} at line {context.line + 1})"
        raise ScenarioError(source, [Problem((), message,
                                             mark.line + 1 if mark else None)]) from None
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ScenarioError(source, [Problem((), "must be a mapping of field: value", 1)])
    return data


def read_text(path: str | Path) -> str:
    path = Path(path)
    try:
        return path.read_text()
    except FileNotFoundError:
        bundled = SCENARIO_DIR / f"{path.name}.yaml" if path.suffix == "" else None
        if bundled is not None and bundled.exists():
            return bundled.read_text()
        raise ConfigError(str(path), "no such scenario file (bundled scenarios: "
                          f"{', '.join(sorted(p.stem for p in SCENARIO_DIR.glob('*.yaml')))})"
                          ) from None
    except OSError as exc:
        raise ConfigError(str(path), f"cannot read: {exc.strerror}") from None
    except UnicodeDecodeError:
        raise ConfigError(str(path), "not a text (UTF-8) file") from None


def merge(data: dict, overrides: dict) -> dict:
    """``{"params.size_bytes": 4096}`` written into a copy of ``data``."""
    data = json.loads(json.dumps(data))
    for dotted, value in overrides.items():
        target = data
        *parents, last = dotted.split(".")
        for key in parents:
            node = target.get(key)
            if not isinstance(node, dict):
                node = target[key] = {} if node is None else node
            if not isinstance(node, dict):
                raise ConfigError(dotted, f"{key} is not a section")
            target = node
        target[last] = value
    return data


def nearest_line(lines: dict[tuple, int], path: tuple) -> int | None:
    """The line of ``path`` or of its closest parent that the file spells out."""
    for end in range(len(path), 0, -1):
        if path[:end] in lines:
            return lines[path[:end]]
    return None
