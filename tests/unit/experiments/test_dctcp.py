"""The DCTCP micro-benchmark's pure parts: its parameters and the problems it names, its setups
(fabric, queue, host TCP per sender count and queueing), the queue summary of synthetic
samples, every check on synthetic results (PASS and FAIL, values computed by hand), the
window-floor note, the summary rows with the published statements, the figures from files,
the redrawing of a finished run, and the ``testbed dctcp`` flags. Nothing here starts an
emulation: ``run_scenario`` is replaced in the CLI tests."""
from __future__ import annotations

import json
from pathlib import Path

import matplotlib.figure
import pytest
from pydantic import ValidationError
from tests.unit.stand_ins import StandInFabric, StandInRun, StandInWatch
from tests.unit.summaries import run_summary

import testbed.cli
import testbed.harness.run
from testbed.capabilities import Capability, Paths, Platform
from testbed.cli import EXIT_OK, EXIT_USAGE, main
from testbed.errors import ConfigError
from testbed.experiments.dctcp import replot as replot_module
from testbed.experiments.dctcp.bench import (
    DROPTAIL,
    ECN,
    END_MARGIN_S,
    MIN_CWND_SEGMENTS,
    QUEUE_FILE,
    judged_window_s,
    parse_ping_rtt_ms,
    read_queue_samples,
    summarise_queue,
    tcp_label,
    window_floor_bytes,
    write_queue_samples,
)
from testbed.experiments.dctcp.checks import (
    DROPTAIL_P95_MIN_FRACTION,
    ECN_MEDIAN_TOLERANCE_FRAMES,
    ECN_MIN_UTILISATION,
    MIN_SAMPLED_FRACTION,
    PUBLISHED,
    dctcp_checks,
    summary_rows,
)
from testbed.experiments.dctcp.experiment import Dctcp, DctcpParams
from testbed.harness.run import Outcome
from testbed.experiments.registry import load
from testbed.harness.scenario import Scenario
from testbed.measure.fidelity import judge
from testbed.measure.telemetry import link_directions
from testbed.model.bench import bench_fabric, bench_of
from testbed.model.verdict import FAIL, NOT_JUDGED, PASS, Verdict
from testbed.plan.profiles import StepEcn
from testbed.plan.settings import SYSCTL_TCP_CC, SYSCTL_TCP_ECN

MTU = 1500
RATE_MBIT = 20.0
BUFFER_BYTES = 125_000  # 50 ms at 20 Mbit/s: 83 packets of 1500 B
K_BYTES = 3000  # DCTCP's 20 packets at 1 Gbit/s scaled to 20 Mbit/s is 600 B; two frames floor it
IDLE_RTT_MS = 0.2  # 500 B in flight at 20 Mbit/s


def platform(dctcp: bool = False) -> Platform:
    caps = {"tcp_dctcp": Capability("tcp_dctcp", dctcp, "test"),
            "tcp_cubic": Capability("tcp_cubic", True, "test")}
    return Platform("test", caps, Paths("userspace", "ebpf", "dctcp" if dctcp else "cubic+ecn",
                                        "userspace-roce", "none", "tbf-pause-agent"))


def experiment(dctcp: bool = False, rate_mbit: float = RATE_MBIT, **params) -> Dctcp:
    scenario = Scenario(name="t", experiment="dctcp", link_rate_mbit=rate_mbit, mtu_bytes=MTU)
    return Dctcp(scenario, DctcpParams(**params), platform(dctcp))


# --- parameters and problems ------------------------------------------------------------------


def test_defaults_as_the_earlier_benchmark():
    p = DctcpParams()
    assert (p.senders, p.seconds, p.omit_s, p.k_bytes, p.buffer_bytes, p.rtt_s) == (
        [2, 8], 30, 5, None, None, None)
    assert (p.droptail_cc, p.ecn_cc) == ("cubic", "auto")
    assert (Dctcp.default_rate_mbit, Dctcp.default_mtu_bytes) == (20.0, 1500)


@pytest.mark.parametrize(("field", "value", "loc"), [
    ("senders", [], ("senders",)), ("senders", [0], ("senders", 0)),
    ("senders", [33], ("senders", 0)), ("senders", [2, 2], ("senders",)),
    ("senders", [2.0], ("senders", 0)), ("senders", "2", ("senders",)),
    ("seconds", 4, ("seconds",)), ("seconds", 601, ("seconds",)),
    ("seconds", 10.0, ("seconds",)), ("omit_s", -1, ("omit_s",)), ("omit_s", 61, ("omit_s",)),
    ("k_bytes", 0, ("k_bytes",)), ("k_bytes", 3000.0, ("k_bytes",)),
    ("buffer_bytes", 0, ("buffer_bytes",)), ("buffer_bytes", 2.5e5, ("buffer_bytes",)),
    ("rtt_s", 0.0, ("rtt_s",)), ("rtt_s", -0.001, ("rtt_s",)),
    ("rtt_s", float("nan"), ("rtt_s",)), ("rtt_s", float("inf"), ("rtt_s",)),
    ("droptail_cc", "dctcp", ("droptail_cc",)), ("droptail_cc", "auto", ("droptail_cc",)),
    ("ecn_cc", "bbr", ("ecn_cc",)), ("seconds", True, ("seconds",)),
])
def test_params_refuse_bad_values_naming_the_field(field, value, loc):
    with pytest.raises(ValidationError) as info:
        DctcpParams(**{field: value})
    assert info.value.errors()[0]["loc"] == loc


