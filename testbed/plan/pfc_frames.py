"""IEEE 802.1Qbb priority flow control: pause frames and pause-time arithmetic.

A PFC frame is a MAC Control frame (ethertype 0x8808, opcode 0x0101) sent to the reserved
multicast 01:80:c2:00:00:01, with a class-enable vector and eight pause times, one per
priority, counted in quanta of 512 bit times at the link rate. An enabled class with a
non-zero time is paused (XOFF) for that long; an enabled class with time 0 resumes (XON);
a disabled class is left as it is. Frames are built and parsed with scapy's own layer
(``scapy.contrib.mac_control``), which also pads them to the 64-byte minimum.
"""
from __future__ import annotations

import math
import re
import struct
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from scapy.contrib.mac_control import MACControl, MACControlClassBasedFlowControl
from scapy.layers.l2 import Ether

from testbed.errors import ConfigError
from testbed.model.topology.checks import check_count, check_rate
from testbed.plan.profiles import MAX_PAUSE_QUANTA, PFC_CLASSES

PFC_DST_MAC = MACControl.DEFAULT_DST_MAC  # 01:80:c2:00:00:01
PFC_ETHERTYPE = 0x8808
PFC_OPCODE = MACControl.OP_CODE_CLASS_BASED_FLOW_CONTROL  # 0x0101
QUANTUM_BITS = 512
XOFF_QUANTA = MAX_PAUSE_QUANTA  # the longest pause; refreshed while the queue stays above XOFF
XON_QUANTA = 0
# Float noise tolerated when a duration is converted back to whole quanta.
QUANTA_EPSILON = 1e-9
MAC_PATTERN = re.compile(r"^[0-9a-f]{2}(:[0-9a-f]{2}){5}$")


def pause_duration_s(quanta: int, rate_mbit: float) -> float:
    """How long ``quanta`` pause quanta last on a link of ``rate_mbit``."""
    check_count("quanta", quanta, 0, MAX_PAUSE_QUANTA)
    check_rate("rate_mbit", rate_mbit)
    return quanta * QUANTUM_BITS / (rate_mbit * 1e6)


def quanta_for(duration_s: float, rate_mbit: float) -> int:
    """The fewest quanta that pause a link of ``rate_mbit`` for at least ``duration_s``."""
    check_rate("rate_mbit", rate_mbit)
    if isinstance(duration_s, bool) or not 0 <= duration_s < math.inf:
        raise ConfigError("duration_s", f"must be a non-negative number, got {duration_s!r}")
    quanta = math.ceil(duration_s * rate_mbit * 1e6 / QUANTUM_BITS - QUANTA_EPSILON)
    if quanta > MAX_PAUSE_QUANTA:
        longest = pause_duration_s(MAX_PAUSE_QUANTA, rate_mbit)
        raise ConfigError("duration_s", f"{duration_s} s exceeds the longest pause at "
                                        f"{rate_mbit} Mbit/s ({longest:.6g} s)")
    return max(quanta, 0)


def refresh_interval_s(quanta: int, rate_mbit: float) -> float:
    """How often to resend XOFF so a paused upstream never resumes in between: half the
    pause, leaving the other half for the frame to arrive and be acted on."""
    return pause_duration_s(quanta, rate_mbit) / 2


def _check_mac(field: str, mac: str) -> str:
    if not isinstance(mac, str) or not MAC_PATTERN.match(mac.lower()):
        raise ConfigError(field, f"must be a MAC address like 02:00:00:00:00:01, got {mac!r}")
    return mac.lower()


def pfc_frame(src_mac: str, pause_quanta: Mapping[int, int]) -> bytes:
    """The bytes of a PFC frame from ``src_mac`` pausing each class in ``pause_quanta`` for
    its number of quanta (0 resumes it); classes not named are not enabled."""
    src = _check_mac("src_mac", src_mac)
    if not pause_quanta:
        raise ConfigError("pause_quanta", "must name at least one class")
    fields = {}
    for cls, quanta in pause_quanta.items():
        check_count("pause_quanta", cls, 0, PFC_CLASSES - 1)
        check_count(f"pause_quanta[{cls}]", quanta, 0, MAX_PAUSE_QUANTA)
        fields[f"c{cls}_enabled"] = 1
        fields[f"c{cls}_pause_time"] = quanta
    frame = (Ether(dst=PFC_DST_MAC, src=src, type=PFC_ETHERTYPE)
             / MACControlClassBasedFlowControl(**fields))
    return bytes(frame)


def xoff_frame(src_mac: str, classes: Iterable[int], quanta: int = XOFF_QUANTA) -> bytes:
    """Pause ``classes`` for ``quanta`` (the longest pause by default)."""
    return pfc_frame(src_mac, {cls: quanta for cls in classes})


def xon_frame(src_mac: str, classes: Iterable[int]) -> bytes:
    """Resume ``classes`` at once."""
    return pfc_frame(src_mac, {cls: XON_QUANTA for cls in classes})


# IEEE 802 local experimental ethertype 1: a frame no switch or host here acts on.
KICK_ETHERTYPE = 0x88B5


def kick_frame(src_mac: str) -> bytes:
    """A minimum-size frame that asks nothing of its receiver, sent *through* an egress
    queue to make the kernel service it (``testbed.apply.pfc_agent``): the reserved
    MAC-control address, which bridges never forward, and a local experimental ethertype,
    which OVS (no table-miss flow) and hosts drop."""
    frame = Ether(dst=PFC_DST_MAC, src=_check_mac("src_mac", src_mac), type=KICK_ETHERTYPE)
    return bytes(frame / (b"\x00" * 46))


@dataclass(frozen=True)
class PfcFrame:
    """A decoded PFC frame: who sent it, and the pause time of every enabled class."""

    src_mac: str
    dst_mac: str
    pause_quanta: dict[int, int]


PFC_HEADER = struct.Struct("!6s6sHHH8H")  # dst, src, ethertype, opcode, class-enable vector, times


def _mac_text(raw: bytes) -> str:
    return ":".join(f"{b:02x}" for b in raw)


def decode_pfc_frame(data: bytes) -> PfcFrame | None:
    """The same decoding as ``parse_pfc_frame``, by fixed offsets: what the pause agent runs
    on every frame it receives (scapy takes about a millisecond per frame). A unit test holds
    the two to the same answers."""
    if len(data) < PFC_HEADER.size:
        return None
    dst, src, ethertype, opcode, enabled, *times = PFC_HEADER.unpack_from(data)
    if ethertype != PFC_ETHERTYPE or opcode != PFC_OPCODE:
        return None
    quanta = {cls: times[cls] for cls in range(PFC_CLASSES) if enabled >> cls & 1}
    return PfcFrame(src_mac=_mac_text(src), dst_mac=_mac_text(dst), pause_quanta=quanta)


def parse_pfc_frame(data: bytes) -> PfcFrame | None:
    """Decode ``data`` with scapy; None if it is not a PFC frame."""
    frame = Ether(data)
    if MACControlClassBasedFlowControl not in frame:
        return None
    pfc = frame[MACControlClassBasedFlowControl]
    quanta = {cls: getattr(pfc, f"c{cls}_pause_time") for cls in range(PFC_CLASSES)
              if getattr(pfc, f"c{cls}_enabled")}
    return PfcFrame(src_mac=frame.src, dst_mac=frame.dst, pause_quanta=quanta)
