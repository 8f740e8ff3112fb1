"""One source of truth per experiment: every way to start an experiment (its make target,
``testbed EXPERIMENT``, ``testbed run SCENARIO``, the API's ``fab.run``) resolves to the
parameters of the experiment's defaults scenario (Experiment.defaults_path), and what a
scenario's comment says another entry point runs is what that entry point runs. Each command
is resolved as the CLI resolves it, with the run replaced: nothing here builds a network."""
from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

import testbed.cli
from testbed.cli import main
from testbed.experiments.registry import experiment_classes, load, validate
from testbed.harness.scenario import SCENARIO_DIR
from testbed.interactive.live import run_data

REPO = Path(__file__).resolve().parents[2]
MAKEFILE = REPO / "Makefile"
TESTBED_COMMAND = "$(TESTBED)"
EXPERIMENTS = sorted(experiment_classes())


@pytest.fixture
def resolve_command(monkeypatch):
    """Resolve a ``testbed`` command line as main does and return what it would run (a
    testbed.harness.experiment.Resolved), running nothing."""
    resolved = []

    def record(what, args):
        resolved.append(what)
        return 0

    monkeypatch.setattr(testbed.cli, "execute", record)

    def resolve(argv: list[str]):
        assert main(argv) == 0, argv
        return resolved.pop()

    return resolve


def parameters(resolved) -> dict:
    """Everything a run is made of, but its name: the scenario's fields, the experiment's
    validated params and the fabrics it brings up."""
    return {"scenario": resolved.scenario.model_dump(mode="json", exclude={"name"}),
            "params": resolved.experiment.params.model_dump(mode="json"),
            "setups": [setup.describe() for setup in resolved.setups]}


def make_recipes() -> dict[str, list[str]]:
    """Make target -> the arguments its recipe gives ``$(TESTBED)`` (targets that run it)."""
    recipes, target = {}, None
    for line in MAKEFILE.read_text().splitlines():
        header = re.match(r"^([a-z][a-z-]*):", line)
        if header:
            target = header.group(1)
        elif line.startswith("\t") and TESTBED_COMMAND in line and target is not None:
            words = shlex.split(line.split(TESTBED_COMMAND, 1)[1])
            recipes[target] = [word for word in words if word != "$(ARGS)"]
    return recipes


def scenario_of_recipe(words: list[str]) -> Path | None:
    """The bundled scenario a ``testbed run scenarios/X.yaml`` recipe runs, else None."""
    if words[:1] != ["run"] or len(words) < 2:
        return None
    return SCENARIO_DIR / Path(words[1]).name


def test_the_makefile_is_read():
    # The parser above must see the recipes, or every test below would pass vacuously.
    recipes = make_recipes()
    assert recipes["run-fattree"] == ["run", "scenarios/fattree-allreduce.yaml"]
    assert {"incast", "dctcp", "pfc-demo"} <= set(recipes)


@pytest.mark.parametrize("name", EXPERIMENTS)
def test_every_experiment_has_a_bundled_defaults_scenario_that_runs_it(name):
    cls = experiment_classes()[name]
    path = cls.defaults_path()
    assert path is not None, f"{name}: no testbed/scenarios/{name}.yaml and no defaults_scenario"
    assert path.parent == SCENARIO_DIR
    assert cls.defaults()["experiment"] == name


@pytest.mark.parametrize("name", EXPERIMENTS)
def test_testbed_experiment_runs_its_defaults_scenario(name, resolve_command):
    stem = experiment_classes()[name].defaults_path().stem
    assert parameters(resolve_command([name])) == parameters(resolve_command(["run", stem]))


