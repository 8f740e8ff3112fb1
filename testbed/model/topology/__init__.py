"""Topologies as pure descriptions (testbed.model.topology.base.Fabric), by family name."""
from __future__ import annotations

from testbed.errors import ConfigError
from testbed.model.topology.base import Fabric, Link, Node
from testbed.model.topology.clos import clos
from testbed.model.topology.dragonfly import dragonfly
from testbed.model.topology.fattree import fat_tree
from testbed.model.topology.line import line
from testbed.model.topology.nvswitch import nvswitch
from testbed.model.topology.rail import rail
from testbed.model.topology.spineleaf import spine_leaf

BUILDERS = {"fattree": fat_tree, "line": line, "spineleaf": spine_leaf, "clos": clos,
            "dragonfly": dragonfly, "nvswitch": nvswitch, "rail": rail}

__all__ = ["BUILDERS", "Fabric", "Link", "Node", "build"]


def build(kind: str, **params) -> Fabric:
    """Build the named topology; unknown names and parameters are ConfigErrors."""
    try:
        builder = BUILDERS[kind]
    except KeyError:
        raise ConfigError("topology", f"unknown topology {kind!r}; known: {', '.join(BUILDERS)}") from None
    try:
        return builder(**params)
    except TypeError as exc:
        raise ConfigError("topology", f"bad parameters for {kind}: {exc}") from None
