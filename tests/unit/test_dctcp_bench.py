"""The DCTCP micro-benchmark's pure parts: its config (one-line errors naming the field), the
bench fabric, the queue summary of synthetic samples, the verdict and its tolerances, the
table, the figures from files, and the ``testbed dctcp`` flags. ``run_dctcp`` is replaced
in every CLI test, so nothing here starts an emulation."""
from __future__ import annotations

import argparse
import json
import re
from dataclasses import asdict, replace
from pathlib import Path

import pytest

import testbed.experiments.dctcp.run as bench_module
from testbed import errors
from testbed.apply.network import default_buffer_bytes
from testbed.errors import ConfigError
from testbed.experiments.dctcp.run import (
    DROPTAIL,
    DROPTAIL_MEDIAN_MIN_FRACTION,
    ECN,
    ECN_MEDIAN_TOLERANCE_FRAMES,
    ECN_MIN_UTILISATION,
    END_MARGIN_S,
    MIN_CWND_SEGMENTS,
    PUBLISHED,
    QUEUE_FILE,
    ConfigurationResult,
    DctcpConfig,
    DctcpResult,
    bench_fabric,
    droptail_sysctls,
    format_dctcp,
    format_table,
    judge_pair,
    judged_window_s,
    parse_ping_rtt_ms,
    replot,
    summarise_queue,
    tcp_label,
    verdict,
    window_floor_bytes,
    write_dctcp_results,
    write_queue_samples,
)
from testbed.measure.fidelity import judge
from testbed.measure.telemetry import link_directions
from testbed.plan.profiles import StepEcn
from testbed.plan.settings import SYSCTL_TCP_CC, SYSCTL_TCP_ECN, TcpSettings

REPO = Path(__file__).resolve().parents[2]
USAGE_ERROR_STATUS = 2
MTU = 1500
RATE_MBIT = 20.0
BUFFER_BYTES = default_buffer_bytes(RATE_MBIT, MTU)  # 125000 B, 50 ms
K_BYTES = 3000


# --- config -----------------------------------------------------------------------------------


def test_the_defaults_validate_and_scale_k_from_the_dctcp_anchors():
    config = DctcpConfig()
    config.validate()
    settings = config.ecn_settings()
    # 20 packets at 1 Gbit/s scaled to 20 Mbit/s is 600 B, under the two-frame floor
    assert settings.queue.ecn == StepEcn(2 * MTU)
    assert settings.queue.buffer_bytes == BUFFER_BYTES
    record = settings.scaling["ecn"][0]
    assert record["decided_by"] == "frames"
    assert record["scaled_value"] == pytest.approx(600)


def test_an_explicit_k_is_taken_as_given_and_rtt_raises_a_scaled_k():
    explicit = DctcpConfig(k_bytes=30_000).ecn_settings()
    assert explicit.queue.ecn == StepEcn(30_000) and explicit.scaling is None
    rtt_s = 0.1  # 250 KB in flight at 20 Mbit/s: K > C*RTT/7
    k = DctcpConfig(rtt_s=rtt_s, buffer_bytes=500_000).ecn_settings().queue.ecn.k_bytes
    assert k > RATE_MBIT * 1e6 / 8 * rtt_s / 7


def test_buffer_is_configurable():
    assert DctcpConfig(buffer_bytes=60_000).ecn_settings().queue.buffer_bytes == 60_000


@pytest.mark.parametrize(("field", "value", "named"), [
    ("rate_mbit", 0, "rate_mbit"), ("rate_mbit", -20.0, "rate_mbit"),
    ("rate_mbit", float("nan"), "rate_mbit"), ("rate_mbit", 101.0, "rate_mbit"),
    ("rate_mbit", True, "rate_mbit"), ("rate_mbit", "20", "rate_mbit"),
    ("senders", (), "senders"), ("senders", (0,), "senders"), ("senders", (33,), "senders"),
    ("senders", (2, 2), "senders"), ("senders", (2.0,), "senders"), ("senders", "2", "senders"),
    ("seconds", 4, "seconds"), ("seconds", 601, "seconds"), ("seconds", 10.0, "seconds"),
    ("omit_s", -1, "omit_s"), ("omit_s", 61, "omit_s"),
    ("mtu_bytes", 575, "mtu_bytes"), ("mtu_bytes", 9001, "mtu_bytes"),
    ("buffer_bytes", 4 * MTU - 1, "buffer_bytes"), ("buffer_bytes", 2.5e5, "buffer_bytes"),
    ("k_bytes", 0, "k_bytes"), ("k_bytes", -1, "k_bytes"), ("k_bytes", BUFFER_BYTES, "k_bytes"),
    ("k_bytes", 3000.0, "k_bytes"),
    ("rtt_s", 0, "rtt_s"), ("rtt_s", -0.001, "rtt_s"),
    ("droptail_cc", "dctcp", "droptail_cc"), ("droptail_cc", "auto", "droptail_cc"),
    ("ecn_cc", "bbr", "ecn_cc"),
])
def test_bad_configs_are_one_line_errors_naming_the_field(field, value, named):
    with pytest.raises(ConfigError) as info:
        DctcpConfig(**{field: value}).validate()
    assert info.value.field == named
    assert "\n" not in str(info.value)


