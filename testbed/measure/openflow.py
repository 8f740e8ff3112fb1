"""The controller's measurement files as plain data: port counters polled over OpenFlow
(port-stats JSON lines, testbed.controllers.apps.port_stats_app) turned into rates per link direction, and
failure events (events JSON lines, testbed.controllers.apps.fabric_app) turned into reaction times.

Times are CLOCK_MONOTONIC seconds (time.monotonic), one clock for every process of the
machine: a failure injected by the testbed and noticed by the controller are comparable.
Rates are Mbit/s (1e6 bit/s), each over the interval between two polls of one port. The bytes
a link direction carries are counted on its switch side (testbed.measure.telemetry.counted_directions):
the sending switch's TX counter, or for a host's uplink the RX counter of its switch port.
"""
from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from testbed.controllers.routing.wiring import wiring_summary
from testbed.measure.telemetry import counted_directions
from testbed.model.records import (
    EVENTS_FILE,
    FAILURE_EVENTS,
    PORT_STATS_FILE,
    WIRING_FILE,
    End,
    PortSample,
    port_samples,
    rate_mbit,
    read_json_lines,
)
from testbed.model.topology.base import Fabric


@dataclass(frozen=True)
class RatePoint:
    """The rate of one link direction over [t0_s, t1_s] (CLOCK_MONOTONIC seconds)."""

    t0_s: float
    t1_s: float
    mbit: float


def link_rate_series(fabric: Fabric, samples: Iterable[PortSample]) -> dict[str, list[RatePoint]]:
    """Per link direction ("src->dst", as testbed.measure.telemetry labels them), its rate between
    every two consecutive polls of the port that counts it, in time order."""
    by_end: dict[End, list[PortSample]] = defaultdict(list)
    for sample in samples:
        by_end[sample.end].append(sample)
    series = {}
    for src, dst, link, end, counter in counted_directions(fabric):
        port_end = (link.a, link.a_port) if end == 0 else (link.b, link.b_port)
        polls = sorted(by_end.get(port_end, []), key=lambda s: s.t_monotonic_s)
        points = []
        for before, after in zip(polls, polls[1:]):
            rate = rate_mbit(before, after, counter)
            if rate is not None:
                points.append(RatePoint(before.t_monotonic_s, after.t_monotonic_s, rate))
        series[f"{src}->{dst}"] = points
    return series


def window_mean_mbit(points: list[RatePoint], start_s: float, end_s: float) -> float | None:
    """Time-weighted mean rate over [start_s, end_s], from the polls overlapping it; None
    when none does."""
    weighted = seconds = 0.0
    for p in points:
        overlap = min(p.t1_s, end_s) - max(p.t0_s, start_s)
        if overlap > 0:
            weighted += p.mbit * overlap
            seconds += overlap
    return weighted / seconds if seconds else None


def link_rate_summary(fabric: Fabric, samples: list[PortSample],
                      window_s: tuple[float, float] | None = None) -> dict:
    """Per link direction: mean rate over ``window_s`` (CLOCK_MONOTONIC start and end; the
    whole file when None), peak rate of any one poll interval in it, and both as a fraction
    of the link's rate (None for an unshaped link)."""
    rates = {f"{src}->{dst}": link.rate_mbit for src, dst, link, _, _ in counted_directions(fabric)}
    times = [s.t_monotonic_s for s in samples]
    start, end = window_s or (min(times, default=0.0), max(times, default=0.0))
    links = {}
    for label, points in link_rate_series(fabric, samples).items():
        inside = [p for p in points if min(p.t1_s, end) > max(p.t0_s, start)]
        mean = window_mean_mbit(inside, start, end)
        peak = max((p.mbit for p in inside), default=None)
        rate = rates[label]
        links[label] = {
            "mean_mbit": mean, "peak_mbit": peak,
            "mean_utilisation": mean / rate if rate and mean is not None else None,
            "peak_utilisation": peak / rate if rate and peak is not None else None}
    return {"window_monotonic_s": [start, end], "polls": len(set(times)), "links": links}


@dataclass(frozen=True)
class Reaction:
    """How the controller reacted to one event after a failure injected at a known time:
    seconds until it noticed (``detected_s``) and until every switch it updated confirmed
    the new rules (``applied_s``), both from the injection."""

    event: str
    link: dict | None
    switch: str | None
    detected_s: float
    applied_s: float
    switches_updated: int


def reaction_times(events: Iterable[dict], injected_monotonic_s: float,
                   kinds: tuple[str, ...] = FAILURE_EVENTS) -> list[Reaction]:
    """The reactions to a failure injected at ``injected_monotonic_s``: every event of
    ``kinds`` noticed at or after it, in the order noticed (one per link or switch that went
    down: a link is reported once, by whichever of its switches notices first)."""
    after = sorted((e for e in events if e["event"] in kinds
                    and e["t_monotonic_s"] >= injected_monotonic_s),
                   key=lambda e: e["t_monotonic_s"])
    return [Reaction(e["event"], e.get("link"), e.get("switch"),
                     e["t_monotonic_s"] - injected_monotonic_s,
                     e["applied_monotonic_s"] - injected_monotonic_s, e["switches_updated"])
            for e in after]


def openflow_summary(workdir: Path, fabric: Fabric, window_monotonic_s=None) -> dict:
    """The controller's files in a run folder, summarised: its failure events as written, per
    link direction the rate the switches' own port counters saw during the window (the whole
    run when None), and its latest wiring check (None if none completed)."""
    events = read_json_lines(workdir / EVENTS_FILE)
    samples = port_samples(read_json_lines(workdir / PORT_STATS_FILE))
    window = tuple(window_monotonic_s) if window_monotonic_s else None
    return {"events": events,
            "port_counters": link_rate_summary(fabric, samples, window),
            "wiring": wiring_summary(read_json_lines(workdir / WIRING_FILE))}