@pytest.mark.parametrize(("field", "value"), [
    ("senders", [1]), ("senders", [32, 1]), ("seconds", 5), ("seconds", 600), ("omit_s", 0),
    ("omit_s", 60), ("droptail_cc", "reno"), ("ecn_cc", "cubic"), ("rtt_s", 0.001)])
def test_params_accept_the_limits(field, value):
    assert getattr(DctcpParams(**{field: value}), field) == value


@pytest.mark.parametrize(("rate_mbit", "params", "field"), [
    (101.0, {}, "link_rate_mbit"),
    (RATE_MBIT, {"buffer_bytes": 4 * MTU - 1}, "params.buffer_bytes"),
    (RATE_MBIT, {"k_bytes": 30_000, "rtt_s": 0.001}, "params.rtt_s"),
])
def test_problems_name_the_field(rate_mbit, params, field):
    problems = experiment(rate_mbit=rate_mbit, **params).problems()
    assert [p.field for p in problems] == [field]
    assert experiment(rate_mbit=100.0, buffer_bytes=4 * MTU).problems() == []


def test_k_at_the_buffer_is_refused_as_a_parameter():
    with pytest.raises(ConfigError) as info:
        experiment(k_bytes=BUFFER_BYTES).setups()
    assert info.value.field == "params.k_bytes"


def test_a_congestion_control_the_kernel_lacks_is_refused_naming_its_parameter():
    with pytest.raises(ConfigError) as info:
        experiment(dctcp=False, ecn_cc="dctcp").setups()
    assert info.value.field == "params.ecn_cc"
    assert "ecn_cc: auto takes cubic+ecn" in info.value.problem
    assert experiment(dctcp=True, ecn_cc="dctcp").host_tcp()[ECN].congestion_control == "dctcp"


def test_the_scenario_loads_with_every_setup():
    resolved = load("dctcp")
    assert resolved.experiment.name == "dctcp" and resolved.experiment.rate_mbit == RATE_MBIT
    assert [s.name for s in resolved.setups] == ["n2-droptail", "n2-ecn", "n8-droptail",
                                                 "n8-ecn"]


def test_a_topology_or_queue_section_is_refused():
    with pytest.raises(ConfigError) as info:
        load("dctcp", {"queue": {"ecn": {"scheme": "dctcp"}}})
    assert "queue: dctcp sets this itself" in str(info.value)


# --- setups -----------------------------------------------------------------------------------


def test_default_setups_give_each_pair_its_queue_and_host_tcp():
    setups = {s.name: s for s in experiment().setups()}
    assert list(setups) == ["n2-droptail", "n2-ecn", "n8-droptail", "n8-ecn"]
    for n in (2, 8):
        dt, ecn = setups[f"n{n}-droptail"], setups[f"n{n}-ecn"]
        assert len(dt.fabric.hosts) == len(ecn.fabric.hosts) == n + 1
        assert dt.queue.buffer_bytes == ecn.queue.buffer_bytes == BUFFER_BYTES
        assert dt.queue.ecn is None and ecn.queue.ecn == StepEcn(K_BYTES)
        assert not dt.queue.uses_classes and not ecn.queue.uses_classes
        assert dt.host_sysctls() == {SYSCTL_TCP_CC: "cubic", SYSCTL_TCP_ECN: "0"}
        assert ecn.host_sysctls() == {SYSCTL_TCP_CC: "cubic", SYSCTL_TCP_ECN: "1"}
        k_record = ecn.queue_record["ecn"]["ecn"][0]
        assert (k_record["decided_by"], k_record["scaled_value"]) == ("frames", pytest.approx(600))
        assert "ecn" not in dt.queue_record


def test_explicit_k_buffer_and_an_rtt_that_raises_k():
    (_, ecn, *_) = experiment(k_bytes=30_000, buffer_bytes=60_000, senders=[2]).setups()
    assert ecn.queue.ecn == StepEcn(30_000) and ecn.queue.buffer_bytes == 60_000
    assert ecn.queue_record["ecn"] is None  # as configured: nothing was scaled
    rtt_s = 0.1  # 250 KB in flight at 20 Mbit/s: K > C*RTT/7 = 35714 B
    (_, raised) = experiment(rtt_s=rtt_s, buffer_bytes=500_000, senders=[2]).setups()
    assert raised.queue.ecn.k_bytes == 35_715


