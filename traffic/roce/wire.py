"""RoCEv2 on the wire: the InfiniBand transport headers carried in UDP (port 4791) over IPv4.

Layout of every packet this transport sends, after the IPv4 and UDP headers::

    BTH (12 B) [RETH (16 B) | AETH (4 B) [ECN echo (4 B)] | CNP padding (16 B)] payload pad ICRC (4 B)

- BTH, the base transport header: opcode, solicited/migreq/pad count/transport version,
  P_Key, FECN/BECN, destination QP, ack-request bit, 24-bit PSN.
- RETH on RDMA WRITE FIRST and ONLY: virtual address, R_Key, DMA length.
- AETH on ACK/NAK: syndrome (ACK, RNR NAK or NAK with a code) and the 24-bit MSN.
- CNP (opcode 0x81): BTH with BECN set and 16 reserved bytes.
- ECN echo: 4 bytes after the AETH carrying the cumulative count of CE-marked payload bytes
  the responder received (mod 2^32). It is not part of the standard: a responder adds it only
  when the DCTCP-style window control asks for it, and the requester recognises it by the
  ACK's length. A standard ACK has none.
- ICRC: CRC-32 over a pseudo-header (8 bytes of ones for the absent LRH, the IPv4 header with
  TOS, TTL and checksum set to ones, the UDP header with its checksum set to ones) and the
  transport packet with the BTH byte holding FECN/BECN/reserved set to ones; stored
  little-endian, as ``scapy.contrib.roce.BTH.compute_icrc`` does.

The declarative definitions are scapy's (``scapy.contrib.roce``: BTH, AETH, ``cnp()``); this
module adds the RETH and the ECN echo as scapy layers. The fast path (``build_*`` with
struct-packed headers; ``BurstFramer`` for the engine's bursts, with numpy records for runs
of full packets; ``zlib.crc32`` continued from a cached pseudo-header state) is what the
engine sends; tests check its bytes equal scapy's for every opcode used.

The ICRC covers the IPv4 identification field, which the kernel writes, so the sender must
know it in advance. The engine sends from an unconnected UDP socket with
IP_MTU_DISCOVER=IP_PMTUDISC_DO: every datagram leaves with DF set, and Linux's
``ip_select_ident_segs`` then writes IP ID 0 (a DF packet cannot be fragmented, so it needs no
unique ID; only a connected socket would use a per-socket counter, and newer kernels write 0
for every DF packet). The pseudo-header below is built on that: ID 0, flags DF, no options.
"""
from __future__ import annotations

import socket
import struct
import zlib
from dataclasses import dataclass
from enum import IntEnum

import numpy as np
from scapy.contrib.roce import AETH, BTH, CNP_OPCODE
from scapy.contrib.roce import opcode as roce_opcode
from scapy.fields import IntField, XIntField, XLongField
from scapy.layers.inet import IP, UDP
from scapy.packet import Packet, bind_layers

ROCE_UDP_PORT = 4791
DEFAULT_PKEY = 0xFFFF
IPV4_HEADER_BYTES = 20
UDP_HEADER_BYTES = 8
BTH_BYTES = 12
RETH_BYTES = 16
AETH_BYTES = 4
ECN_ECHO_BYTES = 4
CNP_PADDING_BYTES = 16
ICRC_BYTES = 4
PATH_MTUS = (256, 512, 1024, 2048, 4096)
MSN_MASK = 0xFFFFFF
COUNTER_MODULO = 1 << 32   # the ECN echo counter wraps like a 32-bit register


def _rc(name: str) -> int:
    return roce_opcode("RC", name)[0]


class Opcode(IntEnum):
    """Reliable-connection opcodes this transport uses, taken from scapy's table."""
    SEND_FIRST = _rc("SEND_FIRST")
    SEND_MIDDLE = _rc("SEND_MIDDLE")
    SEND_LAST = _rc("SEND_LAST")
    SEND_ONLY = _rc("SEND_ONLY")
    RDMA_WRITE_FIRST = _rc("RDMA_WRITE_FIRST")
    RDMA_WRITE_MIDDLE = _rc("RDMA_WRITE_MIDDLE")
    RDMA_WRITE_LAST = _rc("RDMA_WRITE_LAST")
    RDMA_WRITE_ONLY = _rc("RDMA_WRITE_ONLY")
    ACKNOWLEDGE = _rc("ACKNOWLEDGE")
    CNP = CNP_OPCODE


