"""What ``testbed`` says about itself: every subcommand's --help walked at several terminal
widths (no help line cut inside a word, every flag and argument described), the grouped
``testbed --help`` with root commands marked, and ``testbed list``. Nothing here runs."""
from __future__ import annotations

import argparse
import re

import pytest

from testbed.cli import build_parser, main
from testbed.cli_help import COMMAND_GROUPS, NEEDS_ROOT, ROOT_MARK, command_group
from testbed.experiments.registry import EXPERIMENTS
from testbed.harness.scenario import SCENARIO_DIR
from testbed.model.topology import BUILDERS

WIDTHS = (60, 80, 150)  # terminal columns the help is formatted for
ONLY_A_DEFAULT = re.compile(r"\(default [^)]*\)")


def flat(text: str) -> str:
    """Text with every run of whitespace (line breaks and indents) as one space."""
    return " ".join(text.split())


def subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    (action,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return dict(action.choices)


def pages(columns: int, monkeypatch) -> dict[str, tuple[argparse.ArgumentParser, str]]:
    """Every --help page (the top one as "testbed") at ``columns`` columns."""
    monkeypatch.setenv("COLUMNS", str(columns))
    top = build_parser()
    parsers = {"testbed": top, **{f"testbed {name}": sub
                                  for name, sub in subcommands(top).items()}}
    return {prog: (parser, parser.format_help()) for prog, parser in parsers.items()}


def described_actions(parser: argparse.ArgumentParser):
    """(flag or argument name, its help as printed) of every action the page lists."""
    formatter = parser._get_formatter()
    for action in parser._actions:
        if action.help is argparse.SUPPRESS or isinstance(action, argparse._SubParsersAction):
            continue
        name = "/".join(action.option_strings) or action.metavar or action.dest
        yield name, (formatter._expand_help(action) if action.help else "")


@pytest.mark.parametrize("columns", WIDTHS)
def test_every_help_line_is_whole_and_every_flag_described(columns, monkeypatch):
    problems = []
    for prog, (parser, text) in pages(columns, monkeypatch).items():
        printed = flat(text)
        if not parser.description:
            problems.append(f"{prog}: no description")
        elif flat(parser.description) not in printed:
            problems.append(f"{prog}: description cut: {parser.description!r}")
        for name, help_text in described_actions(parser):
            words = ONLY_A_DEFAULT.sub("", help_text).split()
            if len(words) < 2:
                problems.append(f"{prog} {name}: no description ({help_text!r})")
            elif flat(help_text) not in printed:
                problems.append(f"{prog} {name}: help cut: {help_text!r}")
        # argparse lays out the usage and each flag's spellings itself (never inside a word)
        after_usage = text.split("\n\n", 1)[1]
        too_wide = [line for line in after_usage.splitlines()
                    if len(line) > columns and " " in line.strip()
                    and not line.lstrip().startswith("-")]
        problems += [f"{prog}: line wider than {columns}: {line!r}" for line in too_wide]
    assert problems == []


def test_a_cut_or_an_undescribed_flag_is_caught(monkeypatch):
    """The walk above fails on what it is for: a flag whose help is only its default, and a
    help line broken inside a hyphenated name."""
    parser = argparse.ArgumentParser(prog="x", description="d")
    parser.add_argument("--k", help="(default 4)")
    parser.add_argument("--scenario", help="default fattree-allreduce " * 6)
    ((k, k_help), (s, s_help)) = list(described_actions(parser))[1:]
    assert len(ONLY_A_DEFAULT.sub("", k_help).split()) < 2
    monkeypatch.setenv("COLUMNS", "40")
    assert flat(s_help) not in flat(parser.format_help())  # argparse's own wrap breaks it


def test_the_top_help_groups_every_command_and_marks_root(monkeypatch):
    (_, text) = pages(100, monkeypatch)["testbed"]
    top = build_parser()
    for name in subcommands(top):
        group = command_group(name, EXPERIMENTS)
        assert group is not None, f"{name} is in no group of testbed --help"
        assert sum(name in names for names in COMMAND_GROUPS.values()) + (
            name in EXPERIMENTS) == 1, name
        root = name in NEEDS_ROOT or name in EXPERIMENTS
        marked = re.search(rf"^  {re.escape(name)}( {re.escape(ROOT_MARK)})?  ", text,
                           re.MULTILINE)
        assert marked, f"{name} is not listed"
        assert bool(marked.group(1)) == root, name
    groups = [line.split(":")[0] for line in text.splitlines()
              if line.split(":")[0] in COMMAND_GROUPS]
    assert groups == ["fabric", "experiments", "lab", "tools"]
    assert "{" not in text.splitlines()[0]  # no flat {run,allreduce,...} list


def test_run_and_topo_help_point_to_testbed_list(monkeypatch):
    every = pages(100, monkeypatch)
    for prog in ("testbed run", "testbed topo", "testbed up"):
        assert "`testbed list`" in every[prog][1], prog


def test_experiment_help_pages_say_what_they_reproduce(monkeypatch):
    from testbed.experiments.pages import claim
    from testbed.experiments.registry import experiment_classes

    every = pages(100, monkeypatch)
    for name in experiment_classes():
        assert flat(claim(name)) in flat(every[f"testbed {name}"][1]), name
        assert "Needs root" in every[f"testbed {name}"][1]


def test_list_prints_scenarios_families_and_experiments_one_line_each(capsys):
    assert main(["list"]) == 0
    blocks = capsys.readouterr().out.split("\n\n")
    assert len(blocks) == 3
    scenarios, families, experiments = (
        {line.split()[0]: line for line in block.splitlines()[1:]} for block in blocks)
    assert sorted(scenarios) == sorted(p.stem for p in SCENARIO_DIR.glob("*.yaml"))
    assert list(families) == list(BUILDERS)
    assert sorted(experiments) == sorted(EXPERIMENTS)
    assert families["fattree"].split()[1:3] == ["k=4", "host_rate_mbit=100.0"]
    assert "[allreduce] Ring AllReduce" in scenarios["fattree-allreduce"]
