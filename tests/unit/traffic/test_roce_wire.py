"""The RoCEv2 wire format: the fast path's bytes equal scapy's for every opcode used, the ICRC
equals scapy's BTH.compute_icrc over the full IPv4/UDP packet, decoding round-trips, and
tshark names the InfiniBand BTH in a pcap written with scapy."""
from __future__ import annotations

import shutil
import struct
import subprocess

import pytest
from scapy.all import IP, UDP, Ether, Raw, raw, wrpcap
from scapy.contrib.roce import AETH, BTH, cnp

from testbed.traffic.roce import rc, wire
from testbed.traffic.roce.work import CompletionQueue, WrOpcode
from testbed.traffic.roce.wire import RETH, ECNEcho, Opcode

SRC, DST, SPORT, DPORT = "10.0.1.2", "10.0.3.4", 4791, 4791
DATA_TOS = wire.tos_byte(26, wire.ECN_ECT0)
SEEDS = wire.IcrcSeeds(SRC, DST, SPORT, DPORT)
QPN = 0x00ABCD
PAYLOAD_1K = bytes(range(256)) * 4
RETH_FIELDS = (0x7F00_0000_1000, 0x1234_5601, 5000)
HEADERS_BYTES = wire.IPV4_HEADER_BYTES + wire.UDP_HEADER_BYTES


def scapy_roce_bytes(layers) -> bytes:
    """The transport bytes scapy builds (BTH onwards, ICRC computed by scapy over the IPv4/UDP
    packet the kernel writes: ID 0, DF)."""
    packet = IP(src=SRC, dst=DST, id=0, flags="DF", tos=DATA_TOS, ttl=64) / UDP(
        sport=SPORT, dport=DPORT) / layers
    return raw(packet)[HEADERS_BYTES:]


def scapy_data(opcode: Opcode, psn: int, payload: bytes, ackreq: bool, reth=None):
    pad = -len(payload) & 3
    layers = BTH(opcode=int(opcode), padcount=pad, dqpn=QPN, psn=psn, ackreq=int(ackreq))
    if reth is not None:
        layers = layers / RETH(va=reth[0], rkey=reth[1], dlen=reth[2])
    return layers / Raw(payload + bytes(pad))


DATA_CASES = [
    (Opcode.SEND_FIRST, 0, PAYLOAD_1K, False, None),
    (Opcode.SEND_MIDDLE, 1, PAYLOAD_1K, False, None),
    (Opcode.SEND_LAST, 2, b"tail!", True, None),
    (Opcode.SEND_ONLY, 0xFFFFFF, b"hi", True, None),
    (Opcode.RDMA_WRITE_FIRST, 0xFFFFFE, PAYLOAD_1K, False, RETH_FIELDS),
    (Opcode.RDMA_WRITE_MIDDLE, 0xFFFFFF, PAYLOAD_1K, True, None),
    (Opcode.RDMA_WRITE_LAST, 0, PAYLOAD_1K[:905], True, None),
    (Opcode.RDMA_WRITE_ONLY, 77, PAYLOAD_1K[:3], True, RETH_FIELDS),
]


@pytest.mark.parametrize("opcode,psn,payload,ackreq,reth", DATA_CASES,
                         ids=[c[0].name for c in DATA_CASES])
def test_data_packets_equal_scapy(opcode, psn, payload, ackreq, reth):
    fast = wire.build_data(SEEDS, opcode, QPN, psn, payload, ackreq, reth)
    assert fast == scapy_roce_bytes(scapy_data(opcode, psn, payload, ackreq, reth))


@pytest.mark.parametrize("syndrome", [
    wire.AETH_ACK_NO_CREDITS,
    wire.nak_syndrome(wire.NakCode.PSN_SEQUENCE_ERROR),
    wire.nak_syndrome(wire.NakCode.REMOTE_ACCESS_ERROR),
    wire.rnr_syndrome(14),
], ids=["ACK", "NAK-seq", "NAK-access", "RNR-NAK"])
def test_ack_and_nak_equal_scapy(syndrome):
    fast = wire.build_ack(SEEDS, QPN, 0x00FFFF, syndrome, 0x123456)
    reference = BTH(opcode=int(Opcode.ACKNOWLEDGE), dqpn=QPN, psn=0x00FFFF) / AETH(
        syndrome=syndrome, msn=0x123456)
    assert fast == scapy_roce_bytes(reference)


def test_ack_with_ecn_echo_equals_scapy_layers():
    fast = wire.build_ack(SEEDS, QPN, 9, wire.AETH_ACK_NO_CREDITS, 3, ce_bytes=(1 << 32) + 5)
    reference = BTH(opcode=int(Opcode.ACKNOWLEDGE), dqpn=QPN, psn=9) / AETH(
        syndrome=wire.AETH_ACK_NO_CREDITS, msn=3) / ECNEcho(ce_bytes=5)   # the counter wraps
    assert fast == scapy_roce_bytes(reference)


