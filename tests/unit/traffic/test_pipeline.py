"""Pipeline schedules (GPipe, 1F1B) as data, micro-batches in flight, the bubble formula,
the simulated and the measured bubble of a run with modelled compute, the Gantt chart, and
the stage program over TCP."""
from __future__ import annotations

import pytest

from tests.unit.ranks import loopback_hosts, run_rank_processes, run_ranks
from testbed.traffic.collectives.transport import close_local, local_transports
from testbed.traffic.training.gantt import plot_gantt
from testbed.traffic.training.pipeline import (
    B,
    F,
    PipeOp,
    bubble_fraction,
    gpipe_schedule,
    measured_bubble,
    one_f_one_b_schedule,
    peak_in_flight,
    run_stage,
    simulate_pipeline,
)

REL = 1e-12
BUBBLE_ABS_TOL = 0.06   # measured with sleeps and loopback transfers on a shared 2-core machine
FORWARD_S, BACKWARD_S = 0.02, 0.04


def ops(text: str) -> list[PipeOp]:
    """'F0 F1 B0' -> [PipeOp(F, 0), PipeOp(F, 1), PipeOp(B, 0)]."""
    return [PipeOp(t[0], int(t[1:])) for t in text.split()]


def test_gpipe_and_1f1b_by_hand():
    assert gpipe_schedule(3, 2) == [ops("F0 F1 B0 B1")] * 3
    assert one_f_one_b_schedule(4, 6) == [
        ops("F0 F1 F2 F3 B0 F4 B1 F5 B2 B3 B4 B5"),
        ops("F0 F1 F2 B0 F3 B1 F4 B2 F5 B3 B4 B5"),
        ops("F0 F1 B0 F2 B1 F3 B2 F4 B3 F5 B4 B5"),
        ops("F0 B0 F1 B1 F2 B2 F3 B3 F4 B4 F5 B5"),
    ]
    # fewer micro-batches than stages: the warm-up is cut short
    assert one_f_one_b_schedule(4, 2)[0] == ops("F0 F1 B0 B1")


@pytest.mark.parametrize("stages", [1, 2, 3, 4, 8])
@pytest.mark.parametrize("micro_batches", [1, 2, 3, 4, 8, 16])
def test_every_micro_batch_runs_forward_then_backward_once_per_stage(stages, micro_batches):
    for schedule in (gpipe_schedule(stages, micro_batches), one_f_one_b_schedule(stages, micro_batches)):
        assert len(schedule) == stages
        for stage_ops in schedule:
            assert sorted(stage_ops, key=lambda o: (o.kind, o.micro_batch)) == (
                [PipeOp(B, i) for i in range(micro_batches)] + [PipeOp(F, i) for i in range(micro_batches)])
            for i in range(micro_batches):
                assert stage_ops.index(PipeOp(F, i)) < stage_ops.index(PipeOp(B, i))


@pytest.mark.parametrize("stages", [1, 2, 3, 4, 8])
@pytest.mark.parametrize("micro_batches", [1, 2, 4, 8, 16])
def test_micro_batches_in_flight(stages, micro_batches):
    for s, stage_ops in enumerate(one_f_one_b_schedule(stages, micro_batches)):
        assert peak_in_flight(stage_ops) == min(stages - s, micro_batches) <= stages
    for stage_ops in gpipe_schedule(stages, micro_batches):
        assert peak_in_flight(stage_ops) == micro_batches


@pytest.mark.parametrize(("stages", "micro_batches", "bubble"), [(4, 8, 3 / 11), (2, 2, 1 / 3), (1, 5, 0.0),
                                                                 (8, 32, 7 / 39)])
def test_bubble_formula(stages, micro_batches, bubble):
    assert bubble_fraction(stages, micro_batches) == pytest.approx(bubble, rel=REL)


