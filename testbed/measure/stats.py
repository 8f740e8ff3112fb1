"""The statistics every experiment shares: one percentile definition and one fairness index."""
from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q``-th percentile (0..100) of a non-empty sequence, linear between the closest
    ranks (numpy's default, as nccl-tests' and most papers' plots use)."""
    if len(values) == 0:
        raise ValueError("percentile of no values")
    if not 0 <= q <= 100:
        raise ValueError(f"q must be in [0, 100], got {q!r}")
    return float(np.percentile(np.asarray(values, dtype=float), q))


def jain_index(values: Sequence[float]) -> float:
    """Jain's fairness index: 1 when all values are equal, 1/n when one takes everything
    (1 for no load at all)."""
    total = sum(values)
    squares = sum(v * v for v in values)
    return total * total / (len(values) * squares) if squares else 1.0
