"""The hedera experiment's pure parts: its parameters and old flags, its three setups, what
``measure`` returns from (faked) flows and watch, and every check and trust check on
synthetic fractions computed by hand, the published ratios beside ours, rows and plots."""
from __future__ import annotations

import pytest
from pydantic import ValidationError
from tests.unit.stand_ins import StandInFabric, StandInRun, StandInWatch

import testbed.experiments.hedera.experiment as hedera
import testbed.cli
import testbed.harness.run
from testbed.cli import main
from testbed.experiments.hedera.experiment import (
    ECMP_GAIN_MIN,
    JAIN_MIN_ECMP,
    NONBLOCKING_MIN_FRACTION,
    ORDERING_SLACK,
    PUBLISHED_MBIT,
    SINGLE_PATH_SHARE_MIN,
    SPREAD_FLOWS,
    SPREAD_STREAMS,
    HederaParams,
    published_ratio,
    spread_pairs,
    spread_summary,
    uplinks,
)
from testbed.harness.run import Outcome
from testbed.experiments.registry import load, validate
from testbed.measure.patterns import PatternResult
from testbed.model.topology.fattree import fat_tree
from testbed.model.verdict import Verdict

PNG_MAGIC = b"\x89PNG"
SPREAD = {"edge": "p0e0", "uplinks": ["p0e0->p0a0", "p0e0->p0a1"], "flows": 64,
          "flow_mbit_total": 19.0, "errors": []}


def experiment(**params):
    return validate({"name": "t", "experiment": "hedera", "link_rate_mbit": 10,
                     "params": params}).experiment


def pattern(name: str, fraction: float) -> dict:
    return PatternResult(name, [], [], fraction).to_dict()


def results_with(fractions: dict[str, dict[str, float]], spread: dict | None = None) -> dict:
    """{setup: {pattern: fraction}} as measure returns it, with ``spread`` ({setup: uplink
    Mbit/s}) under the ECMP and single-path setups."""
    results = {setup: {"patterns": {p: pattern(p, f) for p, f in by_pattern.items()}}
               for setup, by_pattern in fractions.items()}
    for setup, loads in (spread or {}).items():
        jain = sum(loads) ** 2 / (len(loads) * sum(x * x for x in loads))
        results[setup]["spread"] = {**SPREAD, "uplink_mbit": loads, "jain": round(jain, 4),
                                    "busiest_share": round(max(loads) / sum(loads), 4)}
    return results


def outcomes(checks) -> dict[str, str]:
    return {c.name: c.outcome for c in checks}


# --- parameters and setups ------------------------------------------------------------------


def test_defaults_are_the_old_runs():
    p = HederaParams()
    assert (p.seconds, p.omit_s, p.spread) == (10, 2, True)
    assert p.patterns == ["stride1", "stride2", "stride4", "stride8", "random"]


@pytest.mark.parametrize(("field", "value"), [
    ("seconds", 1), ("omit_s", -1), ("patterns", ["stride16"]), ("patterns", ["bogus"]),
    ("patterns", []), ("patterns", ["stride4", "stride4"]), ("spread", 1), ("seconds", 2.5)])
def test_params_refuse_bad_values_naming_the_field(field, value):
    with pytest.raises(ValidationError) as info:
        HederaParams(**{field: value})
    assert info.value.errors()[0]["loc"][0] == field


def test_the_old_flags_still_work(monkeypatch):
    started = []

    def fake_run(resolved, log=print, progress=None):
        started.append(resolved)
        verdict = Verdict()
        return Outcome({"run_id": "r", "title": "t", "headline": "h", "status": "complete",
                        "error": None, "results_dir": "r", "rows": [],
                        "verdict": verdict.to_dict()}, "r", verdict)

    monkeypatch.setattr(testbed.cli, "run_scenario", fake_run)  # where main looks it up
    main(["hedera", "--pattern", "stride4,stride8", "--seconds", "4", "--omit", "1",
          "--rate-mbit", "5", "--seed", "3", "--quiet"])
    (resolved,) = started
    e = resolved.experiment
    assert (e.params.patterns, e.params.seconds, e.params.omit_s) == (["stride4", "stride8"],
                                                                       4, 1)
    assert (e.rate_mbit, resolved.scenario.seed) == (5, 3)


