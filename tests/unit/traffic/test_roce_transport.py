"""The collectives' RoCE transport (testbed.traffic.collectives.roce_transport) between ranks
on 127.0.0.1: rendezvous by clear-to-send, RDMA WRITE into the receiver's buffer and FIN;
messages whole and in order on one or several channels, a barrier, the AllReduce executor
over it with the sum verified on every rank, and the AllReduce program's --transport roce."""
from __future__ import annotations

import threading

import numpy as np
import pytest

from testbed.traffic.collectives.allreduce import expected_digest
from testbed.traffic.collectives.data import ALLREDUCE, op_sizes
from testbed.traffic.collectives.executor import Executor
from testbed.traffic.collectives.roce_transport import RoceTransport
from testbed.traffic.collectives.runner import PreparedCollective

from tests.unit.ranks import free_ports, loopback_hosts, run_ranks, run_rank_processes

WORLD = 4
IO_TIMEOUT_S = 30.0
ELEMS = 100_003  # not a multiple of anything the transport cuts by


def make_world(world: int, channels: int = 1) -> list[RoceTransport]:
    """Every rank's transport, built at once (their set-up connects them to each other)."""
    addresses = {r: ("127.0.0.1", p) for r, p in enumerate(free_ports(world))}
    return run_ranks(world, lambda rank: RoceTransport(
        rank, world, addresses, channels=channels, roce_port=0, mtu_bytes=1024,
        connect_timeout_s=IO_TIMEOUT_S, io_timeout_s=IO_TIMEOUT_S))


@pytest.fixture
def world():
    made: list[list[RoceTransport]] = []

    def make(size: int, channels: int = 1):
        made.append(make_world(size, channels))
        return made[-1]

    yield make
    for transports in made:
        for t in transports:
            t.close()


def message(src: int, dst: int) -> np.ndarray:
    return np.arange(ELEMS, dtype=np.float32) * (src + 1) + dst


@pytest.mark.parametrize("channels", [1, 2])
def test_messages_arrive_whole_and_in_order_between_every_pair(world, channels):
    transports = world(WORLD, channels)

    def rank_main(rank):
        base = transports[rank]
        got = {}
        for k in range(1, WORLD):
            dst, src = (rank + k) % WORLD, (rank - k) % WORLD
            for c in range(channels):
                t = base.channel(c)
                first, second = np.empty(ELEMS, np.float32), np.empty(7, np.float32)
                t.sendrecv(dst, message(rank, dst) + c, src, first)
                t.sendrecv(dst, np.full(7, rank, np.float32), src, second)
                got[(src, c)] = (np.array_equal(first, message(src, rank) + c)
                                 and np.array_equal(second, np.full(7, src, np.float32)))
        base.barrier()
        return got

    results = run_ranks(WORLD, rank_main)
    assert all(all(ok.values()) and len(ok) == (WORLD - 1) * channels for ok in results)
    stats = transports[0].stats()
    qps = stats["qps"]
    assert len(qps) == (WORLD - 1) * channels
    # every data byte went by RDMA WRITE into the peer's buffer: no RNR NAK, no retransmission
    assert all(q["rnr_naks_received"] == 0 and q["retransmitted_packets"] == 0
               for q in qps.values())
    assert stats["engine"]["icrc_errors"] == 0


def test_bytes_and_empty_messages_and_a_size_mismatch(world):
    a, b = world(2)
    got = bytearray(5)

    def rank_main(rank):
        if rank == 0:
            a.send(1, b"hello")           # read-only bytes are copied into a region
            a.send(1, b"")                # nothing moves, nothing waits
            with pytest.raises(ConnectionError):
                a.send(1, b"123")         # the peer offers 4 bytes
        else:
            b.recv(0, got)
            b.recv(0, bytearray(0))
            with pytest.raises((ConnectionError, TimeoutError)):
                b.io_timeout_s = 2.0
                b.recv(0, bytearray(4))

    run_ranks(2, rank_main)
    assert bytes(got) == b"hello"


def test_barrier_holds_every_rank_until_all_entered(world):
    transports = world(3)
    entered, lock, late = [], threading.Lock(), threading.Event()

    def rank_main(rank):
        if rank == 1:
            assert not late.wait(0.3)
        with lock:
            entered.append(rank)
        transports[rank].barrier()
        with lock:
            return len(entered)

    assert run_ranks(3, rank_main) == [3, 3, 3]


def test_the_allreduce_executor_sums_exactly_over_roce(world):
    transports = world(WORLD)
    sizes = op_sizes(ALLREDUCE, 4 * ELEMS, WORLD)

    def rank_main(rank):
        with Executor(transports[rank]) as executor, \
                PreparedCollective(executor, sizes, "ring", 3, 64 * 1024) as coll:
            coll.reset()
            coll.run()
            return coll.wrong()

    assert run_ranks(WORLD, rank_main) == [0] * WORLD


def test_the_allreduce_program_runs_over_roce_with_the_sum_verified():
    size_bytes = 4 * 20_011
    hosts = loopback_hosts(WORLD)
    digest = expected_digest(WORLD, size_bytes, seed=2)
    out = run_rank_processes("testbed.traffic.collectives.allreduce", WORLD, lambda r: [
        "--rank", str(r), "--hosts", hosts, "--size-bytes", str(size_bytes), "--channels", "2",
        "--transport", "roce", "--roce-port", "0", "--roce-mtu", "1024", "--seed", "2",
        "--warmup", "1", "--iters", "2", "--expect-sha256", digest])
    assert [code for code, _ in out] == [0] * WORLD, out
    for rank, (_, res) in enumerate(out):
        assert res["verified"] and res["wrong"] == 0 and res["transport"] == "roce"
        assert res["roce"]["data_packets_sent"] > 0 and res["roce"]["icrc_errors"] == 0


def test_the_allreduce_experiment_passes_the_roce_transport_to_every_rank():
    from testbed.experiments.allreduce.experiment import AllReduceParams, transport_argv

    assert transport_argv("tcp", 50.0, 4, 9000, 312_500) == []
    # MTU 9000 carries 4096-byte payloads; 4 channels share a 50 Mbit/s link; a 312.5 KB
    # buffer drains in 50 ms at 50 Mbit/s, and the ACK timeout outlasts four drains
    assert transport_argv("roce", 50.0, 4, 9000, 312_500) == [
        "--transport", "roce", "--roce-mtu", "4096", "--roce-rate-mbit", "12.5",
        "--roce-ack-timeout-s", "0.2"]
    # 1500 carries 1024 (+ 60 bytes of headers), not 2048
    assert transport_argv("roce", 6.0, 1, 1500, 12_000)[3] == "1024"
    # a small buffer keeps the verbs default
    assert transport_argv("roce", 6.0, 1, 1500, 12_000)[-1] == "0.067"
    assert AllReduceParams.model_validate({"transport": "roce"}).transport == "roce"
    with pytest.raises(ValueError):
        AllReduceParams.model_validate({"transport": "udp"})
