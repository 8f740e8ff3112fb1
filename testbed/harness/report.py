"""A run's report for people: report.md (plots beside it) and report.html (self-contained, the
plots inline), both made from summary.json alone: what ran, every check as PASS or FAIL with
measured against expected, whether the emulator kept up and why, the summary rows and the
plots. ``compare`` puts several runs side by side (``testbed report RUN_DIR...``).

``load_summary`` reads a summary.json someone hands the testbed: anything that is not a
summary of the schema version it reads, or lacks what a report shows, is one ConfigError
naming the file and the problem."""
from __future__ import annotations

import base64
import html
import json
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError

from testbed.errors import ConfigError, short, shown
from testbed.model.verdict import FAIL, PASS, Verdict

SCHEMA_VERSION = 1  # of summary.json; raised when a key changes meaning or goes away
SUMMARY_FILE = "summary.json"
MAX_SUMMARY_BYTES = 64 * 1024 * 1024  # a summary is tens of KB; its samples a few MB at most
COMPLETE = "complete"  # a run's status once every setup was measured (testbed.harness.run)
PATH_CHARS = 240  # of a path in a message


def _cell(value) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


def checks_table(checks: list[dict]) -> list[list[str]]:
    """Rows (with a header) of a checks list: outcome, name, measured, expected, tolerance,
    unit, setup, statement."""
    rows = [["outcome", "check", "measured", "expected", "tolerance", "unit", "setup",
             "what it means"]]
    for c in checks:
        rows.append([c["outcome"], c["name"], _cell(c["measured"]), _cell(c["expected"]),
                     _cell(c["tolerance"]), c["unit"] or "", c.get("setup") or "",
                     c.get("statement") or ""])
    return rows


def headline(summary: dict) -> str:
    verdict = summary.get("verdict") or {}
    counts = verdict.get("counts", {})
    trusted = verdict.get("emulator_trusted")
    return (f"{summary['status'].upper()}: {counts.get(PASS, 0)} checks passed, "
            f"{counts.get(FAIL, 0)} failed, {counts.get('n/a', 0)} not judged; emulator "
            f"{'TRUSTED' if trusted else 'NOT TRUSTED'}")


def markdown(summary: dict, image_prefix: str = "") -> str:
    v = summary.get("verdict") or {}
    prov = summary["provenance"]
    lines = [f"# {summary['run_id']}: {summary['title']}", "",
             f"**{headline(summary)}**", "", summary.get("headline", ""), ""]
    if summary.get("error"):
        lines += [f"Stopped: `{summary['error']}`", ""]
    lines += ["## Checks", "", *md_table(checks_table(v.get("checks", []))), "",
              "## Did the emulator keep up?", ""]
    if v.get("emulator_trusted"):
        lines.append("Yes: every fidelity check passed.")
    else:
        lines += [f"No: {reason}" for reason in v.get("reasons", [])]
    lines += ["", *md_table(checks_table(v.get("trust", []))), ""]
    if summary.get("rows"):
        lines += ["## Summary", "", *md_table([["", ""], *summary["rows"]]), ""]
    if summary.get("plots"):
        lines += ["## Plots", ""]
        lines += [f"![{Path(p).stem}]({image_prefix}{p})" for p in summary["plots"]]
        lines.append("")
    lines += ["## Provenance", "",
              f"testbed {prov['testbed_version']} (commit {prov['commit'] or 'not a checkout'}), "
              f"kernel {prov['kernel']}, Open vSwitch {prov['ovs_version']}, Python "
              f"{prov['python']}, {prov['cpus']} CPUs; paths: "
              + ", ".join(f"{k} {v}" for k, v in prov["paths"].items()),
              "", f"Started {summary['started_at']}, finished {summary['finished_at']}; "
              f"scenario and parameters in config.json, everything measured in summary.json.", ""]
    return "\n".join(lines)


