"""The incast experiment without root: its parameters and what a scenario may ask of it,
each mode's setup (queue and hosts' TCP), which hosts send, the request/response program
over loopback (in-process and as processes), the statistics, the TCP counters' parsing, the
checks (PASS and FAIL cases computed by hand), the summary rows, the figures, and the
``testbed incast`` flags (whose run is replaced, so no test here can start an emulation)."""
from __future__ import annotations

import json
import math
import shutil
import socket
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict
from pathlib import Path

import numpy as np
import pytest
from pydantic import ValidationError
from tests.unit.stand_ins import StandInFabric, StandInRun, record_runs

from testbed.measure.pauses import agent_alive_checks
from testbed import errors
from testbed.capabilities import Platform, choose_paths, probe_capabilities
from testbed.cli import main
from testbed.experiments.incast.checks import (
    DROPTAIL,
    ECN,
    FASTER_BY,
    MODES,
    PFC,
    incast_checks,
    largest_fanin,
)
from testbed.experiments.incast.experiment import (
    MAX_FANIN,
    Incast,
    IncastParams,
    summary_cell,
)
from testbed.experiments.incast.summary import (
    completion_stats,
    ideal_round_s,
    measurement_line,
    summarize,
    timeout_onset,
)
from testbed.experiments.incast.workload import (
    CLIENT_GRACE_S,
    IncastMeasurement,
    Queries,
    bottleneck_port,
    client_argv,
    read_line,
    sender_hosts,
    server_argv,
)
from testbed.drive.flows import counter_deltas, parse_proc_net, tcp_loss_counters
from testbed.experiments.registry import load, validate
from testbed.harness.scenario import Scenario, ScenarioError
from testbed.measure.stats import percentile
from testbed.model.topology.fattree import fat_tree
from testbed.plan.modes import LOSSLESS_DSCP, mode_tcp
from testbed.plan.profiles import StepEcn
from testbed.traffic import incast as program
from testbed.traffic.incast import DEFAULT_CONNECT_TIMEOUT_S

LOOPBACK = "127.0.0.1"
TOS_OF_DSCP_26 = 26 << 2
IO_TIMEOUT_S = 10.0  # loopback exchanges finish in milliseconds; this only bounds a hang
RATE_MBIT = 10.0
RESPONSE_BYTES = 125_000  # 1 Mbit: a round of fan-in n carries n Mbit
ROUNDS = 3
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def platform(congestion: set[str], kconfig: dict[str, str] | None = None,
             tools: set[str] = frozenset({"tcpdump", "tshark"})) -> Platform:
    caps = probe_capabilities(kconfig or {"CONFIG_MODULES": "n"}, set(), set(), congestion,
                              {name: True for name in tools})
    return Platform("test", caps, choose_paths(caps))


HERE = platform({"reno", "cubic", "bbr"})  # this kind of machine: no dctcp


def experiment(link_rate_mbit: float | None = None, machine: Platform = HERE,
               **params) -> Incast:
    return Incast(Scenario(name="t", experiment="incast", link_rate_mbit=link_rate_mbit),
                  IncastParams(**params), machine)


def problems(params: dict, **scenario) -> list[tuple[tuple, str]]:
    with pytest.raises(ScenarioError) as info:
        validate({"name": "t", "experiment": "incast", "params": params, **scenario})
    return [(p.path, p.message) for p in info.value.problems]


# --- parameters -------------------------------------------------------------------------------


def test_the_defaults():
    p = IncastParams()
    assert p.fanins == [MAX_FANIN] and MAX_FANIN == 15
    assert p.modes == list(MODES) == ["droptail", "ecn", "pfc"]
    assert p.dscp == LOSSLESS_DSCP == 26
    assert (p.response_bytes, p.rounds, p.warmup_rounds, p.gap_s) == (65536, 20, 1, 0.2)
    assert p.buffer_bytes is None and p.capture_pauses is False
    e = experiment()
    assert (e.rate_mbit, e.mtu_bytes) == (10.0, 1500)
    assert e.buffer_bytes() == 62_500  # 50 ms at 10 Mbit/s


@pytest.mark.parametrize(("field", "value"), [
    ("fanins", [0]), ("fanins", [16]), ("fanins", []), ("fanins", [3, 3]), ("fanins", ["3"]),
    ("fanins", 3), ("modes", ["red"]), ("modes", []), ("modes", ["ecn", "ecn"]),
    ("response_bytes", 0), ("response_bytes", 2**31), ("rounds", 0), ("rounds", 2.0),
    ("rounds", 1001), ("warmup_rounds", -1), ("gap_s", -0.1), ("gap_s", math.nan),
    ("gap_s", 61.0), ("round_timeout_s", 0), ("round_timeout_s", math.inf),
    ("round_timeout_s", "60"), ("pfc_reaction_time_s", -1e-3), ("pfc_reaction_time_s", 1.5),
    ("dscp", 64), ("dscp", -1), ("buffer_bytes", 0), ("capture_pauses", "yes"),
])
def test_params_refuse_bad_values_naming_the_field(field, value):
    with pytest.raises(ValidationError) as info:
        IncastParams(**{field: value})
    assert info.value.errors()[0]["loc"][0] == field


@pytest.mark.parametrize(("field", "value"), [
    ("fanins", [1, 3, 7, 15]), ("modes", ["pfc"]), ("gap_s", 0), ("warmup_rounds", 0),
    ("pfc_reaction_time_s", 0), ("dscp", 0), ("rounds", 1000)])
