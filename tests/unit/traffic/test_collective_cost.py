"""The alpha-beta cost model against arithmetic written out by hand, the choice crossing
over from tree to ring as the size grows, the nccl-tests bandwidth formulas, and the sweep's
sizes, rows and table."""
from __future__ import annotations

import pytest

from testbed.traffic.collectives.cost import (
    AlphaBeta,
    algbw_gbyte,
    busbw_factor,
    choose,
    link_alpha_beta,
    predict_s,
)
from testbed.traffic.collectives.data import op_sizes
from testbed.traffic.collectives.program import parse_groups, parse_hosts, parse_size
from testbed.traffic.collectives.sweep import format_table, result_row, sweep_sizes

REL = 1e-12  # the model is closed-form arithmetic: only float rounding may differ
ALPHA = 10e-6       # 10 us per message
BETA = 1e-9         # 1 ns per byte (1 GB/s)
LINK = AlphaBeta(ALPHA, BETA)
S = 1_000_000       # bytes


def test_link_alpha_beta_from_rate_and_hops():
    ab = link_alpha_beta(100, hops=3, hop_latency_s=5e-6, host_latency_s=20e-6)
    assert ab.alpha_s == pytest.approx(20e-6 + 3 * 5e-6, rel=REL)
    assert ab.beta_s_per_byte == pytest.approx(8 / 100e6, rel=REL)  # 80 ns per byte
    assert ab.rate_mbit == pytest.approx(100, rel=REL)
    with pytest.raises(ValueError):
        link_alpha_beta(0)


def test_ring_allreduce_by_hand():
    # 2(p-1) alpha + 2(p-1)/p S beta, p = 4: 6 * 10 us + 1.5 * 1e6 * 1 ns = 60 us + 1.5 ms
    assert predict_s("allreduce", "ring", 4, S, LINK) == pytest.approx(60e-6 + 1.5e-3, rel=REL)
    # with gamma = 0.5 ns/B: + (p-1)/p S gamma = 0.75 * 1e6 * 0.5 ns = 0.375 ms
    assert predict_s("allreduce", "ring", 4, S, AlphaBeta(ALPHA, BETA, 0.5e-9)) == pytest.approx(
        60e-6 + 1.5e-3 + 0.375e-3, rel=REL)


def test_halving_doubling_by_hand():
    # p = 8: 2 log2(8) alpha + 2 * 7/8 S beta = 60 us + 1.75 ms
    assert predict_s("allreduce", "hd", 8, S, LINK) == pytest.approx(60e-6 + 1.75e-3, rel=REL)
    # p = 6 runs p' = 4 plus a pre and a post step of the whole buffer:
    # 2*2*10 us + 2*3/4*1 ms + 2*(10 us + 1 ms) = 40 us + 1.5 ms + 2.02 ms
    assert predict_s("allreduce", "hd", 6, S, LINK) == pytest.approx(40e-6 + 1.5e-3 + 2.02e-3, rel=REL)


def test_ring_family_by_hand():
    # (p-1) alpha + (p-1)/p S beta, p = 4: 30 us + 0.75 ms
    for op, algorithm in (("allgather", "ring"), ("reducescatter", "ring"), ("alltoall", "pairwise")):
        assert predict_s(op, algorithm, 4, S, LINK) == pytest.approx(30e-6 + 0.75e-3, rel=REL)


def test_broadcasts_by_hand():
    # binomial, p = 5: ceil(log2 5) = 3 rounds of (alpha + S beta) = 3 * 1.01 ms
    assert predict_s("broadcast", "tree", 5, S, LINK) == pytest.approx(3 * 1.01e-3, rel=REL)
    # chain over 3 hops, 4 slices of 250 kB: (3 + 4 - 1) * (10 us + 0.25 ms) = 6 * 0.26 ms
    assert predict_s("broadcast", "ring", 4, S, LINK, slice_bytes=250_000) == pytest.approx(
        6 * 0.26e-3, rel=REL)
    # unsliced: 3 * (10 us + 1 ms)
    assert predict_s("broadcast", "ring", 4, S, LINK) == pytest.approx(3 * 1.01e-3, rel=REL)


def test_double_binary_tree_by_hand():
    # p = 8: depth 3, two children per inner rank, each tree S/2 = 500 kB.
    # unsliced, up and down: 2 * 3 * (10 us + 2 * 500 kB * 1 ns) = 6 * 1.01 ms
    assert predict_s("allreduce", "tree", 8, S, LINK) == pytest.approx(6 * 1.01e-3, rel=REL)
    # 100 kB slices: 5 per tree, (3 + 5 - 1) stages of (10 us + 2 * 100 kB * 1 ns), twice
    assert predict_s("allreduce", "tree", 8, S, LINK, slice_bytes=100_000) == pytest.approx(
        2 * 7 * 0.21e-3, rel=REL)
    # p = 2: one child per rank, depth 1: 2 * (10 us + 500 kB * 1 ns)
    assert predict_s("allreduce", "tree", 2, S, LINK) == pytest.approx(2 * 0.51e-3, rel=REL)


def test_hierarchical_by_hand():
    intra = AlphaBeta(1e-6, 0.1e-9)  # NVLink-like: 1 us, 10 GB/s
    groups = [[0, 1, 2, 3], [4, 5, 6, 7]]
    # chain reduce over 3 hops (unsliced): 3 * (1 us + 1e6 * 0.1 ns) = 3 * 0.101 ms, the same
    # to broadcast back; ring of 2 leaders: 2 * 10 us + 2 * 1/2 * 1 ms = 1.02 ms
    expected = 2 * 3 * 0.101e-3 + 1.02e-3
    assert predict_s("allreduce", "hierarchical", 8, S, LINK, groups=groups, intra=intra) == pytest.approx(
        expected, rel=REL)
    # one node: no inter-node ring at all
    assert predict_s("allreduce", "hierarchical", 4, S, LINK, groups=[[0, 1, 2, 3]], intra=intra) == pytest.approx(
        2 * 3 * 0.101e-3, rel=REL)


