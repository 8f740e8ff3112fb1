"""24-bit PSN arithmetic: addition with wrap, signed distance, windows, unwrapping."""
from __future__ import annotations

import pytest

from testbed.traffic.roce import psn

TOP = psn.PSN_MASK   # 0xFFFFFF, the last PSN before the wrap


def test_add_wraps_modulo_2_to_24():
    assert psn.add(TOP, 1) == 0
    assert psn.add(TOP - 2, 5) == 2
    assert psn.add(0, -1) == TOP
    assert psn.add(5, 3) == 8


@pytest.mark.parametrize("a,b,expected", [
    (10, 15, 5), (15, 10, -5),
    (TOP, 0, 1), (0, TOP, -1),              # across the wrap, both ways
    (TOP - 9, 10, 20),                      # 10 before the wrap to 10 after it
    (0, psn.PSN_HALF - 1, psn.PSN_HALF - 1),
    (0, psn.PSN_HALF, -psn.PSN_HALF),       # exactly half way reads as behind
])
def test_distance_is_signed_and_wraps(a, b, expected):
    assert psn.distance(a, b) == expected


def test_in_window_across_the_wrap():
    start = TOP - 3                         # window of 8: TOP-3 .. TOP, 0 .. 3
    inside = [TOP - 3, TOP, 0, 3]
    outside = [TOP - 4, 4, 1000]
    assert all(psn.in_window(p, start, 8) for p in inside)
    assert not any(psn.in_window(p, start, 8) for p in outside)


def test_in_window_refuses_ambiguous_windows():
    with pytest.raises(ValueError):
        psn.in_window(0, 0, psn.PSN_HALF + 1)


def test_wire_psn_and_unwrap_are_inverse_near_the_reference():
    start = TOP - 5
    for index in (0, 5, 6, 7, 1000, 3 * psn.PSN_MODULO + 17):
        wire = psn.wire_psn(start, index)
        assert psn.unwrap(wire, start, index) == index
        assert psn.unwrap(wire, start, index + 100) == index       # reference a bit ahead
        assert psn.unwrap(wire, start, max(index - 100, 0)) == index  # or behind
    assert psn.wire_psn(start, 5) == TOP
    assert psn.wire_psn(start, 6) == 0
