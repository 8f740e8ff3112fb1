"""Scenario files: YAML that sets RunConfig fields, checked field by field.

    name: fattree-allreduce
    topology: {name: fattree, k: 4}
    link_rate_mbit: 6
    workload: allreduce
    size_bytes: 2097152
"""
from __future__ import annotations

import dataclasses
from pathlib import Path

import yaml

from testbed.errors import ConfigError
from testbed.experiments.allreduce.run import RunConfig

FIELD_TYPES = {f.name: f.type for f in dataclasses.fields(RunConfig)}
_PY_TYPES = {"str": (str,), "int": (int,), "float": (int, float), "dict": (dict,),
             "bool": (bool,), "str | None": (str, type(None)), "dict | None": (dict, type(None))}


def load_scenario(path: str | Path) -> RunConfig:
    """Read a scenario file into a validated RunConfig; every problem names its field."""
    return config_from_dict(read_scenario(path), str(path))


def read_scenario(path: str | Path) -> dict:
    """The raw mapping of a scenario file."""
    path = Path(path)
    try:
        data = yaml.safe_load(path.read_text())
    except OSError as exc:
        raise ConfigError(str(path), f"cannot read: {exc.strerror}") from None
    except UnicodeDecodeError:
        raise ConfigError(str(path), "not a text (UTF-8) file") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark else ""
        raise ConfigError(str(path), f"not valid YAML{where}") from None
    if not isinstance(data, dict):
        raise ConfigError(str(path), "must be a mapping of field: value")
    return data


def config_from_dict(data: dict, source: str = "scenario") -> RunConfig:
    data = dict(data)
    kwargs = {}
    topo = data.pop("topology", None)
    if topo is not None:
        if isinstance(topo, str):
            topo = {"name": topo}
        if not isinstance(topo, dict) or "name" not in topo:
            raise ConfigError("topology", "must be a name or a mapping with 'name'")
        topo = dict(topo)
        kwargs["topology"] = topo.pop("name")
        kwargs["topology_params"] = topo
    for key, value in data.items():
        if key not in FIELD_TYPES or key == "topology_params":
            known = ", ".join(k for k in FIELD_TYPES if k != "topology_params")
            raise ConfigError(key, f"unknown field in {source} (known: {known})")
        want = _PY_TYPES[FIELD_TYPES[key]]
        if isinstance(value, bool) != (bool in want) or not isinstance(value, want):
            raise ConfigError(key, f"must be {FIELD_TYPES[key]}, got {value!r}")
        kwargs[key] = value
    config = RunConfig(**kwargs)
    config.validate()
    return config
