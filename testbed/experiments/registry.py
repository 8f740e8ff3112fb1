"""Every experiment by name, and scenarios resolved against them: the one list the CLI, the
scenario schema and ``testbed run`` read. Adding an experiment is a folder under
testbed/experiments/ and one line here.

It sits above the experiments (it loads them) and above the harness's scenario schema
(testbed.harness.scenario) and experiment protocol (testbed.harness.experiment), which know no
experiment: ``load`` and ``validate`` turn a scenario file or mapping into a
testbed.harness.experiment.Resolved (its experiment, parameters, setups and this machine's
platform), reporting every problem at once; ``json_schema`` is the scenario schema with each
experiment's ``params``."""
from __future__ import annotations

import importlib
from pathlib import Path

from pydantic import TypeAdapter, ValidationError

from testbed.capabilities import detect
from testbed.errors import ConfigError, TestbedError, short
from testbed.harness.experiment import (
    COMMON_SECTIONS,
    HOSTS,
    ROUTING,
    Resolved,
    Setup,
)
from testbed.harness.plans import common_problems, ecn_path_for, target_problems
from testbed.harness.scenario import (
    Problem,
    Scenario,
    ScenarioError,
    TopologySpec,
    dedupe,
    duplicate_keys,
    locate,
    merge,
    parse_document,
    pydantic_problems,
    read_text,
    topology_problems,
    yaml_lines,
)

EXPERIMENTS = {  # name (a scenario's ``experiment``, a CLI subcommand) -> "module:Class"
    "allreduce": "testbed.experiments.allreduce.experiment:AllReduce",
    "anycast-failover": "testbed.experiments.anycast_failover.experiment:Anycast",
    "hedera": "testbed.experiments.hedera.experiment:Hedera",
    "dragonfly-routing": "testbed.experiments.dragonfly_routing.experiment:DragonflyRouting",
    "dctcp": "testbed.experiments.dctcp.experiment:Dctcp",
    "incast": "testbed.experiments.incast.experiment:Incast",
    "pfc-demo": "testbed.experiments.pfc_demo.experiment:PfcDemo",
    "roce-loss": "testbed.experiments.roce_loss.experiment:RoceLoss",
    "roce-dcqcn": "testbed.experiments.roce_dcqcn.experiment:RoceDcqcn",
    "roce-incast-pfc": "testbed.experiments.roce_incast_pfc.experiment:RoceIncastPfc",
    "roce-dctcp": "testbed.experiments.roce_dctcp.experiment:RoceDctcp",
    "collectives-sweep": "testbed.experiments.collectives_sweep.experiment:CollectivesSweep",
    "data-parallel": "testbed.experiments.data_parallel.experiment:DataParallel",
    "parameter-server": "testbed.experiments.parameter_server.experiment:ParameterServer",
    "tensor-parallel": "testbed.experiments.tensor_parallel.experiment:TensorParallel",
    "pipeline-parallel": "testbed.experiments.pipeline_parallel.experiment:PipelineParallel",
    "torch-ddp": "testbed.experiments.torch_ddp.experiment:TorchDdp",
    "replay": "testbed.experiments.replay.experiment:Replay",
}


def experiment_class(name: str):
    module, _, cls = EXPERIMENTS[name].partition(":")
    return getattr(importlib.import_module(module), cls)


def experiment_classes() -> dict:
    """name -> class, for the experiments whose modules exist (all of them, once built)."""
    classes = {}
    for name in EXPERIMENTS:
        try:
            classes[name] = experiment_class(name)
        except ModuleNotFoundError as err:
            if not err.name.startswith("testbed.experiments."):
                raise
    return classes


