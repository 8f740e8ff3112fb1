"""The one percentile and the one fairness index every experiment uses."""
from __future__ import annotations

import numpy as np
import pytest

from testbed.measure.stats import jain_index, percentile

FLOAT_REL_TOL = 1e-12


@pytest.mark.parametrize("q", [0, 1, 25, 50, 90, 99, 100])
def test_percentile_is_numpys_linear_definition(q):
    values = [3.0, 1.0, 4.0, 1.5, 9.0, 2.6, 5.3]
    assert percentile(values, q) == pytest.approx(np.percentile(values, q))


def test_percentile_by_hand():
    # sorted 1, 2, 3, 4: p50 at rank 1.5 -> 2.5; p90 at rank 2.7 -> 3 + 0.7
    assert percentile([4, 1, 3, 2], 50) == 2.5
    assert percentile([4, 1, 3, 2], 90) == pytest.approx(3.7)
    assert percentile([7], 99) == 7


@pytest.mark.parametrize(("values", "q"), [([], 50), ([1.0], 101), ([1.0], -1)])
def test_percentile_refuses_nothing_and_out_of_range(values, q):
    with pytest.raises(ValueError):
        percentile(values, q)

@pytest.mark.parametrize("n", [1, 2, 3, 8, 16])
def test_jain_equal_shares_is_one(n):
    assert jain_index([4.2] * n) == pytest.approx(1.0, rel=FLOAT_REL_TOL)


@pytest.mark.parametrize("n", [2, 3, 8, 16])
def test_jain_one_takes_all_is_one_over_n(n):
    assert jain_index([5.0] + [0.0] * (n - 1)) == pytest.approx(1 / n, rel=FLOAT_REL_TOL)


def test_jain_known_value():
    # (1 + 3)^2 / (2 * (1 + 9)) = 0.8
    assert jain_index([1.0, 3.0]) == pytest.approx(0.8, rel=FLOAT_REL_TOL)


def test_jain_all_zero_is_one():
    assert jain_index([0.0, 0.0, 0.0]) == 1.0


