"""What the RoCE experiments measure, as pure functions of what the runs left: the RoCE packet
sample decoded (tshark names the InfiniBand BTH; scapy recomputes each packet's ICRC, which
also confirms the IP ID 0 the sender's ICRC assumes, testbed.traffic.roce.wire), the real
queue over a window, and the congestion controls' time series from the senders' results,
with the figures drawn from them.

A capture's checks: every captured frame decodes as InfiniBand BTH over UDP 4791 in tshark
(``-d udp.port==4791,infiniband``), and every one's ICRC verifies in scapy
(``scapy.contrib.roce.BTH.compute_icrc``), which can only hold if the kernel wrote IP ID 0
(the ICRC covers the IPv4 identification field).
"""
from __future__ import annotations

import subprocess
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

from testbed.errors import TestbedError
from testbed.measure.stats import percentile
from testbed.model.verdict import Check, holds

TSHARK_TIMEOUT_S = 120.0
TSHARK_FIELDS = ("frame.protocols", "infiniband.bth.opcode", "ip.id")
INFINIBAND = "infiniband"
MIN_CAPTURED_PACKETS = 10  # fewer says more about the capture than about the packets


# --- the packet sample --------------------------------------------------------------------------


def tshark_argv(path: Path) -> list[str]:
    """tshark printing, per frame of ``path``, its protocols, BTH opcode and IP ID, with UDP
    port 4791 decoded as InfiniBand (RoCEv2)."""
    return ["tshark", "-r", str(path), "-d", f"udp.port==4791,{INFINIBAND}", "-T", "fields",
            "-E", "separator=;", *(arg for name in TSHARK_FIELDS for arg in ("-e", name))]


def parse_tshark(text: str) -> dict:
    """``tshark_argv``'s output counted: frames, those tshark decoded down to the BTH, and
    the BTH opcodes seen."""
    frames = bth = 0
    opcodes: Counter = Counter()
    for line in text.splitlines():
        if not line.strip():
            continue
        protocols, opcode, _ = (line.split(";") + ["", ""])[:3]
        frames += 1
        if INFINIBAND in protocols.split(":") and opcode:
            bth += 1
            opcodes[int(opcode, 0)] += 1
    return {"frames": frames, "bth_frames": bth,
            "opcodes": {f"{op:#04x}": n for op, n in sorted(opcodes.items())}}


def scapy_verdicts(packets) -> dict:
    """Per packet carrying a BTH: whether scapy's ICRC matches the trailer, and whether its
    IP ID is 0 (what the sender's ICRC assumed)."""
    from scapy.contrib.roce import BTH
    from scapy.layers.inet import IP

    from testbed.traffic.roce.wire import scapy_icrc_ok

    roce = [p for p in packets if p.haslayer(BTH) and p.haslayer(IP)]
    return {"packets": len(roce), "icrc_ok": sum(scapy_icrc_ok(p) for p in roce),
            "ip_id_zero": sum(p[IP].id == 0 for p in roce)}


def decode_capture(path: Path) -> dict:
    """A capture read by tshark and by scapy; a reader that fails leaves ``error``."""
    import scapy.contrib.roce  # noqa: F401  (binds BTH to UDP 4791 before the pcap is read)
    from scapy.utils import rdpcap

    summary: dict = {"pcap": str(path), "error": None}
    try:
        out = subprocess.run(tshark_argv(path), capture_output=True, text=True,
                             timeout=TSHARK_TIMEOUT_S)
        if out.returncode != 0:
            raise TestbedError(f"tshark could not read {path}: {out.stderr.strip()[-300:]}")
        summary["tshark"] = parse_tshark(out.stdout)
        summary["scapy"] = scapy_verdicts(rdpcap(str(path)))
    except FileNotFoundError as err:
        summary["error"] = f"{err.filename or 'tshark'} is missing"
    except (OSError, subprocess.TimeoutExpired, TestbedError) as err:
        summary["error"] = str(err)
    return summary