def md_table(rows: list[list[str]]) -> list[str]:
    if len(rows) < 2:
        return ["(none)"]
    esc = [[str(c).replace("|", "\\|").replace("\n", " ") for c in row] for row in rows]
    return ["| " + " | ".join(esc[0]) + " |", "|" + "---|" * len(esc[0]),
            *("| " + " | ".join(r) + " |" for r in esc[1:])]


STYLE = """body{font-family:sans-serif;max-width:1100px;margin:2em auto;color:#222}
table{border-collapse:collapse;margin:1em 0;font-size:90%}td,th{border:1px solid #ccc;
padding:3px 6px;text-align:left}.PASS{color:#060;font-weight:bold}.FAIL{color:#b00;
font-weight:bold}img{max-width:100%;border:1px solid #eee;margin:.5em 0}"""


def html_table(rows: list[list[str]]) -> str:
    if len(rows) < 2:
        return "<p>(none)</p>"
    head = "".join(f"<th>{html.escape(c)}</th>" for c in rows[0])
    body = "".join("<tr>" + "".join(f'<td class="{html.escape(c)}">{html.escape(c)}</td>'
                                   if i == 0 else f"<td>{html.escape(c)}</td>"
                                   for i, c in enumerate(r)) + "</tr>" for r in rows[1:])
    return f"<table><tr>{head}</tr>{body}</table>"


def html_page(summary: dict, workdir: Path) -> str:
    """The same report as one HTML file with the plots inline."""
    v = summary.get("verdict") or {}
    parts = [f"<h1>{html.escape(summary['run_id'])}: {html.escape(summary['title'])}</h1>",
             f"<p><b>{html.escape(headline(summary))}</b></p>",
             f"<p>{html.escape(summary.get('headline', ''))}</p>"]
    if summary.get("error"):
        parts.append(f"<p>Stopped: <code>{html.escape(summary['error'])}</code></p>")
    parts += ["<h2>Checks</h2>", html_table(checks_table(v.get("checks", []))),
              "<h2>Did the emulator keep up?</h2>"]
    parts += [f"<p>{html.escape(r)}</p>" for r in v.get("reasons", [])] or \
        ["<p>Yes: every fidelity check passed.</p>"]
    parts.append(html_table(checks_table(v.get("trust", []))))
    if summary.get("rows"):
        parts += ["<h2>Summary</h2>", html_table([["", ""], *summary["rows"]])]
    for plot in summary.get("plots", []):
        data = base64.b64encode((workdir / plot).read_bytes()).decode()
        parts.append(f'<p><img alt="{html.escape(plot)}" src="data:image/png;base64,{data}"></p>')
    prov = summary["provenance"]
    parts.append(f"<p><small>testbed {prov['testbed_version']} (commit "
                 f"{html.escape(str(prov['commit']))}), kernel {html.escape(prov['kernel'])}, "
                 f"Open vSwitch {prov['ovs_version']}, {prov['cpus']} CPUs</small></p>")
    return (f"<!doctype html><html><head><meta charset='utf-8'><title>"
            f"{html.escape(summary['run_id'])}</title><style>{STYLE}</style></head><body>"
            + "\n".join(parts) + "</body></html>\n")


def write_report(summary: dict, workdir: Path) -> list[Path]:
    """report.md and report.html in the run folder."""
    md = workdir / "report.md"
    md.write_text(markdown(summary))
    page = workdir / "report.html"
    page.write_text(html_page(summary, workdir))
    return [md, page]


def run_exit_status(status: str, verdict: Verdict, accept_failed: bool = False,
                    accept_untrusted: bool = False) -> int:
    """0: the run completed, every judged check passed and the emulator kept up; 1 otherwise
    (a failed check or an untrusted emulator unless accepted)."""
    if status != COMPLETE:
        return 1
    if verdict.failed and not accept_failed:
        return 1
    if not verdict.emulator_trusted and not accept_untrusted:
        return 1
    return 0


