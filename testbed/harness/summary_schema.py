"""summary.json as typed models: the one description of what a run, or a repeated run, leaves
behind. The harness builds the model before it writes the file, so every file matches the
JSON Schema made from these models (``testbed schema --summary``; published as
docs/summary.schema.json). ``read_summary`` reads files of an older schema version where
that is cheap and refuses the rest in one line.

Schema versions (``SCHEMA_VERSION``, raised when a key changes meaning or goes away):
  1  ``rows`` as [what, text] pairs, ``plots`` as paths.
  2  ``rows`` with their numbers and units beside the text, ``plots`` with captions,
     provenance with the command line and the versions of the Python dependencies and
     Mininet, and repeated runs (``kind: repeat``).
"""
from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Annotated, Any, Literal, Union

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError

from testbed.errors import ConfigError, short, shown
from testbed.harness.plots import caption_for
from testbed.model.verdict import FAIL

SCHEMA_VERSION = 2
READABLE_VERSIONS = (1, 2)
SCHEMA_ID = f"urn:dcfabric-testbed:summary:{SCHEMA_VERSION}"
SCHEMA_PATH = Path(__file__).resolve().parents[2] / "docs" / "summary.schema.json"
SUMMARY_FILE = "summary.json"
MAX_SUMMARY_BYTES = 64 * 1024 * 1024  # a summary is tens of KB; its samples a few MB at most
PATH_CHARS = 240  # of a path in a message
RUN, REPEAT = "run", "repeat"
RUNNING, COMPLETE, FAILED, INTERRUPTED = "running", "complete", "failed", "interrupted"

Scalar = Union[bool, int, float, str, None]
Status = Literal["running", "complete", "failed", "interrupted"]


class Record(BaseModel):
    """A part of summary.json: unknown keys are errors, so the schema lists every key."""

    model_config = ConfigDict(extra="forbid")


# --- one run ---------------------------------------------------------------------------------


class NumberRecord(Record):
    """A headline number as a number: its value in its unit."""

    name: str = Field(description="what the number is, within its row")
    value: float | int | None = Field(description="the value; null when nothing was measured")
    unit: str = Field(description="its unit, e.g. Mbit/s, s, bytes, fraction; empty for a "
                                  "count")


class RowRecord(Record):
    """One line of the printed summary: the text people read, and the numbers it shows."""

    what: str = Field(description="what the row is about")
    text: str = Field(description="the value as printed")
    numbers: list[NumberRecord] = Field(default_factory=list,
                                  description="the numbers the text shows, with their units")


class CheckRecord(Record):
    """One claim judged from a measurement (testbed.model.verdict.Check)."""

    name: str
    measured: Scalar = Field(description="the number (or yes/no) that decides the check")
    expected: Scalar = Field(description="what it is judged against, e.g. '>= 0.9'")
    tolerance: float | int | str | None = Field(description="allowed distance from expected")
    unit: str = Field(description="unit of measured, expected and tolerance")
    passed: bool | None = Field(description="null: the check could not be judged")
    outcome: Literal["PASS", "FAIL", "n/a"]
    statement: str = Field("", description="the claim in plain language")
    setup: str | None = Field(None, description="the fabric it was measured on, when an "
                                                "experiment has several")


class VerdictRecord(Record):
    """The checks and whether the emulator kept up (testbed.model.verdict.Verdict)."""

    checks: list[CheckRecord]
    emulator_trusted: bool = Field(description="true only when every trust check passed")
    reasons: list[str] = Field(description="why the emulator is not trusted; empty when it is")
    trust: list[CheckRecord] = Field(description="checks of whether the emulator kept up")
    statements: list[str]
    counts: dict[str, int] = Field(description="how many checks had each outcome")


class Provenance(Record):
    """Where the numbers come from: software, machine and command."""

    testbed_version: str
    commit: str | None = Field(description="git describe of the checkout; null outside one")
    command_line: list[str] = Field(default_factory=list,
                                    description="the command that made the run, as typed")
    kernel: str = Field(description="kernel release")
    uname: str | None = Field(None, description="kernel name, release, version and machine "
                                                "(uname -srvm)")
    ovs_version: str | None = Field(description="ovs-vswitchd --version")
    mininet_version: str | None = None
    python: str
    python_packages: dict[str, str | None] = Field(
        default_factory=dict, description="version of each Python dependency; null when "
                                          "not installed")
    machine: str
    cpus: int | None
    memory_bytes: int | None = None
    paths: dict[str, Any] = Field(description="the path each feature took (testbed doctor)")


