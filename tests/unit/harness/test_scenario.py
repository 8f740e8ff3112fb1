"""Scenario files: what loads, every problem reported at once with its field and line, the
bundled scenarios, and the published JSON schema."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from testbed.experiments.registry import json_schema, load, validate
from testbed.harness.scenario import SCENARIO_DIR, SCHEMA_PATH, ScenarioError, merge

GOOD = """\
name: small-ring
experiment: allreduce
topology:
  name: fattree
  k: 2
link_rate_mbit: 8.5
mtu_bytes: 1500
routing: single
seed: 42
results_dir: out
params:
  size_bytes: 4096
  channels: 2
  warmup: 0
  iters: 5
"""


def write(tmp_path: Path, text: str, name: str = "scenario.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def problems(tmp_path: Path, text: str) -> list[str]:
    with pytest.raises(ScenarioError) as info:
        load(write(tmp_path, text))
    return [str(p) for p in info.value.problems]


def test_good_file(tmp_path):
    resolved = load(write(tmp_path, GOOD))
    s, e = resolved.scenario, resolved.experiment
    assert (s.name, s.routing, s.seed, s.results_dir) == ("small-ring", "single", 42, "out")
    assert (e.name, e.rate_mbit, e.mtu_bytes) == ("allreduce", 8.5, 1500)
    assert e.params.model_dump() == {"size_bytes": 4096, "channels": 2, "warmup": 0, "iters": 5,
                                     "expect_busbw_fraction": 0.9, "algorithm": "ring",
                                     "transport": "tcp", "timeout_s": 600.0}
    (setup,) = resolved.setups
    assert setup.fabric.kind == "fattree" and len(setup.fabric.hosts) == 2
    assert setup.routing == "single" and setup.queue is None


def test_defaults_come_from_the_experiment(tmp_path):
    resolved = load(write(tmp_path, "name: plain\n"))
    e = resolved.experiment
    assert e.name == "allreduce" and e.rate_mbit == e.default_rate_mbit
    assert e.mtu_bytes == e.default_mtu_bytes
    assert len(resolved.setups[0].fabric.hosts) == 16  # the default k=4 fat-tree


@pytest.mark.parametrize("path", sorted(SCENARIO_DIR.glob("*.yaml")), ids=lambda p: p.name)
def test_every_bundled_scenario_loads(path):
    resolved = load(path)
    assert resolved.scenario.name == path.stem
    assert resolved.setups


def test_a_bundled_scenario_loads_by_name():
    assert load("fattree-allreduce").scenario.name == "fattree-allreduce"


def test_every_problem_at_once_with_field_and_line(tmp_path):
    found = problems(tmp_path, """\
