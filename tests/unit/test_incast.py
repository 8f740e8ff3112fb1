"""The incast experiment without root: its config, the request/response program over
loopback (in-process and as processes), the statistics, the TCP counters' parsing, the
verdict, the table and the figures, and the ``testbed incast`` command (whose run is
replaced, so no test here can start an emulation)."""
from __future__ import annotations

import json
import math
import socket
import subprocess
import sys
import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

import testbed.experiments.incast.run
from testbed import errors
from testbed.capabilities import Platform, choose_paths, probe_capabilities
from testbed.errors import ConfigError
from testbed.experiments.incast.run import (
    DROPTAIL,
    ECN,
    MAX_FANIN,
    MODES,
    PFC,
    IncastConfig,
    IncastMeasurement,
    IncastResult,
    bottleneck_port,
    client_argv,
    completion_stats,
    format_table,
    ideal_round_s,
    mode_queue,
    mode_tcp,
    parse_int_list,
    pfc_counters,
    pfc_delta,
    require_pfc_support,
    sender_hosts,
    server_argv,
    summarize,
    timeout_onset,
    verdict,
    write_incast_results,
)
from testbed.harness.flows import counter_deltas, parse_proc_net, tcp_loss_counters
from testbed.measure.stats import percentile
from testbed.plan.profiles import StepEcn
from testbed.traffic import incast as program

LOOPBACK = "127.0.0.1"
TOS_OF_DSCP_26 = 26 << 2
IO_TIMEOUT_S = 10.0  # loopback exchanges finish in milliseconds; this only bounds a hang


# --- config -----------------------------------------------------------------------------------


def test_the_default_config_is_valid():
    config = IncastConfig()
    config.validate()
    assert config.fanins == (MAX_FANIN,) and MAX_FANIN == 15
    assert set(config.modes) == {"droptail", "ecn", "pfc"}
    assert config.dscp == 26


@pytest.mark.parametrize(("changes", "field"), [
    ({"fanins": (0,)}, "fanins"),
    ({"fanins": (16,)}, "fanins"),
    ({"fanins": ()}, "fanins"),
    ({"fanins": (3, 3)}, "fanins"),
    ({"fanins": ("3",)}, "fanins"),
    ({"fanins": 3}, "fanins"),
    ({"modes": ("red",)}, "modes"),
    ({"modes": ()}, "modes"),
    ({"modes": ("ecn", "ecn")}, "modes"),
    ({"response_bytes": 0}, "response_bytes"),
    ({"response_bytes": 2**31}, "response_bytes"),
    ({"rounds": 0}, "rounds"),
    ({"rounds": 2.0}, "rounds"),
    ({"warmup_rounds": -1}, "warmup_rounds"),
    ({"gap_s": -0.1}, "gap_s"),
    ({"gap_s": math.nan}, "gap_s"),
    ({"round_timeout_s": 0}, "round_timeout_s"),
    ({"round_timeout_s": math.inf}, "round_timeout_s"),
    ({"round_timeout_s": "60"}, "round_timeout_s"),
    ({"gap_s": 61.0}, "gap_s"),
    ({"pfc_reaction_time_s": -1e-3}, "pfc_reaction_time_s"),
    ({"rate_mbit": 0}, "rate_mbit"),
    ({"rate_mbit": math.nan}, "rate_mbit"),
    ({"rate_mbit": 20000.0}, "rate_mbit"),
    ({"mtu_bytes": 100}, "mtu_bytes"),
    ({"buffer_bytes": 2999}, "buffer_bytes"),  # under two 1500-byte frames
    ({"dscp": 64}, "dscp"),
    ({"dscp": 0}, "dscp"),  # pfc mode: best effort is not the lossless class
    ({"receiver": "p9e0h0"}, "receiver"),
    # a 2-frame buffer: K (2 frames) is not below it, and PFC's headroom does not fit
    ({"buffer_bytes": 3000, "modes": (ECN,)}, "ecn.k_bytes"),
    ({"buffer_bytes": 3000, "modes": (PFC,)}, "buffer_bytes"),
])
def test_bad_configs_are_one_line_errors_naming_the_field(changes, field):
    with pytest.raises(ConfigError) as info:
        IncastConfig(**changes).validate()
    assert info.value.field == field
    assert "\n" not in str(info.value)


