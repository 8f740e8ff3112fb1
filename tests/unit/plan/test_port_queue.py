"""One port's whole queue as one plan (testbed.plan.port_queue): the tc lines of every kind
of port against lists written out by hand, the handles they use, the eBPF marker's map
entries, netem for impairments and which interfaces get them, and a fabric's plan in one
batch. No root: nothing here runs tc."""
from __future__ import annotations

import struct
from pathlib import Path

import pytest

from testbed.errors import ConfigError
from testbed.model.topology import build
from testbed.plan.ecn_plan import CONFIG_LAYOUT, MODE_OFF, MODE_STEP, unpack_value
from testbed.plan.port_queue import (
    NETEM_DEFAULT_LIMIT_PACKETS,
    Handles,
    Impairment,
    Port,
    default_buffer_bytes,
    host_queue,
    htb_burst_bytes,
    link_impairments,
    netem_limit_packets,
    paused_tbf,
    port_plan,
    running_tbf,
    switch_queue_plan,
)
from testbed.plan.profiles import PFC_CLASSES, PfcConfig, QueueConfig, StepEcn

RATE_MBIT = 20.0
MTU = 1500
BUFFER_BYTES = 125_000  # 50 ms at 20 Mbit/s
K_BYTES = 30_000
INTF = "l0-eth3"
IFINDEX = 42
OBJ = Path("/opt/tb/ecn_marker.o")
# Lossless thresholds inside the buffer, marking (K) below XOFF as the queue requires.
PFC = PfcConfig(xoff_bytes=40_000, xon_bytes=20_000, headroom_bytes=40_000)

# What every shaped port with one buffer starts with: a bucket of 3 ms of the link (7500 B at
# 20 Mbit/s), a quantum of one frame + 64 B.
HTB_LINK = ("class replace dev l0-eth3 parent 5: classid 5:1 htb rate 20.0mbit burst 7500 "
            "cburst 7500 quantum 1564")
# With traffic classes every bucket is two frames (a resumed lossless queue sends them at once).
HTB_LINK_CLASSES = HTB_LINK.replace("7500", "3000")
# The three default classes share 20 Mbit/s: 6.66667 Mbit/s each, borrowing up to all of it.
CLASS = ("class replace dev l0-eth3 parent 5:1 classid 5:{minor} htb rate 6.66667mbit "
         "ceil 20.0mbit burst 3000 cburst 3000 quantum 1564")
# DSCP 26 (0x68 after the 2 ECN bits) to the lossless class 5:13, DSCP 48 (0xc0) to 5:16.
FILTERS = ["filter add dev l0-eth3 parent 5: protocol ip prio 10 u32 match ip dsfield 0x68 "
           "0xfc flowid 5:13",
           "filter add dev l0-eth3 parent 5: protocol ip prio 10 u32 match ip dsfield 0xc0 "
           "0xfc flowid 5:16"]
# A step at K as RED: min K, max K + 1, probability 1, burst 1 + K / MTU = 21.
RED = ("red limit 125000 min 30000 max 30001 avpkt 1500 burst 21 probability 1.0 "
       "bandwidth 20.0mbit ecn nodrop")
MARKER = ["qdisc replace dev l0-eth3 clsact",
          "filter replace dev l0-eth3 egress prio 2 handle 1 bpf da obj /opt/tb/ecn_marker.o "
          "sec classifier"]


def pfc_queue(ecn=None) -> QueueConfig:
    return QueueConfig(BUFFER_BYTES, ecn, pfc=PFC)


def three_hosts_one_leaf():
    """l0h0, l0h1, l0h2 on leaf l0 (ports 1..3), spine s0 on l0's port 4."""
    return build("spineleaf", leaves=1, spines=1, hosts_per_leaf=3, host_rate_mbit=RATE_MBIT,
                 mtu_bytes=MTU)


def config_of(bpftool: list[list[str]]) -> dict[str, int]:
    """The marker config a port's last bpftool command writes."""
    argv = bpftool[-1]
    start = argv.index("value") + 2
    return unpack_value(CONFIG_LAYOUT, bytes(int(b, 16) for b in argv[start:]))


# --- one port, by hand --------------------------------------------------------------------------


