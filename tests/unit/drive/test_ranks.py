"""Rank programs on a running setup (testbed.drive.ranks): their command lines, starting
them with output in files, following rank 0's progress, collecting their JSON, the errors
that name a failed rank, and the watch that adds the generators' CPU to the verdict. Real
processes run here; the network is a stand-in that starts them locally."""
from __future__ import annotations

import json
import signal
import subprocess
import sys
import time

import pytest

from tests.unit.stand_ins import StandInFabric, StandInRun
from testbed import errors
from testbed.harness.progress import Progress
from testbed.drive.ranks import (
    Launch,
    RankWatch,
    all_ranks_window,
    casualty,
    collect_ranks,
    host_problems,
    launches,
    parse_rank_output,
    rank_argv,
    run_ranks,
    start_ranks,
    unfinished,
    window_of,
)
from testbed.measure.generators import GeneratorCpu
from testbed.model.topology.line import line


def local_fabric(fabric=None) -> StandInFabric:
    """The stand-in fabric starting every host's program here (it keeps what was asked)."""
    return StandInFabric(fabric or line(2, 10.0),
                         start=lambda host, argv, kwargs: subprocess.Popen(argv, **kwargs))


def program(rank: int, body: str = "", out: dict | None = None) -> list[str]:
    """A rank that reports two progress lines (rank 0), runs ``body`` and prints ``out``."""
    result = out if out is not None else {"rank": rank, "verified": True,
                                          "timed_window_monotonic_s": [1.0 + rank, 5.0 + rank]}
    code = ("import json, sys\n"
            + ("".join(f"print('progress ' + json.dumps({{'done': {i}, 'of': 2}}), "
                       f"file=sys.stderr, flush=True)\n" for i in (1, 2)) if rank == 0 else "")
            + body + f"print(json.dumps({result!r}))\n")
    return [sys.executable, "-c", code]


def test_a_rank_command_line():
    assert rank_argv("testbed.traffic.training.ddp", 2, ["10.0.0.2", "10.0.0.3"], 29501,
                     ["--steps", 3]) == [
        sys.executable, "-m", "testbed.traffic.training.ddp", "--rank", "2", "--hosts",
        "10.0.0.2,10.0.0.3", "--port", "29501", "--steps", "3"]
    ranks = launches("m", ["h0", "h1"], ["10.0.0.2", "10.0.0.3"], ["-x"])
    assert [r.host for r in ranks] == ["h0", "h1"]
    assert [r.argv[4] for r in ranks] == ["0", "1"] and ranks[1].argv[-1] == "-x"
    assert ranks[0].env is None


def test_outputs_that_are_errors_name_the_rank():
    assert parse_rank_output('noise\n{"rank": 1}\n', 1, 0, "") == {"rank": 1}
    assert parse_rank_output('{"rank": 1, "verified": false}', 1, 1, "")["verified"] is False
    with pytest.raises(errors.TestbedError, match=r"rank 3 failed \(exit 2\): Traceback"):
        parse_rank_output('{"rank": 3}', 3, 2, "Traceback")
    with pytest.raises(errors.TestbedError, match=r"rank 0 failed \(exit 0\)"):
        parse_rank_output("  \n", 0, 0, "")
    with pytest.raises(errors.TestbedError, match="rank 2 failed: ValueError: no"):
        parse_rank_output('{"error": "ValueError: no", "verified": false}', 2, 1, "")
    with pytest.raises(errors.TestbedError, match="rank 1 printed no JSON object"):
        parse_rank_output("hello", 1, 0, "")


def test_ranks_run_with_their_output_in_files_and_rank0s_progress_followed(tmp_path):
    net = local_fabric()
    logged = []
    procs = start_ranks(net, [Launch("h0", program(0)), Launch("h1", program(1), {"X": "1"})],
                        tmp_path, prefix="ar-rank")
    results = collect_ranks(procs, tmp_path, Progress(logged.append, live=False), 2, "steps",
                            "ar-rank")
    assert [r["rank"] for r in results] == [0, 1]
    assert json.loads((tmp_path / "ar-rank1.json").read_text())["rank"] == 1
    assert "progress" in (tmp_path / "ar-rank0.err").read_text()
    assert any(line.startswith("steps: 2/2") for line in logged)
    assert net.envs[1]["X"] == "1" and "PATH" in net.envs[1]  # added to the env
    assert net.envs[0] is None


def test_piped_output_is_kept_in_the_file_too(tmp_path):
    (tmp_path / "rank0.err").write_text("")
    proc = subprocess.Popen(program(0, out={"rank": 0}), stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL)
    assert collect_ranks([proc], tmp_path, Progress(lambda m: None, live=False)) == [{"rank": 0}]
    assert json.loads((tmp_path / "rank0.json").read_text()) == {"rank": 0}


def test_a_failed_rank_is_an_error_with_its_message(tmp_path):
    net = local_fabric()
    procs = start_ranks(net, [Launch("h0", program(0)),
                              Launch("h1", program(1, "raise SystemExit('broken link')\n"))],
                        tmp_path)
    with pytest.raises(errors.TestbedError, match=r"rank 1 failed \(exit 1\): broken link"):
        collect_ranks(procs, tmp_path, Progress(lambda m: None, live=False))


