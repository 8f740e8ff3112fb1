"""How collectives move bytes between ranks: a narrow interface and its implementations.

``Transport`` is what a collective may use: ``send`` a buffer to a peer, ``recv`` into a
preallocated buffer from a peer, ``sendrecv`` both at once, ``barrier``. Messages between two
ranks are matched in order and a receiver knows each message's size, so no framing is sent.
A RoCE transport implements the same four calls.

``SocketTransport`` implements them over stream sockets: ``channels`` connections per
direction of each peer pair, a message of at least ``min_part_bytes`` per channel split
across them (the receiver splits its buffer the same way), every transfer driven by poll()
on non-blocking sockets, so a sendrecv needs no extra thread. ``TcpTransport`` dials its peers
from a rank -> (ip, port) table, on demand or all at once (``connect``), and accepts theirs on
one listening port; connections carry TCP_NODELAY and optionally a DSCP. ``local_transports``
builds a world of in-process transports over socket pairs for tests. ``RecordingTransport``
wraps any transport and records every message (time, source, destination, bytes, tag).
"""
from __future__ import annotations

import select
import socket
import struct
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass

from testbed.traffic.collectives.schedule import chunk_bounds

CONNECT_TIMEOUT_S = 60.0
IO_TIMEOUT_S = 300.0          # a transfer that makes no progress for this long fails
MIN_PART_BYTES = 16 * 1024    # a message is split over as many channels as give parts this big
DIAL_RETRY_S = 0.05
HELLO = struct.Struct("!4sII")  # magic, rank, channel: the first bytes on every connection
HELLO_MAGIC = b"TBCL"
TIMEVAL = struct.Struct("@ll")  # struct timeval (seconds, microseconds): SO_RCVTIMEO, SO_SNDTIMEO


class Transport:
    """Point-to-point messages between the ``world`` ranks of one job; this one is ``rank``."""

    rank: int
    world: int

    def send(self, peer: int, data) -> None:
        """Send all of ``data`` (any contiguous buffer) to ``peer``."""
        raise NotImplementedError

    def recv(self, peer: int, out) -> None:
        """Fill all of ``out`` (a writable contiguous buffer) with the next message from ``peer``."""
        raise NotImplementedError

    def sendrecv(self, send_peer: int, data, recv_peer: int, out) -> None:
        """Send to one peer while receiving from another (or the same) one."""
        errors: list[BaseException] = []

        def sender():
            try:
                self.send(send_peer, data)
            except BaseException as exc:
                errors.append(exc)

        thread = threading.Thread(target=sender, daemon=True)
        thread.start()
        try:
            self.recv(recv_peer, out)
        finally:
            thread.join()
        if errors:
            raise errors[0]

    def channel(self, index: int) -> Transport:
        """A transport over channel ``index`` alone, for a pipeline of its own; a transport
        with one channel is its own only channel."""
        if index != 0:
            raise ValueError(f"{type(self).__name__} has one channel")
        return self

    def barrier(self) -> None:
        """A token goes twice around the ring rank -> rank+1: afterwards every rank has
        entered the barrier. Needs only the ring neighbours' connections."""
        if self.world < 2:
            return
        token = bytearray(1)
        nxt, prev = (self.rank + 1) % self.world, (self.rank - 1) % self.world
        for _ in range(2):
            if self.rank == 0:
                self.send(nxt, b"\x01")
                self.recv(prev, token)
            else:
                self.recv(prev, token)
                self.send(nxt, b"\x01")

    def close(self) -> None:
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def byte_view(buf) -> memoryview:
    return memoryview(buf).cast("B")