def test_three_setups_on_the_runs_rate():
    e = experiment()
    setups = {s.name: s for s in e.setups()}
    assert list(setups) == ["ecmp", "single", "nonblocking"]
    assert [s.routing for s in setups.values()] == ["ecmp", "single", "ecmp"]
    assert setups["ecmp"].fabric.kind == setups["single"].fabric.kind == "fattree"
    reference = setups["nonblocking"].fabric
    assert [s.role for s in reference.switches].count("leaf") == 1
    assert len(reference.hosts) == len(setups["ecmp"].fabric.hosts) == 16
    assert {link.rate_mbit for s in setups.values() for link in s.fabric.links} == {10.0}


def test_the_scenario_runs_the_old_defaults():
    resolved = load("ecmp-hedera")
    assert resolved.experiment.name == "hedera" and resolved.experiment.rate_mbit == 10
    assert resolved.experiment.params == HederaParams()


def test_a_topology_section_is_refused():
    with pytest.raises(Exception, match="topology: hedera sets this itself"):
        validate({"name": "t", "experiment": "hedera", "topology": {"name": "fattree", "k": 4}})


# --- the uplink spread ----------------------------------------------------------------------


def test_edge_uplinks_are_the_directions_toward_aggregation():
    assert uplinks(fat_tree(4), "p0e0") == ["p0e0->p0a0", "p0e0->p0a1"]
    assert len(uplinks(fat_tree(8), "p0e0")) == 4


def test_the_spread_sends_64_flows_from_the_edges_hosts_to_other_pods():
    pairs = spread_pairs(fat_tree(4))
    assert len(pairs) * SPREAD_STREAMS == SPREAD_FLOWS == 64
    assert {src for src, _ in pairs} == {"p0e0h0", "p0e0h1"}
    assert all(not dst.startswith("p0") for _, dst in pairs)


def test_spread_summary_by_hand():
    flows = PatternResult("spread", [("a", "b")] * 16, [1.0] * 16, 0.1)
    s = spread_summary({"p0e0->p0a0": 6.0, "p0e0->p0a1": 2.0}, flows)
    # Jain (6 + 2)^2 / (2 * (36 + 4)) = 64 / 80
    assert (s["jain"], s["busiest_share"], s["flows"], s["flow_mbit_total"]) == (0.8, 0.75,
                                                                                 64, 16.0)
    assert spread_summary({"u0": 0.0, "u1": 0.0}, flows)["busiest_share"] is None


# --- checks on synthetic results -------------------------------------------------------------


def test_ordering_holds_and_breaks_by_hand():
    e = experiment(patterns=["stride4"], spread=False)
    good = outcomes(e.checks(results_with({"nonblocking": {"stride4": 0.97},
                                           "ecmp": {"stride4": 0.6},
                                           "single": {"stride4": 0.25}})))
    assert good["stride4: non-blocking >= ECMP"] == "PASS"
    assert good["stride4: ECMP > single-path"] == "PASS"
    # non-blocking 0.59 vs ECMP 0.6: 0.9833 >= 1 - 0.02; 0.58: 0.9667 is not
    assert 0.59 / 0.6 >= 1 - ORDERING_SLACK > 0.58 / 0.6
    close = outcomes(e.checks(results_with({"nonblocking": {"stride4": 0.59},
                                            "ecmp": {"stride4": 0.6},
                                            "single": {"stride4": 0.25}})))
    assert close["stride4: non-blocking >= ECMP"] == "PASS"
    # ECMP 0.29 over single-path 0.25: a gain of 0.04 < 0.05
    assert 0.29 - 0.25 < ECMP_GAIN_MIN
    broken = outcomes(e.checks(results_with({"nonblocking": {"stride4": 0.58},
                                             "ecmp": {"stride4": 0.6},
                                             "single": {"stride4": 0.25}})))
    assert broken["stride4: non-blocking >= ECMP"] == "FAIL"
    no_gain = e.checks(results_with({"nonblocking": {"stride4": 0.97},
                                     "ecmp": {"stride4": 0.29}, "single": {"stride4": 0.25}}))
    (gain,) = [c for c in no_gain if c.name == "stride4: ECMP > single-path"]
    assert (gain.measured, gain.outcome) == (0.04, "FAIL")