def test_best_effort_traffic_is_fine_without_pfc():
    IncastConfig(dscp=0, modes=(DROPTAIL, ECN)).validate()


def test_sweeps_parse_from_comma_lists():
    assert parse_int_list("--sweep", "1,3,7,15") == (1, 3, 7, 15)
    assert parse_int_list("--sweep", "4") == (4,)
    with pytest.raises(ConfigError) as info:
        parse_int_list("--sweep", "1,x")
    assert info.value.field == "--sweep"


# --- per mode ---------------------------------------------------------------------------------


def test_each_mode_has_its_own_queue_on_the_same_buffer():
    config = IncastConfig(buffer_bytes=100_000)
    droptail, _ = mode_queue(DROPTAIL, config)
    ecn, ecn_record = mode_queue(ECN, config)
    pfc, pfc_record = mode_queue(PFC, config)
    assert {q.buffer_bytes for q in (droptail, ecn, pfc)} == {100_000}
    assert droptail.ecn is None and droptail.pfc is None
    assert isinstance(ecn.ecn, StepEcn) and ecn.pfc is None
    assert ecn_record["scheme"] == "dctcp" and ecn_record["ecn"][0]["value"] == ecn.ecn.k_bytes
    assert pfc.ecn is None and pfc.pfc is not None
    assert pfc.pfc.xoff_bytes + pfc.pfc.headroom_bytes <= pfc.buffer_bytes
    assert pfc_record["pfc"]["xoff_bytes"] == pfc.pfc.xoff_bytes
    # the default traffic class is the one PFC protects
    assert pfc.priority_for_dscp(config.dscp) in pfc.lossless_priorities


def test_a_longer_pause_reaction_needs_more_headroom():
    quick, _ = mode_queue(PFC, IncastConfig(pfc_reaction_time_s=0.001))
    slow, _ = mode_queue(PFC, IncastConfig(pfc_reaction_time_s=0.010))
    assert slow.pfc.headroom_bytes > quick.pfc.headroom_bytes
    assert slow.pfc.xoff_bytes < quick.pfc.xoff_bytes


def platform(congestion: set[str], kconfig: dict[str, str] | None = None) -> Platform:
    caps = probe_capabilities(kconfig or {"CONFIG_MODULES": "n"}, set(), set(), congestion, {})
    return Platform("test", caps, choose_paths(caps))


def test_only_ecn_mode_turns_ecn_on_and_the_other_modes_share_one_algorithm():
    here = platform({"reno", "cubic", "bbr"})  # this kind of machine: no dctcp
    ecn = mode_tcp(ECN, here)
    assert ecn.ecn and ecn.congestion_control == "cubic"
    assert ecn.sysctls()["net.ipv4.tcp_ecn"] == "1"
    for mode in (DROPTAIL, PFC):
        tcp = mode_tcp(mode, here)
        assert not tcp.ecn and tcp.congestion_control == "cubic"
        assert "net.ipv4.tcp_ecn" not in tcp.sysctls()
    stock = platform({"reno", "cubic", "dctcp"})
    assert mode_tcp(ECN, stock).congestion_control == "dctcp"
    assert mode_tcp(DROPTAIL, stock).congestion_control == "cubic"
    bare = platform({"reno"}, {"CONFIG_MODULES": "n", "CONFIG_TCP_CONG_CUBIC": "n"})
    assert mode_tcp(DROPTAIL, bare).congestion_control == "reno"


def test_senders_spread_over_the_pods_and_never_include_the_receiver():
    fabric = IncastConfig().fabric()
    assert sender_hosts(fabric, "p0e0h0", 1) == ["p1e0h0"]
    three = sender_hosts(fabric, "p0e0h0", 3)
    assert sorted(name[:2] for name in three) == ["p1", "p2", "p3"]
    every = sender_hosts(fabric, "p0e0h0", MAX_FANIN)
    assert len(set(every)) == MAX_FANIN and "p0e0h0" not in every
    assert sender_hosts(fabric, "p0e0h0", 7) == every[:7]  # a sweep adds senders
    assert sender_hosts(fabric, "p2e1h1", 1) == ["p3e0h0"]
    assert bottleneck_port(fabric, "p0e0h0") == "p0e0-eth1"