class Plot(Record):
    """A figure of the report."""

    path: str = Field(description="the image, relative to the run folder")
    caption: str = Field(description="one line: what to look at")


class RunSummary(Record):
    """summary.json of one run (``testbed run``, an experiment command, ``Fabric.run``)."""

    model_config = ConfigDict(title="summary.json of one run")
    schema_version: Literal[2] = Field(description="the version of this schema "
                                                   "(SCHEMA_VERSION)")
    kind: Literal["run"] = RUN
    run_id: str
    experiment: str
    title: str
    headline: str = Field(description="what ran, in a line")
    status: Status
    error: str | None = Field(description="why it stopped; null when it did not")
    started_at: str = Field(description="UTC, ISO 8601")
    finished_at: str | None = None
    wall_s: float | None = Field(None, description="duration in seconds")
    provenance: Provenance
    results_dir: str = Field(description="the run folder")
    scenario: dict[str, Any] = Field(description="the scenario as validated, defaults filled "
                                                 "in")
    params: dict[str, Any] = Field(description="the experiment's parameters")
    link_rate_mbit: float
    link_rate_decided_by: str
    mtu_bytes: int
    ecn_path: str | None = Field(description="how marked queues were marked; null without a "
                                             "queue")
    setups: dict[str, dict[str, Any]] = Field(description="per setup: fabric, routing, queue, "
                                                          "hosts' TCP, anycast")
    results: dict[str, dict[str, Any]] = Field(description="per setup: what the experiment "
                                                           "measured, with dir, bring_up, "
                                                           "openflow, and with a failure "
                                                           "schedule failures and "
                                                           "fault_windows")
    verdict: VerdictRecord | None
    rows: list[RowRecord] = Field(default_factory=list, description="the printed summary")
    plots: list[Plot] = Field(default_factory=list)
    report: list[str] | None = Field(None, description="report files, relative to the run "
                                                       "folder")
    fabric_run_id: str | None = Field(None, description="the fabric kept up by the Python API "
                                                        "that this run measured on")


# --- a repeated run --------------------------------------------------------------------------


class Spread(Record):
    """A number over the runs of a repeat."""

    median: float | None = Field(description="null when no run measured it")
    min: float | None
    max: float | None
    n: int = Field(description="how many runs measured it")
    unit: str
    values: list[float | None] = Field(description="each run's value, in run order (null: "
                                                   "not measured)")


class SpreadNumber(Spread):
    """A headline number over the runs of a repeat."""

    name: str


class SpreadRow(Record):
    """A summary row over the runs of a repeat."""

    what: str
    text: str = Field(description="the spread as printed")
    numbers: list[SpreadNumber] = Field(default_factory=list)


class CheckSpread(Record):
    """A check over the runs of a repeat."""

    name: str
    setup: str | None = None
    unit: str
    expected: Scalar = Field(description="the first run's expected value")
    measured: Spread | None = Field(description="null when the measured values are not "
                                                "numbers")
    outcomes: list[str] = Field(description="each run's outcome, in run order ('-': the run "
                                            "did not judge it)")
    passed: bool | None = Field(description="every run that judged it passed; null when none "
                                            "judged it")


class RunEntry(Record):
    """One run of a repeat."""

    run_id: str
    dir: str = Field(description="its run folder, relative to the repeat's folder")
    status: Status
    error: str | None = None
    checks_passed: bool = Field(description="every judged check passed")
    emulator_trusted: bool
    wall_s: float | None = None


class RepeatVerdict(Record):
    """The verdict of a repeat: it passes only when every run does."""

    passed: bool = Field(description="every run complete, every judged check of every run "
                                     "passed, and the emulator trusted in every run")
    runs_asked: int
    runs_made: int
    runs_passed: int
    reasons: list[str] = Field(description="which runs did not pass, and why")


