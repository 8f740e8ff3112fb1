"""A verbs-shaped interface to the transport: protection domain, memory regions, completion
queues and reliable-connected queue pairs, named after pyverbs. The engine (``engine.Engine``)
is the device behind it; a pyverbs/rxe implementation can sit behind the same calls, as
mapped here:

======================================  ===================================================
this module                             pyverbs (rdma-core) / libibverbs
======================================  ===================================================
``Engine(EngineConfig(ip, port))``      ``Context(name='rxe0')`` (the device; GID index of
                                        the RoCEv2 address)
``ProtectionDomain(engine)``            ``PD(ctx)``
``MemoryRegion(pd, length, access)``    ``MR(pd, length, access)``; ``.buf`` is the memory,
                                        ``.addr`` / ``.lkey`` / ``.rkey`` as in pyverbs
``CompletionQueue(depth)``              ``CQ(ctx, depth)``; ``poll(n)`` returns a list of
                                        ``WorkCompletion`` (pyverbs: ``(npolled, [WC])``)
``QueuePair(pd, send_cq, recv_cq,       ``QP(pd, QPInitAttr(qp_type=IBV_QPT_RC, scq, rcq,
config)``                               cap))``
``qp.to_init()``                        ``qp.to_init(QPAttr(port_num, pkey_index,
                                        qp_access_flags))``
``qp.to_rtr(remote: QPInfo)``           ``qp.to_rtr(QPAttr(path_mtu, dest_qp_num=remote.qpn,
                                        rq_psn=remote.psn, ah_attr=GID remote.ip))``
``qp.to_rts()``                         ``qp.to_rts(QPAttr(sq_psn=qp.psn, timeout, retry_cnt,
                                        rnr_retry))``: ``config.ack_timeout_s`` is
                                        4.096 us * 2^timeout
``qp.post_send(SendWR(...))``           ``qp.post_send(SendWR(wr_id, opcode=IBV_WR_SEND |
                                        IBV_WR_RDMA_WRITE, send_flags=IBV_SEND_SIGNALED,
                                        sg=[SGE(mr.addr+offset, length, mr.lkey)]))`` with
                                        ``wr.set_wr_rdma(rkey, remote_addr)``
``qp.post_recv(RecvWR(...))``           ``qp.post_recv(RecvWR(wr_id, 1, [SGE(...)]))``
``qp.local_info(mr)``                   what perftest and rdma_cm exchange out of band
                                        (QPN, PSN, GID, rkey, address)
``engine.run_until(done, timeout_s)``   the hardware progresses by itself; with pyverbs
                                        this becomes polling the CQ until ``done``
======================================  ===================================================

What is not there: RDMA READ, atomics, immediate data, SRQ, UD/UC, inline data, memory
windows. Congestion control (``cc``) and the notification point are per-QP objects here,
where a NIC configures them per device or priority.
"""
from __future__ import annotations

import random
from dataclasses import asdict, dataclass
from enum import IntEnum, IntFlag
from typing import Protocol

import numpy as np

from . import rc, wire
from .cc import CongestionControl, LineRate, NotificationPoint
from .psn import PSN_MASK
from .work import CompletionQueue, WcStatus, WorkCompletion, WrOpcode, WcOpcode

__all__ = ["Access", "CompletionQueue", "Device", "MemoryRegion", "ProtectionDomain",
           "QPConfig", "QPInfo", "QPState", "QueuePair", "RecvWR", "SendWR", "WcOpcode",
           "WcStatus", "WorkCompletion", "WrOpcode"]


class Access(IntFlag):
    """Memory access flags (``ibv_access_flags``)."""
    LOCAL_WRITE = 1
    REMOTE_WRITE = 2
    REMOTE_READ = 4


class QPState(IntEnum):
    """Queue pair states (``ibv_qp_state``)."""
    RESET = 0
    INIT = 1
    RTR = 2
    RTS = 3
    ERROR = 6


class Device(Protocol):
    """What the verbs objects need from the device (the engine implements it)."""

    def local_address(self) -> tuple[str, int]: ...

    def register_mr(self, mr: "MemoryRegion") -> tuple[int, int, int]: ...

    def attach_qp(self, qp: "QueuePair") -> int: ...

    def activate(self, qp: "QueuePair") -> None: ...


