"""A small rtnetlink codec for the qdiscs the PFC pause agent (``testbed.apply.pfc_agent``)
and the ECN anchor agent (``testbed.apply.ecn_anchor``) read and change every few
milliseconds: the backlog of chosen qdiscs (``QdiscBacklogs``) and a tbf's rate changed in
place (``tbf_change_message``, ``QdiscChanger``).

Written by hand because the agent's budget is a poll every few ms on a 2-core machine: measured
there, pyroute2 0.9.7 takes about 32 us to parse one qdisc reply and read its backlog, 2.5 ms
for the 80 lossless queues of a k=4 fat-tree, more than the 2 ms poll it was written for;
this codec, which reads only as far as the backlog, takes about 1.1 us a reply (0.09 ms for
the 80). Everything
else that reads qdiscs dumps them with one ``tc -s -j`` process (``testbed.system.counters``).
"""
from __future__ import annotations

import os
import socket
import struct

RTM_NEWQDISC, RTM_GETQDISC = 36, 38
NLM_F_REQUEST, NLM_F_ACK, NLM_F_ECHO = 0x1, 0x4, 0x8
NLMSG_ERROR = 2
TCA_KIND, TCA_OPTIONS, TCA_STATS = 1, 2, 3
TCA_TBF_PARMS, TCA_TBF_BURST = 1, 6
NLA_F_NESTED = 0x8000
TC_LINKLAYER_ETHERNET = 1
NLMSG = struct.Struct("=IHHII")
TCMSG = struct.Struct("=BBHiIII")
RTATTR = struct.Struct("=HH")
ERRMSG = struct.Struct("=i")
RATESPEC = struct.Struct("=BBHhHI")  # struct tc_ratespec
TC_STATS_BACKLOG = struct.Struct("=I")
TC_STATS_BACKLOG_OFFSET = 32  # struct tc_stats: u64 bytes, u32 packets drops overlimits bps pps qlen backlog
REPLY_TIMEOUT_S = 1.0  # for rtnetlink's answers to the backlog requests


def _align4(n: int) -> int:
    return (n + 3) & ~3


class QdiscBacklogs:
    """Backlogs of chosen qdiscs (the lossless queues) from rtnetlink: one RTM_GETQDISC
    request per queue, all in one message batch, answered one reply each; parsed only as far
    as the backlog. (A dump of every qdisc in the namespace returned six times as many.)
    NLM_F_ECHO asks for the reply: recent kernels answer a qdisc GET only to an echo request
    or to listeners of the tc multicast group. A reply that never comes is an error after
    ``REPLY_TIMEOUT_S``, not a silent hang."""

    def __init__(self, wanted: set[tuple[int, int]]):
        self.wanted = sorted(wanted)  # (ifindex, handle major)
        self.sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, 0)  # NETLINK_ROUTE
        self.sock.bind((0, 0))
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 20)
        self.sock.settimeout(REPLY_TIMEOUT_S)
        self.buf = bytearray(1 << 20)
        self.seq = 0

    def _requests(self) -> tuple[bytes, dict[int, tuple[int, int]]]:
        parts, by_seq = [], {}
        for key in self.wanted:
            self.seq = (self.seq + 1) & 0xFFFFFFFF
            ifindex, major = key
            parts.append(NLMSG.pack(NLMSG.size + TCMSG.size, RTM_GETQDISC,
                                    NLM_F_REQUEST | NLM_F_ECHO, self.seq, 0)
                         + TCMSG.pack(0, 0, 0, ifindex, major << 16, 0, 0))
            by_seq[self.seq] = key
        return b"".join(parts), by_seq

    def read(self) -> dict[tuple[int, int], int]:
        return self.receive(self.send())

    def send(self) -> dict[int, tuple[int, int]]:
        """Send the requests; the kernel reads every backlog while this call runs (rtnetlink
        handles a request in the sender's context), so a caller can time the readings by
        it. Returns what ``receive`` waits for."""
        request, pending = self._requests()
        self.sock.send(request)
        return pending

    def receive(self, pending: dict[int, tuple[int, int]]) -> dict[tuple[int, int], int]:
        """The answers to ``send``'s requests: {(ifindex, handle major): backlog bytes}."""
        out: dict[tuple[int, int], int] = {}
        while pending:
            n = self.sock.recv_into(self.buf)
            view = memoryview(self.buf)[:n]
            off = 0
            while off + NLMSG.size <= n:
                length, mtype, _, seq, _ = NLMSG.unpack_from(view, off)
                if length < NLMSG.size:
                    break
                key = pending.pop(seq, None)
                if key is not None and mtype == RTM_NEWQDISC:
                    out[key] = self._backlog(view, off + NLMSG.size + TCMSG.size, off + length)
                elif key is not None and mtype == NLMSG_ERROR:
                    err = ERRMSG.unpack_from(view, off + NLMSG.size)[0]
                    raise OSError(-err, f"reading qdisc {key[1]:x}: on ifindex {key[0]}: "
                                        f"{os.strerror(-err)}")
                off += _align4(length)
        return out

    @staticmethod
    def _backlog(view, start: int, end: int) -> int:
        off = start
        while off + RTATTR.size <= end:
            alen, atype = RTATTR.unpack_from(view, off)
            if alen < RTATTR.size:
                break
            if atype == TCA_STATS:
                return TC_STATS_BACKLOG.unpack_from(view, off + RTATTR.size
                                                    + TC_STATS_BACKLOG_OFFSET)[0]
            off += _align4(alen)
        return 0