def resolve(scenario: Scenario) -> tuple[Resolved | None, list[Problem]]:
    """Everything about ``scenario`` that needs more than the schema: its experiment and
    parameters, which common sections that experiment honours, the topology and the other
    names it refers to, and what the machine can do. Returns the problems found (the
    resolved scenario only when there are none)."""
    classes = experiment_classes()
    cls = classes.get(scenario.experiment)
    if cls is None:
        return None, [Problem(("experiment",), f"unknown experiment {short(scenario.experiment)}; "
                              f"known: {', '.join(sorted(classes))}")]
    problems: list[Problem] = []
    try:
        params = cls.Params.model_validate(scenario.params)
    except ValidationError as err:
        problems += pydantic_problems(err, ("params",))
        params = None
    for section in sorted(COMMON_SECTIONS - cls.sections):
        given = getattr(scenario, section)
        if section == ROUTING and given == "ecmp":
            continue
        if section == HOSTS and not given.model_fields_set:
            continue
        if given is not None:
            problems.append(Problem((section,), f"{cls.name} sets this itself for each of its "
                                    f"fabrics; leave it out"))
    platform = detect()
    problems += common_problems(scenario, cls, platform)
    if problems or params is None:
        return None, problems
    experiment = cls(scenario, params, platform)
    problems += experiment.problems()
    setups: list[Setup] = []
    if not problems:
        try:
            setups = experiment.setups()
        except ConfigError as err:
            problems.append(Problem(tuple(err.field.split(".")), err.problem))
        except TestbedError as err:
            problems.append(Problem((), str(err)))
        problems += target_problems(scenario, setups, platform)
    ecn_path = None
    if not problems:
        try:
            ecn_path = ecn_path_for(setups, scenario, platform)
        except ConfigError as err:
            problems.append(Problem(tuple(err.field.split(".")), err.problem))
        except TestbedError as err:
            problems.append(Problem(("queue",), str(err)))
    if problems:
        return None, problems
    return Resolved(scenario, experiment, platform, setups, ecn_path), []


def load(path: str | Path, overrides: dict | None = None, origins: dict | None = None):
    """Read, merge ``overrides`` (dotted field -> value, from the command line) and validate a
    scenario file; returns a testbed.harness.experiment.Resolved. A bundled scenario may be
    named without its folder and suffix (``testbed run fattree-allreduce``). ``origins``
    (dotted field -> the flag that set it) makes a problem in a field a flag set name the
    flag instead of a line of the file."""
    text = read_text(path)
    data, root = parse_document(text, str(path))
    return validate(merge(data, overrides or {}), str(path), yaml_lines(root),
                    duplicate_keys(root), origins)


def validate(data: dict, source: str = "scenario", lines: dict | None = None,
             early: list[Problem] | None = None, origins: dict | None = None):
    """Every problem of a scenario mapping at once (ScenarioError), or the scenario with
    its experiment, parameters and platform resolved. ``lines``: field path -> line in the
    file; ``origins``: dotted field -> the flag that set it (named instead of a line)."""
    problems = list(early or [])
    try:
        scenario = Scenario.model_validate(data)
    except ValidationError as err:
        problems += pydantic_problems(err)
        scenario = None
    if scenario is None:
        problems += section_problems(data)
    resolved = None
    if scenario is not None:
        resolved, more = resolve(scenario)
        problems += more
    if problems:
        located = sorted((locate(p, lines or {}, origins or {}) for p in dedupe(problems)),
                         key=lambda p: p.line or 0)
        raise ScenarioError(source, located)
    return resolved


def section_problems(data: dict) -> list[Problem]:
    """When the scenario as a whole did not validate, the problems of the sections that can
    be checked on their own: the topology's parameters and the experiment's params."""
    problems = []
    if isinstance(data.get("topology"), dict):
        try:
            problems += topology_problems(TypeAdapter(TopologySpec).validate_python(
                data["topology"]))
        except ValidationError:
            pass
    name = data.get("experiment", "allreduce")
    cls = experiment_classes().get(name) if isinstance(name, str) else None
    if cls is not None and isinstance(data.get("params", {}), dict):
        try:
            cls.Params.model_validate(data.get("params", {}))
        except ValidationError as err:
            problems += pydantic_problems(err, ("params",))
    return problems


def json_schema() -> dict:
    """The scenario schema for editors (JSON Schema 2020-12): the common fields, and each
    experiment's ``params`` chosen by ``experiment``."""
    schema = Scenario.model_json_schema()
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    schema["title"] = "testbed scenario"
    defs = schema.setdefault("$defs", {})
    classes = experiment_classes()
    schema["properties"]["experiment"]["enum"] = sorted(classes)
    branches = []
    for name, cls in sorted(classes.items()):
        params = cls.Params.model_json_schema()
        for key, sub in params.pop("$defs", {}).items():
            defs[key] = sub
        ref = f"{cls.Params.__name__}_{name.replace('-', '_')}"
        defs[ref] = params
        branches.append({"if": {"properties": {"experiment": {"const": name}}},
                         "then": {"properties": {"params": {"$ref": f"#/$defs/{ref}"}}}})
    schema["allOf"] = branches
    return schema
