"""The RoCE experiments' shared code without root: the host programs' command lines, their
JSON parsed and summarised, a batch of flows run for real on 127.0.0.x through a stand-in
network (the same programs an emulated host runs), the one-switch bench and DCQCN's lossless
queue, the capture's decoding by tshark and scapy, the real queue over a window, and the
figures."""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
from scapy.all import Ether, IP, raw, wrpcap
from tests.unit.stand_ins import StandInFabric

from testbed import errors
from testbed.capabilities import Capability, Platform, choose_paths
from testbed.drive.roce_flows import (
    CC_FILE,
    QUEUE_FILE,
    RXE_FIRST_PORT,
    RoceRun,
    RoceSettings,
    capture_argv,
    flow_summary,
    parse_host_output,
    run_roce_flows,
    rxe_argv,
    send_argv,
    serve_argv,
    served_windows,
)
from testbed.errors import ConfigError
from testbed.experiments.roce_common.roce_setups import (
    LOSSLESS_QUEUE,
    ack_timeout_s,
    dcqcn_red_bytes,
    incast_outstanding,
    lossless_queue,
    roce_frame_bytes,
    transport_problems,
)
from testbed.measure.roce import (
    capture_checks,
    cc_series,
    decode_capture,
    parse_tshark,
    sampled_fraction,
    verified_check,
    window_queue,
)
from testbed.model.bench import bench_fabric, bench_of
from testbed.traffic.roce import wire

PY = sys.executable
RUN_TIMEOUT_S = 60.0


# --- command lines and results ---------------------------------------------------------------


def test_settings_need_a_duration_or_a_count_and_rxe_has_no_congestion_control():
    with pytest.raises(ValueError):
        RoceSettings()
    with pytest.raises(ValueError):
        RoceSettings(duration_s=1.0, count=3)
    with pytest.raises(ValueError):
        RoceSettings(duration_s=1.0, cc="dcqcn", transport="rxe")
    with pytest.raises(ValueError):
        RoceSettings(count=3, transport="rxe")
    with pytest.raises(ValueError):
        RoceSettings(count=3, transport="udp")


def test_the_sender_and_server_command_lines():
    settings = RoceSettings(cc="dcqcn", link_rate_mbit=20.0, duration_s=10.0,
                            cc_params={"g": 0.5}, ack_timeout_s=1.6, message_bytes=4096)
    assert send_argv("10.0.0.2", "10.0.0.4", settings, seed=3, python="py") == [
        "py", "-m", "testbed.traffic.roce.host", "send", "--bind", "10.0.0.2", "--peer",
        "10.0.0.4", "--opcode", "write", "--size", "4096", "--mtu", "1024", "--cc", "dcqcn",
        "--queue-depth", "16", "--max-outstanding", "128", "--timeout-s", "60", "--seed", "3",
        "--duration-s", "10", "--link-rate-mbit", "20", "--ack-timeout-s", "1.6",
        "--cc-param", "g=0.5"]
    assert serve_argv("10.0.0.4", 3, settings, python="py") == [
        "py", "-m", "testbed.traffic.roce.host", "serve", "--bind", "10.0.0.4",
        "--connections", "3", "--timeout-s", "70", "--ack-timeout-s", "1.6"]  # 60 + the 10 s run
    counted = RoceSettings(count=5)
    assert send_argv("a", "b", counted, 1, python="py")[-2:] == ["--count", "5"]
    rxe = RoceSettings(duration_s=10.0, transport="rxe")
    assert rxe_argv("send", "10.0.0.2", rxe, RXE_FIRST_PORT + 1, "10.0.0.3", python="py") == [
        "py", "-m", "testbed.traffic.roce.rxe", "send", "--bind", "10.0.0.2", "--side-port",
        str(RXE_FIRST_PORT + 1), "--duration-s", "10", "--size", "65536", "--mtu", "1024",
        "--peer", "10.0.0.3"]


def test_the_host_programs_json_is_its_last_line():
    assert parse_host_output('starting\n{"goodput_mbit": 1.5}\n\n', "x") == {"goodput_mbit": 1.5}
    for bad in ("", "Traceback: boom\n"):
        with pytest.raises(errors.TestbedError):
            parse_host_output(bad, "sender a -> b")
    summary = flow_summary({"goodput_mbit": 2.0, "messages": 3, "cc": {"series": [1]},
                            "data_verified": True})
    assert summary["goodput_mbit"] == 2.0 and "cc" not in summary and summary["naks"] is None


