"""PFC's costs on the wire (``testbed pfc-demo``, shortened): on the k=4 fat-tree at
20 Mbit/s, a 13:1 incast in the lossless class, and a victim flow that never uses the
congested port but shares the links that feed it.

- head-of-line blocking: under PFC the victim gets far less than in the lossy run;
- congestion spreading: ports two or more hops from the congested switch are paused;
- ECN cuts the pause time: with marking at K and ECN hosts, far fewer port-seconds paused;
- the lossless class drops nothing with PFC.

The tolerances are the demo's own (``testbed.experiments.pfc.run``); the runs measured for the README
gave the victim 0.7 Mbit/s under PFC against 13 in the lossy run, and 40-80 port-seconds
paused against none with ECN. Needs root; runs alone."""
from __future__ import annotations

from testbed.experiments.pfc import run as pfc_demo
from testbed.experiments.pfc.run import (
    CONDITIONS,
    LOSSY,
    PFC,
    PFC_ECN,
    PfcDemoConfig,
    run_pfc_demo,
)


def test_pfc_pauses_a_victim_spread_over_hops_and_ecn_cuts_them(tmp_path, capsys):
    config = PfcDemoConfig(alone_s=3, contention_s=5, results_dir=str(tmp_path))
    out = run_pfc_demo(config, log=lambda m: print(m, flush=True))
    results = out["results"]
    assert out["complete"] and set(results) == set(CONDITIONS)
    for line in out["verdict"]["statements"]:
        print(line)
    lossy, pfc, both = results[LOSSY], results[PFC], results[PFC_ECN]
    assert not any(r["errors"] for r in results.values()), [r["errors"] for r in results.values()]
    assert pfc["lossless_drops"] == 0 and both["lossless_drops"] == 0
    assert pfc["queue_drops"] == 0, "PFC: no queue anywhere may drop the lossless class"
    assert lossy["queue_drops"] > 0, "the lossy run's incast must overflow its queue"
    assert pfc["victim_mbit"] <= lossy["victim_mbit"] * (1 - pfc_demo.VICTIM_SLOWED_BY)
    assert pfc["max_paused_hops"] >= pfc_demo.SPREAD_MIN_HOPS
    assert pfc["paused_s"] > 0 and pfc["pause_frames_sent"] > 0
    assert both["paused_s"] <= pfc["paused_s"] * (1 - pfc_demo.PAUSE_CUT_BY)
    assert both["ce_marks"] > 0
    checks = out["verdict"]["checks"]
    assert all(checks.values()), checks
    assert (tmp_path / next(p.name for p in tmp_path.iterdir()) / "pfc-demo.png").exists()