def capture_checks(capture: dict | None, setup: str | None = None) -> list[Check]:
    """tshark decodes every captured frame as InfiniBand BTH, and scapy verifies every
    packet's ICRC (and so its IP ID 0); not judged without a capture."""
    names = ("RoCE sample decodes as InfiniBand BTH", "RoCE sample ICRC verified by scapy")
    if capture is None or capture.get("error"):
        why = "no capture" if capture is None else f"the capture could not be read: " \
                                                   f"{capture['error']}"
        return [holds(name, None, why, setup) for name in names]
    t, s = capture["tshark"], capture["scapy"]
    enough = t["frames"] >= MIN_CAPTURED_PACKETS
    return [
        holds(names[0], t["bth_frames"] == t["frames"] if enough else None,
              f"{capture['pcap']}: tshark decodes {t['bth_frames']} of {t['frames']} captured "
              f"frames as InfiniBand BTH over UDP 4791 (opcodes {t['opcodes']})"
              + ("" if enough else f"; fewer than {MIN_CAPTURED_PACKETS} frames captured"),
              setup, measured=t["bth_frames"], expected=t["frames"]),
        holds(names[1], s["icrc_ok"] == s["packets"] == t["frames"] if enough else None,
              f"scapy's BTH.compute_icrc matches the trailer of {s['icrc_ok']} of "
              f"{s['packets']} packets it read as BTH, of {t['frames']} captured; "
              f"{s['ip_id_zero']} carry IP ID 0, as the sender's ICRC assumes", setup,
              measured=s["icrc_ok"], expected=t["frames"]),
    ]


# --- the real queue -------------------------------------------------------------------------------


def window_queue(t_s: Sequence[float], depth_bytes: Sequence[int],
                 window_s: Sequence[float], mtu_bytes: int) -> dict:
    """The queue samples inside ``window_s`` (same clock as ``t_s``): their count, median,
    p95, max and mean in bytes and frames of ``mtu_bytes`` (None without samples)."""
    start, end = window_s
    depths = [d for t, d in zip(t_s, depth_bytes) if start <= t <= end]
    stats = ({"median": percentile(depths, 50), "p95": percentile(depths, 95),
              "max": max(depths), "mean": sum(depths) / len(depths)} if depths
             else dict.fromkeys(("median", "p95", "max", "mean")))
    out: dict = {"samples": len(depths)}
    for name, value in stats.items():
        out[f"{name}_bytes"] = value
        out[f"{name}_frames"] = None if value is None else value / mtu_bytes
    return out


def sampled_fraction(samples: int, window_s: Sequence[float], interval_s: float) -> float:
    """Samples taken against those the window holds at ``interval_s``."""
    expected = max(1, round((window_s[1] - window_s[0]) / interval_s))
    return samples / expected


# --- the congestion controls' series ----------------------------------------------------------


def cc_series(sender: dict) -> dict:
    """A sender's control series with times in CLOCK_MONOTONIC seconds: rate (DCQCN, none)
    or window (DCTCP-style), alpha, CNPs received; and the NP's CNPs sent from its receiver."""
    cc = sender.get("cc") or {}
    origin = sender.get("series_origin_monotonic_s") or 0.0
    series = {name: list(values) for name, values in (cc.get("series") or {}).items()}
    series["t_s"] = [origin + t for t in series.get("t_s", [])]
    receiver = sender.get("receiver") or {}
    np_origin = receiver.get("series_origin_monotonic_s") or 0.0
    np_series = (receiver.get("np") or {}).get("series") or {}
    return {"name": cc.get("name"), "series": series,
            "cnps_sent": {"t_s": [np_origin + t for t in np_series.get("t_s", [])],
                          "count": list(np_series.get("cnps_sent", []))}}


def scaling_rows(sender: dict) -> list[dict]:
    """How the sender's control scaled the paper's parameters to the link (DCQCN), as the
    host program reported it; empty for the others."""
    return list((sender.get("cc") or {}).get("scaling") or [])


def goodput_fraction(goodput_mbit: float | None, rate_mbit: float) -> float | None:
    return None if goodput_mbit is None else round(goodput_mbit / rate_mbit, 4)


def verified_check(flows: list[dict], setup: str | None = None) -> Check:
    """Every flow's data arrived intact: the receiver's memory hashes as the sender's. Not
    judged on the rxe path (perftest does not check the bytes); a flow whose program failed
    counts as not verified."""
    name = "RoCE data verified"
    if flows and all(f.get("transport") == "rxe" for f in flows):
        return holds(name, None, "perftest (the rxe path) moves the bytes without checking "
                     "them", setup)
    verified = sum(bool(f.get("data_verified")) for f in flows)
    return holds(name, verified == len(flows) if flows else None,
                 f"{verified} of {len(flows)} flows: the SHA-256 of the receiver's memory "
                 "region equals the sender's", setup, measured=verified, expected=len(flows))