@pytest.mark.parametrize("senders", [1, 2, 8, 32])
def test_the_bench_is_one_switch_and_the_bottleneck_its_port_to_the_receiver(senders):
    bench = bench_of(bench_fabric(senders, RATE_MBIT, MTU))
    fabric = bench.fabric
    assert len(bench.senders) == senders and bench.receiver not in bench.senders
    assert {fabric.host_attachment(h.name)[0] for h in fabric.hosts} == {"l0"}
    assert bench.bottleneck_intf == f"l0-eth{senders + 1}"
    directions = {d.label: d for d in link_directions(fabric)}
    bottleneck = directions[bench.bottleneck_label]
    assert bottleneck.counter_path == f"/sys/class/net/{bench.bottleneck_intf}/statistics/tx_bytes"
    assert bottleneck.rate_mbit == RATE_MBIT and fabric.mtu_bytes == MTU


@pytest.mark.parametrize(("cc", "ecn", "label"), [("cubic", False, "cubic"),
                                                  ("cubic", True, "cubic+ecn"),
                                                  ("dctcp", True, "dctcp"),
                                                  (None, False, "default")])
def test_tcp_label(cc, ecn, label):
    assert tcp_label({"congestion_control": cc, "ecn": ecn}) == label


# --- measurements -----------------------------------------------------------------------------


def test_the_judged_window_leaves_out_start_up_and_the_end():
    assert judged_window_s(5, 30) == (5.0, 35.0 - END_MARGIN_S)


def test_queue_summary_of_synthetic_samples():
    t_s = [i * 0.01 for i in range(1000)]
    depth = [0 if t < 2.0 else (i % 100) * MTU for i, t in enumerate(t_s)]
    summary = summarise_queue(t_s, depth, (2.0, 9.99), MTU)
    assert summary["samples"] == 800
    assert summary["sampled_fraction"] == pytest.approx(800 / 799, rel=1e-3)
    assert summary["interval_ms_mean"] == pytest.approx(10.0)
    assert summary["median_packets"] == 49.5  # linear between the two middle ranks of 0..99
    # p95: rank 0.95 * 799 = 759.05 of 0..99 each 8 times: 94 + 0.05 * (95 - 94)
    assert summary["p95_packets"] == pytest.approx(94.05)
    assert summary["max_packets"] == 99 and summary["max_bytes"] == 99 * MTU
    assert summary["mean_bytes"] == pytest.approx(49.5 * MTU)


def test_queue_summary_counts_a_slow_sampler_and_an_empty_window():
    t_s = [i * 0.05 for i in range(200)]  # every 50 ms: a fifth of what 10 ms would give
    assert summarise_queue(t_s, [MTU] * 200, (0.0, 9.95), MTU)["sampled_fraction"] == \
        pytest.approx(0.2, rel=0.01)
    empty = summarise_queue(t_s, [MTU] * 200, (20.0, 30.0), MTU)
    assert empty["samples"] == 0 and empty["median_bytes"] is None
    assert empty["p95_packets"] is None and empty["interval_ms_mean"] is None


def test_ping_rtt():
    out = ("--- 10.0.0.4 ping statistics ---\n5 packets transmitted, 5 received, 0% packet "
           "loss, time 803ms\nrtt min/avg/max/mdev = 0.091/0.137/0.201/0.040 ms\n")
    assert parse_ping_rtt_ms(out) == {"min_ms": 0.091, "avg_ms": 0.137, "max_ms": 0.201}
    assert parse_ping_rtt_ms("5 packets transmitted, 0 received, 100% packet loss\n") is None


def test_window_floor():
    assert window_floor_bytes(8, MTU, RATE_MBIT, None) == 8 * MIN_CWND_SEGMENTS * MTU
    # 1 ms at 20 Mbit/s holds 2500 B
    assert window_floor_bytes(2, MTU, RATE_MBIT, 0.001) == pytest.approx(4 * MTU - 2500)
    assert window_floor_bytes(1, MTU, RATE_MBIT, 0.1) == 0


# --- checks -----------------------------------------------------------------------------------


