"""The engine: the device behind ``verbs``. One UDP socket per host (port 4791 by default)
carries every QP's packets; a single-threaded progress loop receives, runs timers, and sends.

Per ``progress`` call:

1. receive: drain the socket (non-blocking); each datagram is checked (ICRC, against the QP's
   peer address, so a packet from anyone else fails too) and dispatched by destination QP:
   data to the responder (which may answer with an ACK/NAK, sent at once) and to the
   notification point (which may answer with a CNP); ACK/NAK to the requester, whose progress
   feeds the congestion control; CNP to the congestion control. The received TOS byte
   (IP_RECVTOS) says whether the packet was CE-marked.
2. timers: local ACK timeouts of every requester; the congestion controls' own timers.
3. send: every QP with work sends bursts within what its congestion control allows: the
   token bucket at ``rate_bps()`` (bytes counted with IPv4 and UDP headers, as the link
   counts them) and ``window_bytes()`` of data outstanding. Bursts are framed into a ring
   of slots (``wire.BurstFramer``); a full ring, or what one QP's turn produced, leaves in
   one sendmmsg (``batch``).
4. if nothing happened, sleep in select() until a datagram arrives or the next timer or token
   is due (capped by ``max_idle_wait_s``): an idle engine does not spin.

Packets carry their class in the TOS byte: data the lossless class's DSCP with ECT(0)
(the socket's IP_TOS), ACK/NAK/CNP the control class's DSCP (per packet, in an IP_TOS
control message). The socket is unconnected with DF set (see ``wire`` on why the ICRC needs
that).

Test hooks (``FaultHooks``): drop packets on the send path with a probability, mark data
packets CE on the send path (as a switch would), and capture every packet sent. With a hook
on, packets leave one ``sendmsg`` at a time.

Connection set-up (QPN, PSN, address, R_Key) goes over a small TCP side channel, as perftest
and rdma_cm do: ``SideChannel``.
"""
from __future__ import annotations

import json
import math
import random
import select
import socket
import time
from dataclasses import dataclass
from typing import Callable

from . import wire
from .batch import BurstSender
from .cc.dctcp import echo_delta
from .verbs import MemoryRegion, QueuePair

# Linux values the socket module of Python 3.11 does not name.
IP_MTU_DISCOVER = getattr(socket, "IP_MTU_DISCOVER", 10)
IP_PMTUDISC_DO = getattr(socket, "IP_PMTUDISC_DO", 2)

DATA_DSCP = 26          # the lossless class
CONTROL_DSCP = 48       # ACK, NAK, CNP
IP_UDP_BYTES = wire.IPV4_HEADER_BYTES + wire.UDP_HEADER_BYTES
FIRST_QPN = 0x11        # QPs 0 and 1 are the special management QPs of InfiniBand
MR_ALIGN_BYTES = 4096
MR_BASE_ADDR = 0x7F00_0000_0000
MAX_DATAGRAM_BYTES = 65536
RECEIVE_BATCH = 256     # datagrams drained per progress call before timers and sends run
MIN_DEPTH_PACKETS = 4   # token bucket depth floor
_MIN_DATAGRAM_BYTES = wire.BTH_BYTES + wire.ICRC_BYTES
_DATA_OPCODES = frozenset(int(op) for op in wire.DATA_OPCODES)
_ANC_BYTES = socket.CMSG_SPACE(4)


@dataclass(frozen=True)
class EngineConfig:
    local_ip: str
    port: int = wire.ROCE_UDP_PORT
    data_dscp: int = DATA_DSCP
    control_dscp: int = CONTROL_DSCP
    ecn_capable: bool = True                # data packets leave ECT(0)
    verify_icrc: bool = True
    burst_packets: int = 128                # packets framed and sent per system call
    turn_packets: int = 1024                # packets one QP may send before the loop moves on
    pacing_burst_s: float = 1e-3            # token bucket depth, as time at the current rate:
                                            # how much a loop stalled by the scheduler may
                                            # catch up (a burst), beyond which it loses rate
    socket_buffer_bytes: int = 4 << 20      # requested SO_SNDBUF/SO_RCVBUF (kernel caps it)
    max_idle_wait_s: float = 0.05