def test_unknown_pairs_are_refused():
    with pytest.raises(ValueError):
        predict_s("allgather", "tree", 4, S, LINK)
    with pytest.raises(ValueError, match="node groups"):
        predict_s("allreduce", "hierarchical", 4, S, LINK)


def test_choose_tree_for_small_ring_for_large_and_crosses_once():
    """p = 16, 50 us, 1 Gbit/s, 256 KiB slices, as NCCL: small sizes are latency-bound (the
    tree's 2*4 stages beat the ring's 30 messages), large ones bandwidth-bound (the ring moves
    1.875 S per link, the tree 2 S)."""
    link = link_alpha_beta(1000, host_latency_s=50e-6)
    kwargs = {"slice_bytes": 256 * 1024}
    small_ring = predict_s("allreduce", "ring", 16, 8, link)
    small_tree = predict_s("allreduce", "tree", 16, 8, link, **kwargs)
    assert small_ring == pytest.approx(30 * 50e-6 + 1.875 * 8 * 8e-9, rel=REL)
    assert small_tree == pytest.approx(2 * 4 * (50e-6 + 2 * 4 * 8e-9), rel=REL)
    assert choose("allreduce", 16, 8, link, ("ring", "tree"), **kwargs) == ("tree", small_tree)
    big = 64 * 2**20
    assert choose("allreduce", 16, big, link, ("ring", "tree"), **kwargs)[0] == "ring"
    picks = [choose("allreduce", 16, 2**k, link, ("ring", "tree"), **kwargs)[0] for k in range(3, 28)]
    first_ring = picks.index("ring")
    assert set(picks[:first_ring]) == {"tree"} and set(picks[first_ring:]) == {"ring"}


def test_choose_with_a_link_per_algorithm():
    """Halving-doubling's far partners cross more hops: with a slower path it loses to the ring."""
    near, far = AlphaBeta(ALPHA, BETA), AlphaBeta(ALPHA, 2 * BETA)
    assert choose("allreduce", 8, S, near, ("ring", "hd"))[0] == "hd"  # same beta, fewer alphas
    assert choose("allreduce", 8, S, {"ring": near, "hd": far}, ("ring", "hd"))[0] == "ring"


@pytest.mark.parametrize(("op", "world", "factor"), [
    ("allreduce", 2, 1.0), ("allreduce", 4, 1.5), ("allreduce", 16, 1.875),
    ("reducescatter", 4, 0.75), ("allgather", 8, 0.875), ("alltoall", 2, 0.5), ("broadcast", 8, 1.0)])
def test_busbw_factors_of_nccl_tests(op, world, factor):
    assert busbw_factor(op, world) == pytest.approx(factor, rel=REL)


def test_algbw():
    assert algbw_gbyte(2_000_000_000, 2.0) == pytest.approx(1.0, rel=REL)


# --- the sweep's pure parts ---------------------------------------------------------------------


def test_sweep_sizes_as_nccl_tests():
    assert sweep_sizes(8, 128, 2) == [8, 16, 32, 64, 128]
    assert sweep_sizes(8, 100, 4) == [8, 32]
    assert sweep_sizes(0, 4, 2) == [0, 1, 2, 4]
    with pytest.raises(ValueError):
        sweep_sizes(8, 4, 2)


def test_parse_size_hosts_and_groups():
    assert [parse_size(s) for s in ("8", "64K", "128M", "1G", "2kb")] == [8, 65536, 128 * 2**20, 2**30, 2048]
    assert parse_hosts("10.0.0.1, 10.0.0.2:30000", 29500) == {0: ("10.0.0.1", 29500), 1: ("10.0.0.2", 30000)}
    assert parse_groups("0,1/2,3,4") == [[0, 1], [2, 3, 4]]
    assert parse_groups(None) is None


def test_result_row_and_table_by_hand():
    sizes = op_sizes("allreduce", 1_000_000, 4)
    row = result_row("allreduce", 4, sizes, "ring", 0, [0.001, 0.003], wrong=2, predicted_s=0.001)
    # mean time 2 ms: algbw = 1e6 B / 2 ms = 0.5 GB/s, busbw = 0.5 * 1.5 = 0.75 GB/s
    assert row["time_us"] == pytest.approx(2000, rel=REL)
    assert row["time_us_max"] == pytest.approx(3000, rel=REL)
    assert row["algbw_gbyte_s"] == pytest.approx(0.5, rel=REL)
    assert row["busbw_gbyte_s"] == pytest.approx(0.75, rel=REL)
    assert row["busbw_mbit_s"] == pytest.approx(6000, rel=REL)
    assert row["predicted_busbw_gbyte_s"] == pytest.approx(1.5, rel=REL)
    assert (row["count"], row["type"], row["redop"], row["root"], row["wrong"]) == (250000, "float", "sum", -1, 2)
    lines = format_table([row]).splitlines()
    assert lines[0].split() == ["#", "size", "count", "type", "redop", "root", "time", "algbw",
                                "busbw", "#wrong"]
    assert lines[2].split() == ["1000000", "250000", "float", "sum", "-1", "2000.0", "0.50", "0.75", "2"]
    bcast = result_row("broadcast", 4, op_sizes("broadcast", 8, 4), "ring", 3, [1e-3], 0, 1e-3)
    assert (bcast["redop"], bcast["root"]) == ("none", 3)