def test_the_htb_bucket_is_3_ms_of_the_link_and_never_under_two_frames():
    assert htb_burst_bytes(20.0, 1500) == 7500
    assert htb_burst_bytes(100.0, 9000) == 37500
    assert htb_burst_bytes(6.0, 1500) == 3000  # 3 ms would be 2250 B: two frames instead


def test_a_plain_port_is_a_rate_and_a_default_buffer():
    assert port_plan(INTF, RATE_MBIT, MTU).tc == [
        "qdisc replace dev l0-eth3 root handle 5: htb default 1",
        HTB_LINK,
        "qdisc replace dev l0-eth3 parent 5:1 handle 10: bfifo limit 125000",
    ]
    assert port_plan(INTF, RATE_MBIT, MTU).bpftool == []


def test_an_unshaped_port_has_no_queue():
    assert port_plan(INTF, None, MTU, pfc_queue()).tc == []


def test_ebpf_path_keeps_the_bfifo_and_attaches_the_marker_beside_it():
    queue = QueueConfig(90_000, StepEcn(K_BYTES))
    plan = port_plan(INTF, RATE_MBIT, MTU, queue, "ebpf", ifindex=IFINDEX, obj=OBJ)
    assert plan.tc == [
        "qdisc replace dev l0-eth3 root handle 5: htb default 1",
        HTB_LINK,
        "qdisc replace dev l0-eth3 parent 5:1 handle 10: bfifo limit 90000",
        *MARKER,
    ]
    # zeroed state, counters, depth sample and anchor, then the config that switches it on
    assert [argv[4].rsplit("/", 1)[1] for argv in plan.bpftool] == [
        "ecn_state", "ecn_counters", "ecn_qdepth", "ecn_anchor", "ecn_config"]
    key = plan.bpftool[-1][plan.bpftool[-1].index("key") + 2:][:4]
    assert bytes(int(b, 16) for b in key) == struct.pack("=I", IFINDEX)
    assert config_of(plan.bpftool) == {"rate_bytes_per_s": 2_500_000, "limit_bytes": 90_000,
                                       "mode": MODE_STEP, "k_bytes": K_BYTES, "kmin_bytes": 0,
                                       "kmax_bytes": 0, "pmax": 0}


def test_ebpf_path_without_ecn_only_counts():
    plan = port_plan(INTF, RATE_MBIT, MTU, QueueConfig(BUFFER_BYTES), "ebpf", ifindex=IFINDEX,
                     obj=OBJ)
    assert plan.tc[-2:] == MARKER
    assert config_of(plan.bpftool)["mode"] == MODE_OFF


def test_red_path_puts_red_where_the_buffer_goes_once():
    plan = port_plan(INTF, RATE_MBIT, MTU, QueueConfig(BUFFER_BYTES, StepEcn(K_BYTES)),
                     "red-qdisc", ifindex=IFINDEX)
    assert plan.tc == [
        "qdisc replace dev l0-eth3 root handle 5: htb default 1",
        HTB_LINK,
        f"qdisc replace dev l0-eth3 parent 5:1 handle 10: {RED}",
    ]
    assert plan.bpftool == []
    # without ECN the RED path keeps the bfifo, at the queue's size
    assert port_plan(INTF, RATE_MBIT, MTU, QueueConfig(90_000), "red-qdisc").tc[-1] == \
        "qdisc replace dev l0-eth3 parent 5:1 handle 10: bfifo limit 90000"


def test_class_queues_without_marking_as_a_hosts_nic_has_them():
    assert port_plan(INTF, RATE_MBIT, MTU, pfc_queue()).tc == [
        "qdisc replace dev l0-eth3 root handle 5: htb default 10",  # htb reads hex: 5:10
        HTB_LINK_CLASSES,
        CLASS.format(minor="10"),
        "qdisc replace dev l0-eth3 parent 5:10 handle 20: bfifo limit 125000",
        CLASS.format(minor="13"),
        "qdisc replace dev l0-eth3 parent 5:13 handle 23: tbf rate 20000kbit burst 1564 "
        "limit 125000",
        CLASS.format(minor="16"),
        "qdisc replace dev l0-eth3 parent 5:16 handle 26: bfifo limit 125000",
        *FILTERS,
    ]


