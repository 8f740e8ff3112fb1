"""The RC requester and responder, driven by explicit time through an in-memory link that can
lose chosen packets: segmentation, go-back-N after a NAK, timeouts and the retry limit, ACK
coalescing, duplicates, R_Key violations, RNR, and a transfer across the 24-bit PSN wrap.
Expected counts are worked out by hand in each test."""
from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from testbed.traffic.roce import wire
from testbed.traffic.roce.psn import PSN_MASK
from testbed.traffic.roce.rc import Requester, Responder, packet_codes, timeout_s_from_code
from testbed.traffic.roce.wire import NakCode, Opcode
from testbed.traffic.roce.work import CompletionQueue, WcOpcode, WcStatus, WrOpcode

REGION_VA = 0x7F00_0000_0000
RKEY = 0x1234_5601
TIMEOUT_S = 0.010
NEVER = 10**9            # an ack-request period longer than any test message


def pattern(nbytes: int, seed: int = 7) -> bytes:
    return bytes((i * 31 + seed) & 0xFF for i in range(nbytes))


@dataclass
class Link:
    """A requester and a responder joined by a synchronous, lossy link: every packet is
    delivered (or dropped) as soon as it is sent, every reply likewise."""
    requester: Requester
    responder: Responder
    memory: bytearray
    send_cq: CompletionQueue
    recv_cq: CompletionQueue
    drop_data: set = field(default_factory=set)    # (psn, n-th transmission of it)
    drop_replies: set = field(default_factory=set) # n-th reply sent (from 1)
    transmissions: list = field(default_factory=list)
    replies: list = field(default_factory=list)

    def run(self, now_s: float) -> None:
        seen: dict[int, int] = {}
        while (burst := self.requester.next_burst(now_s, 64)) is not None:
            for packet in self.requester.expand(burst):
                seen[packet.psn] = seen.get(packet.psn, 0) + 1
                self.transmissions.append((packet.opcode, packet.psn))
                if (packet.psn, seen[packet.psn]) in self.drop_data:
                    continue
                reply = self.responder.on_packet(packet.opcode, packet.psn, packet.ackreq,
                                                 memoryview(packet.payload), packet.reth)
                if reply is None:
                    continue
                self.replies.append(reply)
                if len(self.replies) in self.drop_replies:
                    continue
                self.requester.on_ack(now_s, reply.psn, reply.syndrome, reply.msn)


def make_link(start_psn: int = 100, mtu: int = 1024, ack_request_every: int = NEVER,
              ack_every: int = NEVER, retry_count: int = 7, window: int = 128,
              region_bytes: int = 1 << 16, **drops) -> Link:
    memory = bytearray(region_bytes)

    def resolve(rkey: int, va: int, length: int):
        offset = va - REGION_VA
        if rkey != RKEY or offset < 0 or offset + length > region_bytes:
            return None
        return memoryview(memory)[offset:offset + length]

    send_cq, recv_cq = CompletionQueue(), CompletionQueue()
    requester = Requester(start_psn=start_psn, mtu_bytes=mtu, cq=send_cq,
                          ack_request_every=ack_request_every, ack_timeout_s=TIMEOUT_S,
                          retry_count=retry_count, max_outstanding_packets=window)
    responder = Responder(start_psn=start_psn, mtu_bytes=mtu, cq=recv_cq, resolve=resolve,
                          ack_every=ack_every)
    return Link(requester, responder, memory, send_cq, recv_cq, **drops)


def post_write(link: Link, wr_id: int, data: bytes, offset: int = 0, rkey: int = RKEY) -> None:
    link.requester.post(wr_id, WrOpcode.RDMA_WRITE, memoryview(data),
                        remote_addr=REGION_VA + offset, rkey=rkey)


# --- segmentation ---------------------------------------------------------------------------


@pytest.mark.parametrize("mtu,expected_sizes", [
    (1024, [1024] * 9 + [784]),       # 10000 = 9 * 1024 + 784
    (2048, [2048] * 4 + [1808]),      # 10000 = 4 * 2048 + 1808
    (4096, [4096] * 2 + [1808]),      # 10000 = 2 * 4096 + 1808
])
def test_write_is_segmented_at_the_path_mtu(mtu, expected_sizes):
    link = make_link(mtu=mtu)
    data = pattern(10000)
    post_write(link, 1, data, offset=512)
    burst = link.requester.next_burst(0.0, 64)
    packets = link.requester.expand(burst)
    assert [len(p.payload) for p in packets] == expected_sizes
    n = len(expected_sizes)
    assert [p.opcode for p in packets] == (
        [Opcode.RDMA_WRITE_FIRST] + [Opcode.RDMA_WRITE_MIDDLE] * (n - 2) + [Opcode.RDMA_WRITE_LAST])
    assert [p.psn for p in packets] == list(range(100, 100 + n))
    assert [p.ackreq for p in packets] == [False] * (n - 1) + [True]
    assert packets[0].reth == (REGION_VA + 512, RKEY, 10000)
    assert all(p.reth is None for p in packets[1:])
    for p in packets:
        link.responder.on_packet(p.opcode, p.psn, p.ackreq, memoryview(p.payload), p.reth)
    assert bytes(link.memory[512:10512]) == data