def result_of(queueing: str, median_bytes: float | None, utilisation: float, senders: int = 2,
              sampled_fraction: float = 0.98, sampler_error: str | None = None,
              trustworthy: bool = True, run_dir: Path | None = None) -> dict:
    """One setup's results as measure() returns them."""
    ecn = queueing == ECN
    stats = {f"{name}_{unit}": None if median_bytes is None else
             median_bytes * factor / (MTU if unit == "packets" else 1)
             for name, factor in (("median", 1.0), ("p95", 1.2), ("max", 1.5), ("mean", 1.0))
             for unit in ("bytes", "packets")}
    fidelity = judge(0.5 if trustworthy else 0.99, 1.0, utilisation, 0.0,
                     bandwidth_bound=not ecn, setup=f"n{senders}-{queueing}")
    return {
        "senders": senders, "queueing": queueing, "rate_mbit": RATE_MBIT, "mtu_bytes": MTU,
        "buffer_bytes": BUFFER_BYTES, "k_bytes": K_BYTES if ecn else None,
        "k_scaling": None, "tcp": {"congestion_control": "cubic", "ecn": ecn},
        "ecn_path": "ebpf", "bottleneck": f"l0-eth{senders + 1}", "window_s": [5.0, 34.5],
        "queue": {"samples": 2900, "sampled_fraction": sampled_fraction,
                  "interval_ms_mean": 10.1, **stats},
        "marker_queue": {"median_packets": None if median_bytes is None
                         else median_bytes / MTU + 0.5},
        "divergence": {"mean_abs_bytes": 750.0},
        "utilisation": utilisation, "flow_mbit": [utilisation * RATE_MBIT / senders] * senders,
        "jain": 1.0, "marks": 1234 if ecn else 0, "fifo_drops": 0 if ecn else 56,
        "fidelity": fidelity.to_dict(), "idle_rtt": {"avg_ms": IDLE_RTT_MS},
        "sampler_error": sampler_error, "errors": [],
        "dir": str(run_dir / "setups" / f"n{senders}-{queueing}") if run_dir else "",
    }


GOOD_DROPTAIL = {"queueing": DROPTAIL, "median_bytes": 0.8 * BUFFER_BYTES, "utilisation": 0.98}
GOOD_ECN = {"queueing": ECN, "median_bytes": K_BYTES + MTU, "utilisation": 0.96}


def results_of(*runs: dict) -> dict[str, dict]:
    return {f"n{r['senders']}-{r['queueing']}": r for r in runs}


def outcomes(results: dict[str, dict]) -> dict[tuple[str, str], str]:
    return {(c.setup, c.name): c.outcome for c in dctcp_checks(results)}


def test_every_check_passes_on_a_good_pair():
    checks = dctcp_checks(results_of(result_of(**GOOD_DROPTAIL), result_of(**GOOD_ECN)))
    assert {(c.setup, c.name): (c.measured, c.outcome) for c in checks} == {
        ("n2-droptail", "drop-tail queue p95"): (0.96, PASS),   # 1.2 x 100000 / 125000
        ("n2-droptail", "queue sampled"): (0.98, PASS),
        ("n2-ecn", "ECN median queue near K"): (4500.0, PASS),    # 1 frame above K = 3000
        ("n2-ecn", "ECN utilisation"): (0.96, PASS),
        ("n2-ecn", "queue sampled"): (0.98, PASS),
    }
    near_k = next(c for c in checks if c.name == "ECN median queue near K")
    assert (near_k.expected, near_k.tolerance, near_k.unit) == (
        K_BYTES, ECN_MEDIAN_TOLERANCE_FRAMES * MTU, "bytes")
    assert "note" not in near_k.statement  # 2 flows at 2 segments: 5500 B <= K + 4500


@pytest.mark.parametrize(("droptail", "ecn", "failing"), [
    # p95 at 1.2 x 0.4 = 0.48 of the buffer, under 0.5
    ({"median_bytes": 0.4 * BUFFER_BYTES}, {}, ("n2-droptail", "drop-tail queue p95")),
    # 4 frames above K: 6000 B > 4500 B
    ({}, {"median_bytes": K_BYTES + 4 * MTU}, ("n2-ecn", "ECN median queue near K")),
    ({}, {"utilisation": 0.89}, ("n2-ecn", "ECN utilisation")),
    ({}, {"sampled_fraction": 0.3}, ("n2-ecn", "queue sampled")),
    ({"sampler_error": "TestbedError: bpftool failed"}, {}, ("n2-droptail", "queue sampled")),
])
def test_each_check_can_fail_alone(droptail, ecn, failing):
    found = outcomes(results_of(result_of(**{**GOOD_DROPTAIL, **droptail}),
                                result_of(**{**GOOD_ECN, **ecn})))
    assert found[failing] == FAIL
    assert [key for key, outcome in found.items() if outcome != PASS] == [failing]


def test_the_tolerances_hold_at_their_edges():
    droptail = {**GOOD_DROPTAIL,  # p95 = 1.2 x median, exactly at the bound
                "median_bytes": DROPTAIL_P95_MIN_FRACTION / 1.2 * BUFFER_BYTES}
    ecn = {**GOOD_ECN, "median_bytes": K_BYTES + ECN_MEDIAN_TOLERANCE_FRAMES * MTU,
           "utilisation": ECN_MIN_UTILISATION, "sampled_fraction": MIN_SAMPLED_FRACTION}
    found = outcomes(results_of(result_of(**droptail), result_of(**ecn)))
    assert set(found.values()) == {PASS}
    below = {**ecn, "median_bytes": K_BYTES - 2 * MTU}  # 2 frames under K: within 3 frames
    assert outcomes(results_of(result_of(**below)))[("n2-ecn", "ECN median queue near K")] == PASS