def test_where_single_path_lost_nothing_ecmp_has_nothing_to_beat():
    """Stride 1 on the k=4 fat-tree: no two flows share a link on one path per destination
    (a run before the harness: 98.6% non-blocking and ECMP, 98.4% single-path)."""
    e = experiment(patterns=["stride1"], spread=False)
    checks = e.checks(results_with({"nonblocking": {"stride1": 0.986},
                                    "ecmp": {"stride1": 0.986}, "single": {"stride1": 0.984}}))
    (gain,) = [c for c in checks if c.name == "stride1: ECMP > single-path"]
    assert gain.passed is None and "lost nothing" in gain.statement
    assert outcomes(checks)["stride1: non-blocking >= ECMP"] == "PASS"


def test_the_published_gap_stands_beside_ours():
    assert published_ratio("stride4") == pytest.approx(3482 / 12465)
    assert published_ratio("stride1") > 1.0  # ECMP matched the switch when flows stay local
    assert published_ratio("stagger") is None
    ordered = [published_ratio(f"stride{n}") for n in (1, 2, 4, 8)]
    assert ordered == sorted(ordered, reverse=True)  # the gap opens as flows cross more layers
    assert set(PUBLISHED_MBIT) >= {"stride1", "stride2", "stride4", "stride8", "random"}
    e = experiment(patterns=["stride1", "stride4", "stride3"], spread=False)
    checks = {c.name: c for c in e.checks(results_with({
        "nonblocking": {"stride1": 0.98, "stride4": 0.98, "stride3": 0.98},
        "ecmp": {"stride1": 0.98, "stride4": 0.49, "stride3": 0.5},
        "single": {"stride1": 0.98, "stride4": 0.25, "stride3": 0.25}}))}
    stride4 = checks["stride4: ECMP / non-blocking beside Hedera's"]
    assert (stride4.measured, stride4.expected, stride4.outcome) == (0.5, "< 0.9 (Hedera 0.28)",
                                                                     "PASS")
    assert "Figure 9" in stride4.statement
    stride1 = checks["stride1: ECMP / non-blocking beside Hedera's"]
    assert (stride1.measured, stride1.expected, stride1.outcome) == (1.0, ">= 0.9 (Hedera 1.03)",
                                                                     "PASS")
    assert checks["stride3: ECMP / non-blocking beside Hedera's"].passed is None
    # a gap where Hedera had none, and none where it had one
    flipped = outcomes(e.checks(results_with({
        "nonblocking": {"stride1": 0.98, "stride4": 0.98}, "ecmp": {"stride1": 0.7,
                                                                    "stride4": 0.95},
        "single": {"stride1": 0.6, "stride4": 0.25}})))
    assert flipped["stride1: ECMP / non-blocking beside Hedera's"] == "FAIL"
    assert flipped["stride4: ECMP / non-blocking beside Hedera's"] == "FAIL"


EARLIER_RUN = {"nonblocking": {"stride1": 0.986, "stride2": 0.981, "stride4": 0.984,
                              "stride8": 0.983, "random": 0.983},
              "ecmp": {"stride1": 0.986, "stride2": 0.677, "stride4": 0.431, "stride8": 0.493,
                       "random": 0.582},
              "single": {"stride1": 0.984, "stride2": 0.492, "stride4": 0.248,
                         "stride8": 0.247, "random": 0.405}}