@dataclass(frozen=True)
class FaultHooks:
    """Test hooks on the send path (see the module docstring)."""
    drop_probability: float = 0.0
    ce_mark_probability: float = 0.0
    capture: Callable[[bytes, tuple[str, int], int], None] | None = None
    seed: int = 0

    @property
    def active(self) -> bool:
        return self.drop_probability > 0 or self.ce_mark_probability > 0 or self.capture is not None


class TokenBucket:
    """Pacing for one QP: tokens in bytes accrue at the rate up to a depth worth ``burst_s``
    at that rate, and never less than ``MIN_DEPTH_PACKETS`` packets, so that a loop woken a
    little late by the scheduler does not lose the tokens of the packets it owes."""

    def __init__(self, burst_s: float, now_s: float = 0.0):
        self.burst_s = burst_s
        self.tokens = 0.0
        self.refilled_s = now_s

    def allowance(self, now_s: float, rate_bps: float, packet_bytes: int) -> tuple[int, float]:
        """Packets of ``packet_bytes`` that may leave now, and when the next one may if none."""
        depth = max(MIN_DEPTH_PACKETS * packet_bytes, rate_bps / 8 * self.burst_s)
        self.tokens = min(depth, self.tokens + (now_s - self.refilled_s) * rate_bps / 8)
        self.refilled_s = now_s
        packets = int(self.tokens // packet_bytes)
        if packets:
            return packets, now_s
        return 0, now_s + (packet_bytes - self.tokens) * 8 / rate_bps

    def spend(self, nbytes: int) -> None:
        self.tokens -= nbytes


class Engine:
    """One host's transport: the socket, its QPs, the progress loop (module docstring)."""

    def __init__(self, config: EngineConfig, hooks: FaultHooks | None = None,
                 clock: Callable[[], float] = time.monotonic):
        if config.local_ip in ("", "0.0.0.0"):
            raise ValueError("the engine binds one address: the ICRC covers the source address")
        self.config = config
        self.hooks = hooks or FaultHooks()
        self.clock = clock
        self.data_tos = wire.tos_byte(config.data_dscp,
                                      wire.ECN_ECT0 if config.ecn_capable else wire.ECN_NOT_ECT)
        self.control_tos = wire.tos_byte(config.control_dscp, wire.ECN_NOT_ECT)
        self._control_anc = [(socket.IPPROTO_IP, socket.IP_TOS, bytes([self.control_tos]))]
        self._ce_anc = [(socket.IPPROTO_IP, socket.IP_TOS,
                         bytes([wire.tos_byte(config.data_dscp, wire.ECN_CE)]))]
        self.sock = self._open_socket(config, self.data_tos)
        self.port = self.sock.getsockname()[1]
        slot_bytes = (wire.BTH_BYTES + wire.RETH_BYTES + max(wire.PATH_MTUS) + wire.MAX_PAD_BYTES
                      + wire.ICRC_BYTES)
        self._tx = BurstSender(self.sock, config.burst_packets, slot_bytes)
        self._framer = wire.BurstFramer(self._tx.view, config.burst_packets, slot_bytes)
        self._rbuf = bytearray(MAX_DATAGRAM_BYTES)
        self._rview = memoryview(self._rbuf)
        self._rng = random.Random(self.hooks.seed)
        self._hooked = self.hooks.active
        self._qps: dict[int, QueuePair] = {}
        self._active: dict[int, QueuePair] = {}   # QPs with posted work, in arrival order
        self._pacers: dict[int, TokenBucket] = {}
        self._next_qpn = FIRST_QPN
        self._next_key = random.getrandbits(20) << 8 | 1
        self._next_addr = MR_BASE_ADDR
        self.stats = dict(datagrams_sent=0, data_packets_sent=0, control_packets_sent=0,
                          bytes_sent=0, datagrams_received=0, icrc_errors=0, unknown_qp=0,
                          malformed=0, dropped_by_hook=0, ce_marked_by_hook=0, cnps_sent=0,
                          cnps_received=0, waits=0)

    @staticmethod
    def _open_socket(config: EngineConfig, data_tos: int) -> socket.socket:
        sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, config.socket_buffer_bytes)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, config.socket_buffer_bytes)
            # DF on every datagram: no fragmentation, and IP ID 0 from an unconnected socket.
            sock.setsockopt(socket.IPPROTO_IP, IP_MTU_DISCOVER, IP_PMTUDISC_DO)
            sock.setsockopt(socket.IPPROTO_IP, socket.IP_TOS, data_tos)   # data; control per packet
            sock.setsockopt(socket.IPPROTO_IP, socket.IP_RECVTOS, 1)
            sock.bind((config.local_ip, config.port))
        except OSError:
            sock.close()
            raise
        return sock

    def close(self) -> None:
        self.sock.close()

    def __enter__(self) -> "Engine":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # --- the device interface of verbs ---------------------------------------------------------

    def local_address(self) -> tuple[str, int]:
        return self.config.local_ip, self.port

    def register_mr(self, mr: MemoryRegion) -> tuple[int, int, int]:
        key = self._next_key
        self._next_key = (self._next_key + 0x100) & 0xFFFFFFFF
        addr = self._next_addr
        self._next_addr += (mr.length // MR_ALIGN_BYTES + 2) * MR_ALIGN_BYTES
        return key, key, addr

    def attach_qp(self, qp: QueuePair) -> int:
        qpn = self._next_qpn
        self._next_qpn += 1
        self._qps[qpn] = qp
        self._pacers[qpn] = TokenBucket(self.config.pacing_burst_s, self.clock())
        return qpn

    def activate(self, qp: QueuePair) -> None:
        self._active.setdefault(qp.qp_num, qp)

    # --- progress ----------------------------------------------------------------------------------

    def run_until(self, done: Callable[[], bool], timeout_s: float) -> bool:
        """Progress until ``done()`` or ``timeout_s`` passes; returns ``done()``."""
        deadline = self.clock() + timeout_s
        while not done():
            now = self.clock()
            if now >= deadline:
                return done()
            self.progress(min(deadline - now, self.config.max_idle_wait_s))
        return True

    def progress(self, max_wait_s: float = 0.0) -> bool:
        """One pass of the loop (module docstring); True if anything was received or sent."""
        now = self.clock()
        received = self._receive(now)
        if received:
            now = self.clock()
        fired, wake_s = self._run_timers(now)
        sent, due_s = self._transmit(now)
        if received or sent or fired:
            return True
        wait_s = min(min(wake_s, due_s) - self.clock(), max_wait_s)
        if wait_s > 0:
            self.stats["waits"] += 1
            select.select([self.sock], [], [], wait_s)
        return False

    def _run_timers(self, now: float) -> tuple[int, float]:
        """Fire due ACK timeouts; returns how many fired and when the next one is due."""
        fired, wake_s = 0, math.inf
        for qp in self._qps.values():
            req = qp.requester
            if req is None:
                continue
            qp.cc.advance(now)
            if req.deadline_s <= now and req.on_timer(now):
                fired += 1
                qp.cc.on_loss(now, True, req.flight_bytes)
                if req.has_work(now):
                    self.activate(qp)
            wake_s = min(wake_s, req.next_deadline_s(now))
        return fired, wake_s

    # --- receive -------------------------------------------------------------------------------

    def _receive(self, now: float) -> int:
        """Drain the socket; dispatch each datagram (the per-packet receive path: keep it lean)."""
        recvmsg_into, rview, buf = self.sock.recvmsg_into, self._rview, self._rbuf
        unpack_bth = wire.BTH_STRUCT.unpack_from
        qps, verify, stats = self._qps, self.config.verify_icrc, self.stats
        count = 0
        while count < RECEIVE_BATCH:
            try:
                length, anc, _flags, _addr = recvmsg_into([rview], _ANC_BYTES, socket.MSG_DONTWAIT)
            except BlockingIOError:
                break
            count += 1
            if length < _MIN_DATAGRAM_BYTES:
                stats["malformed"] += 1
                continue
            opcode, flags, _pkey, qpn_word, psn_word = unpack_bth(buf, 0)
            qp = qps.get(qpn_word & 0xFFFFFF)
            if qp is None or qp.rx_seeds is None:
                stats["unknown_qp"] += 1
                continue
            if verify and not wire.icrc_ok(qp.rx_seeds, buf, length):
                stats["icrc_errors"] += 1
                continue
            if opcode in _DATA_OPCODES:
                self._on_data(qp, opcode, flags, psn_word, length,
                              anc[0][2][0] & wire.ECN_MASK == wire.ECN_CE if anc else False, now)
            elif opcode == wire.Opcode.ACKNOWLEDGE:
                self._on_ack(qp, psn_word & 0xFFFFFF, length, now)
            elif opcode == wire.Opcode.CNP:
                stats["cnps_received"] += 1
                qp.cnps_received += 1
                qp.cc.on_cnp(now)
            else:
                stats["malformed"] += 1
        stats["datagrams_received"] += count
        return count

    def _on_data(self, qp: QueuePair, opcode: int, flags: int, psn_word: int, length: int,
                 ce: bool, now: float) -> None:
        head, reth = wire.BTH_BYTES, None
        if opcode in wire.RETH_OPCODES:
            reth = wire.RETH_STRUCT.unpack_from(self._rbuf, head)
            head += wire.RETH_BYTES
        end = length - wire.ICRC_BYTES - ((flags >> 4) & 3)
        if end < head:
            self.stats["malformed"] += 1
            return
        reply = qp.responder.on_packet(opcode, psn_word & 0xFFFFFF, psn_word >> 31,
                                       self._rview[head:end], reth, ce)
        if reply is not None:
            self._send_control(qp, wire.build_ack(qp.tx_seeds, qp.remote.qpn, reply.psn,
                                                  reply.syndrome, reply.msn, reply.ce_bytes,
                                                  qp.config.pkey))
        if ce and qp.np is not None and qp.np.on_data(now, ce):
            qp.cnps_sent += 1
            self.stats["cnps_sent"] += 1
            self._send_control(qp, wire.build_cnp(qp.tx_seeds, qp.remote.qpn, qp.config.pkey))

    def _on_ack(self, qp: QueuePair, psn: int, length: int, now: float) -> None:
        req = qp.requester
        if req is None or length < wire.BTH_BYTES + wire.AETH_BYTES + wire.ICRC_BYTES:
            self.stats["malformed"] += 1
            return
        (aeth,) = wire.AETH_STRUCT.unpack_from(self._rbuf, wire.BTH_BYTES)
        syndrome = aeth >> 24
        result = req.on_ack(now, psn, syndrome, aeth & wire.MSN_MASK)
        marked = 0
        if length >= wire.BTH_BYTES + wire.AETH_BYTES + wire.ECN_ECHO_BYTES + wire.ICRC_BYTES:
            (echo,) = wire.ECN_ECHO_STRUCT.unpack_from(self._rbuf, wire.BTH_BYTES + wire.AETH_BYTES)
            marked = echo_delta(echo, qp.last_echo_bytes)
            if marked:
                qp.last_echo_bytes = echo
        if result.acked_bytes or marked:
            qp.cc.on_ack(now, result.acked_bytes, marked, req.flight_bytes)
        if result.go_back and syndrome & wire.SYNDROME_KIND_MASK == wire.AETH_NAK:
            qp.cc.on_loss(now, False, req.flight_bytes)
        if req.has_work(now) or req.tx < req.posted:
            self.activate(qp)

    # --- send --------------------------------------------------------------------------------------

    def _transmit(self, now: float) -> tuple[int, float]:
        """Send what every active QP may; returns packets sent and when tokens are next due."""
        sent, due_s = 0, math.inf
        for qpn, qp in list(self._active.items()):
            req = qp.requester
            if req.error or req.tx >= req.posted:
                del self._active[qpn]
                continue
            n, qp_due = self._transmit_qp(qp, req, now)
            sent += n
            due_s = min(due_s, qp_due)
        return sent, due_s

    def _transmit_qp(self, qp: QueuePair, req, now: float) -> tuple[int, float]:
        """Send what one QP may now: bursts from the requester, within its congestion
        control, framed into the ring (several messages' bursts share one sendmmsg)."""
        cc, pacer, mtu = qp.cc, self._pacers[qp.qp_num], req.mtu_bytes
        packet_bytes = mtu + wire.BTH_BYTES + wire.ICRC_BYTES + IP_UDP_BYTES
        dest = (qp.remote.ip, qp.remote.port)
        lengths: list[int] = []
        sent, due_s = 0, math.inf
        while sent < self.config.turn_packets and req.has_work(now):
            count = self.config.burst_packets - len(lengths)
            if not count:
                self._flush(dest, lengths)
                continue
            rate = cc.rate_bps()
            if rate is not None:
                allowed, due_s = pacer.allowance(now, rate, packet_bytes)
                if not allowed:
                    break
                count = min(count, allowed)
            window = cc.window_bytes()
            window_limited = False
            if window is not None:
                room = int((window - req.inflight_bytes) // mtu)
                if room <= 0:
                    if req.inflight_bytes > 0:
                        break
                    room = 1   # a window below one packet still lets one packet out
                window_limited = room <= count
                count = min(count, room)
            burst = req.next_burst(now, count, request_ack=window_limited)
            if burst is None:
                break
            wire_bytes, payload_bytes = self._frame(qp, burst, lengths)
            if rate is not None:
                pacer.spend(wire_bytes)
            cc.on_sent(now, payload_bytes)
            sent += burst.count
        self._flush(dest, lengths)
        return sent, due_s

    def _frame(self, qp: QueuePair, burst, lengths: list[int]) -> tuple[int, int]:
        """Frame a burst into the next free slots; returns its bytes on the wire (with IPv4
        and UDP) and of payload."""
        wqe, req = burst.wqe, qp.requester
        first_slot = len(lengths)
        self._framer.frame(qp.tx_seeds, qp.remote.qpn, (req.start_psn + wqe.first) & 0xFFFFFF,
                           wqe.codes, wqe.payload, req.mtu_bytes, burst.index, burst.count,
                           wqe.reth, lengths, qp.config.pkey, first_slot=first_slot)
        payload = wqe.bytes_between(wqe.first + burst.index, wqe.first + burst.index + burst.count,
                                    req.mtu_bytes)
        return sum(lengths[first_slot:]) + IP_UDP_BYTES * burst.count, payload

    def _flush(self, dest: tuple[str, int], lengths: list[int]) -> None:
        """Send the framed slots and empty ``lengths``."""
        if not lengths:
            return
        if self._hooked:
            self._send_through_hooks(dest, lengths)
        else:
            self._tx.send(dest, lengths)
        self.stats["datagrams_sent"] += len(lengths)
        self.stats["data_packets_sent"] += len(lengths)
        self.stats["bytes_sent"] += sum(lengths)
        lengths.clear()

    def _send_through_hooks(self, dest: tuple[str, int], lengths: list[int]) -> None:
        hooks, view, slot = self.hooks, self._tx.view, self._tx.slot_bytes
        for k, length in enumerate(lengths):
            packet = bytes(view[k * slot:k * slot + length])
            marked = hooks.ce_mark_probability > 0 and self._rng.random() < hooks.ce_mark_probability
            self.stats["ce_marked_by_hook"] += marked
            tos = wire.tos_byte(self.config.data_dscp, wire.ECN_CE) if marked else self.data_tos
            self._hooked_send(packet, dest, tos, self._ce_anc if marked else [])

    def _send_control(self, qp: QueuePair, packet: bytes) -> None:
        dest = (qp.remote.ip, qp.remote.port)
        self.stats["control_packets_sent"] += 1
        self.stats["datagrams_sent"] += 1
        self.stats["bytes_sent"] += len(packet)
        if self._hooked:
            self._hooked_send(packet, dest, self.control_tos, self._control_anc)
        else:
            self.sock.sendmsg([packet], self._control_anc, 0, dest)

    def _hooked_send(self, packet: bytes, dest: tuple[str, int], tos: int, anc: list) -> None:
        hooks = self.hooks
        if hooks.capture is not None:
            hooks.capture(packet, dest, tos)
        if hooks.drop_probability > 0 and self._rng.random() < hooks.drop_probability:
            self.stats["dropped_by_hook"] += 1
            return
        self.sock.sendmsg([packet], anc, 0, dest)

    # --- summaries -----------------------------------------------------------------------------

    def qp_stats(self, qp: QueuePair) -> dict:
        """Counters of one QP's requester and responder."""
        out = {"qpn": qp.qp_num, "state": qp.state.name, "cnps_sent": qp.cnps_sent,
               "cnps_received": qp.cnps_received}
        req, resp = qp.requester, qp.responder
        if req is not None:
            out.update(packets_sent=req.packets_sent, retransmitted_packets=req.retransmitted_packets,
                       naks_received=req.naks, rnr_naks_received=req.rnr_naks,
                       timeouts=req.timeouts, acks_received=req.acks,
                       messages_completed=req.completed, bytes_completed=req.completed_bytes,
                       error=req.error)
        if resp is not None:
            out.update(packets_received=resp.packets, duplicates=resp.duplicates,
                       out_of_sequence=resp.out_of_sequence, acks_sent=resp.acks_sent,
                       naks_sent=resp.naks_sent, rnr_naks_sent=resp.rnr_naks_sent,
                       messages_received=resp.messages, bytes_placed=resp.bytes_placed,
                       ce_packets=resp.ce_packets, ce_bytes=resp.ce_bytes,
                       access_errors=resp.access_errors, invalid_requests=resp.invalid_requests)
        return out


class SideChannel:
    """A TCP connection carrying JSON lines: the out-of-band exchange of ``QPInfo`` before
    connecting, and of results afterwards (perftest and rdma_cm do the same over TCP)."""

    def __init__(self, conn: socket.socket):
        self.conn = conn
        self._reader = conn.makefile("r", encoding="utf-8")

    @staticmethod
    def listen(bind_ip: str, port: int) -> socket.socket:
        """A non-blocking listening socket, for ``accept_ready`` inside a progress loop."""
        server = socket.create_server((bind_ip, port))
        server.setblocking(False)
        return server

    @classmethod
    def accept_ready(cls, server: socket.socket, timeout_s: float) -> "SideChannel | None":
        """The next pending connection, or None if nobody is waiting."""
        try:
            conn, _ = server.accept()
        except BlockingIOError:
            return None
        conn.settimeout(timeout_s)
        return cls(conn)

    @classmethod
    def connect(cls, peer_ip: str, port: int, timeout_s: float,
                retry_interval_s: float = 0.05) -> "SideChannel":
        """Connect, retrying while the server is not listening yet."""
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                conn = socket.create_connection((peer_ip, port), timeout=timeout_s)
                conn.settimeout(timeout_s)
                return cls(conn)
            except (ConnectionRefusedError, socket.timeout):
                if time.monotonic() + retry_interval_s >= deadline:
                    raise
                time.sleep(retry_interval_s)

    def send(self, message: dict) -> None:
        self.conn.sendall((json.dumps(message) + "\n").encode())

    def recv(self) -> dict:
        line = self._reader.readline()
        if not line:
            raise ConnectionError("side channel closed by the peer")
        return json.loads(line)

    def readable(self) -> bool:
        """Whether a message (or the peer's close) is waiting, without blocking."""
        return bool(select.select([self.conn], [], [], 0)[0])

    def close(self) -> None:
        self._reader.close()
        self.conn.close()
