"""The bench's table, from a result shaped like testbed.capacity.bench.run_bench's, and the
plain-Mininet baseline's topology."""
from __future__ import annotations

from testbed.capacity.bench import bench_rows, mininet_topo
from testbed.model.topology.fattree import fat_tree


def test_bench_rows_put_each_measure_beside_its_baseline():
    result = {
        "run_id": "b1",
        "lines_mbit": {"mtu9000": {"direct_veth": 19000.0, "kernel_forwarding_2_routers": 14000.0,
                                   "ovs_2_switches": 1400.0, "ovs_2_switches_offloaded": 7000.0}},
        "ceiling_k4": {"ceiling_mbit": 150.0, "forwarded_switch_hops_mbit": 7000.0,
                       "forwarded_vs_kernel_line": 0.5, "trials": []},
        "fabric_k4": {"testbed": {"up_s": 1.0, "down_s": 0.1}, "plain_mininet": {"up_s": 4.0,
                                                                                 "down_s": 2.5},
                      "up_ratio_vs_plain": 0.25, "down_ratio_vs_plain": 0.04},
    }
    rows = bench_rows(result)
    assert rows[0] == ["measure", "testbed", "baseline", "ratio"]
    assert ["TCP through 2 OVS switches, mtu9000", "1400 Mbit/s",
            "14000 Mbit/s kernel-forwarding line", "0.100"] in rows
    assert ["  ... passing offloaded packets, mtu9000", "7000 Mbit/s",
            "14000 Mbit/s kernel-forwarding line", "0.500"] in rows
    assert ["k=4 ring trusted at >= 90% busbw", "150 Mbit/s", "", ""] in rows
    none = bench_rows({"run_id": "b4", "ceiling_k8": {"ceiling_mbit": None, "trials": [
        {"rate_mbit": 5.0}, {"rate_mbit": 2.5}]}})
    assert ["k=8 ring trusted at >= 90% busbw", "none of 2.5, 5 Mbit/s", "", ""] in none
    thinned = bench_rows({"run_id": "b5", "ceiling_k8": {
        "ceiling_mbit": 20.0, "topology": {"name": "fattree", "k": 8, "hosts_per_edge": 1},
        "ranks": 32, "forwarded_switch_hops_mbit": 900.0, "forwarded_vs_kernel_line": 0.05,
        "trials": []}})
    assert ["k=8 ring of 32 ranks (1 per edge switch) trusted at >= 90% busbw", "20 Mbit/s",
            "", ""] in thinned
    assert ["k=4 ring: switch-hop throughput at the ceiling", "7000 Mbit/s",
            "kernel-forwarding line, MTU 9000", "0.500"] in rows
    assert ["k=4 fat-tree up", "1.0 s", "4.0 s plain Mininet", "0.25"] in rows


def test_the_roce_engine_stands_beside_a_plain_udp_sender():
    result = {"run_id": "b2", "roce_engine": {
        "mtu_bytes": 1024, "message_bytes": 1 << 20,
        "pps": [{"sink": "drained", "plain_pps_per_core": 200000.0,
                 "engine_pps_per_core": 120000.0, "ratio": 0.6}],
        "goodput": {"goodput_mbit": 700.0, "data_verified": True}}}
    rows = bench_rows(result)
    assert ["RoCE engine sender, 1024 B packets", "120000 pps/core",
            "200000 pps/core plain UDP sender", "0.60 (goal 0.5)"] in rows
    assert ["one RoCE QP on 127.0.0.1", "700 Mbit/s", "data verified: True", ""] in rows
    failed = bench_rows({"run_id": "b3", "roce_engine": {"error": "boom"}})
    assert ["RoCE engine", "failed", "boom", ""] in failed


def test_the_kernel_datapath_line_stands_beside_the_userspace_one():
    result = {"run_id": "b6", "lines_mbit": {"mtu1500": {
        "direct_veth": 1600.0, "kernel_forwarding_2_routers": 1500.0, "ovs_2_switches": 60.0,
        "ovs_2_switches_kernel": 900.0, "kernel_vs_userspace": 15.0}}}
    rows = bench_rows(result)
    assert ["  ... on the kernel datapath, mtu1500", "900 Mbit/s",
            "60 Mbit/s userspace datapath", "15.000"] in rows


def test_a_flag_forces_the_userspace_datapath_where_the_module_exists(monkeypatch):
    from testbed.capabilities import (
        DATAPATH_ENV,
        Capability,
        choose_paths,
        fabric_datapath,
    )

    caps = {"ovs_kernel_module": Capability("ovs_kernel_module", True, "module loaded")}
    monkeypatch.delenv(DATAPATH_ENV, raising=False)
    assert fabric_datapath(choose_paths(caps)) == "kernel"
    monkeypatch.setenv(DATAPATH_ENV, "user")  # what `testbed bench --userspace-datapath` sets
    assert choose_paths(caps).ovs_datapath == "userspace"
    assert fabric_datapath(choose_paths(caps)) == "user"


def test_the_bench_and_doctor_flags_parse():
    from testbed.cli import build_parser

    args = build_parser().parse_args(["bench", "--lines-only", "--userspace-datapath"])
    assert args.lines_only and args.userspace_datapath
    assert not build_parser().parse_args(["bench"]).userspace_datapath
    assert build_parser().parse_args(["doctor"]).probe
    assert not build_parser().parse_args(["doctor", "--no-probe"]).probe


def test_mininet_topo_carries_names_ports_dpids_addresses_and_rates():
    fabric = fat_tree(2, host_rate_mbit=6.0, fabric_rate_mbit=12.0)
    topo = mininet_topo(fabric)
    assert sorted(topo.nodes()) == sorted(fabric.nodes)
    assert topo.nodeInfo("p0e0") == {"isSwitch": True, "dpid": "0000000100000000"}
    assert topo.nodeInfo("p1e0h0") == {"ip": "10.1.0.2/8", "mac": "02:00:0a:01:00:02"}
    links = topo.links(withKeys=True, withInfo=True)
    assert len(links) == len(fabric.links)
    infos = {(info["node1"], info["node2"]): info for _, _, _, info in links}
    assert infos[("p0e0h0", "p0e0")]["port1"] == 0 and infos[("p0e0h0", "p0e0")]["port2"] == 1
    assert infos[("p0e0h0", "p0e0")]["bw"] == 6.0
    assert infos[("p1a0", "c0")] == {"node1": "p1a0", "node2": "c0", "port1": 2, "port2": 2,
                                     "bw": 12.0}
