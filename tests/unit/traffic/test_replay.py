"""Traces: pairing sends with receives, the JSON-lines round trip, replay with the original
timing and per-pair order, record-then-replay of a real collective, and the replay program
over TCP on a trace the DDP program recorded."""
from __future__ import annotations

import numpy as np
import pytest

from tests.unit.ranks import loopback_hosts, run_rank_processes, run_ranks
from testbed.traffic.collectives.algorithms import ring_allreduce
from testbed.traffic.collectives.executor import Executor, plan_rank
from testbed.traffic.collectives.transport import RecordingTransport, close_local, local_transports
from testbed.traffic.training.replay import (
    TraceMessage,
    compare,
    load_trace,
    merge_events,
    pair_order,
    read_json_lines,
    replay,
    write_rank_events,
    write_trace,
)

REL = 1e-12
TIMING_TOL_S = 0.05       # a replayed send may start this late on a shared machine
COMPLETION_RATIO = (0.5, 3.0)  # replayed / recorded completion of a short in-process trace


def event(kind, t, src, dst, size, tag=""):
    return {"event": kind, "t_s": t, "src": src, "dst": dst, "bytes": size, "tag": tag}


def test_merge_pairs_the_kth_send_with_the_kth_receive():
    events = [event("send", 10.0, 0, 1, 8, "a"), event("send", 10.5, 0, 1, 4, "b"),
              event("recv", 10.2, 0, 1, 8, "a"), event("recv", 10.9, 0, 1, 4, "b"),
              event("send", 10.1, 1, 0, 2), event("recv", 10.3, 1, 0, 2)]
    assert merge_events(events) == [
        TraceMessage(0.0, 0, 1, 8, "a", pytest.approx(0.2)),
        TraceMessage(pytest.approx(0.1), 1, 0, 2, "", pytest.approx(0.3)),
        TraceMessage(0.5, 0, 1, 4, "b", pytest.approx(0.9)),
    ]
    with pytest.raises(ValueError, match="sent 8 bytes, received 4"):
        merge_events([event("send", 0, 0, 1, 8), event("recv", 1, 0, 1, 4)])


def test_trace_round_trip(tmp_path):
    messages = [TraceMessage(0.0, 0, 1, 100, "x", 0.01), TraceMessage(0.02, 1, 0, 5, "y", None)]
    path = tmp_path / "trace.jsonl"
    write_trace(path, messages)
    assert len(read_json_lines([path])) == 2
    assert load_trace([path]) == messages


def test_pair_order_keeps_send_order_per_pair():
    messages = [TraceMessage(0.3, 0, 1, 1), TraceMessage(0.1, 0, 1, 1), TraceMessage(0.2, 1, 0, 1)]
    assert pair_order(messages) == {(0, 1): [1, 0], (1, 0): [2]}


def test_replay_keeps_timing_and_content():
    messages = [TraceMessage(0.00, 0, 1, 1000), TraceMessage(0.05, 1, 2, 20_000),
                TraceMessage(0.10, 2, 0, 7), TraceMessage(0.10, 0, 1, 300_000),
                TraceMessage(0.15, 1, 0, 0)]
    transports = local_transports(3)
    try:
        results = run_ranks(3, lambda r: replay(transports[r], messages))
    finally:
        close_local(transports)
    done = {i: t for res in results for i, t in res["done"].items()}
    assert sorted(done) == [0, 1, 2, 3]  # the empty message 4 has no arrival to time
    assert all(not res["corrupt"] for res in results)
    for i in done:
        assert done[i] >= messages[i].t_s
    for res in results:
        assert all(0 <= lateness < TIMING_TOL_S for lateness in res["sent"].values())
    assert done[3] > done[0]  # same pair: in order


def test_record_then_replay_a_ring_allreduce(tmp_path):
    world, n = 3, 30_000
    schedule = ring_allreduce(world, n)
    transports = local_transports(world)
    recorders = [RecordingTransport(t, origin_s=0.0) for t in transports]

    def workload(rank):
        buf = np.ones(n, dtype=np.float32)
        with Executor(recorders[rank]) as executor:
            executor.run(plan_rank(schedule, rank, 1000), buf)
        assert np.all(buf == world)

    try:
        run_ranks(world, workload)
    finally:
        close_local(transports)
    paths = []
    for r, rec in enumerate(recorders):
        paths.append(tmp_path / f"rank{r}.jsonl")
        write_rank_events(paths[-1], rec)
    messages = load_trace(paths)
    assert len(messages) == sum(1 for tr in schedule.transfers()) * 10  # 10 slices per chunk
    assert all(m.done_s is not None and m.done_s >= m.t_s for m in messages)
    assert sum(m.bytes for m in messages) == 2 * (world - 1) * n * 4
    transports = local_transports(world)
    try:
        results = run_ranks(world, lambda r: replay(transports[r], messages))
    finally:
        close_local(transports)
    result = compare(messages, {i: t for res in results for i, t in res["done"].items()})
    assert result["compared"] == len(messages)
    low, high = COMPLETION_RATIO
    assert low <= result["completion_ratio"] <= high


def test_replay_program_over_tcp_on_a_ddp_trace(tmp_path):
    world = 2
    hosts = loopback_hosts(world)
    traces = [tmp_path / f"rank{r}.jsonl" for r in range(world)]
    out = run_rank_processes("testbed.traffic.training.ddp", world, lambda r: [
        "--rank", str(r), "--hosts", hosts, "--scale", "0.001", "--steps", "1", "--warmup-steps", "0",
        "--forward-ms", "10", "--backward-ms", "20", "--channels", "1", "--link-rate-mbit", "1000",
        "--trace-out", str(tmp_path / "rank{rank}.jsonl")])
    assert [code for code, _ in out] == [0] * world
    messages = load_trace(traces)
    assert messages and all(m.tag.startswith("step0/bucket") for m in messages)
    hosts = loopback_hosts(world)
    merged = tmp_path / "merged.jsonl"
    out = run_rank_processes("testbed.traffic.training.replay", world, lambda r: [
        "--rank", str(r), "--hosts", hosts, "--channels", "1", "--trace", *map(str, traces),
        "--write-merged", str(merged)])
    assert [code for code, _ in out] == [0] * world
    head = out[0][1]
    assert head["verified"] and head["corrupt_total"] == 0
    assert head["comparison"]["compared"] == len(messages)
    # the last message may land at another rank, after rank 0's own window closed
    start = head["timed_window_monotonic_s"][0]
    end = max(result["timed_window_monotonic_s"][1] for _, result in out)
    assert end - start >= head["comparison"]["replayed_completion_s"]
    assert load_trace([merged]) == messages