def test_rtt_does_not_apply_to_an_explicit_k():
    with pytest.raises(ConfigError) as info:
        DctcpConfig(k_bytes=30_000, rtt_s=0.001).validate()
    assert info.value.field == "rtt_s"


def test_the_judged_window_leaves_out_start_up_and_the_end():
    assert judged_window_s(DctcpConfig(seconds=30, omit_s=5)) == (5.0, 35.0 - END_MARGIN_S)


# --- the fabric and the hosts -----------------------------------------------------------------


@pytest.mark.parametrize("senders", [1, 2, 8, 32])
def test_bench_is_one_switch_and_the_bottleneck_is_its_port_to_the_receiver(senders):
    bench = bench_fabric(senders, RATE_MBIT, MTU)
    fabric = bench.fabric
    assert len(bench.senders) == senders and bench.receiver not in bench.senders
    assert len(fabric.hosts) == senders + 1
    switches = {fabric.host_attachment(h.name)[0] for h in fabric.hosts}
    assert switches == {"l0"}  # every host on the one leaf; the spine carries nothing
    assert bench.bottleneck_intf == f"l0-eth{senders + 1}"
    assert bench.bottleneck_intf in [intf for _, _, intf, _ in fabric.switch_ends()]
    directions = {d.label: d for d in link_directions(fabric)}
    bottleneck = directions[bench.bottleneck_label]
    assert bottleneck.counter_path == f"/sys/class/net/{bench.bottleneck_intf}/statistics/tx_bytes"
    assert bottleneck.rate_mbit == RATE_MBIT
    assert all(link.rate_mbit == RATE_MBIT for link in fabric.links)
    assert fabric.mtu_bytes == MTU


def test_drop_tail_hosts_turn_ecn_off_and_keep_their_congestion_control():
    tcp = TcpSettings("cubic", "cubic", False, "as configured")
    assert droptail_sysctls(tcp) == {SYSCTL_TCP_CC: "cubic", SYSCTL_TCP_ECN: "0"}


@pytest.mark.parametrize(("cc", "ecn", "label"), [("cubic", False, "cubic"),
                                                  ("cubic", True, "cubic+ecn"),
                                                  ("dctcp", True, "dctcp"),
                                                  (None, False, "default")])
def test_tcp_label(cc, ecn, label):
    assert tcp_label({"congestion_control": cc, "ecn": ecn}) == label


# --- measurements -----------------------------------------------------------------------------


def test_queue_summary_of_synthetic_samples():
    # 10 s at 10 ms: 0..999 packets' worth of bytes... in the judged window [2, 10) only
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
    assert summary["median_bytes"] == 49.5 * MTU


def test_queue_summary_counts_a_slow_sampler_and_an_empty_window():
    t_s = [i * 0.05 for i in range(200)]  # every 50 ms: a fifth of what 10 ms would give
    summary = summarise_queue(t_s, [MTU] * 200, (0.0, 9.95), MTU)
    assert summary["sampled_fraction"] == pytest.approx(0.2, rel=0.01)
    empty = summarise_queue(t_s, [MTU] * 200, (20.0, 30.0), MTU)
    assert empty["samples"] == 0 and empty["median_bytes"] is None
    assert empty["p95_packets"] is None and empty["interval_ms_mean"] is None


def test_ping_rtt():
    out = ("PING 10.0.0.4 (10.0.0.4) 56(84) bytes of data.\n\n--- 10.0.0.4 ping statistics ---\n"
           "5 packets transmitted, 5 received, 0% packet loss, time 803ms\n"
           "rtt min/avg/max/mdev = 0.091/0.137/0.201/0.040 ms\n")
    assert parse_ping_rtt_ms(out) == {"min_ms": 0.091, "avg_ms": 0.137, "max_ms": 0.201}
    lost = ("--- 10.0.0.4 ping statistics ---\n"
            "5 packets transmitted, 0 received, 100% packet loss, time 4081ms\n")
    assert parse_ping_rtt_ms(lost) is None


