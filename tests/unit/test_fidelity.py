"""The fidelity verdict at and around each named tolerance."""
from __future__ import annotations

import pytest

from testbed.fidelity import (
    MAX_CPU_BUSY_FRACTION,
    MAX_RETRANSMIT_FRACTION,
    MIN_LINK_DELIVERY_FRACTION,
    Verdict,
    judge,
)

STEP = 1e-6  # a nudge across a tolerance, far below any measurement's resolution
HEALTHY = {"cpu_busy_fraction": 0.5, "vswitchd_cores": 1.0, "link_delivery_fraction": 0.95,
           "retransmit_fraction": 0.0}

CPU_WORDS = "machine CPU"
DELIVERY_WORDS = "busiest host link delivered"
RETRANSMIT_WORDS = "retransmitted beyond"


def judged(**changes) -> Verdict:
    return judge(**{**HEALTHY, **changes})


def test_tolerances_are_sane():
    assert 0 < MAX_CPU_BUSY_FRACTION < 1
    assert 0 < MIN_LINK_DELIVERY_FRACTION < 1
    assert 0 < MAX_RETRANSMIT_FRACTION < 1


def test_healthy_run_is_trustworthy_with_one_summary_reason():
    verdict = judged()
    assert verdict.trustworthy
    assert len(verdict.reasons) == 1
    reason = verdict.reasons[0]
    assert "CPU 50% busy" in reason
    assert "95% of its rate" in reason
    assert "0.00% of TCP segments" in reason
    assert "ovs-vswitchd 1.00 cores" in reason


@pytest.mark.parametrize(("signal", "limit", "bad_side", "words"), [
    ("cpu_busy_fraction", MAX_CPU_BUSY_FRACTION, +1, CPU_WORDS),
    ("link_delivery_fraction", MIN_LINK_DELIVERY_FRACTION, -1, DELIVERY_WORDS),
    ("retransmit_fraction", MAX_RETRANSMIT_FRACTION, +1, RETRANSMIT_WORDS),
])
def test_each_tolerance_at_and_around_its_limit(signal, limit, bad_side, words):
    at_limit = judged(**{signal: limit})
    assert at_limit.trustworthy, "the limit itself is still acceptable"

    good = judged(**{signal: limit - bad_side * STEP})
    assert good.trustworthy

    bad = judged(**{signal: limit + bad_side * STEP})
    assert not bad.trustworthy
    assert len(bad.reasons) == 1
    assert words in bad.reasons[0]
    for other in {CPU_WORDS, DELIVERY_WORDS, RETRANSMIT_WORDS} - {words}:
        assert other not in bad.reasons[0]


def test_reasons_quote_the_measured_value_and_the_limit():
    cpu = judged(cpu_busy_fraction=0.99).reasons[0]
    assert cpu.startswith("machine CPU 99% busy")
    assert f"limit {MAX_CPU_BUSY_FRACTION:.0%}" in cpu
    delivery = judged(link_delivery_fraction=0.5).reasons[0]
    assert "delivered 50% of its configured rate" in delivery
    assert f"need {MIN_LINK_DELIVERY_FRACTION:.0%}" in delivery
    retrans = judged(retransmit_fraction=0.125).reasons[0]
    assert retrans.startswith("12.5% of TCP segments")
    assert f"limit {MAX_RETRANSMIT_FRACTION:.0%}" in retrans


def test_all_three_problems_are_reported_in_order():
    verdict = judged(cpu_busy_fraction=1.0, link_delivery_fraction=0.1, retransmit_fraction=0.5)
    assert not verdict.trustworthy
    assert len(verdict.reasons) == 3
    assert CPU_WORDS in verdict.reasons[0]
    assert DELIVERY_WORDS in verdict.reasons[1]
    assert RETRANSMIT_WORDS in verdict.reasons[2]


def test_delivery_is_no_verdict_when_not_bandwidth_bound():
    assert judged(link_delivery_fraction=0.0, bandwidth_bound=False).trustworthy
    verdict = judged(link_delivery_fraction=0.0, cpu_busy_fraction=1.0, bandwidth_bound=False)
    assert not verdict.trustworthy
    assert len(verdict.reasons) == 1 and CPU_WORDS in verdict.reasons[0]


def test_vswitchd_cpu_alone_is_no_verdict():
    assert judged(vswitchd_cores=2.0).trustworthy


def test_trustworthy_exactly_when_no_problem():
    grid = [judged(cpu_busy_fraction=c, link_delivery_fraction=d, retransmit_fraction=r)
            for c in (0.1, MAX_CPU_BUSY_FRACTION, MAX_CPU_BUSY_FRACTION + STEP)
            for d in (1.0, MIN_LINK_DELIVERY_FRACTION, MIN_LINK_DELIVERY_FRACTION - STEP)
            for r in (0.0, MAX_RETRANSMIT_FRACTION, MAX_RETRANSMIT_FRACTION + STEP)]
    for verdict in grid:
        problems = sum([verdict.cpu_busy_fraction > MAX_CPU_BUSY_FRACTION,
                        verdict.link_delivery_fraction < MIN_LINK_DELIVERY_FRACTION,
                        verdict.retransmit_fraction > MAX_RETRANSMIT_FRACTION])
        assert verdict.trustworthy == (problems == 0)
        assert len(verdict.reasons) == max(problems, 1)
    assert sum(v.trustworthy for v in grid) == 2 ** 3  # two acceptable values per signal


def test_verdict_echoes_inputs_and_serialises():
    verdict = judge(0.25, 0.75, 0.9, 0.002)
    assert verdict.to_dict() == {
        "trustworthy": True, "reasons": verdict.reasons, "cpu_busy_fraction": 0.25,
        "vswitchd_cores": 0.75, "link_delivery_fraction": 0.9, "retransmit_fraction": 0.002}
