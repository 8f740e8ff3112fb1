#!/usr/bin/env python3
"""CI's resolution step: prove that every supported Python's pinned dependency set installs
from the package registry, without booting the OS that ships that Python.

The supported Pythons are the ``Programming Language :: Python :: X.Y`` classifiers in
pyproject.toml; the pins are requirements.txt (the runtime dependencies) and
requirements-<extra>.txt for every extra pyproject.toml declares. The wheel declares compatible
ranges instead of pins; first, for each Python, every pin must lie in its declared range (the
exit status is 1 otherwise). Then for each Python this picks the pins whose environment
markers apply to it, adds the build requirements, and asks pip to resolve the whole set as
binary wheels for that interpreter and for the C library of the OS that ships it
(``pip install --dry-run --only-binary=:all: --python-version X.Y --platform ... --target``),
installing nothing. The exit status is 1 if any set does not resolve.

Two things pip does not do on its own, done here:
  * pip evaluates environment markers against the interpreter it runs on, not against
    ``--python-version``, for the requested pins and for every dependency's own requirements.
    So the pins are chosen per target here, and after each resolution the resolved
    distributions' requirements are evaluated for the target; any that apply to it and are not
    met (exceptiongroup and tomli below 3.11, for instance) are added and the set is resolved
    again, until nothing is missing.
  * A resolution needs each candidate's metadata, not the wheel; torch and its CUDA libraries
    are gigabytes per Python. Older pips (Debian 12's 23.0 among them) download every resolved
    wheel in ``--dry-run`` even when the index serves the metadata alone (PEP 658), so the
    resolution runs with a pinned recent pip in a throwaway venv, which reads PEP 658 metadata
    where the index serves it and otherwise fetches only each wheel's metadata with HTTP range
    requests (``--use-feature=fast-deps``; a server without range support gets whole wheels).

Machine-local package sources (find-links, extra indexes, constraints from pip.conf or from
PIP_* variables) are ignored: the registry alone must carry every wheel.

    python scripts/check_pins.py                      # every supported Python, against PyPI
    python scripts/check_pins.py --python 3.10 -v     # one Python, listing what resolved
    python scripts/check_pins.py --index-url URL      # another registry (a mirror)
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import venv
from dataclasses import dataclass
from pathlib import Path

from packaging.markers import default_environment
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10; pytest depends on tomli there
    import tomli as tomllib

ROOT = Path(__file__).resolve().parent.parent
PYPROJECT = ROOT / "pyproject.toml"
PYPI_SIMPLE_URL = "https://pypi.org/simple"
# The pip that resolves (in a throwaway venv): one that reads PEP 658 metadata, fetches wheel
# metadata by range requests (fast-deps) and downloads no wheel in --dry-run.
RESOLVER_PIP = "pip==26.3"
ARCH = "x86_64"
PYTHON_CLASSIFIER_PREFIX = "Programming Language :: Python :: "
MAX_RESOLUTION_ROUNDS = 5  # each round can only add requirements; real sets settle in 1-2
PIP_TIMEOUT_S = 900
# PIP_* variables kept for pip's runs: transport and cache settings, never package sources.
PIP_TRANSPORT_VARIABLES = (
    "PIP_CACHE_DIR", "PIP_CERT", "PIP_CLIENT_CERT", "PIP_DEFAULT_TIMEOUT", "PIP_NO_CACHE_DIR",
    "PIP_PROXY", "PIP_RETRIES", "PIP_TRUSTED_HOST",
)


@dataclass(frozen=True)
class Target:
    """An OS the testbed supports, as pip sees it: its /usr/bin/python3 and its C library."""

    os_name: str
    python_full_version: str  # that OS's /usr/bin/python3
    glibc: tuple[int, int]  # that OS's glibc; a wheel must not need a newer one

    @property
    def python_version(self) -> str:
        return ".".join(self.python_full_version.split(".")[:2])


# One row per supported Python (the classifiers must list exactly these versions).
TARGETS: tuple[Target, ...] = (
    Target("Ubuntu 22.04", "3.10.12", (2, 35)),
    Target("Debian 12", "3.11.2", (2, 36)),
    Target("Ubuntu 24.04", "3.12.3", (2, 39)),
)


# --- pure: what to resolve ----------------------------------------------------------------------


def supported_pythons(pyproject: dict) -> list[str]:
    """The X.Y versions named by the project's ``Programming Language :: Python :: X.Y``
    classifiers."""
    versions = []
    for classifier in pyproject["project"].get("classifiers", []):
        if classifier.startswith(PYTHON_CLASSIFIER_PREFIX):
            version = classifier[len(PYTHON_CLASSIFIER_PREFIX):]
            if version.count(".") == 1:
                versions.append(version)
    return versions


def pin_files(pyproject: dict) -> dict[str, list[Path]]:
    """The files holding the exact pins: "" (the runtime dependencies) -> requirements.txt,
    then requirements-<extra>.txt for each extra the package metadata declares."""
    extras = pyproject["project"].get("optional-dependencies", {})
    return {"": [ROOT / "requirements.txt"],
            **{extra: [ROOT / f"requirements-{extra}.txt"] for extra in extras}}


def declared_ranges(pyproject: dict) -> dict[str, list[Requirement]]:
    """The package metadata's requirements (compatible ranges): "" for the runtime
    dependencies, then one entry per extra."""
    project = pyproject["project"]
    return {"": [Requirement(text) for text in project.get("dependencies", [])],
            **{extra: [Requirement(text) for text in texts]
               for extra, texts in project.get("optional-dependencies", {}).items()}}


def range_problems(ranges: list[Requirement], pins: list[Requirement],
                   environment: dict[str, str]) -> list[str]:
    """Why the pins that apply in ``environment`` and the declared ranges do not match: a pin
    outside its range, a pin with no range, a range with no pin."""
    declared = {canonicalize_name(req.name): req for req in ranges if applies(req, environment)}
    pinned = {canonicalize_name(req.name): req for req in pins if applies(req, environment)}
    problems = [f"{name}: pinned but not declared"
                for name in sorted(pinned.keys() - declared.keys())]
    problems += [f"{name}: declared ({declared[name]}) but not pinned"
                 for name in sorted(declared.keys() - pinned.keys())]
    for name in sorted(pinned.keys() & declared.keys()):
        (pin,) = pinned[name].specifier
        if not declared[name].specifier.contains(pin.version, prereleases=True):
            problems.append(f"{name}: the pin {pin.version} is outside the declared range "
                            f"{declared[name].specifier}")
    return problems


def read_requirements(text: str) -> list[Requirement]:
    """A pins file's requirements; blank lines and whole-line comments skipped."""
    return [Requirement(line) for line in (raw.strip() for raw in text.splitlines())
            if line and not line.startswith("#")]


