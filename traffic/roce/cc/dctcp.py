"""A DCTCP-style window for one QP (RFC 8257), fed by the ECN echo in the responder's ACKs.

Per ACK the engine reports the bytes newly acknowledged and, from the ECN echo, how many of
them arrived CE-marked. With g = 1/16:

- Observation window: bytes acknowledged and bytes marked are summed until the cumulative
  acknowledged bytes pass ``window_end``; then F = marked / acknowledged,
  alpha <- (1 - g) alpha + g F, and the next window ends once the data in flight now is
  acknowledged (window_end = delivered + flight, i.e. SND.NXT).
- Reaction, at most once per window of data: an ACK with marks outside a reduced window sets
  cwnd <- cwnd (1 - alpha/2) (with the alpha just updated, as RFC 8257 orders it) and
  ssthresh <- cwnd; the reduced window lasts until the data in flight then is acknowledged.
- Growth, for ACKs without marks outside a reduced window: slow start below ssthresh
  (cwnd += acked), congestion avoidance above it (cwnd += MSS * acked / cwnd, one MSS per
  window of data, i.e. per RTT).
- Loss (go-back-N after a NAK) halves cwnd once per window; a local ACK timeout sets
  ssthresh to half the window and cwnd to the minimum.

The window never drops below ``min_cwnd_packets`` MSS, so a QP can always send one packet.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass

from ..wire import COUNTER_MODULO
from .base import TimeSeries

_HALF_COUNTER = COUNTER_MODULO // 2


@dataclass(frozen=True)
class DctcpParams:
    mss_bytes: int = 1024
    g: float = 1 / 16
    initial_alpha: float = 1.0
    initial_cwnd_packets: float = 10
    min_cwnd_packets: float = 1
    initial_ssthresh_bytes: float = math.inf



def echo_delta(echo_total: int, last_total: int) -> int:
    """New marked bytes between two ECN-echo readings of the 32-bit wrapping counter
    (0 for an older reading that arrives late)."""
    delta = (echo_total - last_total) % COUNTER_MODULO
    return delta if delta < _HALF_COUNTER else 0


class DctcpWindow:
    name = "dctcp"

    def __init__(self, params: DctcpParams, now_s: float = 0.0):
        self.params = params
        self.mss = params.mss_bytes
        self.cwnd_bytes = params.initial_cwnd_packets * self.mss
        self.min_cwnd_bytes = params.min_cwnd_packets * self.mss
        self.ssthresh_bytes = params.initial_ssthresh_bytes
        self.alpha = params.initial_alpha
        self.delivered_bytes = 0
        self.window_end_bytes = self.cwnd_bytes   # the first window is the initial window
        self.window_acked_bytes = 0
        self.window_marked_bytes = 0
        self.reduced_until_bytes = -1             # inside a reduced window while delivered <= it
        self.marked_bytes = 0
        self.reductions = 0
        self.losses = 0
        self.series = TimeSeries("t_s", "cwnd_bytes", "alpha", "marked_fraction")
        self.series.append(now_s, self.cwnd_bytes, self.alpha, 0.0)

    def rate_bps(self) -> None:
        return None

    def window_bytes(self) -> float:
        return self.cwnd_bytes

    def on_sent(self, now_s: float, nbytes: int) -> None:
        pass

    def on_cnp(self, now_s: float) -> None:
        pass

    def advance(self, now_s: float) -> None:
        pass

    def on_ack(self, now_s: float, acked_bytes: int, marked_bytes: int, flight_bytes: int) -> None:
        marked_bytes = min(marked_bytes, acked_bytes)
        self.delivered_bytes += acked_bytes
        self.marked_bytes += marked_bytes
        self.window_acked_bytes += acked_bytes
        self.window_marked_bytes += marked_bytes
        if self.delivered_bytes >= self.window_end_bytes and self.window_acked_bytes > 0:
            fraction = self.window_marked_bytes / self.window_acked_bytes
            self.alpha = (1 - self.params.g) * self.alpha + self.params.g * fraction
            self.window_end_bytes = self.delivered_bytes + flight_bytes
            self.window_acked_bytes = self.window_marked_bytes = 0
            self.series.append(now_s, self.cwnd_bytes, self.alpha, fraction)
        reduced = self.delivered_bytes <= self.reduced_until_bytes
        if marked_bytes > 0:
            if not reduced:
                self._reduce(now_s, 1 - self.alpha / 2, flight_bytes)
        elif not reduced:
            if self.cwnd_bytes < self.ssthresh_bytes:
                self.cwnd_bytes += acked_bytes
            else:
                self.cwnd_bytes += self.mss * acked_bytes / self.cwnd_bytes

    def on_loss(self, now_s: float, timeout: bool, flight_bytes: int) -> None:
        self.losses += 1
        if timeout:
            self.ssthresh_bytes = max(self.cwnd_bytes / 2, 2 * self.mss)
            self.cwnd_bytes = self.min_cwnd_bytes
            self.reduced_until_bytes = self.delivered_bytes + flight_bytes
            self.series.append(now_s, self.cwnd_bytes, self.alpha, None)
        elif self.delivered_bytes > self.reduced_until_bytes:
            self._reduce(now_s, 0.5, flight_bytes)

    def _reduce(self, now_s: float, factor: float, flight_bytes: int) -> None:
        self.cwnd_bytes = max(self.min_cwnd_bytes, self.cwnd_bytes * factor)
        self.ssthresh_bytes = self.cwnd_bytes
        self.reduced_until_bytes = self.delivered_bytes + flight_bytes
        self.reductions += 1
        self.series.append(now_s, self.cwnd_bytes, self.alpha, None)

    def summary(self) -> dict:
        return {"name": self.name, "params": asdict(self.params), "cwnd_bytes": self.cwnd_bytes,
                "alpha": self.alpha, "reductions": self.reductions, "losses": self.losses,
                "marked_bytes": self.marked_bytes, "series": self.series.as_dict()}