def test_class_queues_on_the_red_path_mark_in_every_class_and_inside_the_lossless_tbf():
    plan = port_plan(INTF, RATE_MBIT, MTU, pfc_queue(StepEcn(K_BYTES)), "red-qdisc")
    assert plan.tc == [
        "qdisc replace dev l0-eth3 root handle 5: htb default 10",
        HTB_LINK_CLASSES,
        CLASS.format(minor="10"),
        f"qdisc replace dev l0-eth3 parent 5:10 handle 20: {RED}",
        CLASS.format(minor="13"),
        "qdisc replace dev l0-eth3 parent 5:13 handle 23: tbf rate 20000kbit burst 1564 "
        "limit 125000",
        f"qdisc add dev l0-eth3 parent 23:1 handle 33: {RED}",  # the tbf stays for pausing
        CLASS.format(minor="16"),
        f"qdisc replace dev l0-eth3 parent 5:16 handle 26: {RED}",
        *FILTERS,
    ]


def test_class_queues_on_the_ebpf_path_get_one_marker_for_the_port():
    plan = port_plan(INTF, RATE_MBIT, MTU, pfc_queue(StepEcn(K_BYTES)), "ebpf",
                     ifindex=IFINDEX, obj=OBJ)
    assert plan.tc == port_plan(INTF, RATE_MBIT, MTU, pfc_queue()).tc + MARKER
    assert config_of(plan.bpftool)["limit_bytes"] == BUFFER_BYTES  # the port's whole buffer


def test_an_impaired_port_puts_netem_at_the_root_and_its_queue_under_it():
    impairment = Impairment(delay_ms=10, jitter_ms=2, loss_percent=0.5)
    plan = port_plan(INTF, RATE_MBIT, MTU, QueueConfig(BUFFER_BYTES, StepEcn(K_BYTES)),
                     "red-qdisc", impairment)
    # limit: 12 ms of 2.5 MB/s is 30000 B, times 8 arriving ports, in 64-byte frames: 3750
    assert plan.tc == [
        "qdisc replace dev l0-eth3 root handle 1: netem limit 3750 delay 10ms 2ms loss 0.5%",
        "qdisc replace dev l0-eth3 parent 1:1 handle 5: htb default 1",
        HTB_LINK,
        f"qdisc replace dev l0-eth3 parent 5:1 handle 10: {RED}",
    ]
    # everything under the HTB is what the unimpaired port has
    plain = port_plan(INTF, RATE_MBIT, MTU, pfc_queue(), None)
    impaired = port_plan(INTF, RATE_MBIT, MTU, pfc_queue(), None, Impairment(delay_ms=1))
    assert impaired.tc[2:] == plain.tc[1:]


def test_an_unshaped_impaired_link_is_netem_alone():
    assert port_plan("s0-eth1", None, MTU, impairment=Impairment(loss_percent=1)).tc == [
        "qdisc replace dev s0-eth1 root handle 1: netem limit 1000 loss 1%"]
    # 5 ms at a veth's 20 Gbit/s (2.5 GB/s) is 12.5 MB, times 8, in 64-byte frames
    delayed = port_plan("s0-eth1", None, MTU, impairment=Impairment(delay_ms=5)).tc
    assert delayed == ["qdisc replace dev s0-eth1 root handle 1: netem limit 1562500 delay 5ms"]


def test_netem_values_are_plain_decimals_and_its_limit_never_below_its_default():
    tiny = Impairment(delay_ms=0.25, loss_percent=1e-05)
    assert port_plan(INTF, 1.0, MTU, impairment=tiny).tc[0] == \
        "qdisc replace dev l0-eth3 root handle 1: netem limit 1000 delay 0.25ms loss 0.00001%"
    assert netem_limit_packets(1.0, tiny) == NETEM_DEFAULT_LIMIT_PACKETS


@pytest.mark.parametrize(("fields", "field"), [
    ({}, "impairment"), ({"jitter_ms": 1, "loss_percent": 1}, "jitter_ms"),
    ({"delay_ms": -1}, "delay_ms"), ({"loss_percent": 101}, "loss_percent"),
    ({"delay_ms": True}, "delay_ms"),
])
def test_impairments_that_make_no_sense_are_refused(fields, field):
    with pytest.raises(ConfigError) as err:
        Impairment(**fields)
    assert err.value.field == field