SEND_OPCODES = (Opcode.SEND_FIRST, Opcode.SEND_MIDDLE, Opcode.SEND_LAST, Opcode.SEND_ONLY)
WRITE_OPCODES = (Opcode.RDMA_WRITE_FIRST, Opcode.RDMA_WRITE_MIDDLE, Opcode.RDMA_WRITE_LAST,
                 Opcode.RDMA_WRITE_ONLY)
RETH_OPCODES = frozenset((Opcode.RDMA_WRITE_FIRST, Opcode.RDMA_WRITE_ONLY))
FIRST_OPCODES = frozenset((Opcode.SEND_FIRST, Opcode.SEND_ONLY, Opcode.RDMA_WRITE_FIRST,
                           Opcode.RDMA_WRITE_ONLY))
LAST_OPCODES = frozenset((Opcode.SEND_LAST, Opcode.SEND_ONLY, Opcode.RDMA_WRITE_LAST,
                          Opcode.RDMA_WRITE_ONLY))
DATA_OPCODES = frozenset(SEND_OPCODES + WRITE_OPCODES)

# AETH syndromes: bits 6..5 say ACK (00), RNR NAK (01) or NAK (11); the low 5 bits carry the
# credit count, the RNR timer code or the NAK code.
AETH_ACK_NO_CREDITS = 0x1F   # ACK with the credit field "invalid": no end-to-end credits
AETH_RNR_NAK = 0x20
AETH_NAK = 0x60
SYNDROME_KIND_MASK = 0x60
SYNDROME_VALUE_MASK = 0x1F


class NakCode(IntEnum):
    PSN_SEQUENCE_ERROR = 0
    INVALID_REQUEST = 1
    REMOTE_ACCESS_ERROR = 2
    REMOTE_OPERATIONAL_ERROR = 3


# RNR NAK timer codes (InfiniBand Architecture, table "Encoding for RNR NAK Timer"), in ms.
RNR_TIMER_MS = (655.36, 0.01, 0.02, 0.03, 0.04, 0.06, 0.08, 0.12, 0.16, 0.24, 0.32, 0.48, 0.64,
                0.96, 1.28, 1.92, 2.56, 3.84, 5.12, 7.68, 10.24, 15.36, 20.48, 30.72, 40.96,
                61.44, 81.92, 122.88, 163.84, 245.76, 327.68, 491.52)


def nak_syndrome(code: NakCode) -> int:
    return AETH_NAK | int(code)


def rnr_syndrome(timer_code: int) -> int:
    return AETH_RNR_NAK | (timer_code & SYNDROME_VALUE_MASK)


def rnr_delay_s(syndrome: int) -> float:
    return RNR_TIMER_MS[syndrome & SYNDROME_VALUE_MASK] / 1e3


# ECN field of the IPv4 TOS byte (RFC 3168).
ECN_NOT_ECT, ECN_ECT1, ECN_ECT0, ECN_CE = 0, 1, 2, 3
ECN_MASK = 3


def tos_byte(dscp: int, ecn: int) -> int:
    """The IPv4 TOS byte for a DSCP (0..63) and an ECN codepoint."""
    if not 0 <= dscp < 64:
        raise ValueError(f"DSCP {dscp} out of 0..63")
    return (dscp << 2) | (ecn & ECN_MASK)


def is_ce(tos: int) -> bool:
    return tos & ECN_MASK == ECN_CE


# --- scapy layers ------------------------------------------------------------------------


class RETH(Packet):
    """RDMA Extended Transport Header (RDMA WRITE FIRST/ONLY, READ REQUEST)."""
    name = "RETH"
    fields_desc = [
        XLongField("va", 0),
        XIntField("rkey", 0),
        IntField("dlen", 0),
    ]


class ECNEcho(Packet):
    """This transport's ECN echo after the AETH (see the module docstring)."""
    name = "ECNEcho"
    fields_desc = [IntField("ce_bytes", 0)]


