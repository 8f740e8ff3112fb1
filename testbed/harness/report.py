"""A run's report for people: report.md (plots beside it) and report.html (self-contained, the
plots inline), both made from summary.json alone, for one run or a repeated run: what ran,
every check as PASS or FAIL with measured against expected, whether the emulator kept up and
why, the summary rows, every plot with a caption saying what to look at, and the provenance.
Both render the same ``sections``; a table leaves out any column that is empty in every row.

``compare`` puts several runs or repeated runs side by side, and ``gate_reasons`` says which
of them did not pass (``testbed report RUN_DIR... [--require-pass]``). ``load_summary``
reads a summary.json someone hands the testbed (testbed.harness.summary_schema.read_summary):
anything else is one ConfigError naming the file and the problem."""
from __future__ import annotations

import base64
import html
from dataclasses import dataclass, field
from pathlib import Path

from testbed.harness.summary_schema import REPEAT, read_summary, run_reasons, spread_text
from testbed.model.verdict import FAIL, NOT_JUDGED, PASS, Verdict

EMPTY_CELLS = ("", "-")


def _cell(value) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


# --- tables ------------------------------------------------------------------------------------


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


def check_spreads_table(checks: list[dict]) -> list[list[str]]:
    """Rows (with a header) of a repeat's checks: the outcome over the runs, the measured
    values' median, range and N, and each run's outcome."""
    rows = [["outcome", "check", "measured (median, range, N)", "expected", "unit", "setup",
             "runs"]]
    for c in checks:
        outcome = NOT_JUDGED if c["passed"] is None else PASS if c["passed"] else FAIL
        measured = "-" if c["measured"] is None else spread_text({**c["measured"], "unit": ""})
        rows.append([outcome, c["name"], measured, _cell(c["expected"]), c["unit"] or "",
                     c.get("setup") or "", " ".join(c["outcomes"])])
    return rows


def without_empty_columns(rows: list[list[str]]) -> list[list[str]]:
    """The table (header first) without the columns empty ("" or "-") in every row below the
    header; a table with no rows below its header is returned as it is."""
    if len(rows) < 2:
        return rows
    keep = [i for i in range(len(rows[0]))
            if any(str(row[i]).strip() not in EMPTY_CELLS for row in rows[1:])]
    return [[row[i] for i in keep] for row in rows]


def summary_rows(summary: dict) -> list[list[str]]:
    """The printed summary as (what, text) rows."""
    return [[row["what"], row["text"]] for row in summary.get("rows") or []]


# --- what the report says ----------------------------------------------------------------------


def headline(summary: dict) -> str:
    """The verdict in a line."""
    if summary.get("kind") == REPEAT:
        v = summary["verdict"]
        return (f"{'PASSED' if v['passed'] else 'NOT PASSED'}: {v['runs_passed']} of "
                f"{v['runs_asked']} runs passed their checks with the emulator trusted "
                f"({v['runs_made']} made, {summary['status']})")
    verdict = summary.get("verdict") or {}
    counts = verdict.get("counts", {})
    trusted = verdict.get("emulator_trusted")
    return (f"{summary['status'].upper()}: {counts.get(PASS, 0)} checks passed, "
            f"{counts.get(FAIL, 0)} failed, {counts.get(NOT_JUDGED, 0)} not judged; emulator "
            f"{'TRUSTED' if trusted else 'NOT TRUSTED'}")


@dataclass
class Table:
    rows: list[list[str]]  # the header first
    links: dict[int, str] = field(default_factory=dict)  # row index -> link of its first cell


@dataclass
class Figure:
    path: str  # relative to the run folder
    caption: str


@dataclass
class Section:
    title: str
    blocks: list = field(default_factory=list)  # paragraphs (str), Tables and Figures


def provenance_lines(prov: dict) -> list[str]:
    """The provenance as lines of text."""
    packages = ", ".join(f"{name} {version or 'not installed'}"
                         for name, version in (prov.get("python_packages") or {}).items())
    lines = [f"testbed {prov['testbed_version']} (commit {prov['commit'] or 'not a checkout'})",
             f"kernel {prov.get('uname') or prov['kernel']}; Open vSwitch "
             f"{prov['ovs_version']}; Mininet {prov.get('mininet_version')}; Python "
             f"{prov['python']}; {prov['cpus']} CPUs",
             "paths: " + ", ".join(f"{k} {v}" for k, v in prov["paths"].items())]
    if prov.get("command_line"):
        lines.insert(0, "command: " + " ".join(prov["command_line"]))
    if packages:
        lines.append(f"Python packages: {packages}")
    return lines


def plot_section(summary: dict) -> list[Section]:
    plots = summary.get("plots") or []
    return [Section("Plots", [Figure(p["path"], p["caption"]) for p in plots])] if plots else []


