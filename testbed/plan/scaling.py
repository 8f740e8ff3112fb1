"""Default queue parameters from published anchors (docs/references.md), scaled to the
emulated link rate, each with a plain record of how it was scaled, for the run's results.

The anchors were measured or recommended at real data-center rates (1 to 40 Gbit/s); an
emulated link runs at tens to hundreds of Mbit/s. A threshold keeps its meaning when it
keeps its queueing delay, bytes / rate, so thresholds scale in proportion to the rate, as
the HPCC simulator's defaults do across link speeds (alibaba-edu/High-Precision-Congestion-
Control, mix/config.txt: Kmin 100/200/400 and Kmax 400/800/1600 at 25/50/100 Gbit/s).
Two floors keep a scaled threshold meaningful at low rates, and the record says when one
decided:

- a marking threshold is at least ``MIN_THRESHOLD_FRAMES`` full frames: below that, one
  frame being sent and one arriving behind it would count as congestion;
- a RED ramp spans at least ``MIN_RAMP_FRAMES`` full frames, or it is a step.

Records are dicts: ``parameter``, ``anchor`` (the published statement), ``anchor_rate_mbit``,
``anchor_value``, ``emulated_rate_mbit``, ``factor`` (value scaled / anchor value),
``scaled_value``, ``value`` (after bounds) and ``decided_by``.
"""
from __future__ import annotations

import math

from testbed.errors import ConfigError
from testbed.model.topology.checks import check_count, check_mtu, check_rate
from testbed.plan.profiles import (
    DEFAULT_CLASSES,
    MAX_PAUSE_QUANTA,
    PfcConfig,
    QueueConfig,
    RedEcn,
    StepEcn,
)

ANCHOR_PACKET_BYTES = 1500  # DCTCP counts K in packets of a standard Ethernet MTU
# DCTCP (Alizadeh et al., SIGCOMM 2010; RFC 8257): K = 20 packets at 1 Gbit/s, 65 at 10 Gbit/s.
DCTCP_K_ANCHORS = ((1000.0, 20), (10000.0, 65))  # (rate_mbit, K in packets)
DCTCP_RTT_DIVISOR = 7  # K > C * RTT / 7
# DCQCN (Zhu et al., SIGCOMM 2015): Kmin = 5 KB, Kmax = 200 KB, Pmax = 1%, chosen for the
# paper's 40 Gbit/s testbed (ConnectX-3 Pro NICs, 40GbE switches). KB taken as 1000 bytes.
DCQCN_ANCHOR_RATE_MBIT = 40000.0
DCQCN_KMIN_BYTES = 5_000
DCQCN_KMAX_BYTES = 200_000
DCQCN_PMAX = 0.01
MIN_THRESHOLD_FRAMES = 2
MIN_RAMP_FRAMES = 4
PFC_FRAME_BYTES = 64  # a pause frame on the wire
XON_HYSTERESIS_FRAMES = 2  # XON this many frames under XOFF, so pauses do not chatter
# Reaction time of a pause path when none is given. Hardware reacts within a few
# microseconds. The emulated one (testbed.apply.pfc_agent) samples the queues every 4 ms and
# pauses a neighbour about 0.5 ms (p99 2 ms) after sending the frame; but frames that left
# the neighbour's queue before the pause may still wait in the userspace switch's receive
# buffers, which grow when ovs-vswitchd is short of CPU. Measured on a k=4 fat-tree under
# 15:1 incast at 20 Mbit/s: 5 ms per end lost frames, 20 ms per end lost none.
DEFAULT_PFC_REACTION_TIME_S = 0.020
DEFAULT_CABLE_DELAY_S = 0.0  # veth pairs have no propagation delay


def _record(parameter: str, anchor: str, anchor_rate_mbit: float, anchor_value: float,
            rate_mbit: float, scaled: float, value: int, decided_by: str) -> dict:
    return {
        "parameter": parameter,
        "anchor": anchor,
        "anchor_rate_mbit": anchor_rate_mbit,
        "anchor_value": anchor_value,
        "emulated_rate_mbit": rate_mbit,
        "factor": scaled / anchor_value,
        "scaled_value": scaled,
        "value": value,
        "decided_by": decided_by,
    }


def _largest(candidates: dict[str, int]) -> tuple[str, int]:
    """The bound that decides (the first named wins a tie) and its value."""
    name = max(candidates, key=lambda key: candidates[key])
    return name, candidates[name]


