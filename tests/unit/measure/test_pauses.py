"""PFC pauses as runs measure them, without root: the pause agent's counter deltas, where a
capture runs, tcpdump's command line, closing counts and lifecycle (a stand-in program plays
tcpdump), tshark's decoding of real 802.1Qbb frames written to a pcap, and the capture's
record and checks."""
from __future__ import annotations

import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
from scapy.layers.l2 import Ether
from scapy.utils import wrpcap
from tests.unit.stand_ins import StandInFabric

from testbed import errors
from testbed.errors import ConfigError
from testbed.measure.capture import HostCapture, capture_argv
from testbed.measure.pauses import (
    CAPTURE_FILE,
    CAPTURE_TOLERANCE_FRAMES,
    CapturePoint,
    DecodedPauses,
    PauseCapture,
    agent_alive_checks,
    capture_checks,
    capture_point,
    capture_summary,
    counter_deltas,
    decode_pause_frames,
    parse_tshark_fields,
    tcpdump_argv,
    tcpdump_stats,
)
from testbed.model.topology import build
from testbed.model.topology.fattree import fat_tree
from testbed.plan.pfc_frames import kick_frame, xoff_frame, xon_frame

LOSSLESS_PRIORITY = 3
SWITCH_MAC = "02:00:00:00:00:11"
POINT = CapturePoint("p0e0h1", "p0e0h1-eth0", "p0e0-eth2", "p0e0-eth1")


def require_tshark() -> None:
    if shutil.which("tshark") is None:
        pytest.fail("tshark is not installed; scripts/install.sh installs it")


# --- the agent's counters ---------------------------------------------------------------------


def agent_counters(xoff=0, xon=0, received=0, pauses=0, paused_s=0.0, storms=0) -> dict:
    """One interface's counters as the pause agent writes them, with fields the deltas skip."""
    return {"node": "n", "xoff_sent": xoff, "xon_sent": xon, "frames_received": received,
            "pauses": pauses, "paused_s": paused_s, "storms": storms,
            "longest_pause_s": 0.3, "max_backlog_bytes": 99}


def test_counter_deltas():
    before = {"p0a0-eth1": agent_counters(xoff=3, xon=1, received=2, pauses=1, paused_s=0.25),
              "p0e0-eth1": agent_counters(xoff=1)}
    after = {"p0a0-eth1": agent_counters(xoff=7, xon=2, received=5, pauses=3, paused_s=1.0,
                                         storms=1),
             "p0e0-eth1": agent_counters(xoff=1),
             "c0-eth1": agent_counters(received=4, pauses=2, paused_s=0.5)}  # new: from zero
    assert counter_deltas(before, after) == {
        "p0a0-eth1": {"xoff_sent": 4, "xon_sent": 1, "frames_received": 3, "pauses": 2,
                      "paused_s": 0.75, "storms": 1},
        "p0e0-eth1": {"xoff_sent": 0, "xon_sent": 0, "frames_received": 0, "pauses": 0,
                      "paused_s": 0.0, "storms": 0},
        "c0-eth1": {"xoff_sent": 0, "xon_sent": 0, "frames_received": 4, "pauses": 2,
                    "paused_s": 0.5, "storms": 0},
    }
    assert counter_deltas({}, {}) == {}


def test_a_pause_agent_that_died_makes_its_setup_untrusted():
    results = {"droptail": {}, "pfc": {"pause_agent_running": True},
               "pfc+ecn": {"pause_agent_running": False}}
    checks = agent_alive_checks(results)
    assert [(c.setup, c.outcome) for c in checks] == [("pfc", "PASS"), ("pfc+ecn", "FAIL")]
    assert agent_alive_checks({"droptail": {}}) == []


# --- where ------------------------------------------------------------------------------------


def test_the_capture_runs_on_the_receivers_neighbour():
    fabric = fat_tree(4, host_rate_mbit=10.0)
    # p0e0's port 1 goes to p0e0h0, port 2 to p0e0h1 (hosts first, then the aggregations)
    assert capture_point(fabric, "p0e0h0") == POINT
    assert capture_point(fabric, "p0e0h1") == CapturePoint("p0e0h0", "p0e0h0-eth0",
                                                           "p0e0-eth1", "p0e0-eth2")
    assert capture_point(fabric, "p3e1h1").host == "p3e1h0"


def test_a_receiver_alone_on_its_switch_has_no_capture_point():
    line = build("line", host_rate_mbit=10.0)  # h0 on s0, h1 on s1
    with pytest.raises(ConfigError) as info:
        capture_point(line, "h0")
    assert info.value.field == "receiver" and "only host on s0" in info.value.problem


