"""scripts/install.sh's quiet steps, run in a shell of their own with a log in a temporary
folder: a step prints one line with what it does and how long it took and keeps its output
in the log; a failing step prints the log's last lines and exits with its status. Nothing
is installed."""
from __future__ import annotations

import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
INSTALL = ROOT / "scripts" / "install.sh"
TAIL_LINES = 3


def step_function() -> str:
    """install.sh's ``step`` function, as written there."""
    text = INSTALL.read_text()
    match = re.search(r"^step\(\) \{\n.*?^\}\n", text, re.MULTILINE | re.DOTALL)
    assert match, "install.sh has no step() function"
    return match.group(0)


def run_steps(log: Path, *steps: str) -> subprocess.CompletedProcess:
    script = "\n".join(["set -euo pipefail", f"LOG={log}", f"LOG_TAIL_LINES={TAIL_LINES}",
                        step_function(), *steps, "echo after"])
    return subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=30)


def test_a_step_prints_one_line_and_keeps_its_output_in_the_log(tmp_path):
    log = tmp_path / "install.log"
    out = run_steps(log, 'step "saying hello" sh -c "echo hello; echo noise >&2"')
    assert out.returncode == 0
    assert re.fullmatch(r"\[install\] saying hello \.\.\. done \(\d+ s\)\nafter\n", out.stdout)
    assert out.stderr == ""
    assert "hello" in log.read_text() and "noise" in log.read_text()


def test_a_failing_step_shows_the_logs_tail_and_exits_with_its_status(tmp_path):
    log = tmp_path / "install.log"
    out = run_steps(log, "step breaking sh -c 'for i in 1 2 3 4 5; do echo line$i; done; "
                         "exit 7'")
    assert out.returncode == 7
    assert out.stdout == "[install] breaking ... failed (exit 7)\n"  # nothing after it ran
    assert out.stderr.splitlines() == [
        f"install.sh: breaking failed; the last {TAIL_LINES} lines of {log}:",
        "line3", "line4", "line5"]
