"""A new experiment is one folder and one registry line: a throwaway experiment written into a
temporary tree, and registered by its one line in testbed.experiments.registry.EXPERIMENTS,
is listed by `testbed list` and in the docs index (its README's title), gets its docs page
(its README), gets `testbed NAME`
with its parameters as flags, and has its params in the scenario schema, with no other edit.
Staged under testbed/experiments/ in the installed layout, the same folder is under the
experiments' import contract with no edit of setup.cfg: kept while it imports no other
experiment, broken when it imports one or when a shared folder or a tool imports it."""
from __future__ import annotations

import textwrap

import pytest

from testbed.cli import build_parser
from testbed.cli_help import listing
from testbed.experiments import registry
from testbed.experiments.pages import experiment_index, experiment_pages
from tests.unit.test_layers import lint_imports

NAME = "ping-throwaway"
PACKAGE = "throwaway_experiments"
CLAIM = "an idle fabric's round-trip time stays under max_rtt_ms"
INIT = '"""ping: an idle fabric\'s round-trip time."""'
EXPERIMENT = '''
from pydantic import Field
from testbed.harness.experiment import Experiment, Params


class PingParams(Params):
    count: int = Field(20, ge=1, le=10_000, description="echo requests sent")
    max_rtt_ms: float = Field(5.0, gt=0, description="largest average RTT that passes, ms")


class Ping(Experiment):
    name, title, Params = "ping-throwaway", "ping an idle fabric", PingParams

    def setups(self):
        return [self.scenario_setup()]
'''


@pytest.fixture
def throwaway(tmp_path, monkeypatch):
    """The experiment's folder in a temporary tree, importable, and its registry line."""
    folder = tmp_path / PACKAGE / "ping"
    folder.mkdir(parents=True)
    (tmp_path / PACKAGE / "__init__.py").write_text("")
    (folder / "__init__.py").write_text(f"{INIT}\n")
    (folder / "experiment.py").write_text(textwrap.dedent(EXPERIMENT))
    (folder / "README.md").write_text(f"# {NAME}: {CLAIM}\n\nHow to run it, what it checks.\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setitem(registry.EXPERIMENTS, NAME, f"{PACKAGE}.ping.experiment:Ping")
    return NAME


def test_testbed_list_names_the_new_experiment(throwaway):
    lines = listing().splitlines()
    assert any(line.split()[:1] == [throwaway] and CLAIM in line
               for line in lines)


def test_the_docs_index_and_page_come_from_the_new_experiment_s_readme(throwaway, tmp_path):
    rows = [line for line in experiment_index().splitlines() if f"| `{throwaway}` |" in line]
    assert len(rows) == 1 and CLAIM in rows[0] and f"({throwaway}.md)" in rows[0]
    docs = tmp_path / "docs"
    docs.mkdir()
    page = experiment_pages(docs)[docs / f"{throwaway}.md"]
    assert f"# {throwaway}: {CLAIM}" in page


def test_the_new_experiment_is_a_command_with_its_params_as_flags(throwaway):
    args = build_parser().parse_args([throwaway, "--count", "7", "--max-rtt-ms", "2.5"])
    assert (args.count, args.max_rtt_ms) == (7, 2.5)
    with pytest.raises(SystemExit):  # its bounds come with it
        build_parser().parse_args([throwaway, "--count", "many"])


def test_the_scenario_schema_has_the_new_experiment_s_params(throwaway):
    schema = registry.json_schema()
    assert throwaway in schema["properties"]["experiment"]["enum"]
    branch = next(b for b in schema["allOf"]
                  if b["if"]["properties"]["experiment"]["const"] == throwaway)
    ref = branch["then"]["properties"]["params"]["$ref"].split("/")[-1]
    params = schema["$defs"][ref]["properties"]
    assert set(params) == {"count", "max_rtt_ms"} and params["count"]["maximum"] == 10_000


def test_a_scenario_naming_the_new_experiment_validates_its_params(throwaway):
    with pytest.raises(Exception, match="params.count"):
        registry.validate({"experiment": throwaway, "params": {"count": 0}})


def staged_throwaway(imports: str = "") -> dict[str, str]:
    """The throwaway experiment's folder as lint_imports stages it, inside testbed/experiments
    (its experiment.py ending with ``imports``)."""
    folder = "testbed/experiments/ping"
    return {f"{folder}/__init__.py": INIT,
            f"{folder}/experiment.py": textwrap.dedent(EXPERIMENT) + imports}


def lint(added: dict[str, str]) -> tuple[int, str]:
    """lint-imports' exit status and its report, its line wrapping undone."""
    done = lint_imports().run(capture=True, added=added)
    return done.returncode, " ".join((done.stdout + done.stderr).split())


def test_the_new_experiment_folder_keeps_the_contracts_with_no_setup_cfg_edit():
    status, report = lint(staged_throwaway())
    assert status == 0 and " kept, 0 broken." in report, report


def test_the_new_experiment_importing_another_breaks_the_experiments_contract():
    status, report = lint(staged_throwaway("from testbed.experiments.incast import checks\n"))
    assert status == 1, report
    assert "testbed.experiments.ping is not allowed to import testbed.experiments.incast" in report


@pytest.mark.parametrize("importer, owner", [
    ("testbed/experiments/incast/checks.py", "testbed.experiments.incast"),  # an experiment
    ("testbed/experiments/roce_common/roce_setups.py", "testbed.experiments.roce_common"),
    ("testbed/chaos/__init__.py", "testbed.chaos"),  # the tools
    ("testbed/capacity/__init__.py", "testbed.capacity"),
])
def test_importing_the_new_experiment_breaks_the_experiments_contract(importer, owner):
    status, report = lint({**staged_throwaway(),
                           importer: "import testbed.experiments.ping.experiment"})
    assert status == 1, report
    assert f"{owner} is not allowed to import testbed.experiments.ping" in report


def test_a_folder_without_experiment_py_under_experiments_breaks_the_contract():
    status, report = lint({"testbed/experiments/helpers/__init__.py": '"""named nowhere"""'})
    assert status == 1, report
    assert "testbed.experiments.helpers is not an experiment" in report