def test_a_port_plan_refuses_what_it_cannot_plan():
    with pytest.raises(ConfigError):
        port_plan(INTF, RATE_MBIT, MTU, QueueConfig(BUFFER_BYTES), "pie")
    with pytest.raises(ValueError):
        port_plan(INTF, RATE_MBIT, MTU, None, "red-qdisc")  # nothing to mark
    with pytest.raises(ValueError):
        port_plan(INTF, RATE_MBIT, MTU, QueueConfig(BUFFER_BYTES), "ebpf")  # no ifindex
    with pytest.raises(ConfigError):  # a batch line is split on blanks
        port_plan(INTF, RATE_MBIT, MTU, QueueConfig(BUFFER_BYTES), "ebpf", ifindex=1,
                  obj=Path("/home/a b/ecn_marker.o"))


# --- handles ------------------------------------------------------------------------------------


def test_handles_by_hand():
    assert (Handles.class_id(3), Handles.class_id_number(3)) == ("5:13", 0x50013)
    assert (Handles.leaf(3), Handles.leaf_major(3)) == ("23:", 0x23)
    assert (Handles.inner(3), Handles.inner_parent(3)) == ("33:", "23:1")
    assert Handles.class_id(7) == "5:17" and Handles.leaf(0) == "20:"


def test_no_two_parts_of_a_tree_share_a_handle():
    fixed = [Handles.IMPAIRMENT, Handles.HTB, Handles.BUFFER]
    per_class = [f(p) for f in (Handles.leaf, Handles.inner) for p in range(PFC_CLASSES)]
    assert len(set(fixed + per_class)) == len(fixed) + len(per_class)
    class_ids = [Handles.class_id(p) for p in range(PFC_CLASSES)]
    assert len(set(class_ids)) == PFC_CLASSES and Handles.LINK_CLASS not in class_ids


def test_buffer_marking_and_lossless_handles_of_a_queue():
    assert Handles.buffers(None) == Handles.buffers(QueueConfig(BUFFER_BYTES)) == {"10:"}
    assert Handles.marking(QueueConfig(BUFFER_BYTES)) == {"10:"}
    assert Handles.buffers(pfc_queue()) == {"20:", "23:", "26:"}
    assert Handles.marking(pfc_queue()) == {"20:", "23:", "26:", "33:"}
    assert Handles.lossless(pfc_queue()) == {"23:"}
    assert Handles.any_buffer() == {"10:", *(f"2{p}:" for p in range(PFC_CLASSES))}


def created_handles(lines: list[str]) -> set[str]:
    return {line.split()[line.split().index("handle") + 1] for line in lines
            if line.startswith("qdisc") and " handle " in line}


def test_the_plans_create_exactly_the_handles_the_readers_look_for():
    queue = pfc_queue(StepEcn(K_BYTES))
    lines = port_plan(INTF, RATE_MBIT, MTU, queue, "red-qdisc", Impairment(delay_ms=1)).tc
    assert created_handles(lines) == {Handles.IMPAIRMENT, Handles.HTB} | Handles.marking(queue)
    plain = port_plan(INTF, RATE_MBIT, MTU, QueueConfig(BUFFER_BYTES), "red-qdisc").tc
    assert created_handles(plain) == {Handles.HTB} | Handles.buffers(None)


def test_the_lossless_tbf_pauses_by_its_rate_alone():
    running = running_tbf(RATE_MBIT, MTU, BUFFER_BYTES)
    assert running == {"rate": "20000kbit", "burst": MTU + 64, "limit": BUFFER_BYTES}
    assert paused_tbf(MTU, BUFFER_BYTES) == {**running, "rate": "1kbit"}


@pytest.mark.parametrize(("rate_mbit", "mtu_bytes", "expected"), [
    (1000.0, 9000, 6_250_000),  # 1 Gbit/s * 50 ms = 6.25 MB
    (100.0, 1500, 625_000),
    (6.0, 9000, 72_000),        # 37 500 B of 50 ms is under 8 jumbo frames
    (6.0, 1500, 37_500),
    (1.0, 1500, 12_000),        # 6 250 B is under 8 frames of 1500
])
def test_default_buffer_bytes(rate_mbit, mtu_bytes, expected):
    assert default_buffer_bytes(rate_mbit, mtu_bytes) == expected
    assert isinstance(default_buffer_bytes(rate_mbit, mtu_bytes), int)


