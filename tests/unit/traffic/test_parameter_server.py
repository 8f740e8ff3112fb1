"""Parameter-server sharding by hand and on the real models, and the server and worker
programs over TCP in both modes."""
from __future__ import annotations

import pytest

from tests.unit.ranks import loopback_hosts, run_rank_processes
from testbed.traffic.training.models import load_model
from testbed.traffic.training.parameter_server import Piece, imbalance, shard_parameters, split_pieces

REL = 1e-12


def test_sharding_by_hand():
    # largest first onto the least loaded: 10 -> s0, 7 -> s1, 5 -> s1 (7 < 10), 3 -> s0 (10 < 12),
    # 3 -> s1 (12 < 13)
    shards = shard_parameters([10, 7, 5, 3, 3], servers=2)
    assert [[p.param for p in s.pieces] for s in shards] == [[0, 3], [1, 2, 4]]
    assert [s.size_bytes for s in shards] == [13, 15]
    assert imbalance(shards) == pytest.approx(15 / 14, rel=REL)


def test_sharding_splits_large_tensors():
    assert split_pieces([10, 2], split_bytes=5) == [Piece(0, 0, 5), Piece(0, 5, 10), Piece(1, 0, 2)]
    shards = shard_parameters([10, 2], servers=2, split_bytes=5)
    assert [s.pieces for s in shards] == [(Piece(0, 0, 5), Piece(1, 0, 2)), (Piece(0, 5, 10),)]


@pytest.mark.parametrize("servers", [1, 2, 3, 4, 8])
def test_shards_cover_every_byte_once(servers):
    sizes = load_model("resnet50").param_bytes()
    shards = shard_parameters(sizes, servers)
    covered = sorted((p.param, p.start, p.end) for s in shards for p in s.pieces)
    assert covered == [(i, 0, n) for i, n in enumerate(sizes)]
    assert imbalance(shards) < 1.05


def test_gpt2_needs_split_tensors_to_balance():
    sizes = load_model("gpt2_small").param_bytes()
    whole = shard_parameters(sizes, 4)
    # wte alone is 154 MB of 498 MB: more than a quarter, whatever the rest does
    assert imbalance(whole) >= sizes[0] / (sum(sizes) / 4) > 1.2
    assert imbalance(shard_parameters(sizes, 4, split_bytes=16 * 2**20)) < 1.05


@pytest.mark.parametrize("mode", ["bsp", "async"])
def test_server_and_worker_programs_over_tcp(mode):
    world, servers, steps = 5, 2, 3
    hosts = loopback_hosts(world)
    out = run_rank_processes("testbed.traffic.training.parameter_server", world, lambda r: [
        "--rank", str(r), "--hosts", hosts, "--servers", str(servers), "--mode", mode,
        "--steps", str(steps), "--compute-ms", "10", "--scale", "0.002", "--channels", "2"])
    assert [code for code, _ in out] == [0] * world
    results = [res for _, res in out]
    assert [r["role"] for r in results] == ["server"] * servers + ["worker"] * (world - servers)
    shard_message_bytes = results[0]["shard_message_bytes"]
    for r in results:
        assert r["verified"] and r["wrong"] == 0
    for s in range(servers):
        links = results[s]["bytes_per_peer"]
        assert sorted(links) == ["2", "3", "4"]
        for link in links.values():  # an N:1 incast of pushes, every step
            assert link == {"sent_bytes": steps * shard_message_bytes[s],
                            "received_bytes": steps * shard_message_bytes[s]}
    for w in results[servers:]:
        assert len(w["steps"]) == steps
        assert w["pulls_checked"] == (mode == "bsp")
    if mode == "bsp":
        assert len(results[0]["applied_s"]) == steps
    assert results[0]["wrong_total"] == 0 and len(results[0]["job_step_s"]) == steps
    for r in results:
        start, end = r["timed_window_monotonic_s"]
        assert end - start >= steps * 0.010  # every step's compute at least