def run_sections(summary: dict) -> list[Section]:
    """The sections of one run's report."""
    v = summary.get("verdict") or {}
    trust = ["Yes: every fidelity check passed."] if v.get("emulator_trusted") else \
        [f"No: {reason}" for reason in v.get("reasons", [])]
    sections = [Section("Checks", [Table(without_empty_columns(
                    checks_table(v.get("checks", []))))]),
                Section("Did the emulator keep up?", [*trust, Table(without_empty_columns(
                    checks_table(v.get("trust", []))))])]
    if summary.get("rows"):
        sections.append(Section("Summary", [Table([["", ""], *summary_rows(summary)])]))
    return sections + plot_section(summary)


def repeat_sections(summary: dict) -> list[Section]:
    """The sections of a repeated run's report."""
    runs = [["run", "status", "checks", "emulator", "wall (s)", "folder"]]
    links = {}
    for index, r in enumerate(summary["runs"], 1):
        runs.append([str(index), r["status"], "passed" if r["checks_passed"] else "FAILED",
                     "trusted" if r["emulator_trusted"] else "NOT trusted", _cell(r["wall_s"]),
                     r["dir"]])
        links[index] = f"{r['dir']}/report.html"
    reasons = summary["verdict"]["reasons"] or ["Every run passed."]
    sections = [Section("Runs", [Table(runs, links), *reasons]),
                Section("Checks", [Table(without_empty_columns(
                    check_spreads_table(summary["checks"])))]),
                Section("Did the emulator keep up?", [Table(without_empty_columns(
                    check_spreads_table(summary["trust"])))])]
    if summary.get("rows"):
        sections.append(Section("Summary", [
            "Each number: the median over the runs, then its range and how many runs "
            "measured it.", Table([["", ""], *summary_rows(summary)])]))
    return sections + plot_section(summary)


def sections(summary: dict) -> list[Section]:
    """Every section of the report, in order, the provenance last."""
    body = repeat_sections(summary) if summary.get("kind") == REPEAT else run_sections(summary)
    when = (f"Started {summary['started_at']}, finished {summary['finished_at']}; everything "
            "measured in summary.json" + ("." if summary.get("kind") == REPEAT else
                                          ", the scenario and parameters in config.json."))
    return body + [Section("Provenance", [*provenance_lines(summary["provenance"]), when])]


def section_titles(summary: dict) -> list[str]:
    return [s.title for s in sections(summary)]


# --- markdown ----------------------------------------------------------------------------------


def md_table(rows: list[list[str]]) -> list[str]:
    if len(rows) < 2:
        return ["(none)"]
    esc = [[str(c).replace("|", "\\|").replace("\n", " ") for c in row] for row in rows]
    return ["| " + " | ".join(esc[0]) + " |", "|" + "---|" * len(esc[0]),
            *("| " + " | ".join(r) + " |" for r in esc[1:])]


def md_block(block, image_prefix: str) -> list[str]:
    if isinstance(block, Table):
        return md_table(block.rows)
    if isinstance(block, Figure):
        return [f"![{Path(block.path).stem}]({image_prefix}{block.path})", "",
                f"*{block.caption}*"]
    return [block]


def markdown(summary: dict, image_prefix: str = "") -> str:
    lines = [f"# {summary['run_id']}: {summary['title']}", "",
             f"**{headline(summary)}**", "", summary.get("headline", ""), ""]
    if summary.get("error"):
        lines += [f"Stopped: `{summary['error']}`", ""]
    for section in sections(summary):
        lines += [f"## {section.title}", ""]
        for block in section.blocks:
            lines += [*md_block(block, image_prefix), ""]
    return "\n".join(lines)


# --- html --------------------------------------------------------------------------------------

STYLE = """body{font-family:sans-serif;max-width:1100px;margin:2em auto;color:#222}
table{border-collapse:collapse;margin:1em 0;font-size:90%}td,th{border:1px solid #ccc;
padding:3px 6px;text-align:left}.PASS{color:#060;font-weight:bold}.FAIL{color:#b00;
font-weight:bold}figure{margin:1.5em 0}img{max-width:100%;border:1px solid #eee}
figcaption{font-size:90%;color:#444;margin-top:.3em}"""


def html_table(table: Table | list[list[str]]) -> str:
    table = table if isinstance(table, Table) else Table(table)
    rows = table.rows
    if len(rows) < 2:
        return "<p>(none)</p>"
    head = "".join(f"<th>{html.escape(c)}</th>" for c in rows[0])

    def cell(index: int, c: str, i: int) -> str:
        text = html.escape(c)
        if i == 0 and index in table.links:
            text = f'<a href="{html.escape(table.links[index])}">{text}</a>'
        return f'<td class="{html.escape(c)}">{text}</td>' if i == 0 else f"<td>{text}</td>"

    body = "".join("<tr>" + "".join(cell(index, c, i) for i, c in enumerate(r)) + "</tr>"
                   for index, r in enumerate(rows[1:], 1))
    return f"<table><tr>{head}</tr>{body}</table>"


def html_block(block, workdir: Path) -> str:
    if isinstance(block, Table):
        return html_table(block)
    if isinstance(block, Figure):
        data = base64.b64encode((workdir / block.path).read_bytes()).decode()
        return (f'<figure><img alt="{html.escape(block.path)}" '
                f'src="data:image/png;base64,{data}"><figcaption>'
                f"{html.escape(block.caption)}</figcaption></figure>")
    return f"<p>{html.escape(block)}</p>"


