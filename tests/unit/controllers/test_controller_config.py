"""How settings reach the controller: the testbed's command line for the launcher, the
launcher's checks (one-line usage errors before os-ken starts), the environment variables the
apps read, and the run configuration that refuses routing modes and anycast services a fabric
cannot have."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from testbed.apply.controller import ControllerProcess, write_anycast
from testbed.controllers.apps.config import (
    DEFAULT_PORT_STATS_INTERVAL_S,
    ENV_ANYCAST,
    ENV_EVENTS,
    ENV_FABRIC,
    ENV_PORT_STATS,
    ENV_PORT_STATS_INTERVAL,
    ENV_ROUTING,
    ENV_STATUS,
    ControllerConfig,
)
from testbed.controllers.apps.launcher import parse_args
from testbed.controllers.routing.fabric_state import AnycastService
from testbed.errors import ConfigError
from testbed.experiments.allreduce.experiment import ecmp_spread
from testbed.experiments.registry import load, validate
from testbed.measure.telemetry import link_directions
from testbed.model.topology import build

REPO = Path(__file__).resolve().parents[3]
ANYCAST = {"service_ip": "10.255.0.1", "replicas": ["p0e0h0", "p3e1h1"]}
SMALL_DRAGONFLY = {"name": "dragonfly", "p": 1, "a": 2, "h": 1}


@pytest.fixture
def fabric_json(tmp_path) -> Path:
    path = tmp_path / "fabric.json"
    build("fattree", k=4).dump_json(path)
    return path


def test_controller_process_hands_over_every_file(tmp_path, fabric_json):
    proc = ControllerProcess(fabric_json, tmp_path, port=6999, routing="single")
    argv = proc.argv()
    config, port = parse_args(argv[3:])  # after: python -m testbed.controllers.apps.launcher
    assert port == 6999
    assert config == ControllerConfig(
        fabric_path=str(fabric_json), status_path=str(tmp_path / "controller-status.json"),
        routing="single", events_path=str(tmp_path / "controller-events.jsonl"),
        port_stats_path=str(tmp_path / "port-stats.jsonl"),
        port_stats_interval_s=DEFAULT_PORT_STATS_INTERVAL_S, anycast=None,
        wiring_path=str(tmp_path / "wiring.jsonl"))
    write_anycast(tmp_path, ANYCAST)
    config, _ = parse_args(proc.argv()[3:])
    assert config.anycast_service() == AnycastService.from_dict(ANYCAST)
    quiet = ControllerProcess(fabric_json, tmp_path, port_stats_interval_s=None,
                              wiring_check=False).argv()
    assert "--port-stats" not in quiet and "--port-stats-interval" not in quiet
    assert "--wiring-check" not in quiet


def test_environment_round_trip(tmp_path):
    config = ControllerConfig("f.json", "s.json", "ugal", "e.jsonl", "p.jsonl", 0.25,
                              json.dumps(ANYCAST))
    env = config.to_env()
    assert set(env) == {ENV_FABRIC, ENV_STATUS, ENV_ROUTING, ENV_EVENTS, ENV_PORT_STATS,
                        ENV_PORT_STATS_INTERVAL, ENV_ANYCAST}
    assert ControllerConfig.from_env(env) == config
    minimal = ControllerConfig.from_env({ENV_FABRIC: "f.json"})
    assert (minimal.routing, minimal.events_path, minimal.port_stats_path, minimal.anycast) == (
        "ecmp", None, None, None)
    assert minimal.port_stats_interval_s == DEFAULT_PORT_STATS_INTERVAL_S
    assert minimal.anycast_service() is None
    # the anycast setting is a file or the JSON itself
    assert config.anycast_service() == AnycastService.from_dict(ANYCAST)
    for bad in ("0", "-1", "nan"):
        with pytest.raises(ValueError, match=ENV_PORT_STATS_INTERVAL):
            ControllerConfig.from_env({ENV_FABRIC: "f.json", ENV_PORT_STATS_INTERVAL: bad})


@pytest.mark.parametrize(("extra", "words"), [
    (["--routing", "ugal"], "--routing: 'ugal' routes dragonfly fabrics only, not fattree"),
    (["--routing", "bogus"], "invalid choice: 'bogus'"),
    (["--port-stats-interval", "0"], "--port-stats-interval must be > 0"),
    (["--anycast", '{"service_ip": "10.255.0.1", "replicas": ["nobody"]}'],
     "--anycast: replica 'nobody' is not a host"),
    (["--anycast", "/no/such/anycast.json"], "--anycast: "),
])
def test_launcher_refuses_in_one_line(capsys, fabric_json, extra, words):
    with pytest.raises(SystemExit) as info:
        parse_args(["--fabric", str(fabric_json), "--status", "s.json", *extra])
    assert info.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert words in err[-1]


def test_launcher_takes_dragonfly_modes_for_a_dragonfly(tmp_path):
    path = tmp_path / "fabric.json"
    build("dragonfly", p=1, a=2, h=1).dump_json(path)
    for mode in ("minimal", "valiant", "ugal", "ecmp"):
        config, _ = parse_args(["--fabric", str(path), "--status", "s", "--routing", mode])
        assert config.routing == mode


# --- the run configuration -------------------------------------------------------------------


@pytest.mark.parametrize(("data", "field", "words"), [
    ({"routing": "ugal"}, "routing", "'ugal' routes dragonfly fabrics only, not fattree"),
    ({"routing": "valiant", "topology": {"name": "spineleaf"}}, "routing",
     "dragonfly fabrics only"),
    ({"routing": "x"}, "routing", "must be one of ecmp, single, minimal, valiant, ugal"),
    ({"anycast": {"service_ip": "10.255.0.1", "replicas": ["p9e9h9"]}}, "anycast",
     "'p9e9h9' is not a host"),
    ({"anycast": {"service_ip": "172.16.0.1", "replicas": ["p0e0h0"]}}, "anycast",
     "in 10.0.0.0/8"),
    ({"anycast": ANYCAST | {"port": 80}}, "anycast.port", "unknown field"),
    ({"anycast": {"service_ip": "10.255.0.1", "replicas": ["g0r0h0"]},
      "topology": SMALL_DRAGONFLY, "routing": "ugal"}, "anycast", "needs routing ecmp or single"),
    ({"anycast": "10.255.0.1"}, "anycast", "valid dictionary"),
])
def test_scenario_refusals_name_their_field(data, field, words):
    with pytest.raises(ConfigError) as info:
        validate({"name": "x", **data})
    found = [p for p in info.value.problems if p.field == field]
    assert found and words in found[0].message, info.value.problems


def test_scenarios_take_dragonfly_modes_and_anycast():
    for mode in ("minimal", "valiant", "ugal"):
        resolved = validate({"name": "x", "topology": SMALL_DRAGONFLY, "routing": mode})
        assert resolved.setups[0].routing == mode
    resolved = validate({"name": "x", "anycast": ANYCAST, "routing": "single"})
    assert resolved.setups[0].anycast == ANYCAST
    assert validate({"name": "x"}).setups[0].anycast is None


def test_repo_scenarios_for_ugal_and_anycast():
    ugal = load(REPO / "scenarios" / "dragonfly-ugal-allreduce.yaml").setups[0]
    assert (ugal.fabric.kind, ugal.routing) == ("dragonfly", "ugal")
    anycast = load(REPO / "scenarios" / "fattree-anycast-allreduce.yaml").setups[0]
    assert (anycast.routing, anycast.anycast) == ("ecmp", ANYCAST)


@pytest.mark.parametrize("mode", ["valiant", "ugal"])
def test_spread_of_dragonfly_groups_reads_their_ports(mode):
    fabric = build("dragonfly", p=1, a=2, h=1)
    rates = {d.label: 0.0 for d in link_directions(fabric)}
    assert ecmp_spread(fabric, mode, rates)["uplinks_in_groups"] == 0  # no traffic, no entry
    rates = {label: 3.0 for label in rates}
    spread = ecmp_spread(fabric, mode, rates)
    assert spread["switches"] and spread["jain_mean"] == 1.0


def test_an_uplink_counts_as_used_relative_to_the_link_rate():
    """A slow fabric's flows are slow too: at 1 Mbit/s, 0.25 Mbit/s on an uplink is traffic."""
    fabric = build("fattree", k=4, host_rate_mbit=1.0)
    rates = {d.label: 0.25 for d in link_directions(fabric)}
    spread = ecmp_spread(fabric, "ecmp", rates)
    assert spread["uplinks_used"] == spread["uplinks_in_groups"] > 0 and spread["spread"]
    rates = {label: 0.04 for label in rates}  # under 5% of the rate: not counted
    assert ecmp_spread(fabric, "ecmp", rates)["uplinks_used"] == 0
