"""The engine over real UDP sockets on 127.0.0.1 (no root): transfers between two engines with
loss injected on the send path, verified by hash; captured packets decoded by scapy; traffic
classes seen on the wire; CE marks turned into CNPs (DCQCN) and into the ECN echo (DCTCP);
pacing; and an idle engine that sleeps."""
from __future__ import annotations

import hashlib
import socket
import time
from dataclasses import dataclass

import pytest
from scapy.all import IP, UDP, raw
from scapy.contrib.roce import BTH

from testbed.traffic.roce import cc, wire
from testbed.traffic.roce.engine import Engine, EngineConfig, FaultHooks, TokenBucket
from testbed.traffic.roce.rc import Requester
from testbed.traffic.roce.verbs import (CompletionQueue, MemoryRegion, ProtectionDomain,
                                        QPConfig, QPInfo, QueuePair, RecvWR, SendWR, WcStatus,
                                        WrOpcode)
from testbed.traffic.roce.wire import RETH, Opcode

LOOPBACK = "127.0.0.1"
TRANSFER_TIMEOUT_S = 30.0
PACING_REL_TOL = 0.02            # paced transfer time within 2% of bytes on the wire / rate
IDLE_CPU_FRACTION = 0.2          # an idle engine uses under a fifth of a core (it sleeps)
SILENT_PEER = (LOOPBACK, wire.ROCE_UDP_PORT)   # nothing answers there
CNPS_IN_FLIGHT = 1               # at most the CNP of the last packet, sent after its ACK


@dataclass
class Side:
    engine: Engine
    pd: ProtectionDomain
    mr: MemoryRegion
    cq: CompletionQueue
    qp: QueuePair


def make_side(engine: Engine, region_bytes: int, config: QPConfig = QPConfig(),
              control=None, fill_seed: int | None = None, psn: int | None = None) -> Side:
    pd = ProtectionDomain(engine)
    mr = MemoryRegion(pd, region_bytes)
    if fill_seed is not None:
        mr.buf[:] = hashlib.shake_256(str(fill_seed).encode()).digest(region_bytes)
    cq = CompletionQueue(1 << 16)
    qp = QueuePair(pd, cq, cq, config, cc=control, psn=psn)
    qp.to_init()
    return Side(engine, pd, mr, cq, qp)


def connect(a: Side, b: Side) -> None:
    a.qp.to_rtr(b.qp.local_info(b.mr))
    b.qp.to_rtr(a.qp.local_info(a.mr))
    a.qp.to_rts()
    b.qp.to_rts()


def pump(engines, done, timeout_s: float = TRANSFER_TIMEOUT_S) -> bool:
    """Progress both engines (one process, so neither may sleep) until ``done()``."""
    deadline = time.monotonic() + timeout_s
    while not done():
        if time.monotonic() > deadline:
            return False
        for engine in engines:
            engine.progress(0.0)
    return True


@pytest.fixture
def engines():
    opened = []

    def open_engine(**kwargs) -> Engine:
        hooks = kwargs.pop("hooks", None)
        engine = Engine(EngineConfig(LOOPBACK, port=0, **kwargs), hooks)
        opened.append(engine)
        return engine

    yield open_engine
    for engine in opened:
        engine.close()


def digest(view) -> str:
    return hashlib.sha256(view).hexdigest()


