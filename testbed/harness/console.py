"""What a run prints: its summary rows, every check as PASS or FAIL with measured against
expected, and whether the emulator kept up (rich tables; plain text when not a terminal)."""
from __future__ import annotations

from rich.console import Console
from rich.table import Table

from testbed.harness.report import checks_table, headline
from testbed.model.verdict import FAIL, NOT_JUDGED, PASS

STYLES = {PASS: "green", FAIL: "bold red", NOT_JUDGED: "yellow"}
PLAIN_WIDTH = 140  # columns when the output is not a terminal (logs, pipes)


def console() -> Console:
    c = Console(highlight=False, soft_wrap=False)
    if not c.is_terminal:
        c = Console(highlight=False, width=PLAIN_WIDTH, no_color=True)
    return c


def print_rows(rows: list[list[str]], title: str | None = None) -> None:
    """A table whose first row is the header."""
    table = Table(*rows[0], title=title, title_justify="left", show_lines=False)
    for row in rows[1:]:
        table.add_row(*row)
    console().print(table)


def print_summary(summary: dict) -> None:
    out = console()
    out.print()
    out.print(f"[bold]{summary['run_id']}[/bold]: {summary.get('headline', summary['title'])}")
    if summary.get("rows"):
        table = Table(show_header=False, box=None, padding=(0, 2))
        for what, value in summary["rows"]:
            table.add_row(what, value)
        out.print(table)
    verdict = summary.get("verdict") or {}
    for title, key in (("Checks", "checks"), ("Did the emulator keep up?", "trust")):
        rows = checks_table(verdict.get(key, []))
        if len(rows) < 2:
            continue
        table = Table(*rows[0][:-1], title=title, title_justify="left")
        for row in rows[1:]:
            style = STYLES.get(row[0], "")
            table.add_row(f"[{style}]{row[0]}[/{style}]" if style else row[0], *row[1:-1])
        out.print(table)
    for statement in verdict.get("statements", []):
        out.print(f"  - {statement}")
    if not verdict.get("emulator_trusted"):
        for reason in verdict.get("reasons", []):
            out.print(f"  [red]not trusted:[/red] {reason}")
    if summary.get("error"):
        out.print(f"[red]stopped:[/red] {summary['error']}")
    out.print(f"[bold]{headline(summary)}[/bold]")
    out.print(f"results: {summary['results_dir']} (report.html, report.md, summary.json)")
