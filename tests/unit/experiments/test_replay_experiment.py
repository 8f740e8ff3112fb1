"""The replay experiment: its two fabrics, the recording ranks' arguments and the pcap
sample's command line, the checks PASS and FAIL computed by hand, rows and the figure, and
a workload recorded, merged and replayed on both fabrics over loopback."""
from __future__ import annotations

import pytest

import testbed.experiments.replay.experiment as replay_module
from tests.unit.loopback_fabric import LoopbackRun, measure_setups
from testbed.capabilities import Capability
from testbed.experiments.replay.experiment import completion_stretch, rank_trace_path
from testbed.experiments.registry import load, validate
from testbed.harness.scenario import ScenarioError
from testbed.plan.training import cost_links
from testbed.traffic.training.replay import load_trace

SMALL = {"topology": {"name": "spineleaf", "leaves": 2, "spines": 1, "hosts_per_leaf": 2},
         "link_rate_mbit": 6}


def scenario(**params):
    return validate({"name": "r", "experiment": "replay", **SMALL, "params": params})


def test_the_recording_and_the_replay_fabric():
    resolved = load("replay")
    record, replay = resolved.setups
    assert (record.name, replay.name) == ("record", "replay")
    assert record.fabric.kind == "fattree" and len(record.fabric.hosts) == 16
    assert replay.fabric.label() == "spineleaf leaves=2 spines=1 hosts_per_leaf=2"
    rates = {(link.a, link.b): link.rate_mbit for link in replay.fabric.links}
    assert rates[("l0h0", "l0")] == 6.0 and rates[("l0", "s0")] == 3.0  # uplinks at half
    wide = validate({"name": "r", "experiment": "replay", "params": {"world": 5}})
    assert len(wide.setups[1].fabric.hosts) == 6  # ceil(5 / 2) hosts per leaf


def test_problems(monkeypatch):
    with pytest.raises(ScenarioError, match="world: 5 ranks need 5 hosts; the fabric has 4"):
        scenario(world=5)
    with pytest.raises(ScenarioError, match="routing: replay sets this itself"):
        validate({"name": "r", "experiment": "replay", "routing": "single"})
    monkeypatch.setattr(replay_module, "missing_capabilities", lambda caps, names: [
        Capability("tcpdump", False, "not on PATH")])
    with pytest.raises(ScenarioError, match="capture_packets: needs tcpdump, which this machine "
                                            r"lacks \(not on PATH"):
        scenario(capture_packets=10)
    assert scenario(capture_packets=0).experiment.params.capture_packets == 0


def test_the_recording_ranks_and_the_pcap_sample(tmp_path):
    resolved = scenario(capture_packets=300)
    exp = resolved.experiment
    fabric = resolved.setups[0].fabric
    assert rank_trace_path(tmp_path).endswith("trace-rank{rank}.jsonl")
    args = exp.ddp_args(tmp_path, cost_links(fabric, ["l0h0", "l1h0"]))
    assert args[args.index("--trace-out") + 1] == str(tmp_path / "trace-rank{rank}.jsonl")
    assert args[args.index("--warmup-steps") + 1] == "0"  # every step is in the trace
    run = LoopbackRun(fabric, tmp_path, "record")
    capture = exp.capture(run, "l0h0")
    assert capture.argv == ["tcpdump", "-i", "l0h0-eth0", "-U", "-w",
                            str((tmp_path / "record.pcap").absolute()), "-c", "300", "-s", "128",
                            "tcp"]
    assert capture.host == "l0h0" and capture.log_path == tmp_path / "record-capture.log"


def comparison(recorded: float, replayed: float, corrupt: int = 0) -> dict:
    return {"messages": 40, "compared": 40, "recorded_completion_s": recorded,
            "replayed_completion_s": replayed, "completion_ratio": replayed / recorded,
            "mean_delta_s": 0.01, "max_delta_s": 0.02, "corrupt_total": corrupt,
            "verified": corrupt == 0, "hosts": ["a", "b"]}


def results(same: float, other: float, corrupt: int = 0, verified=True) -> dict:
    recording = {"hosts": ["a", "b"], "step_s": 0.5, "verified": verified,
                 "verified_ranks": 4 if verified else 2, "messages": 40, "bytes": 1000,
                 "trace": "t.jsonl"}
    return {"record": {"recording": recording, "replay": comparison(1.0, same)},
            "replay": {"replay": comparison(1.0, other, corrupt)}}


def test_checks_pass_by_hand():
    exp = scenario().experiment
    # same fabric: 1.1 s for 1.0 s recorded, within 25%; the other: 2.0 / 1.1 = 1.82 >= 1.2
    checks = exp.checks(results(1.1, 2.0))
    assert [(c.name, c.setup, c.outcome) for c in checks] == [
        ("recorded workload verified", "record", "PASS"),
        ("every replayed message arrived intact", "record", "PASS"),
        ("every replayed message arrived intact", "replay", "PASS"),
        ("replay / recording completion on the same fabric", "record", "PASS"),
        ("replay fabric / recording fabric completion", "replay", "PASS")]
    assert completion_stretch(results(1.1, 2.0)) == pytest.approx(2.0 / 1.1)


def test_checks_fail_by_hand():
    exp = scenario().experiment
    # 1.5 s for 1.0 s: 50% off; the other fabric 1.5 / 1.5 = 1.0 < 1.2; 2 corrupt messages
    checks = exp.checks(results(1.5, 1.5, corrupt=2, verified=False))
    assert [c.outcome for c in checks] == ["FAIL", "PASS", "FAIL", "FAIL", "FAIL"]
    only = exp.checks({"replay": results(1.1, 2.0)["replay"]})
    assert [c.outcome for c in only] == ["PASS", "n/a"]  # no recording to compare with


def test_rows_and_the_figure(tmp_path):
    exp = scenario().experiment
    r = results(1.1, 2.0)
    rows = dict(exp.rows(r))
    assert rows["recording"] == "40 messages, 1000 B on a, b, step 0.500 s"
    assert rows["completion, replay fabric / recording fabric"] == "1.82"
    assert rows["replay on replay"].startswith("40 messages: recorded completion 1.000 s, "
                                               "replayed 2.000 s (x2.00)")
    [path] = exp.plots(r, tmp_path, "run | fattree / spineleaf | 6 Mbit/s")
    assert path.name == "completion.png" and path.stat().st_size > 10_000


def test_record_and_replay_over_loopback(tmp_path):
    resolved = scenario(steps=1, scale=0.0005, forward_ms=5, backward_ms=10)
    results_ = measure_setups(resolved, tmp_path)
    rec = results_["record"]["recording"]
    assert rec["verified"] and rec["messages"] > 0
    merged = load_trace([tmp_path / "record" / "trace.jsonl"])
    assert len(merged) == rec["messages"] and sum(m.bytes for m in merged) == rec["bytes"]
    for name in ("record", "replay"):
        replay = results_[name]["replay"]
        assert replay["verified"] and replay["compared"] == rec["messages"], name
    assert results_["replay"]["replay"]["hosts"] == ["l0h0", "l0h1", "l1h0", "l1h1"]
    outcomes = [c.outcome for c in resolved.experiment.checks(results_)]
    assert outcomes[:3] == ["PASS", "PASS", "PASS"]
