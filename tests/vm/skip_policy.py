"""The stock-kernel suite's rules, as pure functions (tests/vm/conftest.py applies them):

- its own tests (this folder) run only inside the guest that ``make vm-test`` boots, where
  TESTBED_IN_VM=1; anywhere else they are deselected, never skipped;
- inside the guest a skipped test (or an expected failure) fails the session unless the
  allowlist (allowed-skips.txt beside this file) names it with its reason; the allowlist is
  printed when the session starts.

The allowlist holds one test per line, ``<pytest node id> -- <reason>``; blank lines and
lines starting with ``#`` are comments. Only numbers that depend on the emulator keeping up
belong there (software emulation cannot hold them at any rate), never a functional assertion.
"""
from __future__ import annotations

from collections.abc import Mapping

IN_VM_ENV = "TESTBED_IN_VM"
SEPARATOR = " -- "


def in_vm(environ: Mapping[str, str]) -> bool:
    """Whether this session runs inside the stock-kernel guest."""
    return environ.get(IN_VM_ENV) == "1"


def parse_allowlist(text: str) -> dict[str, str]:
    """Allowlist text -> {node id: reason}. A line without a reason, or a test listed twice,
    is a ValueError naming the line."""
    allowed: dict[str, str] = {}
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        nodeid, sep, reason = line.partition(SEPARATOR)
        nodeid, reason = nodeid.strip(), reason.strip()
        if not sep or not nodeid or not reason:
            raise ValueError(f"allowed-skips.txt line {number}: expected '<node id>{SEPARATOR}"
                             f"<reason>', got {line!r}")
        if nodeid in allowed:
            raise ValueError(f"allowed-skips.txt line {number}: {nodeid} is listed twice")
        allowed[nodeid] = reason
    return allowed


def header_lines(allowed: Mapping[str, str]) -> list[str]:
    """What the session prints first: the skips it will accept, with their reasons."""
    if not allowed:
        return ["stock-kernel suite: no skip is allowed (tests/vm/allowed-skips.txt is empty)"]
    return ([f"stock-kernel suite: {len(allowed)} skip(s) allowed (tests/vm/allowed-skips.txt):"]
            + [f"  {nodeid} -- {reason}" for nodeid, reason in allowed.items()])


def unexpected_skips(skipped: Mapping[str, str], allowed: Mapping[str, str]) -> list[str]:
    """One line per skipped test the allowlist does not name (its node id and skip reason)."""
    return [f"{nodeid}: skipped ({reason}) but not in tests/vm/allowed-skips.txt"
            for nodeid, reason in skipped.items() if nodeid not in allowed]
