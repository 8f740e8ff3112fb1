"""How the switches are spread over ovs-vswitchd processes and CPUs (testbed.plan.shards),
and how a run is told and records it."""
from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from testbed.apply import ovs
from testbed.errors import ConfigError
from testbed.harness.run import CPU_PINNING_ENV, SWITCHD_SHARDS_ENV, cpu_pinning, switchd_shards
from testbed.model.topology.fattree import fat_tree
from testbed.plan.bring_up import host_script
from testbed.plan.shards import (
    PORTS_PER_SHARD_MIN,
    SHARDS_MAX,
    CpuLayout,
    cpu_layout,
    cpu_mask,
    partition,
    shard_count,
)

K4_PORTS = 80  # the k=4 fat-tree's switch ports


@pytest.mark.parametrize("cpus, shards", [(1, 1), (2, 1), (3, 1), (4, 2), (8, 4), (64, SHARDS_MAX)])
def test_one_process_per_two_cpus_keeps_a_cpu_for_the_hosts(cpus, shards):
    assert shard_count(K4_PORTS, cpus) == shards


def test_small_fabrics_stay_in_one_process():
    assert shard_count(PORTS_PER_SHARD_MIN * 2 - 1, 64) == 1


def test_a_requested_count_is_taken_but_never_more_than_one_per_port():
    assert shard_count(K4_PORTS, 2, requested=2) == 2
    assert shard_count(3, 2, requested=8) == 3
    with pytest.raises(ValueError, match="at least 1"):
        shard_count(K4_PORTS, 2, requested=0)


def test_the_k4_fat_tree_splits_into_equal_port_counts_keeping_the_fabrics_order():
    fabric = fat_tree(4, host_rate_mbit=6.0)
    ports = {s.name: 0 for s in fabric.switches}
    for switch, _, _, _ in fabric.switch_ends():
        ports[switch] += 1
    groups = partition(ports, 2)
    assert sorted(sum(ports[s] for s in g) for g in groups) == [40, 40]
    assert sorted(s for g in groups for s in g) == sorted(ports)
    order = list(ports)
    for group in groups:
        assert group == sorted(group, key=order.index)


@given(st.dictionaries(st.text(min_size=1, max_size=4), st.integers(1, 64), min_size=1,
                       max_size=40), st.integers(1, 8))
def test_every_switch_lands_in_exactly_one_group_and_loads_stay_close(ports, shards):
    groups = partition(ports, shards)
    assert sorted(s for g in groups for s in g) == sorted(ports)
    assert len(groups) == min(shards, len(ports)) and all(groups)
    loads = [sum(ports[s] for s in g) for g in groups]
    assert max(loads) - min(loads) <= max(ports.values())  # greedy: within one switch


def test_the_forwarding_cpus_and_the_hosts_receive_cpus_never_overlap():
    assert cpu_layout([0, 1], 1) == CpuLayout((0,), (1,))
    assert cpu_layout([2, 3, 5, 7], 2) == CpuLayout((2, 3), (5, 7))
    assert cpu_layout([0, 1], 2) == CpuLayout() == cpu_layout([0], 1)  # no CPU left: no pinning
    assert cpu_layout(range(8), 2).host_cpus_mask == "fc"
    # a latency-bound experiment's hosts keep two CPUs, or nothing is pinned
    assert cpu_layout([0, 1], 1, min_host_cpus=2) == CpuLayout()
    assert cpu_layout([0, 1, 2], 1, min_host_cpus=2) == CpuLayout((0,), (1, 2))
    assert CpuLayout().host_cpus_mask is None


def test_cpu_masks_are_hex_as_rps_cpus_takes_them():
    assert cpu_mask([1]) == "2" and cpu_mask([0, 1, 2, 3]) == "f" and cpu_mask([8]) == "100"
    with pytest.raises(ValueError):
        cpu_mask([-1])


