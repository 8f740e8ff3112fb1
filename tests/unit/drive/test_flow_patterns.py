"""Long-flow patterns summarised (testbed.measure.patterns) and run (testbed.drive.flows
.run_pattern with iperf3 replaced): host pairs by name, the received aggregate over the host
links, the measured window, the worst window's fidelity, failed flows as trust checks, the
summary rows and the grouped-bar figure."""
from __future__ import annotations

import pytest

import testbed.drive.flows as flows
from testbed.drive.flows import SERVER_START_S, flow_window, run_pattern
from testbed.measure.fidelity import (
    MAX_CPU_BUSY_FRACTION,
    MIN_LINK_DELIVERY_FRACTION,
    judge,
)
from testbed.measure.patterns import (
    PatternResult,
    completion_checks,
    fraction_of_capacity,
    fraction_row,
    fractions,
    fractions_percent,
    host_pairs,
    plot_grouped_bars,
    run_window,
    worst_verdict,
)
from testbed.model.topology.fattree import fat_tree

PNG_MAGIC = b"\x89PNG"


def test_host_pairs_name_the_fabric_hosts_in_order():
    fabric = fat_tree(4)
    pairs = host_pairs(fabric, "stride4")
    assert pairs[0] == ("p0e0h0", "p1e0h0") and pairs[15] == ("p3e1h1", "p0e1h1")
    assert host_pairs(fabric, "random", seed=5) == host_pairs(fabric, "random", seed=5)
    assert host_pairs(fabric, "random", seed=5) != host_pairs(fabric, "random", seed=6)
    with pytest.raises(ValueError, match="bogus"):
        host_pairs(fabric, "bogus")


def test_fraction_of_capacity_is_the_aggregate_over_the_senders_links():
    # 4 flows at 10 Mbit/s host links: (9 + 8 + 5 + 0) / 40
    assert fraction_of_capacity([9.0, 8.0, 5.0, 0.0], 10.0) == pytest.approx(0.55)
    assert fraction_of_capacity([], 10.0) == 0.0


def test_run_pattern_summarises_what_iperf3_received(monkeypatch):
    pairs = [("a", "b"), ("b", "a")]
    calls = []

    def fake_run_flows(net, given, seconds, omit_s, streams=1, tos=0):
        calls.append((net, given, seconds, omit_s, streams))
        return [6.0, 2.0], ["b -> a: the connection timed out"]

    monkeypatch.setattr(flows, "run_flows", fake_run_flows)
    monkeypatch.setattr(flows.time, "monotonic", lambda: 100.0)
    r = run_pattern("net", "stride1", pairs, seconds=4, omit_s=1, host_rate_mbit=10.0,
                    streams=3)
    assert calls == [("net", pairs, 4, 1, 3)]
    assert r.fraction_of_capacity == pytest.approx(0.4)
    assert r.errors == ["b -> a: the connection timed out"]
    assert r.window_monotonic_s == (100.0 + SERVER_START_S + 1, 100.0 + SERVER_START_S + 5)
    d = r.to_dict()
    assert d["pairs"] == [["a", "b"], ["b", "a"]] and d["fraction_of_capacity"] == 0.4


def test_the_window_starts_after_the_servers_head_start_and_the_omitted_start_up():
    assert flow_window(10.0, seconds=6, omit_s=2) == (10.0 + SERVER_START_S + 2,
                                                      10.0 + SERVER_START_S + 8)
    assert run_window([(3.0, 5.0), (1.0, 2.0), (6.0, 9.0)]) == [1.0, 9.0]
    assert run_window([]) == []


def test_the_worst_window_decides_the_fidelity_verdict():
    good = judge(0.50, 0.9, 0.97, 0.001)
    busy = judge(0.97, 1.0, 0.95, 0.001)
    slow = judge(0.40, 0.8, 0.80, 0.001)
    assert good.trustworthy and not busy.trustworthy and not slow.trustworthy
    worst = worst_verdict([good, slow], "ecmp")
    assert (worst.cpu_busy_fraction, worst.link_delivery_fraction) == (0.50, 0.80)
    assert not worst.trustworthy and 0.80 < MIN_LINK_DELIVERY_FRACTION
    assert [c.outcome for c in worst.checks] == ["PASS", "PASS", "FAIL"]
    assert {c.setup for c in worst.checks} == {"ecmp"}
    worst = worst_verdict([good, busy])
    assert worst.cpu_busy_fraction == 0.97 > MAX_CPU_BUSY_FRACTION
    assert [c.outcome for c in worst.checks] == ["FAIL", "PASS", "PASS"]
    assert worst_verdict([good, judge(0.6, 0.9, 0.99, 0.001)]).trustworthy


def result(fraction: float, errors=()) -> dict:
    return {"patterns": {"stride4": PatternResult("stride4", [], [], fraction,
                                                  list(errors)).to_dict()}}


def test_failed_flows_fail_a_trust_check_per_setup():
    results = {"ecmp": result(0.5), "single": result(0.25, ["h1 -> h2: refused"]),
               "broken": {"dir": "x"}}  # a setup that measured nothing is left out
    checks = completion_checks(results, {"ecmp": ["spread: h3 -> h4: reset"]})
    assert [(c.setup, c.measured, c.outcome) for c in checks] == [
        ("ecmp", 1, "FAIL"), ("single", 1, "FAIL")]
    assert "h1 -> h2: refused" in checks[1].statement
    assert [c.outcome for c in completion_checks({"ecmp": result(0.5)})] == ["PASS"]


def test_fractions_and_their_row():
    table = fractions({"ecmp": result(0.4312), "nonblocking": result(0.984), "x": {"dir": "d"}})
    assert table == {"ecmp": {"stride4": 0.4312}, "nonblocking": {"stride4": 0.984}}
    labels = {"nonblocking": "non-blocking", "ecmp": "ECMP", "single": "single-path"}
    assert fraction_row(table, "stride4", labels) == ("non-blocking 98.4%, ECMP 43.1%, "
                                                      "single-path -")
    percent = fractions_percent(table, labels)
    assert list(percent) == ["non-blocking", "ECMP"]  # in the labels' order, measured only
    assert percent["ECMP"]["stride4"] == pytest.approx(43.12)


def test_the_grouped_bar_figure_is_written(tmp_path):
    path = plot_grouped_bars({"a": {"p1": 50.0, "p2": 30.0}, "b": {"p1": 90.0}}, "pattern",
                             "%", "run | fabric | 10 Mbit/s", tmp_path / "bars.png",
                             marks={("a", "p1"): 33.0}, mark_label="model", ylim=(0, 110))
    assert path.read_bytes()[:4] == PNG_MAGIC