def test_a_run_verifies_only_when_every_flow_did():
    ok = {"data_verified": True, "goodput_mbit": 3.0}
    run = RoceRun([("a", "c"), ("b", "c")], [ok, None], {}, [], None)
    assert run.goodputs_mbit() == [3.0, 0.0] and run.all_verified() is False
    assert RoceRun([("a", "c")], [ok], {}, [], None).all_verified() is True
    unchecked = {"data_verified": None, "goodput_mbit": 1.0, "errors": [], "transport": "rxe"}
    assert RoceRun([("a", "c")], [unchecked], {}, [], None).all_verified() is None
    assert verified_check([ok, ok]).passed is True
    assert verified_check([ok, {"data_verified": False}]).passed is False
    assert verified_check([unchecked]).passed is None  # perftest does not check: not judged
    # an engine flow whose program failed left no data_verified: that fails, never n/a
    failed = {"goodput_mbit": 0.0}
    assert verified_check([ok, failed]).passed is False
    assert RoceRun([("a", "c")], [failed], {}, [], None).all_verified() is False


def test_the_judged_flows_are_all_sending_from_the_last_start_to_the_first_end():
    pairs = [("a", "c"), ("b", "c")]
    early = {"window_monotonic_s": [10.0, 52.0]}
    late = {"window_monotonic_s": [10.1, 60.0]}  # drained its posted messages longer
    run = RoceRun(pairs, [early, late], {}, [], (10.0, 60.0))
    assert run.all_sending_monotonic_s == (10.1, 52.0)
    assert RoceRun(pairs, [early, None], {}, [], None).all_sending_monotonic_s is None
    apart = {"window_monotonic_s": [53.0, 54.0]}
    assert RoceRun(pairs, [early, apart], {}, [], None).all_sending_monotonic_s is None


# --- a real run through a stand-in network ------------------------------------------------------


def loopback_fabric(hosts: dict[str, str]) -> StandInFabric:
    """What run_roce_flows uses of a running fabric, the stand-in's: the hosts' addresses,
    here every host on its own 127.0.0.x address of this namespace, and popen, starting the
    programs here."""
    fabric = SimpleNamespace(nodes={name: SimpleNamespace(ip=ip) for name, ip in hosts.items()})
    return StandInFabric(fabric, start=lambda host, argv, kwargs: subprocess.Popen(
        argv, cwd=Path(__file__).resolve().parents[3], **kwargs))


def test_an_incast_of_two_flows_runs_and_verifies(tmp_path):
    net = loopback_fabric({"h0": "127.0.0.2", "h1": "127.0.0.3", "h2": "127.0.0.4"})
    settings = RoceSettings(count=4, message_bytes=100_000, timeout_s=RUN_TIMEOUT_S)
    run = run_roce_flows(net, [("h0", "h2"), ("h1", "h2")], settings, tmp_path)
    assert run.errors == [] and run.all_verified() is True
    assert [r["messages"] for r in run.senders] == [4, 4]
    assert run.servers["h2"]["connections"][0]["errors"] == []
    start, end = run.window_monotonic_s
    assert start < end
    assert (tmp_path / "roce-h0-h2.json").exists() and (tmp_path / "roce-serve-h2.json").exists()
    flows = run.summary()["flows"]
    assert [f["src"] for f in flows] == ["h0", "h1"] and flows[0]["bytes_delivered"] == 400_000


def test_a_server_is_judged_over_the_flows_it_served():
    a, b = {"window_monotonic_s": [10.0, 14.0]}, {"window_monotonic_s": [11.0, 16.0]}
    assert served_windows(["h2", "h2", "h3"], [a, b, None]) == {"h2": (10.0, 16.0)}
    assert served_windows(["h2-0", "h2-1"], [a, b]) == {"h2-0": (10.0, 14.0),
                                                        "h2-1": (11.0, 16.0)}


