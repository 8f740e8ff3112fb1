"""A run's report.html opened in headless Chromium, as a reader's browser would: which images
loaded, which sections the page has, and a screenshot of the whole page kept as a test
artefact. Debian's chromium package (scripts/install.sh installs it); TESTBED_CHROMIUM
names another binary. Nothing here touches the machine's network."""
from __future__ import annotations

import html
import json
import os
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

CHROMIUM_ENV = "TESTBED_CHROMIUM"
ARTEFACTS_ENV = "TESTBED_TEST_ARTEFACTS"  # where screenshots are kept (default: pytest's tmp)
CANDIDATES = ("/usr/bin/chromium", "chromium", "chromium-browser")
FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
         "--disable-component-update", "--disable-sync", "--no-first-run",
         "--disable-dev-shm-usage", "--hide-scrollbars")
LOAD_BUDGET_MS = 10_000  # virtual time the page gets to load its (inline) images
TIMEOUT_S = 180
WIDTH_PX = 1280
MAX_HEIGHT_PX = 16_384
# Appended to a copy of the page: once it has loaded, writes what it found into the DOM,
# which --dump-dom prints.
PROBE = """<script>window.addEventListener('load', function () {
  var images = Array.prototype.slice.call(document.images);
  var found = {
    images: images.length,
    broken: images.filter(function (i) { return !(i.complete && i.naturalWidth > 0); })
                  .map(function (i) { return i.alt; }),
    sections: Array.prototype.map.call(document.querySelectorAll('section > h2'),
                                       function (h) { return h.textContent; }),
    captions: document.querySelectorAll('figure > figcaption').length,
    height: document.documentElement.scrollHeight};
  var out = document.createElement('pre');
  out.id = 'probe';
  out.textContent = JSON.stringify(found);
  document.body.appendChild(out);
});</script>"""


def chromium() -> str:
    """The Chromium binary; a test failure (never a skip) when there is none."""
    for candidate in filter(None, (os.environ.get(CHROMIUM_ENV), *CANDIDATES)):
        path = shutil.which(candidate)
        if path:
            return path
    pytest.fail(f"no Chromium: scripts/install.sh installs Debian's chromium package, or set "
                f"{CHROMIUM_ENV} to a Chromium binary", pytrace=False)


def run_chromium(*args: str) -> subprocess.CompletedProcess:
    with tempfile.TemporaryDirectory(prefix="testbed-chromium-") as profile:
        return subprocess.run([chromium(), *FLAGS, f"--user-data-dir={profile}", *args],
                              capture_output=True, text=True, timeout=TIMEOUT_S)


def artefact_dir(tmp_path: Path) -> Path:
    folder = Path(os.environ.get(ARTEFACTS_ENV) or tmp_path)
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def open_report(report_html: Path, screenshot: Path, workdir: Path) -> dict:
    """Open ``report_html`` in headless Chromium: what it found once the page loaded
    (images, broken images by their alt text, section titles, captions, page height), and a
    screenshot of the whole page at ``screenshot``."""
    probed = workdir / f"probe-{report_html.parent.name}.html"
    probed.write_text(report_html.read_text().replace("</body>", PROBE + "</body>"))
    out = run_chromium(f"--virtual-time-budget={LOAD_BUDGET_MS}",  # laid out as shot below
                       f"--window-size={WIDTH_PX},800", "--dump-dom", probed.as_uri())
    match = re.search(r'<pre id="probe">(.*?)</pre>', out.stdout, re.DOTALL)
    assert match, f"Chromium printed no probe (exit {out.returncode}): {out.stderr[-2000:]}"
    found = json.loads(html.unescape(match.group(1)))
    height = min(MAX_HEIGHT_PX, max(800, found["height"]))
    shot = run_chromium(f"--virtual-time-budget={LOAD_BUDGET_MS}",
                        f"--window-size={WIDTH_PX},{height}", f"--screenshot={screenshot}",
                        report_html.resolve().as_uri())
    assert screenshot.exists(), f"no screenshot (exit {shot.returncode}): {shot.stderr[-2000:]}"
    return found


def check_report_in_browser(run_dir: Path, tmp_path: Path) -> Path:
    """A run's (or repeated run's) report.html, opened in Chromium, shows every image of its
    summary loaded, each with its caption, and every section; returns the screenshot."""
    from testbed.harness.report import section_titles
    from testbed.harness.summary_schema import read_summary

    summary = read_summary(run_dir)
    screenshot = artefact_dir(tmp_path) / f"report-{Path(run_dir).resolve().name}.png"
    found = open_report(Path(run_dir) / "report.html", screenshot, tmp_path)
    assert found["broken"] == [], f"images that did not load: {found['broken']}"
    assert found["images"] == found["captions"] == len(summary["plots"])
    assert found["sections"] == section_titles(summary)
    assert screenshot.read_bytes().startswith(b"\x89PNG") and screenshot.stat().st_size > 10_000
    print(f"screenshot of {run_dir}/report.html: {screenshot}")
    return screenshot
