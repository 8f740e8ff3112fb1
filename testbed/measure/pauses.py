"""PFC pauses as a run measures them: the pause agent's per-interface counters over a window,
and a capture of the pause frames on the wire, kept as a pcap and decoded by tshark.

The pause agent (testbed.apply.pfc_agent) sends its frames past the egress queue
(PACKET_QDISC_BYPASS), and the kernel shows such frames to no packet socket on the interface
that sends them; the interface at the other end of the link receives them like any frame. So
a capture runs on a receiving interface: the NIC of a host beside the congested port, on the
same edge switch (``capture_point``). A host port can feed every other port of its switch
(testbed.plan.pfc.feeding_ports), so that switch pauses the host whenever the congested
port's lossless queue crosses XOFF, and resumes it at XON.

tcpdump writes the frames (``ether proto 0x8808``, each as it arrives) inside the host's
namespace; tshark reads them back, and its MAC Control dissector names opcode 0x0101 "Class
Based Flow Control" (802.1Qbb PFC) with the class-enable vector and the eight pause times.
"""
from __future__ import annotations

import subprocess
from dataclasses import asdict, dataclass, field
from pathlib import Path

from testbed.errors import ConfigError, TestbedError
from testbed.measure.capture import (  # noqa: F401 (tcpdump_stats: read with the captures)
    HostCapture,
    capture_argv,
    tcpdump_stats,
)
from testbed.model.topology.base import Fabric
from testbed.model.verdict import Check, holds, near
from testbed.plan.pfc_frames import PFC_ETHERTYPE, PFC_OPCODE
from testbed.plan.profiles import PFC_CLASSES

CAPTURE_FILE = "pause-frames.pcap"
CAPTURE_LOG = "pause-capture.log"
AGENT_COUNTERS = ("xoff_sent", "xon_sent", "frames_received", "pauses", "paused_s", "storms")
TSHARK_TIMEOUT_S = 120.0
MAC_CONTROL = "macc"  # tshark's name of the MAC Control protocol
TSHARK_FIELDS = ("frame.protocols", "eth.src", "macc.opcode", "macc.cbfc.enbv",
                 *(f"macc.cbfc.pause_time.c{p}" for p in range(PFC_CLASSES)))
# Named tolerance. The capture and the pause agent count the same frames on the same link (the
# agent as it sends them, tcpdump as they arrive), over a window that starts and ends with no
# queue congested: any difference is a frame lost on the link or by the capture.
CAPTURE_TOLERANCE_FRAMES = 0


# --- the pause agent's counters -----------------------------------------------------------------


def counter_deltas(before: dict, after: dict) -> dict[str, dict[str, float]]:
    """Per interface, the pause agent's counters' increase between two readings of its
    ``interfaces`` section (an interface absent before counts from zero)."""
    return {intf: {k: c.get(k, 0) - before.get(intf, {}).get(k, 0) for k in AGENT_COUNTERS}
            for intf, c in after.items()}


# --- where to capture ---------------------------------------------------------------------------


@dataclass(frozen=True)
class CapturePoint:
    """A host NIC that receives the pauses its edge switch sends when ``congested`` (the
    switch port towards the receiver) fills: ``host`` and its ``interface``, and ``sent_by``,
    the switch port at the other end of its link."""

    host: str
    interface: str
    sent_by: str
    congested: str


def capture_point(fabric: Fabric, receiver: str) -> CapturePoint:
    """The first other host on ``receiver``'s edge switch, in the fabric's order."""
    edge, _ = fabric.host_attachment(receiver)
    link, end = fabric.host_link(receiver)
    for host in fabric.hosts:
        if host.name != receiver and fabric.host_attachment(host.name)[0] == edge:
            own, own_end = fabric.host_link(host.name)
            return CapturePoint(host.name, own.intf(own_end), own.intf(1 - own_end),
                                link.intf(1 - end))
    raise ConfigError("receiver", f"{receiver} is the only host on {edge}: no neighbour there "
                                  "receives the pauses its port causes")


# --- tcpdump --------------------------------------------------------------------------------------


def tcpdump_argv(interface: str, path: Path) -> list[str]:
    """tcpdump writing every MAC Control frame arriving on ``interface`` to ``path``, each as
    it comes (-U), so a stop by signal loses none."""
    return capture_argv(interface, path, ["ether", "proto", f"{PFC_ETHERTYPE:#06x}"])


class PauseCapture(HostCapture):
    """tcpdump on ``point``'s host NIC, in the host's namespace, while the block runs; the
    frames go to ``folder``/pause-frames.pcap and tcpdump's messages beside it. Entering waits
    until tcpdump listens; leaving stops it (SIGTERM) and reads its closing counts."""

    def __init__(self, net, point: CapturePoint, folder: Path):
        path = folder / CAPTURE_FILE
        super().__init__(net, point.host, tcpdump_argv(point.interface, path.absolute()), path,
                         folder / CAPTURE_LOG)
        self.point = point


# --- tshark ---------------------------------------------------------------------------------------


