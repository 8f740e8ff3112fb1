"""The queues' and switch ports' counters (testbed.system.counters) from hand-written
``tc -s -j qdisc show`` output and a fake /sys tree. No root, no tc."""
from __future__ import annotations

import json

from testbed.plan.profiles import PfcConfig, QueueConfig, StepEcn
from testbed.system.counters import (
    buffer_stats,
    impairment_drops,
    lossless_drops,
    parse_qdiscs,
    port_queue_drops,
    queue_drops,
    queued_packets,
    read_interface_counters,
    switch_totals,
)

BUFFER_BYTES = 125_000
PFC_QUEUE = QueueConfig(BUFFER_BYTES, StepEcn(30_000),
                        pfc=PfcConfig(xoff_bytes=40_000, xon_bytes=20_000,
                                      headroom_bytes=40_000))


def tc_entry(kind: str, handle: str, drops: int = 0, qlen: int = 0, **extra) -> dict:
    return {"kind": kind, "handle": handle, "bytes": 1000, "packets": 10, "drops": drops,
            "overlimits": 0, "requeues": 0, "backlog": 0, "qlen": qlen, **extra}


# One switch port with one buffer, one with class queues, one impaired, and a host's default.
QDISCS = [
    tc_entry("htb", "5:", 7, qlen=2, dev="p0e0-eth1", root=True),  # repeats its buffer's
    tc_entry("bfifo", "10:", 7, qlen=2, dev="p0e0-eth1", parent="5:1"),
    tc_entry("htb", "5:", 12, dev="l0-eth1", root=True),
    tc_entry("bfifo", "20:", 9, qlen=3, dev="l0-eth1", parent="5:10"),
    tc_entry("tbf", "23:", 2, qlen=4, dev="l0-eth1", parent="5:13"),  # lossless
    tc_entry("bfifo", "26:", 1, dev="l0-eth1", parent="5:16"),
    # impaired: netem counts its 4 losses and the 3 drops of the buffer below it
    tc_entry("netem", "1:", 7, qlen=5, dev="l0-eth4", root=True),
    tc_entry("htb", "5:", 3, qlen=1, dev="l0-eth4", parent="1:1"),
    tc_entry("bfifo", "10:", 3, qlen=1, dev="l0-eth4", parent="5:1"),
    tc_entry("clsact", "ffff:", 0, dev="l0-eth4", parent="ffff:fff1"),
    {"kind": "tbf", "handle": "23:", "dev": "l0-eth2"},  # no statistics yet
    tc_entry("noqueue", "0:", 0, dev="lo", root=True),
    tc_entry("fq_codel", "0:", 11, qlen=9, dev="eth0", root=True),  # not an emulated queue
    tc_entry("netem", "8001:", 50, qlen=6, dev="eth1", root=True),  # nor is this impairment
]


def test_parse_qdiscs_of_nothing():
    assert parse_qdiscs("") == parse_qdiscs(None) == parse_qdiscs("[]") == []
    assert parse_qdiscs(json.dumps(QDISCS)) == QDISCS


def test_drops_count_the_buffers_once():
    assert queue_drops(QDISCS) == 7 + (9 + 2 + 1) + 3
    assert queue_drops([]) == 0


def test_drops_per_port():
    assert port_queue_drops(QDISCS, ["p0e0-eth1", "l0-eth1", "l0-eth4", "l0-eth9"]) == {
        "p0e0-eth1": 7, "l0-eth1": 9 + 2 + 1, "l0-eth4": 3, "l0-eth9": 0}


def test_lossless_drops_count_only_the_lossless_queues():
    assert lossless_drops(QDISCS, PFC_QUEUE) == 2


def test_impairment_drops_leave_out_what_netem_repeats_of_its_child():
    assert impairment_drops(QDISCS) == 7 - 3
    assert impairment_drops([q for q in QDISCS if q.get("kind") != "netem"]) == 0


def test_queued_packets_are_the_buffers_and_netems_delay_line():
    assert queued_packets(QDISCS) == 2 + (3 + 4) + 1 + 5


def test_switch_totals_add_the_ports_and_the_queues():
    ports = {"l0-eth1": {"rx_packets": 100, "tx_packets": 80},
             "l0-eth4": {"rx_packets": 50, "tx_packets": 45}}
    assert switch_totals(ports, QDISCS) == {"rx_packets": 150, "tx_packets": 125,
                                            "queue_drops": 22, "impairment_drops": 4}


def test_interface_counters_are_read_from_sys(tmp_path):
    for intf, rx, tx in (("l0-eth1", 100, 80), ("s0-eth1", 7, 9)):
        folder = tmp_path / intf / "statistics"
        folder.mkdir(parents=True)
        (folder / "rx_packets").write_text(f"{rx}\n")
        (folder / "tx_packets").write_text(f"{tx}\n")
    assert read_interface_counters(["l0-eth1", "s0-eth1"], tmp_path) == {
        "l0-eth1": {"rx_packets": 100, "tx_packets": 80},
        "s0-eth1": {"rx_packets": 7, "tx_packets": 9}}


def test_buffer_stats_of_one_buffer_with_red():
    qdiscs = [
        {"kind": "htb", "handle": "5:", "dev": "l0-eth3", "drops": 9},
        {"kind": "red", "handle": "10:", "dev": "l0-eth3", "packets": 500, "drops": 1,
         "backlog": 3000, "marked": 77},
        {"kind": "bfifo", "handle": "10:", "parent": "5:1"},  # a host's, without dev
    ]
    assert buffer_stats(qdiscs) == {"l0-eth3": {"kind": "red", "packets": 500, "drops": 1,
                                                "backlog_bytes": 3000, "marked": 77}}


def test_buffer_stats_add_up_the_class_queues_and_their_marks():
    qdiscs = [
        {"kind": "htb", "handle": "5:", "dev": "l0-eth3", "drops": 9, "packets": 900},
        {"kind": "red", "handle": "20:", "dev": "l0-eth3", "packets": 500, "drops": 1,
         "backlog": 3000, "marked": 7},
        {"kind": "tbf", "handle": "23:", "dev": "l0-eth3", "packets": 300, "drops": 0,
         "backlog": 1500},
        {"kind": "red", "handle": "33:", "dev": "l0-eth3", "packets": 300, "drops": 0,
         "backlog": 1500, "marked": 5},  # inside the tbf: its packets are the tbf's
    ]
    assert buffer_stats(qdiscs, PFC_QUEUE) == {"l0-eth3": {
        "kind": "classes", "packets": 800, "drops": 1, "backlog_bytes": 4500, "marked": 12}}
    assert buffer_stats(qdiscs) == {}  # without classes only the single buffer counts
