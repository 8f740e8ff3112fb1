"""The transports: message splitting over channels, send/recv/sendrecv/barrier in process and
over TCP on 127.0.0.1 (on-demand and full-mesh connections, TCP_NODELAY, DSCP), recording,
and the host programs run as 4 real rank processes over TCP."""
from __future__ import annotations

import hashlib
import socket
import threading

import numpy as np
import pytest

from tests.unit.ranks import free_ports, loopback_hosts, run_rank_processes, run_ranks
from testbed.traffic.collectives.allreduce import expected_digest
from testbed.traffic.collectives.transport import (
    HELLO,
    HELLO_MAGIC,
    RecordingTransport,
    TcpTransport,
    close_local,
    local_transports,
    split_message,
)

IO_TIMEOUT_S = 10.0
WORLD = 4


# --- splitting ----------------------------------------------------------------------------------


def test_split_message_gives_each_channel_at_least_the_minimum():
    assert split_message(10, 4, 64) == [(0, 10)]
    assert split_message(256, 4, 64) == [(0, 64), (64, 128), (128, 192), (192, 256)]
    assert split_message(200, 4, 64) == [(0, 67), (67, 134), (134, 200)]
    assert split_message(10**6, 4, 64) == [(0, 250000), (250000, 500000), (500000, 750000),
                                           (750000, 1000000)]
    assert split_message(0, 4, 64) == [(0, 0)]


# --- in process ---------------------------------------------------------------------------------


@pytest.fixture
def local():
    made = []

    def make(world, channels=1, min_part_bytes=8):
        made.append(local_transports(world, channels, IO_TIMEOUT_S, min_part_bytes))
        return made[-1]

    yield make
    for t in made:
        close_local(t)


def exchange_all(transports) -> list[dict]:
    """Every rank sends a distinct 1 MiB-ish message to every other rank and receives theirs,
    with sendrecv to the ring neighbours and send/recv for the rest."""
    world = len(transports)

    def message(src, dst):
        return np.arange(250_003, dtype=np.float32) * (src + 1) + dst

    def rank_main(rank):
        t = transports[rank]
        got = {}
        nxt, prev = (rank + 1) % world, (rank - 1) % world
        got[prev] = np.empty(250_003, dtype=np.float32)
        t.sendrecv(nxt, message(rank, nxt), prev, got[prev])
        for k in range(2, world):  # pairwise: one thread per rank, so pair sends with receives
            dst, src = (rank + k) % world, (rank - k) % world
            got[src] = np.empty(250_003, dtype=np.float32)
            t.sendrecv(dst, message(rank, dst), src, got[src])
        t.barrier()
        return {src: bool(np.array_equal(buf, message(src, rank))) for src, buf in got.items()}

    return run_ranks(world, rank_main)


@pytest.mark.parametrize("channels", [1, 3])
def test_local_messages_arrive_whole_and_in_order(local, channels):
    results = exchange_all(local(WORLD, channels))
    assert all(all(ok.values()) and len(ok) == WORLD - 1 for ok in results)


def test_barrier_holds_every_rank_until_all_entered(local):
    transports = local(WORLD)
    entered, lock = [], threading.Lock()
    late = threading.Event()

    def rank_main(rank):
        if rank == 2:
            assert not late.wait(0.3)  # rank 2 arrives 0.3 s after the others
        with lock:
            entered.append(rank)
        transports[rank].barrier()
        with lock:
            return len(entered)

    assert run_ranks(WORLD, rank_main) == [WORLD] * WORLD


def test_recv_from_a_closed_peer_raises(local):
    transports = local(2)
    for writer, _ in transports[0].wires.get(1, 0):
        writer.close()
    with pytest.raises(ConnectionError):
        transports[0].recv(1, bytearray(4))


def test_recv_without_progress_times_out():
    transports = local_transports(2, io_timeout_s=0.2)
    try:
        with pytest.raises(TimeoutError, match="no progress"):
            transports[0].recv(1, bytearray(4))
    finally:
        close_local(transports)


def test_bad_peers_are_refused(local):
    t = local(2)[0]
    for peer in (0, 2, -1):
        with pytest.raises(ValueError, match="bad peer"):
            t.send(peer, b"x")


def test_recording_transport_records_messages_and_bytes_per_peer(local):
    transports = local(3)
    recorders = [RecordingTransport(t, origin_s=0.0) for t in transports]

    def rank_main(rank):
        rec = recorders[rank]
        if rank == 0:
            with rec.tagged("grad"):
                rec.send(1, np.zeros(10, dtype=np.float32))
                rec.send(2, b"abc")
            rec.recv(1, bytearray(5))
        elif rank == 1:
            buf = np.empty(10, dtype=np.float32)
            rec.recv(0, buf)
            rec.send(0, b"hello")
        else:
            rec.recv(0, bytearray(3))
        rec.barrier()  # not recorded

    run_ranks(3, rank_main)
    sent0 = [(m.src, m.dst, m.size_bytes, m.tag) for m in recorders[0].sent]
    assert sent0 == [(0, 1, 40, "grad"), (0, 2, 3, "grad")]
    assert recorders[0].tag == ""
    assert [(m.src, m.dst, m.size_bytes) for m in recorders[1].received] == [(0, 1, 40)]
    assert recorders[0].bytes_per_peer() == {1: {"sent_bytes": 40, "received_bytes": 5},
                                             2: {"sent_bytes": 3, "received_bytes": 0}}
    assert all(m.t_s > 0 for r in recorders for m in r.sent + r.received)