def test_nothing_sampled_is_not_judged():
    found = outcomes(results_of(result_of(**{**GOOD_DROPTAIL, "median_bytes": None}),
                                result_of(**{**GOOD_ECN, "median_bytes": None})))
    assert found[("n2-droptail", "drop-tail queue p95")] == NOT_JUDGED
    assert found[("n2-ecn", "ECN median queue near K")] == NOT_JUDGED


def test_ecn_at_low_utilisation_fails_its_check_but_not_trust():
    ecn = result_of(**{**GOOD_ECN, "utilisation": 0.6})
    assert ecn["fidelity"]["trustworthy"]  # not bandwidth-bound: a short port is the result
    assert outcomes(results_of(ecn))[("n2-ecn", "ECN utilisation")] == FAIL
    droptail = result_of(**{**GOOD_DROPTAIL, "utilisation": 0.6})
    assert not droptail["fidelity"]["trustworthy"]  # drop-tail must fill the port


def test_many_flows_at_their_smallest_windows_are_judged_against_that_floor():
    ecn = result_of(queueing=ECN, median_bytes=16 * MTU, utilisation=1.0, senders=8)
    (near,) = [c for c in dctcp_checks(results_of(ecn)) if c.name.startswith("ECN median")]
    # 8 flows x 2 segments x 1500 B - 500 B in flight = 23500 B: about 16 packets, over K + 3
    # frames = 7500 B (5 packets), so the floor plus the same tolerance bounds the queue
    assert near.name == "ECN median queue at most the window floor"
    assert near.outcome == PASS and near.expected == f"<= {23500 + 3 * MTU}"
    assert ("8 flows at their smallest windows (2 segments each) keep about 16 packets queued, "
            "above K + tolerance (5)" in near.statement)
    assert "a K above 23500 B can be; judged against that floor instead" in near.statement
    # a queue far above the floor (drop-tail-like) still fails
    full = result_of(queueing=ECN, median_bytes=80 * MTU, utilisation=1.0, senders=8)
    (far,) = [c for c in dctcp_checks(results_of(full)) if c.name.startswith("ECN median")]
    assert far.outcome == FAIL


def test_failed_flows_are_noted_in_the_statements():
    r = result_of(**GOOD_ECN)
    r["errors"] = ["l0h0 -> l0h2: the server has terminated"]
    (near_k,) = [c for c in dctcp_checks(results_of(r)) if c.name == "ECN median queue near K"]
    assert "note: 1 flows failed: l0h0 -> l0h2: the server has terminated" in near_k.statement


def test_a_setup_that_failed_before_measuring_has_no_checks():
    assert dctcp_checks({"n2-droptail": {"dir": "x", "bring_up": {}}}) == []


def test_statements_carry_the_published_numbers():
    checks = dctcp_checks(results_of(result_of(**GOOD_DROPTAIL), result_of(**GOOD_ECN)))
    statements = " ".join(c.statement for c in checks)
    for entry in PUBLISHED:
        assert f"published, {entry['source']}: {entry['statement']}" in statements
    verdict = Verdict(checks)
    assert json.loads(json.dumps(verdict.to_dict()))["counts"] == {PASS: 5, FAIL: 0,
                                                                   NOT_JUDGED: 0}


# --- rows -------------------------------------------------------------------------------------


def test_rows_give_each_setup_and_the_published_numbers_beside_ours():
    ecn = result_of(**GOOD_ECN)
    ecn["k_scaling"] = {"decided_by": "frames", "scaled_value": 600.0}
    rows = dict(summary_rows(results_of(result_of(**GOOD_DROPTAIL), ecn,
                                        result_of(**GOOD_DROPTAIL, senders=8, trustworthy=False),
                                        result_of(**GOOD_ECN, senders=8))))
    dt = rows["n2-droptail: 2 senders, drop-tail (cubic)"]
    assert dt.startswith("queue median/p95/max 66.7/80.0/100.0 packets (qdisc backlog)")
    assert "marker's model median 67.2, mean |model - qdisc| 0.5 packets" in dt
    assert "utilisation 98.0%" in dt and "drops 56" in dt and dt.endswith("kept up: yes")
    assert rows["n8-droptail: 8 senders, drop-tail (cubic)"].endswith("kept up: NO")
    assert "marks 1234" in rows["n2-ecn: 2 senders, ECN (cubic+ecn)"]
    assert rows["ours: K"] == ("K = 3000 B = 2.0 packets at 20 Mbit/s (scaled from the "
                               "anchors, decided by frames; the anchor alone gives 600 B)")
    assert rows["ours: 2 senders, queues"] == (
        "20 Mbit/s, 83-packet buffer: drop-tail median 66.7 packets (80% of it); ECN median "
        "3.0 packets at K = 2.0")
    assert rows["ours: 8 senders, utilisation"] == (
        "ECN 96.0% with median 3.0 packets; drop-tail 98.0% with 66.7")
    for entry in PUBLISHED:
        assert rows[f"published: {entry['source']}"] == entry["statement"]
    names = [name for name, _ in summary_rows(results_of(result_of(**GOOD_DROPTAIL), ecn))]
    # each published statement is followed by ours
    assert names[2:] == ["published: DCTCP (Alizadeh et al., SIGCOMM 2010; RFC 8257)",
                         "ours: K",
                         "published: Mininet-HiFi reproduction (Handigol et al., CoNEXT 2012)",
                         "ours: 2 senders, queues", "published: DCTCP claim",
                         "ours: 2 senders, utilisation"]


