"""Where a run's numbers come from: the testbed's version and commit, the kernel, Open vSwitch,
Python, the machine's size, and the path each feature took (testbed.capabilities)."""
from __future__ import annotations

import os
import platform as pyplatform
import subprocess
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


def provenance(platform) -> dict:
    """Everything that identifies the software and machine a run measured."""
    return {
        "testbed_version": testbed.__version__,
        "commit": git_commit(),
        "kernel": platform.kernel_release,
        "ovs_version": ovs_version(),
        "python": pyplatform.python_version(),
        "machine": pyplatform.machine(),
        "cpus": os.cpu_count(),
        "memory_bytes": os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"),
        "paths": asdict(platform.paths),
    }