@dataclass(frozen=True)
class QPInfo:
    """What two sides exchange out of band before connecting (perftest's ``pingpong_dest``):
    the QP number and first PSN, the RoCEv2 address (IPv4 and UDP port), and one memory region
    the peer may write (address, R_Key, length)."""
    qpn: int
    psn: int
    ip: str
    port: int
    mr_addr: int = 0
    rkey: int = 0
    mr_length: int = 0

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> "QPInfo":
        return cls(**{k: data[k] for k in cls.__dataclass_fields__})


@dataclass(frozen=True)
class QPConfig:
    """Per-QP transport settings (the verbs QP attributes, in seconds and bytes)."""
    path_mtu_bytes: int = 1024
    ack_request_every: int = 16                # requester: ack-request bit every N packets
    ack_every: int = 16                        # responder: ACK at least every N packets
    ack_timeout_s: float = rc.timeout_s_from_code(rc.DEFAULT_TIMEOUT_CODE)
    retry_count: int = 7
    rnr_retry: int = rc.INFINITE_RNR_RETRY
    rnr_timer_code: int = 1                    # the RNR delay the responder asks for (10 us)
    max_outstanding_packets: int = 128
    ecn_echo: bool = False                     # responder appends the ECN echo to ACKs
    cnp_interval_s: float | None = None        # notification point; None: no CNPs
    pkey: int = wire.DEFAULT_PKEY


class ProtectionDomain:
    def __init__(self, device: Device):
        self.device = device
        self._mrs: dict[int, MemoryRegion] = {}

    def add(self, mr: "MemoryRegion") -> None:
        self._mrs[mr.rkey] = mr

    def remove(self, mr: "MemoryRegion") -> None:
        self._mrs.pop(mr.rkey, None)

    def resolve(self, rkey: int, va: int, length: int) -> memoryview | None:
        """The memory a remote RDMA WRITE of ``length`` bytes at ``va`` with ``rkey`` may write,
        or None when the key, the range or the access rights do not allow it."""
        mr = self._mrs.get(rkey)
        if mr is None or not mr.access & Access.REMOTE_WRITE:
            return None
        offset = va - mr.addr
        if offset < 0 or length < 0 or offset + length > mr.length:
            return None
        return mr.view[offset:offset + length]


class MemoryRegion:
    """Registered memory: a bytearray (or a given numpy/bytearray buffer) with keys and a
    virtual address the device assigned."""

    def __init__(self, pd: ProtectionDomain, length_bytes: int | None = None, *,
                 buffer: bytearray | np.ndarray | None = None,
                 access: Access = Access.LOCAL_WRITE | Access.REMOTE_WRITE):
        if (length_bytes is None) == (buffer is None):
            raise ValueError("give either a length or a buffer")
        self.pd = pd
        self.buf = bytearray(length_bytes) if buffer is None else buffer
        self.view = memoryview(self.buf).cast("B")
        if self.view.readonly:
            raise ValueError("a memory region needs a writable buffer")
        self.length = len(self.view)
        self.access = Access(access)
        self.lkey, self.rkey, self.addr = pd.device.register_mr(self)
        pd.add(self)

    def close(self) -> None:
        """Deregister: remote writes with this R_Key fail from now on."""
        self.pd.remove(self)

    def slice(self, offset_bytes: int, length_bytes: int) -> memoryview:
        if offset_bytes < 0 or length_bytes < 0 or offset_bytes + length_bytes > self.length:
            raise ValueError(f"[{offset_bytes}, +{length_bytes}) is outside the region "
                             f"of {self.length} bytes")
        return self.view[offset_bytes:offset_bytes + length_bytes]


@dataclass(frozen=True)
class SendWR:
    """A send work request: SEND, or RDMA WRITE to ``remote_addr`` with ``rkey``, of
    ``length_bytes`` (default: to the end of the region) from ``mr`` at ``offset_bytes``."""
    wr_id: int
    opcode: WrOpcode
    mr: MemoryRegion
    offset_bytes: int = 0
    length_bytes: int | None = None
    remote_addr: int = 0
    rkey: int = 0
    signaled: bool = True

    def local(self) -> memoryview:
        length = self.mr.length - self.offset_bytes if self.length_bytes is None else self.length_bytes
        return self.mr.slice(self.offset_bytes, length)


@dataclass(frozen=True)
class RecvWR:
    """A receive work request: the buffer an incoming SEND lands in."""
    wr_id: int
    mr: MemoryRegion
    offset_bytes: int = 0
    length_bytes: int | None = None

    def local(self) -> memoryview:
        length = self.mr.length - self.offset_bytes if self.length_bytes is None else self.length_bytes
        return self.mr.slice(self.offset_bytes, length)