bind_layers(BTH, RETH, opcode=int(Opcode.RDMA_WRITE_FIRST))
bind_layers(BTH, RETH, opcode=int(Opcode.RDMA_WRITE_ONLY))
bind_layers(AETH, ECNEcho)


def wrap_in_ip(datagram: bytes, src_ip: str, dst_ip: str, src_port: int, dst_port: int,
               tos: int, ttl: int = 64) -> IP:
    """The IPv4/UDP packet the kernel sends for ``datagram`` from the engine's socket (ID 0,
    DF, no options), dissected by scapy down to the BTH whatever the destination port."""
    return (IP(src=src_ip, dst=dst_ip, id=0, flags="DF", tos=tos, ttl=ttl)
            / UDP(sport=src_port, dport=dst_port) / BTH(datagram))


def scapy_icrc_ok(packet: Packet) -> bool:
    """Whether the ICRC in a dissected IPv4/UDP/BTH packet is the one scapy computes."""
    bth = packet[BTH]
    return struct.pack("!I", bth.icrc) == bth.compute_icrc(None)


# --- fast path -------------------------------------------------------------------------

BTH_STRUCT = struct.Struct("!BBHII")
RETH_STRUCT = struct.Struct("!QII")
AETH_STRUCT = struct.Struct("!I")
ECN_ECHO_STRUCT = struct.Struct("!I")
ICRC_STRUCT = struct.Struct("<I")
_PSEUDO_IP = struct.Struct("!BBHHHBBH4s4s")
_PSEUDO_UDP = struct.Struct("!HHHH")
_LRH_ONES = b"\xff" * 8
_IP_VERSION_IHL = 0x45
_IP_FLAGS_DF = 0x4000
_IP_ID_UNCONNECTED_DF = 0   # see the module docstring
_MASKED_BYTE = 0xFF
_MASKED_WORD = 0xFFFF
BTH_MASKED_OFFSET = 4       # the byte with FECN, BECN and the 6 reserved bits
_FECN_BIT, _BECN_BIT = 0x80, 0x40
_ACKREQ_BIT = 1 << 31
_QPN_MASK = 0xFFFFFF
_PSN_MASK = 0xFFFFFF
MAX_PAD_BYTES = 3
_PAD = bytes(MAX_PAD_BYTES + 1)
_ACKREQ_WORD = tuple(_ACKREQ_BIT if code & 0x80 else 0 for code in range(256))  # by packet code
_BTH_DTYPE = np.dtype([("opcode", "u1"), ("flags", "u1"), ("pkey", ">u2"), ("qpn_word", ">u4"),
                       ("psn_word", ">u4")])   # BTH_STRUCT as a numpy record


class IcrcSeeds:
    """CRC-32 state after the masked pseudo-header of one path (addresses and ports), by the
    RoCE length (BTH to ICRC inclusive), cached: the per-packet ICRC then continues from it."""

    def __init__(self, src_ip: str, dst_ip: str, src_port: int, dst_port: int):
        self.src_ip, self.dst_ip, self.src_port, self.dst_port = src_ip, dst_ip, src_port, dst_port
        self._src = socket.inet_aton(src_ip)
        self._dst = socket.inet_aton(dst_ip)
        self._cache: dict[int, int] = {}

    def __call__(self, roce_bytes: int) -> int:
        seed = self._cache.get(roce_bytes)
        if seed is None:
            udp_bytes = UDP_HEADER_BYTES + roce_bytes
            ip = _PSEUDO_IP.pack(_IP_VERSION_IHL, _MASKED_BYTE, IPV4_HEADER_BYTES + udp_bytes,
                                 _IP_ID_UNCONNECTED_DF, _IP_FLAGS_DF, _MASKED_BYTE,
                                 socket.IPPROTO_UDP, _MASKED_WORD, self._src, self._dst)
            udp = _PSEUDO_UDP.pack(self.src_port, self.dst_port, udp_bytes, _MASKED_WORD)
            seed = self._cache[roce_bytes] = zlib.crc32(_LRH_ONES + ip + udp)
        return seed