def test_window_floor():
    assert window_floor_bytes(8, MTU, RATE_MBIT, None) == 8 * MIN_CWND_SEGMENTS * MTU
    # 1 ms at 20 Mbit/s holds 2500 B
    assert window_floor_bytes(2, MTU, RATE_MBIT, 0.001) == pytest.approx(4 * MTU - 2500)
    assert window_floor_bytes(1, MTU, RATE_MBIT, 0.1) == 0


# --- verdict ----------------------------------------------------------------------------------


def run_of(queueing: str, median_bytes: float, utilisation: float, senders: int = 2,
           trustworthy: bool = True, sampled_fraction: float = 0.98) -> ConfigurationResult:
    fidelity = judge(0.5 if trustworthy else 0.99, 1.0, utilisation, 0.0,
                     bandwidth_bound=queueing == DROPTAIL)
    ecn = queueing == ECN
    return ConfigurationResult(
        label=f"n{senders}-{queueing}", senders=senders, queueing=queueing, rate_mbit=RATE_MBIT,
        mtu_bytes=MTU, buffer_bytes=BUFFER_BYTES, k_bytes=K_BYTES if ecn else None,
        tcp={"congestion_control": "cubic", "ecn": ecn}, ecn_path="ebpf",
        bottleneck=f"l0-eth{senders + 1}", window_s=[5.0, 34.5],
        queue={"samples": 2900, "sampled_fraction": sampled_fraction, "interval_ms_mean": 10.1,
               "median_bytes": median_bytes, "median_packets": median_bytes / MTU,
               "p95_bytes": median_bytes * 1.2, "p95_packets": median_bytes * 1.2 / MTU,
               "max_bytes": median_bytes * 1.5, "max_packets": median_bytes * 1.5 / MTU,
               "mean_bytes": median_bytes, "mean_packets": median_bytes / MTU},
        utilisation=utilisation, bottleneck_mbit=utilisation * RATE_MBIT,
        flow_mbit=[utilisation * RATE_MBIT / senders] * senders, jain=1.0,
        marks=1234 if ecn else 0, fifo_drops=0 if ecn else 56,
        virtual_fifo_drops=0 if ecn else 56, counters={}, fidelity=fidelity.to_dict(),
        idle_rtt={"min_ms": 0.1, "avg_ms": 0.2, "max_ms": 0.4})


GOOD_DROPTAIL = dict(queueing=DROPTAIL, median_bytes=0.8 * BUFFER_BYTES, utilisation=0.98)
GOOD_ECN = dict(queueing=ECN, median_bytes=K_BYTES + MTU, utilisation=0.96)


def result_of(*runs: ConfigurationResult) -> DctcpResult:
    return DctcpResult(config=asdict(DctcpConfig()), k_scaling=None, runs=list(runs))


def test_the_claim_holds_when_every_check_does():
    row = judge_pair(run_of(**GOOD_DROPTAIL), run_of(**GOOD_ECN))
    assert row["holds"], row
    assert row["ecn_median_minus_k_bytes"] == MTU
    assert row["droptail_median_fraction_of_buffer"] == pytest.approx(0.8)
    assert row["notes"] == []


@pytest.mark.parametrize(("droptail", "ecn", "failing"), [
    ({"median_bytes": DROPTAIL_MEDIAN_MIN_FRACTION * BUFFER_BYTES * 0.9}, {},
     "droptail_median_near_buffer"),
    ({}, {"median_bytes": K_BYTES + (ECN_MEDIAN_TOLERANCE_FRAMES + 1) * MTU}, "ecn_median_near_k"),
    ({}, {"utilisation": ECN_MIN_UTILISATION - 0.01}, "ecn_utilisation_ok"),
    ({"trustworthy": False}, {}, "emulator_kept_up"),
    ({"utilisation": 0.7}, {}, "emulator_kept_up"),  # drop-tail must fill the port
    ({}, {"sampled_fraction": 0.3}, "queue_sampled"),
])
def test_each_check_can_fail_the_claim(droptail, ecn, failing):
    row = judge_pair(run_of(**{**GOOD_DROPTAIL, **droptail}), run_of(**{**GOOD_ECN, **ecn}))
    assert not row[failing] and not row["holds"]
    others = {"droptail_median_near_buffer", "ecn_median_near_k", "ecn_utilisation_ok",
              "emulator_kept_up", "queue_sampled"} - {failing}
    assert all(row[name] for name in others), row