def test_write_and_send_with_one_percent_loss_arrive_intact(engines):
    size = 2 << 20
    a = make_side(engines(hooks=FaultHooks(drop_probability=0.01, seed=3)), size, fill_seed=1)
    b = make_side(engines(hooks=FaultHooks(drop_probability=0.01, seed=4)), size)
    connect(a, b)
    a.qp.post_send(SendWR(1, WrOpcode.RDMA_WRITE, a.mr, 0, size // 2,
                          remote_addr=b.mr.addr, rkey=b.mr.rkey))
    chunk = size // 8
    for i in range(4):   # four SENDs into the second half of b's region
        b.qp.post_recv(RecvWR(100 + i, b.mr, size // 2 + i * chunk, chunk))
        a.qp.post_send(SendWR(10 + i, WrOpcode.SEND, a.mr, size // 2 + i * chunk, chunk))
    assert pump([a.engine, b.engine], lambda: len(a.cq) == 5 and len(b.cq) == 4)
    assert [(wc.wr_id, wc.status) for wc in a.cq.poll(9)] == [
        (1, WcStatus.SUCCESS), (10, WcStatus.SUCCESS), (11, WcStatus.SUCCESS),
        (12, WcStatus.SUCCESS), (13, WcStatus.SUCCESS)]
    assert [(wc.wr_id, wc.byte_len) for wc in b.cq.poll(9)] == [(100 + i, chunk) for i in range(4)]
    assert digest(a.mr.view) == digest(b.mr.view)
    stats_a, stats_b = a.engine.qp_stats(a.qp), b.engine.qp_stats(b.qp)
    assert a.engine.stats["dropped_by_hook"] > 0
    assert stats_a["retransmitted_packets"] > 0 and stats_a["naks_received"] > 0
    assert stats_b["bytes_placed"] == size            # retransmissions never placed twice
    assert a.engine.stats["icrc_errors"] == b.engine.stats["icrc_errors"] == 0


def test_captured_packets_decode_as_ip_udp_bth_and_their_icrc_verifies(engines):
    """The bytes the engine sends (a 2500-byte WRITE from PSN 0xFFFFFE: FIRST, MIDDLE, LAST
    across the wrap), wrapped in the IPv4/UDP header the kernel writes, decode with scapy as
    IP/UDP/BTH with a valid ICRC, and equal the reference packets of the pure requester."""
    captured = []
    engine = engines(hooks=FaultHooks(capture=lambda pkt, dest, tos: captured.append((pkt, dest, tos))))
    side = make_side(engine, 4096, fill_seed=5, psn=0xFFFFFE)
    side.qp.to_rtr(QPInfo(0x4242, 0, *SILENT_PEER, 0x1000, 0xBEEF01, 1 << 20))
    side.qp.to_rts()
    side.qp.post_send(SendWR(1, WrOpcode.RDMA_WRITE, side.mr, 0, 2500, remote_addr=0x1000,
                             rkey=0xBEEF01))
    assert pump([engine], lambda: len(captured) == 3, timeout_s=5)

    reference = Requester(start_psn=0xFFFFFE, mtu_bytes=1024, cq=CompletionQueue())
    reference.post(1, WrOpcode.RDMA_WRITE, side.mr.view[:2500], remote_addr=0x1000, rkey=0xBEEF01)
    packets = reference.expand(reference.next_burst(0.0, 64))
    assert [(p.opcode, p.psn) for p in packets] == [
        (Opcode.RDMA_WRITE_FIRST, 0xFFFFFE), (Opcode.RDMA_WRITE_MIDDLE, 0xFFFFFF),
        (Opcode.RDMA_WRITE_LAST, 0)]
    seeds = wire.IcrcSeeds(LOOPBACK, SILENT_PEER[0], engine.port, SILENT_PEER[1])
    for (datagram, dest, tos), expected in zip(captured, packets, strict=True):
        assert dest == SILENT_PEER and tos == engine.data_tos
        on_wire = IP(raw(wire.wrap_in_ip(datagram, LOOPBACK, dest[0], engine.port, dest[1], tos)))
        assert on_wire.haslayer(UDP) and on_wire.haslayer(BTH)
        assert on_wire[UDP].dport == wire.ROCE_UDP_PORT
        assert wire.scapy_icrc_ok(on_wire)
        bth = on_wire[BTH]
        assert (bth.opcode, bth.dqpn, bth.psn, bth.ackreq) == (
            expected.opcode, 0x4242, expected.psn, int(expected.ackreq))
        assert datagram == wire.build_data(seeds, expected.opcode, 0x4242, expected.psn,
                                           expected.payload, expected.ackreq, expected.reth)
    first = IP(raw(wire.wrap_in_ip(captured[0][0], LOOPBACK, SILENT_PEER[0], engine.port,
                                   SILENT_PEER[1], engine.data_tos)))
    assert (first[RETH].va, first[RETH].rkey, first[RETH].dlen) == (0x1000, 0xBEEF01, 2500)


@pytest.mark.parametrize("data_dscp,control_dscp", [(26, 48), (10, 40)])
def test_traffic_classes_on_the_wire(engines, data_dscp, control_dscp):
    """A plain UDP socket plays the peer: it sees the engine's data with the data DSCP and
    ECT(0), sends the engine a SEND and gets the ACK back in the control class."""
    peer = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    peer.bind((LOOPBACK, 0))
    peer.setsockopt(socket.IPPROTO_IP, socket.IP_RECVTOS, 1)
    peer.settimeout(5)
    try:
        engine = engines(data_dscp=data_dscp, control_dscp=control_dscp)
        side = make_side(engine, 4096, fill_seed=6)
        peer_ip, peer_port = peer.getsockname()
        side.qp.to_rtr(QPInfo(0x77, 500, peer_ip, peer_port))
        side.qp.to_rts()
        side.qp.post_recv(RecvWR(9, side.mr, 0, 4096))
        side.qp.post_send(SendWR(1, WrOpcode.SEND, side.mr, 0, 100))
        engine.progress(0.0)
        datagram, anc, _, source = peer.recvmsg(2048, socket.CMSG_SPACE(4))
        assert anc[0][2][0] == wire.tos_byte(data_dscp, wire.ECN_ECT0)
        assert source == (LOOPBACK, engine.port)
        header = wire.parse(datagram)
        assert (header.opcode, header.dest_qpn) == (Opcode.SEND_ONLY, 0x77)

        seeds = wire.IcrcSeeds(peer_ip, LOOPBACK, peer_port, engine.port)
        peer.sendto(wire.build_data(seeds, Opcode.SEND_ONLY, side.qp.qp_num, 500, b"x" * 64,
                                    ackreq=True), (LOOPBACK, engine.port))
        assert pump([engine], lambda: len(side.cq) > 0, timeout_s=5)
        ack, anc, _, _ = peer.recvmsg(2048, socket.CMSG_SPACE(4))
        assert anc[0][2][0] == wire.tos_byte(control_dscp, wire.ECN_NOT_ECT)
        reply = wire.parse(ack)
        assert (reply.opcode, reply.dest_qpn, reply.psn, reply.syndrome, reply.msn) == (
            Opcode.ACKNOWLEDGE, 0x77, 500, wire.AETH_ACK_NO_CREDITS, 1)
        assert wire.icrc_ok(wire.IcrcSeeds(LOOPBACK, peer_ip, engine.port, peer_port),
                            bytearray(ack), len(ack))
        assert [(wc.wr_id, wc.byte_len) for wc in side.cq.poll(9)] == [(9, 64)]
        assert bytes(side.mr.buf[:64]) == b"x" * 64
    finally:
        peer.close()


def test_bad_icrc_and_unknown_qp_are_dropped_and_counted(engines):
    engine = engines()
    side = make_side(engine, 4096)
    sender = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sender.bind((LOOPBACK, 0))
    try:
        side.qp.to_rtr(QPInfo(0x77, 0, *sender.getsockname()))
        seeds = wire.IcrcSeeds(LOOPBACK, LOOPBACK, sender.getsockname()[1], engine.port)
        good = wire.build_data(seeds, Opcode.RDMA_WRITE_ONLY, side.qp.qp_num, 0, b"abcd",
                               True, (side.mr.addr, side.mr.rkey, 4))
        corrupt = bytearray(good)
        corrupt[-6] ^= 0xFF
        sender.sendto(bytes(corrupt), (LOOPBACK, engine.port))
        sender.sendto(wire.build_data(seeds, Opcode.SEND_ONLY, 0x999, 0, b"abcd"),
                      (LOOPBACK, engine.port))
        sender.sendto(b"short", (LOOPBACK, engine.port))
        assert pump([engine], lambda: engine.stats["datagrams_received"] == 3, timeout_s=5)
        assert (engine.stats["icrc_errors"], engine.stats["unknown_qp"], engine.stats["malformed"]) == (1, 1, 1)
        assert side.qp.responder.packets == 0 and bytes(side.mr.buf[:4]) == bytes(4)
    finally:
        sender.close()


def test_ce_marks_produce_cnps_and_dcqcn_cuts_the_rate(engines):
    link_bps = 2e9
    control, _ = cc.make("dcqcn", link_rate_bps=link_bps, mtu_bytes=1024)
    size = 1 << 20
    a = make_side(engines(hooks=FaultHooks(ce_mark_probability=0.3, seed=8)), size,
                  control=control, fill_seed=2)
    b = make_side(engines(), size, config=QPConfig(cnp_interval_s=control.params.cnp_interval_s))
    connect(a, b)
    for i in range(4):
        a.qp.post_send(SendWR(i, WrOpcode.RDMA_WRITE, a.mr, remote_addr=b.mr.addr, rkey=b.mr.rkey))
    assert pump([a.engine, b.engine], lambda: len(a.cq) == 4)
    assert all(wc.status is WcStatus.SUCCESS for wc in a.cq.poll(9))
    assert digest(a.mr.view) == digest(b.mr.view)
    assert b.qp.responder.ce_packets > 0
    # the last CNP may follow the ACK that completed the transfer: still in flight
    assert b.qp.np.cnps_sent > 0 and 0 <= b.qp.np.cnps_sent - a.qp.cnps_received <= CNPS_IN_FLIGHT
    assert control.cnps_received == a.qp.cnps_received
    assert min(control.series.as_dict()["rate_bps"]) < link_bps / 2   # at least one halving


def test_dctcp_window_follows_the_echoed_marks(engines):
    control, _ = cc.make("dctcp", link_rate_bps=None, mtu_bytes=1024)
    size = 1 << 20
    a = make_side(engines(hooks=FaultHooks(ce_mark_probability=0.2, seed=9)), size,
                  control=control, fill_seed=3)
    b = make_side(engines(), size, config=QPConfig(ecn_echo=True))
    connect(a, b)
    a.qp.post_send(SendWR(1, WrOpcode.RDMA_WRITE, a.mr, remote_addr=b.mr.addr, rkey=b.mr.rkey))
    assert pump([a.engine, b.engine], lambda: len(a.cq) == 1)
    assert a.cq.poll(1)[0].status is WcStatus.SUCCESS
    assert digest(a.mr.view) == digest(b.mr.view)
    assert control.marked_bytes == b.qp.responder.ce_bytes > 0   # every marked byte echoed
    assert control.reductions > 0 and control.alpha < 1.0


class SteppedClock:
    """Engine time that advances only when the test says: pacing is then exact whatever the
    machine's load (the sockets still carry the packets for real)."""

    def __init__(self):
        self.now_s = 0.0

    def __call__(self) -> float:
        return self.now_s


def test_pacing_holds_the_configured_rate():
    rate_bps, step_s, size = 40e6, 10e-6, 1 << 20
    clock = SteppedClock()
    sender = Engine(EngineConfig(LOOPBACK, port=0), clock=clock)
    receiver = Engine(EngineConfig(LOOPBACK, port=0), clock=clock)
    try:
        a = make_side(sender, size, control=cc.LineRate(rate_bps), fill_seed=4)
        b = make_side(receiver, size)
        connect(a, b)
        a.qp.post_send(SendWR(1, WrOpcode.RDMA_WRITE, a.mr, remote_addr=b.mr.addr, rkey=b.mr.rkey))
        deadline = time.monotonic() + TRANSFER_TIMEOUT_S
        while not len(a.cq) and time.monotonic() < deadline:
            sender.progress(0.0)
            receiver.progress(0.0)
            clock.now_s += step_s
        assert a.cq.poll(1)[0].status is WcStatus.SUCCESS
    finally:
        sender.close()
        receiver.close()
    # Every 1024-byte payload costs 1024 + 12 (BTH) + 4 (ICRC) + 28 (IPv4, UDP) on the link;
    # the first packet's RETH adds 16. Time starts with an empty bucket.
    expected_s = (size + (size // 1024) * (12 + 4 + 28) + 16) * 8 / rate_bps
    assert clock.now_s == pytest.approx(expected_s, rel=PACING_REL_TOL)


def test_token_bucket_by_hand():
    bucket = TokenBucket(burst_s=1e-3)
    # 80 Mbit/s = 10 MB/s; depth = max(4 * 1000, 10e6 * 1e-3) = 10000 bytes
    assert bucket.allowance(0.0, 80e6, 1000) == (0, pytest.approx(100e-6))  # empty: 1000 B take 100 us
    packets, _ = bucket.allowance(250e-6, 80e6, 1000)      # 2500 bytes accrued
    assert packets == 2
    bucket.spend(2000)                                     # 500 left
    assert bucket.tokens == pytest.approx(500)
    assert bucket.allowance(1.0, 80e6, 1000)[0] == 10      # capped at the depth, 10000
    # at 8 Mbit/s the time depth (1000 B) is below the floor of 4 packets
    slow = TokenBucket(burst_s=1e-3)
    assert slow.allowance(1.0, 8e6, 1000)[0] == 4


def test_idle_engine_sleeps(engines):
    engine = engines()
    side = make_side(engine, 4096)
    side.qp.to_rtr(QPInfo(0x55, 0, *SILENT_PEER))
    side.qp.to_rts()
    wall_s = 0.3
    cpu0 = time.process_time()
    assert not engine.run_until(lambda: False, wall_s)
    assert time.process_time() - cpu0 < IDLE_CPU_FRACTION * wall_s
    assert engine.stats["waits"] <= wall_s / engine.config.max_idle_wait_s + 2


def test_silent_peer_exhausts_retries_without_spinning(engines):
    engine = engines()
    side = make_side(engine, 4096, config=QPConfig(ack_timeout_s=0.05, retry_count=2))
    side.qp.to_rtr(QPInfo(0x55, 0, *SILENT_PEER, 0x1000, 1, 4096))
    side.qp.to_rts()
    side.qp.post_send(SendWR(1, WrOpcode.RDMA_WRITE, side.mr, 0, 100, remote_addr=0x1000, rkey=1))
    cpu0, wall0 = time.process_time(), time.monotonic()
    assert engine.run_until(lambda: len(side.cq) > 0, 5.0)
    wall = time.monotonic() - wall0
    assert wall == pytest.approx(3 * 0.05, abs=0.05)      # three timeouts: 2 retries, then error
    assert time.process_time() - cpu0 < IDLE_CPU_FRACTION * wall
    assert [wc.status for wc in side.cq.poll(9)] == [WcStatus.RETRY_EXC_ERR]
    assert engine.qp_stats(side.qp)["timeouts"] == 3 and side.qp.in_error
