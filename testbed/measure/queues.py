"""Telemetry of the marked switch queues: per-port counters over a run, and every port's
queue depth sampled every few milliseconds during it (as mininet-tests/dctcp sampled at
10 ms), turned into the ``ecn`` part of a run's summary.

Two sources, by marking path (``testbed.plan.ecn_plan``):

- eBPF: the marker's ``ecn_counters`` map (CE marks, ECT packets, peak virtual backlog,
  virtual-FIFO drops) and its ``ecn_qdepth`` map (the backlog after the latest packet and
  its time, drained to the moment of reading: ``ecn_plan.queue_bytes_at``);
- either path: the buffer qdisc's own statistics (packets sent, drops, backlog, and RED's
  ``marked``). On the eBPF path its drops beside the marker's virtual drops show whether
  the virtual FIFO kept in step with the real one.

``testbed.apply.marking.EcnMarking`` does the reading; everything here is pure but the sampling
thread. Cost of a sample: one ``bpftool -j map dump`` (eBPF) or ``tc -s -j qdisc show``
(RED) process reads every port at once. Not yet measured on a live fabric: the series keeps
how long each read took (``read_s``) and the statistics the interval achieved; if reads
take a good part of the interval, read the pinned map with the bpf syscall instead
(BPF_OBJ_GET on the pin, then BPF_MAP_GET_NEXT_KEY and BPF_MAP_LOOKUP_ELEM, e.g. through
ctypes), which spawns no process on the emulator's two cores.
"""
from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field

from testbed.measure.stats import percentile
from testbed.plan.ecn_plan import Port, queue_bytes_at, rate_bytes_per_s
from testbed.plan.settings import EcnSettings, queue_record

# Counters that add up over time (a run's share is after minus before); the rest are peaks.
ADDITIVE_FIELDS = ("marks", "ect_packets", "offered_packets", "not_ect_over", "ce_arrived",
                   "virtual_fifo_drops", "fifo_drops", "sent_packets")
MARKER_FIELDS = {  # port counter -> field of the marker's ecn_counters
    "marks": "ce_marks", "ect_packets": "ect_packets", "offered_packets": "packets",
    "not_ect_over": "not_ect_over", "ce_arrived": "ce_arrived",
    "virtual_fifo_drops": "fifo_drops", "max_queue_bytes": "max_queue_bytes",
}
PERCENTILES = (50, 90, 99)


# --- counters ---------------------------------------------------------------------------------


def port_counters(ports: Sequence[Port], marker: Mapping[int, Mapping[str, int]] | None,
                  buffers: Mapping[str, Mapping]) -> dict[str, dict]:
    """Every port's counters: from the marker's map (keyed by ifindex; None on the RED path,
    whose marks come from the qdisc and whose other marker fields are None) and from its
    buffer qdisc's statistics (``ecn_plan.parse_buffer_stats``)."""
    counters = {}
    for port in ports:
        qdisc = buffers.get(port.intf, {})
        entry: dict = {"rate_mbit": port.rate_mbit, "fifo_drops": qdisc.get("drops", 0),
                       "sent_packets": qdisc.get("packets", 0)}
        if marker is None:
            entry.update(dict.fromkeys(MARKER_FIELDS))
            entry["marks"] = qdisc.get("marked", 0)
        else:
            values = marker.get(port.ifindex, {})
            entry.update({name: values.get(source, 0) for name, source in MARKER_FIELDS.items()})
        counters[port.intf] = entry
    return counters


def counter_delta(before: Mapping[str, Mapping], after: Mapping[str, Mapping]) -> dict[str, dict]:
    """``after`` with its additive counters made relative to ``before`` (peaks stay as read)."""
    delta = {}
    for intf, values in after.items():
        old = before.get(intf, {})
        delta[intf] = {name: (value - old[name] if name in ADDITIVE_FIELDS and value is not None
                              and old.get(name) is not None else value)
                       for name, value in values.items()}
    return delta


def counter_totals(counters: Mapping[str, Mapping]) -> dict:
    """Sums of the additive counters over all ports (None where no port has the field), the
    highest peak queue, and how many ports marked at all."""
    totals: dict = {}
    for name in ADDITIVE_FIELDS:
        values = [c.get(name) for c in counters.values() if c.get(name) is not None]
        totals[name] = sum(values) if values else None
    peaks = [c.get("max_queue_bytes") for c in counters.values()
             if c.get("max_queue_bytes") is not None]
    totals["max_queue_bytes"] = max(peaks) if peaks else None
    totals["ports_marking"] = sum(1 for c in counters.values() if c.get("marks"))
    return totals


