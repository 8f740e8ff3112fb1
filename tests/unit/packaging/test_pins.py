"""The pinned dependencies and the declared ranges: every pins file parses, every supported
Python gets one exact pin per dependency, no Python gets a release that has no wheels for it,
and the package metadata declares compatible ranges (the lowest pin to the next major release)
that hold every pin. No network: scripts/check_pins.py asks the registry."""
from __future__ import annotations

import configparser
import importlib.util
import sys
from pathlib import Path

import pytest
from packaging.markers import default_environment
from packaging.requirements import InvalidRequirement, Requirement
from packaging.specifiers import SpecifierSet
from packaging.utils import canonicalize_name
from packaging.version import Version

import testbed

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10; pytest depends on tomli there
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[3]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())

# Each listed OS's /usr/bin/python3: Ubuntu 22.04, Debian 12, Ubuntu 24.04.
SUPPORTED_PYTHONS = ("3.10", "3.11", "3.12")

# What each part of the metadata must pin (canonical names), written out by hand.
EXPECTED_DEPENDENCIES = {
    "": {"os-ken", "scapy", "pyroute2", "networkx", "numpy", "matplotlib", "pyyaml",
         "pydantic", "rich"},
    "test": {"pytest", "hypothesis", "packaging", "setuptools", "import-linter"},
    "torch": {"torch"},
}
EXPECTED_PIN_FILES = {
    "": ["requirements.txt"],
    "test": ["requirements-test.txt"],
    "torch": ["requirements-torch.txt"],
}

# Releases that publish no wheels for Pythons older than the one named (their Requires-Python).
FIRST_RELEASE_WITHOUT_WHEELS_BELOW = {
    # (project, first such release): the oldest Python its wheels support
    ("numpy", "2.3"): "3.11",
    ("networkx", "3.5"): "3.11",
    ("matplotlib", "3.11"): "3.11",
    ("numpy", "2.5"): "3.12",
    ("networkx", "3.7"): "3.12",
}


