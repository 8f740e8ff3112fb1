"""What the ``testbed`` command says about itself: ``testbed --help`` with its commands in
groups (fabric, experiments, lab, tools), the ones that need root marked, each line wrapped
whole, never cut; and ``testbed list``: the bundled scenarios, the topology families with
their parameters, and the experiments, one line each. Nothing here runs anything."""
from __future__ import annotations

import argparse
import inspect
import shutil
import textwrap

from testbed.experiments.pages import claim
from testbed.experiments.registry import EXPERIMENTS, experiment_classes
from testbed.harness.scenario import SCENARIO_DIR
from testbed.model.topology import BUILDERS

# The groups of ``testbed --help``, in order; every command is in exactly one
# (tests/unit/test_cli_help.py checks). "experiments" holds every registered experiment.
EXPERIMENTS_GROUP = "experiments"
COMMAND_GROUPS: dict[str, tuple[str, ...]] = {
    "fabric": ("run", "up", "status", "exec", "cli", "down", "clean"),
    EXPERIMENTS_GROUP: (),
    "lab": ("lab",),  # the teaching exercises: its own subcommands say which need root
    "tools": ("list", "report", "schema", "topo", "doctor", "bench", "calibrate", "chaos"),
}
GROUP_TITLES = {
    "fabric": "fabric: run a scenario, or keep a fabric up and work on it",
    EXPERIMENTS_GROUP: "experiments: one each, its parameters as flags (same as `testbed run` "
                       "with its scenario)",
    "lab": "lab: the teaching exercises (labs/); `lab run` needs root",
    "tools": "tools: inspect, describe, compare, measure the machine, break runs on purpose",
}
# Commands that build a network, change the machine or read what only root may.
NEEDS_ROOT = frozenset({"run", "up", "exec", "cli", "down", "clean", "bench", "calibrate",
                        "chaos"})
ROOT_MARK = "*"
MIN_WIDTH = 60


def help_width() -> int:
    """The width argparse formats help to (the terminal's, less its margin)."""
    return max(MIN_WIDTH, shutil.get_terminal_size().columns - 2)


class WholeWords(argparse.HelpFormatter):
    """argparse's help with lines broken between words only: never inside a word, nor at a
    name's hyphen (``fattree-allreduce``)."""

    def _split_lines(self, text, width):
        return wrap(self._whitespace_matcher.sub(" ", text).strip(), width)

    def _fill_text(self, text, width, indent):
        return "\n".join(wrap(self._whitespace_matcher.sub(" ", text).strip(), width, indent))


class PreparedDescription(WholeWords):
    """The description and epilog printed as they are (``arrange_help`` wrapped them)."""

    def _fill_text(self, text, width, indent):
        return "".join(indent + line for line in text.splitlines(keepends=True))


def needs_root(name: str, experiments) -> bool:
    return name in NEEDS_ROOT or name in experiments


def command_group(name: str, experiments) -> str | None:
    """The group a command is listed in; None for one in no group."""
    if name in experiments:
        return EXPERIMENTS_GROUP
    return next((group for group, names in COMMAND_GROUPS.items() if name in names), None)


def wrap(text: str, width: int, indent: str = "") -> list[str]:
    """``text`` in lines of at most ``width`` characters, broken between words only."""
    return textwrap.wrap(text, width, initial_indent=indent, subsequent_indent=indent,
                         break_long_words=False, break_on_hyphens=False)


def command_label(name: str, root: bool) -> str:
    return f"  {name}{' ' + ROOT_MARK if root else ''}"


def grouped_commands(helps: dict[str, str], experiments, width: int) -> str:
    """The commands by group (in the group's order; experiments by name), empty groups left
    out, each command's help wrapped beside its name."""
    column = max(len(command_label(n, True)) for n in helps) + 2
    blocks = []
    for group, title in GROUP_TITLES.items():
        names = [n for n in helps if command_group(n, experiments) == group]
        order = COMMAND_GROUPS[group]
        names.sort(key=lambda n: (order.index(n) if n in order else len(order), n))
        if not names:
            continue
        lines = wrap(title, width)
        for name in names:
            label = command_label(name, needs_root(name, experiments)).ljust(column)
            text = wrap(helps[name], width, " " * column) or [""]
            lines += [label + text[0][column:], *text[1:]]
        blocks.append("\n".join(lines))
    return "\n\n".join(blocks)


