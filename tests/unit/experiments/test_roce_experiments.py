"""The four RoCE experiments without root: their scenarios and setups, parameter checks, the
claims judged on synthetic results (PASS and FAIL worked out by hand), the printed rows and
the figures."""
from __future__ import annotations

import json

import pytest

from testbed.measure.pauses import agent_alive_checks
from testbed.errors import ConfigError
from testbed.drive.roce_flows import CC_FILE, QUEUE_FILE
from testbed.experiments.registry import load
from testbed.harness.scenario import SCENARIO_DIR
from testbed.model.verdict import PASS

FRAME = 1024 + 60 + 14  # a full RoCE frame at path MTU 1024


def scenario(name: str, **overrides):
    return load(SCENARIO_DIR / f"{name}.yaml", overrides)


def outcomes(checks) -> dict[tuple[str, str | None], str]:
    return {(c.name, c.setup): c.outcome for c in checks}


CAPTURE_OK = {"pcap": "x.pcap", "error": None,
              "tshark": {"frames": 300, "bth_frames": 300, "opcodes": {"0x0a": 290, "0x11": 10}},
              "scapy": {"packets": 300, "icrc_ok": 300, "ip_id_zero": 300}}
FLOW_OK = {"src": "l0h0", "dst": "l0h2", "data_verified": True, "errors": []}


# --- roce-loss --------------------------------------------------------------------------------


def loss_result(p: float, roce: float, tcp: float, **extra) -> dict:
    return {"loss_percent": p, "rate_mbit": 20.0, "roce_goodput_mbit": roce,
            "tcp_goodput_mbit": tcp, "tcp_retransmitted_segments": 3,
            "roce": {**FLOW_OK, "retransmitted_packets": 10, "naks": 2, "timeouts": 0},
            "applied_loss": {"matched": 1000, "dropped": round(10 * p), "fraction": p / 100},
            "errors": [], **extra}


def test_roce_loss_scenario_makes_a_setup_per_loss_rate():
    resolved = scenario("roce-loss")
    assert [s.name for s in resolved.setups] == ["loss-0", "loss-0.01", "loss-0.1", "loss-1"]
    assert all(len(s.fabric.hosts) == 2 and s.queue is None for s in resolved.setups)
    settings = resolved.experiment.settings()
    assert settings.cc == "none" and settings.link_rate_mbit is None  # unpaced, a window
    # 64 frames of 1098 B at 20 Mbit/s drain in 28.1 ms; four of them
    assert settings.ack_timeout_s == pytest.approx(4 * 64 * FRAME * 8 / 20e6)


def test_roce_loss_params_are_checked():
    for overrides, field in (({"params.loss_percents": [0.1, 1]}, "params.loss_percents"),
                             ({"params.loss_percents": [0, 1, 0.1]}, "params.loss_percents"),
                             ({"params.max_outstanding": 200}, "params.max_outstanding"),
                             ({"params.roce_mtu_bytes": 4096}, "params.roce_mtu_bytes"),
                             ({"params.omit_s": 10}, "params.omit_s")):
        with pytest.raises(ConfigError) as info:
            scenario("roce-loss", **overrides)
        assert field in str(info.value), (overrides, str(info.value))


