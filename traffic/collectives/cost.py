"""Alpha-beta cost model of the collectives (Thakur, Rabenseifner, Gropp 2005) and the
nccl-tests bandwidth formulas.

A message of n bytes over a link costs alpha + n*beta (alpha: latency in seconds, beta:
seconds per byte, 1/bandwidth); reducing n bytes costs n*gamma. ``size_bytes`` is nccl-tests'
size S (the AllReduce buffer, AllGather's whole output, ReduceScatter's whole input,
AllToAll's send buffer, the broadcast buffer). With p ranks:

| algorithm | time |
|---|---|
| ring AllReduce | 2(p-1) alpha + 2(p-1)/p S beta + (p-1)/p S gamma |
| halving-doubling AllReduce, p = 2^k | 2 log2(p) alpha + 2(p-1)/p S beta + (p-1)/p S gamma |
| halving-doubling, otherwise (p' = 2^floor(log2 p)) | the above for p' + 2 alpha + 2 S beta + S gamma (pre and post steps) |
| ring ReduceScatter | (p-1) alpha + (p-1)/p S beta + (p-1)/p S gamma |
| ring AllGather, pairwise AllToAll | (p-1) alpha + (p-1)/p S beta |
| binomial Broadcast | ceil(log2 p) (alpha + S beta) |
| pipelined chain over h hops, k slices of s = S/k | (h + k - 1)(alpha + s beta [+ s gamma]) |
| double binary tree AllReduce | 2 (D + k - 1)(alpha + f s beta) + (D + k - 1) f s gamma, D = floor(log2 p), S/2 per tree in k slices of s, f = min(2, p-1) children per inner rank |
| hierarchical AllReduce | chain reduce in the node (intra link) + ring AllReduce of the leaders (inter link) + chain broadcast in the node |

Pipelined algorithms take ``slice_bytes`` (the executor's slice); without it they send whole
buffers (k = 1). ``choose`` returns the cheapest algorithm for a size, which is how NCCL ends
up on trees for small messages (fewer latency terms) and rings for large ones (fewer bytes
per link).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Mapping

ALLREDUCE, REDUCESCATTER, ALLGATHER, ALLTOALL, BROADCAST = (
    "allreduce", "reducescatter", "allgather", "alltoall", "broadcast")


@dataclass(frozen=True)
class AlphaBeta:
    """Per-message latency ``alpha_s``, per-byte time ``beta_s_per_byte`` and per-byte
    reduction time ``gamma_s_per_byte``."""

    alpha_s: float
    beta_s_per_byte: float
    gamma_s_per_byte: float = 0.0

    @property
    def rate_mbit(self) -> float:
        return 8 / self.beta_s_per_byte / 1e6

    def message_s(self, size_bytes: float) -> float:
        return self.alpha_s + size_bytes * self.beta_s_per_byte


def link_alpha_beta(rate_mbit: float, hops: int = 1, hop_latency_s: float = 0.0,
                    host_latency_s: float = 0.0, gamma_s_per_byte: float = 0.0) -> AlphaBeta:
    """A path's alpha and beta from the fabric: ``hops`` links of ``hop_latency_s`` each plus
    the hosts' own ``host_latency_s``; beta from the bottleneck ``rate_mbit``."""
    if rate_mbit <= 0:
        raise ValueError("rate_mbit must be positive")
    return AlphaBeta(host_latency_s + hops * hop_latency_s, 8 / (rate_mbit * 1e6), gamma_s_per_byte)


def _check(world: int, size_bytes: float) -> None:
    if world < 1 or size_bytes < 0:
        raise ValueError(f"bad world {world} or size {size_bytes}")


def ring_allreduce_s(world: int, size_bytes: float, link: AlphaBeta) -> float:
    _check(world, size_bytes)
    p = world
    return (2 * (p - 1) * link.alpha_s + 2 * (p - 1) / p * size_bytes * link.beta_s_per_byte
            + (p - 1) / p * size_bytes * link.gamma_s_per_byte)


def halving_doubling_allreduce_s(world: int, size_bytes: float, link: AlphaBeta) -> float:
    _check(world, size_bytes)
    p2 = 1 << (world.bit_length() - 1)
    t = (2 * math.log2(p2) * link.alpha_s + 2 * (p2 - 1) / p2 * size_bytes * link.beta_s_per_byte
         + (p2 - 1) / p2 * size_bytes * link.gamma_s_per_byte)
    if p2 != world:
        t += 2 * link.message_s(size_bytes) + size_bytes * link.gamma_s_per_byte
    return t


def ring_reduce_scatter_s(world: int, size_bytes: float, link: AlphaBeta) -> float:
    _check(world, size_bytes)
    p = world
    return (p - 1) * link.alpha_s + (p - 1) / p * size_bytes * (link.beta_s_per_byte + link.gamma_s_per_byte)


def ring_allgather_s(world: int, size_bytes: float, link: AlphaBeta) -> float:
    _check(world, size_bytes)
    p = world
    return (p - 1) * link.alpha_s + (p - 1) / p * size_bytes * link.beta_s_per_byte


pairwise_alltoall_s = ring_allgather_s  # p-1 exchanges of S/p each, the same terms


def binomial_broadcast_s(world: int, size_bytes: float, link: AlphaBeta) -> float:
    _check(world, size_bytes)
    return (world - 1).bit_length() * link.message_s(size_bytes)