def test_params_accept_the_limits(field, value):
    assert getattr(IncastParams(**{field: value}), field) == value


@pytest.mark.parametrize(("params", "scenario", "path"), [
    ({"receiver": "p9e0h0"}, {}, ("params", "receiver")),
    ({"buffer_bytes": 2999}, {}, ("params", "buffer_bytes")),  # under two 1500-byte frames
    ({"dscp": 0}, {}, ("params", "dscp")),  # pfc mode: best effort is not the lossless class
    # a 2-frame buffer: K (2 frames) is not below it, and PFC's headroom does not fit
    ({"buffer_bytes": 3000, "modes": ["ecn"]}, {}, ("params", "buffer_bytes")),
    ({"buffer_bytes": 3000, "modes": ["pfc"]}, {}, ("params", "buffer_bytes")),
    ({"capture_pauses": True, "modes": ["droptail"]}, {}, ("params", "capture_pauses")),
    ({}, {"topology": {"name": "fattree", "k": 4}}, ("topology",)),
    ({}, {"queue": {"pfc": True}}, ("queue",)),
    ({}, {"hosts": {"tcp_cc": "reno"}}, ("hosts",)),
])
def test_scenario_problems_name_their_field(params, scenario, path):
    found = problems(params, **scenario)
    assert [p for p, _ in found] == [path], found


def test_best_effort_traffic_is_fine_without_pfc():
    resolved = validate({"name": "t", "experiment": "incast",
                         "params": {"dscp": 0, "modes": ["droptail", "ecn"]}})
    assert [s.name for s in resolved.setups] == [DROPTAIL, ECN]


def test_a_capture_needs_tcpdump_and_tshark():
    bare = platform({"reno", "cubic"}, tools=set())
    found = experiment(machine=bare, modes=["pfc"], capture_pauses=True).problems()
    assert [(p.path, p.message.split(",")[0]) for p in found] == [
        (("params", "capture_pauses"), "needs tcpdump"),
        (("params", "capture_pauses"), "needs tshark")]
    assert experiment(modes=["pfc"], capture_pauses=True).problems() == []


def test_the_bundled_scenarios():
    sweep = validate({"name": "incast", "experiment": "incast", "link_rate_mbit": 10,
                      "params": {"fanins": [1, 3, 7, 15]}})
    assert [s.name for s in sweep.setups] == list(MODES)
    lossless = load("pfc-lossless")
    assert [s.name for s in lossless.setups] == [PFC]
    p = lossless.experiment.params
    assert p.capture_pauses and p.fanins == [15] and p.buffer_bytes == 300_000
    bundled = load("incast")
    assert [s.queue.buffer_bytes for s in bundled.setups] == [48_000, 48_000, 62_500]


# --- per mode ---------------------------------------------------------------------------------


def test_each_mode_is_a_setup_with_its_own_queue_on_the_same_buffer():
    e = experiment(buffer_bytes=100_000)
    droptail, ecn, pfc = e.setups()
    assert [s.name for s in (droptail, ecn, pfc)] == list(MODES)
    assert {s.queue.buffer_bytes for s in (droptail, ecn, pfc)} == {100_000}
    assert len({id(s.fabric) for s in (droptail, ecn, pfc)}) == 1
    assert len(droptail.fabric.hosts) == 16 and droptail.fabric.mtu_bytes == 1500
    assert droptail.queue.ecn is None and droptail.queue.pfc is None
    assert isinstance(ecn.queue.ecn, StepEcn) and ecn.queue.pfc is None
    assert ecn.queue_record["scheme"] == "dctcp"
    assert ecn.queue_record["ecn"][0]["value"] == ecn.queue.ecn.k_bytes
    assert pfc.queue.ecn is None and pfc.queue.pfc is not None
    assert pfc.queue.pfc.xoff_bytes + pfc.queue.pfc.headroom_bytes <= pfc.queue.buffer_bytes
    assert pfc.queue_record["pfc"]["xoff_bytes"] == pfc.queue.pfc.xoff_bytes
    assert pfc.queue_record["pfc"]["fan_in"] == 1  # incast sizes headroom for one feeder
    # the default traffic class is the one PFC protects
    assert pfc.queue.priority_for_dscp(e.params.dscp) in pfc.queue.lossless_priorities
    assert all(s.routing == "ecmp" for s in (droptail, ecn, pfc))


def test_the_pfc_mode_may_have_a_buffer_of_its_own():
    # PFC's headroom at 10 Mbit/s (53 KB) does not fit in the 32 KB where drop-tail collapses
    with pytest.raises(errors.ConfigError, match="32000 B cannot hold the pfc queue") as refused:
        experiment(buffer_bytes=32_000).setups()
    assert refused.value.field == "params.buffer_bytes"
    droptail, ecn, pfc = experiment(buffer_bytes=32_000, pfc_buffer_bytes=62_500).setups()
    assert droptail.queue.buffer_bytes == ecn.queue.buffer_bytes == 32_000
    assert pfc.queue.buffer_bytes == 62_500 and pfc.queue_record["buffer_bytes"] == 62_500
    with pytest.raises(errors.ConfigError) as small:
        experiment(buffer_bytes=32_000, pfc_buffer_bytes=40_000).setups()
    assert small.value.field == "params.pfc_buffer_bytes"
    found = experiment(pfc_buffer_bytes=1000).problems()
    assert [p.path for p in found] == [("params", "pfc_buffer_bytes")]