def test_the_generators_cpu_covers_each_program_over_its_flows(tmp_path):
    from testbed.measure.generators import GeneratorCpu

    net = loopback_fabric({"h0": "127.0.0.2", "h1": "127.0.0.3", "h2": "127.0.0.4"})
    settings = RoceSettings(count=4, message_bytes=100_000, timeout_s=RUN_TIMEOUT_S)
    with GeneratorCpu() as cpu:
        run = run_roce_flows(net, [("h0", "h2"), ("h1", "h2")], settings, tmp_path, cpu)
    assert run.errors == []
    assert set(cpu.windows) == {"server h2", "sender h0->h2", "sender h1->h2"}
    assert cpu.windows["server h2"] == served_windows(["h2", "h2"], run.senders)["h2"]


def test_a_sender_that_fails_is_an_error_of_the_run_not_an_exception(tmp_path):
    net = loopback_fabric({"h0": "127.0.0.2", "h1": "192.0.2.1"})  # TEST-NET-1: not ours
    settings = RoceSettings(count=1, timeout_s=1.0)
    # the server cannot bind an address this machine does not have; the sender finds nobody
    run = run_roce_flows(net, [("h0", "h1")], settings, tmp_path)
    assert run.senders == [None] and run.window_monotonic_s is None
    assert any("sender h0 -> h1" in e for e in run.errors)


# --- the bench and its queues ---------------------------------------------------------------


def test_the_bench_puts_every_flow_through_the_receivers_port():
    bench = bench_of(bench_fabric(3, 20.0, 1500))
    assert bench.senders == ("l0h0", "l0h1", "l0h2") and bench.receiver == "l0h3"
    assert bench.bottleneck_intf == "l0-eth4" and bench.bottleneck_label == "l0->l0h3"
    assert bench.pairs() == [("l0h0", "l0h3"), ("l0h1", "l0h3"), ("l0h2", "l0h3")]
    assert LOSSLESS_QUEUE == "23:"  # priority 3's tbf


def test_dcqcn_thresholds_keep_their_bytes_and_say_so():
    ecn, records = dcqcn_red_bytes(20.0)
    assert (ecn.kmin_bytes, ecn.kmax_bytes, ecn.pmax) == (5000, 200_000, 0.01)
    kmax = next(r for r in records if r["parameter"] == "kmax_bytes")
    # 200 KB at 20 Mbit/s: 200000 * 8 / 20e6 = 0.08 s of link time
    assert kmax["link_time_s"] == pytest.approx(0.08) and "bytes unchanged" in kmax["rule"]


def test_the_lossless_queue_leaves_headroom_for_every_feeding_port():
    fabric = bench_fabric(4, 20.0, 1500)
    ecn, _ = dcqcn_red_bytes(20.0)
    queue, record = lossless_queue(fabric, 20.0, 1500, 1_000_000, ecn, 0.020)
    # 6 ports on l0 (5 hosts, 1 uplink): fan-in 5. Per port 2 * 2.5e6 B/s * 0.02 s = 100000,
    # plus 2 MTU and a pause frame: 103064; five of them 515320. XOFF = 1e6 - 515320.
    assert record["pfc"]["fan_in"] == 5 and queue.pfc.headroom_bytes == 515_320
    assert queue.pfc.xoff_bytes == 484_680 and queue.uses_classes and queue.ecn == ecn
    with pytest.raises(ConfigError) as info:
        lossless_queue(fabric, 20.0, 1500, 400_000, ecn, 0.020)
    assert info.value.field == "params.buffer_bytes"


def test_an_incast_holds_one_and_a_half_buffers_in_flight():
    # 1.5 * 1.5 MB over 4 QPs of 1098-byte frames: 512.3 -> 513 packets each
    assert incast_outstanding(1_500_000, 4, 1098) == 513
    for senders in range(2, 16):
        each = incast_outstanding(1_500_000, senders, 1098)
        assert senders * each * 1098 >= 1.5 * 1_500_000  # past XOFF (below the buffer)
        assert (each - 1) * 1098 <= 0.75 * 1_500_000  # fits in its own NIC's queue


def test_frames_timeouts_and_the_rxe_refusal():
    assert roce_frame_bytes(1024) == 1024 + 12 + 16 + 4 + 20 + 8 + 14
    # a 1 MB buffer at 20 Mbit/s drains in 0.4 s; four drains
    assert ack_timeout_s(1_000_000, 20.0) == pytest.approx(1.6)
    assert ack_timeout_s(1000, 1000.0) == 0.067
    caps = {"rdma_rxe": Capability("rdma_rxe", False, "CONFIG_RDMA_RXE not set")}
    platform = Platform("t", caps, choose_paths(caps))
    assert transport_problems("engine", platform) == []
    problems = transport_problems("rxe", platform, which=lambda tool: None)
    assert [p.path for p in problems] == [("params", "transport")] * 2
    assert "CONFIG_RDMA_RXE not set" in problems[0].message
    assert "rdma, ib_write_bw" in problems[1].message
    caps["rdma_rxe"] = Capability("rdma_rxe", True, "module rdma_rxe loaded")
    assert transport_problems("rxe", Platform("t", caps, choose_paths(caps)),
                              which=lambda tool: f"/usr/bin/{tool}") == []


