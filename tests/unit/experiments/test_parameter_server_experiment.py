"""The parameter-server experiment: parameters and problems, the ports into the servers and
the queue read there, the backlog sampler, the busiest link, a mode's summary and the checks
PASS and FAIL computed by hand, rows and figures, and a short run for real over loopback
(the servers' ports read from a stand-in)."""
from __future__ import annotations

import time

import pytest
from pydantic import ValidationError

import testbed.experiments.parameter_server.backlog as backlog_module
from tests.unit.loopback_fabric import measure_setups
from tests.unit.stand_ins import StandInWatch
from testbed import errors
from testbed.experiments.parameter_server.backlog import BacklogSampler, backlog_stats
from testbed.experiments.parameter_server.experiment import (
    ParameterServerParams,
    busiest_link,
    expected_busiest_ratio,
    ps_summary,
    server_port,
)
from testbed.experiments.registry import load, validate
from testbed.harness.scenario import ScenarioError
from testbed.plan.profiles import QueueConfig
from testbed.plan.training import cost_links

SMALL = {"topology": {"name": "spineleaf", "leaves": 2, "spines": 1, "hosts_per_leaf": 3},
         "link_rate_mbit": 6}


def scenario(**params):
    return validate({"name": "p", "experiment": "parameter-server", **SMALL, "params": params})


def test_params_and_problems():
    p = ParameterServerParams()
    assert (p.servers, p.workers, p.modes, p.model) == (2, 8, ["bsp", "async"], "resnet50")
    with pytest.raises(ValidationError, match="lists a mode twice"):
        ParameterServerParams(modes=["bsp", "bsp"])
    with pytest.raises(ScenarioError, match="workers: 10 servers and workers need 10 hosts; "
                                            "the fabric has 6"):
        scenario()
    with pytest.raises(ScenarioError, match="the AllReduce comparison needs at least 2 workers"):
        scenario(workers=1)
    assert scenario(workers=1, compare_allreduce=False).experiment.params.workers == 1


def test_the_queue_into_a_server_is_its_switch_port():
    exp = scenario(workers=4).experiment
    fabric = exp.fabric()
    assert server_port(fabric, "l0h0") == "l0-eth1" and server_port(fabric, "l1h2") == "l1-eth3"
    assert exp.backlog_handle(None) == "10:"
    assert exp.backlog_handle(QueueConfig(buffer_bytes=100_000)) == "10:"
    classes = QueueConfig(buffer_bytes=100_000, class_queues=True)
    assert exp.backlog_handle(classes) == "20:"  # DSCP 0: best effort, priority 0
    lossless = scenario(workers=4, dscp=26).experiment
    assert lossless.backlog_handle(classes) == "23:"  # the lossless class, priority 3


def test_the_expected_ratio_by_hand():
    # 8 workers each push 102400 B to a server; a ring link carries 2*7/8 * 204800 = 358400 B
    assert expected_busiest_ratio(8, [102400, 102400], 204800) == pytest.approx(819200 / 358400)
    assert expected_busiest_ratio(2, [50, 70], 0) is None


class FakeBacklog:
    """A port whose backlog grows by 1000 B per read; fails from the ``fail_at``-th read."""

    def __init__(self, intf, handle=None, fail_at=None):
        self.intf, self.handle, self.reads, self.fail_at = intf, handle, 0, fail_at
        self.closed = False

    def read(self):
        self.reads += 1
        if self.fail_at is not None and self.reads >= self.fail_at:
            raise errors.TestbedError(f"{self.intf}: no answer for qdisc {self.handle}")
        return 1000 * self.reads

    def close(self):
        self.closed = True


def test_the_backlog_sampler_reads_every_port_until_the_block_ends():
    opened = []

    def open_backlog(intf, handle):
        opened.append(FakeBacklog(intf, handle))
        return opened[-1]

    with BacklogSampler(["s-eth1", "s-eth2"], "10:", 0.005, open_backlog) as sampler:
        time.sleep(0.1)
    assert [p.handle for p in opened] == ["10:", "10:"] and all(p.closed for p in opened)
    n = len(sampler.series["t_s"])
    assert n >= 3 and sampler.error is None
    assert sampler.series["backlog_bytes"]["s-eth1"] == [1000 * (i + 1) for i in range(n)]
    stats = backlog_stats(sampler.series["backlog_bytes"]["s-eth2"])
    assert stats["peak_bytes"] == 1000 * n and stats["samples"] == n
    assert backlog_stats([]) == {"samples": 0, "peak_bytes": 0, "p95_bytes": 0.0,
                                 "mean_bytes": 0.0}
    assert backlog_stats([0, 0, 0, 4000])["mean_bytes"] == 1000.0