@dataclass
class DecodedPauses:
    """What tshark made of a capture: every frame in it, those it decoded as MAC Control
    with the PFC opcode (0x0101, Class Based Flow Control), which of those pause a class
    (XOFF: an enabled class with a non-zero time) or only resume (XON), how many enable each
    class, and the senders' MAC addresses."""

    frames: int = 0
    pfc_frames: int = 0
    xoff_frames: int = 0
    xon_frames: int = 0
    by_priority: dict[int, int] = field(default_factory=dict)
    sources: list[str] = field(default_factory=list)

    def to_dict(self) -> dict:
        return asdict(self)


def tshark_argv(path: Path) -> list[str]:
    """tshark printing, one line per frame of ``path``, the protocols it decoded and the
    MAC Control fields (empty where a frame has none)."""
    return ["tshark", "-r", str(path), "-T", "fields", "-E", "occurrence=f",
            *(arg for name in TSHARK_FIELDS for arg in ("-e", name))]


def parse_tshark_fields(text: str) -> DecodedPauses:
    """``tshark_argv``'s output, counted."""
    decoded = DecodedPauses()
    sources = set()
    for line in text.splitlines():
        if not line.strip():
            continue
        protocols, src, opcode, enabled, *times = (line.split("\t") + [""] * len(TSHARK_FIELDS)
                                                   )[:len(TSHARK_FIELDS)]
        decoded.frames += 1
        if MAC_CONTROL not in protocols.split(":") or not opcode \
                or int(opcode, 0) != PFC_OPCODE:
            continue
        decoded.pfc_frames += 1
        sources.add(src)
        vector = int(enabled, 0) if enabled else 0
        classes = [p for p in range(PFC_CLASSES) if vector >> p & 1]
        for p in classes:
            decoded.by_priority[p] = decoded.by_priority.get(p, 0) + 1
        if any(int(times[p] or 0) for p in classes):
            decoded.xoff_frames += 1
        else:
            decoded.xon_frames += 1
    decoded.sources = sorted(sources)
    return decoded


def decode_pause_frames(path: Path) -> DecodedPauses:
    """Read a capture with tshark; a tshark that fails is a TestbedError with its message."""
    try:
        out = subprocess.run(tshark_argv(path), capture_output=True, text=True,
                             timeout=TSHARK_TIMEOUT_S)
    except FileNotFoundError:
        raise TestbedError("tshark is not installed (scripts/install.sh installs it)") from None
    except subprocess.TimeoutExpired:
        raise TestbedError(f"tshark took over {TSHARK_TIMEOUT_S:g} s to read {path}") from None
    if out.returncode != 0:
        raise TestbedError(f"tshark could not read {path}: {out.stderr.strip()[-300:]}")
    return parse_tshark_fields(out.stdout)


# --- the capture's record and its checks ------------------------------------------------


def capture_summary(point: CapturePoint, capture: PauseCapture, deltas: dict) -> dict:
    """A finished capture as plain data: where it ran, tcpdump's counts, what tshark decoded,
    and the pause agent's own count of the frames on that link (``deltas``: its counters'
    increase over the capture, ``counter_deltas``)."""
    sent = deltas.get(point.sent_by, {})
    summary = {"pcap": str(capture.path), **asdict(point),
               "agent_sent": int(sent.get("xoff_sent", 0) + sent.get("xon_sent", 0)),
               "agent_received": int(deltas.get(point.interface, {}).get("frames_received", 0)),
               "kernel_dropped": capture.stats.get("kernel_dropped"), "tcpdump": capture.stats,
               "error": None}
    try:
        summary.update(decode_pause_frames(capture.path).to_dict())
    except TestbedError as err:
        summary["error"] = str(err)
    return summary


def agent_alive_checks(results: dict[str, dict]) -> list[Check]:
    """A trust check per setup that ran the pause agent (``pause_agent_running`` in its
    results, which the harness records for every setup with PFC): a fabric whose pauses
    stopped being obeyed is not lossless."""
    return [holds("the pause agent ran throughout", r["pause_agent_running"],
                  "the pause agent (PFC) was still running when the measurement ended", setup)
            for setup, r in results.items() if "pause_agent_running" in r]


def capture_checks(capture: dict, setup: str | None = None) -> list[Check]:
    """tshark decodes every captured frame as PFC, and the capture holds as many frames as
    the pause agent sent on that link (``capture_summary``)."""
    decodes = "tshark decodes the captured pause frames as PFC"
    if capture.get("error"):
        return [holds(decodes, None, f"the capture could not be read: {capture['error']}",
                      setup)]
    frames, pfc_frames = capture["frames"], capture["pfc_frames"]
    return [
        holds(decodes, frames > 0 and pfc_frames == frames,
              f"{capture['pcap']} (on {capture['host']}, {capture['interface']}): tshark decodes "
              f"{pfc_frames} of {frames} captured frames as MAC Control opcode 0x0101, Class "
              f"Based Flow Control ({capture['xoff_frames']} pause, {capture['xon_frames']} "
              "resume)", setup, measured=pfc_frames, expected=frames),
        near("captured pause frames against the agent's count", pfc_frames,
             capture["agent_sent"], CAPTURE_TOLERANCE_FRAMES, "frames",
             f"{pfc_frames} frames captured on {capture['interface']}; the pause agent sent "
             f"{capture['agent_sent']} from {capture['sent_by']} and counted "
             f"{capture['agent_received']} arriving there (tcpdump dropped "
             f"{capture.get('kernel_dropped')})", setup),
    ]
