"""How long DCQCN takes to share a bottleneck fairly, which sets how much of a roce-dcqcn run
is left out before fairness is judged (``settle_s``).

The transport's own reaction and notification points (testbed.traffic.roce.cc.dcqcn, with
the paper's parameters scaled to the link) drive two paced QPs into one FIFO with the
scenario's RED-ECN profile (the marker's rule, testbed.plan.profiles.mark_probability). Two
QPs that start at line rate are cut at random: one may take a CNP more than the other before
the queue drains (the emulator measured 10.8 against 6.7 Mbit/s in run
20261204-121045-roce-dcqcn-3bce, and a Jain index of 0.92-0.95 for 35 s). From there the
notification point's one CNP per interval per QP cuts both by the same fraction at each
marking burst, and only the equal additive increase closes the gap: the bundled scenario's
settle must cover that, its judged window must then find the QPs fair."""
from __future__ import annotations

import heapq
import random

import pytest

from testbed.experiments.roce_dcqcn.checks import MIN_JAIN
from testbed.experiments.roce_common.roce_setups import dcqcn_red_bytes, roce_frame_bytes
from testbed.harness.scenario import parse_yaml, read_text
from testbed.measure.stats import jain_index
from testbed.plan.profiles import mark_probability
from testbed.traffic.roce.cc.dcqcn import NotificationPoint, ReactionPoint, params_for_link

ONE_WAY_DELAY_S = 100e-6       # propagation and the hosts' stacks, each way
SCENARIO = parse_yaml(read_text("roce-dcqcn"), "roce-dcqcn")  # the bundled scenario
LINK_BPS = SCENARIO["link_rate_mbit"] * 1e6
FRAME_BYTES = roce_frame_bytes(SCENARIO["params"]["roce_mtu_bytes"])  # a full RoCE frame
PROFILE, _ = dcqcn_red_bytes(SCENARIO["link_rate_mbit"])  # the scenario's ports' RED-ECN
UNEQUAL_STARTS_BPS = [(10e6, 5e6), (10e6, 2.5e6)]  # one cut apart, two cuts apart
SEEDS = range(3)
SHORT_WINDOW_S = (10, 25)      # what the shortened test judged before (25 s, settle 10)


def sent_bytes_per_second(start_bps: tuple[float, float], seed: int, until_s: float) -> list:
    """Two QPs under DCQCN from rates ``start_bps`` into one FIFO at the scenario's link rate:
    the bytes each sent in every whole second up to ``until_s``."""
    params, _ = params_for_link(LINK_BPS)
    rng = random.Random(seed)
    rps, nps = [], [NotificationPoint(params.cnp_interval_s) for _ in start_bps]
    for rate in start_bps:
        rp = ReactionPoint(params)
        rp.on_cnp(0.0)                             # cut once: timers and alpha running
        rp.rc_bps = rp.rt_bps = rate
        rps.append(rp)
    sent = [[0] * int(until_s) for _ in rps]
    queue_bytes, drained_at_s = 0.0, 0.0
    events = [(i * 1e-4, "send", i) for i in range(len(rps))]
    while events:
        now, kind, i = heapq.heappop(events)
        if now >= until_s:
            break
        if kind == "cnp":
            rps[i].on_cnp(now)
            continue
        rps[i].advance(now)
        queue_bytes = max(0.0, queue_bytes - (now - drained_at_s) * LINK_BPS / 8)
        drained_at_s = now
        ce = rng.random() < mark_probability(PROFILE, int(queue_bytes))
        queue_bytes += FRAME_BYTES
        sent[i][int(now)] += FRAME_BYTES
        arrives_s = now + queue_bytes * 8 / LINK_BPS + ONE_WAY_DELAY_S
        if nps[i].on_data(arrives_s, ce):
            heapq.heappush(events, (arrives_s + ONE_WAY_DELAY_S, "cnp", i))
        rps[i].on_sent(now, FRAME_BYTES)
        heapq.heappush(events, (now + FRAME_BYTES * 8 / rps[i].rate_bps(), "send", i))
    return sent


def jain_over(sent: list, window_s: tuple[float, float]) -> float:
    start, end = (int(x) for x in window_s)
    return jain_index([sum(per_second[start:end]) for per_second in sent])


@pytest.mark.parametrize("start_bps", UNEQUAL_STARTS_BPS)
def test_the_scenario_judges_fairness_after_dcqcn_has_converged(start_bps):
    params = SCENARIO["params"]
    window_s = (params["settle_s"], params["seconds"])
    short = []
    for seed in SEEDS:
        sent = sent_bytes_per_second(start_bps, seed, params["seconds"])
        assert jain_over(sent, window_s) >= MIN_JAIN, (seed, sent)
        short.append(jain_over(sent, SHORT_WINDOW_S))
    # the window the shortened test judged came too early: still unfair from such a start
    assert min(short) < MIN_JAIN, short