# --- tcpdump ----------------------------------------------------------------------------------


def test_tcpdump_keeps_only_mac_control_frames_as_they_come(tmp_path):
    assert tcpdump_argv("p0e0h1-eth0", tmp_path / "x.pcap") == [
        "tcpdump", "-i", "p0e0h1-eth0", "-U", "-w", str(tmp_path / "x.pcap"),
        "ether", "proto", "0x8808"]


def test_tcpdump_closing_counts():
    text = ("tcpdump: listening on p0e0h1-eth0, link-type EN10MB (Ethernet), snapshot length "
            "262144 bytes\n1 packet captured\n 12 packets received by filter\n"
            "0 packets dropped by kernel\n")
    assert tcpdump_stats(text) == {"captured": 1, "received": 12, "kernel_dropped": 0}
    assert tcpdump_stats("tcpdump: no such device\n") == {}


FAKE_TCPDUMP = r"""
import signal, sys, time
def stop(*_):
    sys.stderr.write("7 packets captured\n7 packets received by filter\n"
                     "1 packet dropped by kernel\n")
    sys.exit(0)
signal.signal(signal.SIGTERM, stop)
time.sleep(0.2)
sys.stderr.write("tcpdump: listening on p0e0h1-eth0, link-type EN10MB (Ethernet)\n")
sys.stderr.flush()
while True:
    time.sleep(0.05)
"""
BROKEN_TCPDUMP = ("import sys; sys.stderr.write('tcpdump: p0e0h1-eth0: No such device "
                  "exists\\n'); sys.exit(1)")


def running(script: str) -> StandInFabric:
    """The stand-in fabric running ``script`` wherever the capture asks for tcpdump."""
    return StandInFabric(fat_tree(4), start=lambda host, argv, kwargs: subprocess.Popen(
        [sys.executable, "-c", script], **kwargs))


def test_the_capture_waits_until_tcpdump_listens_and_reads_its_counts(tmp_path):
    net = running(FAKE_TCPDUMP)
    with PauseCapture(net, POINT, tmp_path) as capture:
        assert capture.proc.poll() is None  # listening, still running
        assert "listening on" in (tmp_path / "pause-capture.log").read_text()
    assert capture.proc.returncode == 0
    assert capture.stats == {"captured": 7, "received": 7, "kernel_dropped": 1}
    assert capture.path == tmp_path / CAPTURE_FILE
    assert net.started == [("p0e0h1", tcpdump_argv("p0e0h1-eth0", tmp_path / CAPTURE_FILE))]


def test_a_tcpdump_that_cannot_start_is_an_error_with_its_message(tmp_path):
    with pytest.raises(errors.TestbedError, match="No such device exists"):
        with PauseCapture(running(BROKEN_TCPDUMP), POINT, tmp_path):
            pytest.fail("the block must not run")


# --- tshark -----------------------------------------------------------------------------------


def tshark_line(protocols: str, opcode: str = "", enabled: str = "", times=()) -> str:
    times = [str(t) for t in times] or [""] * 8
    return "\t".join([protocols, SWITCH_MAC, opcode, enabled, *times])


def test_tshark_fields_are_counted_by_kind_and_class():
    lines = [
        tshark_line("eth:ethertype:macc", "0x0101", "0x0008", [0, 0, 0, 65535, 0, 0, 0, 0]),
        tshark_line("eth:ethertype:macc", "0x0101", "0x0008", [0] * 8),
        tshark_line("eth:ethertype:macc", "0x0101", "0x0048", [0, 0, 0, 0, 0, 0, 9, 0]),
        tshark_line("eth:ethertype:macc", "0x0001"),  # an 802.3x pause: MAC Control, not PFC
        tshark_line("eth:ethertype:data"),  # not decoded as MAC Control at all
        "",
    ]
    decoded = parse_tshark_fields("\n".join(lines) + "\n")
    assert decoded == DecodedPauses(frames=5, pfc_frames=3, xoff_frames=2, xon_frames=1,
                                    by_priority={3: 3, 6: 1}, sources=[SWITCH_MAC])
    assert parse_tshark_fields("") == DecodedPauses()


def write_frames(path: Path, frames: list[bytes]) -> Path:
    wrpcap(str(path), [Ether(frame) for frame in frames])
    return path