def test_the_readme_measurement_passes_every_check():
    e = experiment()
    checks = e.checks(results_with(EARLIER_RUN, {"ecmp": [4.9, 4.8], "single": [9.8, 0.0]}))
    assert [c.name for c in checks if c.passed is False] == []
    assert [c.name for c in checks if c.passed is None] == ["stride1: ECMP > single-path"]
    shape = next(c for c in checks if c.name == "the gap opens as flows climb the tree")
    # ECMP / non-blocking: 1.00 (stride 1) > 0.69 (stride 2) > 0.44, 0.50 (strides 4, 8)
    assert shape.measured == "1.00 > 0.69 > 0.44/0.50" and shape.outcome == "PASS"


def test_the_shape_breaks_when_a_core_stride_keeps_more_than_the_pod_stride():
    run = {setup: dict(by_pattern) for setup, by_pattern in EARLIER_RUN.items()}
    run["ecmp"]["stride8"] = 0.70  # 0.71 of the non-blocking, above stride 2's 0.69
    e = experiment(spread=False)
    assert outcomes(e.checks(results_with(run)))["the gap opens as flows climb the tree"] == "FAIL"
    e = experiment(patterns=["stride4", "stride8"], spread=False)
    shape = next(c for c in e.checks(results_with(run)) if c.name.startswith("the gap"))
    assert shape.passed is None  # one layer only: nothing to compare


def test_spread_checks_by_hand():
    e = experiment(patterns=["stride4"])
    fractions = {s: {"stride4": f} for s, f in (("nonblocking", 0.97), ("ecmp", 0.6),
                                                ("single", 0.25))}
    # Jain of (9.9, 0.1) = 100 / (2 * 98.02) = 0.5101; single-path busiest share 9.95 / 10
    uneven = outcomes(e.checks(results_with(fractions, {"ecmp": [9.9, 0.1],
                                                        "single": [9.95, 0.05]})))
    assert uneven["uplink spread: Jain index under ECMP"] == "FAIL"
    assert uneven["uplink spread: busiest uplink's share under single-path"] == "PASS"
    even = outcomes(e.checks(results_with(fractions, {"ecmp": [5.0, 4.0],
                                                      "single": [5.0, 4.0]})))
    # Jain of (5, 4) = 81 / 82 = 0.988; single-path's share 5 / 9 = 0.556
    assert 81 / 82 >= JAIN_MIN_ECMP and 5 / 9 < SINGLE_PATH_SHARE_MIN
    assert even["uplink spread: Jain index under ECMP"] == "PASS"
    assert even["uplink spread: busiest uplink's share under single-path"] == "FAIL"


def test_a_partial_run_judges_nothing_it_did_not_measure():
    e = experiment()
    checks = e.checks({"ecmp": results_with({"ecmp": {"stride1": 0.9}})["ecmp"]})
    assert {c.outcome for c in checks} == {"n/a"}
    trust = e.trust({"ecmp": results_with({"ecmp": {"stride1": 0.9}})["ecmp"]})
    assert {c.outcome for c in trust if c.name.endswith("reference delivery")} == {"n/a"}


def test_trust_needs_the_reference_near_its_capacity_and_every_flow():
    e = experiment(patterns=["stride4", "stride8"])
    results = results_with({"nonblocking": {"stride4": 0.97, "stride8": 0.84},
                            "ecmp": {"stride4": 0.6, "stride8": 0.6},
                            "single": {"stride4": 0.25, "stride8": 0.25}},
                           {"ecmp": [5.0, 5.0], "single": [10.0, 0.0]})
    results["single"]["spread"]["errors"] = ["p0e0h0 -> p1e0h0: timed out"]
    trust = {(c.name, c.setup): c.outcome for c in e.trust(results)}
    assert 0.84 < NONBLOCKING_MIN_FRACTION <= 0.97
    assert trust[("stride4: non-blocking reference delivery", "nonblocking")] == "PASS"
    assert trust[("stride8: non-blocking reference delivery", "nonblocking")] == "FAIL"
    assert trust[("flows that failed", "ecmp")] == "PASS"
    assert trust[("flows that failed", "single")] == "FAIL"