class QueuePair:
    """A reliable-connected QP: the requester and responder state machines (``rc``), its
    congestion control and notification point, and what the engine needs to reach the peer."""

    def __init__(self, pd: ProtectionDomain, send_cq: CompletionQueue,
                 recv_cq: CompletionQueue, config: QPConfig = QPConfig(),
                 cc: CongestionControl | None = None, psn: int | None = None):
        self.pd = pd
        self.device = pd.device
        self.send_cq, self.recv_cq = send_cq, recv_cq
        self.config = config
        self.cc = cc if cc is not None else LineRate(None)
        self.np = NotificationPoint(config.cnp_interval_s) if config.cnp_interval_s is not None else None
        self.psn = (random.getrandbits(24) if psn is None else psn) & PSN_MASK
        self.state = QPState.RESET
        self.remote: QPInfo | None = None
        self.requester: rc.Requester | None = None
        self.responder: rc.Responder | None = None
        self.tx_seeds: wire.IcrcSeeds | None = None   # ICRC pseudo-header: us -> peer
        self.rx_seeds: wire.IcrcSeeds | None = None   # peer -> us
        self.last_echo_bytes = 0
        self.cnps_sent = 0
        self.cnps_received = 0
        self.qp_num = self.device.attach_qp(self)

    def to_init(self) -> None:
        self._require(QPState.RESET)
        self.responder = rc.Responder(
            start_psn=0, mtu_bytes=self.config.path_mtu_bytes, cq=self.recv_cq,
            resolve=self.pd.resolve, qp_num=self.qp_num, ack_every=self.config.ack_every,
            ecn_echo=self.config.ecn_echo, rnr_timer_code=self.config.rnr_timer_code)
        self.state = QPState.INIT

    def to_rtr(self, remote: QPInfo) -> None:
        """Ready to receive from ``remote`` (its QPN, first PSN and address)."""
        self._require(QPState.INIT)
        self.remote = remote
        self.responder.expected_psn = remote.psn & PSN_MASK
        local_ip, local_port = self.device.local_address()
        self.tx_seeds = wire.IcrcSeeds(local_ip, remote.ip, local_port, remote.port)
        self.rx_seeds = wire.IcrcSeeds(remote.ip, local_ip, remote.port, local_port)
        self.state = QPState.RTR

    def to_rts(self) -> None:
        """Ready to send, from PSN ``self.psn``."""
        self._require(QPState.RTR)
        c = self.config
        self.requester = rc.Requester(
            start_psn=self.psn, mtu_bytes=c.path_mtu_bytes, cq=self.send_cq, qp_num=self.qp_num,
            ack_request_every=c.ack_request_every, ack_timeout_s=c.ack_timeout_s,
            retry_count=c.retry_count, rnr_retry=c.rnr_retry,
            max_outstanding_packets=c.max_outstanding_packets)
        self.state = QPState.RTS

    def post_send(self, wr: SendWR) -> None:
        if self.state is not QPState.RTS:
            raise RuntimeError(f"post_send needs RTS, QP {self.qp_num} is {self.state.name}")
        if wr.mr.pd is not self.pd:
            raise ValueError("the memory region belongs to another protection domain")
        self.requester.post(wr.wr_id, wr.opcode, wr.local(), remote_addr=wr.remote_addr,
                            rkey=wr.rkey, signaled=wr.signaled)
        self.device.activate(self)

    def post_recv(self, wr: RecvWR) -> None:
        if self.state is QPState.RESET:
            raise RuntimeError(f"post_recv needs INIT or later, QP {self.qp_num} is RESET")
        self.responder.post_recv(wr.wr_id, wr.local())

    def local_info(self, mr: MemoryRegion | None = None) -> QPInfo:
        ip, port = self.device.local_address()
        if mr is None:
            return QPInfo(self.qp_num, self.psn, ip, port)
        return QPInfo(self.qp_num, self.psn, ip, port, mr.addr, mr.rkey, mr.length)

    @property
    def in_error(self) -> bool:
        return self.requester is not None and self.requester.error

    def _require(self, state: QPState) -> None:
        if self.state is not state:
            raise RuntimeError(f"QP {self.qp_num} is {self.state.name}, expected {state.name}")