def _icrc_of(seeds: IcrcSeeds, packet: bytearray | memoryview, end: int) -> int:
    """ICRC of ``packet[:end]`` (BTH onwards, without the ICRC), masking the BTH byte."""
    saved = packet[BTH_MASKED_OFFSET]
    packet[BTH_MASKED_OFFSET] = _MASKED_BYTE
    crc = zlib.crc32(memoryview(packet)[:end], seeds(end + ICRC_BYTES))
    packet[BTH_MASKED_OFFSET] = saved
    return crc


def icrc_ok(seeds: IcrcSeeds, packet: bytearray | memoryview, length: int) -> bool:
    """Whether the last 4 of ``length`` bytes are the packet's ICRC (``packet`` is writable:
    the masked byte is restored afterwards)."""
    end = length - ICRC_BYTES
    return end >= BTH_BYTES and _icrc_of(seeds, packet, end) == ICRC_STRUCT.unpack_from(packet, end)[0]


def _finish(seeds: IcrcSeeds, packet: bytearray, end: int) -> bytes:
    ICRC_STRUCT.pack_into(packet, end, _icrc_of(seeds, packet, end))
    return bytes(packet)


def _bth_words(dest_qpn: int, psn: int, ackreq: bool, becn: bool = False) -> tuple[int, int]:
    return ((_BECN_BIT << 24 if becn else 0) | (dest_qpn & _QPN_MASK),
            (_ACKREQ_BIT if ackreq else 0) | (psn & _PSN_MASK))


def build_data(seeds: IcrcSeeds, opcode: Opcode, dest_qpn: int, psn: int, payload: bytes,
               ackreq: bool = False, reth: tuple[int, int, int] | None = None,
               pkey: int = DEFAULT_PKEY) -> bytes:
    """One SEND or RDMA WRITE packet (BTH to ICRC). ``reth`` is (va, rkey, dma_length) and
    goes with RDMA WRITE FIRST and ONLY only; the payload is padded to 4 bytes."""
    if (reth is not None) != (opcode in RETH_OPCODES):
        raise ValueError(f"{opcode.name} {'needs' if reth is None else 'takes no'} RETH")
    pad = -len(payload) & 3
    ext = RETH_BYTES if reth is not None else 0
    end = BTH_BYTES + ext + len(payload) + pad
    packet = bytearray(end + ICRC_BYTES)
    BTH_STRUCT.pack_into(packet, 0, opcode, pad << 4, pkey, *_bth_words(dest_qpn, psn, ackreq))
    if reth is not None:
        RETH_STRUCT.pack_into(packet, BTH_BYTES, *reth)
    packet[BTH_BYTES + ext:BTH_BYTES + ext + len(payload)] = payload
    return _finish(seeds, packet, end)


def build_ack(seeds: IcrcSeeds, dest_qpn: int, psn: int, syndrome: int, msn: int,
              ce_bytes: int | None = None, pkey: int = DEFAULT_PKEY) -> bytes:
    """An ACK or NAK (opcode ACKNOWLEDGE with AETH), with the ECN echo when ``ce_bytes``."""
    end = BTH_BYTES + AETH_BYTES + (ECN_ECHO_BYTES if ce_bytes is not None else 0)
    packet = bytearray(end + ICRC_BYTES)
    BTH_STRUCT.pack_into(packet, 0, Opcode.ACKNOWLEDGE, 0, pkey, *_bth_words(dest_qpn, psn, False))
    AETH_STRUCT.pack_into(packet, BTH_BYTES, (syndrome << 24) | (msn & MSN_MASK))
    if ce_bytes is not None:
        ECN_ECHO_STRUCT.pack_into(packet, BTH_BYTES + AETH_BYTES, ce_bytes % COUNTER_MODULO)
    return _finish(seeds, packet, end)


def build_cnp(seeds: IcrcSeeds, dest_qpn: int, pkey: int = DEFAULT_PKEY) -> bytes:
    """A congestion notification packet to ``dest_qpn`` (as scapy's ``cnp()``: BECN, PSN 0)."""
    end = BTH_BYTES + CNP_PADDING_BYTES
    packet = bytearray(end + ICRC_BYTES)
    BTH_STRUCT.pack_into(packet, 0, Opcode.CNP, 0, pkey, *_bth_words(dest_qpn, 0, False, becn=True))
    return _finish(seeds, packet, end)


