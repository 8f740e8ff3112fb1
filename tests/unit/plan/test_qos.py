"""Queue profiles, their scaling from the published anchors, PFC frames, the marking plans,
and the eBPF marker itself: compiled for BPF, and its C logic run natively against the
Python rules. No root, nothing loaded into the kernel."""
from __future__ import annotations

import json
import math
import random
import shlex
import shutil
import struct
import subprocess
import itertools
from dataclasses import astuple, dataclass, fields
from pathlib import Path

import pytest
from scapy.contrib.mac_control import MACControlClassBasedFlowControl
from scapy.layers.inet import IP, UDP
from scapy.layers.l2 import ARP, Dot1Q, Ether

import testbed.errors as errors
from testbed.capabilities import Platform, choose_paths, probe_capabilities
from testbed.errors import ConfigError
from testbed.plan import ecn_plan, profiles, scaling
from testbed.plan.ecn_plan import (
    BPF_SOURCE,
    CONFIG_LAYOUT,
    COUNTERS_LAYOUT,
    MAPS,
    MODE_OFF,
    MODE_RED,
    MODE_STEP,
    MarkerConfig,
    batch_input,
    choose_ecn_path,
    compile_command,
    ebpf_config_commands,
    layout_struct,
    marker_config,
    pinned_map_paths,
    pmax_to_u32,
    queue_bytes_at,
    red_ewma_log,
    red_parameters,
    unpack_value,
)
from testbed.plan.bpf_maps import dump_command, parse_dump
from testbed.plan.pfc_frames import (
    PFC_DST_MAC,
    parse_pfc_frame,
    pause_duration_s,
    pfc_frame,
    quanta_for,
    xoff_frame,
    xon_frame,
)
from testbed.plan.port_queue import port_plan
from testbed.plan.profiles import (
    DEFAULT_CLASSES,
    U32_MAX,
    PfcConfig,
    QueueConfig,
    RedEcn,
    StepEcn,
    TrafficClass,
    anchored_backlog,
    mark_probability,
    virtual_queue_step,
)

REPO = Path(__file__).resolve().parents[3]
SRC_MAC = "02:00:00:00:00:01"
MTU = 1500
PROBABILITY_TOLERANCE = 1e-12
# 802.1Qbb: one quantum is 512 bit times; 65535 quanta last 3.355 ms at 10 GbE
# (docs/references.md).
LONGEST_PAUSE_10G_S = 3.355e-3
LONGEST_PAUSE_TOLERANCE_S = 1e-6
TOOL_TIMEOUT_S = 60


def pfc_queue(**overrides) -> QueueConfig:
    """A valid lossless queue; ``overrides`` replace single fields to break one rule."""
    values = {"buffer_bytes": 100_000, "ecn": RedEcn(5_000, 20_000, 0.01),
              "classes": DEFAULT_CLASSES,
              "pfc": PfcConfig(xoff_bytes=60_000, xon_bytes=50_000, headroom_bytes=30_000)}
    values.update(overrides)
    return QueueConfig(**values)


# --- profiles: every validation path ----------------------------------------------------------

INVALID = [
    # (what, builder, field named in the error)
    ("K of zero", lambda: StepEcn(0), "k_bytes"),
    ("K negative", lambda: StepEcn(-1), "k_bytes"),
    ("K not an integer", lambda: StepEcn(1.5), "k_bytes"),
    ("K a bool", lambda: StepEcn(True), "k_bytes"),
    ("K over 32 bits", lambda: StepEcn(2**32), "k_bytes"),
    ("Kmin negative", lambda: RedEcn(-1, 10, 0.1), "kmin_bytes"),
    ("Kmax zero", lambda: RedEcn(0, 0, 0.1), "kmax_bytes"),
    ("Kmin equal to Kmax", lambda: RedEcn(10, 10, 0.1), "kmin_bytes"),
    ("Kmin above Kmax", lambda: RedEcn(20, 10, 0.1), "kmin_bytes"),
    ("Pmax zero", lambda: RedEcn(0, 10, 0.0), "pmax"),
    ("Pmax negative", lambda: RedEcn(0, 10, -0.5), "pmax"),
    ("Pmax above one", lambda: RedEcn(0, 10, 1.01), "pmax"),
    ("Pmax NaN", lambda: RedEcn(0, 10, math.nan), "pmax"),
    ("XON equal to XOFF", lambda: PfcConfig(100, 100, 10), "pfc.xon_bytes"),
    ("XON above XOFF", lambda: PfcConfig(100, 200, 10), "pfc.xon_bytes"),
    ("XON negative", lambda: PfcConfig(100, -1, 10), "pfc.xon_bytes"),
    ("XOFF zero", lambda: PfcConfig(0, 0, 10), "pfc.xoff_bytes"),
    ("no headroom", lambda: PfcConfig(100, 50, 0), "pfc.headroom_bytes"),
    ("zero quanta", lambda: PfcConfig(100, 50, 10, quanta=0), "pfc.quanta"),
    ("quanta over 16 bits", lambda: PfcConfig(100, 50, 10, quanta=65536), "pfc.quanta"),
    ("no storm threshold", lambda: PfcConfig(100, 50, 10, storm_threshold_ms=0),
     "pfc.storm_threshold_ms"),
    ("priority 8", lambda: TrafficClass(8, "x", (1,)), "classes.x.priority"),
    ("DSCP 64", lambda: TrafficClass(1, "x", (64,)), "classes.x.dscp"),
    ("buffer of zero", lambda: QueueConfig(0), "buffer_bytes"),
    ("K at the buffer", lambda: QueueConfig(10_000, StepEcn(10_000)), "ecn.k_bytes"),
    ("Kmax over the buffer", lambda: QueueConfig(10_000, RedEcn(100, 10_001, 0.1)),
     "ecn.kmax_bytes"),
    ("profile of another type", lambda: QueueConfig(10_000, "dctcp"), "ecn"),
    ("no classes", lambda: QueueConfig(10_000, classes=()), "classes"),
    ("a class of another type", lambda: QueueConfig(10_000, classes=(3,)), "classes"),
    ("priority used twice",
     lambda: QueueConfig(10_000, classes=(TrafficClass(1, "a", (1,)), TrafficClass(1, "b", (2,)))),
     "classes"),
    ("DSCP mapped twice",
     lambda: QueueConfig(10_000, classes=(TrafficClass(1, "a", (1,)), TrafficClass(2, "b", (1,)))),
     "classes"),
    ("PFC without a lossless class",
     lambda: pfc_queue(classes=(TrafficClass(0, "best-effort", (0,)),)), "pfc"),
    ("XOFF over the buffer",
     lambda: pfc_queue(pfc=PfcConfig(100_001, 50_000, 1)), "pfc.xoff_bytes"),
    ("XOFF + headroom over the buffer",
     lambda: pfc_queue(pfc=PfcConfig(60_000, 50_000, 40_001)), "pfc.headroom_bytes"),
    ("marking starts at XOFF",
     lambda: pfc_queue(ecn=RedEcn(60_000, 70_000, 0.01)), "ecn"),
    ("step K above XOFF", lambda: pfc_queue(ecn=StepEcn(65_000)), "ecn"),
]


