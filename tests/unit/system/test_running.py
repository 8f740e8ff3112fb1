"""The interface of a running fabric (testbed.system.running.RunningFabric): FabricNetwork and
the unit tests' stand-in both implement it, member by member and with the same parameters, so
what experiments and measurement are tested against is what a real run gives them."""
from __future__ import annotations

import inspect
from types import SimpleNamespace

import pytest
from tests.unit.stand_ins import StandInFabric

from testbed.apply.network import FabricNetwork
from testbed.model.topology.fattree import fat_tree
from testbed.system.running import RunningFabric

MEMBERS = [name for name in dir(RunningFabric) if not name.startswith("_")]
ATTRIBUTES = sorted(RunningFabric.__annotations__)


def parameters(function) -> list[tuple[str, object]]:
    """(name, kind) of every parameter but self: what a caller may pass."""
    return [(p.name, p.kind) for p in inspect.signature(function).parameters.values()
            if p.name != "self"]


def implementations(tmp_path) -> list:
    fabric = fat_tree(4, host_rate_mbit=6.0)
    return [FabricNetwork(fabric, tmp_path, ledger=None), StandInFabric(fabric, tmp_path)]


def test_the_protocol_names_what_experiments_and_measurement_use():
    assert ATTRIBUTES == ["ecn_path", "fabric", "queue", "workdir"]
    assert {"popen", "cmd", "switch_counters", "port_backlogs", "pause_counters", "lossless",
            "emulator_processes"} <= set(MEMBERS)


@pytest.mark.parametrize("which", ["FabricNetwork", "StandInFabric"])
def test_each_implementation_is_a_running_fabric(tmp_path, which):
    net = next(n for n in implementations(tmp_path) if type(n).__name__ == which)
    assert isinstance(net, RunningFabric)
    for name in ATTRIBUTES:
        assert hasattr(net, name), name
    for name in MEMBERS:
        wanted = inspect.getattr_static(RunningFabric, name)
        have = inspect.getattr_static(type(net), name)
        if isinstance(wanted, property):
            assert isinstance(have, property), name
        else:
            assert parameters(have) == parameters(wanted), name


def test_fabric_network_names_the_processes_that_emulate_it(tmp_path):
    net = FabricNetwork(fat_tree(4, host_rate_mbit=6.0), tmp_path, ledger=None)
    net.switchd = SimpleNamespace(pids=[101])
    net.pfc = SimpleNamespace(proc=SimpleNamespace(pid=202))
    net.marking = SimpleNamespace(anchor_pids=[303])
    assert net.emulator_processes() == {"ovs-vswitchd": [101], "pause agent": [202],
                                        "ECN anchor agent": [303]}
    net.pfc = net.marking = None  # neither agent: ovs-vswitchd alone
    assert net.emulator_processes() == {"ovs-vswitchd": [101]}
    assert not net.lossless and net.pause_counters() == {} and net.pause_events() == []
    assert net.marked_ports() == [] and net.ecn_counters() == {} and net.ecn_anchoring() is None