# --- the capture --------------------------------------------------------------------------------

SRC, DST = "10.0.0.2", "10.0.0.3"
SEEDS = wire.IcrcSeeds(SRC, DST, wire.ROCE_UDP_PORT, wire.ROCE_UDP_PORT)
BACK = wire.IcrcSeeds(DST, SRC, wire.ROCE_UDP_PORT, wire.ROCE_UDP_PORT)  # the ACKs' path
DATA_TOS = wire.tos_byte(26, wire.ECN_ECT0)


def engine_packets(count: int, corrupt: int | None = None) -> list:
    """What the engine sends, framed as the kernel writes it (IP ID 0, DF) on Ethernet."""
    frames = []
    for psn in range(count):
        datagram = bytearray(wire.build_data(SEEDS, wire.Opcode.SEND_ONLY, 0x12, psn,
                                             bytes(range(256)) * 4, ackreq=True))
        if psn == corrupt:
            datagram[20] ^= 0xFF  # a payload byte: the ICRC no longer matches
        frames.append(Ether() / IP(raw(wire.wrap_in_ip(bytes(datagram), SRC, DST,
                                                       wire.ROCE_UDP_PORT, wire.ROCE_UDP_PORT,
                                                       DATA_TOS))))
    frames.append(Ether() / IP(raw(wire.wrap_in_ip(
        wire.build_ack(BACK, 0x12, count - 1, wire.AETH_ACK_NO_CREDITS, 1), DST, SRC,
        wire.ROCE_UDP_PORT, wire.ROCE_UDP_PORT, wire.tos_byte(48, 0)))))
    return frames


def test_capture_argv_keeps_a_sample_of_roce_packets():
    assert capture_argv("l0h2-eth0", Path("/r/roce.pcap"), 300) == [
        "tcpdump", "-i", "l0h2-eth0", "-U", "-w", "/r/roce.pcap", "-c", "300", "udp", "port",
        "4791"]


def test_tshark_fields_are_counted():
    text = "eth:ethertype:ip:udp:infiniband;0x04;0x0000\neth:ethertype:ip:udp:data;;0x1234\n\n"
    assert parse_tshark(text) == {"frames": 2, "bth_frames": 1, "opcodes": {"0x04": 1}}


@pytest.mark.skipif(shutil.which("tshark") is None, reason="tshark is not installed")
def test_a_capture_of_engine_packets_decodes_and_verifies(tmp_path):
    path = tmp_path / "roce.pcap"
    wrpcap(str(path), engine_packets(12))
    capture = decode_capture(path)
    assert capture["error"] is None
    assert capture["tshark"] == {"frames": 13, "bth_frames": 13,
                                 "opcodes": {"0x04": 12, "0x11": 1}}
    assert capture["scapy"] == {"packets": 13, "icrc_ok": 13, "ip_id_zero": 13}
    assert [c.passed for c in capture_checks(capture, "s")] == [True, True]


@pytest.mark.skipif(shutil.which("tshark") is None, reason="tshark is not installed")
def test_a_corrupted_packet_fails_the_icrc_check(tmp_path):
    path = tmp_path / "roce.pcap"
    wrpcap(str(path), engine_packets(12, corrupt=5))
    capture = decode_capture(path)
    decodes, icrc = capture_checks(capture, "s")
    assert decodes.passed is True and icrc.passed is False
    assert capture["scapy"]["icrc_ok"] == 12 and capture["scapy"]["packets"] == 13


def test_frames_scapy_did_not_read_as_bth_fail_the_icrc_check():
    unread = {"pcap": "x", "error": None,
              "tshark": {"frames": 300, "bth_frames": 300, "opcodes": {}},
              "scapy": {"packets": 0, "icrc_ok": 0, "ip_id_zero": 0}}
    decodes, icrc = capture_checks(unread, "s")
    assert decodes.passed is True and icrc.passed is False and icrc.expected == 300


