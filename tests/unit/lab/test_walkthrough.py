"""Lab 00's page cannot drift from the tool: the page and its companion file list the same
commands in the same order, every output the page shows has the shape the companion file
asks of the replay, and the outputs the tool prints the same on every machine (the topology,
the prompt's help, nodes, pingall, links, status) are exactly what the code prints now. The
replay's pure parts and its order of commands are checked with the commands stubbed."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

import testbed.interactive.attach
import testbed.lab.walkthrough as walkthrough
from testbed.cli import main
from testbed.experiments.registry import load
from testbed.interactive.attach import link_lines, ping_report
from testbed.interactive.shell import help_lines
from testbed.lab.spec import find_lab
from testbed.lab.walkthrough import (
    PROMPT,
    TODO,
    Step,
    StepRun,
    judge_steps,
    load_steps,
    output_problems,
    page_commands,
    replay,
    shell_argv,
    split_session,
)

LAB = find_lab(0)
PAGE = (LAB.folder / "README.md").read_text()
STEPS = load_steps(LAB.folder / LAB.manifest.replay)
CUT = {"p0e0-eth3", "p0a0-eth1"}  # the ends of the cable the page cuts


def shown() -> dict[str, list[str]]:
    """Command -> every output the page shows for it (a command may appear twice)."""
    found: dict[str, list[str]] = {}
    for command in page_commands(PAGE):
        if command.shown is not None and not command.placeholder:
            found.setdefault(command.text, []).append(command.shown)
    return found


def fabric():
    return load("fattree-allreduce").setups[0].fabric


def test_the_page_and_the_companion_file_list_the_same_commands_in_order():
    on_page = [c.text for c in page_commands(PAGE)]
    assert on_page == [s.text for s in STEPS]
    assert len(on_page) >= 20
    for needed in ("$ sudo .venv/bin/testbed up", "testbed> pingall", "testbed> dump-groups p0e0",
                   "testbed> link down p0e0 p0a0", "testbed> iperf p0e0h0 p3e1h1 5",
                   "$ tshark -r /tmp/walkthrough.pcap", "$ sudo .venv/bin/testbed down"):
        assert needed in on_page


def test_every_output_the_page_shows_has_the_expected_shape():
    checked = 0
    for command, step in zip(page_commands(PAGE), STEPS):
        if command.shown is None or command.placeholder:
            continue
        assert output_problems(step, command.shown) == [], command.text
        checked += 1
    assert checked >= 8


def test_the_page_shows_every_output_it_asks_students_to_look_at():
    """Every command's output is on the page, pasted from a replay, none left to fill in;
    only what happens on the prompt itself shows no output."""
    assert [c.text for c in page_commands(PAGE) if c.placeholder] == []
    on_the_prompt = [c.text for c in page_commands(PAGE) if c.shown is None]
    assert on_the_prompt == ["$ sudo .venv/bin/testbed cli", "testbed> exit"]


def test_the_outputs_every_machine_prints_alike_are_what_the_tool_prints(capsys, monkeypatch,
                                                                         tmp_path):
    f = fabric()
    hosts, ips = [h.name for h in f.hosts], {h.name: h.ip for h in f.hosts}
    page = shown()
    assert main(["topo", "fattree", "k=4"]) == 0
    assert page["$ .venv/bin/testbed topo fattree k=4"] == [capsys.readouterr().out.rstrip("\n")]
    assert page[PROMPT + "help"] == ["\n".join(help_lines())]
    assert page[PROMPT + "nodes"] == [f"hosts: {' '.join(hosts)}\nswitches: "
                                      f"{' '.join(s.name for s in f.switches)}"]
    everyone = {h: set(ips.values()) - {ips[h]} for h in hosts}
    assert page[PROMPT + "pingall"] == ["\n".join(ping_report(hosts, ips, everyone)[0])]
    assert page[PROMPT + "links"] == ["\n".join(link_lines(
        f, lambda intf: "down" if intf in CUT else "up"))]
    monkeypatch.setattr(testbed.interactive.attach, "SESSION_PATH", tmp_path / "none.json")
    assert main(["status"]) == 1
    # the second status, after testbed down (the first shows the fabric up)
    assert page["$ .venv/bin/testbed status"][-1] == capsys.readouterr().out.rstrip("\n")


def test_page_commands_take_outputs_from_their_block_or_the_text_block_after():
    page = "\n".join([
        "```console", "$ one", "out 1", "testbed> two", "out 2", "```", "",
        "```text", "TODO(lead): paste the output of this command", "```",
        "prose", "```console", "$ three", "```", "words between", "```text", "not it",
        "```", "```console", "$ four", "```", "```text", "", "```"])
    commands = page_commands(page)
    assert [(c.text, c.shown) for c in commands] == [
        ("$ one", "out 1"), ("testbed> two", "out 2"), ("$ three", None), ("$ four", "")]
    page = "```console\n$ one\n```\n\n```text\nTODO(lead): paste the output of this command\n```"
    (command,) = page_commands(page)
    assert command.placeholder


def test_a_session_is_cut_at_its_echoed_prompts_even_when_one_repeats():
    transcript = "\n".join(["banner", "testbed> a", "1", "testbed> b", "2", "2b",
                            "testbed> a", "3"])
    assert split_session(transcript, ["a", "b", "a", "c"]) == ("banner", ["1", "2\n2b", "3", ""])


def test_judging_the_steps_by_order_exit_and_shape():
    steps = [Step(shell="testbed up", expect=["^up$"], exit=0), Step(prompt="x", absent=[r"\S"]),
             Step(shell="testbed status", exit=1)]
    runs = [StepRun("$ testbed up", "up", 0), StepRun("testbed> x", "oops")]
    results = judge_steps(steps, runs)
    assert [(r.passed, r.problems) for r in results] == [
        (True, ()), (False, (r"a line matches '\\S', which must not appear",)),
        (False, ("not replayed",))]
    runs = [StepRun("$ testbed up", "down", 3)]
    assert judge_steps(steps[:1], runs)[0].problems == ("no line matches '^up$'",
                                                        "exit status 3, expected 0")


def test_a_step_must_check_something_and_be_one_kind():
    with pytest.raises(ValueError, match="check something"):
        Step(shell="ls")
    with pytest.raises(ValueError, match="give shell"):
        Step(shell="ls", prompt="x", exit=0)
    with pytest.raises(ValueError, match="no exit status of its own"):
        Step(prompt="x", exit=0)
    with pytest.raises(ValueError, match="pattern"):
        Step(shell="ls", expect=["("])


def test_shell_commands_run_without_a_shell_and_without_sudo():
    assert shell_argv("sudo .venv/bin/testbed exec h -- ip -br addr") == [
        sys.executable, "-m", "testbed", "exec", "h", "--", "ip", "-br", "addr"]
    assert shell_argv("tshark -r '/tmp/a b.pcap'") == ["tshark", "-r", "/tmp/a b.pcap"]


class Stub:
    """run_argv stood in for: every call recorded, answers by the command."""

    def __init__(self, fail: str | None = None):
        self.calls: list[tuple[list[str], str | None]] = []
        self.fail = fail

    def __call__(self, argv, cwd, timeout, stdin=None):
        self.calls.append((argv, stdin))
        joined = " ".join(argv)
        if self.fail and self.fail in joined:
            return subprocess.CompletedProcess(argv, 1, "boom")
        if argv[-1] == "cli":
            return subprocess.CompletedProcess(argv, 0, "".join(
                f"{PROMPT}{line}\nout of {line}\n" for line in stdin.splitlines()))
        return subprocess.CompletedProcess(argv, 0, f"out of {joined}")


def test_the_replay_runs_the_page_in_order_one_session_for_the_prompt(monkeypatch):
    stub = Stub()
    monkeypatch.setattr(walkthrough, "run_argv", stub)
    runs = replay(STEPS, Path("."), log=lambda m: None)
    assert [r.text for r in runs] == [s.text for s in STEPS]
    sessions = [stdin for argv, stdin in stub.calls if argv[-1] == "cli"]
    assert sessions == ["".join(s.prompt + "\n" for s in STEPS if s.prompt is not None)]
    assert runs[[s.text for s in STEPS].index(PROMPT + "pingall")].output == "out of pingall"
    assert stub.calls[-1][0][-2:] == ["testbed", "status"]  # the page's last command
    assert not any(argv[-1] == "clean" for argv, _ in stub.calls)


def test_a_replay_that_fails_with_the_fabric_up_takes_it_down(monkeypatch):
    stub = Stub()
    monkeypatch.setattr(walkthrough, "run_argv", stub)

    def broken(argv, cwd, timeout, stdin=None):
        if argv[-1] == "cli":
            raise KeyboardInterrupt
        return stub(argv, cwd, timeout, stdin)

    monkeypatch.setattr(walkthrough, "run_argv", broken)
    with pytest.raises(KeyboardInterrupt):
        replay(STEPS, Path("."), log=lambda m: None)
    assert stub.calls[-1][0][-2:] == ["testbed", "down"]
    stub = Stub(fail="testbed down")
    monkeypatch.setattr(walkthrough, "run_argv", stub)
    replay(STEPS, Path("."), log=lambda m: None)  # the page's own down failed: clean
    assert [argv[-1] for argv, _ in stub.calls[-2:]] == ["down", "clean"]
