"""Per-QP congestion control, pluggable by name: ``none`` (line rate), ``dcqcn`` (rate, from
CNPs) and ``dctcp`` (window, from the ECN echo in ACKs). ``make`` builds one for a QP."""
from __future__ import annotations

from .base import CongestionControl, TimeSeries, with_overrides
from .dcqcn import DcqcnParams, NotificationPoint, ReactionPoint, ScaledParameter, params_for_link
from .dctcp import DctcpParams, DctcpWindow
from .none import LineRate

NAMES = ("none", "dcqcn", "dctcp")

__all__ = ["NAMES", "CongestionControl", "DcqcnParams", "DctcpParams", "DctcpWindow",
           "LineRate", "NotificationPoint", "ReactionPoint", "ScaledParameter", "TimeSeries",
           "make", "params_for_link", "with_overrides"]


def make(name: str, *, link_rate_bps: float | None, mtu_bytes: int,
         overrides: dict[str, float] | None = None, now_s: float = 0.0
         ) -> tuple[CongestionControl, list[ScaledParameter]]:
    """The control called ``name`` for a QP on a link of ``link_rate_bps`` (None: unpaced,
    only for ``none`` and ``dctcp``), with parameters overridden by ``overrides``; and, for
    DCQCN, the record of how the paper's parameters were scaled to that link."""
    overrides = dict(overrides or {})
    if name == "none":
        if overrides:
            raise ValueError(f"cc none takes no parameters, got {sorted(overrides)}")
        return LineRate(link_rate_bps, now_s), []
    if name == "dcqcn":
        if link_rate_bps is None:
            raise ValueError("DCQCN needs the link rate (its rates and timers scale with it)")
        params, record = params_for_link(link_rate_bps)
        return ReactionPoint(with_overrides(params, overrides), now_s), record
    if name == "dctcp":
        params = with_overrides(DctcpParams(mss_bytes=mtu_bytes), overrides)
        return DctcpWindow(params, now_s), []
    raise ValueError(f"unknown congestion control {name!r}; known: {NAMES}")
