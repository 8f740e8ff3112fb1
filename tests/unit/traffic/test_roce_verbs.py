"""The verbs-shaped interface over a stub device (what any backend must provide: an address,
keys for memory regions, QP numbers, a wake-up): memory regions and their remote checks,
QP state transitions, and the info exchanged out of band."""
from __future__ import annotations

import numpy as np
import pytest

from testbed.traffic.roce.verbs import (Access, CompletionQueue, MemoryRegion, ProtectionDomain,
                                        QPConfig, QPInfo, QPState, QueuePair, RecvWR, SendWR,
                                        WrOpcode)
from testbed.traffic.roce.work import WcOpcode, WcStatus, WorkCompletion


class StubDevice:
    def __init__(self):
        self.activated = []
        self._next = 100

    def local_address(self):
        return "10.0.0.1", 4791

    def register_mr(self, mr):
        self._next += 1
        return self._next, self._next + 1000, 0x1000 * self._next

    def attach_qp(self, qp):
        self._next += 1
        return self._next

    def activate(self, qp):
        self.activated.append(qp.qp_num)


def test_memory_region_over_numpy_and_remote_checks():
    pd = ProtectionDomain(StubDevice())
    values = np.arange(16, dtype=np.float32)
    mr = MemoryRegion(pd, buffer=values)
    assert mr.length == 64 and mr.rkey == mr.lkey + 1000
    assert pd.resolve(mr.rkey, mr.addr + 8, 8).tobytes() == values[2:4].tobytes()
    assert pd.resolve(mr.rkey, mr.addr + 60, 8) is None            # past the end
    assert pd.resolve(mr.rkey, mr.addr - 4, 8) is None             # before the start
    assert pd.resolve(mr.rkey + 1, mr.addr, 8) is None             # unknown key
    local_only = MemoryRegion(pd, 64, access=Access.LOCAL_WRITE)
    assert pd.resolve(local_only.rkey, local_only.addr, 8) is None  # no remote write right
    mr.close()
    assert pd.resolve(mr.rkey, mr.addr, 8) is None                  # deregistered
    with pytest.raises(ValueError):
        MemoryRegion(pd, buffer=bytes(8))                           # read-only memory
    with pytest.raises(ValueError):
        mr.slice(60, 8)


def test_queue_pair_states_and_exchange():
    device = StubDevice()
    pd = ProtectionDomain(device)
    mr = MemoryRegion(pd, 4096)
    cq = CompletionQueue(8)
    qp = QueuePair(pd, cq, cq, QPConfig(path_mtu_bytes=2048), psn=0xABCDEF)
    assert qp.state is QPState.RESET
    with pytest.raises(RuntimeError):
        qp.post_recv(RecvWR(1, mr))
    qp.to_init()
    qp.post_recv(RecvWR(1, mr, 0, 1024))                 # receives may be posted from INIT
    with pytest.raises(RuntimeError):
        qp.post_send(SendWR(2, WrOpcode.SEND, mr))
    with pytest.raises(RuntimeError):
        qp.to_rts()                                      # RTR comes first
    info = qp.local_info(mr)
    assert info == QPInfo(qp.qp_num, 0xABCDEF, "10.0.0.1", 4791, mr.addr, mr.rkey, 4096)
    assert QPInfo.from_dict(info.to_dict()) == info
    remote = QPInfo(0x42, 77, "10.0.0.2", 4791, 0x9000, 5, 1 << 20)
    qp.to_rtr(remote)
    assert qp.responder.expected_psn == 77 and qp.responder.posted_receives == 1
    assert (qp.tx_seeds.src_ip, qp.tx_seeds.dst_ip) == ("10.0.0.1", "10.0.0.2")
    qp.to_rts()
    qp.post_send(SendWR(3, WrOpcode.RDMA_WRITE, mr, 0, 3000, remote_addr=0x9000, rkey=5))
    assert device.activated == [qp.qp_num]
    assert qp.requester.start_psn == 0xABCDEF and qp.requester.posted == 2   # 3000 B at 2048
    other = ProtectionDomain(device)
    with pytest.raises(ValueError):
        qp.post_send(SendWR(4, WrOpcode.SEND, MemoryRegion(other, 16)))


def test_completion_queue_polls_in_order_and_counts_overruns():
    cq = CompletionQueue(depth=2)
    for wr_id in range(3):
        cq.push(WorkCompletion(wr_id, WcStatus.SUCCESS, WcOpcode.SEND, 0))
    assert cq.overruns == 1 and len(cq) == 2
    assert [wc.wr_id for wc in cq.poll(5)] == [0, 1] and cq.poll(1) == []
