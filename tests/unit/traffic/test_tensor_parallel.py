"""Megatron tensor parallelism: activation sizes and the order of a step's AllReduces by
hand, the step prediction, and the rank program over TCP."""
from __future__ import annotations

import pytest

from tests.unit.ranks import loopback_hosts, run_rank_processes
from testbed.traffic.training.tensor_parallel import (
    ATTENTION,
    BACKWARD,
    FORWARD,
    MLP,
    activation_bytes,
    predict_tp_step_s,
    tp_collectives,
)

REL = 1e-12


def test_activation_bytes_of_gpt2_small():
    # batch 8 x sequence 1024 x hidden 768 x 2 bytes (fp16)
    assert activation_bytes(8, 1024, 768, 2) == 12_582_912


def test_two_allreduces_forward_and_two_backward_per_layer():
    plan = tp_collectives(2, 100)
    assert [(c.layer, c.phase, c.block) for c in plan] == [
        (0, FORWARD, ATTENTION), (0, FORWARD, MLP), (1, FORWARD, ATTENTION), (1, FORWARD, MLP),
        (1, BACKWARD, MLP), (1, BACKWARD, ATTENTION), (0, BACKWARD, MLP), (0, BACKWARD, ATTENTION)]
    assert {c.size_bytes for c in plan} == {100}
    assert len(tp_collectives(12, 1)) == 48


def test_step_prediction_by_hand():
    # 12 layers x (4 ms + 8 ms) + 48 AllReduces x 1.5 ms = 144 ms + 72 ms
    assert predict_tp_step_s(12, 0.004, 0.008, 0.0015) == pytest.approx(0.216, rel=REL)


def test_tensor_parallel_program_over_tcp():
    world, layers, fwd_ms, bwd_ms = 4, 2, 4.0, 8.0
    hosts = loopback_hosts(world)
    out = run_rank_processes("testbed.traffic.training.tensor_parallel", world, lambda r: [
        "--rank", str(r), "--hosts", hosts, "--layers", str(layers), "--batch", "2", "--seq", "128",
        "--scale", "0.1", "--layer-forward-ms", str(fwd_ms), "--layer-backward-ms", str(bwd_ms),
        "--steps", "2", "--channels", "1", "--link-rate-mbit", "1000"])
    assert [code for code, _ in out] == [0] * world
    for _, res in out:
        assert res["verified"] and res["allreduces_per_step"] == 4 * layers
        assert res["activation_bytes"] == 2 * 128 * 768 * 2
        assert res["message_bytes"] == round(2 * 128 * 768 * 2 * 0.1 / 4) * 4
        for step in res["steps"]:
            assert step["compute_s"] >= layers * (fwd_ms + bwd_ms) / 1e3
            assert step["comm_s"] > 0
        assert res["predicted_step_s"] > layers * (fwd_ms + bwd_ms) / 1e3
        start, end = res["timed_window_monotonic_s"]  # the measured steps, not the warm-up
        assert end - start == pytest.approx(sum(s["step_s"] for s in res["steps"]), rel=0.5)
