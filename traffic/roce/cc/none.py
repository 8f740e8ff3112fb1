"""No congestion control: data leaves at the configured line rate (or unpaced), whatever the
network says. CNPs are only counted."""
from __future__ import annotations

from .base import TimeSeries


class LineRate:
    name = "none"

    def __init__(self, line_rate_bps: float | None = None, now_s: float = 0.0):
        self.line_rate_bps = line_rate_bps
        self.cnps_received = 0
        self.series = TimeSeries("t_s", "rate_bps", "cnps_received")
        self.series.append(now_s, line_rate_bps, 0)

    def rate_bps(self) -> float | None:
        return self.line_rate_bps

    def window_bytes(self) -> float | None:
        return None

    def on_sent(self, now_s: float, nbytes: int) -> None:
        pass

    def on_ack(self, now_s: float, acked_bytes: int, marked_bytes: int, flight_bytes: int) -> None:
        pass

    def on_cnp(self, now_s: float) -> None:
        self.cnps_received += 1
        self.series.append(now_s, self.line_rate_bps, self.cnps_received)

    def on_loss(self, now_s: float, timeout: bool, flight_bytes: int) -> None:
        pass

    def advance(self, now_s: float) -> None:
        pass

    def summary(self) -> dict:
        return {"name": self.name, "line_rate_bps": self.line_rate_bps,
                "cnps_received": self.cnps_received, "series": self.series.as_dict()}
