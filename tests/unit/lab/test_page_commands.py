"""Every `testbed run` command the labs' pages print (students' questions, teachers'
answers, the labs' README) resolves as the CLI would resolve it: the scenario (a file or a
bundled name) exists and every `--set` names a field and a value the scenario accepts.
Nothing runs; a command a student copies from a page never ends in a bad-input error."""
from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from testbed.cli import build_parser, run_origins, run_overrides
from testbed.experiments.registry import load
from testbed.harness.scenario import ScenarioError

ROOT = Path(__file__).resolve().parents[3]
PAGES = sorted((ROOT / "labs").rglob("*.md"))
# A command in backticks, possibly wrapped over lines: `sudo .venv/bin/testbed run ...`
COMMAND = re.compile(r"`(?:sudo )?(?:\.venv/bin/)?testbed run ([^`]+)`")
# A command valid only on a kernel with a feature this machine lacks (the page names the
# kernel) is refused with this in its message, after its fields were checked.
KERNEL_FEATURE = "needs the kernel's"


def page_commands() -> list[tuple[str, str]]:
    found = []
    for page in PAGES:
        for match in COMMAND.finditer(page.read_text()):
            found.append((str(page.relative_to(ROOT)), " ".join(match.group(1).split())))
    return found


COMMANDS = page_commands()


def test_the_pages_print_commands():
    assert len(COMMANDS) >= 16  # one "change a parameter" run per exercise at least


@pytest.mark.parametrize(("page", "command"), COMMANDS, ids=[f"{p}: {c}" for p, c in COMMANDS])
def test_a_page_command_resolves(page, command, monkeypatch):
    monkeypatch.chdir(ROOT)
    args = build_parser().parse_args(["run", *shlex.split(command)])
    try:
        load(args.scenario, run_overrides(args), run_origins(args))
    except ScenarioError as err:
        if KERNEL_FEATURE not in str(err):
            raise
