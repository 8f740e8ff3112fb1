"""RTT under load against the queueing the emulated queues explain: the probe path's hops,
ping's output, and the excess by hand."""
from __future__ import annotations

import pytest

from testbed.measure.fidelity import judge
from testbed.measure.rtt import (
    IDLE_SHARE,
    MIN_EXCESS_MS,
    Hop,
    excess_summary,
    explained_ms,
    parse_ping,
    path_hops,
)
from testbed.model.topology import build


def test_the_probe_path_has_every_ecmp_candidate_port_per_hop():
    f = build("fattree", k=4, host_rate_mbit=6)
    hops = path_hops(f, "p0e0h0", "p3e1h1")
    # edge -> 2 aggregations, aggregation -> 2 cores each, core -> the far pod's aggregation,
    # aggregation -> the far edge, edge -> the host: 5 switch hops
    assert len(hops) == 5
    assert hops[0] == Hop(("p0e0-eth3", "p0e0-eth4"), 6)
    assert len(hops[1].ports) == 4 and all(p.startswith(("p0a0", "p0a1")) for p in hops[1].ports)
    assert len(hops[2].ports) == 4 and all(p.startswith("c") for p in hops[2].ports)
    assert hops[-1] == Hop(("p3e1-eth2",), 6)
    assert [len(h.ports) for h in path_hops(f, "p0e0h0", "p0e0h1")] == [1]  # same edge


def test_ping_output_with_timestamps():
    text = """PING 10.3.1.3 (10.3.1.3) 56(84) bytes of data.
[1764622000.123456] 64 bytes from 10.3.1.3: icmp_seq=1 ttl=64 time=1.23 ms
[1764622000.173456] 64 bytes from 10.3.1.3: icmp_seq=2 ttl=64 time=45.6 ms
[1764622000.223456] no answer yet for icmp_seq=3
"""
    assert parse_ping(text) == [(1764622000.123456, 1, 1.23), (1764622000.173456, 2, 45.6)]


def test_explained_queueing_by_hand():
    hops = [Hop(("a", "b"), 8.0), Hop(("c",), 8.0), Hop(("d",), None)]
    # the larger of a and b: 2000 B at 8 Mbit/s = 2 ms; c: 1000 B = 1 ms; d unshaped: nothing
    assert explained_ms(hops, {"a": 500, "b": 2000, "c": 1000, "d": 10**6}) == pytest.approx(3.0)


def test_excess_is_what_neither_idle_nor_the_queues_explain():
    hops = [Hop(("a",), 8.0)]
    probes = [(10.0, 12.0), (10.1, 30.0), (10.2, 13.0)]
    explained = [(10.0, 9.0), (10.1, 10.0), (10.2, 10.0)]
    r = excess_summary(2.0, probes, explained, hops)
    # excess: 12-2-9 = 1, 30-2-10 = 18, 13-2-10 = 1 -> median 1
    assert (r.p50_excess_ms, r.samples) == (1.0, 3)
    assert r.limit_ms == max(MIN_EXCESS_MS, IDLE_SHARE * 2.0)
    assert (r.p50_explained_ms, r.judged) == (10.0, 3)
    assert excess_summary(None, probes, explained, hops).p50_excess_ms is None


def test_without_a_queue_sample_near_a_probe_nothing_is_judged():
    hops = [Hop(("a",), 8.0)]
    probes = [(10.0, 12.0), (11.0, 80.0)]
    r = excess_summary(2.0, probes, [(10.05, 9.0)], hops)
    # the second probe is a second from any sample: left out rather than charged 80 ms
    assert (r.judged, r.p50_excess_ms) == (1, 1.0)
    none = excess_summary(2.0, probes, [], hops)
    assert none.p50_excess_ms is None and none.limit_ms is None and none.samples == 2


def test_a_probe_is_timed_from_when_it_left():
    """ping -D stamps the reply's arrival; the probe is matched to the queues it met when it
    left, rtt earlier."""
    from testbed.measure.rtt import RttProbe

    probe = RttProbe.__new__(RttProbe)
    probe.t_offset = 1000.0
    probe._stop = __import__("threading").Event()
    probe._thread, probe.host_readers = None, []

    class Ping:
        def terminate(self):
            pass

        def communicate(self, timeout):
            return "[1010.500000] 64 bytes from 10.0.0.2: icmp_seq=1 ttl=64 time=100 ms\n", ""

    probe.proc = Ping()
    probe.__exit__(None, None, None)
    assert probe.probes == [(pytest.approx(10.4), 100.0)]


def test_a_probe_delayed_beyond_the_queues_makes_the_run_untrusted():
    good = dict(cpu_busy_fraction=0.5, vswitchd_cores=0.5, link_delivery_fraction=0.97,
                emulator_loss_fraction=0.0)
    fine = judge(**good, rtt={"p50_excess_ms": 2.0, "limit_ms": 5.0})
    assert fine.trustworthy
    late = judge(**good, rtt={"p50_excess_ms": 40.0, "limit_ms": 5.0})
    assert not late.trustworthy and "added delay" in late.reasons[0]
    assert [c.outcome for c in late.checks if c.name.startswith("probe RTT")] == ["FAIL"]


def test_the_limit_allows_for_the_packet_each_hop_is_sending():
    from testbed.plan.port_queue import gso_max_bytes, in_service_ms

    # 100 Mbit/s sends 12500 bytes a millisecond: the GSO cap; 6 Mbit/s only 750, so two
    # frames, TCP's smallest TSO burst
    assert gso_max_bytes(100.0, 1500) == 12500 and gso_max_bytes(6.0, 9000) == 18028
    assert gso_max_bytes(10_000.0, 1500) == 65536 and gso_max_bytes(None, 1500) == 65536
    assert in_service_ms(100.0, 1500, offloads_on=True) == pytest.approx(1.0)
    assert in_service_ms(100.0, 1500, offloads_on=False) == pytest.approx(1514 * 8 / 1e5)
    assert in_service_ms(None, 1500, offloads_on=True) == 0.0
    hops = [Hop(("a",), 8.0)]
    r = excess_summary(2.0, [(10.0, 30.0)], [(10.0, 9.0)], hops, in_service_ms=12.0)
    assert r.limit_ms == MIN_EXCESS_MS + 12.0 and r.in_service_ms == 12.0