def test_a_longer_pause_reaction_needs_more_headroom():
    [quick] = experiment(modes=["pfc"], pfc_reaction_time_s=0.001).setups()
    [slow] = experiment(modes=["pfc"], pfc_reaction_time_s=0.010).setups()
    assert slow.queue.pfc.headroom_bytes > quick.queue.pfc.headroom_bytes
    assert slow.queue.pfc.xoff_bytes < quick.queue.pfc.xoff_bytes


def test_only_ecn_mode_turns_ecn_on_and_the_other_modes_share_one_algorithm():
    droptail, ecn, pfc = experiment().setups()
    assert ecn.tcp.ecn and ecn.tcp.congestion_control == "cubic"
    assert ecn.host_sysctls()["net.ipv4.tcp_ecn"] == "1"
    for setup in (droptail, pfc):
        assert not setup.tcp.ecn and setup.tcp.congestion_control == "cubic"
        assert "net.ipv4.tcp_ecn" not in setup.host_sysctls()
    stock = platform({"reno", "cubic", "dctcp"})
    assert mode_tcp(True, stock).congestion_control == "dctcp"
    assert mode_tcp(False, stock).congestion_control == "cubic"
    bare = platform({"reno"}, {"CONFIG_MODULES": "n", "CONFIG_TCP_CONG_CUBIC": "n"})
    assert mode_tcp(False, bare).congestion_control == "reno"


def test_senders_spread_over_the_pods_and_never_include_the_receiver():
    fabric = fat_tree(4, host_rate_mbit=RATE_MBIT)
    assert sender_hosts(fabric, "p0e0h0", 1) == ["p1e0h0"]
    three = sender_hosts(fabric, "p0e0h0", 3)
    assert sorted(name[:2] for name in three) == ["p1", "p2", "p3"]
    every = sender_hosts(fabric, "p0e0h0", MAX_FANIN)
    assert len(set(every)) == MAX_FANIN and "p0e0h0" not in every
    assert sender_hosts(fabric, "p0e0h0", 7) == every[:7]  # a sweep adds senders
    assert sender_hosts(fabric, "p0e0h0", 4)[-1] == "p0e0h1"  # the receiver's own pod last
    assert sender_hosts(fabric, "p2e1h1", 1) == ["p3e0h0"]
    assert bottleneck_port(fabric, "p0e0h0") == "p0e0-eth1"
    with pytest.raises(errors.ConfigError):
        sender_hosts(fabric, "p0e0h0", 16)


def test_the_driver_speaks_the_programs_command_line():
    queries = Queries(response_bytes=1234, rounds=7, warmup=2, gap_s=0.05, dscp=26,
                      round_timeout_s=9.5)
    client = program.build_parser().parse_args(
        client_argv(["10.1.0.2", "10.2.0.2"], 5601, queries)[3:])
    assert (client.mode, client.response_bytes, client.rounds, client.warmup, client.gap_s,
            client.dscp, client.round_timeout_s) == ("query", 1234, 7, 2, 0.05, 26, 9.5)
    assert client.hold_after_warmup  # the driver reads the counters after the warm-up
    assert program.parse_servers(client.servers, client.port) == [("10.1.0.2", 5601),
                                                                   ("10.2.0.2", 5601)]
    server = program.build_parser().parse_args(server_argv(5601, 26)[3:])
    assert (server.mode, server.port, server.dscp, server.connections) == ("serve", 5601, 26, 1)
    # connecting, then 9 rounds of at most 9.55 s each, then the grace
    assert queries.client_limit_s() == pytest.approx(
        DEFAULT_CONNECT_TIMEOUT_S + 9 * 9.55 + CLIENT_GRACE_S)


def test_the_experiment_asks_the_programs_for_its_params():
    e = experiment(response_bytes=1234, rounds=7, warmup_rounds=2, gap_s=0.05, dscp=10,
                   round_timeout_s=9.5)
    assert e.queries() == Queries(1234, 7, 2, 0.05, 10, 9.5)


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


def test_the_client_calls_back_between_warm_up_and_recorded_queries():
    addresses, threads = start_servers(2, dscp=0)
    calls = []
    result = program.query(addresses, 10_000, rounds=2, gap_s=0.01, dscp=0,
                           round_timeout_s=IO_TIMEOUT_S, connect_timeout_s=IO_TIMEOUT_S,
                           warmup=2, warmed=lambda: calls.append(time.monotonic()))
    for thread in threads:
        thread.join(IO_TIMEOUT_S)
    assert result["error"] is None and len(calls) == 1
    last_warmup = result["warmup_rounds"][-1]
    assert last_warmup["start_monotonic_s"] + last_warmup["round_s"] <= calls[0]
    assert calls[0] <= result["rounds"][0]["start_monotonic_s"]


