"""A scripted OpenFlow 1.3 switch over loopback TCP: enough of the protocol for the
controller to connect, program it and poll it, without OVS, namespaces or root. It answers
the handshake, port-description and port-statistics requests, barriers and echoes, records
every flow and group modification it is sent, and reports port changes when told to.

Messages are packed with os-ken's own struct formats (os_ken.ofproto.ofproto_v1_3) and flow
modifications read back with its parser, so the bytes are what a real switch exchanges."""
from __future__ import annotations

import socket
import struct
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from os_ken.ofproto import ofproto_parser, ofproto_protocol
from os_ken.ofproto import ofproto_v1_3 as ofp

HEADER = struct.Struct(ofp.OFP_HEADER_PACK_STR)
MULTIPART = struct.Struct(ofp.OFP_MULTIPART_REPLY_PACK_STR)
GROUP_MOD = struct.Struct("!HBxI")  # command, type, pad, group_id (after the header)
CONNECT_TIMEOUT_S = 10.0


@dataclass(frozen=True)
class Received:
    """One flow or group modification as the switch got it."""

    t_monotonic_s: float
    kind: str  # "flow" or "group"
    command: int
    priority: int | None = None
    group_id: int | None = None


def port_struct(port_no: int, up: bool) -> bytes:
    return struct.pack(ofp.OFP_PORT_PACK_STR, port_no, bytes(6), f"p{port_no}".encode(),
                       0, 0 if up else ofp.OFPPS_LINK_DOWN, 0, 0, 0, 0, 0, 0)


class ScriptedSwitch:
    """Connects to a controller at 127.0.0.1:``port`` as datapath ``dpid`` with ``ports``
    (port number -> up). ``tx_bytes(port)`` gives the TX byte counter a port-statistics reply
    reports (default 0)."""

    def __init__(self, dpid: int, ports: dict[int, bool], port: int,
                 tx_bytes: Callable[[int], int] = lambda port: 0):
        self.dpid = dpid
        self.ports = dict(ports)
        self.tx_bytes = tx_bytes
        self.received: list[Received] = []
        self.stats_requests = 0
        self.lock = threading.Lock()
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=CONNECT_TIMEOUT_S)
        self.dp = ofproto_protocol.ProtocolDesc(ofp.OFP_VERSION)
        self.thread = threading.Thread(target=self.serve, daemon=True)
        self.thread.start()

    def send(self, msg_type: int, xid: int, body: bytes = b"") -> None:
        with self.lock:
            self.sock.sendall(HEADER.pack(ofp.OFP_VERSION, msg_type, HEADER.size + len(body), xid)
                              + body)

    def port_status(self, port_no: int, up: bool) -> None:
        """Report that a port went down or came back (OFPPR_MODIFY, link state)."""
        self.ports[port_no] = up
        body = struct.pack(ofp.OFP_PORT_STATUS_PACK_STR, ofp.OFPPR_MODIFY, port_no, bytes(6),
                           f"p{port_no}".encode(), 0, 0 if up else ofp.OFPPS_LINK_DOWN,
                           0, 0, 0, 0, 0, 0)
        self.send(ofp.OFPT_PORT_STATUS, 0, body)

    def modifications(self, since_s: float = 0.0) -> list[Received]:
        with self.lock:
            return [r for r in self.received if r.t_monotonic_s >= since_s]

    def close(self) -> None:
        self.sock.close()

    def read(self) -> tuple[int, int, bytes]:
        header = self.recv_exactly(HEADER.size)
        _, msg_type, length, xid = HEADER.unpack(header)
        return msg_type, xid, header + self.recv_exactly(length - HEADER.size)

    def recv_exactly(self, n: int) -> bytes:
        data = b""
        while len(data) < n:
            chunk = self.sock.recv(n - len(data))
            if not chunk:
                raise ConnectionError("controller closed the connection")
            data += chunk
        return data

    def serve(self) -> None:
        self.send(ofp.OFPT_HELLO, 0)
        self.sock.settimeout(None)
        try:
            while True:
                self.answer(*self.read())
        except (ConnectionError, OSError):
            return

    def answer(self, msg_type: int, xid: int, buf: bytes) -> None:
        now = time.monotonic()
        if msg_type == ofp.OFPT_FEATURES_REQUEST:
            self.send(ofp.OFPT_FEATURES_REPLY, xid,
                      struct.pack(ofp.OFP_SWITCH_FEATURES_PACK_STR, self.dpid, 0, 254, 0, 0, 0))
        elif msg_type == ofp.OFPT_ECHO_REQUEST:
            self.send(ofp.OFPT_ECHO_REPLY, xid, buf[HEADER.size:])
        elif msg_type == ofp.OFPT_BARRIER_REQUEST:
            self.send(ofp.OFPT_BARRIER_REPLY, xid)
        elif msg_type == ofp.OFPT_MULTIPART_REQUEST:
            kind, _ = MULTIPART.unpack_from(buf, HEADER.size)
            if kind == ofp.OFPMP_PORT_DESC:
                body = b"".join(port_struct(p, up) for p, up in sorted(self.ports.items()))
            else:
                assert kind == ofp.OFPMP_PORT_STATS, kind
                self.stats_requests += 1
                body = b"".join(struct.pack(ofp.OFP_PORT_STATS_PACK_STR, p, 0, 0, 0,
                                            self.tx_bytes(p), 0, 0, 0, 0, 0, 0, 0, 0, 0, 0)
                                for p in sorted(self.ports))
            self.send(ofp.OFPT_MULTIPART_REPLY, xid, MULTIPART.pack(kind, 0) + body)
        elif msg_type == ofp.OFPT_FLOW_MOD:
            mod = ofproto_parser.msg(self.dp, ofp.OFP_VERSION, msg_type, len(buf), xid, buf)
            with self.lock:
                self.received.append(Received(now, "flow", mod.command, priority=mod.priority))
        elif msg_type == ofp.OFPT_GROUP_MOD:
            command, _, group_id = GROUP_MOD.unpack_from(buf, HEADER.size)
            with self.lock:
                self.received.append(Received(now, "group", command, group_id=group_id))


def wait_for(condition: Callable[[], object], timeout_s: float, what: str):
    """Poll ``condition`` until it returns something true; AssertionError after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.02)
    raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")
