"""Lab 00, the walkthrough: the commands its page shows, the shape each one's output must
have (the companion file), the replay of those commands on this machine, and the judging of
what they printed. So the page cannot drift from the tool: a unit test holds the page and the
companion file to the same commands and the page's shown outputs to their patterns, and the
replay (root; ``testbed lab run 0`` and the integration test) holds the tool to them.

The page (README.md) shows commands in ```console blocks: ``$ CMD`` at the shell,
``testbed> CMD`` at the prompt ``testbed cli`` opens. A command's output follows it in its
block, or in the ```text block right after it (a placeholder saying TODO until pasted).

The companion file (walkthrough.checks.yaml) lists the same commands in the same order:

    steps:
      - shell: sudo .venv/bin/testbed up          # or prompt: pingall
        expect: ['fabric up: run \\S+, held by pid \\d+']   # each must match (re.M)
        absent: ['^\\*\\*\\* ']                    # none may match
        exit: 0                                   # shell steps: the exit status

Prompt steps run in one ``testbed cli`` session, the one the ``shell`` step before them
opens; that step's ``exit`` is the session's.
"""
from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

from pydantic import Field, model_validator

from testbed.errors import TestbedError
from testbed.harness.scenario import Strict
from testbed.lab.spec import load_model

SHELL, PROMPT = "$ ", "testbed> "
TODO = "TODO(lead)"
CLI_ARGS = ("testbed", "cli")
UP_ARGS, DOWN_ARGS = ("testbed", "up"), ("testbed", "down")
STEP_TIMEOUT_S = 120
UP_TIMEOUT_S = 900  # as testbed up's own wait for its holder
SESSION_TIMEOUT_S = 600
FENCE = re.compile(r"^```(\w*)\s*$")


class Step(Strict):
    """One command of the page and the shape of its output."""

    shell: str | None = None
    prompt: str | None = None
    expect: list[str] = []
    absent: list[str] = []
    exit: int | None = None

    @model_validator(mode="after")
    def _one_command(self):
        if (self.shell is None) == (self.prompt is None):
            raise ValueError("give shell (a command at the shell) or prompt (one at the "
                             "testbed> prompt)")
        if self.prompt is not None and self.exit is not None:
            raise ValueError("a prompt command has no exit status of its own: give the "
                             "session's on its `testbed cli` step")
        if not (self.expect or self.absent or self.exit is not None):
            raise ValueError("check something: expect, absent or exit")
        for pattern in [*self.expect, *self.absent]:
            try:
                re.compile(pattern)
            except re.error as exc:
                raise ValueError(f"pattern {pattern!r}: {exc}") from None
        return self

    @property
    def text(self) -> str:
        """The command as the page shows it."""
        return SHELL + self.shell if self.shell is not None else PROMPT + self.prompt


class Steps(Strict):
    steps: list[Step] = Field(min_length=1)


@dataclass(frozen=True)
class PageCommand:
    """A command on the page and the output shown beside it (None: none shown)."""

    text: str
    shown: str | None

    @property
    def placeholder(self) -> bool:
        return self.shown is not None and TODO in self.shown


@dataclass(frozen=True)
class StepRun:
    """What one replayed command printed (stdout and stderr together) and its exit status
    (None for a prompt command)."""

    text: str
    output: str
    exit: int | None = None


@dataclass(frozen=True)
class StepResult:
    text: str
    passed: bool
    problems: tuple[str, ...] = ()


# --- the page -------------------------------------------------------------------------------


def page_commands(markdown: str) -> list[PageCommand]:
    """Every ``$ `` and ``testbed> `` line of the page's console blocks, in order, with the
    output shown after it: the lines that follow it in its block, or a text block right
    after its block (only blank lines between) when the block ends with the command."""
    commands: list[list] = []  # [text, shown lines or None]
    kind = None  # the open block's info string; None outside blocks
    current = None  # the command whose output the open block's lines are
    waiting = None  # a command that ended its console block with nothing shown
    for line in markdown.splitlines():
        fence = FENCE.match(line.strip())
        if fence and kind is None:
            kind = fence.group(1) or "plain"
            current = None
            if kind == "text" and waiting is not None:
                current, waiting[1] = waiting, []
            waiting = None
            continue
        if fence:
            if kind == "console" and current is not None and current[1] is None:
                waiting = current
            kind, current = None, None
            continue
        if kind is None:
            if line.strip():
                waiting = None  # prose between: the next text block is not an output
        elif kind == "console" and line.startswith((SHELL, PROMPT)):
            current = [line.rstrip(), None]
            commands.append(current)
        elif kind in ("console", "text") and current is not None:
            current[1] = [*(current[1] or []), line]
    return [PageCommand(text, None if shown is None else "\n".join(shown))
            for text, shown in commands]


def load_steps(path: Path) -> list[Step]:
    """The companion file's steps; every problem reported with its field and line."""
    return load_model(Steps, path).steps


def output_problems(step: Step, output: str) -> list[str]:
    """What ``output`` lacks of ``step``'s expected shape, or shows that it must not."""
    problems = [f"no line matches {p!r}" for p in step.expect
                if not re.search(p, output, re.MULTILINE)]
    problems += [f"a line matches {p!r}, which must not appear" for p in step.absent
                 if re.search(p, output, re.MULTILINE)]
    return problems