def test_the_driver_speaks_the_programs_command_line():
    config = IncastConfig(response_bytes=1234, rounds=7, warmup_rounds=2, gap_s=0.05, dscp=26,
                          round_timeout_s=9.5)
    client = program.build_parser().parse_args(
        client_argv(["10.1.0.2", "10.2.0.2"], 5601, config)[3:])
    assert (client.mode, client.response_bytes, client.rounds, client.warmup, client.gap_s,
            client.dscp, client.round_timeout_s) == ("query", 1234, 7, 2, 0.05, 26, 9.5)
    assert program.parse_servers(client.servers, client.port) == [("10.1.0.2", 5601),
                                                                   ("10.2.0.2", 5601)]
    server = program.build_parser().parse_args(server_argv(5601, 26)[3:])
    assert (server.mode, server.port, server.dscp, server.connections) == ("serve", 5601, 26, 1)


# --- the program: framing ---------------------------------------------------------------------


def test_requests_round_trip_and_anything_else_is_refused():
    assert len(program.encode_request(1)) == program.REQUEST.size == 12
    for nbytes in (1, 65536, 2**40):
        assert program.decode_request(program.encode_request(nbytes)) == nbytes
    with pytest.raises(ValueError):
        program.decode_request(b"XXXX" + program.encode_request(5)[4:])
    with pytest.raises(ValueError):
        program.decode_request(program.REQUEST.pack(program.MAGIC, 0))
    with pytest.raises(ValueError):
        program.decode_request(program.encode_request(5)[:-1])
    for bad in (0, -1, True, 2.0):
        with pytest.raises(ValueError):
            program.encode_request(bad)


def recv_exactly(sock: socket.socket, nbytes: int) -> bytes:
    data = bytearray()
    while len(data) < nbytes:
        chunk = sock.recv(nbytes - len(data))
        assert chunk, f"closed after {len(data)} of {nbytes} bytes"
        data += chunk
    return bytes(data)


def test_a_connection_answers_each_request_with_exactly_the_bytes_asked():
    ours, theirs = socket.socketpair()
    ours.settimeout(IO_TIMEOUT_S)
    sizes = [5, program.SEND_CHUNK_BYTES + 17, 1]  # one spans several send blocks
    with ThreadPoolExecutor(1) as pool:
        served = pool.submit(program.serve_connection, theirs)
        ours.sendall(b"".join(program.encode_request(n) for n in sizes))
        assert recv_exactly(ours, sum(sizes)) == bytes(sum(sizes))
        ours.settimeout(0.2)
        with pytest.raises(socket.timeout):
            ours.recv(1)  # nothing more than asked
        ours.close()
        assert served.result(timeout=IO_TIMEOUT_S) == len(sizes)


def test_a_malformed_request_ends_the_connection():
    ours, theirs = socket.socketpair()
    with ThreadPoolExecutor(1) as pool:
        served = pool.submit(program.serve_connection, theirs)
        ours.sendall(b"GET / HTTP/1.0\r\n")
        with pytest.raises(ValueError):
            served.result(timeout=IO_TIMEOUT_S)
    ours.settimeout(IO_TIMEOUT_S)
    try:  # the server closed its end: an orderly close, or a reset over unread bytes
        assert ours.recv(1) == b""
    except ConnectionResetError:
        pass
    ours.close()


def test_dscp_sets_the_tos_byte_and_is_checked():
    with socket.socket() as sock:
        program.set_dscp(sock, 26)
        assert sock.getsockopt(socket.IPPROTO_IP, socket.IP_TOS) == TOS_OF_DSCP_26
        for bad in (-1, 64, True):
            with pytest.raises(ValueError):
                program.set_dscp(sock, bad)


def test_server_addresses_parse_with_and_without_ports():
    assert program.parse_servers("10.1.0.2,10.2.0.2:7001", 7000) == [("10.1.0.2", 7000),
                                                                      ("10.2.0.2", 7001)]
    with pytest.raises(ValueError):
        program.parse_servers("10.1.0.2", None)
    with pytest.raises(ValueError):
        program.parse_servers("10.1.0.2,", 7000)


# --- the program: queries over loopback -------------------------------------------------------


def start_servers(count: int, dscp: int) -> tuple[list[tuple[str, int]], list[threading.Thread]]:
    """``count`` servers on loopback, each serving one connection, in threads."""
    addresses, threads = [], []
    for _ in range(count):
        listener = program.open_listener(LOOPBACK, 0, dscp)
        addresses.append((LOOPBACK, listener.getsockname()[1]))

        def run(listener=listener):
            with listener:
                program.serve(listener, dscp, connections=1)

        thread = threading.Thread(target=run, daemon=True)
        thread.start()
        threads.append(thread)
    return addresses, threads