def test_cnp_equals_scapy_cnp():
    assert wire.build_cnp(SEEDS, QPN) == scapy_roce_bytes(cnp(QPN))


def test_burst_framer_equals_scapy_for_every_packet_of_a_write_and_a_send():
    """The engine's per-packet path: a 5000-byte WRITE (FIRST with RETH, MIDDLE x3, short LAST
    with pad) and a 2048-byte SEND (FIRST, LAST), against scapy packet by packet."""
    cq = CompletionQueue()
    requester = rc.Requester(start_psn=0xFFFFFD, mtu_bytes=1024, cq=cq, ack_request_every=2)
    message = bytes(range(251)) * 20
    requester.post(1, WrOpcode.RDMA_WRITE, memoryview(message[:5000]),
                   remote_addr=RETH_FIELDS[0], rkey=RETH_FIELDS[1])
    requester.post(2, WrOpcode.SEND, memoryview(message[:2048]))
    slot_bytes = 1200
    ring = memoryview(bytearray(8 * slot_bytes))
    framer = wire.BurstFramer(ring, 8, slot_bytes)
    seen, lengths = [], []
    while (burst := requester.next_burst(0.0, 8)) is not None:   # both bursts share the ring
        wqe = burst.wqe
        first_slot = len(lengths)
        framer.frame(SEEDS, QPN, wire_first_psn(requester, wqe), wqe.codes, wqe.payload, 1024,
                     burst.index, burst.count, wqe.reth, lengths, first_slot=first_slot)
        for k, packet in enumerate(requester.expand(burst), start=first_slot):
            framed = bytes(ring[k * slot_bytes:k * slot_bytes + lengths[k]])
            expected = scapy_roce_bytes(scapy_data(packet.opcode, packet.psn, packet.payload,
                                                   packet.ackreq, packet.reth))
            assert framed == expected, packet.opcode.name
            seen.append((packet.opcode, packet.psn, packet.ackreq))
    assert len(lengths) == 7
    with pytest.raises(ValueError):
        framer.frame(SEEDS, QPN, 0, bytes(2), memoryview(bytes(2048)), 1024, 0, 2, None, [],
                     first_slot=7)
    # Packet indices 0..6 across both messages; ack requested on every 2nd (indices 1, 3, 5)
    # and on the last packet of each message (4, 6).
    assert seen == [
        (Opcode.RDMA_WRITE_FIRST, 0xFFFFFD, False), (Opcode.RDMA_WRITE_MIDDLE, 0xFFFFFE, True),
        (Opcode.RDMA_WRITE_MIDDLE, 0xFFFFFF, False), (Opcode.RDMA_WRITE_MIDDLE, 0, True),
        (Opcode.RDMA_WRITE_LAST, 1, True),
        (Opcode.SEND_FIRST, 2, True), (Opcode.SEND_LAST, 3, True)]


def wire_first_psn(requester: rc.Requester, wqe) -> int:
    return (requester.start_psn + wqe.first) & 0xFFFFFF


@pytest.mark.parametrize("opcode,psn,payload,ackreq,reth", DATA_CASES[:5],
                         ids=[c[0].name for c in DATA_CASES[:5]])
def test_icrc_equals_scapy_compute_icrc_over_the_ipv4_udp_packet(opcode, psn, payload, ackreq, reth):
    datagram = wire.build_data(SEEDS, opcode, QPN, psn, payload, ackreq, reth)
    packet = IP(raw(wire.wrap_in_ip(datagram, SRC, DST, SPORT, DPORT, DATA_TOS)))
    assert packet.haslayer(BTH)
    expected = packet[BTH].compute_icrc(None)           # scapy's, little-endian bytes
    assert datagram[-wire.ICRC_BYTES:] == expected
    assert wire.scapy_icrc_ok(packet)


def test_icrc_ignores_the_mutable_fields_and_checks_the_rest():
    """TOS (ECN marks), TTL and the FECN/BECN byte are masked; addresses and payload are not."""
    datagram = wire.build_data(SEEDS, Opcode.SEND_ONLY, QPN, 5, b"abcd", True)
    for tos, ttl in ((DATA_TOS | wire.ECN_CE, 64), (0, 3)):
        assert wire.scapy_icrc_ok(IP(raw(wire.wrap_in_ip(datagram, SRC, DST, SPORT, DPORT, tos, ttl))))
    becn = bytearray(datagram)
    becn[4] |= 0x40
    assert wire.icrc_ok(SEEDS, becn, len(becn))
    corrupted = bytearray(datagram)
    corrupted[-5] ^= 1
    assert not wire.icrc_ok(SEEDS, corrupted, len(corrupted))
    other_source = wire.IcrcSeeds("10.0.1.3", DST, SPORT, DPORT)
    assert not wire.icrc_ok(other_source, bytearray(datagram), len(datagram))


