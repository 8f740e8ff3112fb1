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

import ipaddress
import json
import stat
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

from testbed.errors import ConfigError, short, shown
from testbed.harness.yaml_input import MAX_BYTES, YamlInputError, compose, construct
from testbed.model.topology import BUILDERS, build, parameters
from testbed.model.topology.checks import MAX_MTU_BYTES, MIN_MTU_BYTES

NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.+-]{0,63}$"
NAME_RULE = ("must be ASCII letters, digits and _ . + - (no spaces), starting with a letter or "
             "digit, at most 64 characters")
# A node a scenario refers to (failures, impairments, anycast replicas): what every family
# and an explicit topology name their nodes, so no other text reaches a host's shell.
NODE_NAME_PATTERN = r"^[a-z][a-z0-9]{0,31}$"
FAILURE_ACTIONS = ("link_down", "link_up", "switch_down", "switch_up", "controller_restart",
                   "impair", "stop", "kill")
SCHEMA_PATH = Path(__file__).resolve().parents[1] / "scenarios" / "schema.json"
SCENARIO_DIR = SCHEMA_PATH.parent


NodeName = Annotated[str, Field(pattern=NODE_NAME_PATTERN)]
Pair = Annotated[list[NodeName], Field(min_length=2, max_length=2)]  # [a, b]: two node names


class Strict(BaseModel):
    """Unknown keys are errors, and values are taken as written: no bool where a number is
    meant, no "4" for 4, no NaN or infinity."""

    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False)


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
    replicas: list[NodeName] = Field(min_length=1)

    @field_validator("service_ip")
    @classmethod
    def _ipv4(cls, value: str) -> str:
        ipaddress.IPv4Address(value)
        return value


class TargetSelector(Strict):
    """Which links, switches or hosts a failure may hit: by ``role`` (``core``, ``spine``...),
    ``pod`` (a fat-tree's or a 5-stage Clos' pod, a dragonfly's group) or ``names``; every
    one when empty. A link matches when either of its ends does."""

    role: NodeName | None = None
    pod: int | None = Field(None, ge=0, le=65_535)
    names: list[NodeName] | None = Field(None, min_length=1)


# Faults a schedule heals by itself ``for_s`` after they start, and those that need it.
HEALED_ACTIONS = ("link_down", "switch_down", "impair", "stop")
WINDOWED_ACTIONS = ("impair", "stop")
FABRIC_DAEMONS = ("controller", "ovs-vswitchd", "pause-agent")
HOST_DAEMONS = ("traffic", "iperf3")  # programs in a host: testbed.traffic's, iperf3


class FailureSpec(Strict):
    """One entry of a failure schedule, ``at_s`` seconds after the workload starts: an event
    (``link_up``, ``controller_restart``, ``kill``...) or, with ``for_s``, a fault that the
    schedule heals ``for_s`` later, and always heals when the run ends earlier, failed or
    not (``link_down``, ``switch_down``, ``impair``, ``stop``). Its target: one ``link`` or
    ``switch``; ``links``, ``switches`` or ``hosts`` chosen by a selector and ``mode`` (one,
    all, a ``fixed`` number, a ``percent`` of what the selector matches; picked with the
    scenario's seed); or a ``daemon`` (a fabric's, or a program in a ``host``)."""

    at_s: float = Field(ge=0, le=86_400)
    action: Literal[FAILURE_ACTIONS]
    for_s: float | None = Field(None, gt=0, le=86_400)
    link: Pair | None = None
    switch: NodeName | None = None
    host: NodeName | None = None
    links: TargetSelector | None = None
    switches: TargetSelector | None = None
    hosts: TargetSelector | None = None
    daemon: Literal[(*FABRIC_DAEMONS, *HOST_DAEMONS)] | None = None
    mode: Literal["one", "all", "fixed", "percent"] | None = None
    value: float | None = Field(None, gt=0)
    loss_percent: float = Field(0.0, ge=0, le=100)
    delay_ms: float = Field(0.0, ge=0, le=10_000)
    jitter_ms: float = Field(0.0, ge=0, le=10_000)

    @model_validator(mode="after")
    def _target(self):
        for problem in failure_spec_problems(self):
            raise ValueError(problem)
        return self

    @property
    def selector(self) -> TargetSelector | None:
        return self.links or self.switches or self.hosts