def test_ecn_at_low_utilisation_is_the_result_not_an_emulator_fault():
    ecn = run_of(**{**GOOD_ECN, "utilisation": 0.6})
    assert ecn.fidelity["trustworthy"]
    row = judge_pair(run_of(**GOOD_DROPTAIL), ecn)
    assert row["emulator_kept_up"] and not row["ecn_utilisation_ok"]


def test_many_flows_at_their_smallest_windows_are_named_when_they_exceed_k():
    row = judge_pair(run_of(**GOOD_DROPTAIL, senders=8),
                     run_of(queueing=ECN, median_bytes=16 * MTU, utilisation=1.0, senders=8))
    assert not row["ecn_median_near_k"]
    assert any("smallest windows" in note for note in row["notes"])
    assert row["window_floor_bytes"] == pytest.approx(16 * MTU - 20e6 / 8 * 0.0002)


def test_verdict_over_sender_counts():
    v = verdict(result_of(run_of(**GOOD_DROPTAIL), run_of(**GOOD_ECN),
                          run_of(**GOOD_DROPTAIL, senders=8),
                          run_of(**{**GOOD_ECN, "utilisation": 0.5}, senders=8)))
    assert set(v["by_senders"]) == {"2", "8"}
    assert v["by_senders"]["2"]["holds"] and not v["by_senders"]["8"]["holds"]
    assert v["emulator_kept_up"] and not v["claim_holds"]
    assert v["tolerances"]["ecn_min_utilisation"] == ECN_MIN_UTILISATION
    json.dumps(v)  # it goes into summary.json
    assert not verdict(result_of(run_of(**GOOD_DROPTAIL)))["claim_holds"]  # nothing to judge


# --- text and files ---------------------------------------------------------------------------


def test_table_rows_and_the_published_numbers_beside_ours():
    result = result_of(run_of(**GOOD_DROPTAIL), run_of(**GOOD_ECN),
                       run_of(**GOOD_DROPTAIL, senders=8, trustworthy=False),
                       run_of(**GOOD_ECN, senders=8))
    table = format_table(result)
    rows = [line for line in table.splitlines() if re.match(r"\s+\d+\s", line)]
    assert len(rows) == 4
    assert rows[0].split()[:3] == ["2", "drop-tail", "cubic"]
    assert rows[1].split()[:4] == ["2", "ECN", "cubic+ecn", "2.0"]
    assert "66.7" in rows[0]  # median 0.8 * 125000 B in 1500-byte packets
    assert "3.0" in rows[1] and "96.0%" in rows[1] and "1234" in rows[1]
    assert rows[2].endswith("NO") and rows[3].endswith("yes")
    text = format_dctcp(result)
    for entry in PUBLISHED:
        assert entry["statement"] in text
    assert "83-packet buffer" in text and "claim holds" in text and "claim NOT shown" in text
    assert "K = 3000 B = 2.0 packets at 20 Mbit/s (as configured)" in text
    result.k_scaling = DctcpConfig().ecn_settings().scaling["ecn"][0]
    assert ("scaled from the anchors, decided by frames; the anchor alone gives 600 B"
            in format_dctcp(result))


def write_run(tmp_path: Path, result: DctcpResult) -> None:
    for run in result.runs:
        (tmp_path / run.label).mkdir()
        t_s = [i * 0.01 for i in range(3500)]
        write_queue_samples(tmp_path / run.label / QUEUE_FILE, t_s,
                            [int(run.queue["median_bytes"])] * len(t_s), [0.002] * len(t_s))


def test_results_and_figures_from_files(tmp_path):
    result = result_of(run_of(**GOOD_DROPTAIL), run_of(**GOOD_ECN),
                       run_of(**GOOD_DROPTAIL, senders=8), run_of(**GOOD_ECN, senders=8))
    write_run(tmp_path, result)
    paths = write_dctcp_results(result, tmp_path)
    assert [p.name for p in paths] == ["summary.json", "queue_time.png", "queue_cdf.png"]
    assert all(p.stat().st_size > 0 for p in paths)
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["verdict"]["claim_holds"]
    assert summary["result"]["runs"][1]["k_bytes"] == K_BYTES
    assert summary["published"] == list(PUBLISHED)
    (tmp_path / "queue_cdf.png").unlink()
    assert [p.name for p in replot(tmp_path)] == ["queue_time.png", "queue_cdf.png"]
    with pytest.raises(errors.TestbedError):
        replot(tmp_path / "n2-ecn")
