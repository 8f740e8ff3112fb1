"""Topologies as pure descriptions (testbed.model.topology.base.Fabric), by family name."""
from __future__ import annotations

import inspect

from pydantic import ConfigDict, TypeAdapter, ValidationError

from testbed.errors import ConfigError, short, shown
from testbed.model.topology.base import Fabric, Link, Node
from testbed.model.topology.checks import check_count, check_mtu, check_rate
from testbed.model.topology.clos import clos
from testbed.model.topology.dragonfly import dragonfly
from testbed.model.topology.fattree import fat_tree
from testbed.model.topology.line import line
from testbed.model.topology.nvswitch import MAX_GPUS, nvswitch_nodes
from testbed.model.topology.rail import rail
from testbed.model.topology.spineleaf import spine_leaf


def nvswitch(base: str = "fattree", gpus_per_node: int = 4, nvlink_ratio: float = 18.0,
             host_rate_mbit: float = 100.0, mtu_bytes: int = 9000, **base_params) -> Fabric:
    """Build the named base fabric (remaining keywords go to its builder), NIC rate
    ``host_rate_mbit``, and turn its hosts into NVSwitch nodes
    (testbed.model.topology.nvswitch.nvswitch_nodes). It lives beside ``BUILDERS``, which it
    looks its base up in."""
    if not isinstance(base, str) or base not in BUILDERS or base == "nvswitch":
        known = ", ".join(name for name in BUILDERS if name != "nvswitch")
        raise ConfigError("base", f"must be one of {known}, got {base!r}")
    check_count("gpus_per_node", gpus_per_node, maximum=MAX_GPUS)
    check_rate("host_rate_mbit", host_rate_mbit)
    check_mtu(mtu_bytes)
    return nvswitch_nodes(BUILDERS[base](host_rate_mbit=host_rate_mbit, mtu_bytes=mtu_bytes,
                                         **base_params), gpus_per_node, nvlink_ratio)


BUILDERS = {"fattree": fat_tree, "line": line, "spineleaf": spine_leaf, "clos": clos,
            "dragonfly": dragonfly, "nvswitch": nvswitch, "rail": rail}
# Parameter types checked before a builder runs (plain values, as YAML and flags give them);
# the builders check ranges, and the explicit family checks its own nodes and links.
CHECKED_TYPES = (int, float, str, bool, type(None))
FINITE = ConfigDict(allow_inf_nan=False)

__all__ = ["BUILDERS", "Fabric", "Link", "Node", "build", "parameters"]


def signature(builder) -> dict[str, inspect.Parameter]:
    return dict(inspect.signature(builder, eval_str=True).parameters)


def parameters(builder, given: dict) -> dict[str, inspect.Parameter]:
    """The parameters a topology builder takes, by name; a builder over a ``base`` family
    (nvswitch) takes the parameters of the base ``given`` names (or its default) too."""
    own = signature(builder)
    taken = {name: p for name, p in own.items() if p.kind is not inspect.Parameter.VAR_KEYWORD}
    if len(taken) < len(own):
        base = given.get("base", own["base"].default)
        if isinstance(base, str) and BUILDERS.get(base, builder) is not builder:
            taken.update({name: p for name, p in parameters(BUILDERS[base], {}).items()
                          if name not in taken})
    return taken


def type_problem(parameter: inspect.Parameter, value) -> str | None:
    """Why ``value`` is not of the parameter's annotated type (taken as written: no bool for
    a number, no "4" for 4), or None; annotations other than plain values are the builder's
    to check."""
    annotation = parameter.annotation
    members = getattr(annotation, "__args__", (annotation,))
    if annotation is inspect.Parameter.empty or not all(m in CHECKED_TYPES for m in members):
        return None
    try:
        TypeAdapter(annotation, config=FINITE).validate_python(value, strict=True)
    except ValidationError as err:
        return f"{err.errors()[0]['msg']}, got {value!r}"
    return None


def build(kind: str, **params) -> Fabric:
    """Build the named topology; unknown names and parameters, and values of the wrong type,
    are ConfigErrors naming them."""
    builder = BUILDERS.get(kind)
    if builder is None:
        raise ConfigError("topology", f"unknown topology {short(kind)}; known: "
                          f"{', '.join(BUILDERS)}")
    taken = parameters(builder, params)
    for key, value in params.items():
        if key not in taken:
            raise ConfigError(shown(key), f"not a parameter of {kind}; valid: "
                              f"{', '.join(taken)}")
        problem = type_problem(taken[key], value)
        if problem:
            raise ConfigError(key, problem)
    return builder(**params)
