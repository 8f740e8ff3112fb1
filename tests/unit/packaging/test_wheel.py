"""What the distribution installs: the repository's three programs (testbed/, controllers/,
traffic/) under the one import name ``testbed``. A wheel is built offline from a copy of the
sources (pip wheel --no-build-isolation, with the venv's setuptools) and its file list and
Requires-Dist read (compatible ranges, never exact pins); the editable install this checkout runs from must resolve testbed.controllers and
testbed.traffic to the top-level folders."""
from __future__ import annotations

import zipfile
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from tests.unit.packaging.wheel_build import REPO, build_wheel

import testbed.controllers
import testbed.traffic

# Import name -> the repository folder it is installed from.
PROGRAMS = {"testbed": "testbed", "testbed/controllers": "controllers",
            "testbed/traffic": "traffic"}
# Package data the code reads at run time (one file or pattern per kind).
PACKAGE_DATA = ("testbed/apply/bpf/*.c", "testbed/scenarios/*.yaml", "testbed/scenarios/schema.json",
                "testbed/traffic/training/shapes/*.json", "testbed/experiments/allreduce/README.md")


def source_files(folder: str) -> set[str]:
    """The Python files and package data under a repository folder, relative to it."""
    root = REPO / folder
    return {path.relative_to(root).as_posix() for path in root.rglob("*")
            if path.is_file() and "__pycache__" not in path.parts
            and (path.suffix in {".py", ".c", ".yaml", ".json"} or path.match("experiments/*/README.md"))}


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    return build_wheel(tmp_path_factory.mktemp("src"), tmp_path_factory.mktemp("wheel"))


@pytest.fixture(scope="module")
def wheel_files(wheel) -> set[str]:
    with zipfile.ZipFile(wheel) as archive:
        return set(archive.namelist())


@pytest.fixture(scope="module")
def requires_dist(wheel) -> list[Requirement]:
    """The wheel's Requires-Dist lines."""
    with zipfile.ZipFile(wheel) as archive:
        (metadata,) = [name for name in archive.namelist() if name.endswith(".dist-info/METADATA")]
        text = archive.read(metadata).decode()
    return [Requirement(line.split(":", 1)[1]) for line in text.splitlines()
            if line.startswith("Requires-Dist:")]


def test_the_wheel_requires_ranges_not_pins(requires_dist):
    # Pins would fight a user's own numpy or torch; the pins files keep them for install.sh.
    assert {r.name for r in requires_dist} >= {"numpy", "os-ken", "torch", "pytest"}
    for requirement in requires_dist:
        operators = {spec.operator for spec in requirement.specifier}
        assert operators == {">=", "<"}, requirement


def test_the_wheel_has_one_top_level_package(wheel_files):
    top = {name.split("/")[0] for name in wheel_files}
    (dist_info,) = [name for name in top if name.endswith(".dist-info")]
    assert top == {"testbed", dist_info}
    assert not any(name.startswith(("controllers/", "traffic/")) for name in wheel_files)


@pytest.mark.parametrize("installed, folder", PROGRAMS.items())
def test_every_source_file_is_in_the_wheel_under_testbed(wheel_files, installed, folder):
    expected = {f"{installed}/{name}" for name in source_files(folder)}
    assert expected, folder
    assert expected - wheel_files == set()


def test_the_controller_and_the_host_programs_are_installed_under_testbed(wheel_files):
    for name in ("testbed/controllers/__init__.py", "testbed/controllers/apps/launcher.py",
                 "testbed/traffic/__init__.py", "testbed/traffic/roce/host.py",
                 "testbed/traffic/collectives/allreduce.py"):
        assert name in wheel_files


@pytest.mark.parametrize("pattern", PACKAGE_DATA)
def test_the_package_data_is_in_the_wheel(wheel_files, pattern):
    folder, _, glob = pattern.rpartition("/")
    matching = {name for name in wheel_files if name.startswith(f"{folder}/")
                and Path(name).match(glob) and "/" not in name[len(folder) + 1:]}
    assert matching, pattern


def test_this_checkout_imports_the_top_level_programs():
    # The editable install maps testbed.controllers and testbed.traffic to the top-level
    # folders; a stale testbed/controllers or testbed/traffic folder (left by an old checkout)
    # would shadow them as an empty namespace package.
    for module, folder in ((testbed.controllers, "controllers"), (testbed.traffic, "traffic")):
        assert module.__file__ is not None, f"{module.__name__} is an empty namespace package"
        assert Path(module.__file__).resolve() == REPO / folder / "__init__.py"
    for stale in (REPO / "testbed" / "controllers", REPO / "testbed" / "traffic"):
        assert not stale.exists(), f"{stale} is left from the old layout: remove it"