def _attr(kind: int, payload: bytes) -> bytes:
    data = RTATTR.pack(RTATTR.size + len(payload), kind) + payload
    return data + b"\0" * (_align4(len(data)) - len(data))


def tbf_change_message(ifindex: int, handle: int, parent: int, rate_bytes_per_s: int,
                       burst_bytes: int, limit_bytes: int, seq: int) -> bytes:
    """RTM_NEWQDISC changing tbf ``handle`` in place (no create, no replace): the rate and
    bucket given in bytes, so the kernel derives the bucket time itself (TCA_TBF_BURST)."""
    rate = RATESPEC.pack(0, TC_LINKLAYER_ETHERNET, 0, 0, 0, rate_bytes_per_s)
    qopt = rate + RATESPEC.pack(0, 0, 0, 0, 0, 0) + struct.pack("=III", limit_bytes, 0, 0)
    options = _attr(TCA_TBF_PARMS, qopt) + _attr(TCA_TBF_BURST, struct.pack("=I", burst_bytes))
    body = (TCMSG.pack(0, 0, 0, ifindex, handle, parent, 0) + _attr(TCA_KIND, b"tbf\0")
            + _attr(TCA_OPTIONS | NLA_F_NESTED, options))
    return NLMSG.pack(NLMSG.size + len(body), RTM_NEWQDISC, NLM_F_REQUEST | NLM_F_ACK,
                      seq, 0) + body


def rate_bytes_per_s(rate: str) -> int:
    """A lossless queue's tbf rate ("1kbit", "20000kbit": ``testbed.plan.port_queue``'s
    ``running_tbf`` and ``paused_tbf``) in bytes per second."""
    if not rate.endswith("kbit"):
        raise ValueError(f"unexpected rate {rate!r}")
    return int(rate[:-4]) * 1000 // 8


class QdiscChanger:
    """Changes qdiscs of one network namespace over its own rtnetlink socket."""

    def __init__(self):
        self.sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, 0)
        self.sock.bind((0, 0))
        self.seq = 0

    def change_tbf(self, ifindex: int, handle: int, parent: int, params: dict) -> None:
        self.seq += 1
        self.sock.send(tbf_change_message(ifindex, handle, parent,
                                          rate_bytes_per_s(params["rate"]), params["burst"],
                                          params["limit"], self.seq))
        reply = self.sock.recv(4096)
        _, mtype, _, _, _ = NLMSG.unpack_from(reply, 0)
        if mtype == NLMSG_ERROR:
            err = ERRMSG.unpack_from(reply, NLMSG.size)[0]
            if err:
                raise OSError(-err, f"tbf change on ifindex {ifindex}: {os.strerror(-err)}")