def test_a_held_client_waits_for_its_caller_after_the_warm_up():
    # the driver reads every host's counters while the client waits, then lets it go on
    addresses, threads = start_servers(1, dscp=0)
    queries = Queries(response_bytes=5000, rounds=2, warmup=1, gap_s=0.0, dscp=0,
                      round_timeout_s=IO_TIMEOUT_S)
    argv = client_argv([addresses[0][0]], addresses[0][1], queries)
    client = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    try:
        assert read_line(client.stdout, IO_TIMEOUT_S).strip() == program.WARMED_LINE.encode()
        time.sleep(0.2)
        assert client.poll() is None  # held: no recorded query without the caller's word
        out, _ = client.communicate(b"go\n", timeout=IO_TIMEOUT_S)
    finally:
        if client.poll() is None:
            client.kill()
            client.wait()
    threads[0].join(IO_TIMEOUT_S)
    result = json.loads(out)
    assert client.returncode == 0 and len(result["rounds"]) == 2
    assert len(result["warmup_rounds"]) == 1


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
        client = subprocess.run([sys.executable, "-m", "testbed.traffic.incast", "query",
                                 "--servers", f"{LOOPBACK}:{port}", "--response-bytes",
                                 "100000", "--rounds", "2", "--dscp", "26"],
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


def test_ideal_round_is_the_payload_at_link_rate():
    assert ideal_round_s(15, 65536, 10.0) == pytest.approx(15 * 65536 * 8 / 10e6)




def test_completion_statistics():
    stats = completion_stats([0.1, 0.2, 0.3, 0.4, 1.0])
    assert stats["count"] == 5 and stats["median_s"] == pytest.approx(0.3)
    assert stats["max_s"] == 1.0 and stats["mean_s"] == pytest.approx(0.4)
    # numpy's linear rule: rank 0.99 * 4 = 3.96, between 0.4 and 1.0
    assert stats["p99_s"] == pytest.approx(0.4 + 0.96 * 0.6)
    assert completion_stats([]) == {"count": 0, "mean_s": None, "median_s": None,
                                    "p99_s": None, "max_s": None}


def measurement(mode: str = DROPTAIL, fanin: int = 2, round_s=(0.2, 0.4, 0.3),
                timeouts: int = 0, probes: int = 0, drops: int = 0,
                switch_drops: int | None = None,
                marks: int | None = None, pauses: int | None = None, lossless_drops: int = 0,
                rx: int = 1000, tx: int | None = None,
                error: str | None = None) -> IncastMeasurement:
    senders = [f"s{i}" for i in range(fanin)]
    switch_drops = drops if switch_drops is None else switch_drops
    m = IncastMeasurement(mode, fanin, "r", senders, RESPONSE_BYTES, round_s=list(round_s),
                          flow_s=[[t] * fanin for t in round_s],
                          send_spread_s=[1e-5] * len(round_s))
    m.tcp = {name: {"timeouts": 0, "probe_recoveries": 0, "retransmits": 0}
             for name in [*senders, "r"]}
    m.tcp["s0"] = {"timeouts": timeouts, "probe_recoveries": probes,
                   "retransmits": 3 * (timeouts + probes)}
    m.queue_drops = drops
    m.switches = {"rx_packets": rx, "tx_packets": rx - switch_drops if tx is None else tx,
                  "queue_drops": switch_drops}
    if marks is not None:
        m.queues = {"path": "ebpf", "totals": {"marks": marks, "max_queue_bytes": 9000}}
    if pauses is not None:
        m.pfc = {"pause_frames_sent": pauses, "pause_frames_received": pauses,
                 "paused_time_s": 0.1, "pause_storms": 0, "lossless_drops": lossless_drops}
    m.error = error
    return m


def test_a_measurement_summary():
    s = summarize(measurement(fanin=2, round_s=(0.2, 0.4), timeouts=2, drops=7,
                              switch_drops=5), rate_mbit=RATE_MBIT)
    assert s["rounds_done"] == 2 and s["round"]["median_s"] == pytest.approx(0.3)
    assert s["flow"]["count"] == 4
    assert s["ideal_round_s"] == pytest.approx(0.2)  # 2 x 125 kB at 10 Mbit/s
    assert s["median_over_ideal"] == pytest.approx(1.5)
    # goodput per round: 2 Mbit in 0.2 s and in 0.4 s -> 10 and 5 Mbit/s, median 7.5
    assert s["goodput_mbit"] == pytest.approx(7.5) and s["goodput_fraction"] == pytest.approx(0.75)
    assert (s["tcp_timeouts"], s["sender_timeouts"], s["tcp_retransmits"]) == (2, 2, 6)
    assert (s["tcp_probe_recoveries"], s["tcp_timer_recoveries"]) == (0, 2)
    probed = summarize(measurement(timeouts=1, probes=3), rate_mbit=RATE_MBIT)
    assert (probed["tcp_probe_recoveries"], probed["tcp_timer_recoveries"]) == (3, 4)
    assert (s["queue_drops"], s["switch_queue_drops"], s["host_queue_drops"]) == (7, 5, 2)
    assert s["emulator_lost_packets"] == 0 and s["ce_marks"] is None
    assert s["pause_frames_sent"] is None and s["lossless_drops"] is None
    paused = summarize(measurement(PFC, pauses=50, lossless_drops=1), RATE_MBIT)
    assert (paused["pause_frames_sent"], paused["lossless_drops"]) == (50, 1)
    lossy = summarize(measurement(rx=1000, tx=900), rate_mbit=RATE_MBIT)
    assert lossy["emulator_lost_packets"] == 100
    assert lossy["emulator_loss_fraction"] == pytest.approx(0.1)
    empty = summarize(measurement(round_s=(), error="round 0: timed out"), rate_mbit=RATE_MBIT)
    assert empty["round"]["count"] == 0 and empty["goodput_mbit"] is None
    assert empty["error"] == "round 0: timed out"


def test_a_measurement_line():
    line = measurement_line(summarize(measurement(ECN, 2, (0.2, 0.4), timeouts=1, drops=3,
                                                  marks=12), RATE_MBIT))
    assert line == ("fan-in  2: 2 rounds, median 0.300 s, p99 0.398 s, max 0.400 s (ideal "
                    "0.200 s); 3 queue drops, 1 TCP timeouts, 0 tail-loss probe recoveries, 3 "
                    "retransmits, 12 CE marks")
    stopped = measurement_line(summarize(measurement(round_s=(), error="round 0: x"),
                                         RATE_MBIT))
    assert "no round completed" in stopped and stopped.endswith("STOPPED: round 0: x")


# --- TCP counters -----------------------------------------------------------------------------
NETSTAT = """TcpExt: SyncookiesSent TCPTimeouts TCPLossProbes TCPLossProbeRecovery
TcpExt: 0 12 4 3
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
    assert tables["TcpExt"] == {"SyncookiesSent": 0, "TCPTimeouts": 12, "TCPLossProbes": 4,
                                "TCPLossProbeRecovery": 3}
    assert tables["Tcp"]["MaxConn"] == -1 and tables["Tcp"]["RetransSegs"] == 37
    assert tables["IpExt"]["InOctets"] == 123456 and tables["Udp"] == {"InDatagrams": 9}
    assert tcp_loss_counters(NETSTAT + SNMP) == {"timeouts": 12, "probe_recoveries": 3,
                                                 "retransmits": 37}
    assert set(parse_proc_net(SNMP)) == {"Ip", "Tcp", "Udp"}


def test_this_machines_own_counters_parse():
    with open("/proc/net/netstat") as netstat, open("/proc/net/snmp") as snmp:
        counters = tcp_loss_counters(netstat.read() + snmp.read())
    assert min(counters.values()) >= 0 and set(counters) == {"timeouts", "probe_recoveries",
                                                              "retransmits"}


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




# --- checks -----------------------------------------------------------------------------------


def results_of(*measurements: IncastMeasurement, capture: dict | None = None) -> dict:
    """Each mode's results as ``Incast.measure`` returns them (what the checks read)."""
    results: dict[str, dict] = {}
    for m in measurements:
        r = results.setdefault(m.mode, {"measurements": [], "summaries": [],
                                        "dir": f"results/x/setups/{m.mode}"})
        r["measurements"].append(asdict(m))
        r["summaries"].append(summarize(m, RATE_MBIT))
    if capture is not None:
        results[PFC]["pause_capture"] = capture
    return results


def textbook() -> dict:
    """What the literature expects: drop-tail loses packets and waits for timeouts, ECN
    marks instead, PFC pauses instead and loses nothing."""
    return results_of(
        measurement(DROPTAIL, 1, (0.11, 0.12, 0.11)),
        measurement(DROPTAIL, 3, (0.35, 0.6, 0.4), timeouts=1, drops=4),
        measurement(DROPTAIL, 7, (0.9, 1.2, 1.6), timeouts=5, drops=40),
        measurement(ECN, 7, (0.75, 0.8, 0.85), marks=300),
        measurement(PFC, 7, (0.72, 0.74, 0.8), pauses=50),
    )


def outcomes(checks) -> dict[tuple[str, str], str]:
    return {(c.setup, c.name): c.outcome for c in checks}


def test_the_textbook_case_passes_every_check():
    checks = incast_checks(textbook(), ROUNDS)
    assert outcomes(checks) == {
        (DROPTAIL, "every query completed"): "PASS",
        (ECN, "every query completed"): "PASS",
        (PFC, "every query completed"): "PASS",
        (DROPTAIL, "drop-tail drops packets"): "PASS",
        (DROPTAIL, "drop-tail waits on retransmission timers"): "PASS",
        (ECN, "ECN marks"): "PASS",
        (ECN, "ECN: fewer timer recoveries than drop-tail"): "PASS",
        (PFC, "PFC: lossless-class drops"): "PASS",
        (PFC, "PFC: switch queue drops"): "PASS",
        (PFC, "PFC pauses instead"): "PASS",
        (ECN, "ecn p99 query completion below drop-tail's"): "PASS",
        (PFC, "pfc p99 query completion below drop-tail's"): "PASS",
    }
    by_name = {(c.setup, c.name): c for c in checks}
    completed = by_name[(DROPTAIL, "every query completed")]
    assert (completed.measured, completed.expected) == (9, ">= 9")  # 3 fan-ins x 3 rounds
    # p99 by numpy's rule over 3 rounds: rank 1.98; drop-tail 1.2 + 0.98 * 0.4 = 1.592
    tail = by_name[(ECN, "ecn p99 query completion below drop-tail's")]
    assert tail.measured == pytest.approx(0.8 + 0.98 * 0.05)
    assert tail.expected == f"<= {round(1.592 * (1 - FASTER_BY), 6):g}"
    fewer = by_name[(ECN, "ECN: fewer timer recoveries than drop-tail")]
    assert (fewer.measured, fewer.expected) == (0, "< 5")
    assert by_name[(DROPTAIL, "drop-tail drops packets")].measured == 40
    assert "40 queue drops" in by_name[(DROPTAIL, "drop-tail drops packets")].statement
    assert not any("NOT" in c.statement for c in checks)


def test_the_checks_say_when_the_expectations_fail():
    checks = incast_checks(results_of(
        measurement(DROPTAIL, 7, (0.8, 0.8, 0.8)),
        measurement(ECN, 7, (0.8, 0.9, 0.9), marks=0),
        measurement(PFC, 7, (0.8, 0.9, 0.9), drops=3, pauses=0, lossless_drops=3),
    ), ROUNDS)
    found = outcomes(checks)
    assert found[(DROPTAIL, "drop-tail drops packets")] == "FAIL"
    assert found[(DROPTAIL, "drop-tail waits on retransmission timers")] == "FAIL"
    assert found[(ECN, "ECN marks")] == "FAIL"
    # no drop-tail timeouts to compare with: not judged, and said why
    assert found[(ECN, "ECN: fewer timer recoveries than drop-tail")] == "n/a"
    assert found[(PFC, "PFC: lossless-class drops")] == "FAIL"
    assert found[(PFC, "PFC: switch queue drops")] == "FAIL"
    assert found[(PFC, "PFC pauses instead")] == "FAIL"
    # 0.899 against drop-tail's 0.8: not 10% lower
    assert found[(ECN, "ecn p99 query completion below drop-tail's")] == "FAIL"
    assert found[(PFC, "pfc p99 query completion below drop-tail's")] == "FAIL"
    text = "\n".join(c.statement for c in checks)
    assert "NOT as incast predicts" in text and "NOT lossless" in text
    assert "NOT at least 10% lower" in text and "no timer recoveries for ECN to remove" in text


def test_tail_loss_probes_count_as_waiting_on_a_timer():
    # Linux's tail-loss probe fires before the RTO and repairs a flow's lost tail: 139 drops
    # with no RTO but probes that recovered losses is still incast's timer-bound recovery
    checks = incast_checks(results_of(
        measurement(DROPTAIL, 15, (0.21, 0.21, 0.36), probes=4, drops=139),
        measurement(ECN, 15, (0.21, 0.21, 0.21), probes=1, marks=1900)), ROUNDS)
    by_name = {c.name: c for c in checks}
    waits = by_name["drop-tail waits on retransmission timers"]
    assert waits.passed and waits.measured == 4
    assert "0 RTOs, 4 tail-loss probes that repaired a loss" in waits.statement
    fewer = by_name["ECN: fewer timer recoveries than drop-tail"]
    assert fewer.passed and (fewer.measured, fewer.expected) == (1, "< 4")


def test_more_ecn_timeouts_than_drop_tail_fail():
    checks = incast_checks(results_of(
        measurement(DROPTAIL, 7, (0.8, 0.8, 0.8), timeouts=2, drops=5),
        measurement(ECN, 7, (0.9, 0.9, 0.9), timeouts=3, marks=10)), ROUNDS)
    [fewer] = [c for c in checks if c.name.startswith("ECN: fewer")]
    assert fewer.passed is False and (fewer.measured, fewer.expected) == (3, "< 2")
    assert "NOT fewer than drop-tail's 2" in fewer.statement


def test_the_tail_bound_at_its_tolerance():
    drop_p99 = 1.0
    bound = drop_p99 * (1 - FASTER_BY)
    for ecn_s, passed in ((bound - 0.01, True), (bound, True), (bound + 0.01, False)):
        checks = incast_checks(results_of(measurement(DROPTAIL, 7, (drop_p99,) * 3),
                                          measurement(ECN, 7, (ecn_s,) * 3, marks=1)), ROUNDS)
        [tail] = [c for c in checks if c.name.endswith("below drop-tail's")]
        assert tail.passed is passed, ecn_s


def test_modes_not_run_make_no_claims():
    checks = incast_checks(results_of(measurement(DROPTAIL, 7, (1.0, 1.5, 1.2), timeouts=2,
                                                  drops=9)), ROUNDS)
    assert {c.setup for c in checks} == {DROPTAIL}
    assert len(checks) == 3 and all(c.passed for c in checks)
    pfc_only = incast_checks(results_of(measurement(PFC, 15, (0.8,) * 3, pauses=9)), ROUNDS)
    assert [c.name for c in pfc_only] == ["every query completed", "PFC: lossless-class drops",
                                          "PFC: switch queue drops", "PFC pauses instead"]
    assert incast_checks({}, ROUNDS) == []
    assert largest_fanin({}) == (None, {})


def test_a_stopped_client_fails_its_modes_completion():
    checks = incast_checks(results_of(
        measurement(DROPTAIL, 3, (0.5, 0.6, 0.5)),
        measurement(DROPTAIL, 7, (0.5,), error="round 1: 1 of 7 responses incomplete")),
        ROUNDS)
    [completed] = [c for c in checks if c.name == "every query completed"]
    assert completed.passed is False and completed.measured == 4
    assert "fan-in 7 stopped after 1 rounds: round 1: 1 of 7" in completed.statement


def capture(frames: int = 40, agent_sent: int = 40) -> dict:
    return {"pcap": "results/x/pause-frames.pcap", "host": "p0e0h1",
            "interface": "p0e0h1-eth0", "sent_by": "p0e0-eth2", "congested": "p0e0-eth1",
            "frames": frames, "pfc_frames": frames, "xoff_frames": frames // 2,
            "xon_frames": frames // 2, "by_priority": {3: frames}, "sources": [],
            "agent_sent": agent_sent, "agent_received": agent_sent, "kernel_dropped": 0,
            "tcpdump": {}, "error": None}


def test_a_capture_adds_its_checks_to_the_pfc_modes():
    results = results_of(measurement(PFC, 15, (0.8,) * 3, pauses=40), capture=capture())
    found = outcomes(incast_checks(results, ROUNDS))
    assert found[(PFC, "tshark decodes the captured pause frames as PFC")] == "PASS"
    assert found[(PFC, "captured pause frames against the agent's count")] == "PASS"
    results[PFC]["pause_capture"] = capture(agent_sent=41)
    found = outcomes(incast_checks(results, ROUNDS))
    assert found[(PFC, "captured pause frames against the agent's count")] == "FAIL"


def test_the_pause_agent_is_a_trust_check():
    results = textbook()
    results[PFC]["pause_agent_running"] = False
    [check] = agent_alive_checks(results)  # the harness adds it to every run's trust
    assert (check.setup, check.passed) == (PFC, False)
    del results[PFC]["pause_agent_running"]
    assert agent_alive_checks(results) == []


# --- rows and figures -------------------------------------------------------------------------


def test_rows_list_every_mode_and_fan_in_then_the_timeout_onset():
    rows = experiment().rows(textbook())
    assert [what for what, _ in rows] == [
        "droptail, fan-in 1", "droptail, fan-in 3", "droptail, fan-in 7", "ecn, fan-in 7",
        "pfc, fan-in 7", "first fan-in waiting on a timer"]
    assert rows[-1][1] == "droptail 3, ecn none, pfc none"
    ecn = dict(rows)["ecn, fan-in 7"]
    assert ecn.startswith("3 queries: median 0.800 s, p99 0.849 s, max 0.850 s (ideal 0.700 s)")
    assert ecn.endswith("0 drops, 0 RTOs, 0 TLP recoveries, 0 retransmits, 300 CE marks")
    assert dict(rows)["pfc, fan-in 7"].endswith("50 pause frames, 0 lossless drops")
    with_capture = experiment().rows(results_of(measurement(PFC, 15, (0.8,) * 3, pauses=4),
                                                capture=capture()))
    assert with_capture[-1] == ("pause capture", (
        "40 of 40 frames decoded as PFC by tshark (20 pause, 20 resume) in "
        "results/x/pause-frames.pcap, on p0e0h1 (p0e0h1-eth0); the pause agent sent 40 on "
        "that link"))


def test_timeout_onset_is_the_smallest_fan_in_with_a_timeout():
    results = textbook()
    assert timeout_onset(results[DROPTAIL]["summaries"]) == 3
    assert timeout_onset(results[ECN]["summaries"]) is None


def test_a_summary_cell_without_rounds():
    cell = summary_cell(summarize(measurement(round_s=(), error="connect: refused"), RATE_MBIT))
    assert cell.startswith("0 queries: median - s, p99 - s, max - s")
    assert "goodput -" in cell and cell.endswith("stopped: connect: refused")


def assert_png(path: Path) -> None:
    assert path.read_bytes()[:len(PNG_SIGNATURE)] == PNG_SIGNATURE


def test_figures_for_a_sweep_and_for_one_fan_in(tmp_path):
    paths = experiment().plots(textbook(), tmp_path, "run | fattree k=4 | 10 Mbit/s links")
    assert [p.name for p in paths] == ["incast.png", "incast-fanin.png"]
    for path in paths:
        assert_png(path)
    single = tmp_path / "single"
    single.mkdir()
    one = experiment().plots(results_of(measurement(DROPTAIL, 7, (0.5, 0.6)),
                                        measurement(ECN, 7, ())), single, "run")
    assert [p.name for p in one] == ["incast.png"]
    assert experiment().plots({}, single, "run") == []


# --- the command ------------------------------------------------------------------------------


def test_the_earlier_flags_still_work(monkeypatch):
    # The flags change fields of scenarios/incast.yaml, whose PFC buffer is sized for its
    # 10 Mbit/s: at 20 Mbit/s the pfc mode needs a buffer of its own.
    started = record_runs(monkeypatch)
    main(["incast", "--sweep", "1,3,7", "--mode", "pfc", "--warmup", "2", "--rate-mbit", "20",
          "--mtu", "9000", "--pfc-buffer-bytes", "300000", "--capture-pauses", "true",
          "--quiet"])
    main(["incast", "--fanin", "7", "--modes", "droptail,ecn", "--quiet"])
    sweep, single = started
    p = sweep.experiment.params
    assert (p.fanins, p.modes, p.warmup_rounds, p.pfc_buffer_bytes, p.capture_pauses) == (
        [1, 3, 7], ["pfc"], 2, 300_000, True)
    assert (sweep.experiment.rate_mbit, sweep.experiment.mtu_bytes) == (20.0, 9000)
    assert [s.name for s in sweep.setups] == [PFC]
    assert single.experiment.params.fanins == [7]
    assert [s.name for s in single.setups] == [DROPTAIL, ECN]


# --- measure, on a stand-in fabric -------------------------------------------------------------
# Every program the experiment starts in a host is replaced by a stand-in of the same command
# line: the servers exit, the client answers each round in (fan-in x 0.1) s, tcpdump writes
# one pause and one resume frame to its pcap; counters move by known amounts. No namespace,
# switch or packet is involved, but measure() runs as on a fabric.

STAND_IN_QUERY = r"""
import json, sys
args = sys.argv[1:]
servers = args[args.index("--servers") + 1].split(",")
rounds, warmup = int(args[args.index("--rounds") + 1]), int(args[args.index("--warmup") + 1])
n = len(servers)
done = {"start_monotonic_s": 0.0, "round_s": 0.1 * n, "flow_s": [0.1 * n] * n,
        "send_spread_s": 1e-5}
print(json.dumps({"servers": servers, "warmup_rounds": [done] * warmup,
                  "rounds": [done] * rounds, "error": None}))
"""
STAND_IN_TCPDUMP = r"""
import signal, sys, time
from scapy.layers.l2 import Ether
from scapy.utils import wrpcap
from testbed.plan.pfc_frames import xoff_frame, xon_frame
path = sys.argv[sys.argv.index("-w") + 1]
wrpcap(path, [Ether(xoff_frame("02:00:00:00:00:01", [3])),
              Ether(xon_frame("02:00:00:00:00:01", [3]))])
def stop(*_):
    sys.stderr.write("2 packets captured\n2 packets received by filter\n"
                     "0 packets dropped by kernel\n")
    sys.exit(0)
signal.signal(signal.SIGTERM, stop)
sys.stderr.write("tcpdump: listening on p0e0h1-eth0\n")
sys.stderr.flush()
while True:
    time.sleep(0.05)
"""


def stand_in(argv: list[str]) -> list[str]:
    if argv[0] == "cat":
        return argv  # the TCP counters: this machine's own, read as they are
    if argv[0] == "tcpdump":
        return [sys.executable, "-c", STAND_IN_TCPDUMP, *argv[1:]]
    if "serve" in argv:
        return [sys.executable, "-c", "pass"]
    assert "query" in argv, argv
    return [sys.executable, "-c", STAND_IN_QUERY, *argv[argv.index("query") + 1:]]


def agent_counters():
    """The pause agent's counters, read after read: two frames sent to p0e0h1 after the
    first reading."""
    reads = 0

    def read() -> dict:
        nonlocal reads
        reads += 1
        sent = 0 if reads == 1 else 1
        return {"p0e0-eth2": {"xoff_sent": sent, "xon_sent": sent, "frames_received": 0,
                              "pauses": 0, "paused_s": 0.0, "storms": 0},
                "p0e0h1-eth0": {"xoff_sent": 0, "xon_sent": 0, "frames_received": 2 * sent,
                                "pauses": sent, "paused_s": 0.1 * sent, "storms": 0}}
    return read


def running_incast(fabric, workdir: Path) -> StandInFabric:
    """The stand-in fabric with PFC, its programs the stand-ins above; 4 more packets dropped
    by the queues, 100 more through the switches and 10 more pause frames at every reading."""
    return StandInFabric(fabric, workdir, pause=agent_counters(),
                         start=lambda host, argv, kwargs: subprocess.Popen(stand_in(argv),
                                                                           **kwargs),
                         steps={"queue_drops": 4, "switch_packets": 100, "pause_frames": 10})


def test_measure_runs_every_fan_in_and_keeps_the_capture(tmp_path, monkeypatch):
    monkeypatch.setattr("testbed.experiments.incast.experiment.PFC_SETTLE_S", 0.0)
    if shutil.which("tshark") is None:
        pytest.fail("tshark is not installed; scripts/install.sh installs it")
    e = experiment(fanins=[1, 3], rounds=2, modes=["pfc"], capture_pauses=True)
    [setup] = e.setups()
    net = running_incast(setup.fabric, tmp_path)
    result = e.measure(StandInRun(net, setup, tmp_path))
    one, three = result["summaries"]
    assert (one["fanin"], one["rounds_done"], one["round"]["median_s"]) == (1, 2, 0.1)
    assert (three["fanin"], three["round"]["median_s"]) == (3, pytest.approx(0.3))
    assert one["queue_drops"] == 4 and one["switch_queue_drops"] == 0  # one reading later
    assert one["pause_frames_sent"] == 10 and one["lossless_drops"] == 0
    assert (tmp_path / "fanin3" / "client.json").exists()
    started = [argv[3] if argv[0] == sys.executable else argv[0] for _, argv in net.started]
    started = [what for what in started if what != "cat"]
    assert started == ["tcpdump", "serve", "query", "serve", "serve", "serve", "query"]
    capture = result["pause_capture"]
    assert capture["pcap"] == str(tmp_path / "pause-frames.pcap")
    assert (capture["frames"], capture["pfc_frames"], capture["xoff_frames"],
            capture["xon_frames"]) == (2, 2, 1, 1)
    assert (capture["agent_sent"], capture["agent_received"]) == (2, 2)
    assert capture["tcpdump"] == {"captured": 2, "received": 2, "kernel_dropped": 0}
    assert result["pause_agent_running"] is True and result["fidelity"]["trustworthy"]
    results = {PFC: {**json.loads(json.dumps(result)), "dir": str(tmp_path)}}
    assert [c.outcome for c in incast_checks(results, 2)] == ["PASS"] * 6
    assert [c.outcome for c in agent_alive_checks(results)] == ["PASS"]