def test_roce_loss_checks_pass_and_fail_by_hand():
    experiment = scenario("roce-loss").experiment
    results = {"loss-0": loss_result(0, 18.9, 19.0, capture=CAPTURE_OK),
               "loss-1": loss_result(1, 9.45, 17.1)}
    # zero loss: 18.9 / 20 = 0.945 >= 0.90. At 1%: RoCE keeps 9.45/18.9 = 0.5, TCP
    # 17.1/19 = 0.9; 0.5 / 0.9 = 0.556 <= 0.75
    checks = experiment.checks(results)
    got = outcomes(checks)
    assert got[("RoCE goodput without loss", "loss-0")] == PASS
    assert got[("RoCE's goodput falls faster than TCP's", "loss-1")] == PASS
    ratio = next(c for c in checks if c.name.startswith("RoCE's goodput falls"))
    assert ratio.measured == pytest.approx(0.5 / 0.9, abs=1e-4)
    assert got[("RoCE data verified", None)] == PASS
    assert got[("RoCE sample ICRC verified by scapy", "loss-0")] == PASS
    # RoCE keeping 0.8 against TCP's 0.9: 0.889 > 0.75 fails; 17 Mbit/s at zero loss fails
    results = {"loss-0": loss_result(0, 17.0, 19.0), "loss-1": loss_result(1, 13.6, 17.1)}
    got = outcomes(experiment.checks(results))
    assert got[("RoCE goodput without loss", "loss-0")] == "FAIL"
    assert got[("RoCE's goodput falls faster than TCP's", "loss-1")] == "FAIL"
    assert got[("RoCE sample decodes as InfiniBand BTH", "loss-0")] == "n/a"  # no capture


def test_roce_loss_rows_and_plot(tmp_path):
    experiment = scenario("roce-loss").experiment
    results = {"loss-0": loss_result(0, 18.9, 19.0), "loss-0.1": loss_result(0.1, 17.0, 19.0),
               "loss-1": loss_result(1, 9.45, 17.1, errors=["h0 -> h1: boom"])}
    rows = dict(experiment.rows(results))
    assert "RoCE 9.45 Mbit/s (50%" in rows["1% loss"] and "TCP 17.10 Mbit/s (90%" in rows["1% loss"]
    assert rows["loss-1: error"] == "h0 -> h1: boom"
    (path,) = experiment.plots(results, tmp_path, "run | 20 Mbit/s")
    assert path.exists() and path.stat().st_size > 0


# --- the bottleneck experiments ----------------------------------------------------------------


def bottleneck(tmp_path, name: str, senders: int, cc: str, median: float, goodputs: list,
               **extra) -> dict:
    """A setup's results as bottleneck_result makes them, with its files in a folder."""
    folder = tmp_path / name
    folder.mkdir()
    (folder / QUEUE_FILE).write_text(json.dumps({"t_s": [100.0, 100.01, 100.02],
                                                 "qdisc_bytes": [0, median, median],
                                                 "marker_bytes": None, "read_s": [0, 0, 0]}))
    (folder / CC_FILE).write_text(json.dumps({"l0h0->l0h2": {"name": cc, "series": {
        "t_s": [100.0, 101.0], "rate_bps": [2e7, 1e7], "alpha": [1.0, 0.5],
        "cnps_received": [0, 1]}, "cnps_sent": {"t_s": [100.9], "count": [1]}}}))
    from testbed.measure.stats import jain_index

    result = {"dir": str(folder), "senders": senders, "cc": cc, "settings": {},
              "bottleneck": "l0-eth3", "bottleneck_label": "l0->l0h2", "frame_bytes": FRAME,
              "window_monotonic_s": [105.0, 140.0], "flows_monotonic_s": [100.0, 140.0],
              "queue": {"samples": 3000, "median_bytes": median, "p95_bytes": median * 2,
                        "max_bytes": median * 3, "mean_bytes": median, "sampled_fraction": 0.9},
              "marker_queue": None, "divergence": None, "sampler_error": None,
              "flows": [dict(FLOW_OK) for _ in goodputs], "goodput_mbit": goodputs,
              "jain": jain_index(goodputs), "utilisation": 0.95, "cc_scaling": [],
              "marks": 120, "pfc": None, "capture": CAPTURE_OK, "errors": [],
              "rate_mbit": 20.0}
    result.update(extra)
    return result