def judge_steps(steps: list[Step], runs: list[StepRun]) -> list[StepResult]:
    """Each step against what its replay printed, in order (a page may show one command
    twice); a step the replay did not reach fails."""
    results = []
    for index, step in enumerate(steps):
        run = runs[index] if index < len(runs) else None
        if run is None or run.text != step.text:
            results.append(StepResult(step.text, False, ("not replayed",)))
            continue
        problems = output_problems(step, run.output)
        if step.exit is not None and run.exit != step.exit:
            problems.append(f"exit status {run.exit}, expected {step.exit}")
        results.append(StepResult(step.text, not problems, tuple(problems)))
    return results


# --- the replay (root: it brings a fabric up) ------------------------------------------------


def shell_argv(command: str) -> list[str]:
    """A page's shell command as an argument list run without a shell: ``sudo`` dropped (the
    replay runs as root), the testbed command run by this interpreter."""
    argv = shlex.split(command)
    if argv[:1] == ["sudo"]:
        argv = argv[1:]
    if argv and Path(argv[0]).name == "testbed":
        argv = [sys.executable, "-m", "testbed", *argv[1:]]
    return argv


def is_testbed(command: str, args: tuple[str, ...]) -> bool:
    argv = shlex.split(command)
    argv = argv[1:] if argv[:1] == ["sudo"] else argv
    return bool(argv) and Path(argv[0]).name == args[0] and tuple(argv[1:2]) == args[1:]


def split_session(transcript: str, prompts: list[str]) -> tuple[str, list[str]]:
    """A piped ``testbed cli`` session's output cut at its echoed prompt lines, in order:
    what came before the first, and the output of each of ``prompts`` ("" for one the
    session never reached)."""
    head: list[str] = []
    outputs: list[list[str]] = []
    for line in transcript.splitlines():
        if len(outputs) < len(prompts) and line == PROMPT + prompts[len(outputs)]:
            outputs.append([])
        else:
            (outputs[-1] if outputs else head).append(line)
    return "\n".join(head), (["\n".join(lines) for lines in outputs]
                             + [""] * (len(prompts) - len(outputs)))


def replay(steps: list[Step], cwd: Path, log=print) -> list[StepRun]:
    """Run the page's commands in order on this machine; a fabric the replay brought up is
    taken down however it ends."""
    runs: list[StepRun] = []
    up = False
    try:
        i = 0
        while i < len(steps):
            step = steps[i]
            if step.shell is None:
                raise TestbedError(f"{step.text}: a prompt command needs a `testbed cli` step "
                                   "before it")
            if is_testbed(step.shell, CLI_ARGS):
                prompts = []
                while i + 1 < len(steps) and steps[i + 1].prompt is not None:
                    i += 1
                    prompts.append(steps[i].prompt)
                log(f"{step.text} with {len(prompts)} commands")
                done = run_argv(shell_argv(step.shell), cwd, SESSION_TIMEOUT_S,
                                "".join(p + "\n" for p in prompts))
                head, outputs = split_session(done.stdout, prompts)
                runs.append(StepRun(step.text, head, done.returncode))
                runs += [StepRun(PROMPT + p, out) for p, out in zip(prompts, outputs)]
            else:
                log(step.text)
                timeout = UP_TIMEOUT_S if is_testbed(step.shell, UP_ARGS) else STEP_TIMEOUT_S
                done = run_argv(shell_argv(step.shell), cwd, timeout)
                runs.append(StepRun(step.text, done.stdout, done.returncode))
                if is_testbed(step.shell, UP_ARGS) and done.returncode == 0:
                    up = True
                elif is_testbed(step.shell, DOWN_ARGS) and done.returncode == 0:
                    up = False
            i += 1
    finally:
        if up:  # a step failed or was interrupted with the fabric up
            log("taking the walkthrough's fabric down")
            if run_argv(shell_argv("testbed down"), cwd, STEP_TIMEOUT_S).returncode != 0:
                run_argv(shell_argv("testbed clean"), cwd, STEP_TIMEOUT_S)
    return runs


def run_argv(argv: list[str], cwd: Path, timeout: float, stdin: str | None = None
             ) -> subprocess.CompletedProcess:
    """One command, stdout and stderr together as a terminal shows them."""
    try:
        return subprocess.run(argv, cwd=cwd, input=stdin, text=True, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, timeout=timeout)
    except subprocess.TimeoutExpired as exc:
        out = exc.stdout.decode(errors="replace") if isinstance(exc.stdout, bytes) else \
            exc.stdout or ""
        return subprocess.CompletedProcess(argv, -1, out + f"\n(timed out after {timeout} s)")


def save_runs(runs: list[StepRun], path: Path) -> None:
    path.write_text(json.dumps([asdict(r) for r in runs], indent=1))


def load_runs(path: Path) -> list[StepRun]:
    return [StepRun(**r) for r in json.loads(path.read_text())]


def transcript_markdown(runs: list[StepRun], results: list[StepResult]) -> str:
    """The replay as a page: every command, what it printed, and whether its shape held."""
    lines = ["# Walkthrough replay", ""]
    for run, verdict in zip(runs, results):
        mark = "PASS" if verdict.passed else "FAIL: " + "; ".join(verdict.problems)
        lines += [f"**{mark}**", "", "```console", run.text,
                  *run.output.rstrip("\n").splitlines(), "```", ""]
    return "\n".join(lines)
