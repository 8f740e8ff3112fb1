"""The reliable-connection (RC) transport as two pure state machines: the requester (send
side of a QP) and the responder (receive side). No sockets and no clock: the caller passes
the time in seconds, and gets back what to transmit.

Requester
  Segments each work request at the path MTU into FIRST/MIDDLE/LAST (or ONLY) packets and
  hands them out in bursts (``next_burst``) within a window of outstanding packets. Each packet
  has an unwrapped index; its PSN is ``start_psn + index`` mod 2^24 (``psn``). The ack-request
  bit is set on the last packet of every message and on every ``ack_request_every``-th packet.
  ACKs are cumulative (``on_ack`` with the AETH): they retire packets and complete work
  requests in order. A NAK PSN-sequence-error retires everything before the NAKed PSN and
  goes back to it (go-back-N); an RNR NAK does the same after the RNR delay; other NAKs
  complete the request in error and flush the rest. A local ACK timeout (``on_timer``) goes
  back to the oldest unacknowledged packet, and once ``retry_count`` timeouts in a row have
  passed without progress the request completes with RETRY_EXC_ERR and the QP is in error.

Responder
  Keeps the expected PSN. An in-order packet is applied: RDMA WRITE payload is placed into the
  memory region the RETH names, after the R_Key, range and access check (``resolve``), SEND
  payload into the buffer of the oldest posted receive; the MSN counts finished messages. It
  ACKs when the packet asks for it or after ``ack_every`` unacknowledged packets (coalescing).
  A packet ahead of the expected PSN is dropped and answered by one NAK per gap; a duplicate
  (behind the expected PSN) is not applied again and is re-ACKed (cumulatively) under the
  same coalescing rule. A SEND with no posted receive gets an RNR NAK.

The ECN echo: the responder counts the payload bytes of CE-marked packets (``ce_bytes``) and,
with ``ecn_echo``, every ACK carries the running count (``wire`` defines the field).
"""
from __future__ import annotations

import bisect
from collections import deque
from dataclasses import dataclass
from typing import Callable, NamedTuple

from . import psn as psnmath
from . import wire
from .wire import NakCode, Opcode
from .work import WC_OPCODE_OF, CompletionQueue, WcOpcode, WcStatus, WorkCompletion, WrOpcode

ACKREQ_CODE_BIT = 0x80
INFINITE_RNR_RETRY = 7          # the verbs value meaning "retry for ever"
MAX_MESSAGE_BYTES = 1 << 31
IB_TIMEOUT_UNIT_S = 4.096e-6    # local ACK timeout = 4.096 us * 2^timeout_code
DEFAULT_TIMEOUT_CODE = 14       # 67 ms, perftest's default
_COMPACT_AFTER = 1024           # retired work requests kept before the list is compacted

_FIRST, _MIDDLE, _LAST, _ONLY = 0, 1, 2, 3
_OPCODES = {
    WrOpcode.SEND: (Opcode.SEND_FIRST, Opcode.SEND_MIDDLE, Opcode.SEND_LAST, Opcode.SEND_ONLY),
    WrOpcode.RDMA_WRITE: (Opcode.RDMA_WRITE_FIRST, Opcode.RDMA_WRITE_MIDDLE,
                          Opcode.RDMA_WRITE_LAST, Opcode.RDMA_WRITE_ONLY),
}
_FIRST_CODES = frozenset(int(op) for op in wire.FIRST_OPCODES)
_LAST_CODES = frozenset(int(op) for op in wire.LAST_OPCODES)
_CONTINUING = {kind: frozenset(int(op) for op in (ops[_MIDDLE], ops[_LAST]))
               for kind, ops in _OPCODES.items()}   # what may follow a FIRST of that kind
_NAK_STATUS = {
    NakCode.INVALID_REQUEST: WcStatus.REM_INV_REQ_ERR,
    NakCode.REMOTE_ACCESS_ERROR: WcStatus.REM_ACCESS_ERR,
    NakCode.REMOTE_OPERATIONAL_ERROR: WcStatus.REM_OP_ERR,
}


def timeout_s_from_code(timeout_code: int) -> float:
    """The local ACK timeout of a verbs ``timeout`` attribute (0..31)."""
    return IB_TIMEOUT_UNIT_S * (1 << timeout_code)


