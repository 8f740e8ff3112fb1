"""Topologies as pure descriptions (testbed.model.topology.base.Fabric), by family name."""
from __future__ import annotations

from testbed.errors import ConfigError
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
