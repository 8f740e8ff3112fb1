"""The collectives' transport over RoCE: one reliable-connected queue pair per peer (and per
channel) on the user-space RoCEv2 engine (testbed.traffic.roce), every message placed by RDMA
WRITE straight into the receiver's registered buffer.

A message moves by rendezvous, as MPI and NCCL do over verbs, so no SEND ever meets a receive
that is not posted (which would cost RNR NAKs and resent bursts):

1. ``recv(peer, out)`` registers ``out`` as a memory region and SENDs the peer a clear-to-send
   (CTS: its address, R_Key and length) on their QP;
2. ``send(peer, data)`` takes the peer's next CTS (messages between two ranks match in order,
   and both know each message's size), RDMA WRITEs ``data`` to that address, then SENDs a
   FIN; the reliable connection delivers in order, so when the FIN arrives the data is in
   place;
3. the receiver's ``recv`` returns on the FIN; the sender's ``send`` on the FIN's completion
   (acknowledged, so delivered).

CTS and FIN are 24-byte control messages into receives every QP keeps posted (a ring of
``CONTROL_SLOTS``, re-posted as consumed). The engine is single-threaded: one progress thread
owns it and every verbs call; ``send``/``recv`` (from any thread, as the executor's per-peer
threads call them) hand it commands and wait for their completion.

Set-up: every rank listens on the TCP side channel at its address from the table; a rank
dials every higher rank and accepts every lower one (so set-up cannot deadlock), each pair
exchanging the QP numbers, first PSNs and RoCE ports of its ``channels`` QPs, moving them to
RTS, then saying ready, so neither end sends before the other can receive.
"""
from __future__ import annotations

import queue
import socket
import struct
import threading
from collections import deque
from dataclasses import dataclass, field

from testbed.traffic.collectives.transport import (
    CONNECT_TIMEOUT_S,
    IO_TIMEOUT_S,
    Transport,
    byte_view,
)
from testbed.traffic.roce import cc as ccmod
from testbed.traffic.roce.engine import Engine, EngineConfig, SideChannel
from testbed.traffic.roce.verbs import (
    CompletionQueue,
    MemoryRegion,
    ProtectionDomain,
    QPConfig,
    QPInfo,
    QueuePair,
    RecvWR,
    SendWR,
    WcStatus,
    WrOpcode,
)

CONTROL = struct.Struct("!BxxxIQQ")   # kind, R_Key, address, length
CTS, FIN = 1, 2
CONTROL_SLOTS = 16                    # control receives kept posted per QP
CQ_DEPTH = 1 << 16
IDLE_WAIT_S = 0.001                   # the progress thread's longest sleep (new commands wait)
DIAL_RETRY_S = 0.05
DEFAULT_ROCE_PORT = 4791
UNSIGNALED_WR_ID = 0                  # the data WRITE: its FIN's completion covers it


@dataclass
class _Waiter:
    """A blocking call's completion, set by the progress thread."""

    done: threading.Event = field(default_factory=threading.Event)
    error: str | None = None

    def finish(self, error: str | None = None) -> None:
        self.error = error
        self.done.set()

    def wait(self, timeout_s: float, what: str) -> None:
        if not self.done.wait(timeout_s):
            raise TimeoutError(f"{what}: no completion in {timeout_s:g} s")
        if self.error is not None:
            raise ConnectionError(f"{what}: {self.error}")


@dataclass
class _Pending:
    """A message this rank sends or receives: its registered buffer, length and caller."""

    region: MemoryRegion
    length: int
    waiter: _Waiter


class _Link:
    """One QP to one peer on one channel, with its control ring and the messages in flight."""

    def __init__(self, qp: QueuePair, control: MemoryRegion):
        self.qp = qp
        self.control = control
        self.cts: deque[tuple[int, int, int]] = deque()   # (address, R_Key, length) received
        self.sends: deque[_Pending] = deque()          # waiting for their CTS
        self.recvs: deque[_Pending] = deque()          # waiting for their FIN


