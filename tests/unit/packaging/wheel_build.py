"""Build the testbed's wheel offline from a copy of the sources (no build/ folder of the
checkout's can leak stale files into it): ``pip wheel --no-build-isolation`` with the venv's
setuptools, which the test extra pins. The wheel tests share it."""
from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import setuptools
from packaging.requirements import Requirement

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10; pytest depends on tomli there
    import tomli as tomllib

REPO = Path(__file__).resolve().parents[3]
# What the build reads: the three programs' folders and these files.
PROGRAM_FOLDERS = ("testbed", "controllers", "traffic")
BUILD_INPUTS = ("pyproject.toml", "setup.py", "setup.cfg", "README.md", "LICENSE")
BUILD_TIMEOUT_S = 300


def build_wheel(src: Path, out: Path) -> Path:
    """Copy the sources into the empty folder ``src``, build the wheel into ``out`` and
    return its path."""
    (requirement,) = [Requirement(r) for r in
                      tomllib.loads((REPO / "pyproject.toml").read_text())["build-system"]["requires"]
                      if Requirement(r).name == "setuptools"]
    assert requirement.specifier.contains(setuptools.__version__), (
        f"the venv's setuptools {setuptools.__version__} does not meet the build requirement "
        f"{requirement}: reinstall the test extra (requirements-test.txt pins it)")
    for name in BUILD_INPUTS:
        shutil.copy2(REPO / name, src / name)
    for folder in PROGRAM_FOLDERS:
        shutil.copytree(REPO / folder, src / folder,
                        ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
                    "--no-index", "--quiet", "--wheel-dir", str(out), str(src)],
                   check=True, cwd=src, timeout=BUILD_TIMEOUT_S)
    (wheel,) = out.glob("*.whl")
    return wheel