def pipelined_s(hops: int, size_bytes: float, link: AlphaBeta, slice_bytes: float | None,
                reduce: bool = False, fan_in: int = 1) -> float:
    """``size_bytes`` pushed over ``hops`` links in slices of at most ``slice_bytes`` (all at
    once without it): (hops + k - 1) stages, each a slice on every link (``fan_in`` slices
    into one receiver), plus its reduction when ``reduce``."""
    if hops <= 0 or size_bytes <= 0:
        return 0.0
    k = 1 if not slice_bytes else max(1, math.ceil(size_bytes / slice_bytes))
    s = size_bytes / k
    stage = link.alpha_s + fan_in * s * link.beta_s_per_byte
    if reduce:
        stage += fan_in * s * link.gamma_s_per_byte
    return (hops + k - 1) * stage


def chain_broadcast_s(world: int, size_bytes: float, link: AlphaBeta,
                      slice_bytes: float | None = None) -> float:
    _check(world, size_bytes)
    return pipelined_s(world - 1, size_bytes, link, slice_bytes)


def tree_allreduce_s(world: int, size_bytes: float, link: AlphaBeta,
                     slice_bytes: float | None = None) -> float:
    """Double binary tree: each tree reduces and broadcasts half of S; the trees run at the
    same time and an inner rank of one is a leaf of the other, so an inner rank's link
    carries its ``fan_in`` children's slices per stage."""
    _check(world, size_bytes)
    depth = world.bit_length() - 1
    fan_in = min(2, world - 1)
    half = size_bytes / 2
    return (pipelined_s(depth, half, link, slice_bytes, reduce=True, fan_in=fan_in)
            + pipelined_s(depth, half, link, slice_bytes, fan_in=fan_in))


def hierarchical_allreduce_s(groups: list[list[int]], size_bytes: float, intra: AlphaBeta,
                             inter: AlphaBeta, slice_bytes: float | None = None) -> float:
    """Chain reduce inside the largest node group (intra-node link), ring AllReduce of the
    node leaders (inter-node link), chain broadcast inside the node."""
    hops = max(len(g) for g in groups) - 1
    leaders = len(groups)
    across = ring_allreduce_s(leaders, size_bytes, inter) if leaders > 1 else 0.0
    return (pipelined_s(hops, size_bytes, intra, slice_bytes, reduce=True) + across
            + pipelined_s(hops, size_bytes, intra, slice_bytes))


def predict_s(op: str, algorithm: str, world: int, size_bytes: float, link: AlphaBeta, *,
              slice_bytes: float | None = None, groups: list[list[int]] | None = None,
              intra: AlphaBeta | None = None) -> float:
    """Predicted time of ``op`` with ``algorithm``. ``link`` is the path between the ranks
    that talk (for hierarchical: between node leaders, ``intra`` inside a node)."""
    if op == ALLREDUCE:
        if algorithm == "ring":
            return ring_allreduce_s(world, size_bytes, link)
        if algorithm == "hd":
            return halving_doubling_allreduce_s(world, size_bytes, link)
        if algorithm == "tree":
            return tree_allreduce_s(world, size_bytes, link, slice_bytes)
        if algorithm == "hierarchical":
            if not groups:
                raise ValueError("the hierarchical AllReduce needs node groups")
            return hierarchical_allreduce_s(groups, size_bytes, intra or link, link, slice_bytes)
    elif op == REDUCESCATTER and algorithm == "ring":
        return ring_reduce_scatter_s(world, size_bytes, link)
    elif op == ALLGATHER and algorithm == "ring":
        return ring_allgather_s(world, size_bytes, link)
    elif op == ALLTOALL and algorithm == "pairwise":
        return pairwise_alltoall_s(world, size_bytes, link)
    elif op == BROADCAST:
        if algorithm == "ring":
            return chain_broadcast_s(world, size_bytes, link, slice_bytes)
        if algorithm == "tree":
            return binomial_broadcast_s(world, size_bytes, link)
    raise ValueError(f"no cost model for {op} with {algorithm!r}")


def choose(op: str, world: int, size_bytes: float, links: AlphaBeta | Mapping[str, AlphaBeta],
           candidates: tuple[str, ...], **kwargs) -> tuple[str, float]:
    """The cheapest of ``candidates`` for this size and its predicted time (the first on a
    tie). ``links``: one AlphaBeta for all, or per algorithm (partners of halving-doubling
    may sit more hops apart than ring neighbours)."""
    best = None
    for algorithm in candidates:
        link = links[algorithm] if isinstance(links, Mapping) else links
        t = predict_s(op, algorithm, world, size_bytes, link, **kwargs)
        if best is None or t < best[1]:
            best = (algorithm, t)
    if best is None:
        raise ValueError("no candidate algorithms")
    return best


def busbw_factor(op: str, world: int) -> float:
    """nccl-tests: busbw = algbw * factor; AllReduce 2(n-1)/n, ReduceScatter, AllGather and
    AllToAll (n-1)/n, Broadcast 1."""
    if op == ALLREDUCE:
        return 2 * (world - 1) / world
    if op in (REDUCESCATTER, ALLGATHER, ALLTOALL):
        return (world - 1) / world
    if op == BROADCAST:
        return 1.0
    raise ValueError(f"unknown collective {op!r}")


def algbw_gbyte(size_bytes: float, seconds: float) -> float:
    """Algorithm bandwidth S/t in GB/s (10^9 bytes per second)."""
    return size_bytes / seconds / 1e9


def gbyte_to_mbit(gbyte_s: float) -> float:
    return gbyte_s * 8e3