def failure_spec_problems(spec: FailureSpec) -> list[str]:
    """What is wrong with one schedule entry on its own: the target its action needs (and
    none it does not), ``for_s`` where a fault is healed, ``mode`` and ``value`` with a
    selector, delay and loss with ``impair``."""
    action = spec.action
    given = [name for name in ("link", "links", "switch", "switches", "host", "hosts", "daemon")
             if getattr(spec, name) is not None]
    if action.startswith("link_") or action == "impair":  # (or links: a selector)
        wanted, needs = ("link", "links"), "link: [a, b]"
    elif action.startswith("switch_"):  # (or switches: a selector)
        wanted, needs = ("switch", "switches"), "switch: NAME"
    elif action in ("stop", "kill"):
        wanted, needs = ("daemon", "host", "hosts"), f"daemon: one of {', '.join(FABRIC_DAEMONS)}, or " \
            f"{' or '.join(HOST_DAEMONS)} with host: NAME (or hosts: a selector)"
    else:
        wanted, needs = (), ""
    for name in given:
        if name not in wanted:
            return [f"{action} takes no {name}"]
    chosen = [name for name in given if name != "daemon"]
    if len(chosen) > 1:
        return [f"give one of {' or '.join(chosen)}, not both"]
    if wanted and not given or action in ("stop", "kill") and spec.daemon is None:
        return [f"{action} needs {needs}"]
    if spec.daemon in FABRIC_DAEMONS and chosen:
        return [f"daemon {spec.daemon} runs beside the fabric, not in a host: leave out {chosen[0]}"]
    if spec.daemon in HOST_DAEMONS and not chosen:
        return [f"daemon {spec.daemon} runs in hosts: name one (host: NAME) or select them "
                "(hosts: a selector)"]
    if spec.for_s is None and action in WINDOWED_ACTIONS:
        return [f"{action} needs for_s: how long it lasts (it is healed then, or when the run "
                "ends first)"]
    if spec.for_s is not None and action not in HEALED_ACTIONS:
        return [f"{action} takes no for_s (only {', '.join(HEALED_ACTIONS)} are healed)"]
    if (spec.mode is not None or spec.value is not None) and spec.selector is None:
        return ["mode and value choose among a selector's targets (links, switches or hosts)"]
    if spec.mode == "fixed" and (spec.value is None or not float(spec.value).is_integer()):
        return ["mode fixed needs value: a whole number of targets"]
    if spec.mode == "percent" and (spec.value is None or spec.value > 100):
        return ["mode percent needs value: a percentage of the targets, at most 100"]
    if spec.mode in (None, "one", "all") and spec.value is not None:
        return [f"mode {spec.mode or 'all'} takes no value"]
    impaired = [name for name in ("loss_percent", "delay_ms", "jitter_ms") if getattr(spec, name)]
    if action != "impair" and impaired:
        return [f"{impaired[0]} is for action impair"]
    if action == "impair" and not (spec.delay_ms or spec.loss_percent):
        return ["impair needs delay_ms or loss_percent"]
    if spec.jitter_ms and not spec.delay_ms:
        return ["jitter_ms needs delay_ms"]
    return []


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
    mtu_bytes: int | None = Field(None, ge=MIN_MTU_BYTES, le=MAX_MTU_BYTES)
    routing: str = "ecmp"
    queue: QueueSpec | None = None
    hosts: HostsSpec = HostsSpec()
    anycast: AnycastSpec | None = None
    failures: list[FailureSpec] = []
    impairments: list[ImpairmentSpec] = []
    params: dict[str, Any] = {}
    seed: int = Field(1, ge=0, le=2**31 - 1)
    results_dir: str = "results"

    @field_validator("results_dir")
    @classmethod
    def _printable_path(cls, value: str) -> str:
        if not value or any(ord(c) < 0x20 or ord(c) == 0x7F for c in value):
            raise ValueError("must be a folder path without control characters (newlines, "
                             f"tabs), got {short(value)}")
        return value


# --- problems ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Problem:
    """One thing wrong with a scenario: where (a field path) and what."""

    path: tuple
    message: str
    line: int | None = None
    origin: str | None = None  # the command-line flag that set the field, if one did

    @property
    def field(self) -> str:
        """The dotted path; a key that would not print as one short line is quoted."""
        return ".".join(str(p) if isinstance(p, int) else shown(str(p))
                        for p in self.path) or "scenario"

    def __str__(self) -> str:
        if self.origin:  # the flag, then the field it set: ``--rate-mbit: link_rate_mbit: ...``
            named = self.origin if self.origin.endswith(self.field) else \
                f"{self.origin}: {self.field}"
            return f"{named}: {self.message}"
        where = f"line {self.line}: " if self.line else ""
        return f"{where}{self.field + ': ' if self.path else ''}{self.message}"