# --- figures and redrawing --------------------------------------------------------------------


def write_setup_samples(r: dict, with_model: bool = True) -> None:
    folder = Path(r["dir"])
    folder.mkdir(parents=True, exist_ok=True)
    t_s = [i * 0.01 for i in range(3500)]
    real = [int(r["queue"]["median_bytes"])] * len(t_s)
    write_queue_samples(folder / QUEUE_FILE, t_s, real,
                        [d + MTU for d in real] if with_model else None, [0.002] * len(t_s))


def run_results(run_dir: Path) -> dict[str, dict]:
    results = results_of(result_of(**GOOD_DROPTAIL, run_dir=run_dir),
                         result_of(**GOOD_ECN, run_dir=run_dir),
                         result_of(**GOOD_DROPTAIL, senders=8, run_dir=run_dir),
                         result_of(**GOOD_ECN, senders=8, run_dir=run_dir))
    for r in results.values():
        write_setup_samples(r, with_model=r["senders"] == 2)
    return results


def test_the_samples_file_round_trips(tmp_path):
    write_queue_samples(tmp_path / QUEUE_FILE, [0.0, 0.01], [0, 1500], None, [0.001, 0.002])
    assert read_queue_samples(tmp_path / QUEUE_FILE) == {
        "t_s": [0.0, 0.01], "qdisc_bytes": [0, 1500], "marker_bytes": None,
        "read_s": [0.001, 0.002]}


@pytest.fixture
def saved_titles(monkeypatch):
    """The title of every figure saved while the test runs."""
    titles = []
    save = matplotlib.figure.Figure.savefig

    def recording(fig, *args, **kwargs):
        titles.append(fig._suptitle.get_text() if fig._suptitle else
                      fig.axes[0].get_title())
        return save(fig, *args, **kwargs)

    monkeypatch.setattr(matplotlib.figure.Figure, "savefig", recording)
    return titles


def test_plots_draw_both_figures_under_the_harness_title(tmp_path, saved_titles):
    results = run_results(tmp_path)
    folder = tmp_path / "plots"
    folder.mkdir()
    paths = experiment().plots(results, folder, "r1 | spineleaf | 20 Mbit/s links")
    assert [p.name for p in paths] == ["queue_time.png", "queue_cdf.png"]
    assert all(p.read_bytes().startswith(b"\x89PNG") for p in paths)
    assert len(saved_titles) == 2
    assert all(t.startswith("r1 | spineleaf | 20 Mbit/s links\n") for t in saved_titles)
    assert experiment().plots({}, folder, "r1") == []


def write_summary(run_dir: Path, results: dict[str, dict], recorded_dir: str) -> None:
    """summary.json as the harness writes it, the run having lived at ``recorded_dir``."""
    moved = {name: {**r, "dir": r["dir"].replace(str(run_dir), recorded_dir)}
             for name, r in results.items()}
    scenario = Scenario(name="dctcp", experiment="dctcp", link_rate_mbit=RATE_MBIT,
                        mtu_bytes=MTU).model_dump(mode="json")
    run_dir.joinpath("summary.json").write_text(json.dumps({
        **run_summary(run_id="r1", experiment="dctcp", results_dir=recorded_dir),
        "scenario": scenario, "params": DctcpParams().model_dump(mode="json"),
        "link_rate_mbit": RATE_MBIT,
        "setups": {name: {"fabric": {"label": "spineleaf leaves=1"}} for name in results},
        "results": moved}))


def test_replot_redraws_a_moved_run_from_its_files(tmp_path, saved_titles, capsys):
    run_dir = tmp_path / "copied-run"
    results = run_results(run_dir)
    write_summary(run_dir, results, "/root/results/r1")
    assert replot_module.main([str(run_dir)]) == EXIT_OK
    assert capsys.readouterr().out.split() == [str(run_dir / "plots" / "queue_time.png"),
                                              str(run_dir / "plots" / "queue_cdf.png")]
    assert all(t.startswith("r1 | spineleaf leaves=1 | 20 Mbit/s links") for t in saved_titles)