def marker_environment(target: Target) -> dict[str, str]:
    """The PEP 508 marker environment of the target's CPython on Linux."""
    environment = default_environment()
    environment.update(
        implementation_name="cpython",
        implementation_version=target.python_full_version,
        os_name="posix",
        platform_machine=ARCH,
        platform_python_implementation="CPython",
        platform_system="Linux",
        python_full_version=target.python_full_version,
        python_version=target.python_version,
        sys_platform="linux",
    )
    return environment


def applies(requirement: Requirement, environment: dict[str, str],
            extras: tuple[str, ...] = ()) -> bool:
    """Whether the requirement's marker holds in the environment, with no extra or any of
    ``extras`` requested."""
    if requirement.marker is None:
        return True
    return any(requirement.marker.evaluate({**environment, "extra": extra})
               for extra in ("", *extras))


def without_marker(requirement: Requirement) -> str:
    """The requirement as pip's command line takes it once its marker is decided."""
    unmarked = Requirement(str(requirement))
    unmarked.marker = None
    return str(unmarked)


def manylinux_platforms(glibc: tuple[int, int], arch: str = ARCH) -> list[str]:
    """Every manylinux platform tag a system with this glibc accepts, newest first
    (pip does not expand a ``--platform`` to the older tags)."""
    major, newest_minor = glibc
    tags = [f"manylinux_{major}_{minor}_{arch}" for minor in range(newest_minor, 4, -1)]
    legacy = {17: "manylinux2014", 12: "manylinux2010", 5: "manylinux1"}
    tags += [f"{name}_{arch}" for minor, name in legacy.items() if minor <= newest_minor]
    return tags