def html_page(summary: dict, workdir: Path) -> str:
    """The same report as one HTML file with the plots inline."""
    parts = [f"<h1>{html.escape(summary['run_id'])}: {html.escape(summary['title'])}</h1>",
             f'<p id="verdict"><b>{html.escape(headline(summary))}</b></p>',
             f"<p>{html.escape(summary.get('headline', ''))}</p>"]
    if summary.get("error"):
        parts.append(f"<p>Stopped: <code>{html.escape(summary['error'])}</code></p>")
    for section in sections(summary):
        parts.append(f"<section><h2>{html.escape(section.title)}</h2>")
        parts += [html_block(block, workdir) for block in section.blocks]
        parts.append("</section>")
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


# --- several runs ------------------------------------------------------------------------------

load_summary = read_summary


def gate_reasons(summary: dict) -> list[str]:
    """Why a run or a repeated run did not pass (it stopped, a check failed, the emulator
    did not keep up, a repeat is short of runs); [] when it passed."""
    if summary.get("kind") == REPEAT:
        return [f"{summary['run_id']}: {r}" for r in summary["verdict"]["reasons"]] or (
            [] if summary["verdict"]["passed"] else [f"{summary['run_id']}: not passed"])
    return run_reasons(f"run {summary['run_id']}", summary)


def check_cell(summary: dict, key: tuple[str, str], which: str) -> str | None:
    """A check's cell for one column: measured value and outcome (a repeat: the spread and
    how many runs passed it)."""
    if summary.get("kind") == REPEAT:
        for c in summary[which]:
            if (c["name"], c.get("setup") or "") == key:
                judged = [o for o in c["outcomes"] if o in (PASS, FAIL)]
                measured = "-" if c["measured"] is None else spread_text(
                    {**c["measured"], "unit": ""})
                return f"{measured} {judged.count(PASS)}/{len(c['outcomes'])} PASS"
        return None
    for c in (summary.get("verdict") or {}).get(which, []):
        if (c["name"], c.get("setup") or "") == key:
            return f"{_cell(c['measured'])} {c['outcome']}"
    return None


def check_keys(summary: dict, which: str) -> list[tuple[str, str]]:
    checks = summary[which] if summary.get("kind") == REPEAT else \
        (summary.get("verdict") or {}).get(which, [])
    return [(c["name"], c.get("setup") or "") for c in checks]


def number_cells(summary: dict) -> dict[str, str]:
    """Every headline number of a run (its value) or a repeat (its spread), by label."""
    cells = {}
    for row in summary.get("rows") or []:
        for n in row.get("numbers", []):
            label = row["what"] if n["name"] == row["what"] else f"{row['what']}: {n['name']}"
            label += f" ({n['unit']})" if n["unit"] else ""
            cells[label] = (spread_text({**n, "unit": ""}) if summary.get("kind") == REPEAT
                            else _cell(n["value"]))
    return cells


def column_head(summary: dict) -> list[str]:
    """The rows every column starts with: what ran and whether it passed."""
    if summary.get("kind") == REPEAT:
        v = summary["verdict"]
        runs = f"{v['runs_made']} of {v['runs_asked']}"
        trusted = f"{sum(r['emulator_trusted'] for r in summary['runs'])}/{v['runs_made']} runs"
        passed = f"{v['runs_passed']}/{v['runs_asked']} runs"
    else:
        runs, trusted = "1", str((summary.get("verdict") or {}).get("emulator_trusted"))
        passed = "yes" if not gate_reasons(summary) else "no"
    return [summary["experiment"], summary["status"], runs, _cell(summary.get("link_rate_mbit")),
            trusted, passed]


def compare(run_dirs: list[Path]) -> list[list[str]]:
    """A table of several runs or repeated runs side by side: one column per folder; rows
    for what ran and whether it passed, then one per check (by name and setup) with the
    measured value and outcome (a repeat: the spread and how many runs passed), then one per
    headline number."""
    summaries = [read_summary(d) for d in run_dirs]
    heads = ["experiment", "status", "runs", "link rate (Mbit/s)", "emulator trusted",
             "passed"]
    rows = [["check", *(s["run_id"] for s in summaries)]]
    rows += [[what, *values] for what, *values in zip(heads, *map(column_head, summaries))]
    for which, suffix in (("checks", ""), ("trust", " (trust)")):
        keys = list(dict.fromkeys(k for s in summaries for k in check_keys(s, which)))
        for key in keys:
            name = key[0] + (f" [{key[1]}]" if key[1] else "") + suffix
            rows.append([name, *(check_cell(s, key, which) or "-" for s in summaries)])
    numbers = [number_cells(s) for s in summaries]
    for label in dict.fromkeys(label for cells in numbers for label in cells):
        rows.append([label, *(cells.get(label, "-") for cells in numbers)])
    return rows


__all__ = ["Verdict", "compare", "gate_reasons", "write_report", "markdown", "html_page",
           "checks_table", "sections", "section_titles"]