class RoceTransport(Transport):
    """RoCE between ranks: ``addresses`` is rank -> (ip, side-channel TCP port) of every
    rank (this one's too); the engine binds this rank's ip and ``roce_port`` (0: any free
    port, for several ranks on one address). ``rate_mbit`` paces every QP (None: unpaced);
    ``mtu_bytes`` is the RoCE path MTU; ``channels`` QPs per peer, each its own channel;
    ``ack_timeout_s`` every QP's local ACK timeout (None: the verbs default)."""

    def __init__(self, rank: int, world: int, addresses: dict, channels: int = 1,
                 roce_port: int = DEFAULT_ROCE_PORT, mtu_bytes: int = 4096,
                 rate_mbit: float | None = None, max_outstanding: int = 64,
                 ack_timeout_s: float | None = None,
                 connect_timeout_s: float = CONNECT_TIMEOUT_S,
                 io_timeout_s: float = IO_TIMEOUT_S):
        if not 0 <= rank < world:
            raise ValueError(f"bad rank {rank} for world {world}")
        if channels < 1:
            raise ValueError("channels must be at least 1")
        self.rank, self.world, self.channels = rank, world, channels
        self.addresses = dict(addresses)
        self.io_timeout_s = io_timeout_s
        self.rate_mbit = rate_mbit
        ip = self.addresses[rank][0]
        self.engine = Engine(EngineConfig(local_ip=ip, port=roce_port, max_idle_wait_s=IDLE_WAIT_S))
        self.pd = ProtectionDomain(self.engine)
        self.cq = CompletionQueue(CQ_DEPTH)
        timers = {} if ack_timeout_s is None else {"ack_timeout_s": ack_timeout_s}
        self.config = QPConfig(path_mtu_bytes=mtu_bytes, max_outstanding_packets=max_outstanding,
                               **timers)
        self.links: dict[tuple[int, int], _Link] = {}
        self.handlers: dict[int, object] = {}   # wr_id -> what its completion does
        self.next_wr = 1
        self.commands: queue.SimpleQueue = queue.SimpleQueue()
        self.failure: str | None = None
        self.closed = False
        try:
            self._connect_all(connect_timeout_s)
        except BaseException:
            self.engine.close()
            raise
        self.thread = threading.Thread(target=self._progress_loop, daemon=True,
                                       name=f"rank{rank}-roce")
        self.thread.start()

    # --- set-up (before the progress thread runs) ----------------------------------------------

    def _new_link(self, peer: int, channel: int) -> _Link:
        pacing, _ = ccmod.make("none", link_rate_bps=None if self.rate_mbit is None
                               else self.rate_mbit * 1e6, mtu_bytes=self.config.path_mtu_bytes)
        qp = QueuePair(self.pd, self.cq, self.cq, self.config, cc=pacing)
        qp.to_init()
        link = _Link(qp, MemoryRegion(self.pd, CONTROL.size * CONTROL_SLOTS))
        for slot in range(CONTROL_SLOTS):
            self._post_control_recv(link, slot)
        self.links[(peer, channel)] = link
        return link

    def _exchange(self, chan: SideChannel, peer: int, dialled: bool) -> None:
        """Swap QP infos with ``peer`` over ``chan``, connect, and agree both are ready."""
        mine = [self._new_link(peer, c) for c in range(self.channels)]
        hello = {"rank": self.rank, "infos": [link.qp.local_info().to_dict() for link in mine]}
        if dialled:
            chan.send(hello)
            theirs = chan.recv()
        else:
            theirs = hello_from = chan.recv()
            if hello_from["rank"] != peer:
                raise ConnectionError(f"rank {self.rank}: expected rank {peer}, "
                                      f"got {hello_from['rank']}")
            chan.send(hello)
        for link, info in zip(mine, theirs["infos"]):
            link.qp.to_rtr(QPInfo.from_dict(info))
            link.qp.to_rts()
        chan.send({"ready": True})
        if not chan.recv().get("ready"):
            raise ConnectionError(f"rank {self.rank}: rank {peer} was not ready")

    def _connect_all(self, timeout_s: float) -> None:
        ip, port = self.addresses[self.rank]
        with socket.create_server((ip, port)) as server:
            server.settimeout(timeout_s)
            pending = {p for p in self.addresses if p < self.rank}
            while pending:   # lower ranks dial this one, in whatever order they come
                conn, _ = server.accept()
                conn.settimeout(timeout_s)
                chan = SideChannel(conn)
                try:
                    peer = chan.recv().get("rank")
                    if peer not in pending:
                        raise ConnectionError(f"rank {self.rank}: unexpected hello from {peer}")
                    pending.discard(peer)
                    self._accept_exchange(chan, peer)
                finally:
                    chan.close()
            for peer in sorted(p for p in self.addresses if p > self.rank):
                chan = self._dial(peer, timeout_s)
                try:
                    self._exchange(chan, peer, dialled=True)
                finally:
                    chan.close()

    def _accept_exchange(self, chan: SideChannel, peer: int) -> None:
        """The accepting side once the dialler's first line (its rank) is read."""
        chan.send({"rank": self.rank, "ok": True})
        self._exchange(chan, peer, dialled=False)

    def _dial(self, peer: int, timeout_s: float) -> SideChannel:
        ip, port = self.addresses[peer]
        chan = SideChannel.connect(ip, port, timeout_s, DIAL_RETRY_S)
        chan.send({"rank": self.rank})
        if not chan.recv().get("ok"):
            raise ConnectionError(f"rank {self.rank}: rank {peer} refused the connection")
        return chan

    # --- the progress thread -------------------------------------------------------------------

    def _progress_loop(self) -> None:
        try:
            while not self.closed:
                while True:
                    try:
                        command = self.commands.get_nowait()
                    except queue.Empty:
                        break
                    command()
                self.engine.progress(IDLE_WAIT_S)
                for wc in self.cq.poll(CQ_DEPTH):
                    handler = self.handlers.pop(wc.wr_id, None)
                    if handler is not None:
                        handler(wc)
        except BaseException as exc:  # no caller to raise to: every waiter learns of it
            self._fail_all(f"the RoCE progress thread failed: {type(exc).__name__}: {exc}")

    def _wr_id(self, handler) -> int:
        wr_id = self.next_wr
        self.next_wr += 1
        self.handlers[wr_id] = handler
        return wr_id

    def _post_control_recv(self, link: _Link, slot: int) -> None:
        def on_control(wc) -> None:
            if wc.status is not WcStatus.SUCCESS:
                self._fail_all(f"control receive failed: {wc.status.name}")
                return
            kind, rkey, addr, length = CONTROL.unpack_from(link.control.view,
                                                           slot * CONTROL.size)
            self._post_control_recv(link, slot)
            if kind == CTS:
                link.cts.append((addr, rkey, length))
                self._start_writes(link)
            elif kind == FIN:
                pending = link.recvs.popleft()
                pending.region.close()
                pending.waiter.finish(None if length == pending.length else
                                      f"message of {length} B into a {pending.length} B buffer")

        link.qp.post_recv(RecvWR(self._wr_id(on_control), link.control, slot * CONTROL.size,
                                 CONTROL.size))

    def _post_control(self, link: _Link, kind: int, rkey: int, addr: int, length: int,
                      then=None) -> None:
        """SEND a control message; ``then(wc)`` runs on its completion."""
        region = MemoryRegion(self.pd, buffer=bytearray(CONTROL.pack(kind, rkey, addr, length)))

        def on_sent(wc) -> None:
            region.close()
            if wc.status is not WcStatus.SUCCESS:
                self._fail_all(f"control send failed: {wc.status.name}")
            elif then is not None:
                then(wc)

        link.qp.post_send(SendWR(self._wr_id(on_sent), WrOpcode.SEND, region))

    def _start_writes(self, link: _Link) -> None:
        """Match posted sends with the peer's clears-to-send, in order."""
        while link.sends and link.cts:
            pending = link.sends.popleft()
            addr, rkey, length = link.cts.popleft()
            if length != pending.length:
                pending.waiter.finish(f"{pending.length} B sent into a {length} B receive")
                continue
            link.qp.post_send(SendWR(UNSIGNALED_WR_ID, WrOpcode.RDMA_WRITE, pending.region,
                                     remote_addr=addr, rkey=rkey, signaled=False))

            def on_fin(wc, pending=pending) -> None:
                pending.region.close()
                pending.waiter.finish()

            self._post_control(link, FIN, 0, 0, pending.length, on_fin)

    def _fail_all(self, why: str) -> None:
        self.failure = why
        for link in self.links.values():
            for pending in [*link.sends, *link.recvs]:
                pending.waiter.finish(why)
            link.sends.clear()
            link.recvs.clear()

    # --- the Transport interface ---------------------------------------------------------------

    def _link(self, peer: int, channel: int = 0) -> _Link:
        if not 0 <= peer < self.world or peer == self.rank:
            raise ValueError(f"rank {self.rank}: bad peer {peer}")
        link = self.links.get((peer, channel))
        if link is None:
            raise ValueError(f"rank {self.rank}: no connection to rank {peer}")
        return link

    def _region(self, buf, writable: bool) -> tuple[MemoryRegion | None, int]:
        """``buf`` as a memory region (read-only data is copied first); None when empty."""
        view = byte_view(buf)
        if not len(view):
            return None, 0
        if view.readonly and not writable:
            view = memoryview(bytearray(view))
        return MemoryRegion(self.pd, buffer=view), len(view)

    def _submit(self, command) -> None:
        if self.failure is not None:
            raise ConnectionError(f"rank {self.rank}: {self.failure}")
        if self.closed:
            raise ConnectionError(f"rank {self.rank}: the transport is closed")
        self.commands.put(command)

    def post_send(self, peer: int, data, channel: int = 0) -> _Waiter | None:
        """Start sending ``data`` to ``peer``; the waiter finishes when it is delivered."""
        link = self._link(peer, channel)
        if not len(byte_view(data)):
            return None
        waiter = _Waiter()

        def command() -> None:
            region, length = self._region(data, writable=False)
            link.sends.append(_Pending(region, length, waiter))
            self._start_writes(link)

        self._submit(command)
        return waiter

    def post_recv(self, peer: int, out, channel: int = 0) -> _Waiter | None:
        """Start receiving ``peer``'s next message into ``out`` (writable, its exact size)."""
        link = self._link(peer, channel)
        if byte_view(out).readonly:
            raise ValueError("recv needs a writable buffer")
        if not len(byte_view(out)):
            return None
        waiter = _Waiter()

        def command() -> None:
            region, length = self._region(out, writable=True)
            link.recvs.append(_Pending(region, length, waiter))
            self._post_control(link, CTS, region.rkey, region.addr, length)

        self._submit(command)
        return waiter

    def _wait(self, waiter: _Waiter | None, what: str) -> None:
        if waiter is not None:
            waiter.wait(self.io_timeout_s, f"rank {self.rank}: {what}")

    def send_on(self, channel: int, peer: int, data) -> None:
        self._wait(self.post_send(peer, data, channel), f"send to rank {peer}")

    def recv_on(self, channel: int, peer: int, out) -> None:
        self._wait(self.post_recv(peer, out, channel), f"receive from rank {peer}")

    def sendrecv_on(self, channel: int, send_peer: int, data, recv_peer: int, out) -> None:
        """Both directions at once: the receive's clear-to-send leaves first."""
        receiving = self.post_recv(recv_peer, out, channel)
        sending = self.post_send(send_peer, data, channel)
        self._wait(sending, f"send to rank {send_peer}")
        self._wait(receiving, f"receive from rank {recv_peer}")

    def send(self, peer: int, data) -> None:
        self.send_on(0, peer, data)

    def recv(self, peer: int, out) -> None:
        self.recv_on(0, peer, out)

    def sendrecv(self, send_peer: int, data, recv_peer: int, out) -> None:
        self.sendrecv_on(0, send_peer, data, recv_peer, out)

    def channel(self, index: int) -> Transport:
        if not 0 <= index < self.channels:
            raise ValueError(f"rank {self.rank}: no channel {index} of {self.channels}")
        return self if self.channels == 1 else RoceChannel(self, index)

    def stats(self) -> dict:
        """The engine's counters and every QP's, for a program's report."""
        return {"engine": dict(self.engine.stats),
                "qps": {f"{peer}/{channel}": self.engine.qp_stats(link.qp)
                        for (peer, channel), link in sorted(self.links.items())}}

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        self.thread.join(timeout=self.io_timeout_s)
        self.engine.close()


class RoceChannel(Transport):
    """One channel of a RoceTransport: its own QP to every peer, so channels run as
    independent pipelines."""

    def __init__(self, base: RoceTransport, index: int):
        self.base, self.index = base, index
        self.rank, self.world = base.rank, base.world

    def send(self, peer: int, data) -> None:
        self.base.send_on(self.index, peer, data)

    def recv(self, peer: int, out) -> None:
        self.base.recv_on(self.index, peer, out)

    def sendrecv(self, send_peer: int, data, recv_peer: int, out) -> None:
        self.base.sendrecv_on(self.index, send_peer, data, recv_peer, out)

    def barrier(self) -> None:
        self.base.barrier()

