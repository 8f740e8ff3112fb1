"""The lab folders and their files as plain data: where the labs are, what each lab runs
(lab.yaml) and what its self-check judges (check.yaml). Loading checks everything it can
without a run (fields, paths, expressions, run names) and reports every problem at once,
naming the file, field and line, as a scenario's errors are reported.

    labs/NN-slug/
      README.md        the exercise (for students)
      lab.yaml         title, and the runs: scenario file, shortened form (LAB_SHORT=1)
      check.yaml       the self-check: one item per claim, judged on the runs' summary.json
      *.yaml           the lab's scenarios, each with a fixed link rate
    labs/00-walkthrough/
      lab.yaml         title, and ``replay``: the companion file of the page's commands
    labs/teachers/NN-slug.md   the answers, apart from the students' text
"""
from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import Field, ValidationError, model_validator

from testbed.errors import ConfigError
from testbed.harness.provenance import SOURCE_ROOT
from testbed.harness.scenario import (
    Problem,
    ScenarioError,
    Strict,
    nearest_line,
    parse_document,
    pydantic_problems,
    read_text,
    yaml_lines,
)
from testbed.lab.values import PathError, parse_expression, parse_path, split_run

LABS_ENV = "TESTBED_LABS_DIR"
FOLDER = re.compile(r"^(\d\d)-([a-z0-9-]+)$")
MANIFEST, CHECKS = "lab.yaml", "check.yaml"
VALUE = "value"  # the name a lone ``value:`` path takes in the expression
# The paths a run took, by the names a check file's ``by_path`` uses: where summary.json
# records each (the first key present wins).
PATH_KEYS: dict[str, tuple[str, ...]] = {
    "datapath": ("provenance.paths.ovs_datapath",),
    "ecn_path": ("ecn_path", "provenance.paths.ecn_marking"),
    "tcp_cc": ("provenance.paths.tcp_congestion",),
    "rdma": ("provenance.paths.rdma",),
}


class RunSpec(Strict):
    """One scenario a lab runs, by the name its check items give."""

    name: str = Field(pattern=r"^[a-z0-9][a-z0-9-]*$")
    scenario: str  # a YAML file in the lab's folder
    short: dict[str, Any] = {}  # dotted scenario fields of the shortened form
    about: str = ""  # what the run shows, in a line


class Manifest(Strict):
    """lab.yaml: the lab's title and what ``testbed lab run`` runs."""

    title: str
    runs: list[RunSpec] = []
    replay: str | None = None  # lab 00: the page's commands and their expected shapes

    @model_validator(mode="after")
    def _runs_or_replay(self):
        if bool(self.runs) == bool(self.replay):
            raise ValueError("give either runs (scenarios to run) or replay (a walkthrough)")
        names = [r.name for r in self.runs]
        if len(set(names)) != len(names):
            raise ValueError(f"run names must differ: {', '.join(names)}")
        return self


class PathBounds(Strict):
    """Bounds that replace an item's own on runs that took these paths (``when``: datapath,
    ecn_path, tcp_cc, rdma -> the path's name)."""

    when: dict[str, str]
    min: float | None = None
    max: float | None = None
    note: str = ""

    @model_validator(mode="after")
    def _known(self):
        unknown = sorted(set(self.when) - set(PATH_KEYS))
        if unknown or not self.when:
            raise ValueError(f"when: name paths by {', '.join(PATH_KEYS)}")
        if self.min is None and self.max is None:
            raise ValueError("give min, max or both")
        return self


class Condition(Strict):
    """One claim: an experiment's own check by name (``check``, ``setup``; a name with * or
    ? matches every check it fits), or a value (``value``: a path) or an expression over
    named values (``values``: name -> path, ``expr``) within ``min``/``max`` (per path in
    ``by_path``), or an expression that must be true."""

    check: str | None = None
    setup: str | None = None
    value: str | None = None
    values: dict[str, str] = {}
    expr: str | None = None
    min: float | None = None
    max: float | None = None
    by_path: list[PathBounds] = []

    @model_validator(mode="after")
    def _one_kind(self):
        numeric = self.value is not None or bool(self.values) or self.expr is not None
        if (self.check is not None) == numeric:
            raise ValueError("give either check (an experiment's check by name) or value / "
                             "values and expr")
        if self.check is not None:
            if self.min is not None or self.max is not None or self.by_path:
                raise ValueError("min, max and by_path bound a value, not a check")
            return self
        if self.setup is not None:
            raise ValueError("setup names a check's setup; a value's path names its own")
        if self.value is not None and self.values:
            raise ValueError("give value (one path) or values (named paths), not both")
        if self.values and self.expr is None:
            raise ValueError("values need an expr that combines them")
        if self.by_path and self.min is None and self.max is None:
            raise ValueError("by_path replaces min and max on some paths: give min or max "
                             "for the others")
        for path in [self.value, *self.values.values()]:
            if path is not None:
                try:
                    parse_path(path)
                except PathError as exc:
                    raise ValueError(str(exc)) from None
        parse_expression(self.expression, self.names)
        return self

    @property
    def names(self) -> dict[str, str]:
        """Expression name -> summary path."""
        return {VALUE: self.value} if self.value is not None else dict(self.values)

    @property
    def expression(self) -> str:
        return self.expr if self.expr is not None else VALUE

    @property
    def bounded(self) -> bool:
        return self.min is not None or self.max is not None or bool(self.by_path)