def test_tshark_decodes_the_agents_frames_as_pfc(tmp_path):
    require_tshark()
    pcap = write_frames(tmp_path / "p.pcap", [
        xoff_frame(SWITCH_MAC, [LOSSLESS_PRIORITY]), xon_frame(SWITCH_MAC, [LOSSLESS_PRIORITY]),
        xoff_frame(SWITCH_MAC, [LOSSLESS_PRIORITY]), kick_frame(SWITCH_MAC)])
    decoded = decode_pause_frames(pcap)
    assert decoded == DecodedPauses(frames=4, pfc_frames=3, xoff_frames=2, xon_frames=1,
                                    by_priority={LOSSLESS_PRIORITY: 3}, sources=[SWITCH_MAC])
    verbose = subprocess.run(["tshark", "-r", str(pcap), "-c", "1", "-V"], capture_output=True,
                             text=True, timeout=60).stdout
    assert "MAC Control" in verbose and "Class Based Flow Control" in verbose


def test_an_unreadable_capture_is_an_error(tmp_path):
    require_tshark()
    with pytest.raises(errors.TestbedError, match="tshark could not read"):
        decode_pause_frames(tmp_path / "missing.pcap")


# --- the record and its checks ----------------------------------------------------------------


@dataclass
class FinishedCapture:
    path: Path
    stats: dict


def test_the_capture_record_sets_tshark_beside_the_agent(tmp_path):
    require_tshark()
    pcap = write_frames(tmp_path / CAPTURE_FILE, [xoff_frame(SWITCH_MAC, [3]),
                                                   xon_frame(SWITCH_MAC, [3])])
    deltas = {"p0e0-eth2": {"xoff_sent": 1, "xon_sent": 1, "frames_received": 0},
              "p0e0h1-eth0": {"xoff_sent": 0, "xon_sent": 0, "frames_received": 2}}
    summary = capture_summary(POINT, FinishedCapture(pcap, {"captured": 2, "kernel_dropped": 0}),
                              deltas)
    assert (summary["frames"], summary["pfc_frames"], summary["xoff_frames"],
            summary["xon_frames"]) == (2, 2, 1, 1)
    assert (summary["agent_sent"], summary["agent_received"]) == (2, 2)
    assert summary["pcap"] == str(pcap) and summary["host"] == "p0e0h1"
    assert summary["kernel_dropped"] == 0 and summary["error"] is None
    assert [c.outcome for c in capture_checks(summary, "pfc")] == ["PASS", "PASS"]
    broken = capture_summary(POINT, FinishedCapture(tmp_path / "none.pcap", {}), deltas)
    assert broken["error"].startswith("tshark could not read")
    [check] = capture_checks(broken, "pfc")
    assert check.passed is None and "could not be read" in check.statement


def record(frames: int, pfc_frames: int, agent_sent: int) -> dict:
    return {"pcap": "pause-frames.pcap", **vars(POINT), "frames": frames,
            "pfc_frames": pfc_frames, "xoff_frames": pfc_frames, "xon_frames": 0,
            "agent_sent": agent_sent, "agent_received": agent_sent, "kernel_dropped": 0,
            "error": None}


def test_capture_checks_pass_when_every_frame_decodes_and_the_counts_agree():
    decodes, counts = capture_checks(record(40, 40, 40), "pfc")
    assert decodes.passed and decodes.measured == 40 and decodes.expected == 40
    assert counts.passed and counts.tolerance == CAPTURE_TOLERANCE_FRAMES == 0
    assert counts.setup == "pfc" and counts.unit == "frames"
    assert "the pause agent sent 40 from p0e0-eth2" in counts.statement


@pytest.mark.parametrize(("frames", "pfc_frames", "agent_sent", "outcomes"), [
    (40, 39, 40, ["FAIL", "FAIL"]),  # a frame tshark did not decode as PFC
    (40, 40, 41, ["PASS", "FAIL"]),  # one more sent than captured
    (0, 0, 0, ["FAIL", "PASS"]),  # nothing captured: nothing shown, though the counts agree
])
def test_capture_checks_fail_on_what_does_not_add_up(frames, pfc_frames, agent_sent, outcomes):
    checks = capture_checks(record(frames, pfc_frames, agent_sent), "pfc")
    assert [c.outcome for c in checks] == outcomes


def test_a_capture_of_other_packets_counts_and_cuts_them(tmp_path):
    assert capture_argv("h0-eth0", tmp_path / "s.pcap", ["tcp"], 300, 128) == [
        "tcpdump", "-i", "h0-eth0", "-U", "-w", str(tmp_path / "s.pcap"), "-c", "300", "-s",
        "128", "tcp"]
    net = running(FAKE_TCPDUMP)
    with HostCapture(net, "h0", ["tcpdump"], tmp_path / "s.pcap", tmp_path / "s.log") as capture:
        assert capture.proc.poll() is None
    assert capture.stats["captured"] == 7 and net.started == [("h0", ["tcpdump"])]