def load_check_pins():
    """scripts/check_pins.py as a module (scripts/ is no package)."""
    spec = importlib.util.spec_from_file_location("check_pins", ROOT / "scripts" / "check_pins.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while the class is made
    spec.loader.exec_module(module)
    return module


CHECK_PINS = load_check_pins()


def dynamic_files() -> dict[str, list[str]]:
    """Extra ("" for the runtime dependencies) -> the files holding its exact pins."""
    return {extra: [path.name for path in paths]
            for extra, paths in CHECK_PINS.pin_files(PYPROJECT).items()}


def declared_range(extra: str, name: str) -> Requirement:
    """The package metadata's requirement on ``name`` (canonical) in ``extra``."""
    (requirement,) = [req for req in CHECK_PINS.declared_ranges(PYPROJECT)[extra]
                      if canonicalize_name(req.name) == name]
    return requirement


def next_major(version: Version) -> Version:
    """The release a compatible range stops below: the next major (the next minor for 0.x)."""
    return Version(f"0.{version.minor + 1}" if version.major == 0 else f"{version.major + 1}")


def requirement_lines(file_name: str) -> list[str]:
    lines = (line.strip() for line in (ROOT / file_name).read_text().splitlines())
    return [line for line in lines if line and not line.startswith("#")]


def requirements_of(extra: str) -> list[Requirement]:
    return [Requirement(line) for name in dynamic_files()[extra]
            for line in requirement_lines(name)]


def pins_for(extra: str, python: str) -> dict[str, list[Requirement]]:
    """Canonical name -> the requirements of ``extra`` whose markers hold on ``python``."""
    environment = {**default_environment(), "python_version": python,
                   "python_full_version": f"{python}.0", "extra": ""}
    chosen: dict[str, list[Requirement]] = {}
    for requirement in requirements_of(extra):
        if requirement.marker is None or requirement.marker.evaluate(environment):
            chosen.setdefault(canonicalize_name(requirement.name), []).append(requirement)
    return chosen


def pinned_version(requirement: Requirement) -> Version:
    (specifier,) = requirement.specifier
    return Version(specifier.version)


def test_metadata_declares_ranges_and_the_pins_files_hold_the_pins():
    project = PYPROJECT["project"]
    assert not {"dependencies", "optional-dependencies"} & set(project["dynamic"])
    assert "dynamic" not in PYPROJECT["tool"]["setuptools"] or set(
        PYPROJECT["tool"]["setuptools"]["dynamic"]) == {"version"}
    assert dynamic_files() == EXPECTED_PIN_FILES
    setup_cfg = configparser.ConfigParser()
    setup_cfg.read(ROOT / "setup.cfg")
    assert not {"metadata", "options"} & set(setup_cfg.sections())  # declared once


@pytest.mark.parametrize("extra", sorted(EXPECTED_DEPENDENCIES))
def test_each_declared_range_runs_from_the_lowest_pin_to_the_next_major(extra):
    declared = CHECK_PINS.declared_ranges(PYPROJECT)[extra]
    assert {canonicalize_name(req.name) for req in declared} == EXPECTED_DEPENDENCIES[extra]
    for name in EXPECTED_DEPENDENCIES[extra]:
        requirement = declared_range(extra, name)
        assert requirement.marker is None, requirement
        lowest = min(pinned_version(pins_for(extra, python)[name][0])
                     for python in SUPPORTED_PYTHONS)
        bounds = {(spec.operator, Version(spec.version)) for spec in requirement.specifier}
        assert bounds == {(">=", lowest), ("<", next_major(lowest))}, requirement


@pytest.mark.parametrize("python", SUPPORTED_PYTHONS)
def test_every_pin_lies_in_its_declared_range(python):
    target = {t.python_version: t for t in CHECK_PINS.TARGETS}[python]
    environment = CHECK_PINS.marker_environment(target)
    ranges = CHECK_PINS.declared_ranges(PYPROJECT)
    for extra in EXPECTED_DEPENDENCIES:
        pins = requirements_of(extra)
        assert CHECK_PINS.range_problems(ranges[extra], pins, environment) == [], extra


def test_a_pin_outside_its_range_is_named():
    environment = CHECK_PINS.marker_environment(CHECK_PINS.TARGETS[0])
    problems = CHECK_PINS.range_problems(
        [Requirement("numpy>=2.3,<3"), Requirement("rich>=15,<16")],
        [Requirement("numpy==2.2.6"), Requirement("scapy==2.8.0")], environment)
    assert problems == ["scapy: pinned but not declared",
                        "rich: declared (rich<16,>=15) but not pinned",
                        "numpy: the pin 2.2.6 is outside the declared range <3,>=2.3"]


def test_each_extra_is_pinned_in_the_file_named_after_it():
    # scripts/install.sh accepts an extra only if requirements-<extra>.txt exists.
    for extra, files in dynamic_files().items():
        if extra:
            assert files == [f"requirements-{extra}.txt"]
            assert (ROOT / files[0]).is_file()


def test_version_comes_from_the_package():
    assert "version" in PYPROJECT["project"]["dynamic"]
    assert PYPROJECT["tool"]["setuptools"]["dynamic"]["version"] == {
        "attr": "testbed.__version__"}
    assert Version(testbed.__version__)


def test_every_pins_file_line_is_one_requirement():
    for files in dynamic_files().values():
        for name in files:
            lines = requirement_lines(name)
            assert lines, name
            for line in lines:
                try:
                    Requirement(line)
                except InvalidRequirement as error:  # e.g. an inline comment
                    pytest.fail(f"{name}: {line!r}: {error}")


def test_supported_pythons_are_the_classifiers_and_requires_python_admits_them():
    prefix = "Programming Language :: Python :: "
    named = [c[len(prefix):] for c in PYPROJECT["project"]["classifiers"] if c.startswith(prefix)]
    classified = [version for version in named if "." in version]
    assert classified == list(SUPPORTED_PYTHONS)
    requires_python = SpecifierSet(PYPROJECT["project"]["requires-python"])
    assert all(requires_python.contains(f"{python}.0") for python in SUPPORTED_PYTHONS)


@pytest.mark.parametrize("python", SUPPORTED_PYTHONS)
@pytest.mark.parametrize("extra", sorted(EXPECTED_DEPENDENCIES))
def test_each_python_gets_one_exact_pin_per_dependency(extra, python):
    chosen = pins_for(extra, python)
    assert set(chosen) == EXPECTED_DEPENDENCIES[extra]
    for name, requirements in chosen.items():
        assert len(requirements) == 1, f"{name} on {python}: {requirements}"
        (specifier,) = requirements[0].specifier
        assert specifier.operator == "==" and "*" not in specifier.version, requirements[0]


@pytest.mark.parametrize("python", SUPPORTED_PYTHONS)
def test_no_python_gets_a_release_without_wheels_for_it(python):
    chosen = pins_for("", python)
    for (project, first_release), oldest_python in FIRST_RELEASE_WITHOUT_WHEELS_BELOW.items():
        if Version(python) < Version(oldest_python):
            (requirement,) = chosen[project]
            assert pinned_version(requirement) < Version(first_release), (python, requirement)


def test_newer_pythons_keep_newer_releases():
    # The markers exist so that 3.11 and 3.12 are not held back to what 3.10 can install.
    for project in ("numpy", "networkx", "matplotlib"):
        versions = [pinned_version(pins_for("", python)[project][0])
                    for python in SUPPORTED_PYTHONS]
        assert versions == sorted(versions) and versions[0] < versions[-1], (project, versions)


@pytest.mark.parametrize("python", SUPPORTED_PYTHONS)
def test_torch_extra_is_torch_2_13_0(python):
    (requirement,) = pins_for("torch", python)["torch"]
    assert pinned_version(requirement) == Version("2.13.0")