def test_a_port_that_stops_answering_ends_the_sampling():
    with BacklogSampler(["s-eth1"], "10:", 0.005,
                        lambda intf, handle: FakeBacklog(intf, handle, fail_at=3)) as sampler:
        time.sleep(0.1)
    assert sampler.series["backlog_bytes"]["s-eth1"] == [1000, 2000]
    assert sampler.error == "s-eth1: no answer for qdisc 10:"


def test_the_busiest_link_over_a_window():
    watch = StandInWatch(rates={"a->b": 2.0, "b->a": 8.0})
    # 8 Mbit/s for 2 s (the stand-in's window: 102 to 104 s less its 100 s offset) = 2 MB
    out = busiest_link(watch, 102.0, 104.0, steps=4)
    assert out["busiest_link"] == "b->a" and out["busiest_link_bytes"] == 2_000_000
    assert out["busiest_link_bytes_per_step"] == 500_000


def test_the_busiest_link_among_some_hosts_links():
    # an uplink carrying two servers' flows is busier than either server's own link
    watch = StandInWatch(rates={"s0->e": 4.0, "e->s0": 3.0, "s1->e": 5.0, "e->a": 8.0})
    assert busiest_link(watch, 102.0, 104.0, steps=1)["busiest_link"] == "e->a"
    out = busiest_link(watch, 102.0, 104.0, steps=1, among={"s0", "s1"})
    assert out["busiest_link"] == "s1->e" and out["busiest_link_bytes"] == 1_250_000


def worker(step_s: list[float], push_pull_s: list[float]) -> dict:
    return {"role": "worker", "verified": True, "tcp_retrans_segs": 2,
            "steps": [{"step_s": s, "push_pull_s": p} for s, p in zip(step_s, push_pull_s)]}


def test_a_modes_summary_by_hand():
    head = {"role": "server", "verified": True, "tcp_retrans_segs": 1, "job_step_s": [1.0, 2.0],
            "wrong_total": 0, "shard_message_bytes": [100, 60], "shard_imbalance": 1.25}
    server = {"role": "server", "verified": True, "tcp_retrans_segs": 0}
    s = ps_summary("bsp", [head, server, worker([1, 2], [0.5, 0.7]), worker([1, 1], [0.3, 0.5])],
                   steps=2)
    assert s["step_s"] == 1.5 and s["push_pull_s"] == pytest.approx(0.5)
    assert s["message_bytes"] == 160 and s["ranks"] == 4 and s["verified_ranks"] == 4
    assert s["verified"] and s["tcp_retransmits"] == 5


def phases(bsp_peak: int, bsp_bytes: float, ar_bytes: float, ar_step: float,
           verified=True) -> dict:
    port = {"server": "h0", "peak_bytes": bsp_peak, "p95_bytes": bsp_peak / 2,
            "mean_bytes": 1.0, "drops": 0}
    common = {"ranks": 10, "verified": verified, "verified_ranks": 10 if verified else 9,
              "wrong_total": 0 if verified else 4, "tcp_retransmits": 0,
              "busiest_link": "e->h0"}
    return {"bsp": {**common, "mode": "bsp", "step_s": 1.0, "server_ports": {"e-eth1": port},
                    "shard_message_bytes": [102400, 102400],
                    "busiest_link_bytes_per_step": bsp_bytes},
            "allreduce": {**common, "mode": "allreduce", "step_s": ar_step,
                          "message_bytes": 204800, "busiest_link_bytes_per_step": ar_bytes}}


def outcomes(exp, phase_results) -> dict:
    r = {"fabric": {"servers": ["h0", "h1"], "workers": [f"w{i}" for i in range(8)],
                    "mtu_bytes": 9000, "phases": phase_results}}
    return {c.name: c.outcome for c in exp.checks(r)}