def test_single_packet_and_empty_messages_are_only_packets():
    link = make_link()
    post_write(link, 1, b"")
    link.requester.post(2, WrOpcode.SEND, memoryview(pattern(1024)))
    link.responder.post_recv(9, memoryview(bytearray(2048)))
    link.run(0.0)
    assert [op for op, _ in link.transmissions] == [Opcode.RDMA_WRITE_ONLY, Opcode.SEND_ONLY]
    assert [(wc.wr_id, wc.status, wc.opcode, wc.byte_len) for wc in link.send_cq.poll(9)] == [
        (1, WcStatus.SUCCESS, WcOpcode.RDMA_WRITE, 0), (2, WcStatus.SUCCESS, WcOpcode.SEND, 1024)]
    assert [(wc.wr_id, wc.opcode, wc.byte_len) for wc in link.recv_cq.poll(9)] == [
        (9, WcOpcode.RECV, 1024)]
    assert link.responder.msn == 2


def test_packet_codes_mark_every_nth_and_the_last():
    codes = packet_codes(WrOpcode.SEND, 6, first_index=2, ack_request_every=4)
    # absolute indices 2..7; (index + 1) % 4 == 0 at 3 and 7; 7 is also the last packet
    assert [c & 0x7F for c in codes] == [Opcode.SEND_FIRST] + [Opcode.SEND_MIDDLE] * 4 + [Opcode.SEND_LAST]
    assert [bool(c & 0x80) for c in codes] == [False, True, False, False, False, True]


# --- loss and recovery --------------------------------------------------------------------------


def test_lost_packet_is_naked_once_and_resent_go_back_n_from_its_psn():
    """8 packets (PSN 100..107), ack requested every 4; PSN 102 lost on its first send.

    First pass: 100, 101 accepted; 103 arrives out of sequence -> one NAK for 102, which also
    acknowledges 100..101; 104..107 are out of sequence too but not NAKed again. The requester
    goes back to 102 and resends 102..107 (6 retransmissions); the responder ACKs 103 and 107
    (ack-request bits at indices 3 and 7)."""
    link = make_link(ack_request_every=4, drop_data={(102, 1)})
    data = pattern(8 * 1024)
    post_write(link, 1, data)
    link.run(0.0)
    req, resp = link.requester, link.responder
    assert [psn for _, psn in link.transmissions] == list(range(100, 108)) + list(range(102, 108))
    assert req.retransmitted_packets == 6 and req.naks == 1 and req.timeouts == 0
    assert resp.naks_sent == 1 and resp.out_of_sequence == 5
    assert [(r.psn, r.syndrome) for r in link.replies] == [
        (102, wire.nak_syndrome(NakCode.PSN_SEQUENCE_ERROR)),
        (103, wire.AETH_ACK_NO_CREDITS), (107, wire.AETH_ACK_NO_CREDITS)]
    assert [(wc.wr_id, wc.status, wc.byte_len) for wc in link.send_cq.poll(9)] == [
        (1, WcStatus.SUCCESS, 8192)]
    assert bytes(link.memory[:8192]) == data
    assert resp.bytes_placed == 8192      # nothing applied twice


def test_lost_ack_times_out_and_duplicates_are_reacked_not_reapplied():
    """4 packets, only the last asks for an ACK; that ACK is lost. Nothing happens before the
    timeout; at the timeout the requester resends all 4; the responder sees 4 duplicates,
    places nothing again, and re-ACKs the last (PSN 103) cumulatively."""
    link = make_link(drop_replies={1})
    post_write(link, 1, pattern(4096))
    link.run(0.0)
    req, resp = link.requester, link.responder
    assert req.deadline_s == pytest.approx(TIMEOUT_S)
    assert not req.on_timer(TIMEOUT_S * 0.99)
    assert req.on_timer(TIMEOUT_S)
    assert req.timeouts == 1 and req.tx == req.una == 0
    link.run(TIMEOUT_S)
    assert req.retransmitted_packets == 4
    assert resp.duplicates == 4 and resp.bytes_placed == 4096 and resp.msn == 1
    assert [(r.psn, r.msn) for r in link.replies] == [(103, 1), (103, 1)]
    assert [wc.status for wc in link.send_cq.poll(9)] == [WcStatus.SUCCESS]
    assert req.deadline_s == float("inf")     # nothing outstanding: the timer is off


