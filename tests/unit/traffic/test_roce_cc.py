"""Congestion control driven by synthetic feedback, against values worked out by hand:
the DCQCN reaction point (cut, alpha, fast recovery, additive and hyper increase, byte
counter), the notification point (one CNP per interval), the DCTCP-style window, and the
scaling of the paper's DCQCN parameters to an emulated link."""
from __future__ import annotations

import math

import pytest

from testbed.traffic.roce import cc
from testbed.traffic.roce.cc.dcqcn import DcqcnParams, NotificationPoint, ReactionPoint
from testbed.traffic.roce.cc.dctcp import DctcpParams, DctcpWindow, echo_delta

REL_TOL = 1e-12
MBIT = 1e6
US = 1e-6

# Round numbers so the arithmetic can be followed: rates in Mbit/s.
PARAMS = DcqcnParams(line_rate_bps=1000 * MBIT, g=1 / 4, initial_alpha=0.5,
                     alpha_interval_s=55 * US, rate_timer_s=100 * US, byte_counter_bytes=1000,
                     fast_recovery_steps=5, rai_bps=10 * MBIT, rhai_bps=100 * MBIT,
                     min_rate_bps=1 * MBIT, cnp_interval_s=50 * US)


def mbit(value_bps: float) -> float:
    return value_bps / MBIT


def test_dcqcn_cut_alpha_fast_recovery_additive_and_hyper_increase():
    rp = ReactionPoint(PARAMS)
    assert mbit(rp.rate_bps()) == 1000 and rp.next_event_s() == math.inf   # idle at line rate

    # CNP at t=0: Rt = Rc = 1000; Rc = 1000 (1 - 0.5/2) = 750; alpha = 0.75*0.5 + 0.25 = 0.625
    rp.on_cnp(0.0)
    assert (mbit(rp.rc_bps), mbit(rp.rt_bps), rp.alpha) == (750, 1000, 0.625)

    # CNP at 10 us (no timer due yet): Rt = 750; Rc = 750 (1 - 0.625/2) = 515.625;
    # alpha = 0.75*0.625 + 0.25 = 0.71875; timers restart: alpha at 65 us, rate at 110 us.
    rp.on_cnp(10 * US)
    assert (mbit(rp.rc_bps), mbit(rp.rt_bps), rp.alpha) == (515.625, 750, 0.71875)

    # Rate timer at 110, 210, 310, 410, 510 us: T = 1..5 <= F: fast recovery Rc = (Rt + Rc)/2
    expected_rc = [632.8125, 691.40625, 720.703125, 735.3515625, 742.67578125]
    for step, rc_mbit in enumerate(expected_rc, start=1):
        rp.advance((10 + 100 * step) * US)
        assert rp.timer_stage == step
        assert mbit(rp.rc_bps) == pytest.approx(rc_mbit, rel=REL_TOL)
        assert mbit(rp.rt_bps) == 750

    # 610 us: T = 6 > F, BC = 0 <= F: additive: Rt = 750 + 10 = 760; Rc = (760 + 742.67578125)/2
    rp.advance(610 * US)
    assert mbit(rp.rt_bps) == pytest.approx(760, rel=REL_TOL)
    assert mbit(rp.rc_bps) == pytest.approx(751.337890625, rel=REL_TOL)
    # alpha decayed at 65, 120, ..., 560 us: floor((610 - 65) / 55) + 1 = 10 intervals
    assert rp.alpha == pytest.approx(0.71875 * 0.75 ** 10, rel=REL_TOL)

    # 6000 bytes sent: 6 byte-counter events. BC = 1..5 with T = 6: additive each
    # (Rt 770, 780, 790, 800, 810); BC = 6: both > F: hyper, i = 6 - 5 = 1: Rt = 810 + 100.
    rc_mbit, rt_mbit = 751.337890625, 760.0
    for rt_step in (10, 10, 10, 10, 10, 100):
        rt_mbit += rt_step
        rc_mbit = (rt_mbit + rc_mbit) / 2
    rp.on_sent(610 * US, 6000)
    assert rp.byte_stage == 6
    assert mbit(rp.rt_bps) == pytest.approx(910, rel=REL_TOL)
    assert mbit(rp.rc_bps) == pytest.approx(rc_mbit, rel=REL_TOL)
    assert rp.increases == {"fast_recovery": 5, "additive": 6, "hyper": 1}

    # 710 us: T = 7, BC = 6: hyper with i = min(7, 6) - 5 = 1: Rt = 1010 -> capped at 1000
    rp.advance(710 * US)
    assert mbit(rp.rt_bps) == 1000
    assert mbit(rp.rc_bps) == pytest.approx((1000 + rc_mbit) / 2, rel=REL_TOL)
    assert rp.cnps_received == 2
    series = rp.series.as_dict()
    assert series["t_s"][:3] == [0.0, 0.0, 10 * US] and len(series["rate_bps"]) == len(series["t_s"])