def test_roce_dcqcn_scenario_setups():
    resolved = scenario("roce-dcqcn")
    assert [s.name for s in resolved.setups] == ["n2-dcqcn", "n4-dcqcn", "n4-none"]
    n4 = resolved.setups[1]
    assert (n4.queue.ecn.kmin_bytes, n4.queue.ecn.kmax_bytes) == (5000, 200_000)
    assert n4.queue.pfc.xoff_bytes == 484_680 and n4.queue.uses_classes
    dcqcn, none = resolved.experiment.settings(n4), resolved.experiment.settings(resolved.setups[2])
    assert (dcqcn.cc, dcqcn.link_rate_mbit, none.cc) == ("dcqcn", 20.0, "none")
    # a 1 MB buffer drains in 0.4 s at 20 Mbit/s; four drains
    assert dcqcn.ack_timeout_s == pytest.approx(1.6)
    with pytest.raises(ConfigError):
        scenario("roce-dcqcn", **{"params.senders": [5]})
    with pytest.raises(ConfigError):
        scenario("roce-dcqcn", **{"params.settle_s": 79})  # 80 s: a second left to judge


def test_roce_dcqcn_checks_by_hand(tmp_path):
    experiment = scenario("roce-dcqcn").experiment
    limits = {"kmin_bytes": 5000, "kmax_bytes": 200_000, "xoff_bytes": 484_680}
    results = {
        # Jain of (9.5, 9.0): 18.5^2 / (2 * (90.25 + 81)) = 342.25 / 342.5 = 0.99927
        "n2-dcqcn": bottleneck(tmp_path, "n2-dcqcn", 2, "dcqcn", 30_000, [9.5, 9.0], **limits),
        # Jain of (8, 2): 100 / (2 * 68) = 0.735; median 203000 > Kmax + 2 frames, 202196
        "n4-dcqcn": bottleneck(tmp_path, "n4-dcqcn", 2, "dcqcn", 203_000, [8.0, 2.0], **limits),
        "n4-none": bottleneck(tmp_path, "n4-none", 4, "none", 450_000, [5, 5, 5, 5], **limits),
    }
    got = outcomes(experiment.checks(results))
    assert got[("DCQCN flows share fairly", "n2-dcqcn")] == PASS
    assert got[("mean queue between Kmin and Kmax", "n2-dcqcn")] == PASS
    assert got[("DCQCN flows share fairly", "n4-dcqcn")] == "FAIL"
    assert got[("mean queue between Kmin and Kmax", "n4-dcqcn")] == "FAIL"
    assert got[("utilisation with DCQCN", "n2-dcqcn")] == PASS  # 0.95 >= 0.85
    assert got[("without congestion control the queue fills", "n4-none")] == PASS
    assert got[("queue sampled", "n4-none")] == PASS
    results["n2-dcqcn"]["utilisation"] = 0.6  # cut too far: the link idles
    assert outcomes(experiment.checks(results))[("utilisation with DCQCN", "n2-dcqcn")] == "FAIL"
    results["n2-dcqcn"]["utilisation"] = 0.95
    results["n4-none"]["queue"]["median_bytes"] = 150_000  # below Kmax: not filled
    assert outcomes(experiment.checks(results))[
        ("without congestion control the queue fills", "n4-none")] == "FAIL"
    rows = dict(experiment.rows(results))
    assert "Jain 0.999" in rows["n2-dcqcn"]
    paths = experiment.plots(results, tmp_path, "run")
    assert len(paths) == 6 and all(p.stat().st_size > 0 for p in paths)