# --- measure, rows and plots -----------------------------------------------------------------


def hedera_run(setup, workdir) -> StandInRun:
    """A run on the stand-in fabric whose Watch's clock is monotonic seconds - 100: every link
    at 95% of its rate in every window but the ones starting after 1000."""
    watch = StandInWatch(rates={"p0e0->p0a0": 4.0, "p0e0->p0a1": 5.0, "p0e0->p0e0h0": 9.0},
                         delivery=lambda window_s: 0.5 if window_s and window_s[0] > 900
                         else 0.95, cpu_busy=0.5)
    return StandInRun(StandInFabric(setup.fabric, workdir), setup, workdir, watch)


def test_measure_returns_patterns_spread_and_the_worst_windows_fidelity(monkeypatch, tmp_path):
    e = experiment(patterns=["stride4", "stride8"])
    ecmp = e.setups()[0]

    def fake_patterns(run, patterns, seconds, omit_s, rate_mbit):
        assert (seconds, omit_s, rate_mbit) == (10, 2, 10.0)
        return {name: PatternResult(name, pairs, [5.0] * len(pairs), 0.5, [], (200.0, 210.0))
                for name, pairs in patterns.items()}

    def fake_spread(net, name, pairs, seconds, omit_s, rate_mbit, streams=1):
        assert streams == SPREAD_STREAMS and len(pairs) == 16
        return PatternResult(name, pairs, [1.0] * 16, 0.1, [], (1300.0, 1310.0))

    monkeypatch.setattr(hedera, "run_patterns", fake_patterns)
    monkeypatch.setattr(hedera, "run_pattern", fake_spread)
    r = e.measure(hedera_run(ecmp, tmp_path))
    assert r["patterns"]["stride4"]["pairs"][0] == ["p0e0h0", "p1e0h0"]
    assert r["spread"]["uplink_mbit"] == [4.0, 5.0] and r["spread"]["jain"] == pytest.approx(
        81 / 82, abs=1e-4)
    assert r["window_monotonic_s"] == [200.0, 1310.0]
    # the spread's window (sampler 1200 s) delivered 50%: the setup is not trusted
    assert r["fidelity"]["link_delivery_fraction"] == 0.5 and not r["fidelity"]["trustworthy"]
    nonblocking = e.setups()[2]
    assert "spread" not in e.measure(hedera_run(nonblocking, tmp_path))


def test_rows_put_the_published_ratio_beside_ours_and_plots_are_written(tmp_path):
    e = experiment()
    results = results_with(EARLIER_RUN, {"ecmp": [4.9, 4.8], "single": [9.8, 0.0]})
    rows = dict(e.rows(results))
    assert rows["stride4"] == ("non-blocking 98.4%, ECMP 43.1%, single-path 24.8% of the host "
                               "links; ECMP / non-blocking 0.44 (Hedera 0.28)")
    assert "hedera_results.csv" in rows["published"]
    assert rows["uplink spread, ECMP"].startswith("Jain index 1.000 over 2 uplinks of p0e0")
    paths = e.plots(results, tmp_path, "run | fattree k=4 | 10 Mbit/s links")
    assert [p.name for p in paths] == ["fractions.png", "ecmp_over_nonblocking.png",
                                       "uplink_spread.png"]
    assert all(p.read_bytes()[:4] == PNG_MAGIC for p in paths)
    assert e.plots({}, tmp_path, "t") == []