def split_message(n_bytes: int, channels: int, min_part_bytes: int = MIN_PART_BYTES) -> list[tuple[int, int]]:
    """[start, end) byte ranges of a message's parts, part c on channel c: as many channels
    as give every part at least ``min_part_bytes``, and at least one."""
    parts = max(1, min(channels, n_bytes // max(1, min_part_bytes)))
    return chunk_bounds(n_bytes, parts)


class SocketTransport(Transport):
    """The transfers over connected stream sockets; subclasses say where the sockets come
    from: ``_out(peer)`` (this rank writes) and ``_in(peer)`` (this rank reads), one per
    channel."""

    def __init__(self, rank: int, world: int, channels: int = 1,
                 io_timeout_s: float = IO_TIMEOUT_S, min_part_bytes: int = MIN_PART_BYTES):
        if not 0 <= rank < world:
            raise ValueError(f"bad rank {rank} for world {world}")
        if channels < 1:
            raise ValueError("channels must be at least 1")
        self.rank, self.world, self.channels = rank, world, channels
        self.io_timeout_s = io_timeout_s
        self.min_part_bytes = min_part_bytes

    def _out(self, peer: int) -> list[socket.socket]:
        raise NotImplementedError

    def _in(self, peer: int) -> list[socket.socket]:
        raise NotImplementedError

    def _parts(self, socks: list[socket.socket], buf) -> list[tuple[socket.socket, memoryview]]:
        view = byte_view(buf)
        return [(socks[c], view[lo:hi])
                for c, (lo, hi) in enumerate(split_message(len(view), self.channels, self.min_part_bytes))]

    def channel(self, index: int) -> Transport:
        if not 0 <= index < self.channels:
            raise ValueError(f"rank {self.rank}: no channel {index} of {self.channels}")
        return self if self.channels == 1 else ChannelView(self, index)

    def _check_peer(self, peer: int) -> None:
        if not 0 <= peer < self.world or peer == self.rank:
            raise ValueError(f"rank {self.rank}: bad peer {peer}")

    def send(self, peer: int, data) -> None:
        self._check_peer(peer)
        self._transfer(self._parts(self._out(peer), data), [])

    def recv(self, peer: int, out) -> None:
        self._check_peer(peer)
        self._transfer([], self._parts(self._in(peer), out))

    def _in_ready(self, peer: int) -> bool:
        """Whether ``_in(peer)`` would return at once."""
        return True

    def sendrecv(self, send_peer: int, data, recv_peer: int, out) -> None:
        self._check_peer(send_peer)
        self._check_peer(recv_peer)
        if not self._in_ready(recv_peer):
            # the peer dials this rank when it first sends, perhaps only after receiving
            # this send: waiting for its connection first would deadlock
            super().sendrecv(send_peer, data, recv_peer, out)
            return
        self._transfer(self._parts(self._out(send_peer), data), self._parts(self._in(recv_peer), out))

    def _transfer(self, sends, recvs) -> None:
        """Move every (socket, view) of ``sends`` and ``recvs`` to completion, whichever is
        ready first; fail after ``io_timeout_s`` without progress."""
        items = [(sock, view, True) for sock, view in sends if len(view)]
        items += [(sock, view, False) for sock, view in recvs if len(view)]
        if len(items) == 1:
            self._transfer_blocking(*items[0])
            return
        pending = {}
        for writing, items in ((True, sends), (False, recvs)):
            for sock, view in items:
                if len(view):
                    pending[sock.fileno()] = [sock, view, writing]
        ready = list(pending)
        poller = None
        deadline = time.monotonic() + self.io_timeout_s
        while pending:
            for fd in ready:
                entry = pending.get(fd)
                if entry is None:
                    continue
                if self._progress(entry):
                    deadline = time.monotonic() + self.io_timeout_s
                if not len(entry[1]):
                    del pending[fd]
                    if poller is not None:
                        poller.unregister(fd)
            if not pending:
                return
            if poller is None:
                poller = select.poll()
                for fd, (_, _, writing) in pending.items():
                    poller.register(fd, select.POLLOUT if writing else select.POLLIN)
            wait_s = deadline - time.monotonic()
            if wait_s <= 0:
                raise TimeoutError(f"rank {self.rank}: no progress for {self.io_timeout_s:g} s")
            ready = [fd for fd, _ in poller.poll(wait_s * 1000)]

    def _transfer_blocking(self, sock: socket.socket, view: memoryview, writing: bool) -> None:
        """One socket, one direction: the whole view in blocking calls (a receive waits for
        all of it), so the kernel, not this loop, handles every arriving or departing
        packet; the socket's kernel timeout stands for ``io_timeout_s`` without progress."""
        timeout = TIMEVAL.pack(int(self.io_timeout_s), int(self.io_timeout_s % 1 * 1e6))
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO if writing else socket.SO_RCVTIMEO,
                        timeout)
        sock.setblocking(True)
        try:
            while len(view):
                n = sock.send(view) if writing else sock.recv_into(view, len(view),
                                                                   socket.MSG_WAITALL)
                if n == 0:
                    raise ConnectionError("peer closed the connection")
                view = view[n:]
        except BlockingIOError:
            raise TimeoutError(f"rank {self.rank}: no progress for {self.io_timeout_s:g} s") from None
        finally:
            sock.setblocking(False)

    @staticmethod
    def _progress(entry: list) -> bool:
        """Send or receive on one socket until it would block; True if any byte moved."""
        sock, view, writing = entry
        moved = False
        try:
            while len(view):
                n = sock.send(view) if writing else sock.recv_into(view)
                if n == 0:
                    raise ConnectionError("peer closed the connection")
                view = view[n:]
                moved = True
        except BlockingIOError:
            pass
        entry[1] = view
        return moved


class ChannelView(SocketTransport):
    """One channel of a SocketTransport: every message whole on that channel's connection,
    so channels run as independent pipelines (as NCCL's channels do) instead of each message
    being split over all of them."""

    def __init__(self, base: SocketTransport, index: int):
        super().__init__(base.rank, base.world, 1, base.io_timeout_s, base.min_part_bytes)
        self.base, self.index = base, index

    def _out(self, peer: int) -> list[socket.socket]:
        return [self.base._out(peer)[self.index]]

    def _in(self, peer: int) -> list[socket.socket]:
        return [self.base._in(peer)[self.index]]

    def _in_ready(self, peer: int) -> bool:
        return self.base._in_ready(peer)

    def barrier(self) -> None:
        self.base.barrier()


def configure_socket(sock: socket.socket, dscp: int | None) -> None:
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    if dscp is not None:
        sock.setsockopt(socket.IPPROTO_IP, socket.IP_TOS, dscp << 2)


class TcpTransport(SocketTransport):
    """TCP between ranks. ``addresses``: rank -> (ip, port) of the peers this rank may dial
    (a ring needs only its successor). Listens on ``listen`` (default: all addresses, this
    rank's port from the table). Connections from this rank to a peer are dialled on first
    use, or for all peers by ``connect``; the peer's connections to this rank are accepted in
    the background and identified by a hello (magic, rank, channel)."""

    def __init__(self, rank: int, world: int, addresses: dict, listen: tuple[str, int] | None = None,
                 channels: int = 1, dscp: int | None = None,
                 connect_timeout_s: float = CONNECT_TIMEOUT_S, io_timeout_s: float = IO_TIMEOUT_S,
                 min_part_bytes: int = MIN_PART_BYTES):
        super().__init__(rank, world, channels, io_timeout_s, min_part_bytes)
        self.addresses = dict(addresses)
        self.dscp = dscp
        self.connect_timeout_s = connect_timeout_s
        if listen is None:
            listen = ("0.0.0.0", self.addresses[rank][1])
        self.outgoing: dict[int, list[socket.socket]] = {}
        self.incoming: dict[int, dict[int, socket.socket]] = {}
        self.cond = threading.Condition()
        self.dial_lock = threading.Lock()
        self.closed = False
        self.listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.listener.bind(listen)
        self.listener.listen(max(16, world * channels))
        self.acceptor = threading.Thread(target=self._accept_loop, daemon=True,
                                         name=f"rank{rank}-accept")
        self.acceptor.start()

    def _accept_loop(self) -> None:
        while True:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return  # the listener was closed
            try:
                conn.settimeout(self.connect_timeout_s)
                hello = bytearray(HELLO.size)
                view = memoryview(hello)
                while len(view):
                    n = conn.recv_into(view)
                    if n == 0:
                        raise ConnectionError("closed before its hello")
                    view = view[n:]
                magic, peer, channel = HELLO.unpack(hello)
                if magic != HELLO_MAGIC or not 0 <= peer < self.world or not 0 <= channel < self.channels:
                    raise ConnectionError(f"bad hello {bytes(hello)!r}")
            except OSError:
                conn.close()
                continue
            configure_socket(conn, self.dscp)
            conn.setblocking(False)
            with self.cond:
                self.incoming.setdefault(peer, {})[channel] = conn
                self.cond.notify_all()

    def _dial(self, peer: int, channel: int) -> socket.socket:
        deadline = time.monotonic() + self.connect_timeout_s
        while True:
            try:
                sock = socket.create_connection(self.addresses[peer], timeout=self.connect_timeout_s)
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise TimeoutError(f"rank {self.rank}: cannot reach rank {peer} at "
                                       f"{self.addresses[peer]}") from None
                time.sleep(DIAL_RETRY_S)
        configure_socket(sock, self.dscp)
        sock.sendall(HELLO.pack(HELLO_MAGIC, self.rank, channel))
        sock.setblocking(False)
        return sock

    def _out(self, peer: int) -> list[socket.socket]:
        socks = self.outgoing.get(peer)
        if socks is None:
            with self.dial_lock:
                socks = self.outgoing.get(peer)
                if socks is None:
                    if peer not in self.addresses:
                        raise ValueError(f"rank {self.rank}: no address for rank {peer}")
                    socks = [self._dial(peer, c) for c in range(self.channels)]
                    self.outgoing[peer] = socks
        return socks

    def _in_ready(self, peer: int) -> bool:
        with self.cond:
            return len(self.incoming.get(peer, ())) == self.channels

    def _in(self, peer: int) -> list[socket.socket]:
        with self.cond:
            ok = self.cond.wait_for(lambda: len(self.incoming.get(peer, ())) == self.channels,
                                    timeout=self.connect_timeout_s)
            if not ok:
                raise TimeoutError(f"rank {self.rank}: rank {peer} did not connect in "
                                   f"{self.connect_timeout_s:g} s")
            chans = self.incoming[peer]
            return [chans[c] for c in range(self.channels)]

    def connect(self, peers=None) -> None:
        """Full mesh: dial every peer (default: all in the address table) and wait until each
        has dialled this rank."""
        peers = [p for p in (self.addresses if peers is None else peers) if p != self.rank]
        for peer in peers:
            self._out(peer)
        for peer in peers:
            self._in(peer)

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        self.listener.close()
        for socks in self.outgoing.values():
            for s in socks:
                s.close()
        with self.cond:
            for chans in self.incoming.values():
                for s in chans.values():
                    s.close()


class _LocalWires:
    """Socket pairs between in-process ranks, made on first use: (src, dst) -> pairs, one
    per channel; src writes end 0, dst reads end 1."""

    def __init__(self, channels: int):
        self.channels = channels
        self.pairs: dict[tuple[int, int], list[tuple[socket.socket, socket.socket]]] = {}
        self.lock = threading.Lock()

    def get(self, src: int, dst: int) -> list[tuple[socket.socket, socket.socket]]:
        with self.lock:
            pairs = self.pairs.get((src, dst))
            if pairs is None:
                pairs = [socket.socketpair() for _ in range(self.channels)]
                for pair in pairs:
                    for s in pair:
                        s.setblocking(False)
                self.pairs[(src, dst)] = pairs
            return pairs

    def close(self) -> None:
        with self.lock:
            for pairs in self.pairs.values():
                for pair in pairs:
                    for s in pair:
                        s.close()


class LocalTransport(SocketTransport):
    """A rank of an in-process world (threads as ranks), over socket pairs."""

    def __init__(self, rank: int, world: int, wires: _LocalWires, io_timeout_s: float,
                 min_part_bytes: int):
        super().__init__(rank, world, wires.channels, io_timeout_s, min_part_bytes)
        self.wires = wires

    def _out(self, peer: int) -> list[socket.socket]:
        return [a for a, _ in self.wires.get(self.rank, peer)]

    def _in(self, peer: int) -> list[socket.socket]:
        return [b for _, b in self.wires.get(peer, self.rank)]


def local_transports(world: int, channels: int = 1, io_timeout_s: float = 10.0,
                     min_part_bytes: int = MIN_PART_BYTES) -> list[LocalTransport]:
    """One transport per rank of an in-process world; ``close_local`` closes them all."""
    wires = _LocalWires(channels)
    return [LocalTransport(r, world, wires, io_timeout_s, min_part_bytes) for r in range(world)]


def close_local(transports: list[LocalTransport]) -> None:
    if transports:
        transports[0].wires.close()


@dataclass(frozen=True)
class MessageRecord:
    """One message as a trace holds it: ``t_s`` since the recording's origin."""

    t_s: float
    src: int
    dst: int
    size_bytes: int
    tag: str


class RecordingTransport(Transport):
    """Wraps a transport and records every message this rank sends (time when the send
    started) and receives (time when it completed), with the current ``tag``, plus bytes per
    peer. Barriers are passed through unrecorded."""

    def __init__(self, inner: Transport, origin_s: float | None = None, tag: str = ""):
        self.inner = inner
        self.rank, self.world = inner.rank, inner.world
        self.origin_s = time.monotonic() if origin_s is None else origin_s
        self.tag = tag
        self.sent: list[MessageRecord] = []
        self.received: list[MessageRecord] = []
        self.lock = threading.Lock()

    @contextmanager
    def tagged(self, tag: str):
        previous, self.tag = self.tag, tag
        try:
            yield self
        finally:
            self.tag = previous

    def _record(self, into: list, t_s: float, src: int, dst: int, buf) -> None:
        with self.lock:
            into.append(MessageRecord(t_s, src, dst, len(byte_view(buf)), self.tag))

    def send(self, peer: int, data) -> None:
        t_s = time.monotonic() - self.origin_s
        self.inner.send(peer, data)
        self._record(self.sent, t_s, self.rank, peer, data)

    def recv(self, peer: int, out) -> None:
        self.inner.recv(peer, out)
        self._record(self.received, time.monotonic() - self.origin_s, peer, self.rank, out)

    def sendrecv(self, send_peer: int, data, recv_peer: int, out) -> None:
        t_s = time.monotonic() - self.origin_s
        self.inner.sendrecv(send_peer, data, recv_peer, out)
        self._record(self.sent, t_s, self.rank, send_peer, data)
        self._record(self.received, time.monotonic() - self.origin_s, recv_peer, self.rank, out)

    def barrier(self) -> None:
        self.inner.barrier()

    def close(self) -> None:
        self.inner.close()

    def bytes_per_peer(self) -> dict[int, dict[str, int]]:
        """peer -> {"sent_bytes", "received_bytes"}: what this link end carried."""
        out: dict[int, dict[str, int]] = {}
        for records, key, peer_of in ((self.sent, "sent_bytes", lambda m: m.dst),
                                      (self.received, "received_bytes", lambda m: m.src)):
            for m in records:
                entry = out.setdefault(peer_of(m), {"sent_bytes": 0, "received_bytes": 0})
                entry[key] += m.size_bytes
        return dict(sorted(out.items()))
