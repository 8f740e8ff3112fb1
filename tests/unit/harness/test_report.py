"""The report (testbed.harness.report): what report.md and report.html say for a run and for a
repeated run, captions under every figure, no column empty in every row, the HTML's
structure on a run folder drawn by the harness's own plotting code, and comparing and gating
several runs (``testbed report``)."""
from __future__ import annotations

import base64
import json
from html.parser import HTMLParser
from pathlib import Path

import pytest
from tests.unit.report_folders import synthetic_run
from tests.unit.summaries import (
    UNTRUSTED,
    number,
    repeat_summary,
    run_summary,
    write_repeat,
    write_run,
)

from testbed.errors import ConfigError
from testbed.harness.plots import DEFAULT_CAPTION
from testbed.harness.report import (
    compare,
    gate_reasons,
    html_page,
    markdown,
    section_titles,
    without_empty_columns,
    write_report,
)
from testbed.harness.summary_schema import read_summary
from testbed.model.verdict import Check, at_least, at_most, holds

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def test_the_report_states_each_check_with_measured_against_expected(tmp_path):
    checks = [at_least("busbw / link rate", 0.5, 0.9, "fraction", "too slow")]
    summary = run_summary(checks=checks, rows=[("busbw", "5.8 Mbit/s")])
    md = markdown(summary)
    assert "**COMPLETE: 0 checks passed, 1 failed, 0 not judged; emulator TRUSTED**" in md
    # tolerance and setup are empty in every row: left out
    assert "| outcome | check | measured | expected | unit | what it means |" in md
    assert "| FAIL | busbw / link rate | 0.5 | >= 0.9 | fraction | too slow |" in md
    assert "| busbw | 5.8 Mbit/s |" in md
    stopped = run_summary(checks=checks, status="failed", error="boom")
    page = html_page(stopped, tmp_path)
    assert '<td class="FAIL">FAIL</td>' in page and "Stopped: <code>boom</code>" in page
    assert [p.name for p in write_report(summary, tmp_path)] == ["report.md", "report.html"]


def test_a_column_is_left_out_only_when_every_row_leaves_it_empty():
    rows = [["a", "b", "c", "d"], ["1", "", "-", "x"], ["2", "", "3", ""]]
    assert without_empty_columns(rows) == [["a", "c", "d"], ["1", "-", "x"], ["2", "3", ""]]
    assert without_empty_columns([["a", "b"]]) == [["a", "b"]]  # nothing below the header
    setups = [Check("x", 1, 1, None, "", True, "", "narrow").to_dict(),
              Check("y", 1, 1, 0.5, "", True).to_dict()]
    md = markdown(run_summary(checks=[Check.from_dict(c) for c in setups]))
    assert "| outcome | check | measured | expected | tolerance | setup |" in md


def test_every_plot_has_its_caption_under_it(tmp_path):
    (tmp_path / "plots").mkdir()
    (tmp_path / "plots" / "a.png").write_bytes(PNG_MAGIC + b"fake")
    summary = run_summary(plots=[{"path": "plots/a.png", "caption": "Look at the knee."}])
    md = markdown(summary)
    assert "![a](plots/a.png)\n\n*Look at the knee.*" in md
    page = html_page(summary, tmp_path)
    encoded = base64.b64encode(PNG_MAGIC + b"fake").decode()
    assert (f'<figure><img alt="plots/a.png" src="data:image/png;base64,{encoded}">'
            "<figcaption>Look at the knee.</figcaption></figure>") in page


class Page(HTMLParser):
    """What a report.html holds: its sections' titles, its images, each figure's caption
    and each table's rows."""

    def __init__(self):
        super().__init__()
        self.sections, self.images, self.captions, self.tables = [], [], [], []
        self._in = None

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if tag == "img":
            self.images.append(attrs["src"])
        elif tag == "table":
            self.tables.append([])
        elif tag == "tr":
            self.tables[-1].append([])
        elif tag in ("h2", "figcaption", "td", "th"):
            self._in = tag
            if tag in ("td", "th"):
                self.tables[-1][-1].append("")
            elif tag == "h2":
                self.sections.append("")
            else:
                self.captions.append("")

    def handle_endtag(self, tag):
        if tag == self._in:
            self._in = None

    def handle_data(self, data):
        if self._in == "h2":
            self.sections[-1] += data
        elif self._in == "figcaption":
            self.captions[-1] += data
        elif self._in in ("td", "th"):
            self.tables[-1][-1][-1] += data


def test_the_html_of_a_drawn_run_has_every_section_image_and_caption(tmp_path):
    folder = synthetic_run(tmp_path / "20261201-000000-fattree-allreduce-ab12")
    summary = read_summary(folder)
    page = Page()
    page.feed((folder / "report.html").read_text())
    assert page.sections == section_titles(summary) == [
        "Checks", "Did the emulator keep up?", "Summary", "Plots", "Provenance"]
    assert [Path(p["path"]).name for p in summary["plots"]] == [
        "topology.png", "link_rates.png", "link_utilisation.png", "weathermap.png"]
    assert len(page.images) == len(summary["plots"])
    for src in page.images:
        assert src.startswith("data:image/png;base64,")
        assert base64.b64decode(src.split(",", 1)[1]).startswith(PNG_MAGIC)
    assert page.captions == [p["caption"] for p in summary["plots"]]
    assert all(c and c != DEFAULT_CAPTION for c in page.captions)  # each says what to look at
    for table in page.tables:
        body = table[1:]
        assert all(len(row) == len(table[0]) for row in body)
        for column in range(len(table[0])):
            if table[0][column]:
                assert any(row[column].strip() not in ("", "-") for row in body), table[0]
    md = (folder / "report.md").read_text()
    assert all(f"## {title}" in md for title in section_titles(summary))