def test_parse_round_trips_every_kind():
    write = wire.parse(wire.build_data(SEEDS, Opcode.RDMA_WRITE_ONLY, QPN, 0xFFFFFF, b"xyz",
                                       True, RETH_FIELDS))
    assert (write.opcode, write.dest_qpn, write.psn, write.ackreq, write.pad) == (
        Opcode.RDMA_WRITE_ONLY, QPN, 0xFFFFFF, True, 1)
    assert write.reth == RETH_FIELDS
    assert (write.payload_start, write.payload_end) == (28, 31)
    nak = wire.parse(wire.build_ack(SEEDS, QPN, 17, wire.nak_syndrome(wire.NakCode.PSN_SEQUENCE_ERROR), 4))
    assert (nak.syndrome, nak.msn, nak.ce_bytes) == (0x60, 4, None)
    echo = wire.parse(wire.build_ack(SEEDS, QPN, 17, wire.AETH_ACK_NO_CREDITS, 4, ce_bytes=777))
    assert echo.ce_bytes == 777
    notification = wire.parse(wire.build_cnp(SEEDS, QPN))
    assert notification.opcode == wire.Opcode.CNP and notification.becn
    with pytest.raises(ValueError):
        wire.parse(b"\x04" * 10)


def test_scapy_decodes_reth_on_write_first_and_only():
    for opcode in (Opcode.RDMA_WRITE_FIRST, Opcode.RDMA_WRITE_ONLY):
        datagram = wire.build_data(SEEDS, opcode, QPN, 1, PAYLOAD_1K, True, RETH_FIELDS)
        packet = IP(raw(wire.wrap_in_ip(datagram, SRC, DST, SPORT, DPORT, DATA_TOS)))
        assert (packet[RETH].va, packet[RETH].rkey, packet[RETH].dlen) == RETH_FIELDS
        assert bytes(packet[RETH].payload) == PAYLOAD_1K
    middle = IP(raw(wire.wrap_in_ip(wire.build_data(SEEDS, Opcode.RDMA_WRITE_MIDDLE, QPN, 1,
                                                    PAYLOAD_1K), SRC, DST, SPORT, DPORT, DATA_TOS)))
    assert not middle.haslayer(RETH)


def test_tos_classes():
    assert wire.tos_byte(26, wire.ECN_ECT0) == 0x6A
    assert wire.tos_byte(48, wire.ECN_NOT_ECT) == 0xC0
    assert wire.is_ce(0x6B) and not wire.is_ce(0x6A)
    with pytest.raises(ValueError):
        wire.tos_byte(64, 0)


@pytest.mark.skipif(shutil.which("tshark") is None, reason="tshark is not installed")
def test_tshark_names_the_infiniband_bth(tmp_path):
    datagrams = [
        wire.build_data(SEEDS, Opcode.RDMA_WRITE_FIRST, QPN, 7, PAYLOAD_1K, False, RETH_FIELDS),
        wire.build_ack(SEEDS, QPN, 7, wire.AETH_ACK_NO_CREDITS, 1),
        wire.build_cnp(SEEDS, QPN),
    ]
    pcap = tmp_path / "roce.pcap"
    wrpcap(str(pcap), [Ether() / IP(raw(wire.wrap_in_ip(d, SRC, DST, SPORT, DPORT, DATA_TOS)))
                       for d in datagrams])
    out = subprocess.run(
        ["tshark", "-r", str(pcap), "-d", "udp.port==4791,infiniband", "-T", "fields",
         "-E", "separator=;", "-e", "frame.protocols", "-e", "infiniband.bth.opcode",
         "-e", "infiniband.bth.destqp", "-e", "infiniband.bth.psn", "-e", "infiniband.reth.dmalen",
         "-e", "infiniband.invariant.crc"],
        capture_output=True, text=True, check=True, timeout=60).stdout.splitlines()
    rows = [line.split(";") for line in out]
    assert len(rows) == 3
    assert all("infiniband" in row[0].split(":") for row in rows)
    assert [int(row[1]) for row in rows] == [Opcode.RDMA_WRITE_FIRST, Opcode.ACKNOWLEDGE, Opcode.CNP]
    assert all(int(row[2], 16) == QPN for row in rows)
    assert [int(row[3]) for row in rows] == [7, 7, 0]
    assert int(rows[0][4]) == RETH_FIELDS[2]
    # tshark reads the ICRC as a big-endian word of the trailer bytes
    assert int(rows[0][5], 16) == struct.unpack("!I", datagrams[0][-4:])[0]