# --- queue depth ------------------------------------------------------------------------------


def depths_from_qdepth(ports: Sequence[Port], samples: Mapping[int, Mapping[str, int]],
                       now_ns: int) -> dict[str, int]:
    """Every port's virtual backlog at ``now_ns`` (CLOCK_MONOTONIC) from the marker's
    ``ecn_qdepth`` entries; a port that has seen no packet is empty."""
    return {port.intf: (queue_bytes_at(samples[port.ifindex], rate_bytes_per_s(port.rate_mbit),
                                       now_ns) if port.ifindex in samples else 0)
            for port in ports}


@dataclass
class QueueSeries:
    """Queue depths in bytes at times ``t_s`` (seconds since sampling started), and how long
    each read took."""

    t_s: list[float] = field(default_factory=list)
    depth_bytes: dict[str, list[int]] = field(default_factory=dict)
    read_s: list[float] = field(default_factory=list)
    error: str | None = None  # why sampling stopped early


def depth_stats(series: QueueSeries, threshold_bytes: int | None = None) -> dict | None:
    """Per-port statistics of the sampled depths (mean, percentiles, max, and the fraction of
    samples above ``threshold_bytes``, where marking starts), plus the interval the sampler
    achieved and the time its reads took; None without samples."""
    n = len(series.t_s)
    if n == 0:
        return None
    ports = {}
    for intf, depths in series.depth_bytes.items():
        stats = {"mean": sum(depths) / n, "max": max(depths),
                 **{f"p{pct}": percentile(depths, pct) for pct in PERCENTILES}}
        if threshold_bytes is not None:
            stats["above_threshold_fraction"] = sum(d > threshold_bytes for d in depths) / n
        ports[intf] = stats
    span = series.t_s[-1] - series.t_s[0]
    return {"samples": n, "interval_s_mean": span / (n - 1) if n > 1 else None,
            "read_s_mean": sum(series.read_s) / n, "read_s_max": max(series.read_s),
            "threshold_bytes": threshold_bytes, "ports": ports}


def _sample_until(stop: threading.Event, read: Callable[[], Mapping[str, int]],
                  series: QueueSeries, interval_s: float) -> None:
    t0 = time.monotonic()
    while True:
        start = time.monotonic()
        try:
            depths = read()
        except Exception as exc:  # a thread has no caller to raise to: record it
            series.error = f"{type(exc).__name__}: {exc}"
            return
        took = time.monotonic() - start
        series.t_s.append(start - t0)
        series.read_s.append(took)
        for intf, values in series.depth_bytes.items():
            values.append(depths.get(intf, 0))
        if stop.wait(max(0.0, interval_s - took)):
            return


@contextmanager
def queue_sampling(read: Callable[[], Mapping[str, int]], intfs: Sequence[str],
                   interval_s: float) -> Iterator[QueueSeries]:
    """Call ``read`` (-> {interface: queue bytes}) every ``interval_s`` in a thread while the
    block runs; yields the series it fills. A failing read ends sampling, and the series'
    ``error`` says why."""
    series = QueueSeries(depth_bytes={intf: [] for intf in intfs})
    stop = threading.Event()
    thread = threading.Thread(target=_sample_until, args=(stop, read, series, interval_s),
                              daemon=True)
    thread.start()
    try:
        yield series
    finally:
        stop.set()
        thread.join()


# --- the run's report -------------------------------------------------------------------------


def ecn_report(settings: EcnSettings, path: str, counters: Mapping[str, Mapping],
               series: QueueSeries | None) -> dict:
    """The ``ecn`` part of a run's summary. ``samples`` (the raw series) is for a file of
    its own (``testbed.experiments.allreduce.report.write_results``), not for summary.json."""
    queue = settings.queue
    threshold = queue.ecn.start_bytes if queue.ecn is not None else None
    report = {"path": path, "queue": queue_record(queue), "scaling": settings.scaling,
              "marking_starts_bytes": threshold, "sample_ms": settings.sample_ms,
              "ports": dict(counters),
              "totals": counter_totals(counters), "queue_depth": None, "sampler_error": None,
              "samples": None}
    if series is not None:
        report["queue_depth"] = depth_stats(series, threshold)
        report["sampler_error"] = series.error
        report["samples"] = asdict(series)
    return report
