"""Records the controller writes and the testbed reads: the files in a run folder, port counters polled over OpenFlow
(one JSON line per port per poll) and the rates computed from two of them, and the JSON-lines
files both sides use. Times are CLOCK_MONOTONIC seconds, one clock for every process of the
machine; rates are Mbit/s (1e6 bit/s)."""
from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path

# The controller's files in a run folder (testbed.apply.controller passes their paths).
EVENTS_FILE = "controller-events.jsonl"
PORT_STATS_FILE = "port-stats.jsonl"
WIRING_FILE = "wiring.jsonl"
ANYCAST_FILE = "anycast.json"

End = tuple[str, int]  # (switch, port)
FAILURE_EVENTS = ("link_down", "switch_down")


@dataclass(frozen=True)
class PortSample:
    """One port's counters as one poll found them; one JSON line of the port-stats file."""

    t_monotonic_s: float
    switch: str
    port: int
    tx_bytes: int
    rx_bytes: int
    tx_packets: int
    rx_packets: int
    tx_dropped: int
    # The switch's own clock for these counters (the port's age in the stats reply): rates
    # over it are free of the jitter of when the controller happened to read the reply.
    duration_s: float | None = None

    @property
    def end(self) -> End:
        return self.switch, self.port

    def to_json(self) -> str:
        return json.dumps(asdict(self))


def read_json_lines(path: str | Path) -> list[dict]:
    """The objects of a JSON-lines file, none when it is missing. A torn last line (its
    writer killed mid-line, as the controller is at the end of a run) is left out."""
    try:
        lines = Path(path).read_text().splitlines()
    except FileNotFoundError:
        return []
    records = []
    for number, line in enumerate(lines, 1):
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:
            if number < len(lines):
                raise ValueError(f"{path}:{number}: not a JSON object") from None
    return records


def port_samples(records: Iterable[dict]) -> list[PortSample]:
    return [PortSample(**record) for record in records]


def rate_mbit(before: PortSample, after: PortSample, counter: str) -> float | None:
    """Mean rate of ``counter`` (a byte counter) between two samples of one port, over the
    switch's own time between them where the samples carry it; None when no time passed or
    the counter went back (the port was deleted and added again)."""
    dt = after.t_monotonic_s - before.t_monotonic_s
    if before.duration_s is not None and after.duration_s is not None \
            and after.duration_s > before.duration_s:
        dt = after.duration_s - before.duration_s
    delta = getattr(after, counter) - getattr(before, counter)
    if dt <= 0 or delta < 0:
        return None
    return delta * 8 / dt / 1e6


def port_tx_rates_mbit(previous: Mapping[End, PortSample],
                       current: Mapping[End, PortSample]) -> dict[End, float]:
    """Mbit/s each port sent between two poll rounds, for ports sampled anew in both."""
    rates = {}
    for end, after in current.items():
        before = previous.get(end)
        rate = rate_mbit(before, after, "tx_bytes") if before is not None else None
        if rate is not None:
            rates[end] = rate
    return rates
