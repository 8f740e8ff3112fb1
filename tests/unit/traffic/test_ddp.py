"""DDP bucketing against hand examples and PyTorch's closing rule, the overlap timeline by
hand, and the rank program run by 4 processes over TCP."""
from __future__ import annotations

import pytest

from tests.unit.ranks import loopback_hosts, run_rank_processes
from testbed.traffic.training.ddp import (
    DEFAULT_BUCKET_CAP_BYTES,
    DEFAULT_FIRST_BUCKET_BYTES,
    Bucket,
    backward_durations,
    bucket_ready_s,
    ddp_buckets,
    flops_compute_s,
    overlap_timeline,
)
from testbed.traffic.training.models import load_model, model_from_dict

REL = 1e-12
STEP_SLACK_S = 0.25  # scheduling on a shared 2-core machine; a step may run this much late


def test_buckets_by_hand():
    # reverse order 3, 2, 1, 0; first limit 3, then 10; a bucket closes once it reaches its limit
    assert ddp_buckets([4, 8, 12, 16], bucket_cap_bytes=10, first_bucket_bytes=3) == [
        Bucket(0, (3,), 16, 3), Bucket(1, (2,), 12, 10), Bucket(2, (1, 0), 12, 10)]
    assert ddp_buckets([1] * 10, bucket_cap_bytes=4, first_bucket_bytes=2) == [
        Bucket(0, (9, 8), 2, 2), Bucket(1, (7, 6, 5, 4), 4, 4), Bucket(2, (3, 2, 1, 0), 4, 4)]
    # what is left at the end is a bucket of its own, below its limit
    assert ddp_buckets([1] * 5, bucket_cap_bytes=4, first_bucket_bytes=2) == [
        Bucket(0, (4, 3), 2, 2), Bucket(1, (2, 1, 0), 3, 4)]


@pytest.mark.parametrize("name", ["resnet50", "gpt2_small"])
def test_model_buckets_follow_pytorchs_rule(name):
    sizes = load_model(name).param_bytes()
    buckets = ddp_buckets(sizes)
    assert [i for b in buckets for i in b.params] == list(reversed(range(len(sizes))))
    assert sum(b.size_bytes for b in buckets) == sum(sizes)
    assert buckets[0].limit_bytes == DEFAULT_FIRST_BUCKET_BYTES == 2**20
    assert all(b.limit_bytes == DEFAULT_BUCKET_CAP_BYTES == 25 * 2**20 for b in buckets[1:])
    for b in buckets:
        assert b.size_bytes == sum(sizes[i] for i in b.params)
        # closed by the tensor that reached the limit: without it the bucket was below
        assert b.size_bytes - sizes[b.params[-1]] < b.limit_bytes
    for b in buckets[:-1]:
        assert b.size_bytes >= b.limit_bytes


def test_resnet50_buckets():
    buckets = ddp_buckets(load_model("resnet50").param_bytes())
    # fc.bias (4 kB) does not fill the 1 MiB first bucket; fc.weight (8.192 MB) overfills it
    assert buckets[0].params == (160, 159) and buckets[0].size_bytes == 4000 + 8_192_000
    assert len(buckets) == 5


def test_backward_split_and_ready_times_by_hand():
    model = model_from_dict({"model": "toy", "params": [
        {"name": f"p{i}", "shape": [n], "forward_flops": f}
        for i, (n, f) in enumerate([(1, 40), (2, 30), (3, 20), (4, 10)])]})
    assert backward_durations(model, 10.0, "params") == pytest.approx([1, 2, 3, 4], rel=REL)
    assert backward_durations(model, 10.0, "flops") == pytest.approx([4, 3, 2, 1], rel=REL)
    with pytest.raises(ValueError):
        backward_durations(model, 1.0, "layers")
    buckets = [Bucket(0, (3,), 0, 0), Bucket(1, (2,), 0, 0), Bucket(2, (1, 0), 0, 0)]
    # gradients in reverse order: p3 done at 4, p2 at 4+3, p1 at 7+2, p0 at 9+1
    assert bucket_ready_s(buckets, [1, 2, 3, 4]) == pytest.approx([4, 7, 10], rel=REL)


def test_overlap_timeline_by_hand():
    t = overlap_timeline([4, 7, 10], [2, 5, 1], forward_s=1, backward_s=10)
    # bucket 0: ready 1+4 = 5, runs 5..7; bucket 1: ready 8, runs 8..13;
    # bucket 2: ready 11, waits for bucket 1, runs 13..14; compute ends at 11
    assert [(b.ready_s, b.start_s, b.end_s) for b in t.buckets] == [(5, 5, 7), (8, 8, 13), (11, 13, 14)]
    assert (t.step_s, t.comm_s, t.exposed_comm_s) == (14, 8, 3)
    assert t.exposed_share == pytest.approx(3 / 14, rel=REL)
    # short AllReduces hide behind backward, except the last bucket's: it is ready only when
    # backward ends (11), so its 0.5 s is always exposed
    hidden = overlap_timeline([4, 7, 10], [1, 1, 0.5], forward_s=1, backward_s=10)
    assert (hidden.step_s, hidden.exposed_comm_s) == (11.5, 0.5)


def test_flops_compute_by_hand():
    model = model_from_dict({"model": "toy", "params": [{"name": "w", "shape": [1], "forward_flops": 1e9}]})
    forward, backward = flops_compute_s(model, samples=10, device_gflops=100)
    assert forward == pytest.approx(0.1, rel=REL) and backward == pytest.approx(0.2, rel=REL)


def test_ddp_program_runs_four_ranks_over_tcp():
    world, forward_ms, backward_ms = 4, 30.0, 60.0
    hosts = loopback_hosts(world)
    out = run_rank_processes("testbed.traffic.training.ddp", world, lambda r: [
        "--rank", str(r), "--hosts", hosts, "--model", "resnet50", "--scale", "0.002",
        "--steps", "2", "--warmup-steps", "1", "--forward-ms", str(forward_ms),
        "--backward-ms", str(backward_ms), "--channels", "2", "--link-rate-mbit", "1000"])
    assert [code for code, _ in out] == [0] * world
    for _, res in out:
        assert res["verified"] and res["wrong"] == 0
        assert len(res["buckets"]) == 5 and len(res["steps"]) == 2
        assert res["buckets"][0]["message_bytes"] == round(8_196_000 * 0.002 / 4) * 4
        compute_s = (forward_ms + backward_ms) / 1e3
        for step in res["steps"]:
            assert compute_s <= step["step_s"] <= compute_s + STEP_SLACK_S
            assert 0 <= step["exposed_share"] < 1
            assert len(step["buckets"]) == 5
            assert all(b["start_s"] >= b["ready_s"] for b in step["buckets"])
        predicted = res["predicted"]
        assert predicted["step_s"] >= compute_s
        assert res["cost_model"]["source"] == "arguments"
    assert len(out[0][1]["job_step_s"]) == 2