class Item(Condition):
    """One line of a self-check: what it claims (``name``), on which run, and why it
    matters; a condition of its own, or ``all`` of several."""

    name: str
    run: str | None = None  # the lab's run it judges (the first run when not given)
    why: str = ""
    all: list[Condition] = []

    @model_validator(mode="after")
    def _one_kind(self):
        if not self.all:
            return Condition._one_kind(self)
        own = sorted(k for k in self.model_fields_set if k not in ("name", "run", "why", "all"))
        if own:
            raise ValueError(f"an item with all: states its conditions there, not "
                             f"{', '.join(own)}")
        return self

    @property
    def conditions(self) -> list[Condition]:
        return list(self.all) if self.all else [self]

    def other_runs(self) -> set[str]:
        """The runs, beside its own, whose values this item reads (``RUN:path``)."""
        return {run for c in self.conditions for path in c.names.values()
                for run in [split_run(path)[0]] if run is not None}


class CheckFile(Strict):
    """check.yaml: the self-check's items."""

    items: list[Item] = Field(min_length=1)


@dataclass(frozen=True)
class Lab:
    """One lab folder, loaded."""

    number: int
    slug: str
    folder: Path
    manifest: Manifest
    checks: CheckFile | None  # None for a walkthrough (its checks are the replay file's)

    @property
    def name(self) -> str:
        return f"{self.number:02d}-{self.slug}"

    @property
    def title(self) -> str:
        return self.manifest.title

    def run_for(self, item: Item) -> RunSpec:
        return next(r for r in self.manifest.runs if r.name == (item.run or
                                                                self.manifest.runs[0].name))

    def scenario_path(self, run: RunSpec) -> Path:
        return self.folder / run.scenario


def labs_root() -> Path:
    """labs/ of the checkout the testbed runs from, or TESTBED_LABS_DIR."""
    return Path(os.environ.get(LABS_ENV) or SOURCE_ROOT / "labs")


def lab_folders(root: Path) -> dict[int, Path]:
    """Lab number -> folder, for every ``NN-slug`` folder of ``root``."""
    if not root.is_dir():
        raise ConfigError(str(root), f"no labs folder (set {LABS_ENV} to one)")
    folders: dict[int, Path] = {}
    for path in sorted(root.iterdir()):
        match = FOLDER.match(path.name)
        if match and path.is_dir():
            folders[int(match.group(1))] = path
    return folders


def load_lab(folder: Path) -> Lab:
    """A lab folder's manifest and check file, every problem of them reported at once."""
    match = FOLDER.match(folder.name)
    if match is None:
        raise ConfigError(str(folder), "a lab folder is named NN-slug, e.g. 06-ecmp")
    manifest = load_model(Manifest, folder / MANIFEST)
    checks = None if manifest.replay else load_model(CheckFile, folder / CHECKS)
    problems = []
    for i, run in enumerate(manifest.runs):
        if not (folder / run.scenario).is_file():
            problems.append(Problem(("runs", i, "scenario"), f"no file {run.scenario} in "
                                                            f"{folder.name}"))
    if manifest.replay and not (folder / manifest.replay).is_file():
        problems.append(Problem(("replay",), f"no file {manifest.replay} in {folder.name}"))
    if problems:
        raise ScenarioError(str(folder / MANIFEST), problems)
    lab = Lab(int(match.group(1)), match.group(2), folder, manifest, checks)
    if checks is not None:
        names = {r.name for r in manifest.runs}
        wrong = [Problem(("items", i, "run"), f"no run {item.run!r}; runs: "
                         f"{', '.join(sorted(names))}")
                 for i, item in enumerate(checks.items) if item.run and item.run not in names]
        wrong += [Problem(("items", i), f"reads run {run!r}, which the lab does not run "
                                        f"({', '.join(sorted(names))})")
                  for i, item in enumerate(checks.items) for run in sorted(item.other_runs())
                  if run not in names]
        if wrong:
            raise ScenarioError(str(folder / CHECKS), wrong)
    return lab


def load_model(cls, path: Path):
    """``path`` read as YAML and validated as ``cls``; every problem with its line."""
    if not path.is_file():
        raise ConfigError(str(path), f"missing: a lab folder has {MANIFEST} and, but for a "
                          f"walkthrough, {CHECKS}")
    data, root = parse_document(read_text(path), str(path))
    try:
        return cls.model_validate(data)
    except ValidationError as err:
        lines = yaml_lines(root)
        problems = [Problem(p.path, p.message, nearest_line(lines, p.path))
                    for p in pydantic_problems(err)]
        raise ScenarioError(str(path), problems) from None


def find_lab(number: int, root: Path | None = None) -> Lab:
    """Lab ``number`` of ``root`` (labs_root()), loaded."""
    folders = lab_folders(root or labs_root())
    if number not in folders:
        raise ConfigError("lab", f"no lab {number}; labs: "
                          f"{', '.join(str(n) for n in sorted(folders)) or 'none'}")
    return load_lab(folders[number])


def all_labs(root: Path | None = None) -> list[Lab]:
    return [load_lab(folder) for _, folder in sorted(lab_folders(root or labs_root()).items())]
