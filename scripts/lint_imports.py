#!/usr/bin/env python3
"""Check the layering: import-linter's contracts (setup.cfg's [importlinter] sections) on the
package as it is installed.

The repository keeps the testbed's three programs side by side (testbed/, controllers/,
traffic/) while the distribution installs them as one package (testbed, testbed.controllers,
testbed.traffic: setup.py's package_dir). import-linter reads a package from its folder, so this
stages that installed layout (the .py files, copied into a temporary folder) and runs
``lint-imports`` on it with the repository's contracts, with this folder on its path for the
experiments' contract type (experiment_contract.py). The exit status is lint-imports': 0 when
every contract is kept.

    python scripts/lint_imports.py            # make lint-imports
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CONFIG = ROOT / "setup.cfg"
SCRIPTS = ROOT / "scripts"  # experiment_contract.py, the contract type setup.cfg names
# Folder in the repository -> where it is installed inside the package (setup.py's PROGRAMS).
LAYOUT = {"testbed": "testbed", "controllers": "testbed/controllers",
          "traffic": "testbed/traffic"}


def stage(into: Path, added: dict[str, str] | None = None) -> Path:
    """The installed layout's Python files under ``into``; returns ``into``. ``added``: lines
    appended to staged files, by their installed path, a file or folder created when new (how a
    test shows which change breaks a contract)."""
    for folder, installed in LAYOUT.items():
        for path in (ROOT / folder).rglob("*.py"):
            target = into / installed / path.relative_to(ROOT / folder)
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(path, target)
    for installed, text in (added or {}).items():
        (into / installed).parent.mkdir(parents=True, exist_ok=True)
        with open(into / installed, "a") as fh:
            fh.write(f"\n{text}\n")
    return into


def lint_imports_argv() -> list[str]:
    """lint-imports beside this interpreter (the venv's), else on PATH."""
    beside = Path(sys.executable).parent / "lint-imports"
    return [str(beside if beside.exists() else shutil.which("lint-imports") or "lint-imports"),
            "--no-cache", str(CONFIG)]


def run(capture: bool = False,
        added: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """lint-imports on a staged copy of the installed layout (``added``: see ``stage``)."""
    with tempfile.TemporaryDirectory(prefix="testbed-layers-") as tmp:
        staged = stage(Path(tmp), added)
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(staged), str(SCRIPTS)])}
        return subprocess.run(lint_imports_argv(), cwd=staged, env=env, text=True,
                              capture_output=capture, check=False)


if __name__ == "__main__":
    sys.exit(run().returncode)