def test_checks_pass_by_hand():
    exp = scenario(workers=4, modes=["bsp"]).experiment
    # peak 20000 B >= 2 frames of 9000; 860160 / 358400 = 2.4 against 2.29 (+-25%); 0.5 < 1.0 s
    assert outcomes(exp, phases(20000, 860160, 358400, 0.5)) == {
        "bsp: data verified": "PASS", "allreduce: data verified": "PASS",
        "bsp: incast queue at the servers' ports": "PASS",
        "busiest server link bytes / busiest AllReduce link bytes": "PASS",
        "AllReduce steps faster than the parameter server": "PASS"}


def test_checks_fail_by_hand():
    exp = scenario(workers=4, modes=["bsp"]).experiment
    # peak 1000 B < 18000; ratio 1.0 far from 2.29; AllReduce 1.5 s slower than 1.0 s
    assert set(outcomes(exp, phases(1000, 358400, 358400, 1.5, verified=False)).values()) == {
        "FAIL"}


def test_rows_and_figures(tmp_path):
    exp = scenario(workers=4, modes=["bsp"]).experiment
    r = {"fabric": {"servers": ["h0", "h1"], "workers": ["w0", "w1"], "mtu_bytes": 9000,
                    "phases": phases(20000, 860160, 358400, 0.5), "dir": str(tmp_path)}}
    (tmp_path / "backlog-bsp.json").write_text(
        '{"t_s": [0.0, 0.01, 0.02], "backlog_bytes": {"e-eth1": [0, 9000, 18000]}}')
    rows = exp.rows(r)
    assert rows[0] == ("servers, workers", "h0, h1; w0, w1")
    assert "e-eth1 peak 20000 B (p95 10000 B), 0 drops" in rows[1][1]
    paths = exp.plots(r, tmp_path, "run | spineleaf | 6 Mbit/s")
    assert [p.name for p in paths] == ["server_backlog.png", "ps_vs_allreduce.png"]
    assert all(p.stat().st_size > 10_000 for p in paths)


def test_the_bundled_scenario():
    resolved = load("parameter-server")
    hosts = resolved.experiment.params.servers + resolved.experiment.params.workers
    assert hosts <= len(resolved.setups[0].fabric.hosts)


def test_a_short_run_over_loopback(tmp_path, monkeypatch):
    monkeypatch.setattr(backlog_module, "PortBacklog", FakeBacklog)
    resolved = validate({"name": "p", "experiment": "parameter-server", **SMALL, "params": {
        "servers": 2, "workers": 4, "steps": 2, "compute_ms": 10, "scale": 0.0005}})
    results = measure_setups(resolved, tmp_path)
    r = results["fabric"]
    assert r["servers"] == ["l0h0", "l0h1"] and r["server_ports"] == ["l0-eth1", "l0-eth2"]
    assert list(r["phases"]) == ["bsp", "async", "allreduce"]
    for name, phase in r["phases"].items():
        assert phase["verified"], name
    assert r["phases"]["bsp"]["server_ports"]["l0-eth1"]["peak_bytes"] > 0
    assert (tmp_path / "fabric" / "backlog-async.json").exists()
    checks = {c.name: c.outcome for c in resolved.experiment.checks(results)}
    assert checks["bsp: data verified"] == checks["allreduce: data verified"] == "PASS"


def test_the_ranks_arguments():
    exp = scenario(workers=4, modes=["async"], compute_ms=60, dscp=26).experiment
    assert exp.ps_args("async") == ["--servers", "2", "--mode", "async", "--model", "resnet50",
                                    "--scale", "0.002", "--steps", "3", "--compute-ms", "60.0",
                                    "--seed", "1", "--channels", "1", "--dscp", "26"]
    fabric = exp.fabric()
    args = exp.allreduce_args(cost_links(fabric, ["l0h2", "l1h0"]))
    # the same 60 ms of compute per step, a third forward and two thirds backward
    assert args[:10] == ["--model", "resnet50", "--scale", "0.002", "--steps", "3",
                         "--warmup-steps", "0", "--forward-ms", "20.0"]
    assert args[10:12] == ["--backward-ms", "40.0"]
    assert args[args.index("--dscp") + 1] == "26"
