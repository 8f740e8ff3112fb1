"""Queue depths of the marked switch ports, sampled every few milliseconds during a run (as
mininet-tests/dctcp sampled at 10 ms), and the ``ecn`` part of a run's summary: the ports'
counters over the run (``testbed.system.counters``), depth statistics, path and queue, and
on the eBPF path how the marker's anchoring went (``anchor_errors`` and the anchor agent's
record).

Depths come, by marking path (``testbed.plan.ecn_plan``), from the eBPF marker's
``ecn_qdepth`` map (the backlog after the latest packet and its time, drained to the moment
of reading: ``ecn_plan.queue_bytes_at``) or from the RED qdiscs' backlog. The running fabric
does the reading (testbed.system.running.RunningFabric.marker_depths, by
``testbed.apply.marking.EcnMarking``); everything here is pure but the sampling thread. Cost
of a sample: one bpf system call (eBPF: ``testbed.apply.bpf_syscall``) or one ``tc -s -j
qdisc show`` process (RED) reads every port at once; the series keeps how long each read
took (``read_s``) and the statistics the interval achieved.
"""
from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager, nullcontext
from dataclasses import asdict, dataclass, field

from testbed.measure.stats import percentile
from testbed.plan.profiles import QueueConfig
from testbed.plan.settings import EcnSettings, queue_record
from testbed.system.counters import counter_delta, counter_totals
from testbed.system.running import RunningFabric

PERCENTILES = (50, 90, 99)


# --- queue depth ------------------------------------------------------------------------------


@dataclass
class QueueSeries:
    """Queue depths in bytes at times ``t_s`` (seconds since sampling started), and how long
    each read took."""

    t_s: list[float] = field(default_factory=list)
    depth_bytes: dict[str, list[int]] = field(default_factory=dict)
    read_s: list[float] = field(default_factory=list)
    error: str | None = None  # why sampling stopped early


def depth_stats(series: QueueSeries,
                threshold_bytes: int | Mapping[str, int] | None = None) -> dict | None:
    """Per-port statistics of the sampled depths (mean, percentiles, max, and the fraction of
    samples above ``threshold_bytes``, where marking starts: one for every port, or per
    interface), plus the interval the sampler achieved and the time its reads took; None
    without samples."""
    n = len(series.t_s)
    if n == 0:
        return None
    ports = {}
    for intf, depths in series.depth_bytes.items():
        stats = {"mean": sum(depths) / n, "max": max(depths),
                 **{f"p{pct}": percentile(depths, pct) for pct in PERCENTILES}}
        limit = (threshold_bytes.get(intf) if isinstance(threshold_bytes, Mapping)
                 else threshold_bytes)
        if limit is not None:
            stats["above_threshold_fraction"] = sum(d > limit for d in depths) / n
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


def anchor_errors(counters: Mapping[str, Mapping]) -> dict | None:
    """How far the marker's model had strayed from the real queue each time an anchor came
    (testbed.plan.anchoring), per port and over all ports, from the ports' counters
    (``testbed.system.counters.port_counters``, over a window by ``counter_delta``): anchors
    applied, the mean error (model - real: above 0, the model had drained too little), the
    mean absolute error and the largest absolute error (since the counters began, as peaks
    are). None when no port counts anchors (the RED path, or nothing marked)."""
    ports = {}
    for intf, c in counters.items():
        anchors = c.get("anchors")
        if not anchors:
            continue
        ports[intf] = {"anchors": anchors, "mean_error_bytes": c["anchor_error_bytes"] / anchors,
                       "mean_abs_error_bytes": c["anchor_abs_error_bytes"] / anchors,
                       "max_abs_error_bytes": c.get("anchor_max_abs_error_bytes")}
    if not ports:
        return None
    anchors = sum(p["anchors"] for p in ports.values())
    return {"anchors": anchors,
            "mean_error_bytes": sum(counters[i]["anchor_error_bytes"] for i in ports) / anchors,
            "mean_abs_error_bytes": sum(counters[i]["anchor_abs_error_bytes"]
                                        for i in ports) / anchors,
            "max_abs_error_bytes": max(p["max_abs_error_bytes"] or 0 for p in ports.values()),
            "ports": ports}


def ecn_report(settings: EcnSettings, path: str, counters: Mapping[str, Mapping],
               series: QueueSeries | None, anchoring: dict | None = None) -> dict:
    """The ``ecn`` part of a run's summary. ``samples`` (the raw series) is for a file of
    its own (``testbed.experiments.allreduce.report.write_results``), not for summary.json.
    ``anchoring``: the anchor agent's record (``EcnMarking.anchoring``), beside the model's
    errors at the anchors (``anchor_errors``)."""
    queue = settings.queue
    threshold = marking_starts_bytes(queue, counters)
    errors = anchor_errors(counters)
    report = {"path": path, "queue": queue_record(queue), "scaling": settings.scaling,
              "marking_starts_bytes": threshold, "sample_ms": settings.sample_ms,
              "ports": dict(counters),
              "totals": counter_totals(counters), "queue_depth": None, "sampler_error": None,
              "samples": None,
              "anchoring": (None if anchoring is None and errors is None
                            else {"agent": anchoring, "errors": errors})}
    if series is not None:
        report["queue_depth"] = depth_stats(series, threshold)
        report["sampler_error"] = series.error
        report["samples"] = asdict(series)
    return report


def marking_starts_bytes(queue: QueueConfig,
                         counters: Mapping[str, Mapping]) -> int | dict[str, int] | None:
    """The backlog above which ``queue`` marks: one number, or with several link rates
    (``QueueConfig.for_rate``) each port's (interface -> bytes, from its counters' rate);
    None without ECN."""
    if queue.ecn is None:
        return None
    if not queue.other_rates:
        return queue.ecn.start_bytes
    return {intf: queue.for_rate(port["rate_mbit"]).ecn.start_bytes
            for intf, port in counters.items()}


@contextmanager
def ecn_monitoring(net: RunningFabric, settings: EcnSettings | None,
                   result: dict) -> Iterator[None]:
    """Sample the marked ports' queue depths while the block runs; when it ends, put the ECN
    report (counters over the block, depth statistics, queue, path, scaling record, anchoring)
    in ``result["ecn"]``. Without marking (no queue on ``net``) it does nothing."""
    if net.ecn_path is None or settings is None:
        yield
        return
    before = net.ecn_counters()
    sampling = (queue_sampling(net.marker_depths, net.marked_ports(),
                               settings.sample_ms / 1000) if settings.sample_ms > 0
                else nullcontext())
    with sampling as series:
        yield
    counters = counter_delta(before, net.ecn_counters())
    result["ecn"] = ecn_report(settings, net.ecn_path, counters, series, net.ecn_anchoring())
