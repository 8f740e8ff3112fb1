"""Sending a burst of datagrams with one system call: sendmmsg(2) from a fixed ring of slots.

Python's socket module has no sendmmsg, and one ``sendto`` per packet costs a system call
each, most of a packet's CPU time in a Python sender. The ring is a bytearray the burst is
framed into (``wire.BurstFramer``); its slots' addresses are wired once into an array of
``struct mmsghdr`` through ctypes, so a burst costs one foreign call. Every message is an
independent datagram, exactly as ``sendto`` would send it (same IP header, so the same
ICRC). Where libc has no sendmmsg the burst falls back to one ``sendto`` per slot.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import errno
import os
import socket
import struct


class _IoVec(ctypes.Structure):
    _fields_ = [("base", ctypes.c_void_p), ("len", ctypes.c_size_t)]


class _MsgHdr(ctypes.Structure):
    _fields_ = [("name", ctypes.c_void_p), ("namelen", ctypes.c_uint32),
                ("iov", ctypes.POINTER(_IoVec)), ("iovlen", ctypes.c_size_t),
                ("control", ctypes.c_void_p), ("controllen", ctypes.c_size_t),
                ("flags", ctypes.c_int)]


class _MMsgHdr(ctypes.Structure):
    _fields_ = [("hdr", _MsgHdr), ("len", ctypes.c_uint)]


_SOCKADDR_IN = struct.Struct("=H2s4s8x")   # family (host order), port and address (network)


def _libc_sendmmsg():
    path = ctypes.util.find_library("c")
    sendmmsg = getattr(ctypes.CDLL(path, use_errno=True), "sendmmsg", None) if path else None
    if sendmmsg is not None:
        sendmmsg.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_uint, ctypes.c_int]
        sendmmsg.restype = ctypes.c_int
    return sendmmsg


class BurstSender:
    """``slots`` datagram slots of ``slot_bytes`` each; ``send`` transmits the first
    ``len(lengths)`` of them, slot k holding ``lengths[k]`` bytes, to one destination."""

    def __init__(self, sock: socket.socket, slots: int, slot_bytes: int, use_sendmmsg: bool = True):
        self.slots, self.slot_bytes = slots, slot_bytes
        self.ring = bytearray(slots * slot_bytes)
        self.view = memoryview(self.ring)
        self._sock = sock
        self._sendmmsg = _libc_sendmmsg() if use_sendmmsg else None
        self._dest: tuple[str, int] | None = None
        self._sockaddr = ctypes.create_string_buffer(_SOCKADDR_IN.size)
        self._iov = (_IoVec * slots)()
        self._msgs = (_MMsgHdr * slots)()
        self._lengths = [0] * slots
        base = ctypes.addressof(ctypes.c_char.from_buffer(self.ring))
        for k in range(slots):
            self._iov[k].base = base + k * slot_bytes
            hdr = self._msgs[k].hdr
            hdr.iov = ctypes.pointer(self._iov[k])
            hdr.iovlen = 1
            hdr.name = ctypes.addressof(self._sockaddr)
            hdr.namelen = _SOCKADDR_IN.size

    @property
    def batched(self) -> bool:
        return self._sendmmsg is not None

    def send(self, dest: tuple[str, int], lengths: list[int]) -> None:
        count = len(lengths)
        if self._sendmmsg is None:
            for k, length in enumerate(lengths):
                self._sock.sendto(self.view[k * self.slot_bytes:k * self.slot_bytes + length], dest)
            return
        if dest != self._dest:
            ctypes.memmove(self._sockaddr, _SOCKADDR_IN.pack(
                socket.AF_INET, struct.pack("!H", dest[1]), socket.inet_aton(dest[0])),
                _SOCKADDR_IN.size)
            self._dest = dest
        iov, known = self._iov, self._lengths
        for k, length in enumerate(lengths):
            if known[k] != length:
                iov[k].len = known[k] = length
        done, fd, msg_bytes = 0, self._sock.fileno(), ctypes.sizeof(_MMsgHdr)
        while done < count:
            sent = self._sendmmsg(fd, ctypes.addressof(self._msgs) + done * msg_bytes,
                                  count - done, 0)
            if sent < 0:
                err = ctypes.get_errno()
                if err == errno.EINTR:
                    continue
                raise OSError(err, f"sendmmsg to {dest}: {os.strerror(err)}")
            done += sent