def test_a_rank_that_outlives_its_time_is_killed(tmp_path):
    net = local_fabric()
    procs = start_ranks(net, [Launch("h0", program(0)),
                              Launch("h1", program(1, "import time; time.sleep(60)\n"))],
                        tmp_path)
    t0 = time.monotonic()
    with pytest.raises(errors.TestbedError, match=r"ranks \[1\] did not finish in 1 s"):
        collect_ranks(procs, tmp_path, Progress(lambda m: None, live=False), timeout_s=1.0)
    assert time.monotonic() - t0 < 10
    assert procs[1].poll() is not None  # killed, not left behind


def test_the_rank_killed_from_outside_is_named_before_the_peers_it_broke():
    # rank 2 was SIGKILLed; ranks 0 and 1 then failed on their broken connections (exit 1)
    assert casualty([1, 1, -9, None]) == 2
    assert casualty([0, 0, 0]) is None and casualty([1, None]) is None


def test_a_stopped_rank_is_named_as_stopped_at_the_deadline():
    assert unfinished("AllReduce iterations", {3: "S", 5: "T", 6: "S"}, 30.0) == (
        "AllReduce iterations: rank 5 was stopped (SIGSTOP) and it and 2 others did not "
        "finish in 30 s")
    assert unfinished("steps", {5: "T"}, 30.0) == (
        "steps: rank 5 was stopped (SIGSTOP) and it did not finish in 30 s")
    assert unfinished("steps", {1: "S", 2: "R"}, 9.0) == "steps: ranks [1, 2] did not finish in 9 s"


def test_a_rank_killed_mid_run_is_the_error(tmp_path):
    net = local_fabric()
    procs = start_ranks(net, [Launch("h0", program(0, "import time; time.sleep(60)\n")),
                              Launch("h1", program(1, "import time; time.sleep(60)\n"))],
                        tmp_path)
    time.sleep(0.2)
    procs[1].send_signal(signal.SIGKILL)  # what a failure schedule's kill does
    procs[1].wait()
    t0 = time.monotonic()
    with pytest.raises(errors.TestbedError, match=r"^steps: rank 1 died: killed by SIGKILL$"):
        collect_ranks(procs, tmp_path, Progress(lambda m: None, live=False), what="steps",
                      timeout_s=30.0)
    assert time.monotonic() - t0 < 10  # at once, not at the deadline
    assert procs[0].poll() is not None  # the survivor waiting for it was killed, not left


def test_a_stopped_rank_fails_the_run_at_its_timeout_named(tmp_path):
    net = local_fabric()
    procs = start_ranks(net, [Launch("h0", program(0)),
                              Launch("h1", program(1, "import time; time.sleep(60)\n"))],
                        tmp_path)
    procs[1].send_signal(signal.SIGSTOP)
    t0 = time.monotonic()
    with pytest.raises(errors.TestbedError, match=r"rank 1 was stopped \(SIGSTOP\) and it did "
                                                  r"not finish in 1 s"):
        collect_ranks(procs, tmp_path, Progress(lambda m: None, live=False), what="steps",
                      timeout_s=1.0)
    assert time.monotonic() - t0 < 10
    assert procs[1].poll() is not None  # SIGKILL ends a stopped process too


def test_windows_span_every_rank():
    assert window_of([{"timed_window_monotonic_s": [2.0, 4.0]},
                      {"timed_window_monotonic_s": [1.5, 3.0]}]) == [1.5, 4.0]
    assert window_of([{"timed_window_monotonic_s": [None, 3.0]}, {}]) is None


def test_the_all_ranks_window_is_where_every_rank_was_timing():
    # a rank that started early (no warm-up) does not stretch the judged window
    assert all_ranks_window([{"timed_window_monotonic_s": [1.0, 4.0]},
                             {"timed_window_monotonic_s": [1.6, 4.2]}]) == [1.6, 4.0]
    # windows that never overlap: their span
    assert all_ranks_window([{"timed_window_monotonic_s": [1.0, 2.0]},
                             {"timed_window_monotonic_s": [3.0, 4.0]}]) == [1.0, 4.0]
    assert all_ranks_window([{}]) is None


def test_run_ranks_watches_each_rank_over_its_window(tmp_path):
    run = StandInRun(local_fabric(), None, tmp_path)
    with GeneratorCpu(interval_s=0.05) as cpu:
        results = run_ranks(run, [Launch("h0", program(0)), Launch("h1", program(1))], "job",
                            prefix="j-rank", cpu=cpu)
    assert len(results) == 2
    assert set(cpu.pids) == {"j-rank0", "j-rank1"}
    assert cpu.windows == {"j-rank0": (1.0, 5.0), "j-rank1": (2.0, 6.0)}


def test_the_rank_watch_adds_the_generators_to_the_verdict(tmp_path):
    run = StandInRun(local_fabric(), None, tmp_path)
    run.net.fabric = line(2, 10.0)
    with RankWatch(run) as watch:
        watch.run_ranks([Launch("h0", program(0, out={"rank": 0}))], "job")
    fidelity = watch.fidelity([101.0, 102.0], bandwidth_bound=True)
    assert run.watched.asked == ((1.0, 2.0), None, True)  # the window, in sampler seconds
    assert "generators" in fidelity and fidelity["trustworthy"] is True
    assert watch.fidelity()["trustworthy"] is True and run.watched.asked[0] is None


def test_more_ranks_than_hosts_is_a_problem_on_the_field():
    fabric = line(2, 10.0)  # 2 hosts
    assert host_problems(fabric, "world", 2) == []
    [problem] = host_problems(fabric, "stages", 3, "stages")
    assert problem.path == ("params", "stages")
    assert problem.message == "3 stages need 3 hosts; the fabric has 2"