class BurstFramer:
    """The per-packet fast path: frames runs of one message's packets into the fixed slots
    of a ring (``slots`` of ``slot_bytes``), ready for one sendmmsg.

    The full-size packets without RETH (the bulk of a message) are framed together through
    numpy views of the ring: their BTHs in one structured assignment, their payloads in one
    copy, the masked byte around the CRCs in one store; only ``zlib.crc32`` runs once per
    packet. The first packet of an RDMA WRITE and a short last packet take ``_frame_one``.
    """

    def __init__(self, ring: memoryview, slots: int, slot_bytes: int):
        self.ring, self.slots, self.slot_bytes = ring, slots, slot_bytes
        self._rows = np.frombuffer(ring, dtype=np.uint8).reshape(slots, slot_bytes)
        self._bth = np.ndarray((slots,), dtype=_BTH_DTYPE, buffer=ring, strides=(slot_bytes,))
        self._offsets = np.arange(slots, dtype=np.int64)
        self._mtu = 0
        self._bodies: list[memoryview] = []
        self._icrc: np.ndarray | None = None

    def _layout(self, mtu: int) -> tuple[list[memoryview], np.ndarray]:
        """Per slot, for a full packet without RETH: the bytes the ICRC covers; and the ICRC
        words of all slots."""
        if mtu != self._mtu:
            self._bodies = [self.ring[b:b + BTH_BYTES + mtu]
                            for b in range(0, self.slots * self.slot_bytes, self.slot_bytes)]
            self._icrc = np.ndarray((self.slots,), dtype="<u4", buffer=self.ring,
                                    offset=BTH_BYTES + mtu, strides=(self.slot_bytes,))
            self._mtu = mtu
        return self._bodies, self._icrc

    def frame(self, seeds: IcrcSeeds, dest_qpn: int, first_psn: int, codes: bytes | bytearray,
              payload: memoryview, mtu: int, first_index: int, count: int,
              reth: tuple[int, int, int] | None, lengths: list[int],
              pkey: int = DEFAULT_PKEY, first_slot: int = 0) -> None:
        """Frame packets ``first_index`` .. ``first_index + count - 1`` of a message into slots
        ``first_slot`` onwards and append their lengths to ``lengths``.

        ``codes[i]`` is packet i's opcode with bit 7 set when it asks for an ACK; ``first_psn``
        is the PSN of packet 0; ``payload`` is the whole message; ``reth`` (va, rkey, length)
        goes into packet 0 when its opcode carries one.
        """
        if first_slot + count > self.slots:
            raise ValueError(f"{count} packets from slot {first_slot} overflow {self.slots} slots")
        qpn_word = (_MASKED_BYTE << 24) | dest_qpn   # the masked byte is ones while the CRC runs
        total = len(payload)
        # Packets [fast_from, fast_to) of the run are full and without RETH; the others take
        # _frame_one.
        fast_from = 1 if first_index == 0 and (reth is not None or total < mtu) else 0
        fast_to = max(fast_from, min(count, total // mtu - first_index))
        for k in range(fast_from):
            lengths.append(self._frame_one(seeds, first_slot + k, codes, first_index + k,
                                           first_psn, pkey, qpn_word, payload, mtu, reth))
        run = fast_to - fast_from
        if run:
            bodies, icrc = self._layout(mtu)
            slots = slice(first_slot + fast_from, first_slot + fast_to)
            index = first_index + fast_from
            code = np.frombuffer(codes, dtype=np.uint8, count=run, offset=index)
            bth = self._bth[slots]
            bth["opcode"] = code & 0x7F
            bth["flags"] = 0
            bth["pkey"] = pkey
            bth["qpn_word"] = qpn_word
            bth["psn_word"] = ((code.astype(np.int64) >> 7) << 31) | (
                (first_psn + index + self._offsets[:run]) & _PSN_MASK)
            self._rows[slots, BTH_BYTES:BTH_BYTES + mtu] = np.frombuffer(
                payload, dtype=np.uint8, count=run * mtu, offset=index * mtu).reshape(run, mtu)
            seed, crc32 = seeds(BTH_BYTES + mtu + ICRC_BYTES), zlib.crc32
            icrc[slots] = [crc32(body, seed) for body in bodies[slots]]
            self._rows[slots, BTH_MASKED_OFFSET] = 0
            lengths.extend([BTH_BYTES + mtu + ICRC_BYTES] * run)
        for k in range(fast_to, count):
            lengths.append(self._frame_one(seeds, first_slot + k, codes, first_index + k,
                                           first_psn, pkey, qpn_word, payload, mtu, reth))

    def _frame_one(self, seeds: IcrcSeeds, slot: int, codes: bytes | bytearray, index: int,
                   first_psn: int, pkey: int, qpn_word: int, payload: memoryview, mtu: int,
                   reth: tuple[int, int, int] | None) -> int:
        """Packet ``index`` into ``slot``, the general way (RETH, short payload, pad); returns
        its length."""
        ring, base = self.ring, slot * self.slot_bytes
        chunk = payload[index * mtu:(index + 1) * mtu]
        code = codes[index]
        opcode = code & 0x7F
        size = len(chunk)
        pad = -size & 3
        BTH_STRUCT.pack_into(ring, base, opcode, pad << 4, pkey, qpn_word,
                             _ACKREQ_WORD[code] | ((first_psn + index) & _PSN_MASK))
        head = base + BTH_BYTES
        if opcode in RETH_OPCODES:
            RETH_STRUCT.pack_into(ring, head, *reth)
            head += RETH_BYTES
        ring[head:head + size] = chunk
        head += size
        ring[head:head + pad] = _PAD[:pad]
        head += pad
        length = head - base + ICRC_BYTES
        ICRC_STRUCT.pack_into(ring, head, zlib.crc32(ring[base:head], seeds(length)))
        ring[base + BTH_MASKED_OFFSET] = 0
        return length


@dataclass(frozen=True)
class Header:
    """The transport headers of one received datagram (``payload_start``/``payload_end``
    delimit the payload without pad and ICRC)."""
    opcode: int
    pad: int
    pkey: int
    fecn: bool
    becn: bool
    dest_qpn: int
    ackreq: bool
    psn: int
    reth: tuple[int, int, int] | None = None
    syndrome: int | None = None
    msn: int | None = None
    ce_bytes: int | None = None
    payload_start: int = BTH_BYTES
    payload_end: int = BTH_BYTES


def parse(datagram: bytes | bytearray | memoryview) -> Header:
    """Decode the headers of a datagram (BTH to ICRC). Raises ValueError when too short."""
    length = len(datagram)
    if length < BTH_BYTES + ICRC_BYTES:
        raise ValueError(f"{length} bytes is shorter than BTH + ICRC")
    opcode, flags, pkey, qpn_word, psn_word = BTH_STRUCT.unpack_from(datagram, 0)
    fields = dict(opcode=opcode, pad=(flags >> 4) & 3, pkey=pkey,
                  fecn=bool(qpn_word >> 24 & _FECN_BIT), becn=bool(qpn_word >> 24 & _BECN_BIT),
                  dest_qpn=qpn_word & _QPN_MASK, ackreq=bool(psn_word >> 31),
                  psn=psn_word & _PSN_MASK)
    end = length - ICRC_BYTES
    head = BTH_BYTES
    if opcode in RETH_OPCODES:
        fields["reth"] = RETH_STRUCT.unpack_from(datagram, head)
        head += RETH_BYTES
    elif opcode == Opcode.ACKNOWLEDGE:
        (aeth,) = AETH_STRUCT.unpack_from(datagram, head)
        fields.update(syndrome=aeth >> 24, msn=aeth & MSN_MASK)
        head += AETH_BYTES
        if end - head >= ECN_ECHO_BYTES:
            fields["ce_bytes"] = ECN_ECHO_STRUCT.unpack_from(datagram, head)[0]
            head += ECN_ECHO_BYTES
    elif opcode == Opcode.CNP:
        head += CNP_PADDING_BYTES
    if head > end:
        raise ValueError(f"{length} bytes is too short for opcode {opcode:#x}")
    return Header(**fields, payload_start=head, payload_end=end - fields["pad"])