def packet_count(length_bytes: int, mtu_bytes: int) -> int:
    """Packets of a message at a path MTU (a zero-length message is one ONLY packet)."""
    return max(1, -(-length_bytes // mtu_bytes))


def packet_codes(wr_opcode: WrOpcode, npackets: int, first_index: int,
                 ack_request_every: int) -> bytearray:
    """Per packet of a message: its opcode, with ``ACKREQ_CODE_BIT`` when it asks for an ACK
    (the last packet, and every packet whose index + 1 is a multiple of ``ack_request_every``)."""
    first, middle, last, only = _OPCODES[wr_opcode]
    if npackets == 1:
        return bytearray([only | ACKREQ_CODE_BIT])
    codes = bytearray([middle]) * npackets
    codes[0] = first
    codes[-1] = last
    start = (-(first_index + 1)) % ack_request_every   # first local index with (index+1) % N == 0
    for i in range(start, npackets, ack_request_every):
        codes[i] |= ACKREQ_CODE_BIT
    codes[-1] |= ACKREQ_CODE_BIT
    return codes


@dataclass(eq=False)
class SendWqe:
    """A send work request being transmitted: packets ``first`` .. ``first + npackets - 1``."""
    wr_id: int
    opcode: WrOpcode
    payload: memoryview
    remote_addr: int
    rkey: int
    signaled: bool
    first: int
    npackets: int
    codes: bytearray

    @property
    def end(self) -> int:
        return self.first + self.npackets

    @property
    def reth(self) -> tuple[int, int, int] | None:
        if self.opcode is WrOpcode.RDMA_WRITE:
            return (self.remote_addr, self.rkey, len(self.payload))
        return None

    def bytes_between(self, start: int, stop: int, mtu_bytes: int) -> int:
        """Payload bytes of this message's packets with indices in [start, stop)."""
        lo = min(max(start - self.first, 0) * mtu_bytes, len(self.payload))
        hi = min(max(stop - self.first, 0) * mtu_bytes, len(self.payload))
        return max(hi - lo, 0)


class Burst(NamedTuple):
    """``count`` consecutive packets of ``wqe`` from its local packet index ``index``."""
    wqe: SendWqe
    index: int
    count: int


class OutPacket(NamedTuple):
    """One packet of a burst, spelled out (for tests and tools; the engine frames bursts)."""
    opcode: Opcode
    psn: int
    ackreq: bool
    payload: bytes
    reth: tuple[int, int, int] | None


class AckResult(NamedTuple):
    acked_packets: int
    acked_bytes: int
    go_back: bool      # transmission restarts from an earlier packet (NAK)
    fatal: bool        # the QP went to the error state


_NO_PROGRESS = AckResult(0, 0, False, False)


class Requester:
    """The send side of an RC QP (see the module docstring). Completions go to ``cq``."""

    def __init__(self, *, start_psn: int, mtu_bytes: int, cq: CompletionQueue,
                 qp_num: int = 0, ack_request_every: int = 16,
                 ack_timeout_s: float = timeout_s_from_code(DEFAULT_TIMEOUT_CODE),
                 retry_count: int = 7, rnr_retry: int = INFINITE_RNR_RETRY,
                 max_outstanding_packets: int = 128):
        if mtu_bytes not in wire.PATH_MTUS:
            raise ValueError(f"path MTU {mtu_bytes} is not one of {wire.PATH_MTUS}")
        if not 1 <= max_outstanding_packets <= psnmath.PSN_HALF:
            raise ValueError("outstanding packets must be within 1 .. 2^23")
        if ack_request_every < 1:
            raise ValueError("ack_request_every must be >= 1")
        self.start_psn = start_psn & psnmath.PSN_MASK
        self.mtu_bytes = mtu_bytes
        self.cq = cq
        self.qp_num = qp_num
        self.ack_request_every = ack_request_every
        self.ack_timeout_s = ack_timeout_s
        self.retry_count = retry_count
        self.rnr_retry = rnr_retry
        self.max_outstanding_packets = max_outstanding_packets
        self._wqes: list[SendWqe] = []
        self._firsts: list[int] = []
        self._head = 0            # first work request not yet retired
        self._tx_pos = 0          # work request holding packet ``tx``
        self.una = 0              # oldest unacknowledged packet
        self.tx = 0               # next packet to transmit
        self.posted = 0           # packet index after the last posted one
        self.max_sent = 0         # one past the highest packet ever transmitted
        self.inflight_bytes = 0   # payload bytes of packets [una, tx): what the window limits
        self.sent_bytes = 0       # payload bytes of packets [0, max_sent): SND.NXT
        self.acked_bytes = 0      # payload bytes of packets [0, una): SND.UNA
        self.deadline_s = float("inf")
        self.rnr_until_s = 0.0
        self.retries_left = retry_count
        self.rnr_retries_left = rnr_retry
        self.error = False
        self.packets_sent = 0
        self.retransmitted_packets = 0
        self.naks = 0
        self.rnr_naks = 0
        self.timeouts = 0
        self.acks = 0
        self.completed = 0
        self.completed_bytes = 0

    # --- posting and transmitting ----------------------------------------------------------

    def post(self, wr_id: int, opcode: WrOpcode, payload: memoryview, *, remote_addr: int = 0,
             rkey: int = 0, signaled: bool = True) -> SendWqe | None:
        """Queue a message; on a QP in error it completes at once, flushed (and None)."""
        if self.error:
            self.cq.push(WorkCompletion(wr_id, WcStatus.WR_FLUSH_ERR, WC_OPCODE_OF[opcode], 0,
                                        self.qp_num))
            return None
        if len(payload) > MAX_MESSAGE_BYTES:
            raise ValueError(f"message of {len(payload)} bytes exceeds 2^31")
        npackets = packet_count(len(payload), self.mtu_bytes)
        wqe = SendWqe(wr_id, WrOpcode(opcode), memoryview(payload).cast("B"), remote_addr, rkey,
                      signaled, self.posted, npackets,
                      packet_codes(opcode, npackets, self.posted, self.ack_request_every))
        self._wqes.append(wqe)
        self._firsts.append(wqe.first)
        self.posted += npackets
        return wqe

    @property
    def outstanding_packets(self) -> int:
        return self.tx - self.una

    @property
    def flight_bytes(self) -> int:
        """Bytes sent and not yet acknowledged (SND.NXT - SND.UNA), go-back-N or not."""
        return self.sent_bytes - self.acked_bytes

    def has_work(self, now_s: float) -> bool:
        """Whether ``next_burst`` would hand out a packet now."""
        return (not self.error and self.tx < self.posted and now_s >= self.rnr_until_s
                and self.tx - self.una < self.max_outstanding_packets)

    def next_burst(self, now_s: float, max_packets: int, request_ack: bool = False) -> Burst | None:
        """The next run of at most ``max_packets`` packets of one message to transmit.

        The last packet of the run asks for an ACK when ``request_ack`` (the caller stops
        here, e.g. at its congestion window) or when the run fills the outstanding window:
        otherwise a window smaller than the ACK coalescing period would wait for an ACK the
        responder has no reason to send before the timeout.
        """
        if not self.has_work(now_s) or max_packets < 1:
            return None
        wqe = self._wqes[self._tx_pos] if 0 <= self._tx_pos < len(self._wqes) else None
        if wqe is None or not wqe.first <= self.tx < wqe.end:
            self._tx_pos = self._position_of(self.tx)
            wqe = self._wqes[self._tx_pos]
        room = self.una + self.max_outstanding_packets - self.tx
        count = min(max_packets, wqe.end - self.tx, room)
        burst = Burst(wqe, self.tx - wqe.first, count)
        if request_ack or count == room:
            wqe.codes[burst.index + count - 1] |= ACKREQ_CODE_BIT
        if self.tx < self.max_sent:
            self.retransmitted_packets += min(count, self.max_sent - self.tx)
        self.inflight_bytes += wqe.bytes_between(self.tx, self.tx + count, self.mtu_bytes)
        if self.tx + count > self.max_sent:
            self.sent_bytes += wqe.bytes_between(max(self.tx, self.max_sent), self.tx + count,
                                                 self.mtu_bytes)
        if self.tx == self.una:
            self.deadline_s = now_s + self.ack_timeout_s
        self.tx += count
        self.max_sent = max(self.max_sent, self.tx)
        self.packets_sent += count
        return burst

    def expand(self, burst: Burst) -> list[OutPacket]:
        """The packets of a burst, one by one (what ``wire.BurstFramer`` frames)."""
        wqe, mtu = burst.wqe, self.mtu_bytes
        packets = []
        for i in range(burst.index, burst.index + burst.count):
            code = wqe.codes[i]
            opcode = Opcode(code & ~ACKREQ_CODE_BIT)
            packets.append(OutPacket(opcode, psnmath.wire_psn(self.start_psn, wqe.first + i),
                                     bool(code & ACKREQ_CODE_BIT),
                                     bytes(wqe.payload[i * mtu:(i + 1) * mtu]),
                                     wqe.reth if opcode in wire.RETH_OPCODES else None))
        return packets

    def _position_of(self, index: int) -> int:
        return bisect.bisect_right(self._firsts, index, self._head) - 1

    # --- feedback ----------------------------------------------------------------------------

    def on_ack(self, now_s: float, psn: int, syndrome: int, msn: int = 0) -> AckResult:
        """An ACK or NAK from the responder (BTH PSN and AETH syndrome)."""
        if self.error:
            return _NO_PROGRESS
        index = psnmath.unwrap(psn, self.start_psn, self.una)
        kind = syndrome & wire.SYNDROME_KIND_MASK
        if kind == 0:   # ACK: everything up to and including ``index`` arrived
            if not self.una <= index < self.max_sent:
                return _NO_PROGRESS
            self.acks += 1
            return self._retire(now_s, index + 1, go_back=False)
        if not self.una <= index <= self.max_sent:   # stale, or names a packet never sent
            return _NO_PROGRESS
        if kind == wire.AETH_RNR_NAK:
            self.rnr_naks += 1
            if self.rnr_retry != INFINITE_RNR_RETRY:
                self.rnr_retries_left -= 1
                if self.rnr_retries_left < 0:
                    result = self._retire(now_s, index, go_back=True)
                    self._fail(WcStatus.RNR_RETRY_EXC_ERR)
                    return result._replace(fatal=True)
            self.rnr_until_s = now_s + wire.rnr_delay_s(syndrome)
            return self._retire(now_s, index, go_back=True)
        if kind != wire.AETH_NAK:
            return _NO_PROGRESS
        code = syndrome & wire.SYNDROME_VALUE_MASK
        if code == NakCode.PSN_SEQUENCE_ERROR:
            if index == self.max_sent:   # nothing is missing: a late NAK, read as an ACK
                return self._retire(now_s, index, go_back=False)
            self.naks += 1
            return self._retire(now_s, index, go_back=True)
        result = self._retire(now_s, index, go_back=False)
        self._fail(_NAK_STATUS.get(code, WcStatus.REM_OP_ERR))
        return result._replace(fatal=True)

    def on_timer(self, now_s: float) -> bool:
        """Fire the local ACK timeout if due; True when it went back (or failed the QP)."""
        if self.error or now_s < self.deadline_s:
            return False
        if self.una >= self.tx:
            self.deadline_s = float("inf")
            return False
        self.timeouts += 1
        self.retries_left -= 1
        if self.retries_left < 0:
            self._fail(WcStatus.RETRY_EXC_ERR)
            return True
        self.tx = self.una
        self.inflight_bytes = 0
        self._tx_pos = self._position_of(self.tx)
        self.deadline_s = now_s + self.ack_timeout_s
        return True

    def next_deadline_s(self, now_s: float) -> float:
        """When the requester next needs ``on_timer``, or can send again after an RNR NAK."""
        if self.error:
            return float("inf")
        if self.tx < self.posted and self.rnr_until_s > now_s:
            return min(self.deadline_s, self.rnr_until_s)
        return self.deadline_s

    def _retire(self, now_s: float, new_una: int, go_back: bool) -> AckResult:
        """Acknowledge packets before ``new_una``; complete the messages they finish."""
        acked_packets = new_una - self.una
        acked_bytes = 0
        if acked_packets > 0:
            self.retries_left = self.retry_count
            if self.rnr_retry != INFINITE_RNR_RETRY and not go_back:
                self.rnr_retries_left = self.rnr_retry
            pos = self._position_of(self.una)
            while pos < len(self._wqes) and self._wqes[pos].first < new_una:
                wqe = self._wqes[pos]
                acked_bytes += wqe.bytes_between(self.una, new_una, self.mtu_bytes)
                if wqe.end > new_una:
                    break
                self._complete(wqe)
                pos += 1
            self.inflight_bytes = max(0, self.inflight_bytes - acked_bytes)
            self.acked_bytes += acked_bytes
            self.una = new_una
            self._compact()
        if go_back:
            self.tx = self.una
            self.inflight_bytes = 0
        elif self.tx < self.una:
            self.tx = self.una
            self.inflight_bytes = 0
        self._tx_pos = self._position_of(self.tx) if self.tx < self.posted else -1
        self.deadline_s = now_s + self.ack_timeout_s if self.tx > self.una or go_back else float("inf")
        return AckResult(acked_packets, acked_bytes, go_back, False)

    def _complete(self, wqe: SendWqe) -> None:
        self._head += 1
        self.completed += 1
        self.completed_bytes += len(wqe.payload)
        if wqe.signaled:
            self.cq.push(WorkCompletion(wqe.wr_id, WcStatus.SUCCESS, WC_OPCODE_OF[wqe.opcode],
                                        len(wqe.payload), self.qp_num))

    def _fail(self, status: WcStatus) -> None:
        """Complete the oldest outstanding request with ``status``, flush the rest; QP error."""
        for n, wqe in enumerate(self._wqes[self._head:]):
            self.cq.push(WorkCompletion(wqe.wr_id, status if n == 0 else WcStatus.WR_FLUSH_ERR,
                                        WC_OPCODE_OF[wqe.opcode], 0, self.qp_num))
        self._head = len(self._wqes)
        self._compact()
        self.error = True
        self.deadline_s = float("inf")

    def _compact(self) -> None:
        if self._head > _COMPACT_AFTER and self._head * 2 > len(self._wqes):
            del self._wqes[:self._head]
            del self._firsts[:self._head]
            self._head = 0
            self._tx_pos = -1


class Reply(NamedTuple):
    """An ACK or NAK to send back: BTH PSN, AETH syndrome and MSN, and the ECN echo."""
    psn: int
    syndrome: int
    msn: int
    ce_bytes: int | None


# resolve(rkey, virtual address, length) -> the registered memory to write, or None
Resolver = Callable[[int, int, int], "memoryview | None"]


class Responder:
    """The receive side of an RC QP (see the module docstring). Receive completions go to
    ``cq``; ``resolve`` checks an R_Key, range and remote-write access."""

    def __init__(self, *, start_psn: int, mtu_bytes: int, cq: CompletionQueue,
                 resolve: Resolver, qp_num: int = 0, ack_every: int = 16,
                 ecn_echo: bool = False, rnr_timer_code: int = 1):
        self.expected_psn = start_psn & psnmath.PSN_MASK
        self.mtu_bytes = mtu_bytes
        self.cq = cq
        self.resolve = resolve
        self.qp_num = qp_num
        self.ack_every = ack_every
        self.ecn_echo = ecn_echo
        self.rnr_syndrome = wire.rnr_syndrome(rnr_timer_code)
        self.msn = 0
        self._recv: deque[tuple[int, memoryview]] = deque()
        self._target: memoryview | None = None   # where the message in progress goes
        self._kind: WrOpcode | None = None
        self._cursor = 0
        self._limit = 0
        self._recv_wr_id = 0
        self._unacked = 0
        self._nak_sent = False
        self.packets = 0
        self.duplicates = 0
        self.out_of_sequence = 0
        self.acks_sent = 0
        self.naks_sent = 0
        self.rnr_naks_sent = 0
        self.access_errors = 0
        self.invalid_requests = 0
        self.messages = 0
        self.bytes_placed = 0
        self.ce_packets = 0
        self.ce_bytes = 0

    def post_recv(self, wr_id: int, buffer: memoryview) -> None:
        self._recv.append((wr_id, memoryview(buffer).cast("B")))

    @property
    def posted_receives(self) -> int:
        return len(self._recv)

    def on_packet(self, opcode: int, psn: int, ackreq: bool, payload: memoryview,
                  reth: tuple[int, int, int] | None = None, ce: bool = False) -> Reply | None:
        """One data packet (SEND or RDMA WRITE); returns the ACK/NAK to send, if any."""
        self.packets += 1
        size = len(payload)
        if ce:
            self.ce_packets += 1
            self.ce_bytes += size
        distance = ((psn - self.expected_psn + psnmath.PSN_HALF) & psnmath.PSN_MASK) - psnmath.PSN_HALF
        if distance > 0:
            self.out_of_sequence += 1
            if self._nak_sent:
                return None
            self._nak_sent = True
            self.naks_sent += 1
            return self._reply(self.expected_psn, wire.nak_syndrome(NakCode.PSN_SEQUENCE_ERROR))
        if distance < 0:
            self.duplicates += 1
            return self._count_toward_ack(ackreq, psnmath.add(self.expected_psn, -1))
        last = opcode in _LAST_CODES
        if not last and size != self.mtu_bytes:
            return self._invalid()   # FIRST and MIDDLE packets carry exactly one path MTU
        if opcode in _FIRST_CODES:
            if self._kind is not None:
                return self._invalid()
            nak = self._begin(opcode, psn, reth)
            if nak is not None:
                self._nak_sent = True   # what follows in this message is not NAKed again
                return nak
        elif self._kind is None or opcode not in _CONTINUING[self._kind]:
            return self._invalid()
        cursor = self._cursor
        if cursor + size > self._limit:
            if self._kind is WrOpcode.SEND:
                self.cq.push(WorkCompletion(self._recv_wr_id, WcStatus.LOC_LEN_ERR, WcOpcode.RECV,
                                            0, self.qp_num))
            return self._invalid()
        self._target[cursor:cursor + size] = payload
        self._cursor = cursor + size
        self.bytes_placed += size
        if last:
            if not self._finish():
                return self._invalid()
        self.expected_psn = (self.expected_psn + 1) & psnmath.PSN_MASK
        self._nak_sent = False
        return self._count_toward_ack(ackreq, psn)

    def _begin(self, opcode: int, psn: int, reth: tuple[int, int, int] | None) -> Reply | None:
        if opcode in wire.RETH_OPCODES:
            va, rkey, dma_len = reth
            target = self.resolve(rkey, va, dma_len)
            if target is None:
                self.access_errors += 1
                self.naks_sent += 1
                return self._reply(psn, wire.nak_syndrome(NakCode.REMOTE_ACCESS_ERROR))
            self._kind, self._target, self._limit = WrOpcode.RDMA_WRITE, target, dma_len
        else:
            if not self._recv:
                self.rnr_naks_sent += 1
                return self._reply(psn, self.rnr_syndrome)
            self._recv_wr_id, target = self._recv.popleft()
            self._kind, self._target, self._limit = WrOpcode.SEND, target, len(target)
        self._cursor = 0
        return None

    def _finish(self) -> bool:
        """The last packet of a message arrived: count it, complete a receive."""
        if self._kind is WrOpcode.RDMA_WRITE and self._cursor != self._limit:
            return False   # fewer bytes than the RETH announced
        if self._kind is WrOpcode.SEND:
            self.cq.push(WorkCompletion(self._recv_wr_id, WcStatus.SUCCESS, WcOpcode.RECV,
                                        self._cursor, self.qp_num))
        self.msn = (self.msn + 1) & wire.MSN_MASK
        self.messages += 1
        self._kind = self._target = None
        return True

    def _count_toward_ack(self, ackreq: bool, ack_psn: int) -> Reply | None:
        self._unacked += 1
        if not ackreq and self._unacked < self.ack_every:
            return None
        self._unacked = 0
        self.acks_sent += 1
        return self._reply(ack_psn, wire.AETH_ACK_NO_CREDITS)

    def _invalid(self) -> Reply:
        self.invalid_requests += 1
        self.naks_sent += 1
        self._kind = self._target = None
        return self._reply(self.expected_psn, wire.nak_syndrome(NakCode.INVALID_REQUEST))

    def _reply(self, psn: int, syndrome: int) -> Reply:
        return Reply(psn, syndrome, self.msn, self.ce_bytes if self.ecn_echo else None)