name: bad name
experiment: allreduce
topology: {name: fattree, kk: 4}
link_rate_mbit: -3
queue: {pfc: maybe}
failures: [{at_s: 2, action: link_down}]
params: {size_bytes: 1001, chanels: 2}
""")
    assert found[0].startswith("line 1: name: must be ASCII letters, digits")
    assert "line 3: topology.kk: not a parameter of fattree; valid: k, fabric_rate_mbit, hosts_per_edge" in found
    assert any(f.startswith("line 4: link_rate_mbit: Input should be greater than 0") for f in found)
    assert any(f.startswith("line 5: queue.pfc:") for f in found)
    assert "line 6: failures.0: link_down needs link: [a, b]" in found
    assert any(f.startswith("line 7: params.size_bytes:") for f in found)
    assert "line 7: params.chanels: unknown field" in found
    assert len(found) == 7


def test_a_topology_value_names_the_parameter(tmp_path):
    assert problems(tmp_path, "name: x\ntopology: {name: fattree, k: 3}\n") == [
        "line 2: topology.k: must be an even integer >= 2, got 3"]


def test_rate_and_mtu_belong_to_the_run_not_the_topology(tmp_path):
    found = problems(tmp_path, "name: x\ntopology: {name: fattree, k: 4, host_rate_mbit: 5}\n")
    assert found == ["line 2: topology.host_rate_mbit: set it as the scenario's link_rate_mbit, "
                     "not under topology"]


def test_unknown_family_lists_the_known_ones(tmp_path):
    (found,) = problems(tmp_path, "name: x\ntopology: {name: torus}\n")
    assert "topology.name: unknown family 'torus'; known: clos, dragonfly, fattree" in found


def test_a_builder_over_a_base_takes_the_base_parameters(tmp_path):
    ok = "name: x\ntopology: {name: nvswitch, base: spineleaf, leaves: 2, spines: 1, " \
         "hosts_per_leaf: 1, gpus_per_node: 2}\n"
    assert load(write(tmp_path, ok)).setups[0].fabric.kind == "nvswitch"
    (found,) = problems(tmp_path, ok.replace("leaves: 2", "k: 2"))
    assert "topology.k: not a parameter of nvswitch" in found


def test_yaml_syntax_error_names_the_line_and_where_the_construct_began(tmp_path):
    (found,) = problems(tmp_path, "name: x\ntopology: {name: fattree, k: 4\nlink_rate_mbit: 6\n")
    assert found.startswith("line 3: not valid YAML")
    assert "at line 2" in found


def test_a_key_given_twice_is_a_problem(tmp_path):
    found = problems(tmp_path, "name: x\nlink_rate_mbit: 6\nlink_rate_mbit: 7\n")
    assert found == ["line 3: link_rate_mbit: given twice"]


def test_not_a_mapping(tmp_path):
    assert problems(tmp_path, "- a\n- b\n") == ["line 1: must be a mapping of field: value"]


def test_missing_file_lists_the_bundled_scenarios(tmp_path):
    from testbed.errors import ConfigError

    with pytest.raises(ConfigError) as info:
        load(tmp_path / "nope.yaml")
    assert "no such scenario file" in str(info.value) and "fattree-allreduce" in str(info.value)


@pytest.mark.parametrize(("extra", "expected"), [
    ("routing: ugal\n", "routing: 'ugal' routes dragonfly fabrics only, not fattree"),
    ("experiment: nosuch\n", "experiment: unknown experiment 'nosuch'"),
    ("failures: [{at_s: 1, action: link_down, link: [p0e0, p3a0]}]\n",
     "failures.0.link: p0e0 and p3a0 are not cabled together"),
    ("failures: [{at_s: 1, action: switch_down, switch: s99}]\n",
     "failures.0.switch: no switch s99"),
    ("failures: [{at_s: 1, action: controller_restart, switch: p0e0}]\n",
     "failures.0: controller_restart takes no switch"),
    ("anycast: {service_ip: 10.255.0.1, replicas: [p9e9h9]}\n", "anycast: replica 'p9e9h9' is not a host"),
    ("anycast: {service_ip: 10.255.0.300, replicas: [p0e0h0]}\n", "anycast.service_ip"),
    ("queue: {ecn: {profile: step, k_bytes: 30000}, buffer_bytes: 20000}\n",
     "queue.ecn.k_bytes: must be below buffer_bytes (20000)"),
    ("hosts: {tcp_cc: bbr}\n", "hosts.tcp_cc:"),
    ("impairments: [{link: all}]\n", "impairments.0: needs delay_ms or loss_percent"),
])
def test_cross_field_problems_name_their_field(tmp_path, extra, expected):
    found = problems(tmp_path, "name: x\n" + extra)
    assert any(expected in f for f in found), found


def test_without_netem_delay_is_refused_and_loss_alone_is_taken(tmp_path):
    from testbed import capabilities

    platform = capabilities.detect()
    if platform.capabilities["sch_netem"].available:
        pytest.fail("this test expects the CI kernel, which has no sch_netem")
    found = problems(tmp_path, "name: x\nimpairments: [{link: all, delay_ms: 5, "
                               "loss_percent: 1}]\n")
    assert found == [f"line 2: impairments.0: delay needs the netem qdisc, which this kernel "
                     f"lacks ({platform.capabilities['sch_netem'].detail}); loss_percent alone "
                     "runs on the eBPF loss program"]
    resolved = load(write(tmp_path, "name: x\nimpairments: [{link: all, loss_percent: 1}]\n"))
    assert resolved.scenario.impairments[0].loss_percent == 1


def test_an_experiment_that_builds_its_own_fabrics_refuses_sections(tmp_path):
    from testbed.experiments.registry import experiment_classes

    fixed = [name for name, cls in experiment_classes().items() if "topology" not in cls.sections]
    for name in fixed:
        found = problems(tmp_path, f"name: x\nexperiment: {name}\ntopology: {{name: fattree, "
                                   "k: 4}\n")
        assert any(f.endswith("topology: " + name + " sets this itself for each of its "
                              "fabrics; leave it out") for f in found), found


def test_explicit_topology(tmp_path):
    text = """\