@pytest.mark.parametrize("stages", [2, 3, 4, 6])
@pytest.mark.parametrize("micro_batches", [1, 3, 8])
def test_simulated_makespan_and_bubble_match_the_formula(stages, micro_batches):
    for schedule in (gpipe_schedule(stages, micro_batches), one_f_one_b_schedule(stages, micro_batches)):
        records = simulate_pipeline(schedule, FORWARD_S, BACKWARD_S)
        assert len(records) == 2 * stages * micro_batches
        makespan = max(r.end_s for r in records)
        assert makespan == pytest.approx((micro_batches + stages - 1) * (FORWARD_S + BACKWARD_S), rel=1e-9)
        assert measured_bubble(records, stages) == pytest.approx(bubble_fraction(stages, micro_batches), rel=1e-9)


def test_simulated_transfer_time_delays_the_pipeline():
    schedule = gpipe_schedule(3, 2)
    slow = simulate_pipeline(schedule, 1.0, 2.0, comm_s=0.5)
    fast = simulate_pipeline(schedule, 1.0, 2.0)
    # the first micro-batch crosses 2 links forward and 2 back, 0.5 s each
    first_b0_stage0 = next(r for r in slow if r.stage == 0 and r.kind == B and r.micro_batch == 0)
    assert first_b0_stage0.start_s == pytest.approx(3 * 1.0 + 3 * 2.0 - 2.0 + 4 * 0.5 + 1.0, rel=REL)
    assert max(r.end_s for r in slow) > max(r.end_s for r in fast)


def test_a_schedule_that_deadlocks_is_refused():
    with pytest.raises(ValueError, match="deadlocks"):
        simulate_pipeline([ops("B0 F0"), ops("F0 B0")], 1.0, 1.0)


@pytest.mark.parametrize("name", ["gpipe", "1f1b"])
def test_measured_bubble_of_a_run_with_modelled_compute(name, tmp_path):
    stages, micro_batches = 4, 6
    schedule = (gpipe_schedule if name == "gpipe" else one_f_one_b_schedule)(stages, micro_batches)
    transports = local_transports(stages)
    try:
        results = run_ranks(stages, lambda r: run_stage(transports[r], schedule[r], FORWARD_S, BACKWARD_S,
                                                        elems=64, seed=2))
    finally:
        close_local(transports)
    records = [rec for recs, _ in results for rec in recs]
    assert [wrong for _, wrong in results] == [0] * stages
    for s in range(stages):
        ran = [(r.kind, r.micro_batch) for r in records if r.stage == s]
        assert ran == [(o.kind, o.micro_batch) for o in schedule[s]]
    assert measured_bubble(records, stages) == pytest.approx(bubble_fraction(stages, micro_batches),
                                                            abs=BUBBLE_ABS_TOL)
    png = tmp_path / "gantt.png"
    plot_gantt(records, png, name)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_pipeline_program_over_tcp(tmp_path):
    stages, micro_batches = 4, 4
    hosts = loopback_hosts(stages)
    png = tmp_path / "gantt.png"
    out = run_rank_processes("testbed.traffic.training.pipeline", stages, lambda r: [
        "--rank", str(r), "--hosts", hosts, "--schedule", "1f1b", "--micro-batches", str(micro_batches),
        "--activation-bytes", "4K", "--forward-ms", "20", "--backward-ms", "40", "--channels", "1",
        "--gantt", str(png)])
    assert [code for code, _ in out] == [0] * stages
    head = out[0][1]
    assert head["verified"] and head["bubble_theory"] == pytest.approx(3 / 7, rel=REL)
    assert head["bubble_measured"] == pytest.approx(3 / 7, abs=BUBBLE_ABS_TOL)
    assert head["peak_in_flight_per_stage"] == [4, 3, 2, 1]
    assert len(head["records"]) == 2 * stages * micro_batches
    assert png.exists()
    assert [res["peak_in_flight"] for _, res in out] == [4, 3, 2, 1]
    for _, res in out:  # each stage measured from its first flush's barrier to the end
        start, end = res["timed_window_monotonic_s"]
        assert start <= min(r["start_s"] for r in head["records"]) and end > start