def test_queries_collect_every_response_each_round():
    senders, response_bytes, rounds = 3, 300_000, 4
    addresses, threads = start_servers(senders, dscp=26)
    result = program.query(addresses, response_bytes, rounds, gap_s=0.01, dscp=26,
                           round_timeout_s=IO_TIMEOUT_S, connect_timeout_s=IO_TIMEOUT_S,
                           warmup=1)
    for thread in threads:  # the client closed its connections: every server finished
        thread.join(IO_TIMEOUT_S)
        assert not thread.is_alive()
    assert result["error"] is None
    assert result["servers"] == [f"{ip}:{port}" for ip, port in addresses]
    assert len(result["warmup_rounds"]) == 1 and len(result["rounds"]) == rounds
    starts = [r["start_monotonic_s"] for r in result["warmup_rounds"] + result["rounds"]]
    assert all(later - earlier >= 0.01 for earlier, later in zip(starts, starts[1:]))
    for r in result["rounds"]:
        assert len(r["flow_s"]) == senders and all(t > 0 for t in r["flow_s"])
        assert r["round_s"] == max(r["flow_s"])
        assert 0 <= r["send_spread_s"] <= r["round_s"]


def test_client_sockets_carry_the_dscp():
    addresses, threads = start_servers(1, dscp=26)
    socks = program.connect_all(addresses, 26, IO_TIMEOUT_S)
    try:
        assert socks[0].getsockopt(socket.IPPROTO_IP, socket.IP_TOS) == TOS_OF_DSCP_26
    finally:
        for sock in socks:
            sock.close()
    threads[0].join(IO_TIMEOUT_S)


def test_a_server_that_never_answers_times_the_round_out():
    listener = socket.create_server((LOOPBACK, 0))
    held: list[socket.socket] = []
    acceptor = threading.Thread(target=lambda: held.append(listener.accept()[0]), daemon=True)
    acceptor.start()
    try:
        result = program.query([listener.getsockname()], 1000, rounds=3, gap_s=0.0, dscp=0,
                               round_timeout_s=0.3, connect_timeout_s=IO_TIMEOUT_S)
    finally:
        acceptor.join(IO_TIMEOUT_S)
        for sock in held:
            sock.close()
        listener.close()
    assert result["rounds"] == [] and result["warmup_rounds"] == []
    assert result["error"].startswith("round 0: 1 of 1 responses incomplete")


def test_a_missing_server_is_a_connect_error():
    with socket.socket() as unused:
        unused.bind((LOOPBACK, 0))
        port = unused.getsockname()[1]  # bound, never listening: connections are refused
        result = program.query([(LOOPBACK, port)], 10, 1, 0.0, 0, connect_timeout_s=0.3)
    assert result["error"].startswith("connect:") and result["connect_s"] is None


def test_server_and_client_run_as_processes():
    server = subprocess.Popen([sys.executable, "-m", "testbed.traffic.incast", "serve", "--bind",
                               LOOPBACK, "--port", "0", "--dscp", "26", "--connections", "1"],
                              stdout=subprocess.PIPE, text=True)
    try:
        port = json.loads(server.stdout.readline())["listening_port"]
        client = subprocess.run([sys.executable, "-m", "testbed.traffic.incast", "query", "--servers",
                                 f"{LOOPBACK}:{port}", "--response-bytes", "100000",
                                 "--rounds", "2", "--dscp", "26"],
                                capture_output=True, text=True, timeout=60)
        assert client.returncode == 0, client.stderr
        result = json.loads(client.stdout)
        assert result["error"] is None and len(result["rounds"]) == 2
        assert server.wait(timeout=IO_TIMEOUT_S) == 0  # its one connection is done
    finally:
        if server.poll() is None:
            server.kill()
        server.wait()
        server.stdout.close()


# --- statistics -------------------------------------------------------------------------------


def test_percentiles_match_numpys_linear_rule():
    values = [0.21, 0.05, 1.3, 0.07, 0.06, 0.25, 0.3, 0.08]
    for q in (0, 25, 50, 90, 99, 100):
        assert percentile(values, q) == pytest.approx(np.percentile(values, q))
    assert percentile([4.0], 99) == 4.0
    with pytest.raises(ValueError):
        percentile([], 50)
    with pytest.raises(ValueError):
        percentile([1.0], 101)