@pytest.mark.parametrize(("what", "build", "field"), INVALID, ids=[case[0] for case in INVALID])
def test_invalid_settings_raise_one_line_config_errors(what, build, field):
    with pytest.raises(ConfigError) as err:
        build()
    assert err.value.field == field
    assert "\n" not in str(err.value)
    assert str(err.value).startswith(f"{field}: ")


def test_valid_queues_are_accepted():
    queue = pfc_queue()
    assert queue.lossless_priorities == (3,)
    assert QueueConfig(10_000, StepEcn(9_999)).ecn.k_bytes == 9_999
    assert QueueConfig(10_000, RedEcn(0, 10_000, 1.0)).ecn.pmax == 1.0  # Kmax == buffer is fine
    assert QueueConfig(10_000).ecn is None


@pytest.mark.parametrize(("dscp", "priority"), [(26, 3), (48, 6), (0, 0), (46, 0), (63, 0)])
def test_dscp_maps_to_its_class_and_unmapped_values_are_best_effort(dscp, priority):
    assert QueueConfig(10_000).priority_for_dscp(dscp) == priority


def test_dscp_out_of_range_is_refused():
    with pytest.raises(ConfigError):
        QueueConfig(10_000).priority_for_dscp(64)


# --- the marking rule -------------------------------------------------------------------------


def test_step_marks_strictly_above_k():
    step = StepEcn(30_000)
    assert mark_probability(step, 0) == 0.0
    assert mark_probability(step, 30_000) == 0.0
    assert mark_probability(step, 30_001) == 1.0
    assert mark_probability(None, 10**9) == 0.0


def test_red_is_zero_to_kmin_linear_to_pmax_then_one():
    red = RedEcn(5_000, 205_000, 0.01)
    assert mark_probability(red, 0) == 0.0
    assert mark_probability(red, 5_000) == 0.0
    assert mark_probability(red, 105_000) == pytest.approx(0.005, abs=PROBABILITY_TOLERANCE)
    assert mark_probability(red, 55_000) == pytest.approx(0.0025, abs=PROBABILITY_TOLERANCE)
    assert mark_probability(red, 205_000) == pytest.approx(0.01, abs=PROBABILITY_TOLERANCE)
    assert mark_probability(red, 205_001) == 1.0
    sweep = [mark_probability(red, q) for q in range(0, 300_000, 997)]
    assert sweep == sorted(sweep)


def test_negative_queue_is_an_error():
    with pytest.raises(ValueError):
        mark_probability(StepEcn(1), -1)


# --- the virtual FIFO -------------------------------------------------------------------------

RATE_50MBIT_BYTES_PER_S = 6_250_000


def test_virtual_queue_drains_at_the_rate_before_the_packet_joins():
    # 1 ms at 50 Mbit/s drains 6250 B of 10000 B; the 1500 B packet then joins.
    assert virtual_queue_step(10_000, 1_000_000, 1500, RATE_50MBIT_BYTES_PER_S, 100_000) == (
        3_750, 5_250, False, 1_000_000)
    # Idle long enough, the queue is empty and the packet finds nothing.
    assert virtual_queue_step(10_000, 10**9, 1500, RATE_50MBIT_BYTES_PER_S, 100_000) == (
        0, 1_500, False, 10**9)


def test_virtual_queue_drops_like_a_bfifo():
    assert virtual_queue_step(9_000, 0, 1500, RATE_50MBIT_BYTES_PER_S, 10_000) == (
        9_000, 9_000, True, 0)
    assert virtual_queue_step(8_500, 0, 1500, RATE_50MBIT_BYTES_PER_S, 10_000) == (
        8_500, 10_000, False, 0)


def test_arrivals_at_the_rate_hold_one_packet_and_faster_arrivals_build_a_queue():
    gap_ns = 240_000  # 1500 B at 50 Mbit/s
    queue = 0
    for _ in range(100):
        backlog, queue, _, _ = virtual_queue_step(queue, gap_ns, 1500, RATE_50MBIT_BYTES_PER_S,
                                                  10**6)
        assert backlog == 0 and queue == 1500
    queue = 0
    for _ in range(100):  # twice the rate: each packet adds half a packet
        _, queue, _, _ = virtual_queue_step(queue, gap_ns // 2, 1500, RATE_50MBIT_BYTES_PER_S,
                                            10**6)
    assert queue == 1500 + 99 * 750


