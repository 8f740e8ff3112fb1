"""What experiments that compare switch-queue modes on one fabric share (incast: drop-tail,
ECN and PFC; pfc-demo: lossy, PFC and PFC with ECN): the traffic class PFC protects, and the
hosts' TCP in a mode that marks and in one that does not, so that only the queue differs
between modes. Pure: the machine enters only as a testbed.capabilities.Platform."""
from __future__ import annotations

from testbed.capabilities import Platform, missing_capabilities
from testbed.plan.profiles import DEFAULT_CLASSES
from testbed.plan.settings import TCP_CC_AUTO, TcpSettings, tcp_settings

LOSSLESS_DSCP = next(tc.dscp[0] for tc in DEFAULT_CLASSES if tc.lossless)  # 26: RoCE's class
LOSSLESS_TOS = LOSSLESS_DSCP << 2  # the IP TOS byte of that class (ECN bits left to TCP)
# Congestion control of the modes without ECN: Linux's default before bbr, and what the
# incast and DCTCP papers compared against as "TCP". Reno where the kernel lacks cubic.
BASE_CC, FALLBACK_CC = "cubic", "reno"


def mode_tcp(ecn: bool, platform: Platform) -> TcpSettings:
    """The hosts' TCP in a mode with ECN marking (``ecn``: ECN on, and the best congestion
    control for it here, dctcp where the kernel has it) or without (cubic, reno where it is
    missing, ECN off: the same in every unmarked mode)."""
    if ecn:
        return tcp_settings(True, TCP_CC_AUTO, platform)
    cc = FALLBACK_CC if missing_capabilities(platform.capabilities, ["tcp_cubic"]) else BASE_CC
    return tcp_settings(False, cc, platform)