def dctcp_k_anchor_bytes(rate_mbit: float) -> tuple[float, float, float]:
    """K in bytes from the DCTCP anchors: (K, anchor rate used, anchor K in bytes).

    At and between the anchors, log-log interpolation (exact at 1 and 10 Gbit/s; K grows
    as rate^0.51 there, because the faster testbed also had a shorter RTT); beyond them, in
    proportion to the rate from the nearer anchor (the same queueing delay).
    """
    (rate_lo, k_lo), (rate_hi, k_hi) = DCTCP_K_ANCHORS
    bytes_lo, bytes_hi = k_lo * ANCHOR_PACKET_BYTES, k_hi * ANCHOR_PACKET_BYTES
    if rate_mbit <= rate_lo:
        return bytes_lo * rate_mbit / rate_lo, rate_lo, bytes_lo
    if rate_mbit >= rate_hi:
        return bytes_hi * rate_mbit / rate_hi, rate_hi, bytes_hi
    exponent = math.log(bytes_hi / bytes_lo) / math.log(rate_hi / rate_lo)
    return bytes_lo * (rate_mbit / rate_lo) ** exponent, rate_lo, bytes_lo


def dctcp_step(rate_mbit: float, mtu_bytes: int,
               rtt_s: float | None = None) -> tuple[StepEcn, dict]:
    """DCTCP's marking threshold K for a link of ``rate_mbit``: the anchor scaled to the
    rate, raised to satisfy K > C * RTT / 7 when the path's ``rtt_s`` is known, and to
    the frame floor."""
    check_rate("rate_mbit", rate_mbit)
    check_mtu(mtu_bytes)
    scaled, anchor_rate, anchor_bytes = dctcp_k_anchor_bytes(rate_mbit)
    candidates = {"anchor": round(scaled), "frames": MIN_THRESHOLD_FRAMES * mtu_bytes}
    if rtt_s is not None:
        check_rate("rtt_s", rtt_s)
        bdp_bytes = rate_mbit * 1e6 / 8 * rtt_s
        candidates["rtt"] = math.floor(bdp_bytes / DCTCP_RTT_DIVISOR) + 1
    decided_by, k_bytes = _largest(candidates)
    anchor = (f"DCTCP K = {anchor_bytes / ANCHOR_PACKET_BYTES:.0f} packets of "
              f"{ANCHOR_PACKET_BYTES} B at {anchor_rate / 1000:g} Gbit/s; K > C*RTT/7")
    record = _record("k_bytes", anchor, anchor_rate, anchor_bytes, rate_mbit, scaled,
                     k_bytes, decided_by)
    if rtt_s is not None:
        record["rtt_s"] = rtt_s
    return StepEcn(k_bytes), record


def dcqcn_red(rate_mbit: float, mtu_bytes: int) -> tuple[RedEcn, list[dict]]:
    """DCQCN's RED-ECN profile for a link of ``rate_mbit``: Kmin and Kmax in proportion to
    the rate from the 40 Gbit/s anchor, then the frame floors; Pmax unchanged."""
    check_rate("rate_mbit", rate_mbit)
    check_mtu(mtu_bytes)
    factor = rate_mbit / DCQCN_ANCHOR_RATE_MBIT
    anchor = (f"DCQCN Kmin = 5 KB, Kmax = 200 KB, Pmax = 1% at "
              f"{DCQCN_ANCHOR_RATE_MBIT / 1000:g} Gbit/s")
    kmin_scaled = DCQCN_KMIN_BYTES * factor
    kmin_by, kmin = _largest({"anchor": round(kmin_scaled),
                              "frames": MIN_THRESHOLD_FRAMES * mtu_bytes})
    kmax_scaled = DCQCN_KMAX_BYTES * factor
    kmax_by, kmax = _largest({"anchor": round(kmax_scaled),
                              "frames": kmin + MIN_RAMP_FRAMES * mtu_bytes})
    records = [
        _record("kmin_bytes", anchor, DCQCN_ANCHOR_RATE_MBIT, DCQCN_KMIN_BYTES, rate_mbit,
                kmin_scaled, kmin, kmin_by),
        _record("kmax_bytes", anchor, DCQCN_ANCHOR_RATE_MBIT, DCQCN_KMAX_BYTES, rate_mbit,
                kmax_scaled, kmax, kmax_by),
        _record("pmax", anchor, DCQCN_ANCHOR_RATE_MBIT, DCQCN_PMAX, rate_mbit, DCQCN_PMAX,
                DCQCN_PMAX, "anchor"),
    ]
    return RedEcn(kmin, kmax, DCQCN_PMAX), records