def test_replot_refuses_what_is_not_a_finished_dctcp_run(tmp_path, capsys):
    assert replot_module.main([str(tmp_path)]) == EXIT_USAGE
    assert "not a run folder (no summary.json)" in capsys.readouterr().err
    run_dir = tmp_path / "run"
    results = run_results(run_dir)
    write_summary(run_dir, results, str(run_dir))
    summary = json.loads((run_dir / "summary.json").read_text())
    (run_dir / "summary.json").write_text(json.dumps({**summary, "experiment": "incast"}))
    with pytest.raises(ConfigError, match="not a dctcp run"):
        replot_module.replot(run_dir)
    write_summary(run_dir, results, str(run_dir))
    (run_dir / "setups" / "n2-ecn" / QUEUE_FILE).unlink()
    assert replot_module.main([str(run_dir)]) == EXIT_USAGE
    assert "queue.json" in capsys.readouterr().err


def test_the_harness_makes_the_verdict_report_and_plots_of_a_run(tmp_path):
    from testbed.capabilities import detect
    from testbed.harness.provenance import provenance
    from testbed.harness.run import COMPLETE, finish

    e = experiment()
    results = run_results(tmp_path)
    results["n8-ecn"]["utilisation"] = 0.5
    summary = {**run_summary(run_id="r1", experiment="dctcp", results_dir=str(tmp_path),
                             status=COMPLETE),
               "title": e.title, "provenance": provenance(detect()),
               "link_rate_mbit": RATE_MBIT, "setups": {s.name: s.describe() for s in e.setups()}}
    outcome = finish(summary, results, e, tmp_path, log=lambda message: None)
    assert outcome.verdict.counts() == {PASS: 9, FAIL: 1, NOT_JUDGED: 0}
    assert [(c.setup, c.name) for c in outcome.verdict.failed] == [("n8-ecn", "ECN utilisation")]
    assert outcome.verdict.emulator_trusted  # every setup's fidelity checks passed
    assert sorted(p["path"] for p in outcome.summary["plots"]) == ["plots/queue_cdf.png",
                                                                 "plots/queue_time.png"]
    assert all(p["caption"] in e.captions.values() for p in outcome.summary["plots"])
    report = (tmp_path / "report.md").read_text()
    for entry in PUBLISHED:
        assert entry["statement"] in report
    assert "ours: 2 senders, queues" in report


# --- the testbed dctcp flags ------------------------------------------------------------------


@pytest.fixture
def started(monkeypatch):
    """The scenarios the CLI started, instead of running them."""
    runs = []

    def fake_run(resolved, log=print, progress=None):
        runs.append(resolved)
        verdict = Verdict()
        summary = {"run_id": "r1", "title": "t", "headline": "h", "status": "complete",
                   "error": None, "results_dir": "results/r1", "rows": [],
                   "verdict": verdict.to_dict(), "link_rate_mbit": 1.0, "experiment": "dctcp"}
        return Outcome(summary, Path("results/r1"), verdict)

    monkeypatch.setattr(testbed.cli, "run_scenario", fake_run)  # where main looks it up
    return runs


def test_the_earlier_flags_still_set_the_run(started):
    main(["dctcp", "--rate-mbit", "50", "--senders", "2,8", "--seconds", "15", "--omit", "3",
          "--k-bytes", "4500", "--buffer-bytes", "90000", "--mtu", "1500",
          "--droptail-cc", "reno", "--ecn-cc", "cubic", "--results", "elsewhere"])
    (resolved,) = started
    p = resolved.experiment.params
    assert (p.senders, p.seconds, p.omit_s, p.k_bytes, p.buffer_bytes) == (
        [2, 8], 15, 3, 4500, 90_000)
    assert (p.droptail_cc, p.ecn_cc) == ("reno", "cubic")
    assert resolved.experiment.rate_mbit == 50.0
    assert resolved.scenario.results_dir == "elsewhere"
    assert [s.queue.ecn for s in resolved.setups if s.name.endswith("ecn")] == [StepEcn(4500)] * 2
    main(["dctcp", "--senders", "4", "--rtt-s", "0.01"])
    assert started[1].experiment.params.senders == [4]
    assert started[1].experiment.params.rtt_s == 0.01


@pytest.mark.parametrize("argv", [["--senders", "2", "8"], ["--senders", "2,8"],
                                  ["--senders", "2", "--senders", "8"]])
def test_sender_counts_by_spaces_or_commas(started, argv):
    """The old flag took `--senders 2 8`; the generated one takes commas too."""
    main(["dctcp", *argv])  # the stand-in run judges nothing: its exit status says untrusted
    assert started[-1].experiment.params.senders == [2, 8]


def test_a_bad_flag_is_one_line_naming_the_field(started, capsys):
    assert main(["dctcp", "--senders", "2,2"]) == EXIT_USAGE
    assert "params.senders: lists a count twice" in capsys.readouterr().err
    assert main(["dctcp", "--rate-mbit", "200"]) == EXIT_USAGE
    assert "link_rate_mbit: must be at most 100" in capsys.readouterr().err
    assert started == []


# --- measure, on a stand-in for a running fabric ----------------------------------------------