def test_a_hosts_nic_steers_its_receive_processing_through_its_own_sysfs():
    fabric = fat_tree(4, host_rate_mbit=6.0)
    script = host_script(fabric, "p1e0h1", rx_cpus_mask="2")
    assert script.splitlines()[-1] == (
        "unshare -m sh -c 'umount -l /sys && mount -t sysfs sysfs /sys && echo 2 > "
        "/sys/class/net/p1e0h1-eth0/queues/rx-0/rps_cpus'")
    assert "rps_cpus" not in host_script(fabric, "p1e0h1")


@pytest.mark.parametrize("value, expected", [(None, None), ("", None), ("1", 1), ("3", 3)])
def test_the_shard_count_comes_from_the_environment_when_set(monkeypatch, value, expected):
    if value is None:
        monkeypatch.delenv(SWITCHD_SHARDS_ENV, raising=False)
    else:
        monkeypatch.setenv(SWITCHD_SHARDS_ENV, value)
    assert switchd_shards() == expected


@pytest.mark.parametrize("value", ["0", "two", "-1", "1.5"])
def test_a_bad_shard_count_is_a_one_line_error_naming_the_variable(monkeypatch, value):
    monkeypatch.setenv(SWITCHD_SHARDS_ENV, value)
    with pytest.raises(ConfigError, match=SWITCHD_SHARDS_ENV):
        switchd_shards()


@pytest.mark.parametrize("value, expected", [(None, True), ("", True), ("on", True),
                                             ("off", False)])
def test_cpu_pinning_is_on_unless_the_environment_turns_it_off(monkeypatch, value, expected):
    if value is None:
        monkeypatch.delenv(CPU_PINNING_ENV, raising=False)
    else:
        monkeypatch.setenv(CPU_PINNING_ENV, value)
    assert cpu_pinning() is expected


@pytest.mark.parametrize("value", ["no", "0", "OFF", "true"])
def test_a_bad_pinning_value_is_a_one_line_error_naming_the_variable(monkeypatch, value):
    monkeypatch.setenv(CPU_PINNING_ENV, value)
    with pytest.raises(ConfigError, match=CPU_PINNING_ENV):
        cpu_pinning()


def test_tcmalloc_is_preloaded_when_the_library_is_installed(monkeypatch):
    import ctypes.util

    monkeypatch.setattr(ctypes.util, "find_library", lambda name: None)
    assert ovs.allocator_preload() is None
    monkeypatch.setattr(ctypes.util, "find_library",
                        lambda name: "libtcmalloc_minimal.so.4" if name == "tcmalloc_minimal" else None)
    assert ovs.allocator_preload() == "libtcmalloc_minimal.so.4"


def test_several_groups_run_the_dummy_datapath_each_in_its_own_directory(tmp_path):
    switchd = ovs.PrivateSwitchd(None, tmp_path / "ovs", cpus=(0,))
    switchd.groups = [["a", "b"]]
    assert switchd.datapath_type == "netdev" and switchd.shard_dir(0) == tmp_path / "ovs"
    assert switchd.taps() == ["a", "b", ovs.NETDEV_DATAPATH_TAP]
    switchd.groups = [["a"], ["b"]]
    assert switchd.datapath_type == "dummy" and switchd.taps() == []
    assert switchd.shard_dir(1) == tmp_path / "ovs" / "shard1"
    (tmp_path / "ovs" / "shard1").mkdir(parents=True)
    (tmp_path / "ovs" / "shard1" / "b.mgmt").touch()
    (tmp_path / "ovs" / "shard0").mkdir()
    assert switchd.bridge_target("b") == f"unix:{tmp_path}/ovs/shard1/b.mgmt"
    assert switchd.vsctl_argv("b") == ["ovs-vsctl", f"--db=unix:{tmp_path}/ovs/shard1/db.sock"]
    with pytest.raises(Exception, match="name the bridge"):
        switchd.vsctl_argv()
    assert switchd.describe()["pinned_cpus"] == [0]
