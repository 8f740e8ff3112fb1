"""What the testbed prints as tables, all through rich: a run's summary rows, every check as
PASS or FAIL with measured against expected, and whether the emulator kept up (plain text
when not a terminal); and ``table_text``, the one plain aligned table (``testbed topo``,
``testbed doctor``: ``doctor_report``). Text from a summary is printed as text: square
brackets in it are not rich markup."""
from __future__ import annotations

from io import StringIO

from rich import box
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from testbed.capabilities import (
    Platform,
    capability_rows,
    ecn_marking_summary,
    path_rows,
    rdma_summary,
)
from testbed.harness.report import (
    check_spreads_table,
    checks_table,
    headline,
    summary_rows,
    without_empty_columns,
)
from testbed.harness.summary_schema import REPEAT
from testbed.model.verdict import FAIL, NOT_JUDGED, PASS

STYLES = {PASS: "green", FAIL: "bold red", NOT_JUDGED: "yellow"}
PLAIN_WIDTH = 140  # columns when the output is not a terminal (logs, pipes)
UNWRAPPED_WIDTH = 10_000  # table_text's lines are as long as their cells make them


def console() -> Console:
    c = Console(highlight=False, soft_wrap=False)
    if not c.is_terminal:
        c = Console(highlight=False, width=PLAIN_WIDTH, no_color=True)
    return c


# No borders; a rule of dashes under the header only (the lines of a rich Box: top, head,
# head_row, mid, row, foot_row, foot, bottom; each left, horizontal, divider, right).
HEADER_RULE = box.Box("    \n    \n -  \n    \n    \n    \n    \n    \n", ascii=True)


def table_text(rows, header=None) -> str:
    """Rows of cells as plain text: columns left-aligned, two spaces apart, no borders and no
    wrapping (a long cell makes a long line), trailing blanks trimmed; ``header`` (column
    names) above them, ruled off with dashes."""
    if header is None:
        table = Table(*([""] * len(rows[0] if rows else ())), show_header=False, box=None,
                      pad_edge=False, padding=(0, 1))
    else:  # the divider is a blank column, so one blank of padding on the right makes two
        table = Table(*header, box=HEADER_RULE, show_edge=False, pad_edge=False,
                      padding=(0, 1, 0, 0), header_style="")
    for row in rows:
        table.add_row(*(str(cell) for cell in row))
    out = StringIO()
    Console(file=out, width=UNWRAPPED_WIDTH, no_color=True, highlight=False, emoji=False,
            markup=False).print(table)
    return "\n".join(line.rstrip() for line in out.getvalue().splitlines())


def print_rows(rows: list[list[str]], title: str | None = None) -> None:
    """A table whose first row is the header."""
    table = Table(*map(escape, rows[0]), title=title, title_justify="left", show_lines=False)
    for row in rows[1:]:
        table.add_row(*map(escape, row))
    console().print(table)


def checks_rich_table(rows: list[list[str]], title: str) -> Table:
    """A checks table (header first, the outcome in the first column) with its outcomes
    coloured."""
    table = Table(*map(escape, rows[0]), title=title, title_justify="left")
    for row in rows[1:]:
        style = STYLES.get(row[0], "")
        cells = [escape(cell) for cell in row]
        table.add_row(f"[{style}]{cells[0]}[/{style}]" if style else cells[0], *cells[1:])
    return table


def print_rows_of(out: Console, summary: dict) -> None:
    if summary.get("rows"):
        table = Table(show_header=False, box=None, padding=(0, 2))
        for what, text in summary_rows(summary):
            table.add_row(escape(what), escape(text))
        out.print(table)


def print_repeat_summary(summary: dict) -> None:
    """A repeated run's runs, its checks over the runs, its rows with their spread, and why
    runs did not pass."""
    out = console()
    out.print()
    out.print(f"[bold]{escape(summary['run_id'])}[/bold]: {escape(summary['headline'])}")
    runs = Table("run", "id", "status", "checks", "emulator", "wall (s)", title="Runs",
                 title_justify="left")
    for index, r in enumerate(summary["runs"], 1):
        runs.add_row(str(index), escape(r["run_id"]), r["status"],
                     "passed" if r["checks_passed"] else "[bold red]FAILED[/bold red]",
                     "trusted" if r["emulator_trusted"] else "[red]NOT trusted[/red]",
                     f"{r['wall_s']:.0f}" if r["wall_s"] is not None else "-")
    out.print(runs)
    print_rows_of(out, summary)
    for title, key in (("Checks over the runs", "checks"),
                       ("Did the emulator keep up? (over the runs)", "trust")):
        rows = without_empty_columns(check_spreads_table(summary[key]))
        if len(rows) > 1:
            out.print(checks_rich_table(rows, title))
    for reason in summary["verdict"]["reasons"]:
        out.print(f"  [red]not passed:[/red] {escape(reason)}")
    if summary.get("error"):
        out.print(f"[red]stopped:[/red] {escape(summary['error'])}")
    out.print(f"[bold]{escape(headline(summary))}[/bold]")
    out.print(f"results: {escape(summary['results_dir'])} (report.html, report.md, summary.json; each "
              "run's folder inside)")


def print_summary(summary: dict) -> None:
    if summary.get("kind") == REPEAT:
        print_repeat_summary(summary)
        return
    out = console()
    out.print()
    out.print(f"[bold]{escape(summary['run_id'])}[/bold]: "
              f"{escape(summary.get('headline') or summary['title'])}")
    print_rows_of(out, summary)
    verdict = summary.get("verdict") or {}
    for title, key in (("Checks", "checks"), ("Did the emulator keep up?", "trust")):
        rows = checks_table(verdict.get(key, []))
        if len(rows) < 2:
            continue
        # the statements are printed below the tables, one a line
        out.print(checks_rich_table(without_empty_columns([row[:-1] for row in rows]), title))
    for statement in verdict.get("statements", []):
        out.print(f"  - {escape(statement)}")
    if not verdict.get("emulator_trusted"):
        for reason in verdict.get("reasons", []):
            out.print(f"  [red]not trusted:[/red] {escape(reason)}")
    if summary.get("error"):
        out.print(f"[red]stopped:[/red] {escape(summary['error'])}")
    out.print(f"[bold]{escape(headline(summary))}[/bold]")
    out.print(f"results: {escape(summary['results_dir'])} (report.html, report.md, summary.json)")


def doctor_report(platform: Platform) -> str:
    """``testbed doctor``'s report: the kernel, each capability yes/no with its detail, each
    feature's path, and the ECN marking summary, the tables aligned."""
    return "\n\n".join([f"kernel {platform.kernel_release}",
                        table_text(capability_rows(platform), ("capability", "avail", "detail")),
                        table_text(path_rows(platform), ("feature", "path")),
                        rdma_summary(platform), ecn_marking_summary(platform)])