def bench_running(fabric, path: str) -> StandInFabric:
    """The stand-in fabric marking on ``path``: the receiver's port's marks grow by 100 at
    every reading, the marker's model holds 7500 B there, and a ping answers in 0.2 ms."""
    return StandInFabric(
        fabric, ecn_path=path, marked={"l0-eth1": 0, "l0-eth3": 7500},
        ecn_reading=lambda n: {"l0-eth3": {"marks": 100 * n, "fifo_drops": 0,
                                           "virtual_fifo_drops": 0, "max_queue_bytes": 9000}},
        answers={"ping": "rtt min/avg/max/mdev = 0.100/0.200/0.300/0.050 ms\n"})


class FakeBacklog:
    """testbed.measure.backlog.PortBacklog reading a fixed backlog."""

    opened: list = []

    def __init__(self, intf, ifindex=None):
        FakeBacklog.opened.append((intf, ifindex))

    def read(self):
        return 4500

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        pass


FLOW_S = 0.8  # how long the stand-in flows run: 0.3 s past the flows' start (SERVER_START_S)


def fake_run_flows(net, pairs, seconds, omit_s):
    import time

    time.sleep(FLOW_S)
    return [9.7] * len(pairs), []


def measured(tmp_path, monkeypatch, queueing: str,
             path: str = "ebpf") -> tuple[dict, StandInWatch]:
    """measure() of the 2-sender setup on the stand-in fabric, marking on ``path``."""
    import testbed.experiments.dctcp.experiment as module

    monkeypatch.setattr(module, "run_flows", fake_run_flows)
    monkeypatch.setattr(module, "PortBacklog", FakeBacklog)
    FakeBacklog.opened = []
    e = experiment(senders=[2], omit_s=0, seconds=5)
    setup = next(s for s in e.setups() if s.name == f"n2-{queueing}")
    watch = StandInWatch(rates={"l0->l0h2": 19.4}, utilisation={"l0->l0h2": 0.97})
    run = StandInRun(bench_running(setup.fabric, path), setup, tmp_path, watch)
    return e.measure(run), watch


@pytest.mark.parametrize("queueing", [DROPTAIL, ECN])
def test_measure_samples_the_real_backlog_beside_the_model(queueing, tmp_path, monkeypatch):
    r, watch = measured(tmp_path, monkeypatch, queueing)
    name = f"n2-{queueing}"
    assert FakeBacklog.opened == [("l0-eth3", None)]  # the receiver's port, by its name
    _, bottleneck, bandwidth_bound = watch.asked
    assert bottleneck == "l0->l0h2" and watch.asked_setup == name
    assert bandwidth_bound is (queueing == DROPTAIL)
    [(t0, t1)] = watch.windows
    assert t1 - t0 == pytest.approx(5 - END_MARGIN_S)
    assert r["window_monotonic_s"] == [t0, t1]
    samples = read_queue_samples(tmp_path / QUEUE_FILE)
    assert set(samples["qdisc_bytes"]) == {4500} and set(samples["marker_bytes"]) == {7500}
    assert len(samples["t_s"]) == len(samples["read_s"]) >= 20  # 0.8 s at 10 ms
    # the judged window starts with the flows, SERVER_START_S after run_flows was called
    judged = [t for t in samples["t_s"] if 0 <= t <= 4.5]
    assert r["queue"]["samples"] == len(judged) > 0
    assert r["queue"]["median_bytes"] == 4500 and r["marker_queue"]["median_bytes"] == 7500
    assert r["divergence"]["mean_bytes"] == 3000 and r["divergence"]["within_fraction"] == 0
    assert r["queue_source"] == "qdisc backlog (rtnetlink)"
    assert (r["senders"], r["queueing"], r["bottleneck"]) == (2, queueing, "l0-eth3")
    assert r["k_bytes"] == (K_BYTES if queueing == ECN else None)
    assert (r["k_scaling"] or {}).get("decided_by") == ("frames" if queueing == ECN else None)
    assert r["marks"] == 100 and r["utilisation"] == 0.97 and r["bottleneck_mbit"] == 19.4
    assert r["flow_mbit"] == [9.7, 9.7] and r["jain"] == 1.0
    assert r["idle_rtt"]["avg_ms"] == 0.2 and r["sampler_error"] is None
    assert r["fidelity"]["trustworthy"] and r["fidelity"]["emulator_lost"] == 0
    json.dumps(r)  # it goes into summary.json
    assert {c.setup for c in dctcp_checks({name: r})} == {name}


def test_on_the_red_path_only_the_qdisc_is_sampled(tmp_path, monkeypatch):
    r, _ = measured(tmp_path, monkeypatch, ECN, path="red-qdisc")
    samples = read_queue_samples(tmp_path / QUEUE_FILE)
    assert set(samples["qdisc_bytes"]) == {4500} and samples["marker_bytes"] is None
    assert r["queue"]["median_bytes"] == 4500
    assert r["marker_queue"] is None and r["divergence"] is None
