"""The host program (``python -m testbed.traffic.roce.host serve|send``) run as two processes
on 127.0.0.1, and the loopback benchmark's measurements (small runs)."""
from __future__ import annotations

import pytest

from testbed.traffic.roce import bench, host

SEND_KEYS = {"role", "opcode", "message_bytes", "mtu_bytes", "messages", "bytes_delivered",
             "elapsed_s", "goodput_mbit", "packets_sent", "retransmitted_packets", "naks",
             "timeouts", "cnps_received", "cnps_sent_by_receiver", "sha256_sender",
             "sha256_receiver", "data_verified", "errors", "cc", "qp", "engine", "receiver",
             "window_monotonic_s", "series_origin_monotonic_s"}
RUN_TIMEOUT_S = 120
CNPS_IN_FLIGHT = 1     # at most the CNP of the last packet, sent after its ACK


def test_write_run_prints_verified_json():
    sent, served = bench.run_pair(["--opcode", "write", "--size", "300000", "--count", "5",
                                   "--mtu", "2048"], timeout_s=RUN_TIMEOUT_S)
    assert SEND_KEYS <= set(sent)
    (connection,) = served["connections"]
    assert sent["data_verified"] and sent["sha256_sender"] == connection["sha256"]
    assert sent["messages"] == 5 and sent["bytes_delivered"] == 5 * 300000
    # 300000 B at MTU 2048 is 147 packets per message
    assert sent["packets_sent"] == 5 * 147 and sent["retransmitted_packets"] == 0
    assert connection["qp"]["messages_received"] == 5 and connection["errors"] == []
    assert served["errors"] == []
    assert sent["goodput_mbit"] > 0 and sent["cc"]["name"] == "none"


def test_send_run_with_dcqcn_and_marks_reports_cnps_and_the_rate_series():
    sent, served = bench.run_pair(["--opcode", "send", "--size", "65536", "--count", "12",
                                   "--cc", "dcqcn", "--link-rate-mbit", "400",
                                   "--ce-mark-probability", "0.05", "--seed", "5"],
                                  timeout_s=RUN_TIMEOUT_S)
    assert sent["data_verified"] and sent["messages"] == 12
    # the receiver sends a CNP after the ACK of the same packet: the last one may still be in
    # flight when the sender has its completions and stops
    assert 0 <= sent["cnps_sent_by_receiver"] - sent["cnps_received"] <= CNPS_IN_FLIGHT
    assert sent["cnps_received"] > 0
    assert served["connections"][0]["np"]["cnps_sent"] == sent["cnps_sent_by_receiver"]
    series = sent["cc"]["series"]
    assert set(series) == {"t_s", "rate_bps", "target_bps", "alpha", "cnps_received"}
    assert min(series["rate_bps"]) < 400e6
    scaling = {row["name"]: row for row in sent["cc"]["scaling"]}
    assert scaling["rate_timer_s"]["value"] == pytest.approx(55e-6 * 100)   # 40G / 400M = 100


def test_loss_run_with_dctcp_retransmits_and_still_verifies():
    sent, _ = bench.run_pair(["--size", "1000000", "--count", "3", "--cc", "dctcp",
                              "--drop-probability", "0.02", "--seed", "3"],
                             serve_args=["--drop-probability", "0.02", "--seed", "4"],
                             timeout_s=RUN_TIMEOUT_S)
    assert sent["data_verified"] and sent["messages"] == 3
    assert sent["retransmitted_packets"] > 0 and sent["naks"] + sent["timeouts"] > 0
    assert sent["cc"]["name"] == "dctcp" and sent["cc"]["losses"] > 0


def test_incast_of_three_senders_onto_one_engine():
    senders = [["--size", "200000", "--count", "4", "--seed", str(seed)] for seed in (1, 2, 3)]
    sent, served = bench.run_hosts(senders, timeout_s=RUN_TIMEOUT_S)
    assert all(s["data_verified"] and s["messages"] == 4 for s in sent)
    assert len(served["connections"]) == 3 and served["errors"] == []
    assert len({c["qp"]["qpn"] for c in served["connections"]}) == 3    # one QP each, one port
    assert sorted(c["sha256"] for c in served["connections"]) == sorted(s["sha256_sender"] for s in sent)
    assert served["engine"]["datagrams_received"] >= 3 * 4 * 196       # 200000 B = 196 packets


def test_host_helpers():
    assert host.slot_count(1 << 20, 3, 64 << 20) == 3
    assert host.slot_count(1 << 20, None, 64 << 20) == 64
    assert host.slot_count(100 << 20, 5, 64 << 20) == 1
    assert host.parse_overrides(["g=0.5", "rai_bps = 1e6"]) == {"g": 0.5, "rai_bps": 1e6}
    series = {"t_s": list(range(10)), "x": list(range(10, 20))}
    assert host.downsample(series, 4) == {"t_s": [0, 3, 6, 9], "x": [10, 13, 16, 19]}
    assert host.json_safe({"a": [float("inf"), 1.0]}) == {"a": [None, 1.0]}


def test_bench_measures_both_senders_in_cpu_time():
    row = bench.measure_pps(packets=20000, mtu=1024, message_bytes=65536, kind="unread")
    assert row["plain_pps_per_core"] > 0 and row["engine_pps_per_core"] > 0
    assert row["ratio"] == pytest.approx(row["engine_pps_per_core"] / row["plain_pps_per_core"])
    assert row["datagram_bytes"] == 1024 + 12 + 4