# --- impaired links -----------------------------------------------------------------------------


def test_both_ends_of_an_impaired_link_get_it_and_later_entries_win():
    fabric = three_hosts_one_leaf()
    slow, lossy = Impairment(delay_ms=5), Impairment(loss_percent=1)
    assert link_impairments(fabric, [(["l0", "s0"], slow)]) == {"l0-eth4": slow,
                                                                 "s0-eth1": slow}
    everywhere = link_impairments(fabric, [("all", slow), (["l0h2", "l0"], lossy)])
    assert everywhere == {"l0h0-eth0": slow, "l0-eth1": slow, "l0h1-eth0": slow,
                          "l0-eth2": slow, "l0h2-eth0": lossy, "l0-eth3": lossy,
                          "l0-eth4": slow, "s0-eth1": slow}
    assert link_impairments(fabric, []) == {}
    with pytest.raises(ConfigError):
        link_impairments(fabric, [(["l0h0", "s0"], slow)])  # not cabled together


# --- a fabric -----------------------------------------------------------------------------------


def ifindex_of(fabric):
    names = [intf for _, _, intf, _ in fabric.switch_ends()]
    return lambda intf: 40 + names.index(intf)


def test_a_fabrics_plan_is_every_switch_ends_plan_in_fabric_order():
    fabric = three_hosts_one_leaf()
    queue = QueueConfig(BUFFER_BYTES, StepEcn(K_BYTES))
    impairments = {"l0-eth4": Impairment(delay_ms=5), "l0h0-eth0": Impairment(delay_ms=5)}
    plan = switch_queue_plan(fabric, queue, "ebpf", impairments, ifindex_of(fabric), OBJ)
    assert plan.ports == [Port(intf, 40 + i, RATE_MBIT) for i, intf in enumerate(
        ["l0-eth1", "l0-eth2", "l0-eth3", "l0-eth4", "s0-eth1"])]
    expected = [port_plan(p.intf, RATE_MBIT, MTU, queue, "ebpf", impairments.get(p.intf),
                          p.ifindex, OBJ) for p in plan.ports]
    assert plan.tc == [line for port in expected for line in port.tc]
    assert plan.bpftool == [argv for port in expected for argv in port.bpftool]
    assert plan.tc_batch() == "\n".join(plan.tc) + "\n"
    assert plan.bpftool_batch().splitlines()[0].startswith("map update pinned /sys/fs/bpf/")
    # 5 ms of 2.5 MB/s is 12500 B, times 8 arriving ports, in 64-byte frames: 1562.5
    assert sum(line.endswith("netem limit 1563 delay 5ms") for line in plan.tc) == 1
    assert "l0h0-eth0" not in plan.tc_batch()  # a host's end is its own set-up's


def test_a_fabric_without_a_queue_gets_default_buffers_and_no_marker():
    fabric = three_hosts_one_leaf()
    plan = switch_queue_plan(fabric)
    assert len(plan.tc) == 3 * len(fabric.switch_ends())
    assert plan.bpftool == [] and plan.ports == [] and plan.bpftool_batch() == ""


def test_a_queue_needs_a_shaped_switch_port():
    unshaped = build("line", switches=2)
    with pytest.raises(ConfigError) as err:
        switch_queue_plan(unshaped, QueueConfig(BUFFER_BYTES), "ebpf", ifindex=lambda intf: 1)
    assert err.value.field == "queue"
    assert switch_queue_plan(unshaped).tc == []  # no queue: nothing asked


def test_a_hosts_nic_queues_by_class_only_with_classes():
    assert host_queue(None) is None
    assert host_queue(QueueConfig(BUFFER_BYTES, StepEcn(K_BYTES))) is None
    assert host_queue(pfc_queue()) == pfc_queue()
    classes = QueueConfig(BUFFER_BYTES, class_queues=True)
    assert host_queue(classes) is classes