# --- TCP on 127.0.0.1 ---------------------------------------------------------------------------


@pytest.fixture
def tcp_world():
    """Makes worlds of TCP transports on 127.0.0.1 and closes them after the test."""
    made = []

    def make(world: int, channels: int, dscp=None) -> list[TcpTransport]:
        table = {r: ("127.0.0.1", p) for r, p in enumerate(free_ports(world))}
        made.extend(TcpTransport(r, world, table, channels=channels, dscp=dscp,
                                 connect_timeout_s=IO_TIMEOUT_S, io_timeout_s=IO_TIMEOUT_S,
                                 min_part_bytes=1024) for r in range(world))
        return made[-world:]

    yield make
    for t in made:
        t.close()


def test_tcp_messages_arrive_whole_over_several_channels(tcp_world):
    transports = tcp_world(WORLD, channels=3)
    results = exchange_all(transports)
    assert all(all(ok.values()) and len(ok) == WORLD - 1 for ok in results)
    # on demand: each rank dialled every peer once per channel
    assert all(sorted(t.outgoing) == sorted(set(range(WORLD)) - {t.rank}) for t in transports)
    assert all(len(socks) == 3 for t in transports for socks in t.outgoing.values())


def test_tcp_connections_carry_nodelay_and_dscp_and_only_where_used(tcp_world):
    transports = tcp_world(3, channels=2, dscp=26)

    def rank_main(rank):
        t = transports[rank]
        t.barrier()  # a ring: every rank needs only its successor
        return sorted(t.outgoing)

    assert run_ranks(3, rank_main) == [[1], [2], [0]]
    for t in transports:
        for sock in t.outgoing[(t.rank + 1) % 3]:
            assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY)
            assert sock.getsockopt(socket.IPPROTO_IP, socket.IP_TOS) == 26 << 2


def test_tcp_full_mesh_connect(tcp_world):
    transports = tcp_world(3, channels=1)
    run_ranks(3, lambda r: transports[r].connect())
    for t in transports:
        assert sorted(t.outgoing) == sorted(t.incoming) == sorted({0, 1, 2} - {t.rank})


def test_tcp_sendrecv_before_the_peer_has_dialled_back(tcp_world):
    """A parameter-server push-pull: the server dials the worker only to answer, after it got
    the push; the worker's sendrecv must not wait for that connection before sending."""
    transports = tcp_world(2, channels=2)
    data = np.arange(100_000, dtype=np.float32)

    def rank_main(rank):
        t = transports[rank]
        buf = np.empty_like(data)
        if rank == 0:
            t.recv(1, buf)
            t.send(1, buf * 2)
            return None
        t.sendrecv(0, data, 0, buf)
        return buf

    np.testing.assert_array_equal(run_ranks(2, rank_main)[1], data * 2)


def test_tcp_ignores_connections_without_a_valid_hello(tcp_world):
    transports = tcp_world(2, channels=1)
    with socket.create_connection(transports[0].addresses[0]) as stray, \
            socket.create_connection(transports[0].addresses[0]) as bogus:
        stray.sendall(b"GET / HTTP/1.0\r\n\r\n")
        bogus.sendall(HELLO.pack(HELLO_MAGIC, 7, 0))  # rank 7 does not exist
        data = np.arange(1000, dtype=np.float32)

        def rank_main(rank):
            if rank == 1:
                transports[1].send(0, data)
                return None
            out = np.empty(1000, dtype=np.float32)
            transports[0].recv(1, out)
            return out

        np.testing.assert_array_equal(run_ranks(2, rank_main)[0], data)


# --- the host programs as 4 processes over TCP --------------------------------------------------


@pytest.mark.parametrize(("op", "algorithm"), [("allreduce", "ring"), ("allreduce", "auto"),
                                               ("alltoall", "pairwise")])
