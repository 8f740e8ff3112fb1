"""The pages a lab run leaves for people: a lab's self-check (self-check.md, .html) with a
link to every run's report, and the index of every lab's latest run (results/labs/index.md,
.html: what ``make lab`` writes). Pure text from plain data, but for reading what the
folders hold."""
from __future__ import annotations

import html
import json
import os
from dataclasses import dataclass
from pathlib import Path

from testbed.harness.report import STYLE, html_table, md_table
from testbed.lab.judge import SelfCheck

INDEX = "index"


def relative(target: str | Path, start: Path) -> str:
    return Path(os.path.relpath(Path(target), start)).as_posix()


def report_links(run_dirs: dict[str, str], start: Path, suffix: str) -> list[tuple[str, str]]:
    """(run name, path of its report.<suffix> relative to ``start``) for each run with one."""
    links = []
    for name, folder in run_dirs.items():
        report = Path(folder) / f"report.{suffix}"
        if report.is_file():
            links.append((name, relative(report, start)))
        elif (Path(folder) / "transcript.md").is_file():
            links.append((name, relative(Path(folder) / "transcript.md", start)))
    return links


def self_check_markdown(check: SelfCheck, folder: Path) -> str:
    lines = [f"# Lab {check.lab}: {check.title}", "", f"**{check.headline()}**", "",
             *md_table(check.rows()), "", "Runs:", ""]
    lines += [f"- {name}: [{path}]({path})" for name, path in
              report_links(check.run_dirs, folder, "md")] or ["- (none)"]
    return "\n".join(lines) + "\n"


def self_check_html(check: SelfCheck, folder: Path) -> str:
    links = "".join(f'<li>{html.escape(name)}: <a href="{html.escape(path)}">'
                    f"{html.escape(path)}</a></li>"
                    for name, path in report_links(check.run_dirs, folder, "html"))
    body = (f"<h1>Lab {html.escape(check.lab)}: {html.escape(check.title)}</h1>"
            f"<p><b>{html.escape(check.headline())}</b></p>{html_table(check.rows())}"
            f"<h2>Runs</h2><ul>{links or '<li>(none)</li>'}</ul>")
    return page(f"lab {check.lab}", body)


def page(title: str, body: str) -> str:
    return (f"<!doctype html><html><head><meta charset='utf-8'><title>{html.escape(title)}"
            f"</title><style>{STYLE}</style></head><body>{body}</body></html>\n")


@dataclass(frozen=True)
class IndexRow:
    """One lab in the index: its latest run folder (None: never run) and self-check."""

    lab: str
    title: str
    folder: Path | None
    form: str = ""
    check: dict | None = None  # self-check.json
    runs: tuple[tuple[str, str], ...] = ()  # (run name, run folder)


def index_rows(labs, latest) -> list[IndexRow]:
    """Every lab with its latest run (``latest(lab)``: a runner.LabRun, or None)."""
    rows = []
    for lab in labs:
        record = latest(lab)
        if record is None:
            rows.append(IndexRow(lab.name, lab.title, None))
            continue
        try:
            check = json.loads((record.folder / "self-check.json").read_text())
        except (OSError, ValueError):
            check = None
        runs = dict(record.runs)
        if record.replay:
            runs["walkthrough"] = str(record.folder)
        rows.append(IndexRow(lab.name, lab.title, record.folder, record.form, check,
                             tuple(runs.items())))
    return rows


def outcome_text(row: IndexRow) -> str:
    if row.folder is None:
        return "not run"
    if row.check is None:
        return "not checked"
    c = row.check.get("counts", {})
    return (f"{'PASSED' if row.check.get('passed') else 'NOT PASSED'} ({c.get('PASS', 0)} "
            f"passed, {c.get('FAIL', 0)} failed, {c.get('not judged', 0)} not judged)")


def index_markdown(rows: list[IndexRow], root: Path) -> str:
    table = [["lab", "form", "self-check", "reports"]]
    for row in rows:
        check = outcome_text(row)
        if row.check is not None:
            check = f"[{check}]({relative(row.folder / 'self-check.md', root)})"
        reports = ", ".join(f"[{name}]({path})" for name, path in
                            report_links(dict(row.runs), root, "md")) or "-"
        table.append([f"{row.lab}: {row.title}", row.form or "-", check, reports])
    passed = sum(1 for r in rows if r.check and r.check.get("passed"))
    return "\n".join(["# Labs: the latest run of each", "",
                      f"{passed} of {len(rows)} labs passed their self-check.", "",
                      *md_table(table), ""])


def index_html(rows: list[IndexRow], root: Path) -> str:
    body = ["<h1>Labs: the latest run of each</h1>",
            f"<p>{sum(1 for r in rows if r.check and r.check.get('passed'))} of {len(rows)} "
            "labs passed their self-check.</p>",
            "<table><tr><th>lab</th><th>form</th><th>self-check</th><th>reports</th></tr>"]
    for row in rows:
        check = html.escape(outcome_text(row))
        css = "PASS" if row.check and row.check.get("passed") else "FAIL" if row.check else ""
        if row.check is not None:
            check = (f'<a class="{css}" href="'
                     f'{html.escape(relative(row.folder / "self-check.html", root))}">{check}</a>')
        reports = ", ".join(f'<a href="{html.escape(path)}">{html.escape(name)}</a>'
                            for name, path in report_links(dict(row.runs), root, "html")) or "-"
        body.append(f"<tr><td>{html.escape(row.lab)}: {html.escape(row.title)}</td>"
                    f"<td>{html.escape(row.form or '-')}</td><td>{check}</td>"
                    f"<td>{reports}</td></tr>")
    body.append("</table>")
    return page("labs", "\n".join(body))


def write_index(rows: list[IndexRow], root: Path) -> list[Path]:
    root.mkdir(parents=True, exist_ok=True)
    md, page_path = root / f"{INDEX}.md", root / f"{INDEX}.html"
    md.write_text(index_markdown(rows, root))
    page_path.write_text(index_html(rows, root))
    return [md, page_path]
