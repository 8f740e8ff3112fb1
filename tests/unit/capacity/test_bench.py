"""The bench's table, from a result shaped like testbed.capacity.bench.run_bench's."""
from __future__ import annotations

from testbed.capacity.bench import bench_rows


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
