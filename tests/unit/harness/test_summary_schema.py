"""summary.json's schema (testbed.harness.summary_schema): the published file is the models'
schema now, what a run writes is built by the models (numbers with units beside each row's
text, plots with captions, the provenance's command line and versions), and reading refuses
a version this testbed does not know in one line. Runs here are the stand-in experiment's,
so nothing touches the machine."""
from __future__ import annotations

import importlib.metadata
import json
import sys

import pydantic
import pytest
from tests.unit.stand_ins import StandInExperiment, standins  # noqa: F401 (a fixture)
from tests.unit.summaries import run_summary

from testbed.capabilities import detect
from testbed.errors import ConfigError
from testbed.harness.experiment import Resolved
from testbed.harness.provenance import command_line, provenance, requirement_names
from testbed.harness.run import run_scenario
from testbed.harness.scenario import Scenario
from testbed.harness.summary_schema import (
    SCHEMA_PATH,
    SCHEMA_VERSION,
    json_schema,
    read_summary,
    row_record,
    validated,
    write_summary,
)
from testbed.model.rows import Number, Row


class Measured(StandInExperiment):
    """The stand-in experiment whose rows carry their numbers."""

    def rows(self, results):
        value = results["fabric"]["value"]
        return [Row("value", f"{value} ms", Number("value", value, "ms")), ("note", "plain")]


def run_of(tmp_path, experiment_class=Measured):
    scenario = Scenario(name="schema-run", experiment="standin", link_rate_mbit=6.0,
                        results_dir=str(tmp_path))
    platform = detect()
    experiment = experiment_class(scenario, experiment_class.Params(), platform)
    return run_scenario(Resolved(scenario, experiment, platform, experiment.setups(), None),
                        log=lambda m: None)


def test_the_published_schema_is_the_models_schema_now():
    """docs/summary.schema.json is what `testbed schema --summary --write` makes now."""
    assert json.loads(SCHEMA_PATH.read_text()) == json.loads(json.dumps(json_schema()))


def test_the_schema_names_its_version_and_both_kinds():
    schema = json_schema()
    assert schema["$id"].endswith(f":{SCHEMA_VERSION}") and SCHEMA_VERSION == 2
    kinds = {schema["$defs"][ref["$ref"].rsplit("/", 1)[1]]["properties"]["kind"]["const"]
             for ref in schema["oneOf"]}
    assert kinds == {"run", "repeat"}
    run = schema["$defs"]["RunSummary"]
    assert run["properties"]["schema_version"]["const"] == SCHEMA_VERSION
    assert run["additionalProperties"] is False
    number = schema["$defs"]["NumberRecord"]["properties"]
    assert set(number) == {"name", "value", "unit"}


def test_a_run_writes_what_the_schema_describes(tmp_path, standins):
    outcome = run_of(tmp_path)
    written = json.loads((outcome.workdir / "summary.json").read_text())
    run = json_schema()["$defs"]["RunSummary"]
    assert list(written) == list(run["properties"])  # every key, in the schema's order
    assert set(run["required"]) <= set(written)
    assert written["schema_version"] == SCHEMA_VERSION and written["kind"] == "run"
    assert written["rows"] == [
        {"what": "value", "text": "7 ms", "numbers": [{"name": "value", "value": 7,
                                                      "unit": "ms"}]},
        {"what": "note", "text": "plain", "numbers": []}]
    assert read_summary(outcome.workdir) == written


def test_every_run_has_a_topology_figure_with_a_caption(tmp_path, standins):
    outcome = run_of(tmp_path)
    (plot,) = outcome.summary["plots"]
    assert plot["path"] == "plots/topology.png" and (outcome.workdir / plot["path"]).exists()
    assert plot["caption"].startswith("The fabric as built")


def test_the_provenance_names_the_command_and_every_version(monkeypatch):
    monkeypatch.setattr(sys, "argv", ["/opt/venv/bin/testbed", "run", "dctcp", "--repeat", "5"])
    prov = provenance(detect())
    assert prov["command_line"] == ["testbed", "run", "dctcp", "--repeat", "5"]
    assert prov["python_packages"]["pydantic"] == pydantic.VERSION
    assert set(prov["python_packages"]) >= {"os-ken", "scapy", "networkx", "numpy",
                                            "matplotlib", "PyYAML", "rich", "pytest"}
    assert prov["mininet_version"] == importlib.metadata.version("mininet")
    assert prov["uname"].split()[1] == prov["kernel"]
    assert command_line([]) == []


def test_requirement_names_read_pins_with_markers_and_extras():
    assert requirement_names(['numpy==2.2.6; python_version < "3.11"',
                              'numpy==2.4.6; python_version == "3.11"',
                              'pytest==9.2.0; extra == "test"', "os-ken==4.2.2"]) == [
        "numpy", "pytest", "os-ken"]


def test_a_row_record_keeps_the_numbers_beside_the_text():
    assert row_record(Row("busbw", "5.9 Mbit/s", Number("busbw", 5.9, "Mbit/s"))) == {
        "what": "busbw", "text": "5.9 Mbit/s",
        "numbers": [{"name": "busbw", "value": 5.9, "unit": "Mbit/s"}]}
    assert row_record(("plain", "text")) == {"what": "plain", "text": "text", "numbers": []}
    row = Row("a", "b", Number("n", 1, ""))
    assert row == ("a", "b") and dict([row]) == {"a": "b"}  # still the pair


def test_a_summary_off_the_schema_is_not_written(tmp_path):
    with pytest.raises(pydantic.ValidationError):
        write_summary(tmp_path, {**run_summary(), "status": "half-done"})
    with pytest.raises(pydantic.ValidationError):
        validated({**run_summary(), "unknown_key": 1})
    assert not (tmp_path / "summary.json").exists()


@pytest.mark.parametrize(("version", "words"), [
    (99, "schema version 99; this testbed reads versions 1, 2"),
    (None, "schema version None; this testbed reads versions 1, 2"),
])
def test_a_summary_of_an_unknown_version_is_refused_in_one_line(tmp_path, version, words):
    (tmp_path / "summary.json").write_text(json.dumps({**run_summary(),
                                                       "schema_version": version}))
    with pytest.raises(ConfigError) as info:
        read_summary(tmp_path)
    assert words in str(info.value) and "\n" not in str(info.value)


def test_a_summary_that_does_not_match_its_version_is_refused_naming_the_key(tmp_path):
    (tmp_path / "summary.json").write_text(json.dumps({**run_summary(), "status": "odd"}))
    with pytest.raises(ConfigError, match=r"does not match schema version 2: status"):
        read_summary(tmp_path)