class ScenarioError(ConfigError):
    """Every problem of a scenario: one line when there is one, else a line saying how many
    and one line per problem."""

    def __init__(self, source: str, problems: list[Problem]):
        self.problems = problems
        self.source = source = shown(source, 240)
        head = f"{source}: {len(problems)} problem{'s' if len(problems) != 1 else ''}"
        super().__init__(problems[0].field if len(problems) == 1 else source,
                         str(problems[0].message) if len(problems) == 1 else head)
        lines = ([f"{source}: {problems[0]}"] if len(problems) == 1
                 else [head, *(f"  {p}" for p in problems)])
        self.args = ("\n".join(lines),)

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
            message = f"{NAME_RULE}, got {short(e['input'])}"
        elif e["type"] == "missing":
            message = "is required"
        elif "input" in e and e["type"] not in ("model_type",) and not isinstance(
                e["input"], (dict, list)):
            message += f", got {short(e['input'])}"
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


def topology_problems(spec) -> list[Problem]:
    """Unknown families and parameters by name, with the valid ones; then the builder's own
    checks (testbed.model.topology.build)."""
    if spec.family == "explicit":
        return []
    builder = BUILDERS.get(spec.name)
    if builder is None:
        return [Problem(("topology", "name"), f"unknown family {short(spec.name)}; known: "
                        f"{', '.join(sorted(BUILDERS))}")]
    valid = [name for name in parameters(builder, spec.params)
             if name not in ("host_rate_mbit", "mtu_bytes")]
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
            build(spec.name, **spec.params)
        except ConfigError as err:
            field = err.field.removeprefix("topology.")
            problems.append(Problem(("topology", *field.split(".")), err.problem))
    return problems


# --- reading files -------------------------------------------------------------------------------


def yaml_lines(root: yaml.Node | None) -> dict[tuple, int]:
    """Field path -> the 1-based line where its value starts, for every mapping key and
    sequence item of a composed YAML document (testbed.harness.yaml_input.compose)."""
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
    if root is not None:
        walk(root, ())
    return lines


def duplicate_keys(root: yaml.Node | None) -> list[Problem]:
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
    if root is not None:
        walk(root, ())
    return problems


def parse_yaml(text: str, source: str) -> dict:
    """The mapping a scenario's text holds (``parse_document``)."""
    return parse_document(text, source)[0]


def parse_document(text: str, source: str) -> tuple[dict, yaml.Node | None]:
    """The mapping a scenario's text holds, and its composed document (for field lines); a
    syntax error, or a document beyond testbed.harness.yaml_input's bounds, is one problem
    naming its line."""
    try:
        root = compose(text)
        data = construct(root)
    except YamlInputError as exc:
        raise ScenarioError(source, [Problem((), f"not valid YAML: {exc.problem}",
                                             exc.line)]) from None
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ScenarioError(source, [Problem((), "must be a mapping of field: value", 1)])
    return data, root


def scenario_path(path: str | Path) -> Path:
    """``path``, or the bundled scenario of that name when there is no such file and the
    name has no suffix (``testbed run fattree-allreduce``)."""
    path = Path(path)
    bundled = SCENARIO_DIR / f"{path.name}.yaml"
    if path.suffix == "" and not path.exists() and bundled.exists():
        return bundled
    return path


def read_text(path: str | Path) -> str:
    """A scenario file's text: a regular file of at most MAX_BYTES, checked before reading."""
    given, path = shown(str(path), 240), scenario_path(path)
    try:
        info = path.stat()
        if not stat.S_ISREG(info.st_mode):
            raise ConfigError(given, "not a regular file (a scenario is a YAML file)")
        if info.st_size > MAX_BYTES:
            raise ConfigError(given, f"{info.st_size} bytes; a scenario is at most "
                              f"{MAX_BYTES} bytes")
        with path.open(encoding="utf-8") as f:
            return f.read(MAX_BYTES + 1)
    except FileNotFoundError:
        raise ConfigError(given, "no such scenario file (bundled scenarios: "
                          f"{', '.join(sorted(p.stem for p in SCENARIO_DIR.glob('*.yaml')))})"
                          ) from None
    except OSError as exc:
        raise ConfigError(given, f"cannot read: {exc.strerror}") from None
    except UnicodeDecodeError:
        raise ConfigError(given, "not a text (UTF-8) file") from None


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
                raise ConfigError(shown(dotted), f"{shown(key)} is not a section")
            target = node
        target[last] = value
    return data


def locate(problem: Problem, lines: dict[tuple, int], origins: dict[str, str]) -> Problem:
    """``problem`` with where it comes from: the flag that set its field (or a parent), else
    its line in the file (or its closest parent's)."""
    for end in range(len(problem.path), 0, -1):
        origin = origins.get(".".join(str(p) for p in problem.path[:end]))
        if origin is not None:
            return Problem(problem.path, problem.message, None, origin)
    return Problem(problem.path, problem.message,
                   problem.line or nearest_line(lines, problem.path))


def nearest_line(lines: dict[tuple, int], path: tuple) -> int | None:
    """The line of ``path`` or of its closest parent that the file spells out."""
    for end in range(len(path), 0, -1):
        if path[:end] in lines:
            return lines[path[:end]]
    return None