@pytest.mark.parametrize("flags, run_flags", [
    (["incast", "--fanin", "3", "--mode", "ecn", "--rate-mbit", "5", "--seed", "7"],
     ["run", "incast", "--rate-mbit", "5", "--seed", "7", "--set", "params.fanins=[3]",
      "--set", "params.modes=[ecn]"]),
    (["dctcp", "--senders", "2", "--omit", "3"],
     ["run", "dctcp", "--set", "params.senders=[2]", "--set", "params.omit_s=3"]),
    (["allreduce", "--size-bytes", "65536", "--mtu", "1500"],
     ["run", "fattree-allreduce", "--size-bytes", "65536", "--mtu", "1500"]),
])
def test_an_experiments_flags_change_only_what_they_name(flags, run_flags, resolve_command):
    assert parameters(resolve_command(flags)) == parameters(resolve_command(run_flags))
    assert parameters(resolve_command(flags)) != parameters(resolve_command([flags[0]]))


def test_no_make_target_runs_an_experiment_command():
    # Make targets run bundled scenarios, so a target and its scenario cannot drift apart.
    commands = {target: words[0] for target, words in make_recipes().items()}
    assert not {target: word for target, word in commands.items() if word in EXPERIMENTS}


@pytest.mark.parametrize("target, words", sorted(
    (target, words) for target, words in make_recipes().items() if words[0] == "run"))
def test_every_make_run_target_runs_a_bundled_scenario(target, words, resolve_command):
    path = scenario_of_recipe(words)
    assert path is not None and path.is_file(), (target, words)
    assert (REPO / words[1]).resolve() == path.resolve()  # scenarios/ is the bundled folder
    resolved = resolve_command(words)
    assert parameters(resolved) == parameters(resolve_command(["run", str(path)]))
    cls = experiment_classes()[resolved.scenario.experiment]
    if cls.defaults_path() == path:  # the experiment's own target: its command runs the same
        assert parameters(resolved) == parameters(resolve_command([cls.name]))


SCENARIO_CLAIM = re.compile(r"what `(?P<command>[^`]+)` runs")


def scenario_claims() -> list[tuple[str, str]]:
    """(scenario file, command) for every ``what `COMMAND` runs`` in a bundled scenario."""
    return [(path.name, match["command"]) for path in sorted(SCENARIO_DIR.glob("*.yaml"))
            for match in SCENARIO_CLAIM.finditer(path.read_text())]


def test_scenarios_claims_are_found():
    assert ("incast.yaml", "make incast") in scenario_claims()


@pytest.mark.parametrize("file_name, command", scenario_claims())
def test_what_a_scenario_says_another_entry_point_runs_holds(file_name, command):
    tool, _, name = command.partition(" ")
    if tool == "make":
        assert scenario_of_recipe(make_recipes()[name]) == SCENARIO_DIR / file_name
    elif tool == "testbed":
        assert experiment_classes()[name].defaults_path() == SCENARIO_DIR / file_name
    else:
        pytest.fail(f"{file_name} claims what {command!r} runs, which no test here checks")


@pytest.mark.parametrize("name", EXPERIMENTS)
def test_fab_run_on_the_experiments_own_fabric_runs_its_defaults(name, resolve_command):
    # fab.run(name) on a fabric brought up from the experiment's defaults scenario.
    path = experiment_classes()[name].defaults_path()
    fabric_scenario = load(path).scenario
    api = validate(run_data(fabric_scenario, name), "fab.run")
    assert parameters(api) == parameters(resolve_command(["run", str(path)]))


def test_fab_run_takes_the_experiments_defaults_and_the_given_params(resolve_command):
    fabric_scenario = load(SCENARIO_DIR / "fattree-allreduce.yaml").scenario
    data = run_data(fabric_scenario, "incast", {"fanins": [3]})
    incast = resolve_command(["incast", "--fanin", "3"])
    assert data["params"] == {**incast.scenario.params, "fanins": [3]}
    assert data["topology"] == fabric_scenario.model_dump(mode="json")["topology"]


def test_fab_run_of_an_unknown_experiment_is_left_to_validation():
    fabric_scenario = load(SCENARIO_DIR / "fattree-allreduce.yaml").scenario
    assert run_data(fabric_scenario, "no-such", None)["params"] == {}
