"""Which kernel modules a fabric loads before use (testbed.apply.modules): the pure choice of
modules, and the thin layer's modprobe calls with a stand-in for modprobe (no root)."""
from __future__ import annotations

import subprocess

import pytest

from testbed.apply import modules
from testbed.apply.modules import (
    congestion_module,
    fabric_modules,
    load_modules,
    modprobe_argv,
    modules_to_load,
)
from testbed import errors


def test_a_stock_kernel_fabric_needs_every_module_its_paths_use():
    assert fabric_modules(kernel_datapath=True, red_marking=True, netem=True,
                          congestion="dctcp") == ["openvswitch", "sch_red", "sch_netem",
                                                  "tcp_dctcp"]
    # the development machines' paths need none
    assert fabric_modules(kernel_datapath=False, red_marking=False, netem=False,
                          congestion=None) == []
    assert congestion_module("dctcp") == "tcp_dctcp"
    assert modprobe_argv("sch_red") == ["modprobe", "sch_red"]


def test_only_what_is_neither_loaded_nor_built_in_is_loaded():
    wanted = ["openvswitch", "sch_red", "sch_netem", "tcp_dctcp", "tcp_cubic", "sch_red"]
    assert modules_to_load(wanted, loaded={"openvswitch"}, builtin={"sch_netem"},
                           congestion_available={"reno", "cubic"}) == ["sch_red", "tcp_dctcp"]
    # a congestion control already available needs nothing, whatever module holds it
    assert modules_to_load(["tcp_dctcp"], set(), set(), {"dctcp"}) == []
    assert modules_to_load(["rdma-rxe"], {"rdma_rxe"}, set(), set()) == []


class FakeModprobe:
    """Records modprobe's argv; fails for the modules in ``refuse``."""

    def __init__(self, refuse=()):
        self.calls = []
        self.refuse = set(refuse)

    def __call__(self, argv, **kwargs):
        self.calls.append(argv)
        failed = argv[-1] in self.refuse
        return subprocess.CompletedProcess(argv, 1 if failed else 0, "",
                                           f"modprobe: FATAL: Module {argv[-1]} not found"
                                           if failed else "")


@pytest.fixture
def machine(monkeypatch):
    """Nothing loaded, nothing built in, reno and cubic available; modprobe stood in for."""
    monkeypatch.setattr(modules, "_read", lambda path: {
        modules.PROC_MODULES: "", modules.TCP_CONGESTION_AVAILABLE: "reno cubic\n"}[path])
    monkeypatch.setattr(modules, "read_builtin_modules", lambda release: set())
    fake = FakeModprobe(refuse={"sch_red"})
    monkeypatch.setattr(modules.subprocess, "run", fake)
    return fake


def test_load_modules_runs_modprobe_for_each_missing_module(machine):
    logged = []
    assert load_modules(["tcp_dctcp", "tcp_cubic", "sch_netem"], log=logged.append) == [
        "tcp_dctcp", "sch_netem"]
    assert machine.calls == [["modprobe", "tcp_dctcp"], ["modprobe", "sch_netem"]]
    assert logged == ["loaded kernel modules: tcp_dctcp, sch_netem"]


def test_a_module_that_will_not_load_is_one_line_naming_it(machine):
    with pytest.raises(errors.TestbedError, match="kernel module sch_red would not load: "
                                           "modprobe: FATAL: Module sch_red not found"):
        load_modules(["sch_red"], log=lambda m: None)


def test_a_fabric_asks_for_the_modules_of_the_paths_it_was_given(tmp_path):
    from testbed.apply.network import FabricNetwork
    from testbed.model.topology import build
    from testbed.plan.port_queue import Impairment
    from testbed.plan.profiles import QueueConfig, StepEcn

    fabric = build("spineleaf", leaves=1, spines=1, hosts_per_leaf=2, host_rate_mbit=10.0)
    stock = FabricNetwork(fabric, tmp_path, ledger=None, datapath="kernel",
                          queue=QueueConfig(100_000, StepEcn(30_000)), ecn_path="red-qdisc",
                          host_sysctls={"net.ipv4.tcp_congestion_control": "dctcp"},
                          impairments={"l0-eth1": Impairment(delay_ms=5.0)})
    assert stock.kernel_modules() == ["openvswitch", "sch_red", "sch_netem", "tcp_dctcp"]
    fallback = FabricNetwork(fabric, tmp_path, ledger=None, datapath="user",
                             queue=QueueConfig(100_000, StepEcn(30_000)), ecn_path="ebpf",
                             host_sysctls={"net.ipv4.tcp_ecn": "1"})
    assert fallback.kernel_modules() == []
