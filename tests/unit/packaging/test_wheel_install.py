"""The wheel installs beside a user's own stack. It is built offline from a copy of the
sources and installed into a fresh venv (no system site-packages) that already holds the
oldest numpy the wheel admits (the lower bound of its declared range, older than this
Python's pin on 3.11 and 3.12); the install must keep that numpy, and the installed
``testbed topo`` and ``testbed doctor --no-probe`` (which builds no namespace) must work.

Needs the package registry: the venv's packages (numpy and the wheel's dependencies) come
from pip's configured sources, PyPI or a mirror, as on CI's machine; pip's cache makes a
second run fast. Marked ``registry`` (``-m "not registry"`` leaves it out offline)."""
from __future__ import annotations

import json
import os
import subprocess
import venv
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from tests.unit.packaging.wheel_build import REPO, build_wheel

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10; pytest depends on tomli there
    import tomli as tomllib

pytestmark = pytest.mark.registry

PIP_TIMEOUT_S = 600
RUN_TIMEOUT_S = 120
FATTREE_K4_HOSTS = 16


def oldest_numpy() -> str:
    """The lower bound of the wheel's numpy range."""
    (numpy,) = [Requirement(text) for text in
                tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]
                if Requirement(text).name == "numpy"]
    (lowest,) = [spec.version for spec in numpy.specifier if spec.operator == ">="]
    return lowest


@pytest.fixture(scope="module")
def user_venv(tmp_path_factory) -> Path:
    """A fresh venv holding the oldest numpy in range, then the wheel with its dependencies."""
    wheel = build_wheel(tmp_path_factory.mktemp("src"), tmp_path_factory.mktemp("wheel"))
    home = tmp_path_factory.mktemp("venv")
    venv.EnvBuilder(with_pip=True, system_site_packages=False).create(home)
    pip = [str(home / "bin" / "python"), "-m", "pip", "install", "--quiet",
           "--disable-pip-version-check"]
    subprocess.run([*pip, f"numpy=={oldest_numpy()}"], check=True, timeout=PIP_TIMEOUT_S)
    subprocess.run([*pip, str(wheel)], check=True, timeout=PIP_TIMEOUT_S)
    return home


def run_in(home: Path, *argv: str) -> subprocess.CompletedProcess:
    """A command of the venv's, from a folder outside the checkout (no source tree on the
    path), with only the venv's bin on PATH before the system's."""
    env = {**os.environ, "PATH": f"{home / 'bin'}:/usr/sbin:/usr/bin:/sbin:/bin"}
    env.pop("PYTHONPATH", None)
    return subprocess.run([str(home / "bin" / argv[0]), *argv[1:]], capture_output=True,
                          text=True, cwd=home, env=env, timeout=RUN_TIMEOUT_S)


def test_the_install_keeps_the_users_older_numpy(user_venv):
    done = run_in(user_venv, "python", "-c", "import numpy, testbed; print(numpy.__version__, "
                  "testbed.__file__)")
    assert done.returncode == 0, done.stderr
    version, module = done.stdout.split()
    assert version == oldest_numpy()
    assert Path(module).is_relative_to(user_venv)  # the installed wheel, not the checkout


def test_testbed_topo_runs_from_the_wheel(user_venv):
    done = run_in(user_venv, "testbed", "topo", "fattree", "k=4", "--json")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["hosts"] == FATTREE_K4_HOSTS


def test_testbed_doctor_runs_from_the_wheel(user_venv):
    # Without system site-packages the venv has no Mininet (the distribution's); doctor says
    # so and still reports the rest, exiting 0.
    done = run_in(user_venv, "testbed", "doctor", "--no-probe")
    assert done.returncode == 0, done.stderr
    lines = {line.split()[0]: line.split()[1] for line in done.stdout.splitlines()
             if len(line.split()) > 1}
    assert lines["capability"] == "avail" and lines["mininet"] == "no"
    assert lines["ovs_datapath"] in {"kernel", "userspace"}
