"""Traffic patterns as plain data: who sends a long flow to whom, by host index.

Hedera (Al-Fares et al., NSDI 2010) measures a fat-tree with one long flow per host:
- ``strideS``: host i sends to host (i + S) mod n. On the k=4 fat-tree (hosts numbered pod by
  pod, edge by edge) stride 1 mostly stays under one edge switch, stride 2 crosses to the
  pod's other edge, stride 4 goes to the next pod and stride 8 to the opposite one.
- ``random``: a random derangement (every host sends one flow and receives one, never to
  itself), seeded so a run can be repeated.
"""
from __future__ import annotations

import random
import re

HEDERA_PATTERNS = ("stride1", "stride2", "stride4", "stride8", "random")
_STRIDE = re.compile(r"stride(\d+)")


def stride(n_hosts: int, step: int) -> list[tuple[int, int]]:
    """(source, destination) index pairs: i -> (i + step) mod n."""
    if not 0 < step % n_hosts:
        raise ValueError(f"stride {step} sends every host to itself with {n_hosts} hosts")
    return [(i, (i + step) % n_hosts) for i in range(n_hosts)]


def random_derangement(n_hosts: int, seed: int) -> list[tuple[int, int]]:
    """A random permutation with no fixed point: i -> perm[i] != i (Sattolo's algorithm makes
    a single cycle, which is a derangement)."""
    if n_hosts < 2:
        raise ValueError("a derangement needs at least 2 hosts")
    perm = list(range(n_hosts))
    rng = random.Random(seed)
    for i in range(n_hosts - 1, 0, -1):
        j = rng.randrange(i)
        perm[i], perm[j] = perm[j], perm[i]
    return [(i, perm[i]) for i in range(n_hosts)]


def pattern_pairs(name: str, n_hosts: int, seed: int = 1) -> list[tuple[int, int]]:
    """The (source, destination) pairs of a named pattern."""
    match = _STRIDE.fullmatch(name)
    if match:
        return stride(n_hosts, int(match.group(1)))
    if name == "random":
        return random_derangement(n_hosts, seed)
    raise ValueError(f"unknown traffic pattern {name!r}; known: strideN, random")
