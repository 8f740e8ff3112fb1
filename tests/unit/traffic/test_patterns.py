from __future__ import annotations

import pytest

from testbed.traffic.patterns import (
    HEDERA_PATTERNS,
    pattern_pairs,
    random_derangement,
    stride,
)


@pytest.mark.parametrize("n", [2, 5, 16, 128])
@pytest.mark.parametrize("name", HEDERA_PATTERNS)
def test_every_pattern_is_a_permutation_without_self_flows(name, n):
    if name.startswith("stride") and int(name[6:]) % n == 0:
        with pytest.raises(ValueError):
            pattern_pairs(name, n)
        return
    pairs = pattern_pairs(name, n, seed=3)
    assert sorted(s for s, _ in pairs) == list(range(n))
    assert sorted(d for _, d in pairs) == list(range(n))
    assert all(s != d for s, d in pairs)


def test_stride_on_the_k4_fat_tree_numbering():
    # hosts pod by pod, 4 per pod: stride 4 reaches the next pod, stride 8 the opposite one
    assert stride(16, 4)[0] == (0, 4) and stride(16, 4)[15] == (15, 3)
    assert all(d // 4 == (s // 4 + 2) % 4 for s, d in stride(16, 8))


@pytest.mark.parametrize("seed", range(20))
def test_random_derangement_is_seeded(seed):
    assert random_derangement(16, seed) == random_derangement(16, seed)


def test_random_patterns_differ_between_seeds():
    assert len({tuple(random_derangement(16, seed)) for seed in range(20)}) > 15


def test_unknown_pattern_is_refused():
    with pytest.raises(ValueError, match="unknown traffic pattern"):
        pattern_pairs("staggered", 16)