def test_dcqcn_rate_floor_and_recovery_to_line_rate_stops_the_timers():
    rp = ReactionPoint(DcqcnParams(line_rate_bps=1000 * MBIT, initial_alpha=1.0, g=1 / 256,
                                   min_rate_bps=300 * MBIT, rate_timer_s=100 * US,
                                   rai_bps=50 * MBIT, rhai_bps=50 * MBIT))
    rp.on_cnp(0.0)                       # 1000 (1 - 1/2) = 500
    rp.on_cnp(1 * US)                    # 500 (1 - 1/2) = 250 -> floor 300
    assert mbit(rp.rc_bps) == 300
    rp.advance(1.0)                      # 10000 timer periods: recovered long before
    assert mbit(rp.rc_bps) == 1000 and mbit(rp.rt_bps) == 1000
    assert rp.next_event_s() == math.inf
    events = len(rp.series)
    rp.advance(2.0)
    assert len(rp.series) == events      # asleep until the next CNP


def test_notification_point_sends_at_most_one_cnp_per_interval():
    np_ = NotificationPoint(cnp_interval_s=50 * US)
    arrivals = [(0.0, True), (10 * US, True), (49.9 * US, True), (50 * US, True),
                (60 * US, False), (120 * US, True), (130 * US, True)]
    decisions = [np_.on_data(t, ce) for t, ce in arrivals]
    assert decisions == [True, False, False, True, False, True, False]
    assert np_.cnps_sent == 3 and np_.ce_packets == 6
    assert np_.series.as_dict()["t_s"] == [0.0, 50 * US, 120 * US]


def test_dctcp_window_alpha_reduction_once_per_window_and_growth():
    """MSS 1000 B, initial window 10 MSS, alpha 1, g = 1/16, slow start (ssthresh infinite)."""
    w = DctcpWindow(DctcpParams(mss_bytes=1000, g=1 / 16, initial_alpha=1.0,
                                initial_cwnd_packets=10))
    assert w.window_bytes() == 10000 and w.window_end_bytes == 10000

    # ACK 5000 unmarked: delivered 5000 < window end 10000; slow start: cwnd 15000
    w.on_ack(0.0, 5000, 0, 5000)
    assert w.cwnd_bytes == 15000 and w.alpha == 1.0

    # ACK 5000, 2500 marked: delivered 10000 ends the window: F = 2500/10000 = 0.25,
    # alpha = 15/16 + 0.25/16 = 0.953125; next window ends at 10000 + 10000 in flight.
    # Marks outside a reduced window: cwnd = 15000 (1 - 0.953125/2) = 7851.5625 = ssthresh.
    w.on_ack(1.0, 5000, 2500, 10000)
    assert w.alpha == 0.953125 and w.window_end_bytes == 20000
    assert w.cwnd_bytes == 7851.5625 and w.ssthresh_bytes == 7851.5625
    assert w.reductions == 1 and w.reduced_until_bytes == 20000

    # ACK 5000 all marked: still inside the reduced window (delivered 15000 <= 20000): no cut
    w.on_ack(2.0, 5000, 5000, 8000)
    assert w.cwnd_bytes == 7851.5625 and w.reductions == 1

    # ACK 5000 unmarked: delivered 20000 ends the window: F = 5000/10000 = 0.5,
    # alpha = 15/16 * 0.953125 + 0.5/16 = 0.9248046875; still reduced: no growth.
    w.on_ack(3.0, 5000, 0, 8000)
    assert w.alpha == 0.9248046875 and w.window_end_bytes == 28000
    assert w.cwnd_bytes == 7851.5625

    # ACK 4000 unmarked, outside the reduced window, cwnd >= ssthresh: congestion avoidance,
    # cwnd += 1000 * 4000 / 7851.5625
    w.on_ack(4.0, 4000, 0, 4000)
    assert w.cwnd_bytes == pytest.approx(7851.5625 + 1000 * 4000 / 7851.5625, rel=REL_TOL)

    # A NAK outside a reduced window halves cwnd; a timeout drops it to one MSS.
    before = w.cwnd_bytes
    w.on_loss(5.0, False, 3000)
    assert w.cwnd_bytes == pytest.approx(before / 2, rel=REL_TOL)
    w.on_loss(6.0, True, 3000)
    assert w.cwnd_bytes == 1000 and w.ssthresh_bytes == pytest.approx(before / 4, rel=REL_TOL)
    assert w.marked_bytes == 7500