def subcommand_helps(subparsers: argparse._SubParsersAction) -> dict[str, str]:
    """Each subcommand's one-line help, in the order they were added."""
    # argparse keeps a subcommand's help only on the pseudo-action it lists it with
    # argparse expands %-escapes in help; these lines are printed as they are
    return {action.dest: (action.help or "").replace("%%", "%")
            for action in subparsers._choices_actions}


def arrange_help(parser: argparse.ArgumentParser,
                 subparsers: argparse._SubParsersAction) -> None:
    """``testbed --help`` with the commands in groups and those needing root marked, in
    place of argparse's flat list; a root command's own --help says it needs root."""
    helps = subcommand_helps(subparsers)
    for name, sub in subparsers.choices.items():
        sub.formatter_class = WholeWords
        sub.description = sub.description or helps[name]
        if needs_root(name, EXPERIMENTS):
            sub.epilog = " ".join(filter(None, [sub.epilog, "Needs root (sudo)."]))
    width = help_width()
    intro = wrap(f"{parser.description}. Commands marked {ROOT_MARK} need root (sudo); "
                 "`testbed COMMAND --help` describes one, `testbed list` shows the bundled "
                 "scenarios, topologies and experiments.", width)
    parser.description = "\n".join(intro) + "\n\n" + grouped_commands(helps, EXPERIMENTS,
                                                                       width)
    # the description and epilog are printed as they are: wrapped here
    parser.epilog = "\n".join(wrap(parser.epilog or "", width))
    parser.formatter_class = PreparedDescription
    parser.usage = f"{parser.prog} [-h] [--version] COMMAND ..."
    subparsers.help = argparse.SUPPRESS  # listed in the description instead


# --- testbed list --------------------------------------------------------------------------------


def scenario_lines() -> list[tuple[str, str]]:
    """Each bundled scenario: its name, and its experiment with the first clause of its
    leading comment."""
    import yaml

    out = []
    for path in sorted(SCENARIO_DIR.glob("*.yaml")):
        text = path.read_text()
        comment = ""
        for line in text.splitlines():
            if not line.startswith("#"):
                break
            comment += " " + line.lstrip("#").strip()
        experiment = (yaml.safe_load(text) or {}).get("experiment", "?")
        first = comment.strip().split(". ")[0].split(": ")[0].rstrip(".")
        out.append((path.stem, f"[{experiment}] {first}" if first else f"[{experiment}]"))
    return out


def family_lines() -> list[tuple[str, str]]:
    """Each topology family with its parameters and their defaults."""
    out = []
    for name, builder in BUILDERS.items():
        params = []
        for p in inspect.signature(builder).parameters.values():
            if p.kind is p.VAR_KEYWORD:
                params.append("(the base family's parameters)")
            elif p.default is p.empty:
                params.append(p.name)
            else:
                params.append(f"{p.name}={'auto' if p.default is None else p.default}")
        out.append((name, " ".join(params)))
    return out


def experiment_lines() -> list[tuple[str, str]]:
    """Each experiment: its name and what it shows (its README's title line)."""
    return [(name, claim(name)) for name in sorted(experiment_classes())]


def listing() -> str:
    """``testbed list``: scenarios, topology families and experiments, one line each."""
    sections = [("scenarios (testbed run NAME; files in testbed/scenarios/)", scenario_lines()),
                ("topology families (testbed topo NAME key=value ...; a scenario's topology: "
                 "{name: NAME, key: value})", family_lines()),
                ("experiments (testbed NAME --help; a scenario's experiment:)",
                 experiment_lines())]
    blocks = []
    for title, lines in sections:
        width = max(len(name) for name, _ in lines) + 2
        blocks.append("\n".join([title, *(f"  {name.ljust(width)}{text}"
                                          for name, text in lines)]))
    return "\n\n".join(blocks)