def summary_exit_status(summary: dict) -> int:
    """The exit status the run of a loaded summary had (``run_exit_status``)."""
    return run_exit_status(summary["status"], Verdict.from_dict(summary.get("verdict") or {}))


class CheckRecord(BaseModel):
    """A check as summary.json holds it (testbed.model.verdict.Check.to_dict)."""

    model_config = ConfigDict(extra="ignore")
    name: str
    outcome: str
    measured: Any = None
    expected: Any = None
    tolerance: Any = None
    unit: str | None = ""
    passed: bool | None = None
    statement: str | None = ""
    setup: str | None = None


class VerdictRecord(BaseModel):
    """A verdict as summary.json holds it (testbed.model.verdict.Verdict.to_dict)."""

    model_config = ConfigDict(extra="allow")
    checks: list[CheckRecord] = []
    trust: list[CheckRecord] = []
    statements: list[str] = []
    reasons: list[str] = []
    emulator_trusted: bool | None = None
    counts: dict[str, int] = {}


class SummaryRecord(BaseModel):
    """What a report of summary.json reads from it; the rest is carried as it is."""

    model_config = ConfigDict(extra="allow")
    run_id: str
    status: str
    experiment: str
    title: str = ""
    headline: str = ""
    error: str | None = None
    results_dir: str = ""
    rows: list[tuple[str, str]] = []
    verdict: VerdictRecord | None = None
    link_rate_mbit: float | None = None


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


def load_summary(run_dir: Path) -> dict:
    """A run's summary.json (``run_dir`` its folder, or the file), checked to be a summary of
    SCHEMA_VERSION with what a report shows, every field of it filled."""
    path = summary_path(run_dir)
    data = read_json(path)
    if not isinstance(data, dict):
        raise ConfigError(named(path), "not a run summary (a JSON object)")
    version = data.get("schema_version")
    if version is None:
        raise ConfigError(named(path), "no schema_version: not a summary this testbed wrote")
    if type(version) is not int or version != SCHEMA_VERSION:
        provenance = data.get("provenance")
        wrote = provenance.get("testbed_version") if isinstance(provenance, dict) else None
        raise ConfigError(named(path), f"schema_version {short(version)}: this testbed reads "
                          f"version {SCHEMA_VERSION}; report it with the testbed that wrote it"
                          + (f" ({short(wrote)})" if wrote else ""))
    try:
        record = SummaryRecord.model_validate(data)
    except ValidationError as err:
        first = err.errors()[0]
        where = ".".join(str(p) if isinstance(p, int) else shown(p) for p in first["loc"])
        raise ConfigError(named(path), f"not a run summary: {where}: {first['msg']}, got "
                          f"{short(first['input'])}") from None
    return {**data, **record.model_dump()}


def compare(run_dirs: list[Path]) -> list[list[str]]:
    """A table of several runs side by side: one row per check (by name and setup), one
    column per run, each cell the measured value and its outcome."""
    summaries = [load_summary(d) for d in run_dirs]
    keys: list[tuple[str, str]] = []
    cells: list[dict] = []
    for s in summaries:
        own = {}
        for c in (s.get("verdict") or {}).get("checks", []):
            key = (c["name"], c.get("setup") or "")
            own[key] = f"{_cell(c['measured'])} {c['outcome']}"
            if key not in keys:
                keys.append(key)
        cells.append(own)
    header = ["check", *(s["run_id"] for s in summaries)]
    rows = [header, ["experiment", *(s["experiment"] for s in summaries)],
            ["status", *(s["status"] for s in summaries)],
            ["link rate (Mbit/s)", *(_cell(s.get("link_rate_mbit")) for s in summaries)],
            ["emulator trusted", *(str((s.get("verdict") or {}).get("emulator_trusted"))
                                   for s in summaries)]]
    for key in keys:
        name = key[0] + (f" [{key[1]}]" if key[1] else "")
        rows.append([name, *(own.get(key, "-") for own in cells)])
    return rows


__all__ = ["Verdict", "compare", "write_report", "markdown", "html_page", "checks_table"]