def test_completion_statistics():
    stats = completion_stats([0.1, 0.2, 0.3, 0.4, 1.0])
    assert stats["count"] == 5 and stats["median_s"] == pytest.approx(0.3)
    assert stats["max_s"] == 1.0 and stats["mean_s"] == pytest.approx(0.4)
    assert 0.4 < stats["p99_s"] < 1.0
    assert completion_stats([]) == {"count": 0, "mean_s": None, "median_s": None,
                                    "p99_s": None, "max_s": None}


def test_ideal_round_is_the_payload_at_link_rate():
    assert ideal_round_s(15, 65536, 10.0) == pytest.approx(15 * 65536 * 8 / 10e6)


def measurement(mode: str = DROPTAIL, fanin: int = 2, round_s=(0.2, 0.4), timeouts: int = 0,
                drops: int = 0, switch_drops: int | None = None, marks: int | None = None,
                pfc: dict | None = None, rx: int = 1000, tx: int | None = None,
                error: str | None = None) -> IncastMeasurement:
    senders = [f"s{i}" for i in range(fanin)]
    switch_drops = drops if switch_drops is None else switch_drops
    m = IncastMeasurement(mode, fanin, "r", senders, 125_000, round_s=list(round_s),
                          flow_s=[[t] * fanin for t in round_s],
                          send_spread_s=[1e-5] * len(round_s))
    m.tcp = {name: {"timeouts": 0, "retransmits": 0} for name in [*senders, "r"]}
    m.tcp["s0"] = {"timeouts": timeouts, "retransmits": 3 * timeouts}
    m.queue_drops = drops
    m.switches = {"rx_packets": rx, "tx_packets": rx - switch_drops if tx is None else tx,
                  "queue_drops": switch_drops}
    if marks is not None:
        m.queues = {"path": "ebpf", "totals": {"marks": marks, "max_queue_bytes": 9000}}
    m.pfc = pfc
    m.error = error
    return m


def test_a_measurement_summary():
    s = summarize(measurement(fanin=2, round_s=(0.2, 0.4), timeouts=2, drops=7,
                              switch_drops=5), rate_mbit=10.0)
    assert s["rounds_done"] == 2 and s["round"]["median_s"] == pytest.approx(0.3)
    assert s["flow"]["count"] == 4
    assert s["ideal_round_s"] == pytest.approx(0.2)  # 2 x 125 kB at 10 Mbit/s
    assert s["median_over_ideal"] == pytest.approx(1.5)
    # goodput per round: 2 Mbit in 0.2 s and in 0.4 s -> 10 and 5 Mbit/s, median 7.5
    assert s["goodput_mbit"] == pytest.approx(7.5) and s["goodput_fraction"] == pytest.approx(0.75)
    assert (s["tcp_timeouts"], s["sender_timeouts"], s["tcp_retransmits"]) == (2, 2, 6)
    assert (s["queue_drops"], s["switch_queue_drops"], s["host_queue_drops"]) == (7, 5, 2)
    assert s["emulator_lost_packets"] == 0 and s["ce_marks"] is None
    lossy = summarize(measurement(rx=1000, tx=900), rate_mbit=10.0)
    assert lossy["emulator_lost_packets"] == 100
    assert lossy["emulator_loss_fraction"] == pytest.approx(0.1)
    empty = summarize(measurement(round_s=(), error="round 0: timed out"), rate_mbit=10.0)
    assert empty["round"]["count"] == 0 and empty["goodput_mbit"] is None
    assert empty["error"] == "round 0: timed out"


# --- TCP counters -----------------------------------------------------------------------------


NETSTAT = """TcpExt: SyncookiesSent TCPTimeouts TCPLossProbes
TcpExt: 0 12 4
IpExt: InNoRoutes InOctets
IpExt: 0 123456
"""
SNMP = """Ip: Forwarding DefaultTTL
Ip: 2 64
Tcp: RtoAlgorithm RtoMin RtoMax MaxConn ActiveOpens RetransSegs
Tcp: 1 200 120000 -1 5 37
Udp: InDatagrams
Udp: 9
"""