def test_retry_limit_exceeded_completes_in_error_and_flushes():
    """Every ACK is lost. retry_count=2 allows two timeouts; the third fails the QP: the first
    request completes RETRY_EXC_ERR, the second is flushed, later posts are flushed at once."""
    link = make_link(retry_count=2, drop_replies=set(range(1, 100)))
    post_write(link, 1, pattern(2048))
    post_write(link, 2, pattern(1024), offset=4096)
    now = 0.0
    link.run(now)
    for expected_timeouts in (1, 2):
        now += TIMEOUT_S
        assert link.requester.on_timer(now)
        assert link.requester.timeouts == expected_timeouts and not link.requester.error
        link.run(now)
    assert link.send_cq.poll(9) == []
    now += TIMEOUT_S
    assert link.requester.on_timer(now)
    assert link.requester.error and link.requester.timeouts == 3
    assert [(wc.wr_id, wc.status) for wc in link.send_cq.poll(9)] == [
        (1, WcStatus.RETRY_EXC_ERR), (2, WcStatus.WR_FLUSH_ERR)]
    post_write(link, 3, b"late")
    assert [(wc.wr_id, wc.status) for wc in link.send_cq.poll(9)] == [(3, WcStatus.WR_FLUSH_ERR)]
    assert link.requester.next_burst(now, 64) is None


def test_progress_resets_the_retry_counter():
    link = make_link(retry_count=1, drop_replies={1})
    post_write(link, 1, pattern(1024))
    link.run(0.0)
    assert link.requester.on_timer(TIMEOUT_S)         # one retry used
    link.run(TIMEOUT_S)                               # ACK arrives: progress
    assert link.requester.retries_left == 1
    post_write(link, 2, pattern(1024))
    assert link.requester.completed == 1


# --- acknowledgements ----------------------------------------------------------------------------


def test_ack_coalescing_counts():
    """Two messages of 10 packets, ack requested every 4 packets: requests at absolute indices
    3, 7, 11, 15 and at the last packets 9 and 19 -> 6 ACKs for 20 packets."""
    link = make_link(ack_request_every=4)
    post_write(link, 1, pattern(10 * 1024))
    post_write(link, 2, pattern(10 * 1024), offset=10 * 1024)
    link.run(0.0)
    assert [r.psn - 100 for r in link.replies] == [3, 7, 9, 11, 15, 19]
    assert link.responder.acks_sent == 6
    assert [r.msn for r in link.replies] == [0, 0, 1, 1, 1, 2]


def test_responder_coalesces_on_its_own_count_when_no_ack_is_requested_sooner():
    """100 packets, only the last asks for an ACK; the responder ACKs every 16 on its own:
    after packets 16, 32, 48, 64, 80, 96 and at 100 -> 7 ACKs."""
    link = make_link(ack_every=16, region_bytes=100 * 1024)
    post_write(link, 1, pattern(100 * 1024))
    link.run(0.0)
    assert [r.psn - 100 for r in link.replies] == [15, 31, 47, 63, 79, 95, 99]


def test_duplicate_only_packet_is_reacked_with_the_last_psn_and_not_applied_again():
    link = make_link()
    resp = link.responder
    data = pattern(100)
    first = resp.on_packet(Opcode.RDMA_WRITE_ONLY, 100, True, memoryview(data), (REGION_VA, RKEY, 100))
    link.memory[:100] = bytes(100)                    # if it were applied again, it would show
    again = resp.on_packet(Opcode.RDMA_WRITE_ONLY, 100, True, memoryview(data), (REGION_VA, RKEY, 100))
    assert first == again == (100, wire.AETH_ACK_NO_CREDITS, 1, None)
    assert bytes(link.memory[:100]) == bytes(100)
    assert resp.duplicates == 1 and resp.messages == 1 and resp.expected_psn == 101


def test_stale_and_ghost_acks_are_ignored():
    link = make_link()
    post_write(link, 1, pattern(3 * 1024))
    link.requester.next_burst(0.0, 64)                # PSN 100..102 sent
    req = link.requester
    assert req.on_ack(0.0, 99, wire.AETH_ACK_NO_CREDITS).acked_packets == 0    # before una
    assert req.on_ack(0.0, 200, wire.AETH_ACK_NO_CREDITS).acked_packets == 0   # never sent
    assert req.on_ack(0.0, 101, wire.AETH_ACK_NO_CREDITS).acked_packets == 2
    assert req.una == 2 and req.acked_bytes == 2048 and req.flight_bytes == 1024