def test_dctcp_per_window_growth_is_one_mss():
    """In congestion avoidance a full window of unmarked ACKs adds one MSS: 20 ACKs of 1000 B
    at cwnd 20000 add 20 * 1000 * 1000 / cwnd, about 1000."""
    w = DctcpWindow(DctcpParams(mss_bytes=1000, initial_cwnd_packets=20, initial_ssthresh_bytes=0))
    for _ in range(20):
        w.on_ack(0.0, 1000, 0, 19000)
    assert 20000 + 950 < w.cwnd_bytes < 20000 + 1000


def test_ecn_echo_delta_handles_wrap_and_late_acks():
    assert echo_delta(1500, 1000) == 500
    assert echo_delta(100, (1 << 32) - 100) == 200     # the 32-bit counter wrapped
    assert echo_delta(1000, 1500) == 0                 # an older ACK arriving late


def test_dcqcn_parameters_scaled_to_the_link_keep_link_time():
    """100 Mbit/s is 1/400 of the paper's 40 Gbit/s: rates / 400, times * 400, bytes as is."""
    params, record = cc.params_for_link(100 * MBIT)
    assert params.line_rate_bps == pytest.approx(100 * MBIT)
    assert params.rai_bps == pytest.approx(40 * MBIT / 400)          # 0.1 Mbit/s
    assert params.rhai_bps == pytest.approx(400 * MBIT / 400)        # 1 Mbit/s
    assert params.rate_timer_s == pytest.approx(55 * US * 400)       # 22 ms
    assert params.alpha_interval_s == pytest.approx(55 * US * 400)
    assert params.cnp_interval_s == pytest.approx(50 * US * 400)     # 20 ms
    assert params.byte_counter_bytes == 10e6
    assert (params.g, params.fast_recovery_steps) == (1 / 256, 5)
    rows = {r.name: r for r in record}
    assert set(rows) == {f for f in vars(params)}
    assert rows["rate_timer_s"].paper_value == pytest.approx(55 * US)
    assert "40G/link" in rows["rate_timer_s"].rule and "link/40G" in rows["rai_bps"].rule
    # a timer spans the same number of packet times: 55 us at 40G = 22 ms at 100M
    assert params.rate_timer_s * params.line_rate_bps == pytest.approx(55 * US * 40e9)


def test_make_builds_each_control_and_rejects_what_does_not_fit():
    none, _ = cc.make("none", link_rate_bps=None, mtu_bytes=1024)
    assert none.rate_bps() is None and none.window_bytes() is None
    dcqcn, record = cc.make("dcqcn", link_rate_bps=1e9, mtu_bytes=1024, overrides={"g": 0.5})
    assert dcqcn.params.g == 0.5 and dcqcn.rate_bps() == pytest.approx(1e9) and record
    dctcp, _ = cc.make("dctcp", link_rate_bps=None, mtu_bytes=2048)
    assert dctcp.window_bytes() == 10 * 2048
    with pytest.raises(ValueError):
        cc.make("dcqcn", link_rate_bps=None, mtu_bytes=1024)
    with pytest.raises(ValueError):
        cc.make("dcqcn", link_rate_bps=1e9, mtu_bytes=1024, overrides={"gain": 1})
    with pytest.raises(ValueError):
        cc.make("reno", link_rate_bps=1e9, mtu_bytes=1024)