def pfc_headroom_bytes(rate_mbit: float, mtu_bytes: int,
                       cable_delay_s: float = DEFAULT_CABLE_DELAY_S,
                       reaction_time_s: float = DEFAULT_PFC_REACTION_TIME_S,
                       fan_in: int = 1) -> int:
    """Bytes that can still arrive after a queue crosses XOFF, which the headroom above XOFF
    must hold for the class to stay lossless:

        headroom = 2 * rate * (cable_delay + reaction_time) + 2 * MTU + pause frame

    - the pause travels upstream over the cable while data keeps coming down it
      (rate * cable_delay each way);
    - the congested port takes up to ``reaction_time`` to emit the pause and the upstream
      port up to as long again to stop (rate * reaction_time each);
    - the pause waits behind the frame the congested port is sending, and the upstream port
      finishes the frame it has started (one MTU each), plus the pause frame itself.

    These are the delay components of the IEEE 802.1Qbb-2011 informative annex on buffer
    requirements (and of switch vendors' headroom guides), with one reaction time per end.
    A hardware switch reserves that headroom per ingress port; here the queue that crosses
    XOFF is an egress queue, which all ``fan_in`` ports of its switch that can feed it fill
    at once, so it holds ``fan_in`` times as much.
    """
    check_count("fan_in", fan_in, 1, 1 << 16)
    check_rate("rate_mbit", rate_mbit)
    check_mtu(mtu_bytes)
    for field, value in (("cable_delay_s", cable_delay_s), ("reaction_time_s", reaction_time_s)):
        if isinstance(value, bool) or not 0 <= value < math.inf:
            raise ConfigError(field, f"must be a non-negative number, got {value!r}")
    rate_bytes_per_s = rate_mbit * 1e6 / 8
    in_flight = 2 * rate_bytes_per_s * (cable_delay_s + reaction_time_s)
    return fan_in * (math.ceil(in_flight) + 2 * mtu_bytes + PFC_FRAME_BYTES)


def pfc_thresholds(rate_mbit: float, mtu_bytes: int, buffer_bytes: int,
                   cable_delay_s: float = DEFAULT_CABLE_DELAY_S,
                   reaction_time_s: float = DEFAULT_PFC_REACTION_TIME_S,
                   fan_in: int = 1) -> tuple[PfcConfig, dict]:
    """PFC for a lossless class owning ``buffer_bytes``: the headroom above, XOFF as high as
    the headroom allows (pausing as late as is safe), XON a little under XOFF."""
    headroom = pfc_headroom_bytes(rate_mbit, mtu_bytes, cable_delay_s, reaction_time_s, fan_in)
    xoff = buffer_bytes - headroom
    if xoff < 1:
        raise ConfigError("buffer_bytes", f"{buffer_bytes} B leaves no room under the PFC "
                                          f"headroom of {headroom} B at {rate_mbit} Mbit/s")
    xon = max(0, xoff - XON_HYSTERESIS_FRAMES * mtu_bytes)
    pfc = PfcConfig(xoff_bytes=xoff, xon_bytes=xon, headroom_bytes=headroom,
                    quanta=MAX_PAUSE_QUANTA)
    record = {
        "parameter": "headroom_bytes",
        "rule": "fan_in * (2 * rate * (cable_delay + reaction_time) + 2 * MTU + pause frame) "
                "(IEEE 802.1Qbb-2011 buffer requirements, per feeding port)",
        "fan_in": fan_in,
        "emulated_rate_mbit": rate_mbit,
        "mtu_bytes": mtu_bytes,
        "cable_delay_s": cable_delay_s,
        "reaction_time_s": reaction_time_s,
        "value": headroom,
        "xoff_bytes": xoff,
        "xon_bytes": xon,
    }
    return pfc, record


SCHEMES = ("dctcp", "dcqcn")


def scaled_queue_config(scheme: str, rate_mbit: float, mtu_bytes: int, buffer_bytes: int,
                        rtt_s: float | None = None, pfc: bool | None = None,
                        reaction_time_s: float = DEFAULT_PFC_REACTION_TIME_S,
                        fan_in: int = 1) -> tuple[QueueConfig, dict]:
    """A queue for ``scheme`` on a link of ``rate_mbit``, and the record of its scaling.

    "dctcp": step marking at K, no PFC. "dcqcn": RED-ECN and, unless ``pfc`` is False, PFC
    on the lossless class (RoCE's set-up). ``buffer_bytes`` is the port's buffer, e.g.
    ``testbed.plan.port_queue.default_buffer_bytes``.
    """
    if scheme not in SCHEMES:
        raise ConfigError("scheme", f"must be one of {', '.join(SCHEMES)}, got {scheme!r}")
    record: dict = {"scheme": scheme, "emulated_rate_mbit": rate_mbit, "mtu_bytes": mtu_bytes,
                    "buffer_bytes": buffer_bytes}
    pfc_config = None
    if scheme == "dctcp":
        ecn, k_record = dctcp_step(rate_mbit, mtu_bytes, rtt_s)
        record["ecn"] = [k_record]
    else:
        ecn, record["ecn"] = dcqcn_red(rate_mbit, mtu_bytes)
    with_pfc = scheme == "dcqcn" if pfc is None else pfc
    if with_pfc:
        pfc_config, record["pfc"] = pfc_thresholds(rate_mbit, mtu_bytes, buffer_bytes,
                                                   reaction_time_s=reaction_time_s,
                                                   fan_in=fan_in)
    queue = QueueConfig(buffer_bytes=buffer_bytes, ecn=ecn, classes=DEFAULT_CLASSES,
                        pfc=pfc_config)
    return queue, record