@pytest.mark.skipif(shutil.which("tshark") is None, reason="tshark is not installed")
def test_a_fresh_process_reads_the_bth_without_importing_scapy_roce_first(tmp_path):
    """decode_capture binds BTH to UDP 4791 before reading: in a process that never imported
    scapy.contrib.roce, scapy would otherwise read every packet as plain UDP payload."""
    path = tmp_path / "roce.pcap"
    wrpcap(str(path), engine_packets(12))
    code = ("import json, sys; from testbed.measure.roce import decode_capture; "
            "print(json.dumps(decode_capture(sys.argv[1])['scapy']))")
    out = subprocess.run([sys.executable, "-c", code, str(path)], capture_output=True,
                         text=True, check=True)
    assert json.loads(out.stdout) == {"packets": 13, "icrc_ok": 13, "ip_id_zero": 13}


def test_no_capture_or_a_short_one_is_not_judged(tmp_path):
    assert [c.passed for c in capture_checks(None)] == [None, None]
    assert [c.passed for c in capture_checks({"error": "tshark is missing", "pcap": "x"})] \
        == [None, None]
    few = {"pcap": "x", "error": None, "tshark": {"frames": 3, "bth_frames": 3, "opcodes": {}},
           "scapy": {"packets": 3, "icrc_ok": 3, "ip_id_zero": 3}}
    assert [c.passed for c in capture_checks(few)] == [None, None]
    assert decode_capture(tmp_path / "missing.pcap")["error"]


# --- the real queue and the series ------------------------------------------------------------


def test_the_queue_over_a_window_by_hand():
    t = [0.0, 0.01, 0.02, 0.03, 0.04, 0.05]
    depth = [9000, 1000, 3000, 2000, 4000, 9000]
    q = window_queue(t, depth, (0.01, 0.04), 1000)
    # inside: 1000 3000 2000 4000 -> median 2500 (interpolated), mean 2500, max 4000
    assert q["samples"] == 4 and q["median_bytes"] == 2500 and q["max_bytes"] == 4000
    assert q["mean_frames"] == 2.5 and q["p95_bytes"] == pytest.approx(3850)
    assert window_queue(t, depth, (1.0, 2.0), 1000)["median_bytes"] is None
    # 0.03 s at 10 ms holds 3 samples
    assert sampled_fraction(4, (0.01, 0.04), 0.01) == pytest.approx(4 / 3)


def test_cc_series_are_put_on_the_monotonic_clock():
    sender = {"series_origin_monotonic_s": 100.0,
              "cc": {"name": "dcqcn", "series": {"t_s": [0.0, 0.5], "rate_bps": [2e7, 1e7],
                                                 "alpha": [1.0, 0.9], "cnps_received": [0, 1]}},
              "receiver": {"series_origin_monotonic_s": 99.0,  # its own origin
                           "np": {"series": {"t_s": [1.4], "cnps_sent": [1]}}}}
    series = cc_series(sender)
    assert series["name"] == "dcqcn" and series["series"]["t_s"] == [100.0, 100.5]
    assert series["cnps_sent"] == {"t_s": [100.4], "count": [1]}
    assert cc_series({})["series"] == {"t_s": []}


def test_the_figures_are_written(tmp_path):
    from testbed.experiments.roce_common.roce_plots import plot_cc, plot_queue

    flows = {"l0h0->l0h2": cc_series({"series_origin_monotonic_s": 10.0, "cc": {
        "series": {"t_s": [0, 1, 2], "rate_bps": [2e7, 1e7, None], "alpha": [1, .5, .4],
                   "cnps_received": [0, 1, 1]}}}),
             "l0h1->l0h2": cc_series({"series_origin_monotonic_s": 10.0, "cc": {
                 "series": {"t_s": [0, 1], "cwnd_bytes": [10240, 5120], "alpha": [1, .9],
                            "marked_fraction": [0.0, None]}}})}
    assert plot_cc(flows, 10.0, "run | bench", tmp_path / "cc.png").stat().st_size > 0
    assert plot_queue([10.0, 10.01], [0, 5000], 10.0, {"K": 3000}, "run",
                      tmp_path / "q.png").stat().st_size > 0
    assert QUEUE_FILE == "queue.json" and CC_FILE == "cc-series.json"