def test_roce_incast_pfc_scenario_and_checks_by_hand(tmp_path):
    resolved = scenario("roce-incast-pfc")
    assert [s.name for s in resolved.setups] == ["pfc", "pfc+dcqcn"]
    assert resolved.setups[0].queue.ecn is None and resolved.setups[1].queue.ecn is not None
    assert len(resolved.setups[0].fabric.hosts) == 7
    experiment = resolved.experiment
    pfc = {"pause_frames_sent": 400, "paused_s": 12.0, "lossless_drops": 0,
           "pause_agent_running": True}
    results = {
        "pfc": bottleneck(tmp_path, "pfc", 6, "none", 700_000, [3.3] * 6, pfc=pfc,
                          xoff_bytes=778_552, kmin_bytes=None, kmax_bytes=None,
                          pause_agent_running=True),
        # 150 of 400 pause frames: 0.375 <= 0.5
        "pfc+dcqcn": bottleneck(tmp_path, "pfc+dcqcn", 6, "dcqcn", 50_000, [3.3] * 6,
                                pfc={**pfc, "pause_frames_sent": 150, "paused_s": 3.0},
                                xoff_bytes=778_552, kmin_bytes=5000, kmax_bytes=200_000,
                                pause_agent_running=True),
    }
    checks = experiment.checks(results)
    got = outcomes(checks)
    assert got[("no drops in the lossless class", "pfc")] == PASS
    assert got[("DCQCN cuts PFC's pauses", "pfc+dcqcn")] == PASS
    assert next(c for c in checks if c.name == "DCQCN cuts PFC's pauses").measured == 0.375
    results["pfc+dcqcn"]["pfc"].update(pause_frames_sent=300, lossless_drops=2)
    got = outcomes(experiment.checks(results))
    assert got[("DCQCN cuts PFC's pauses", "pfc+dcqcn")] == "FAIL"  # 0.75 > 0.5
    assert got[("no drops in the lossless class", "pfc+dcqcn")] == "FAIL"
    assert [c.passed for c in agent_alive_checks(results)] == [True, True]
    assert "2 lossless drops" in dict(experiment.rows(results))["pfc+dcqcn"]
    assert len(experiment.plots(results, tmp_path, "run")) == 4


def test_roce_dctcp_scenario_and_checks_by_hand(tmp_path):
    resolved = scenario("roce-dctcp")
    assert [s.name for s in resolved.setups] == ["n2-dctcp", "n4-dctcp"]
    queue = resolved.setups[0].queue
    assert queue.ecn.k_bytes == 3000 and queue.buffer_bytes == 125_000 and not queue.uses_classes
    experiment = resolved.experiment
    settings = experiment.settings(resolved.setups[0])
    assert settings.cc == "dctcp" and settings.link_rate_mbit is None  # a window, unpaced
    extra = {"k_bytes": 3000, "buffer_bytes": 125_000,
             "queue_record": {"ecn": [{"value": 3000, "anchor": "DCTCP K",
                                         "decided_by": "frames"}]}}
    results = {
        # |5000 - 3000| = 2000 <= 3 * 1098 = 3294; utilisation 0.95
        "n2-dctcp": bottleneck(tmp_path, "n2-dctcp", 2, "dctcp", 5000, [9.5, 9.4], **extra),
        # |7000 - 3000| = 4000 > 3294; utilisation 0.85 < 0.90
        "n4-dctcp": bottleneck(tmp_path, "n4-dctcp", 4, "dctcp", 7000, [4.2] * 4,
                               utilisation=0.85, **extra),
    }
    got = outcomes(experiment.checks(results))
    assert got[("median queue near K", "n2-dctcp")] == PASS
    assert got[("utilisation with the short queue", "n2-dctcp")] == PASS
    assert got[("median queue near K", "n4-dctcp")] == "FAIL"
    assert got[("utilisation with the short queue", "n4-dctcp")] == "FAIL"
    assert got[("RoCE data verified", "n2-dctcp")] == PASS
    rows = dict(experiment.rows(results))
    assert rows["n2-dctcp: K"].startswith("3000 B")
    assert len(experiment.plots(results, tmp_path, "run")) == 4


def test_the_rxe_transport_is_refused_without_rdma_rxe():
    from testbed.capabilities import detect

    if detect().capabilities["rdma_rxe"].available:
        pytest.skip("this kernel has rdma_rxe: there is nothing to refuse")
    with pytest.raises(ConfigError) as info:
        scenario("roce-loss", **{"params.transport": "rxe"})
    assert "params.transport" in str(info.value) and "rdma_rxe" in str(info.value)
    with pytest.raises(ConfigError) as info:
        scenario("roce-incast-pfc", **{"params.transport": "rxe"})
    assert "pfc+dcqcn needs the engine's DCQCN" in str(info.value)
