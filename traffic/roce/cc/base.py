"""The interface every per-QP congestion control implements, and the time series it keeps.

The engine calls, with explicit time in seconds:
``on_sent`` for every burst of data handed to the socket (payload bytes), ``on_ack`` for every
ACK that retires data (bytes newly acknowledged, of which CE-marked per the responder's ECN
echo, and the bytes still in flight, SND.NXT - SND.UNA), ``on_cnp`` for every congestion
notification packet, ``on_loss`` for a NAK (go-back-N) or a local ACK timeout, and
``advance`` before it consults the control, so timers due by then have run. It paces data by
``rate_bps()`` (None: unpaced) and limits the bytes in flight to ``window_bytes()`` (None: no
window). Nothing here reads a clock or touches a socket.
"""
from __future__ import annotations

from dataclasses import fields, replace
from typing import Protocol, TypeVar

Params = TypeVar("Params")


class TimeSeries:
    """Named columns of plain lists, one row per ``append`` (the first column is time)."""

    def __init__(self, *columns: str):
        self.columns = columns
        self._data: dict[str, list] = {name: [] for name in columns}

    def append(self, *values) -> None:
        for name, value in zip(self.columns, values, strict=True):
            self._data[name].append(value)

    def __len__(self) -> int:
        return len(self._data[self.columns[0]])

    def as_dict(self) -> dict[str, list]:
        return {name: list(values) for name, values in self._data.items()}


class CongestionControl(Protocol):
    name: str
    series: TimeSeries

    def rate_bps(self) -> float | None: ...

    def window_bytes(self) -> float | None: ...

    def on_sent(self, now_s: float, nbytes: int) -> None: ...

    def on_ack(self, now_s: float, acked_bytes: int, marked_bytes: int, flight_bytes: int) -> None: ...

    def on_cnp(self, now_s: float) -> None: ...

    def on_loss(self, now_s: float, timeout: bool, flight_bytes: int) -> None: ...

    def advance(self, now_s: float) -> None: ...

    def summary(self) -> dict: ...


def with_overrides(params: Params, overrides: dict[str, float]) -> Params:
    """A parameter dataclass with some fields replaced; unknown names raise."""
    known = {f.name for f in fields(params)}
    unknown = set(overrides) - known
    if unknown:
        raise ValueError(f"unknown {type(params).__name__} fields {sorted(unknown)}; "
                         f"known: {sorted(known)}")
    return replace(params, **overrides)