def test_proc_net_tables_parse_from_either_file_or_both():
    tables = parse_proc_net(NETSTAT + SNMP)
    assert tables["TcpExt"] == {"SyncookiesSent": 0, "TCPTimeouts": 12, "TCPLossProbes": 4}
    assert tables["Tcp"]["MaxConn"] == -1 and tables["Tcp"]["RetransSegs"] == 37
    assert tables["IpExt"]["InOctets"] == 123456 and tables["Udp"] == {"InDatagrams": 9}
    assert tcp_loss_counters(NETSTAT + SNMP) == {"timeouts": 12, "retransmits": 37}
    assert set(parse_proc_net(SNMP)) == {"Ip", "Tcp", "Udp"}


def test_this_machines_own_counters_parse():
    with open("/proc/net/netstat") as netstat, open("/proc/net/snmp") as snmp:
        counters = tcp_loss_counters(netstat.read() + snmp.read())
    assert counters["timeouts"] >= 0 and counters["retransmits"] >= 0


def test_missing_counters_are_reported():
    with pytest.raises(errors.TestbedError, match="TCPTimeouts"):
        tcp_loss_counters(SNMP + "TcpExt: TCPLossProbes\nTcpExt: 1\n")
    with pytest.raises(errors.TestbedError, match="Tcp"):
        tcp_loss_counters(NETSTAT)


def test_counter_deltas_per_host():
    before = {"a": {"timeouts": 3, "retransmits": 10}, "b": {"timeouts": 0, "retransmits": 0}}
    after = {"a": {"timeouts": 5, "retransmits": 19}, "b": {"timeouts": 0, "retransmits": 2}}
    assert counter_deltas(before, after) == {"a": {"timeouts": 2, "retransmits": 9},
                                             "b": {"timeouts": 0, "retransmits": 2}}


# --- PFC counters -----------------------------------------------------------------------------


class PausingFabric:
    def __init__(self, **values):
        self.values = values

    def pfc_summary(self) -> dict:
        return dict(self.values)


PFC_BEFORE = {"pause_frames_sent": 10, "pause_frames_received": 10, "paused_time_s": 0.5,
              "lossless_drops": 0, "storms": 0}


def test_pfc_mode_needs_the_fabric_to_pause():
    with pytest.raises(errors.TestbedError, match="pfc_summary"):
        pfc_counters(object())
    with pytest.raises(errors.TestbedError, match="lossless_drops"):
        pfc_counters(PausingFabric(pause_frames_sent=0, pause_frames_received=0,
                                   paused_time_s=0.0))
    with pytest.raises(errors.TestbedError, match="--mode droptail --mode ecn"):
        require_pfc_support(object)
    require_pfc_support(PausingFabric)
    assert pfc_counters(PausingFabric(**PFC_BEFORE)) == PFC_BEFORE


def test_pfc_counters_over_a_measurement():
    after = {**PFC_BEFORE, "pause_frames_sent": 25, "paused_time_s": 0.75}
    delta = pfc_delta(PFC_BEFORE, after)
    assert delta["pause_frames_sent"] == 15 and delta["pause_frames_received"] == 0
    assert delta["paused_time_s"] == pytest.approx(0.25) and delta["lossless_drops"] == 0
    assert delta["after"] == after


# --- verdict, table, figures ------------------------------------------------------------------


def pauses(sent: int, lossless_drops: int = 0) -> dict:
    return {"pause_frames_sent": sent, "pause_frames_received": sent, "paused_time_s": 0.1,
            "lossless_drops": lossless_drops}


def result_of(*measurements: IncastMeasurement) -> IncastResult:
    config = IncastConfig()
    result = IncastResult(config={"rate_mbit": config.rate_mbit,
                                  "response_bytes": 125_000})
    result.measurements = list(measurements)
    return result


def textbook() -> IncastResult:
    """What the literature expects: drop-tail loses packets and waits for timeouts, ECN
    marks instead, PFC pauses instead and loses nothing."""
    return result_of(
        measurement(DROPTAIL, 1, (0.11, 0.12)),
        measurement(DROPTAIL, 3, (0.35, 0.6), timeouts=1, drops=4),
        measurement(DROPTAIL, 7, (0.9, 1.2, 1.6), timeouts=5, drops=40),
        measurement(ECN, 7, (0.75, 0.8, 0.85), marks=300),
        measurement(PFC, 7, (0.72, 0.74, 0.8), pfc=pauses(50)),
    )