class RepeatSummary(Record):
    """summary.json of a repeated run (``testbed run --repeat N``)."""

    model_config = ConfigDict(title="summary.json of a repeated run")
    schema_version: Literal[2]
    kind: Literal["repeat"] = REPEAT
    run_id: str = Field(description="the repeat's id (its folder's name)")
    experiment: str
    title: str
    headline: str
    status: Status = Field(description="complete when every run was made")
    error: str | None = None
    started_at: str
    finished_at: str | None = None
    wall_s: float | None = None
    provenance: Provenance
    results_dir: str = Field(description="the repeat's folder; each run's folder is inside it")
    scenario: dict[str, Any]
    params: dict[str, Any]
    link_rate_mbit: float
    repeat: int = Field(description="how many runs were asked for")
    runs: list[RunEntry]
    rows: list[SpreadRow] = Field(default_factory=list)
    checks: list[CheckSpread] = Field(default_factory=list)
    trust: list[CheckSpread] = Field(default_factory=list)
    verdict: RepeatVerdict
    plots: list[Plot] = Field(default_factory=list)
    report: list[str] | None = None


Summary = Annotated[Union[RunSummary, RepeatSummary], Field(discriminator="kind")]
SUMMARY = TypeAdapter(Summary)


def json_schema() -> dict:
    """The JSON Schema of summary.json, either kind."""
    schema = SUMMARY.json_schema()
    return {"$schema": "https://json-schema.org/draft/2020-12/schema", "$id": SCHEMA_ID,
            "title": "summary.json", "description": (
                f"What a testbed run leaves in its folder (schema version {SCHEMA_VERSION}); "
                "'kind' tells one run from a repeated run."), **schema}


# --- writing and reading ---------------------------------------------------------------------


def to_json_data(summary: dict) -> dict:
    """``summary`` as JSON data: what json.dumps makes of it, numpy numbers and paths
    included (as their text)."""
    return json.loads(json.dumps(summary, default=str))


def validated(summary: dict) -> dict:
    """``summary`` checked against the schema and written out by its model: the keys in
    schema order, every key present."""
    model = SUMMARY.validate_python(to_json_data(summary))
    return model.model_dump(mode="json")


def write_summary(workdir: Path, summary: dict) -> Path:
    """summary.json in ``workdir``, built by its model."""
    path = Path(workdir) / SUMMARY_FILE
    path.write_text(json.dumps(validated(summary), indent=1) + "\n")
    return path


def named(path: Path) -> str:
    """A path as a message names it: as it is, or quoted when it would not print as one line."""
    return shown(str(path), PATH_CHARS)


def summary_path(run_dir: Path) -> Path:
    """The summary.json of a run folder, or the file itself when given."""
    run_dir = Path(run_dir)
    if run_dir.name == SUMMARY_FILE and run_dir.is_file():
        return run_dir
    if not run_dir.exists():
        raise ConfigError(named(run_dir), "no such run folder")
    if not run_dir.is_dir():
        raise ConfigError(named(run_dir), f"not a run folder (give the folder that holds "
                          f"{SUMMARY_FILE}, or that file)")
    if not (run_dir / SUMMARY_FILE).is_file():
        raise ConfigError(named(run_dir), f"not a run folder (no {SUMMARY_FILE})")
    return run_dir / SUMMARY_FILE


def read_json(path: Path) -> Any:
    """A JSON file's value, or one ConfigError naming the file and what is wrong with it."""
    try:
        size = path.stat().st_size
        if size > MAX_SUMMARY_BYTES:
            raise ConfigError(named(path), f"{size} bytes; a summary is at most "
                              f"{MAX_SUMMARY_BYTES}")
        return json.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise ConfigError(named(path), f"cannot read: {exc.strerror}") from None
    except UnicodeDecodeError:
        raise ConfigError(named(path), "not valid JSON: not UTF-8 text") from None
    except json.JSONDecodeError as exc:
        raise ConfigError(named(path), f"not valid JSON (truncated or damaged?): {exc.msg} at "
                          f"line {exc.lineno} column {exc.colno}") from None
    except RecursionError:
        raise ConfigError(named(path), "not valid JSON for a summary: nested too deeply") from None
    except ValueError as exc:  # e.g. an integer beyond Python's digit limit
        raise ConfigError(named(path), f"not valid JSON: {' '.join(str(exc).split())}") from None


