"""Parameter checks every topology builder shares; each failure is a one-line ConfigError that
names the parameter.

Counts are capped at MAX_COUNT so every coordinate has at most two digits: names such as
``p99l99h99-eth0`` then stay within Linux's 15-character interface names and every coordinate
fits an address octet. The machine-size limit (testbed.model.topology.limits) is far lower anyway.
"""
from __future__ import annotations

import math
from numbers import Real

from testbed.errors import ConfigError
from testbed.model.topology.base import LINUX_IFNAMSIZ_CHARS, Fabric

MAX_COUNT = 100
# The MTUs the testbed takes, for topologies and scenarios alike: from 576 bytes (the datagram
# every IPv4 host must accept, RFC 791) to 9000 (the jumbo frames data-center NICs and switches
# carry). Linux itself would take 68 to a veth's 65535.
MIN_MTU_BYTES, MAX_MTU_BYTES = 576, 9000


def is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def check_count(field: str, value, minimum: int = 1, maximum: int = MAX_COUNT) -> int:
    """An integer in [minimum, maximum]; bools, floats and strings are rejected."""
    if not is_int(value) or not minimum <= value <= maximum:
        raise ConfigError(field, f"must be an integer in [{minimum}, {maximum}], got {value!r}")
    return value


def check_rate(field: str, value) -> float:
    """A positive, finite number (a rate in Mbit/s or a ratio); NaN and bools are rejected."""
    if isinstance(value, bool) or not isinstance(value, Real) or not 0 < value < math.inf:
        raise ConfigError(field, f"must be a positive number, got {value!r}")
    return value


def check_mtu(value) -> int:
    return check_count("mtu_bytes", value, MIN_MTU_BYTES, MAX_MTU_BYTES)


def check_interface_names(fabric: Fabric, field: str, advice: str) -> None:
    """Every interface name fits Linux's limit, or a ConfigError on ``field`` naming the
    longest one and ending in ``advice`` (what to make smaller)."""
    longest = max(fabric.interface_names(), key=len)
    if len(longest) > LINUX_IFNAMSIZ_CHARS:
        raise ConfigError(field, f"interface {longest} has {len(longest)} characters; Linux "
                          f"allows {LINUX_IFNAMSIZ_CHARS}: {advice}")