def test_a_busy_queue_carries_fractions_of_a_byte_from_packet_to_packet():
    # 20 Mbit/s drains 1500.5 B in 600.2 us; 1500 B packets that far apart shrink the queue by
    # half a byte each. Dropping the half byte at every packet would hold it at 40 KB.
    rate, gap_ns, packets = 2_500_000, 600_200, 10_000
    byte_ns = 10**9 // rate  # 400 ns
    queue = 40_000
    for _ in range(packets):
        backlog, queue, _, used_ns = virtual_queue_step(queue, gap_ns, 1500, rate, 10**6)
        carried_ns = gap_ns - used_ns
        assert 0 <= carried_ns < byte_ns  # less than a byte's time waits for the next packet
        gap_ns = 600_200 + carried_ns
    assert abs(queue - (40_000 - packets // 2)) <= 1


RATE_20MBIT_BYTES_PER_S = 2_500_000  # 2.5 B/us: 1 ms drains 2500 B


def test_an_anchor_adds_back_what_arrived_since_the_reading_and_drains_the_rest():
    # read 40 KB at t = 1 s with 1 MB accepted so far; 3000 B accepted since; 1 ms later
    assert anchored_backlog(40_000, 10**9, 10**6, 10**6 + 3_000, 10**9 + 10**6,
                            RATE_20MBIT_BYTES_PER_S, 10**6) == 40_000 + 3_000 - 2_500
    # at the reading's own time nothing has drained
    assert anchored_backlog(40_000, 10**9, 10**6, 10**6, 10**9, RATE_20MBIT_BYTES_PER_S,
                            10**6) == 40_000


def test_an_anchor_never_goes_below_empty_nor_above_the_limit():
    assert anchored_backlog(1_000, 0, 0, 500, 10**6, RATE_20MBIT_BYTES_PER_S, 10**6) == 0
    assert anchored_backlog(90_000, 0, 0, 30_000, 0, RATE_20MBIT_BYTES_PER_S, 100_000) == 100_000


def test_an_anchor_from_the_future_or_a_count_gone_backwards_adds_nothing():
    # user space stamped the reading after the packet read its clock: no drain
    assert anchored_backlog(8_000, 2_000_000, 0, 0, 1_000_000, RATE_20MBIT_BYTES_PER_S,
                            10**6) == 8_000
    # the marker's count below the reading's (its entry was recreated): nothing added back
    assert anchored_backlog(8_000, 0, 5_000, 1_000, 0, RATE_20MBIT_BYTES_PER_S, 10**6) == 8_000


# --- scaling from the anchors -----------------------------------------------------------------


@pytest.mark.parametrize(("rate_mbit", "packets"), [(1000, 20), (10_000, 65)])
def test_dctcp_k_matches_the_paper_at_its_rates(rate_mbit, packets):
    step, record = scaling.dctcp_step(rate_mbit, MTU)
    assert step.k_bytes == packets * 1500
    assert record["decided_by"] == "anchor"
    assert record["anchor_rate_mbit"] == rate_mbit
    assert record["factor"] == pytest.approx(1.0)


def test_dctcp_k_scales_with_the_rate_below_the_anchor():
    step, record = scaling.dctcp_step(500, MTU)
    assert step.k_bytes == 15_000  # same 240 us of queueing as 20 packets at 1 Gbit/s
    assert record["anchor_rate_mbit"] == 1000.0
    assert record["emulated_rate_mbit"] == 500
    assert record["factor"] == pytest.approx(0.5)


def test_dctcp_k_grows_with_the_rate_and_is_continuous_at_the_anchors():
    rates = [10, 50, 100, 300, 999, 1000, 1001, 3000, 9999, 10_000, 10_001, 40_000]
    ks = [scaling.dctcp_step(rate, MTU)[0].k_bytes for rate in rates]
    assert ks == sorted(ks)
    for rate in (1000, 10_000):
        below = scaling.dctcp_step(rate - 1, MTU)[0].k_bytes
        above = scaling.dctcp_step(rate + 1, MTU)[0].k_bytes
        assert above - below < 0.01 * below


def test_dctcp_k_respects_the_rtt_bound_and_the_frame_floor():
    step, record = scaling.dctcp_step(1000, MTU, rtt_s=0.010)
    bdp_over_7 = 1000e6 / 8 * 0.010 / 7
    assert step.k_bytes > bdp_over_7 and step.k_bytes == math.floor(bdp_over_7) + 1
    assert record["decided_by"] == "rtt" and record["rtt_s"] == 0.010
    step, record = scaling.dctcp_step(50, 9000)
    assert step.k_bytes == scaling.MIN_THRESHOLD_FRAMES * 9000
    assert record["decided_by"] == "frames"
    assert record["scaled_value"] == pytest.approx(1500.0)


def test_dcqcn_matches_the_paper_at_40_gbit_and_scales_with_the_rate():
    red, records = scaling.dcqcn_red(40_000, MTU)
    assert (red.kmin_bytes, red.kmax_bytes, red.pmax) == (5_000, 200_000, 0.01)
    assert all(r["decided_by"] == "anchor" and r["anchor_rate_mbit"] == 40_000 for r in records)
    red, records = scaling.dcqcn_red(10_000, MTU)
    assert (red.kmin_bytes, red.kmax_bytes, red.pmax) == (3_000, 50_000, 0.01)
    by_parameter = {r["parameter"]: r for r in records}
    assert by_parameter["kmin_bytes"]["decided_by"] == "frames"  # 1250 B is under 2 frames
    assert by_parameter["kmax_bytes"]["factor"] == pytest.approx(0.25)


def test_dcqcn_floors_keep_a_ramp_at_emulated_rates():
    red, records = scaling.dcqcn_red(100, MTU)
    assert red.kmin_bytes == scaling.MIN_THRESHOLD_FRAMES * MTU
    assert red.kmax_bytes == red.kmin_bytes + scaling.MIN_RAMP_FRAMES * MTU
    assert [r["decided_by"] for r in records] == ["frames", "frames", "anchor"]


def test_pfc_headroom_formula():
    # 1 Gbit/s, 1 ms reaction per end, no cable: 2 * 125 MB/s * 1 ms + 2 MTU + pause frame.
    assert scaling.pfc_headroom_bytes(1000, MTU, 0.0, 0.001) == 250_000 + 3_000 + 64
    # 10 Gbit/s, 100 m of fibre (0.5 us), 1 us reaction: 2 * 1.25 GB/s * 1.5 us = 3750 B.
    assert scaling.pfc_headroom_bytes(10_000, MTU, 0.5e-6, 1e-6) == 3_750 + 3_000 + 64
    with pytest.raises(ConfigError):
        scaling.pfc_headroom_bytes(1000, MTU, -1.0, 0.0)


def test_pfc_thresholds_fill_the_buffer_up_to_the_headroom():
    config, record = scaling.pfc_thresholds(100, MTU, 625_000)
    assert config.xoff_bytes + config.headroom_bytes == 625_000
    assert config.xon_bytes == config.xoff_bytes - scaling.XON_HYSTERESIS_FRAMES * MTU
    assert config.quanta == profiles.MAX_PAUSE_QUANTA
    assert record["value"] == config.headroom_bytes
    with pytest.raises(ConfigError) as err:
        scaling.pfc_thresholds(1000, MTU, 100_000)  # 253 KB of headroom needed
    assert err.value.field == "buffer_bytes"


def test_scaled_queue_configs_and_their_records():
    queue, record = scaling.scaled_queue_config("dcqcn", 100, MTU, 625_000)
    assert isinstance(queue.ecn, RedEcn) and queue.pfc is not None
    assert [r["parameter"] for r in record["ecn"]] == ["kmin_bytes", "kmax_bytes", "pmax"]
    assert "pfc" in record
    json.dumps(record)  # goes into the run's results as it is
    queue, record = scaling.scaled_queue_config("dctcp", 1000, MTU, 6_250_000)
    assert queue.ecn == StepEcn(30_000) and queue.pfc is None and "pfc" not in record
    queue, _ = scaling.scaled_queue_config("dcqcn", 100, MTU, 625_000, pfc=False)
    assert queue.pfc is None
    with pytest.raises(ConfigError):
        scaling.scaled_queue_config("timely", 100, MTU, 625_000)


# --- PFC frames -------------------------------------------------------------------------------


def test_pfc_frame_layout_on_the_wire():
    data = pfc_frame(SRC_MAC, {3: 0xFFFF, 6: 0x1234})
    assert len(data) == 60  # 64 with the FCS the NIC appends
    assert data[0:6] == bytes.fromhex("0180c2000001")
    assert data[6:12] == bytes.fromhex("020000000001")
    assert data[12:14] == b"\x88\x08"  # MAC Control
    assert data[14:16] == b"\x01\x01"  # class-based flow control
    assert struct.unpack("!H", data[16:18])[0] == (1 << 3) | (1 << 6)  # class-enable vector
    times = struct.unpack("!8H", data[18:34])
    assert times == (0, 0, 0, 0xFFFF, 0, 0, 0x1234, 0)
    assert data[34:] == bytes(26)  # padding


def test_pfc_frames_decode_back_with_scapy():
    frame = Ether(xoff_frame(SRC_MAC, [3, 5]))
    layer = frame[MACControlClassBasedFlowControl]
    assert (frame.dst, frame.src, frame.type) == (PFC_DST_MAC, SRC_MAC, 0x8808)
    assert layer._op_code == 0x0101
    assert [getattr(layer, f"c{c}_enabled") for c in range(8)] == [0, 0, 0, 1, 0, 1, 0, 0]
    assert layer.c3_pause_time == layer.c5_pause_time == 0xFFFF
    decoded = parse_pfc_frame(xon_frame(SRC_MAC, [3]))
    assert decoded.pause_quanta == {3: 0} and decoded.src_mac == SRC_MAC
    assert parse_pfc_frame(pfc_frame(SRC_MAC, {0: 7, 7: 9})).pause_quanta == {0: 7, 7: 9}
    assert parse_pfc_frame(bytes(Ether(src=SRC_MAC) / ARP())) is None


@pytest.mark.parametrize(("src", "quanta"), [
    ("02:00:00:00:00", {3: 1}), ("zz:00:00:00:00:01", {3: 1}), (SRC_MAC, {}),
    (SRC_MAC, {8: 1}), (SRC_MAC, {3: 65536}), (SRC_MAC, {3: -1})])
def test_bad_pfc_frames_are_refused(src, quanta):
    with pytest.raises(ConfigError):
        pfc_frame(src, quanta)


@pytest.mark.parametrize("rate_mbit", [10, 50, 100, 1000, 10_000, 40_000, 100_000])
@pytest.mark.parametrize("quanta", [0, 1, 2, 255, 4096, 65535])
def test_quanta_and_time_round_trip(rate_mbit, quanta):
    duration = pause_duration_s(quanta, rate_mbit)
    assert duration == pytest.approx(quanta * 512 / (rate_mbit * 1e6))
    assert quanta_for(duration, rate_mbit) == quanta


def test_pause_times_at_known_rates():
    assert pause_duration_s(65535, 10_000) == pytest.approx(LONGEST_PAUSE_10G_S,
                                                            abs=LONGEST_PAUSE_TOLERANCE_S)
    assert pause_duration_s(1, 1000) == pytest.approx(512e-9)
    assert quanta_for(513e-9, 1000) == 2  # rounds up: the pause lasts at least as asked
    with pytest.raises(ConfigError):
        quanta_for(0.01, 10_000)  # over 65535 quanta
    with pytest.raises(ConfigError):
        quanta_for(-1e-6, 10_000)


# --- plans ------------------------------------------------------------------------------------


def dev_vm_platform(**tools) -> Platform:
    """The stripped kernel: no RED, cls_bpf built in."""
    kconfig = {"CONFIG_MODULES": "n", "CONFIG_NET_SCH_RED": "n", "CONFIG_NET_CLS_BPF": "y",
               "CONFIG_NET_SCH_HTB": "y"}
    return _platform(kconfig, tools)


def stock_platform(**tools) -> Platform:
    """A stock kernel: RED and cls_bpf both built in."""
    return _platform({"CONFIG_NET_SCH_RED": "y", "CONFIG_NET_CLS_BPF": "y"}, tools)


def _platform(kconfig: dict[str, str], tools: dict[str, bool]) -> Platform:
    present = {"tc": True, "clang": True, "bpftool": True, **tools}
    caps = probe_capabilities(kconfig, set(), set(), set(), present)
    return Platform("test", caps, choose_paths(caps))


def test_the_path_follows_the_capabilities_report():
    assert choose_ecn_path(dev_vm_platform()) == "ebpf"
    assert choose_ecn_path(stock_platform()) == "red-qdisc"
    assert choose_ecn_path(stock_platform(), prefer="ebpf") == "ebpf"
    assert choose_ecn_path(dev_vm_platform(clang=False), object_built=True) == "ebpf"


@pytest.mark.parametrize(("report", "prefer", "error"), [
    (dev_vm_platform(), "red-qdisc", errors.TestbedError),
    (dev_vm_platform(clang=False), None, errors.TestbedError),
    (dev_vm_platform(tc=False), None, errors.TestbedError),
    (dev_vm_platform(bpftool=False), None, errors.TestbedError),
    (stock_platform(tc=False), None, errors.TestbedError),
    (_platform({"CONFIG_NET_CLS_BPF": "n"}, {}), None, errors.TestbedError),
    (dev_vm_platform(), "pie", ConfigError),
])
def test_a_path_the_machine_cannot_take_is_refused(report, prefer, error):
    with pytest.raises(error):
        choose_ecn_path(report, prefer=prefer)


def test_config_layout_matches_the_dataclass():
    assert [f.name for f in fields(MarkerConfig)] == [name for name, _ in CONFIG_LAYOUT]


@pytest.mark.parametrize(("ecn", "expected"), [
    (StepEcn(30_000), {"mode": MODE_STEP, "k_bytes": 30_000}),
    (RedEcn(5_000, 200_000, 0.01),
     {"mode": MODE_RED, "kmin_bytes": 5_000, "kmax_bytes": 200_000, "pmax": 42_949_673}),
    (None, {"mode": MODE_OFF}),
])
def test_marker_config_from_a_queue(ecn, expected):
    config = marker_config(100, QueueConfig(625_000, ecn))
    assert config.rate_bytes_per_s == 12_500_000
    assert config.limit_bytes == 625_000
    assert {k: v for k, v in vars(config).items() if k in expected} == expected


def test_pmax_as_a_32_bit_fraction():
    assert pmax_to_u32(0.01) / 2**32 == pytest.approx(0.01, abs=2**-32)
    assert pmax_to_u32(1.0) == U32_MAX
    assert pmax_to_u32(0.5) == 2**31


def hex_after(argv: list[str], word: str, count: int) -> bytes:
    start = argv.index(word) + 2  # skip "hex"
    return bytes(int(byte, 16) for byte in argv[start:start + count])


def test_ebpf_plan_attaches_then_writes_the_port_entry_last():
    queue = QueueConfig(625_000, RedEcn(3_000, 9_000, 0.01))
    obj = Path("/opt/tb/ecn_marker.o")
    plan = port_plan("s1-eth2", 100, MTU, queue, "ebpf", ifindex=42, obj=obj)
    assert plan.tc[-2] == "qdisc replace dev s1-eth2 clsact"
    assert plan.tc[-1].split()[-6:] == ["bpf", "da", "obj", str(obj), "sec", "classifier"]
    updates = plan.bpftool
    assert updates == ebpf_config_commands(42, marker_config(100, queue))
    assert [argv[4].rsplit("/", 1)[1] for argv in updates] == [
        "ecn_state", "ecn_counters", "ecn_qdepth", "ecn_anchor", "ecn_config"]
    for argv in updates:
        assert argv[:4] == ["bpftool", "map", "update", "pinned"]
        assert hex_after(argv, "key", 4) == struct.pack("=I", 42)
    config_argv = updates[-1]
    value = hex_after(config_argv, "value", layout_struct(CONFIG_LAYOUT).size)
    assert unpack_value(CONFIG_LAYOUT, value) == vars(marker_config(100, queue))
    for argv in updates[:-1]:  # fresh state, counters, an anchor of seq 0 (none): all zero
        name = argv[4].rsplit("/", 1)[1]
        assert hex_after(argv, "value", layout_struct(MAPS[name]).size) == bytes(
            layout_struct(MAPS[name]).size)
    assert all(isinstance(arg, str) and arg and " " not in arg for argv in updates for arg in argv)


def red_line(queue: QueueConfig) -> list[str]:
    """The words of the buffer line of a port marked on the RED path."""
    return port_plan("s1-eth2", 100, MTU, queue, "red-qdisc").tc[-1].split()


def test_red_plan_makes_the_buffer_red_ecn():
    argv = red_line(QueueConfig(625_000, RedEcn(3_000, 9_000, 0.01)))
    # made as RED from the start: the kernel refuses to turn a bfifo into RED in place
    assert argv[:9] == ["qdisc", "replace", "dev", "s1-eth2", "parent", "5:1", "handle", "10:",
                        "red"]
    options = dict(zip(argv[9::2], argv[10::2]))
    assert options["limit"] == "625000" and options["min"] == "3000" and options["max"] == "9000"
    assert options["probability"] == "0.01" and options["bandwidth"] == "100mbit"
    assert argv[-2:] == ["ecn", "nodrop"]
    argv = red_line(QueueConfig(625_000, StepEcn(30_000)))
    options = dict(zip(argv[9::2], argv[10::2]))
    assert (options["min"], options["max"], options["probability"]) == ("30000", "30001", "1.0")
    assert red_line(QueueConfig(625_000))[8:] == ["bfifo", "limit", "625000"]  # no ECN


def test_red_parameters_are_ones_tc_accepts():
    for profile in (StepEcn(3_001), StepEcn(30_000), RedEcn(3_000, 9_000, 0.01),
                    RedEcn(5_000, 200_000, 0.01)):
        red = red_parameters(profile, MTU)
        assert red.ewma_log == red_ewma_log(red.min_bytes, red.burst, MTU)
        assert 1 <= red.ewma_log < 32
    assert red_ewma_log(1_000, 1, 1500) is None  # tc: "burst 1 is too small"
    assert red_ewma_log(30_000, 5, 1500) is None  # burst + 1 - 20 < 1
    with pytest.raises(ConfigError):
        red_parameters(StepEcn(1_000), MTU)  # a threshold under one packet


def test_unknown_path_is_refused():
    with pytest.raises(ConfigError):
        port_plan("s1-eth2", 100, MTU, QueueConfig(625_000), "pie", ifindex=42)


def test_rates_the_marker_cannot_hold_are_refused():
    with pytest.raises(ConfigError):
        marker_config(40_000, QueueConfig(625_000))  # 5 GB/s overflows the 32-bit rate


def test_parse_dump_reads_raw_bytes_signed_fields_included():
    counters = dict.fromkeys((name for name, _ in COUNTERS_LAYOUT), 0)
    counters.update(packets=1000, ce_marks=17, max_queue_bytes=45_000, anchors=3,
                    anchor_error_bytes=-4_500, anchor_abs_error_bytes=7_500)
    value = ecn_plan.pack_value(COUNTERS_LAYOUT, counters)
    dump = [{"key": [f"0x{b:02x}" for b in struct.pack("=I", 9)],
             "value": [f"0x{b:02x}" for b in value],
             "formatted": {"key": 9, "value": counters}}]
    assert parse_dump(COUNTERS_LAYOUT, json.dumps(dump)) == {9: counters}
    assert parse_dump(COUNTERS_LAYOUT, "") == {}
    assert dump_command("ecn_counters")[-1] == "/sys/fs/bpf/tc/globals/ecn_counters"


def test_the_anchor_map_is_pinned_and_cleaned_with_the_others():
    assert "/sys/fs/bpf/tc/globals/ecn_anchor" in map(str, pinned_map_paths())
    assert [name for name, _ in MAPS["ecn_anchor"]] == [
        "lock", "pad", "backlog_bytes", "time_ns", "accepted_bytes", "seq"]
    assert MAPS["ecn_qdepth"][-1] == ("accepted_bytes", "Q")
    assert MAPS["ecn_state"][-1] == ("anchor_seq", "Q")


def test_queue_drains_between_samples():
    sample = {"queue_bytes": 10_000, "time_ns": 5_000_000}
    assert queue_bytes_at(sample, RATE_50MBIT_BYTES_PER_S, 6_000_000) == 3_750
    assert queue_bytes_at(sample, RATE_50MBIT_BYTES_PER_S, 4_000_000) == 10_000
    assert queue_bytes_at(sample, RATE_50MBIT_BYTES_PER_S, 10**10) == 0


def test_batch_input():
    commands = [["tc", "qdisc", "replace", "dev", "s1-eth1", "clsact"],
                ["tc", "filter", "replace", "dev", "s1-eth1", "egress", "bpf", "da", "obj",
                 "/x/ecn.o"]]
    text = batch_input(commands, "tc")
    assert text.splitlines() == ["qdisc replace dev s1-eth1 clsact",
                                 "filter replace dev s1-eth1 egress bpf da obj /x/ecn.o"]
    with pytest.raises(ValueError):
        batch_input([["tc", "filter", "obj", "/a b/ecn.o"]], "tc")
    with pytest.raises(ValueError):
        batch_input(commands, "bpftool")


# --- the eBPF program -------------------------------------------------------------------------


def require_tool(name: str) -> str:
    """A tool the eBPF toolchain needs: missing is a failure (scripts/install.sh installs it)."""
    path = shutil.which(name)
    if path is None:
        pytest.fail(f"{name} is not installed; scripts/install.sh installs clang, llvm and "
                    "libbpf-dev")
    return path


def run_tool(argv: list[str], **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run(argv, capture_output=True, text=True, timeout=TOOL_TIMEOUT_S, **kwargs)


def test_marker_compiles_for_bpf_cleanly(tmp_path):
    require_tool("clang")
    obj = tmp_path / "ecn_marker.o"
    out = run_tool(compile_command(BPF_SOURCE, obj))
    assert out.returncode == 0, out.stderr
    assert out.stderr == ""  # no warnings
    require_tool("llvm-objdump")
    sections = run_tool(["llvm-objdump", "-h", str(obj)]).stdout
    for section in ("classifier", ".maps", "license", ".BTF"):
        assert f" {section} " in sections
    assert ".rodata" not in sections  # nothing for tc to create per attach
    symbols = run_tool(["llvm-objdump", "-t", str(obj)]).stdout
    for name in MAPS:
        assert any(line.split()[-1:] == [name] and ".maps" in line
                   for line in symbols.splitlines())
    license_dump = run_tool(["llvm-objdump", "-s", "-j", "license", str(obj)]).stdout
    assert "GPL." in license_dump


def test_c_structs_match_the_python_layouts(tmp_path):
    require_tool("clang")
    checks = []
    for struct_name, layout in MAPS.items():
        offset = 0
        for field, code in layout:
            if field not in ("lock",):
                checks.append(f"_Static_assert(offsetof(struct {struct_name}, {field}) == "
                              f"{offset}, \"{struct_name}.{field}\");")
            offset += struct.calcsize("=" + code)
        checks.append(f"_Static_assert(sizeof(struct {struct_name}) == {offset}, "
                      f"\"sizeof {struct_name}\");")
    wrapper = tmp_path / "layout.c"
    wrapper.write_text(f'#include "{BPF_SOURCE}"\n' + "\n".join(checks) + "\n")
    out = run_tool(compile_command(wrapper, tmp_path / "layout.o"))
    assert out.returncode == 0, out.stderr


def test_makefile_builds_with_the_same_command(tmp_path):
    require_tool("make")
    out = run_tool(["make", "-s", "-n", "-B", "-C", str(REPO), "bpf", f"BPF_BUILD={tmp_path}"])
    assert out.returncode == 0, out.stderr
    clang_lines = [shlex.split(line) for line in out.stdout.splitlines()
                   if line.startswith("clang ")]
    assert clang_lines == [compile_command(Path(f"testbed/apply/bpf/{name}.c"),
                                           tmp_path / f"{name}.o")
                           for name in ("ecn_marker", "loss")]


# The marker's C, compiled for this machine with the BPF helpers replaced by plain functions
# over one packet buffer and a small map table, so its logic runs against the Python rules.
NATIVE_HARNESS = r"""
#include <stdio.h>
#include <string.h>
#include <linux/bpf.h>
#define __BPF_HELPERS__  /* libbpf's helper stubs call into the kernel: replaced below */
#define SEC(name)
#define __uint(name, val) int (*name)[val]
#define __type(name, val) __typeof__(val) *name
#define __always_inline inline __attribute__((always_inline))
enum { LIBBPF_PIN_NONE, LIBBPF_PIN_BY_NAME };
static void *bpf_map_lookup_elem(void *map, const void *key);
static long bpf_map_update_elem(void *map, const void *key, const void *value, __u64 flags);
static __u64 bpf_ktime_get_ns(void);
static __u32 bpf_get_prandom_u32(void);
static long bpf_spin_lock(struct bpf_spin_lock *lock) { (void)lock; return 0; }
static long bpf_spin_unlock(struct bpf_spin_lock *lock) { (void)lock; return 0; }
static long bpf_skb_load_bytes(const void *skb, __u32 off, void *to, __u32 len);
static long bpf_skb_store_bytes(struct __sk_buff *skb, __u32 off, const void *from, __u32 len,
                                __u64 flags);
static long bpf_l3_csum_replace(struct __sk_buff *skb, __u32 off, __u64 from, __u64 to,
                                __u64 size);
#include "ECN_MARKER_C"

static unsigned char pkt[256];
static unsigned pkt_len;
static __u64 now_ns;
static __u32 rnd;
struct slot { void *map; __u32 key; int used; unsigned char value[128]; };
static struct slot slots[64];

static size_t value_size(void *map)
{
	if (map == &ecn_config) return sizeof(struct ecn_config);
	if (map == &ecn_state) return sizeof(struct ecn_state);
	if (map == &ecn_counters) return sizeof(struct ecn_counters);
	if (map == &ecn_anchor) return sizeof(struct ecn_anchor);
	return sizeof(struct ecn_qdepth);
}
static struct slot *find(void *map, __u32 key)
{
	for (int i = 0; i < 64; i++)
		if (slots[i].used && slots[i].map == map && slots[i].key == key) return &slots[i];
	return NULL;
}
static void *bpf_map_lookup_elem(void *map, const void *key)
{
	struct slot *s = find(map, *(const __u32 *)key);
	return s ? s->value : NULL;
}
static long bpf_map_update_elem(void *map, const void *key, const void *value, __u64 flags)
{
	struct slot *s = find(map, *(const __u32 *)key);
	if (s && flags == BPF_NOEXIST) return -17;
	for (int i = 0; !s && i < 64; i++)
		if (!slots[i].used) s = &slots[i];
	s->used = 1; s->map = map; s->key = *(const __u32 *)key;
	memcpy(s->value, value, value_size(map));
	return 0;
}
static __u64 bpf_ktime_get_ns(void) { return now_ns; }
static __u32 bpf_get_prandom_u32(void) { return rnd; }
static long bpf_skb_load_bytes(const void *skb, __u32 off, void *to, __u32 len)
{
	(void)skb;
	if (off + len > pkt_len) return -14;
	memcpy(to, pkt + off, len);
	return 0;
}
static long bpf_skb_store_bytes(struct __sk_buff *skb, __u32 off, const void *from, __u32 len,
                                __u64 flags)
{
	(void)skb; (void)flags;
	if (off + len > pkt_len) return -14;
	memcpy(pkt + off, from, len);
	return 0;
}
/* The kernel's csum_replace2 on the 16-bit field at off: ones' complement, in the packet's
 * own byte order, as the helper does. */
static long bpf_l3_csum_replace(struct __sk_buff *skb, __u32 off, __u64 from, __u64 to,
                                __u64 size)
{
	__u16 check;
	__u32 sum;
	(void)skb;
	if (size != 2 || off + 2 > pkt_len) return -22;
	memcpy(&check, pkt + off, 2);
	sum = (__u16)~check + (__u16)~(__u16)from + (__u16)to;
	sum = (sum & 0xffff) + (sum >> 16);
	sum = (sum & 0xffff) + (sum >> 16);
	check = ~(__u16)sum;
	memcpy(pkt + off, &check, 2);
	return 0;
}

/* Input: the config line, then one event a line: "P ifindex now len rnd frame-hex" a packet,
 * "A ifindex backlog time accepted seq" an anchor written as user space writes it. */
int main(void)
{
	char hex[600], tag[2];
	unsigned ifindex, wire_len;
	struct ecn_config cfg = {0};
	__u32 key;

	if (scanf("%u %llu %u %u %u %u %u %u", &key, (unsigned long long *)&cfg.rate_bytes_per_s,
		  &cfg.limit_bytes, &cfg.mode, &cfg.k_bytes, &cfg.kmin_bytes, &cfg.kmax_bytes,
		  &cfg.pmax) != 8)
		return 2;
	bpf_map_update_elem(&ecn_config, &key, &cfg, BPF_ANY);
	while (scanf("%1s", tag) == 1) {
		struct __sk_buff skb = {0};
		if (tag[0] == 'A') {
			struct ecn_anchor a = {0};
			if (scanf("%u %llu %llu %llu %llu", &ifindex,
				  (unsigned long long *)&a.backlog_bytes,
				  (unsigned long long *)&a.time_ns,
				  (unsigned long long *)&a.accepted_bytes,
				  (unsigned long long *)&a.seq) != 5)
				return 5;
			bpf_map_update_elem(&ecn_anchor, &ifindex, &a, BPF_ANY);
			continue;
		}
		if (tag[0] != 'P' || scanf("%u %llu %u %u %599s", &ifindex,
					   (unsigned long long *)&now_ns, &wire_len, &rnd, hex) != 5)
			return 6;
		pkt_len = strlen(hex) / 2;
		for (unsigned i = 0; i < pkt_len; i++) sscanf(hex + 2 * i, "%2hhx", &pkt[i]);
		skb.ifindex = ifindex;
		skb.len = wire_len;
		if (ecn_marker(&skb) != TC_ACT_OK) return 3;
		for (unsigned i = 0; i < pkt_len; i++) printf("%02x", pkt[i]);
		printf("\n");
	}
	struct ecn_counters *c = bpf_map_lookup_elem(&ecn_counters, &key);
	struct ecn_qdepth *d = bpf_map_lookup_elem(&ecn_qdepth, &key);
	struct ecn_state *st = bpf_map_lookup_elem(&ecn_state, &key);
	if (!c || !d || !st) return 4;
	printf("%llu %llu %llu %llu %llu %llu %llu %llu %llu %lld %llu %llu %llu %llu %llu %llu\n",
	       c->packets, c->bytes, c->ect_packets, c->ce_marks, c->ce_arrived, c->not_ect_over,
	       c->fifo_drops, c->max_queue_bytes, c->anchors, (long long)c->anchor_error_bytes,
	       c->anchor_abs_error_bytes, c->anchor_max_abs_error_bytes, d->queue_bytes,
	       d->time_ns, d->accepted_bytes, st->anchor_seq);
	return 0;
}
"""

PORT = 7
OTHER_PORT = 8  # no config entry: passed through, not counted
LIMIT_BYTES = 30_000
NATIVE_PACKETS = 600
ANCHOR_EVERY = 37  # packets between two readings of the real queue
# How far each reading is from the model's queue at the time, in turn: above and below it,
# over the limit, below empty, equal.
ANCHOR_OFFSETS = (9_000, -4_000, 40_000, -30_000, 0, 1_500, -700)
FUTURE_ANCHOR_NS = 5_000
BYTE_NS_50MBIT = 160  # a byte's time at 50 Mbit/s  # a reading stamped after the packet that applies it


@dataclass(frozen=True)
class Anchor:
    """One write of ``struct ecn_anchor`` by user space."""

    ifindex: int
    backlog_bytes: int
    time_ns: int
    accepted_bytes: int
    seq: int


class MarkerMirror:
    """One port of the marker by the Python rules (``virtual_queue_step``,
    ``anchored_backlog``), packet by packet and anchor by anchor, as the C keeps it."""

    def __init__(self, rate_bytes_per_s: int, limit_bytes: int):
        self.rate, self.limit = rate_bytes_per_s, limit_bytes
        self.queue = self.clock_ns = self.accepted = self.applied_seq = 0
        self.anchor: Anchor | None = None  # the port's entry in ecn_anchor
        self.errors: list[int] = []  # model - anchored, at every anchor applied

    def write_anchor(self, anchor: Anchor) -> None:
        if anchor.ifindex == PORT:
            self.anchor = anchor

    def packet(self, now: int, wire_len: int) -> tuple[int, bool]:
        """The backlog the packet finds and whether the FIFO drops it."""
        elapsed = now - self.clock_ns if now > self.clock_ns else 0
        backlog, after, dropped, used_ns = virtual_queue_step(self.queue, elapsed, wire_len,
                                                              self.rate, self.limit)
        self.clock_ns += used_ns
        a = self.anchor
        if a is not None and a.seq and a.seq != self.applied_seq:
            anchored = anchored_backlog(a.backlog_bytes, a.time_ns, a.accepted_bytes,
                                        self.accepted, now, self.rate, self.limit)
            self.errors.append(backlog - anchored)
            self.applied_seq, self.clock_ns = a.seq, now
            backlog, after, dropped, _ = virtual_queue_step(anchored, 0, wire_len, self.rate,
                                                            self.limit)
        self.queue = after
        if not dropped:
            self.accepted += wire_len
        return backlog, dropped


def run_native_marker(tmp_path: Path, config: MarkerConfig, events: list) -> list[str]:
    """Run the marker's C over ``events`` (packet tuples and ``Anchor`` writes); one output
    line per packet (its frame after the marker), then the port's totals."""
    require_tool("clang")
    harness = tmp_path / "harness.c"
    harness.write_text(NATIVE_HARNESS.replace("ECN_MARKER_C", str(BPF_SOURCE)))
    binary = tmp_path / "harness"
    out = run_tool(["clang", "-O1", "-o", str(binary), str(harness)])
    assert out.returncode == 0, out.stderr
    lines = [f"{PORT} " + " ".join(str(v) for v in astuple(config))]
    for event in events:
        if isinstance(event, Anchor):
            lines.append("A " + " ".join(str(v) for v in astuple(event)))
        else:
            ifindex, now, wire_len, rnd, frame = event
            lines.append(f"P {ifindex} {now} {wire_len} {rnd} {frame.hex()}")
    out = run_tool([str(binary)], input="\n".join(lines) + "\n")
    assert out.returncode == 0, out.stderr
    return out.stdout.split("\n")[:-1]


def with_anchors(packets: list[tuple], config: MarkerConfig, seed: int) -> list:
    """``packets`` with a reading of the real queue written every ``ANCHOR_EVERY`` packets,
    as the anchor agent writes them: stamped between two packets, counting the accepted
    bytes of a packet or two before, with a backlog off the model's by ``ANCHOR_OFFSETS``.
    Now and then a reading from the future, one whose accepted count is ahead of the
    marker's, a reading for a port without a config, and the same seq written again with
    other values (ignored once applied); after the last packet one more reading that no
    packet applies."""
    rng = random.Random(seed)
    mirror = MarkerMirror(config.rate_bytes_per_s, config.limit_bytes)
    offsets = itertools.cycle(ANCHOR_OFFSETS)
    accepted_after: list[int] = [0]  # the port's accepted bytes after each of its packets
    events: list = []
    seq, last_ns = 0, packets[0][1]

    def write(anchor: Anchor) -> None:
        events.append(anchor)
        mirror.write_anchor(anchor)

    for i, packet in enumerate(packets):
        ifindex, now, wire_len, _, _ = packet
        if i and i % ANCHOR_EVERY == 0:
            seq += 1
            n = i // ANCHOR_EVERY
            stale = rng.choice([0, 0, 1, 2])
            accepted = accepted_after[max(0, len(accepted_after) - 1 - stale)]
            time_ns = last_ns + (now - last_ns) // 2
            if n % 7 == 3:
                time_ns = now + FUTURE_ANCHOR_NS
            if n % 11 == 5:
                accepted = mirror.accepted + 10_000
            write(Anchor(PORT, max(0, mirror.queue + next(offsets)), time_ns, accepted, seq))
            if n % 5 == 2:
                write(Anchor(OTHER_PORT, 20_000, time_ns, 0, seq))
        if i % ANCHOR_EVERY == 2 and seq and mirror.applied_seq == seq:
            write(Anchor(PORT, mirror.queue + 7_000, now, mirror.accepted, seq))  # same seq
        events.append(packet)
        if ifindex == PORT:
            mirror.packet(now, wire_len)
            accepted_after.append(mirror.accepted)
        last_ns = now
    write(Anchor(PORT, 12_345, last_ns + 1, mirror.accepted, seq + 1))
    return events


def make_packets(seed: int) -> list[tuple]:
    """Bursts faster than the link alternating with idle gaps, at times off the byte grid;
    every ECN codepoint, a VLAN tag now and then, some ARP, and some packets for a port
    without a config."""
    rng = random.Random(seed)
    packets, now = [], 1_000_000_000
    for i in range(NATIVE_PACKETS):
        now += rng.choice([20_000, 60_000, 120_000, 240_000, 2_000_000 if i % 50 == 0 else 40_000])
        now += rng.randrange(BYTE_NS_50MBIT)  # so that fractions of a byte carry
        wire_len = rng.choice([66, 590, 1514])
        kind = rng.random()
        if kind < 0.05:
            frame = Ether(src=SRC_MAC) / ARP()
        else:
            ip = IP(src="10.0.0.1", dst="10.0.0.2", tos=(rng.choice([0, 8, 26 << 2]) |
                                                         rng.choice([0, 1, 2, 2, 2, 3])))
            ether = Ether(src=SRC_MAC, dst="02:00:00:00:00:02")
            frame = (ether / Dot1Q(vlan=5) if kind > 0.9 else ether) / ip / UDP()
        ifindex = OTHER_PORT if rng.random() < 0.03 else PORT
        packets.append((ifindex, now, wire_len, rng.getrandbits(32), bytes(frame)))
    return packets


def raw_with_checksum_recomputed(ip: IP) -> bytes:
    fresh = IP(bytes(ip))
    del fresh.chksum
    return bytes(fresh)


@pytest.mark.parametrize(("ecn", "seed"), [
    (StepEcn(6_000), 1), (RedEcn(3_000, 20_000, 0.2), 2), (RedEcn(0, 30_000, 1.0), 3),
    (None, 4)])
def test_native_marker_follows_the_python_rules(tmp_path, ecn, seed):
    config = marker_config(50, QueueConfig(LIMIT_BYTES, ecn))
    packets = make_packets(seed)
    events = with_anchors(packets, config, seed)
    output = run_native_marker(tmp_path, config, events)
    frames, totals = output[:-1], [int(v) for v in output[-1].split()]
    assert len(frames) == len(packets)

    expected = dict.fromkeys((name for name, _ in COUNTERS_LAYOUT), 0)
    mirror = MarkerMirror(config.rate_bytes_per_s, LIMIT_BYTES)
    last_ns = 0
    received_frames = iter(frames)
    for event in events:
        if isinstance(event, Anchor):
            mirror.write_anchor(event)
            continue
        ifindex, now, wire_len, rnd, sent = event
        after = bytes.fromhex(next(received_frames))
        if ifindex != PORT:
            assert after == sent
            continue
        backlog, dropped = mirror.packet(now, wire_len)
        queue = mirror.queue
        last_ns = now
        expected["packets"] += 1
        expected["bytes"] += wire_len
        expected["max_queue_bytes"] = max(expected["max_queue_bytes"], queue)
        frame = Ether(sent)
        if dropped:
            expected["fifo_drops"] += 1
        if dropped or IP not in frame:
            assert after == sent
            continue
        ecn_bits = frame[IP].tos & 3
        p = mark_probability(ecn, backlog)
        marked = ecn_bits in (1, 2) and rnd / 2**32 < p
        expected["ce_arrived"] += ecn_bits == 3
        expected["ect_packets"] += ecn_bits in (1, 2)
        expected["not_ect_over"] += ecn_bits == 0 and ecn is not None and \
            backlog > ecn.start_bytes
        expected["ce_marks"] += marked
        out_ip = Ether(after)[IP]
        assert out_ip.tos == (frame[IP].tos | 3 if marked else frame[IP].tos)
        assert raw_with_checksum_recomputed(out_ip) == bytes(out_ip), "IPv4 checksum is stale"
        assert bytes(out_ip.payload) == bytes(frame[IP].payload)
    errors = mirror.errors
    expected.update(anchors=len(errors), anchor_error_bytes=sum(errors),
                    anchor_abs_error_bytes=sum(map(abs, errors)),
                    anchor_max_abs_error_bytes=max(map(abs, errors)))
    assert totals[:12] == [expected[name] for name, _ in COUNTERS_LAYOUT]
    # the telemetry sample, the bytes accepted, and the last anchor applied: not the one
    # written after the last packet
    assert totals[12:] == [queue, last_ns, mirror.accepted, mirror.applied_seq]
    written = [e.seq for e in events if isinstance(e, Anchor)]
    assert mirror.applied_seq == max(written) - 1
    assert min(errors) < 0 < max(errors)  # readings above and below the model were applied
    if ecn is not None:
        assert expected["ce_marks"] > 0 and expected["fifo_drops"] > 0  # the run exercised both