def test_sweep_program_runs_four_ranks_over_tcp(op, algorithm):
    hosts = loopback_hosts(WORLD)
    out = run_rank_processes("testbed.traffic.collectives.sweep", WORLD, lambda r: [
        "--rank", str(r), "--hosts", hosts, "--op", op, "--algo", algorithm, "-b", "8", "-e", "64K",
        "-f", "8", "-w", "1", "-n", "2", "--channels", "2", "--slice-bytes", "16K"])
    assert [code for code, _ in out] == [0] * WORLD
    head = out[0][1]
    assert head["verified"] and head["wrong_total"] == 0 and head["world"] == WORLD
    sizes = [8, 64, 512, 4096, 32768]
    if op == "alltoall":
        sizes = [0, 64, 512, 4096, 32768]  # 8 bytes is less than an element per peer
    assert [r["size_bytes"] for r in head["results"]] == sizes
    for row in head["results"]:
        assert row["time_us"] > 0 and row["predicted_us"] > 0
        start, end = row["window_monotonic_s"]  # every rank's timed iterations of the size
        assert head["timed_window_monotonic_s"][0] <= start < end
        assert row["busbw_mbit_s"] == pytest.approx(row["busbw_gbyte_s"] * 8000)
    assert head["cost_model"]["source"].startswith("calibrated")
    assert len(head["table"].splitlines()) == 2 + len(sizes)
    for code, rank_out in out[1:]:
        assert rank_out["verified"] and len(rank_out["sizes"]) == len(sizes)


def test_allreduce_program_is_a_drop_in_with_hash_verification():
    size_bytes = 4 * 10_007
    hosts = loopback_hosts(WORLD)
    digest = expected_digest(WORLD, size_bytes, seed=5)

    def args(rank, expect=digest):
        return ["--rank", str(rank), "--hosts", hosts, "--size-bytes", str(size_bytes),
                "--channels", "2", "--slice-bytes", "4096", "--seed", "5", "--warmup", "1",
                "--iters", "2", "--expect-sha256", expect]

    out = run_rank_processes("testbed.traffic.collectives.allreduce", WORLD, args)
    assert [code for code, _ in out] == [0] * WORLD
    for rank, (_, res) in enumerate(out):
        assert res["rank"] == rank and res["verified"] and res["wrong"] == 0
        assert len(res["times_s"]) == 2 and res["size_bytes"] == size_bytes
        start, end = res["timed_window_monotonic_s"]
        assert start < end
        assert res["tcp_out_segs"] > 0
    wrong_digest = hashlib.sha256(b"not the sum").hexdigest()
    hosts = loopback_hosts(WORLD)
    out = run_rank_processes("testbed.traffic.collectives.allreduce", WORLD,
                             lambda r: args(r, wrong_digest))
    assert [code for code, _ in out] == [1] * WORLD
    assert all(not res["verified"] and res["wrong"] == 0 for _, res in out)  # the data was right


def test_allreduce_program_with_the_orchestrators_arguments():
    """The argument list testbed.experiment builds (every rank on one port, knowing only its
    successor's address), each rank on its own loopback address."""
    size_bytes, channels = 4 * 5000, 4
    (port,) = free_ports(1)
    digest = expected_digest(WORLD, size_bytes, seed=1)
    out = run_rank_processes("testbed.traffic.collectives.allreduce", WORLD, lambda r: [
        "--rank", str(r), "--world", str(WORLD), "--next-ip", f"127.0.0.{(r + 1) % WORLD + 1}",
        "--listen-ip", f"127.0.0.{r + 1}", "--port", str(port), "--size-bytes", str(size_bytes),
        "--channels", str(channels), "--seed", "1", "--warmup", "1", "--iters", "2",
        "--expect-sha256", digest])
    assert [code for code, _ in out] == [0] * WORLD
    assert all(res["verified"] and res["channels"] == channels for _, res in out)
    # 5000 B per ring step is below a channel's 16 KiB: the ranks ran one channel, and say so
    assert all(res["channels_used"] == 1 for _, res in out)


def test_programs_report_errors_as_json():
    hosts = loopback_hosts(2)
    out = run_rank_processes("testbed.traffic.collectives.sweep", 1, lambda r: [
        "--rank", "0", "--hosts", hosts, "--connect-timeout-s", "0.5", "--link-rate-mbit", "100",
        "-b", "8", "-e", "8"])
    code, res = out[0]
    assert code == 1 and not res["verified"] and "TimeoutError" in res["error"]


# --- one socket, one direction: the blocking path -----------------------------------------------


def test_a_large_message_on_one_channel_arrives_whole_through_a_slow_reader():
    """Sending 4 MiB fills the socket buffers many times over: the blocking send waits for
    the reader, the waiting receive gets all of it; neither loop polls."""
    transports = local_transports(2, io_timeout_s=IO_TIMEOUT_S)
    message = np.random.default_rng(1).integers(0, 255, 4 << 20, dtype=np.uint8)
    got = np.zeros_like(message)
    try:
        sender = threading.Thread(target=transports[0].send, args=(1, message))
        sender.start()
        transports[1].recv(0, got)
        sender.join()
    finally:
        close_local(transports)
    assert np.array_equal(got, message)


def test_a_send_nobody_reads_times_out_without_progress():
    transports = local_transports(2, io_timeout_s=0.3)
    try:
        with pytest.raises(TimeoutError, match="no progress for 0.3 s"):
            transports[0].send(1, bytearray(64 << 20))
    finally:
        close_local(transports)