name: tiny
topology:
  name: explicit
  nodes: [{name: h1, role: host}, {name: s1}, {name: s2}, {name: h2, role: host}]
  links: [[h1, s1], [s1, s2], {ends: [s2, h2], rate_mbit: 3}]
link_rate_mbit: 5
"""
    fabric = load(write(tmp_path, text)).setups[0].fabric
    assert fabric.kind == "explicit"
    assert [(l.a, l.a_port, l.b, l.b_port, l.rate_mbit) for l in fabric.links] == [
        ("h1", 0, "s1", 1, 5), ("s1", 2, "s2", 1, 5), ("s2", 2, "h2", 0, 3)]
    assert [h.ip for h in fabric.hosts] == ["10.200.0.2", "10.200.0.3"]


@pytest.mark.parametrize(("links", "expected"), [
    ("[[h1, s1], [s1, h2], [h1, s2]]", "topology.links.2: host h1 has more than one link"),
    ("[[h1, s1], [s1, s1], [s2, h2]]", "topology.links.1: cables s1 to itself"),
    ("[[h1, s1], [s2, h2]]", "topology.links: the fabric falls apart in 2 pieces"),
    ("[[h1, s1], [s1, x9], [s2, h2]]", "topology.links.1: x9 is not a node"),
])
def test_explicit_topology_problems(tmp_path, links, expected):
    text = ("name: x\ntopology:\n  name: explicit\n  nodes: [{name: h1, role: host}, {name: s1}, {name: s2}, "
            f"{{name: h2, role: host}}]\n  links: {links}\n")
    found = problems(tmp_path, text)
    assert any(expected in f for f in found), found


def test_an_explicit_topology_takes_only_nodes_and_links(tmp_path):
    found = problems(tmp_path, "name: x\ntopology: {name: explicit, nodes: [{name: h1, role: "
                               "host}, {name: s1}], links: [[h1, s1]], k: 4}\n")
    assert found == ["line 2: topology.k: unknown field"]


def test_merge_writes_dotted_fields_into_a_copy():
    data = {"params": {"iters": 1}}
    merged = merge(data, {"params.size_bytes": 4096, "link_rate_mbit": 5, "queue.pfc": True})
    assert merged == {"params": {"iters": 1, "size_bytes": 4096}, "link_rate_mbit": 5,
                      "queue": {"pfc": True}}
    assert data == {"params": {"iters": 1}}


def test_validate_from_a_mapping_names_the_source():
    with pytest.raises(ScenarioError) as info:
        validate({"name": "x", "mtu_bytes": 100}, "testbed allreduce")
    assert str(info.value) == ("testbed allreduce: mtu_bytes: Input should be greater than "
                               "or equal to 576, got 100")


def test_the_published_schema_is_current():
    """testbed/scenarios/schema.json is what `testbed schema --write` makes from the registry
    now: a build output, committed so that the wheel and an editor have it, never edited."""
    assert json.loads(SCHEMA_PATH.read_text()) == json.loads(json.dumps(json_schema())), (
        "testbed/scenarios/schema.json is stale; rewrite it: .venv/bin/testbed schema --write")


def test_the_schema_gives_each_experiment_its_params():
    schema = json_schema()
    names = schema["properties"]["experiment"]["enum"]
    assert "allreduce" in names and len(schema["allOf"]) == len(names)
    branch = next(b for b in schema["allOf"]
                  if b["if"]["properties"]["experiment"]["const"] == "allreduce")
    ref = branch["then"]["properties"]["params"]["$ref"].rsplit("/", 1)[1]
    assert "size_bytes" in schema["$defs"][ref]["properties"]