def read_summary(run_dir: Path) -> dict:
    """A run's summary.json (``run_dir`` its folder, or the file) as a summary of the current
    version (older versions upgraded where that is cheap); anything else (no such file, not
    JSON, a version this testbed cannot read, a key off the schema) is one ConfigError naming
    the file and the problem."""
    path = summary_path(run_dir)
    data = read_json(path)
    if not isinstance(data, dict):
        raise ConfigError(named(path), "not a run summary (a JSON object)")
    kind = data.get("kind", RUN)
    if kind not in (RUN, REPEAT):
        raise ConfigError(named(path), f"a summary of kind {short(kind)}, not of a run or a "
                          "repeated run")
    version = data.get("schema_version")
    if type(version) is not int or version not in READABLE_VERSIONS:
        provenance = data.get("provenance")
        wrote = provenance.get("testbed_version") if isinstance(provenance, dict) else None
        raise ConfigError(named(path), f"schema version {short(version)}; this testbed reads "
                          f"versions {', '.join(map(str, READABLE_VERSIONS))}"
                          + (f"; report it with the testbed that wrote it ({short(wrote)})"
                             if wrote else ""))
    if version == 1:
        data = upgrade_v1(data)
    try:
        return validated(data)
    except ValidationError as err:
        first = err.errors()[0]
        loc = first["loc"][1:] if first["loc"][:1] in ((RUN,), (REPEAT,)) else first["loc"]
        # the key, without the kind it was read as
        where = ".".join(str(p) if isinstance(p, int) else shown(str(p)) for p in loc) or "(top)"
        raise ConfigError(named(path), f"does not match schema version {SCHEMA_VERSION}: "
                          f"{where}: {first['msg']}") from None


def upgrade_v1(data: dict) -> dict:
    """A version-1 summary in version 2's shape: rows and plots as records (no numbers, the
    default caption), the provenance keys version 1 lacked left empty."""
    data = dict(data, schema_version=SCHEMA_VERSION, kind=RUN)
    rows, plots = data.get("rows") or [], data.get("plots") or []
    # anything not of version 1's shape is left as it is, for validation to name
    if isinstance(rows, list) and all(isinstance(r, list) and len(r) == 2 for r in rows):
        data["rows"] = [{"what": str(what), "text": str(text), "numbers": []}
                        for what, text in rows]
    if isinstance(plots, list) and all(isinstance(p, str) for p in plots):
        data["plots"] = [{"path": p, "caption": caption_for(p)} for p in plots]
    if isinstance(data.get("report"), str):
        data["report"] = [data["report"]]
    return data


# --- rows as the experiments give them -------------------------------------------------------


def row_record(row) -> dict:
    """An experiment's summary row (testbed.harness.experiment.Row, or a plain (what, text)
    pair) as a Row record."""
    what, text = row
    return {"what": str(what), "text": str(text),
            "numbers": [{"name": n.name, "value": n.value, "unit": n.unit}
                        for n in getattr(row, "numbers", ())]}


# --- a summary read as text ------------------------------------------------------------------


def is_number(value) -> bool:
    return (isinstance(value, (int, float)) and not isinstance(value, bool)
            and math.isfinite(value))


def show(value: float | None) -> str:
    return "-" if value is None else f"{value:.4g}"


def spread_text(s: dict) -> str:
    """``5.91 Mbit/s (5.8 to 5.95, N=5)``: the median, the range and N."""
    if s["median"] is None:
        return "not measured"
    unit = f" {s['unit']}" if s["unit"] else ""
    span = "" if s["n"] == 1 else f"{show(s['min'])} to {show(s['max'])}, "
    return f"{show(s['median'])}{unit} ({span}N={s['n']})"


def run_reasons(where: str, summary: dict) -> list[str]:
    """Why a run (named ``where`` in them) did not pass: it stopped, a check failed, or the
    emulator did not keep up; [] when it passed."""
    if summary["status"] != COMPLETE:
        return [f"{where} {summary['status']}: {summary.get('error') or 'no error recorded'}"]
    verdict = summary.get("verdict") or {}
    reasons = [f"{where}: check failed: {c['name']}"
               + (f" [{c['setup']}]" if c.get("setup") else "")
               + f" measured {show_value(c['measured'])} {c['unit']}".rstrip()
               + f" (expected {show_value(c['expected'])})"
               for c in verdict.get("checks", []) if c["outcome"] == FAIL]
    if not verdict.get("emulator_trusted"):
        why = "; ".join(verdict.get("reasons", [])) or "no trust check passed"
        reasons.append(f"{where}: emulator not trusted: {why}")
    return reasons


def show_value(value) -> str:
    return show(value) if is_number(value) and isinstance(value, float) else str(value)
