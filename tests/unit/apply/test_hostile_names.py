"""Names and paths that could run something in a host's shell (quotes, ``;``, ``$(...)``,
backquotes, newlines) are refused when a scenario is validated, or reach the shell quoted:
a host's set-up line is run here by a real bash, as Mininet's host shell would read it."""
from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from testbed.experiments.registry import validate
from testbed.harness.scenario import ScenarioError
from testbed.plan.bring_up import setup_command

HOSTILE = ["a'b", 'a"b', "a;touch PWNED", "$(touch PWNED)", "`touch PWNED`", "a|touch PWNED",
           "a&&touch PWNED", "a>PWNED", "a b", "-rf", "a\nb", "a\\b", "*", "~root", "a\x00b"]
CONTROL = {"a\nb", "a\x00b"}  # refused even where a path may hold anything else


def problems_of(data: dict) -> list[str]:
    with pytest.raises(ScenarioError) as info:
        validate({"name": "hostile", **data})
    assert "\n" not in "".join(str(p) for p in info.value.problems)
    return [str(p) for p in info.value.problems]


@pytest.mark.parametrize("name", HOSTILE)
def test_a_hostile_scenario_name_is_refused(name):
    with pytest.raises(ScenarioError) as info:
        validate({"name": name})
    assert str(info.value).startswith("scenario: name: must be ASCII letters")
    assert "\n" not in str(info.value)


@pytest.mark.parametrize("name", HOSTILE)
def test_a_hostile_host_name_is_refused(name):
    nodes = [{"name": name, "role": "host"}, {"name": "h2", "role": "host"},
             {"name": "s1"}]
    found = problems_of({"topology": {"name": "explicit", "nodes": nodes,
                                      "links": [[name, "s1"], ["h2", "s1"]]}})
    assert any(p.startswith("topology.nodes.0.name:") for p in found), found


@pytest.mark.parametrize("name", HOSTILE)
def test_a_hostile_node_in_failures_impairments_and_anycast_is_refused(name):
    found = problems_of({
        "failures": [{"at_s": 1, "action": "link_down", "link": [name, "p0e0"]},
                     {"at_s": 2, "action": "switch_down", "switch": name}],
        "impairments": [{"link": ["p0e0", name], "loss_percent": 1}],
        "anycast": {"service_ip": "10.9.9.9", "replicas": [name]}})
    for field in ("failures.0.link.0", "failures.1.switch", "impairments.0.link",
                  "anycast.replicas.0"):
        assert any(p.startswith(field) for p in found), (field, found)


@pytest.mark.parametrize("name", HOSTILE)
def test_a_hostile_host_parameter_of_an_experiment_is_refused(name):
    found = problems_of({"experiment": "incast", "params": {"receiver": name}})
    assert any(p.startswith("params.receiver") for p in found), found


@pytest.mark.parametrize("name", HOSTILE)
def test_a_hostile_topology_name_is_refused(name):
    found = problems_of({"topology": {"name": name}})
    assert any(p.startswith("topology.name: unknown family") for p in found), found


@pytest.mark.parametrize("name", sorted(CONTROL))
def test_a_results_path_with_control_characters_is_refused(name):
    found = problems_of({"results_dir": f"results/{name}"})
    assert any(p.startswith("results_dir: must be a folder path without control")
               for p in found), found


@pytest.mark.parametrize("name", sorted(set(HOSTILE) - CONTROL))
def test_a_hostile_results_path_reaches_the_host_shell_quoted(tmp_path, name):
    """The path is accepted (it is the user's folder) and the host's shell runs exactly the
    script at that path: nothing in its name is read as shell syntax."""
    resolved = validate({"name": "hostile", "results_dir": f"out/{name}",
                         "topology": {"name": "line", "switches": 1}})
    script = tmp_path / resolved.scenario.results_dir / "run-1" / "host-setup" / "h1.sh"
    script.parent.mkdir(parents=True)
    script.write_text("echo set-up ran\n")
    shell = subprocess.run(["bash", "--norc", "--noediting", "-s"], cwd=tmp_path,
                           input=setup_command(Path(resolved.scenario.results_dir) / "run-1"
                                               / "host-setup" / "h1.sh") + "\n",
                           capture_output=True, text=True, timeout=10)
    assert shell.stdout.splitlines() == ["set-up ran", "rc=0"], shell.stderr
    assert not list(tmp_path.glob("PWNED")) and not list(tmp_path.rglob("PWNED"))