# --- errors ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("rkey,offset", [(RKEY ^ 1, 0), (RKEY, (1 << 16) - 100)],
                         ids=["wrong-rkey", "beyond-the-region"])
def test_rkey_violation_naks_and_completes_in_error(rkey, offset):
    link = make_link()
    post_write(link, 1, pattern(2048), offset=offset, rkey=rkey)
    post_write(link, 2, pattern(10))
    link.run(0.0)
    assert link.responder.access_errors == 1
    assert link.replies[0].syndrome == wire.nak_syndrome(NakCode.REMOTE_ACCESS_ERROR)
    assert [(wc.wr_id, wc.status) for wc in link.send_cq.poll(9)] == [
        (1, WcStatus.REM_ACCESS_ERR), (2, WcStatus.WR_FLUSH_ERR)]
    assert link.requester.error and link.responder.bytes_placed == 0


def test_send_without_a_posted_receive_gets_rnr_nak_then_succeeds():
    link = make_link()
    link.requester.post(1, WrOpcode.SEND, memoryview(pattern(2048)))
    link.run(0.0)
    req = link.requester
    assert link.responder.rnr_naks_sent == 1 and req.rnr_naks == 1
    delay_s = wire.rnr_delay_s(link.responder.rnr_syndrome)           # code 1: 10 us
    assert delay_s == pytest.approx(10e-6)
    assert req.next_burst(delay_s / 2, 64) is None                    # still waiting
    assert req.next_deadline_s(delay_s / 2) == pytest.approx(delay_s)
    assert req.next_deadline_s(delay_s * 2) == req.deadline_s         # a past RNR wait wakes nobody
    buffer = bytearray(4096)
    link.responder.post_recv(5, memoryview(buffer))
    link.run(delay_s)
    assert [wc.status for wc in link.send_cq.poll(9)] == [WcStatus.SUCCESS]
    assert [(wc.wr_id, wc.byte_len) for wc in link.recv_cq.poll(9)] == [(5, 2048)]
    assert bytes(buffer[:2048]) == pattern(2048)


def test_send_larger_than_the_receive_buffer_fails_both_sides():
    link = make_link()
    link.responder.post_recv(5, memoryview(bytearray(1000)))
    link.requester.post(1, WrOpcode.SEND, memoryview(pattern(1500)))
    link.run(0.0)
    assert [(wc.wr_id, wc.status) for wc in link.recv_cq.poll(9)] == [(5, WcStatus.LOC_LEN_ERR)]
    assert [(wc.wr_id, wc.status) for wc in link.send_cq.poll(9)] == [(1, WcStatus.REM_INV_REQ_ERR)]


# --- windows and the PSN wrap -------------------------------------------------------------------


def test_outstanding_window_limits_bursts_until_acked():
    link = make_link(window=4, ack_request_every=2)
    post_write(link, 1, pattern(10 * 1024))
    req = link.requester
    assert req.next_burst(0.0, 64).count == 4
    assert req.next_burst(0.0, 64) is None
    assert req.on_ack(0.0, 101, wire.AETH_ACK_NO_CREDITS).acked_packets == 2
    assert req.next_burst(0.0, 64).count == 2


def test_transfer_across_the_psn_wrap_with_a_loss_at_the_wrap():
    """Start 5 PSNs before 2^24: 20 packets take PSNs 0xFFFFFB..0xFFFFFF, 0..14. PSN 0xFFFFFF
    (index 4) is lost once: NAK for 0xFFFFFF, go back, 16 retransmissions (indices 4..19)."""
    start = PSN_MASK - 4
    link = make_link(start_psn=start, ack_request_every=8, region_bytes=1 << 16)
    data = pattern(20 * 1024)
    post_write(link, 1, data)
    link.drop_data = {(PSN_MASK, 1)}
    link.run(0.0)
    psns = [psn for _, psn in link.transmissions]
    assert psns[:20] == [(start + i) & PSN_MASK for i in range(20)]
    assert psns[20:] == [(start + i) & PSN_MASK for i in range(4, 20)]
    assert link.requester.retransmitted_packets == 16 and link.requester.naks == 1
    assert link.replies[0].psn == PSN_MASK
    assert [wc.status for wc in link.send_cq.poll(9)] == [WcStatus.SUCCESS]
    assert bytes(link.memory[:len(data)]) == data
    assert link.responder.expected_psn == (start + 20) & PSN_MASK == 15


def test_timeout_code_follows_the_verbs_formula():
    assert timeout_s_from_code(14) == pytest.approx(4.096e-6 * 16384)   # 67.1 ms
    assert timeout_s_from_code(0) == pytest.approx(4.096e-6)