def test_a_repeat_report_lists_its_runs_and_every_number_with_its_spread(tmp_path):
    runs = [run_summary(run_id=f"r{i}", results_dir=f"results/rep/r{i}",
                        checks=[at_least("busbw", value, 0.9, "fraction")],
                        rows=[("busbw", f"{value}", number("busbw", value, "fraction"))])
            for i, value in enumerate((0.95, 0.85, 0.97), 1)]
    summary = repeat_summary(runs, folder=Path("results/rep"))
    md = markdown(summary)
    assert section_titles(summary)[:2] == ["Runs", "Checks"]
    assert "**NOT PASSED: 2 of 3 runs passed their checks with the emulator trusted" in md
    assert "| busbw | 0.95 fraction (0.85 to 0.97, N=3) |" in md
    assert "| FAIL | busbw | 0.95 (0.85 to 0.97, N=3) | >= 0.9 | fraction | PASS FAIL PASS |" in md
    assert "run 2 (r2): check failed: busbw measured 0.85 fraction (expected >= 0.9)" in md
    page = html_page(summary, tmp_path)
    assert '<a href="r1/report.html">1</a>' in page


def test_compare_lines_runs_up_by_check(tmp_path):
    write_run(tmp_path / "a", checks=[at_least("busbw", 0.95, 0.9, "")])
    write_run(tmp_path / "b", checks=[at_least("busbw", 0.5, 0.9, ""), holds("extra", True)])
    rows = compare([tmp_path / "a", tmp_path / "b"])
    assert rows[0] == ["check", "a", "b"]
    assert ["busbw", "0.95 PASS", "0.5 FAIL"] in rows and ["extra", "-", "True PASS"] in rows
    assert ["passed", "yes", "no"] in rows


def test_compare_puts_a_repeat_beside_a_run(tmp_path):
    single = write_run(tmp_path / "single", checks=[at_least("busbw", 0.95, 0.9, "fraction")],
                       rows=[("busbw", "x", number("busbw", 5.7, "Mbit/s"))])
    runs = [run_summary(run_id=f"r{i}", results_dir=str(tmp_path / "rep" / f"r{i}"),
                        checks=[at_least("busbw", v, 0.9, "fraction")],
                        rows=[("busbw", "x", number("busbw", 6 * v, "Mbit/s"))])
            for i, v in enumerate((0.9, 0.96, 0.99), 1)]
    repeat = write_repeat(tmp_path / "rep", runs)
    rows = {row[0]: row[1:] for row in compare([single, repeat])}
    assert rows["runs"] == ["1", "3 of 3"]
    assert rows["busbw"] == ["0.95 PASS", "0.96 (0.9 to 0.99, N=3) 3/3 PASS"]
    assert rows["busbw (Mbit/s)"] == ["5.7", "5.76 (5.4 to 5.94, N=3)"]
    assert rows["machine CPU busy (trust)"][1] == "0.4 (0.4 to 0.4, N=3) 3/3 PASS"


def test_gate_reasons_name_what_did_not_pass(tmp_path):
    assert gate_reasons(run_summary(checks=[at_least("a", 1, 0, "")])) == []
    (why,) = gate_reasons(run_summary(run_id="u", trust=UNTRUSTED))
    assert why.startswith("run u: emulator not trusted: machine CPU busy: 0.99 fraction")
    (why,) = gate_reasons(run_summary(run_id="s", status="interrupted", error="interrupted"))
    assert why == "run s interrupted: interrupted"
    good = run_summary(run_id="g")
    short = repeat_summary([good], asked=2, repeat_id="rep")
    assert gate_reasons(short) == ["rep: only 1 of the 2 runs asked for were made"]
    assert gate_reasons(repeat_summary([good, good], repeat_id="rep")) == []


def test_compare_refuses_a_folder_without_a_summary(tmp_path):
    with pytest.raises(ConfigError, match="not a run folder"):
        compare([tmp_path])


def test_a_version_1_summary_is_still_read_and_reported(tmp_path):
    v1 = {key: value for key, value in run_summary(checks=[at_most("x", 1, 2, "")]).items()
          if key not in ("kind", "rows", "plots")}
    v1.update(schema_version=1, rows=[["busbw", "5.8 Mbit/s"]], plots=["plots/a.png"],
              provenance={k: v for k, v in v1["provenance"].items()
                          if k in ("testbed_version", "commit", "kernel", "ovs_version",
                                   "python", "machine", "cpus", "memory_bytes", "paths")})
    (tmp_path / "summary.json").write_text(json.dumps(v1))
    summary = read_summary(tmp_path)
    assert summary["rows"] == [{"what": "busbw", "text": "5.8 Mbit/s", "numbers": []}]
    assert summary["plots"] == [{"path": "plots/a.png", "caption": DEFAULT_CAPTION}]
    assert summary["provenance"]["command_line"] == [] and summary["kind"] == "run"
    assert "| busbw | 5.8 Mbit/s |" in markdown(summary)