def unmet_requirements(report: dict, environment: dict[str, str]) -> list[Requirement]:
    """Requirements of the resolved distributions (a ``pip install --report`` document) that
    apply in ``environment`` but that no resolved distribution satisfies."""
    resolved = {canonicalize_name(item["metadata"]["name"]): Version(item["metadata"]["version"])
                for item in report["install"]}
    unmet = []
    for item in report["install"]:
        extras = tuple(item.get("requested_extras") or ())
        for text in item["metadata"].get("requires_dist", []):
            requirement = Requirement(text)
            if not applies(requirement, environment, extras):
                continue
            version = resolved.get(canonicalize_name(requirement.name))
            if version is None or not requirement.specifier.contains(version, prereleases=True):
                unmet.append(requirement)
    return unmet


# --- thin layer: run pip -------------------------------------------------------------------------


def registry_only_environment() -> dict[str, str]:
    """This process's environment without pip configuration files or PIP_* package sources."""
    environment = {name: value for name, value in os.environ.items()
                   if not name.startswith("PIP_") or name in PIP_TRANSPORT_VARIABLES}
    environment["PIP_CONFIG_FILE"] = os.devnull  # pip then reads no configuration file
    environment["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
    return environment


def make_resolver(directory: Path, index_url: str, environment: dict[str, str]) -> Path:
    """A venv in ``directory`` with RESOLVER_PIP; returns its python."""
    venv.EnvBuilder(with_pip=True).create(directory)
    python = directory / "bin" / "python"
    subprocess.run([str(python), "-m", "pip", "install", "--quiet", "--index-url", index_url,
                    RESOLVER_PIP], env=environment, check=True, timeout=PIP_TIMEOUT_S)
    return python


def resolve(python: Path, requests: list[str], target: Target, index_url: str,
            environment: dict[str, str], scratch: Path) -> tuple[dict | None, str]:
    """Resolve ``requests`` for the target with pip; (the --report document or None, pip's
    stderr)."""
    report_path = scratch / "report.json"
    report_path.unlink(missing_ok=True)
    platforms = [arg for tag in manylinux_platforms(target.glibc) for arg in ("--platform", tag)]
    argv = [str(python), "-m", "pip", "install", "--dry-run", "--quiet", "--ignore-installed",
            "--use-feature=fast-deps", "--only-binary=:all:", "--python-version", target.python_version,
            "--implementation", "cp", *platforms, "--target", str(scratch / "target"),
            "--index-url", index_url, "--report", str(report_path), *requests]
    done = subprocess.run(argv, env=environment, capture_output=True, text=True,
                          timeout=PIP_TIMEOUT_S)
    # fast-deps announces itself on every run; only the rest says anything about the pins.
    stderr = "\n".join(line for line in done.stderr.splitlines() if "fast-deps" not in line)
    if done.returncode != 0:
        return None, stderr
    return json.loads(report_path.read_text()), stderr


@dataclass(frozen=True)
class Outcome:
    """One target's result: the pins asked for, and what resolved or why not."""

    target: Target
    pins: list[str]
    resolved: dict[str, str]  # canonical name -> version; empty when it failed
    error: str  # "" when it resolved


def check_target(python: Path, target: Target, requirements: list[Requirement],
                 build_requires: list[str], index_url: str, environment: dict[str, str],
                 scratch: Path) -> Outcome:
    """Resolve the target's pins plus the build requirements, adding requirements that apply
    to the target but not to this interpreter until none is unmet."""
    markers = marker_environment(target)
    pins = [without_marker(req) for req in requirements if applies(req, markers)]
    requests = pins + build_requires
    for _ in range(MAX_RESOLUTION_ROUNDS):
        report, stderr = resolve(python, requests, target, index_url, environment, scratch)
        if report is None:
            return Outcome(target, pins, {}, stderr.strip())
        unmet = [without_marker(req) for req in unmet_requirements(report, markers)]
        new = [text for text in dict.fromkeys(unmet) if text not in requests]
        if not unmet:
            resolved = {canonicalize_name(item["metadata"]["name"]): item["metadata"]["version"]
                        for item in report["install"]}
            return Outcome(target, pins, resolved, "")
        if not new:
            return Outcome(target, pins, {}, "requirements still unmet after resolving them: "
                           + ", ".join(unmet))
        requests += new
    return Outcome(target, pins, {}, f"no stable set after {MAX_RESOLUTION_ROUNDS} rounds")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--index-url", default=PYPI_SIMPLE_URL,
                        help="the registry's simple index (default: PyPI)")
    parser.add_argument("--python", action="append", metavar="X.Y",
                        help="check only this supported Python (repeatable)")
    parser.add_argument("-v", "--verbose", action="store_true",
                        help="list every resolved distribution")
    args = parser.parse_args(argv)

    pyproject = tomllib.loads(PYPROJECT.read_text())
    supported = supported_pythons(pyproject)
    targets = {target.python_version: target for target in TARGETS}
    if sorted(supported) != sorted(targets):
        print(f"check_pins: pyproject.toml supports Python {', '.join(supported)} but TARGETS "
              f"describes {', '.join(targets)}", file=sys.stderr)
        return 2
    wanted = args.python or supported
    unknown = [version for version in wanted if version not in targets]
    if unknown:
        print(f"check_pins: not a supported Python: {', '.join(unknown)}", file=sys.stderr)
        return 2
    pins = {extra: [req for path in paths for req in read_requirements(path.read_text())]
            for extra, paths in pin_files(pyproject).items()}
    requirements = [req for reqs in pins.values() for req in reqs]
    build_requires = list(pyproject["build-system"]["requires"])
    ranges = declared_ranges(pyproject)
    mismatched = [f"Python {version}, {extra or 'runtime'}: {problem}"
                  for version in wanted for extra in pins
                  for problem in range_problems(ranges.get(extra, []), pins[extra],
                                                marker_environment(targets[version]))]
    for line in mismatched:
        print(f"FAIL {line}")

    environment = registry_only_environment()
    failed = 0
    with tempfile.TemporaryDirectory(prefix="check-pins-") as tmp:
        python = make_resolver(Path(tmp) / "resolver", args.index_url, environment)
        for version in wanted:
            target = targets[version]
            outcome = check_target(python, target, requirements, build_requires,
                                   args.index_url, environment, Path(tmp))
            where = (f"Python {version} ({target.os_name}, "
                     f"glibc {target.glibc[0]}.{target.glibc[1]}, {ARCH})")
            if outcome.error:
                failed += 1
                print(f"FAIL {where}: {len(outcome.pins)} pins do not resolve")
                print("\n".join("    " + line for line in outcome.error.splitlines()[-12:]))
                continue
            print(f"ok   {where}: {len(outcome.pins)} pins + build requirements -> "
                  f"{len(outcome.resolved)} distributions resolve")
            if args.verbose:
                print("    " + " ".join(f"{name}=={version}"
                                        for name, version in sorted(outcome.resolved.items())))
    return 1 if failed or mismatched else 0


if __name__ == "__main__":
    sys.exit(main())