def test_the_verdict_states_what_the_textbook_case_shows():
    v = verdict(textbook())
    assert v["fanin"] == 7
    assert all(v["checks"].values()), v["checks"]
    assert v["timeout_onset_fanin"] == {DROPTAIL: 3, ECN: None, PFC: None}
    assert v["emulator_trusted"] is True
    text = "\n".join(v["statements"])
    assert "NOT" not in text
    assert "drop-tail, fan-in 7: 40 queue drops, 5 TCP timeouts" in text
    assert "PFC, fan-in 7: 0 drops in the lossless class" in text


def test_the_verdict_says_when_the_expectations_fail():
    v = verdict(result_of(
        measurement(DROPTAIL, 7, (0.8, 0.8)),
        measurement(ECN, 7, (0.8, 0.9), marks=0),
        measurement(PFC, 7, (0.8, 0.9), drops=3, pfc=pauses(0, lossless_drops=3)),
    ))
    checks = v["checks"]
    assert checks["droptail_drops"] is False and checks["droptail_timeouts"] is False
    assert checks["ecn_marked"] is False
    assert checks["ecn_fewer_timeouts"] is None  # no drop-tail timeouts to compare with
    assert checks["pfc_lossless"] is False and checks["pfc_paused"] is False
    assert checks["ecn_tail_below_droptail"] is False
    text = "\n".join(v["statements"])
    assert "NOT as incast predicts" in text and "NOT lossless" in text
    assert "NOT at least 10% lower" in text and "no timeouts for ECN to remove" in text
    worse = verdict(result_of(measurement(DROPTAIL, 7, (0.8,), timeouts=2, drops=5),
                              measurement(ECN, 7, (0.9,), timeouts=3, marks=10)))
    assert worse["checks"]["ecn_fewer_timeouts"] is False
    assert "NOT fewer than drop-tail's 2" in "\n".join(worse["statements"])


def test_modes_not_run_are_left_undecided():
    v = verdict(result_of(measurement(DROPTAIL, 7, (1.0, 1.5), timeouts=2, drops=9)))
    assert v["checks"]["droptail_timeouts"] is True
    assert v["checks"]["ecn_marked"] is None and v["checks"]["pfc_lossless"] is None
    assert v["checks"]["pfc_tail_below_droptail"] is None
    assert verdict(result_of())["fanin"] is None


def test_the_verdict_flags_an_emulator_that_lost_packets_and_stopped_rounds():
    v = verdict(result_of(measurement(DROPTAIL, 7, (0.5,), rx=1000, tx=900,
                                      error="round 1: 1 of 7 responses incomplete")))
    assert v["emulator_trusted"] is False
    text = "\n".join(v["statements"])
    assert "may be the emulator's" in text and "stopped after 1 rounds" in text


def test_timeout_onset_is_the_smallest_fan_in_with_a_timeout():
    rows = [summarize(m, 10.0) for m in textbook().measurements]
    assert timeout_onset(rows, DROPTAIL) == 3 and timeout_onset(rows, ECN) is None


def test_the_table_has_a_row_per_fan_in_and_mode():
    lines = format_table(textbook()).strip().splitlines()
    assert lines[0].split()[:3] == ["fan-in", "mode", "rounds"]
    rows = [line.split() for line in lines[1:]]
    assert [(r[0], r[1]) for r in rows] == [("1", DROPTAIL), ("3", DROPTAIL), ("7", DROPTAIL),
                                            ("7", ECN), ("7", PFC)]
    ecn_row = rows[3]
    assert ecn_row[3] == "0.800"  # median s
    assert ecn_row[-3] == "300" and ecn_row[-2] == "-" and ecn_row[-1] == "-"
    assert rows[4][-2] == "50" and rows[4][-1] == "0"


def test_results_and_figures_are_written(tmp_path):
    paths = write_incast_results(textbook(), tmp_path)
    assert [p.name for p in paths] == ["summary.json", "incast.png", "incast-fanin.png"]
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert len(summary["summaries"]) == 5 and summary["verdict"]["fanin"] == 7
    assert all(p.stat().st_size > 0 for p in paths)
    single = tmp_path / "single"
    single.mkdir()
    one = write_incast_results(result_of(measurement(DROPTAIL, 7, (0.5, 0.6)),
                                         measurement(ECN, 7, ())), single)
    assert [p.name for p in one] == ["summary.json", "incast.png"]


# --- the command ------------------------------------------------------------------------------


