"""Where a run's numbers come from: the command that made it, the testbed's version and
commit, the kernel, Open vSwitch, Mininet, Python and every Python dependency's version, the
machine's size, and the path each feature took (testbed.capabilities)."""
from __future__ import annotations

import os
import platform as pyplatform
import re
import subprocess
import sys
from importlib import metadata
from dataclasses import asdict
from pathlib import Path

import testbed

SOURCE_ROOT = Path(testbed.__file__).resolve().parents[1]


def git_commit(root: Path = SOURCE_ROOT) -> str | None:
    """The checked-out commit (with ``-dirty`` when files differ), None outside a checkout."""
    if not (root / ".git").exists():
        return None
    try:
        out = subprocess.run(["git", "-C", str(root), "describe", "--always", "--dirty",
                              "--abbrev=12"], capture_output=True, text=True, timeout=5)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip() or None if out.returncode == 0 else None


def version_line() -> str:
    """``testbed 0.2.0 (commit 0123abcd4567)``, the commit only in a git checkout."""
    commit = git_commit()
    return f"testbed {testbed.__version__}" + (f" (commit {commit})" if commit else "")


def ovs_version() -> str | None:
    try:
        out = subprocess.run(["ovs-vswitchd", "--version"], capture_output=True, text=True,
                             timeout=5)
    except (OSError, subprocess.TimeoutExpired):
        return None
    first = out.stdout.splitlines()[0] if out.stdout else ""
    return first.rsplit(" ", 1)[-1] or None


DISTRIBUTION = "dcfabric-testbed"  # pyproject.toml's project name


def installed_version(distribution: str) -> str | None:
    """The installed version of a Python distribution, None when it is not installed."""
    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return None


def requirement_names(requirements: list[str]) -> list[str]:
    """The distribution names of requirement lines (``numpy==2.4.6; python_version ...``),
    each once, in order."""
    names = [re.match(r"[A-Za-z0-9][A-Za-z0-9._-]*", line.strip()) for line in requirements]
    return list(dict.fromkeys(m.group(0) for m in names if m))


def python_packages() -> dict[str, str | None]:
    """The installed version of every Python dependency the testbed declares (the runtime
    pins and the extras'), None for one not installed; {} outside an installed testbed."""
    try:
        requirements = metadata.requires(DISTRIBUTION) or []
    except metadata.PackageNotFoundError:
        return {}
    return {name: installed_version(name) for name in requirement_names(requirements)}


def command_line(argv: list[str] | None = None) -> list[str]:
    """The command as typed: the program's name without its folder, then its arguments."""
    argv = sys.argv if argv is None else argv
    return [os.path.basename(argv[0]), *argv[1:]] if argv else []


def uname() -> str:
    """``uname -srvm``: kernel name, release, version and machine."""
    u = os.uname()
    return f"{u.sysname} {u.release} {u.version} {u.machine}"


def provenance(platform) -> dict:
    """Everything that identifies the software and machine a run measured, and the command
    that made it."""
    return {
        "testbed_version": testbed.__version__,
        "commit": git_commit(),
        "command_line": command_line(),
        "kernel": platform.kernel_release,
        "uname": uname(),
        "ovs_version": ovs_version(),
        "mininet_version": installed_version("mininet"),
        "python": pyplatform.python_version(),
        "python_packages": python_packages(),
        "machine": pyplatform.machine(),
        "cpus": os.cpu_count(),
        "memory_bytes": os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"),
        "paths": asdict(platform.paths),
    }
