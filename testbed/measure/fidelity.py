"""Did the emulator keep up? A verdict computed from what a run measured (Mininet-HiFi's rule:
numbers from a CPU-bound emulator are not to be trusted).

The verdict rests on three signals, as totals or means over the workload:
- machine CPU: an emulator with no idle CPU left is not keeping time;
- emulator losses, measured by packet conservation at the switches: every packet a switch
  port received either left through another port or was dropped by an emulated egress queue;
  the rest was lost inside the emulator (a switch that could not read its ports fast enough);
- delivery, for bandwidth-bound workloads: the busiest link (the bottleneck) must carry close
  to its configured rate. An emulator that falls behind without losing packets adds delay
  instead, and this is where it shows;
- delivery of every backlogged port, whatever the workload: a port whose queue held a standing
  backlog had packets to send all along, so it must have sent at its rate (less the time PFC
  paused it, and the gaps the pause agent's finer samples found it empty in). A shaper that drains below its rate (late timer wake-ups: steal, softirq work
  deferred) lengthens every queue and cuts every rate while no other signal moves;
- on the eBPF marking path, the marker's model of each marked queue against the kernel's own
  reading of that queue (``testbed.apply.backlogs``, a reading the marker never sees): marks
  made on a model that strayed from the queue mean nothing.
Reported beside them: TCP retransmissions and ovs-vswitchd's CPU. The last is no signal by
itself: with the userspace datapath its main loop makes a fixed-cost pass over every port per
wake-up and stays near one core under any load, absorbing more load in bigger batches.
"""
from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field, replace

from testbed.measure.rtt import RttProbe
from testbed.measure.stats import percentile
from testbed.measure.telemetry import (
    QueueReaders,
    Sampler,
    link_directions,
    window_mean,
    window_rates_mbit,
)
from testbed.model.verdict import Check, at_least, at_most
from testbed.plan.port_queue import htb_burst_bytes
from testbed.system.running import RunningFabric

# Named tolerances.
MAX_CPU_BUSY_FRACTION = 0.95       # the machine needs idle time left to be keeping up
# Packets lost inside switches / packets they received. The drop-tail fabrics here drop about
# 3% of packets at their own queues under a bandwidth-bound ring; emulator losses must stay
# an order of magnitude below what the emulated network itself does.
MAX_EMULATOR_LOSS_FRACTION = 0.005
MIN_LINK_DELIVERY_FRACTION = 0.85  # busiest link vs its configured rate (bandwidth-bound)
# A single thread's CPU, as cores over the measured window: a forwarding thread (ovs-vswitchd's
# main loop polls every non-PMD port; the pause agent samples every lossless queue) that never
# idled cannot have kept time, even when the machine as a whole had CPU left. Read from 100 Hz
# ticks over 0.25 s intervals (0.04 a tick), a pinned thread shows 0.99 or more; one at 0.97
# still idles and drains its work (k=4 incasts ran there with the bottleneck delivering 99.9%
# and nothing lost in the switches).
MAX_THREAD_CORES = 0.99
# Steal: the share of the CPUs' time the hypervisor gave to something else while this
# machine's vCPUs had work (counted as busy above). Not a verdict of its own: on the 2-core CI
# VM, runs that kept every other check took 5-15% stolen; every wake-up it delays comes late
# (a pause, a shaper's timer, a rank's turn), so it is named beside the verdict from here on.
STOLEN_NOTE_FRACTION = 0.05
# A port holds a standing backlog when at least STANDING_BACKLOG_FRAMES full frames wait in
# its queue in at least STANDING_SAMPLE_FRACTION of the samples of the window (at least
# MIN_QUEUE_SAMPLES of them): it had something to send nearly all the time, so it must send at
# its rate, at least MIN_BACKLOGGED_DELIVERY_FRACTION of it while it was backlogged (between
# samples that both found it so), less the time PFC paused it or, where the pause agent samples
# its lossless queues, the time they read empty.
STANDING_BACKLOG_FRAMES = 2
STANDING_SAMPLE_FRACTION = 0.5
MIN_QUEUE_SAMPLES = 4
MIN_BUSY_INTERVALS = 3  # intervals backlogged throughout, for a delivery worth judging
MIN_BACKLOGGED_DELIVERY_FRACTION = 0.90
# The eBPF marker's model of a queue may differ from the kernel's reading of that queue by at
# most a quarter of the marking range (K for step marking, Kmax - Kmin for RED) plus two
# frames and the port's shaper bucket (marker_tolerance_bytes), at the
# MARKER_DIVERGENCE_PERCENTILE of the samples of the window: beyond that its marks follow
# another queue than the real one.
MARKER_DIVERGENCE_RANGE_FRACTION = 0.25
MARKER_DIVERGENCE_SLACK_FRAMES = 2
MARKER_DIVERGENCE_PERCENTILE = 95
ETHERNET_HEADER_BYTES = 14


@dataclass(frozen=True)
class FidelityVerdict:
    """Whether the emulator kept up, the signals behind it, and the same judgement as
    checks of the shape every experiment reports (testbed.model.verdict.Check)."""

    trustworthy: bool
    reasons: list[str]
    cpu_busy_fraction: float
    vswitchd_cores: float
    link_delivery_fraction: float
    emulator_loss_fraction: float
    notes: list[str] = field(default_factory=list)
    checks: list[Check] = field(default_factory=list)
    threads: dict = field(default_factory=dict)  # process -> {"thread", "cores"}
    rtt: dict | None = None  # testbed.measure.rtt.RttResult, when a probe ran
    cpu_stolen_fraction: float | None = None  # None: not measured

    def to_dict(self) -> dict:
        return {**asdict(self), "checks": [c.to_dict() for c in self.checks]}


def emulator_losses(rx_packets: int, tx_packets: int, queue_drops: int) -> int:
    """Packets the switches received but neither sent on nor dropped in an emulated queue."""
    return max(0, rx_packets - tx_packets - queue_drops)


def _in_window(t_s: list[float], window_s: tuple[float, float]) -> list[int]:
    return [i for i, t in enumerate(t_s) if window_s[0] <= t <= window_s[1]]


def standing_ports(t_s: list[float], backlog_bytes: dict[str, list[int]],
                   window_s: tuple[float, float], frame_bytes: int) -> dict[str, float]:
    """The ports that held a standing backlog over the window (module constants), each with
    the fraction of its samples at or above ``STANDING_BACKLOG_FRAMES`` frames."""
    inside = _in_window(t_s, window_s)
    if len(inside) < MIN_QUEUE_SAMPLES:
        return {}
    floor = STANDING_BACKLOG_FRAMES * frame_bytes
    out = {}
    for label, values in backlog_bytes.items():
        share = sum(values[i] >= floor for i in inside) / len(inside)
        if share >= STANDING_SAMPLE_FRACTION:
            out[label] = share
    return out


def overlap_s(spans: list[tuple[float, float]], start: float, end: float) -> float:
    """Seconds of [start, end] covered by ``spans`` (disjoint intervals)."""
    return sum(max(0.0, min(end, b) - max(start, a)) for a, b in spans)


def union_spans(*span_lists: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """The disjoint union of spans, sorted."""
    out: list[tuple[float, float]] = []
    for start, end in sorted(span for spans in span_lists for span in spans):
        if out and start <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], end))
        elif end > start:
            out.append((start, end))
    return out


def backlogged_delivery(t_s: list[float], backlog_bytes: dict[str, list[int]],
                        sent_bytes: dict[str, list[int]], rate_of: dict[str, float],
                        paused: dict[str, list[tuple[float, float]]],
                        window_s: tuple[float, float], frame_bytes: int) -> dict[str, dict]:
    """Each standing port's delivery while it was backlogged: over the intervals between
    samples that both found at least ``STANDING_BACKLOG_FRAMES`` frames queued (it had
    something to send throughout), the bytes it sent (``sent_bytes``: its cumulative byte
    counter at the same samples) against what its rate sends in the part of those intervals
    it owed (``paused``: the spans it owed nothing, in the samples' seconds: PFC paused it,
    or a finer sampler found its queue empty in between). A bursty port owes nothing while
    idle, so its idle time does not count against it. Ports with fewer than
    ``MIN_BUSY_INTERVALS`` such intervals are not judged."""
    standing = standing_ports(t_s, backlog_bytes, window_s, frame_bytes)
    floor = STANDING_BACKLOG_FRAMES * frame_bytes
    inside = _in_window(t_s, window_s)
    out = {}
    for label in standing:
        if label not in rate_of or label not in sent_bytes:
            continue
        backlog, sent = backlog_bytes[label], sent_bytes[label]
        busy_s, busy_bytes, intervals = 0.0, 0, 0
        for i, j in zip(inside, inside[1:]):
            if backlog[i] < floor or backlog[j] < floor:
                continue
            intervals += 1
            busy_s += (t_s[j] - t_s[i]) - overlap_s(paused.get(label, []), t_s[i], t_s[j])
            busy_bytes += sent[j] - sent[i]
        if intervals < MIN_BUSY_INTERVALS:
            continue
        delivery = (1.0 if busy_s <= 0 else
                    busy_bytes * 8 / 1e6 / (rate_of[label] * busy_s))
        out[label] = {"delivery": delivery, "busy_s": round(busy_s, 3), "intervals": intervals}
    return out


def marker_divergence(t_s: list[float], model_bytes: dict[str, list[int]],
                      real_bytes: dict[str, list[int]], window_s: tuple[float, float],
                      swing_bytes: dict[str, list[int]] | None = None) -> dict[str, dict]:
    """Per marked port, how far the marker's model stood from the kernel's reading of the same
    queue over the window: the ``MARKER_DIVERGENCE_PERCENTILE`` of |model - real|, the mean
    of model - real (its bias) and the samples. ``swing_bytes``: per sample, half the span the
    model moved over while the queue was read (telemetry's two readings around it); a gap
    within it is no divergence, beyond it only the excess counts."""
    inside = _in_window(t_s, window_s)
    out = {}
    for label, model in model_bytes.items():
        real = real_bytes.get(label)
        if real is None or not inside:
            continue
        swing = (swing_bytes or {}).get(label) or [0] * len(model)
        diffs = [model[i] - real[i] for i in inside]
        gaps = [max(0, abs(model[i] - real[i]) - swing[i]) for i in inside]
        out[label] = {"abs_bytes": percentile(gaps, MARKER_DIVERGENCE_PERCENTILE),
                      "mean_bytes": sum(diffs) / len(diffs), "samples": len(diffs)}
    return out


def marker_tolerance_bytes(ecn, frame_bytes: int, bucket_bytes: int = 0) -> int:
    """How far a marker's model may stand from the real queue (module constants), for an ECN
    profile (testbed.plan.profiles.StepEcn or RedEcn) on a port whose shaper's bucket holds
    ``bucket_bytes``: the model drains smoothly at the rate, the token bucket sends up to a
    bucket at once, so while the port keeps time its real queue runs up to a bucket below the
    model (testbed.plan.port_queue.HTB_CATCH_UP_S)."""
    span = ecn.k_bytes if hasattr(ecn, "k_bytes") else ecn.kmax_bytes - ecn.kmin_bytes
    return int(MARKER_DIVERGENCE_RANGE_FRACTION * span
               + MARKER_DIVERGENCE_SLACK_FRAMES * frame_bytes + bucket_bytes)


def backlog_checks(delivery: dict[str, float] | None, marker: dict[str, dict] | None,
                   setup: str | None = None) -> tuple[list[Check], list[str]]:
    """The checks (and problems) of the ports' queues: every backlogged port delivered its
    rate (``delivery``: standing port -> ``backlogged_delivery``'s entry), and every
    marked port's model stayed near the queue (``marker``: port -> ``marker_divergence``'s
    entry with its ``tolerance_bytes``). None: not measured, no check; ``{"error": why}``:
    sampling failed, so the run cannot be trusted."""
    checks, problems = [], []
    if delivery is not None and "error" in delivery:
        checks.append(Check("backlogged ports deliver their rate", None,
                            f">= {MIN_BACKLOGGED_DELIVERY_FRACTION:g}", None,
                            "fraction of its rate", None,
                            f"the ports' queues could not be read: {delivery['error']}", setup))
        problems.append(f"the ports' queues could not be read ({delivery['error']}), so "
                        "whether they drained at their rates is unknown")
    elif delivery is not None:
        fraction = {label: d["delivery"] for label, d in delivery.items()}
        worst = min(fraction, key=fraction.get) if fraction else None
        measured = None if worst is None else round(fraction[worst], 4)
        ok = worst is None or fraction[worst] >= MIN_BACKLOGGED_DELIVERY_FRACTION
        statement = (f"{len(delivery)} ports held a standing backlog; the slowest, {worst}, "
                     f"sent {fraction[worst]:.0%} of its rate over the "
                     f"{delivery[worst]['busy_s']:g} s it was backlogged" if worst else
                     "no port held a standing backlog")
        checks.append(Check("backlogged ports deliver their rate", measured,
                            f">= {MIN_BACKLOGGED_DELIVERY_FRACTION:g}", None,
                            "fraction of its rate", ok, statement, setup))
        if not ok:
            slow = sorted(label for label, f in fraction.items()
                          if f < MIN_BACKLOGGED_DELIVERY_FRACTION)
            problems.append(f"{len(slow)} backlogged ports sent below "
                            f"{MIN_BACKLOGGED_DELIVERY_FRACTION:.0%} of their rate ({worst}: "
                            f"{fraction[worst]:.0%}): a shaper drained below its rate")
    if marker:
        worst = max(marker, key=lambda k: marker[k]["abs_bytes"] / marker[k]["tolerance_bytes"])
        entry = marker[worst]
        ok = all(m["abs_bytes"] <= m["tolerance_bytes"] for m in marker.values())
        checks.append(Check("ECN marker's model follows the real queue",
                            round(entry["abs_bytes"]), f"<= {entry['tolerance_bytes']}", None,
                            f"bytes, p{MARKER_DIVERGENCE_PERCENTILE} of |model - qdisc|", ok,
                            f"{worst}: the marker's model stood within {entry['abs_bytes']:.0f} "
                            f"B of the kernel's reading of the queue in "
                            f"{MARKER_DIVERGENCE_PERCENTILE}% of {entry['samples']} samples",
                            setup))
        if not ok:
            problems.append(f"the ECN marker's model of {worst} stood {entry['abs_bytes']:.0f} "
                            f"B from the real queue (limit {entry['tolerance_bytes']} B): it "
                            "marked another queue than the real one")
    return checks, problems


def judge(cpu_busy_fraction: float, vswitchd_cores: float, link_delivery_fraction: float,
          emulator_loss_fraction: float, bandwidth_bound: bool = True,
          setup: str | None = None, threads: dict[str, tuple[str, float]] | None = None,
          rtt: dict | None = None, cpu_stolen_fraction: float | None = None,
          backlogged: dict[str, dict] | None = None,
          marker: dict[str, dict] | None = None) -> FidelityVerdict:
    """Trustworthy when the CPU had headroom, the switches lost (almost) nothing, every
    backlogged port delivered its rate (``backlogged``), every marker's model followed its
    queue (``marker``; ``backlog_checks``) and, for a bandwidth-bound workload, the
    bottleneck link carried close to its rate. CPU time stolen by a hypervisor (part of the
    busy time) is noted from ``STOLEN_NOTE_FRACTION`` up."""
    problems = []
    if cpu_busy_fraction > MAX_CPU_BUSY_FRACTION:
        problems.append(f"machine CPU {cpu_busy_fraction:.0%} busy (limit "
                        f"{MAX_CPU_BUSY_FRACTION:.0%}): the emulator was CPU-bound")
    if emulator_loss_fraction > MAX_EMULATOR_LOSS_FRACTION:
        problems.append(f"the switches lost {emulator_loss_fraction:.2%} of the packets they "
                        f"received outside any emulated queue (limit "
                        f"{MAX_EMULATOR_LOSS_FRACTION:.1%}): the emulator could not keep up")
    notes = []
    if link_delivery_fraction < MIN_LINK_DELIVERY_FRACTION:
        message = (f"the busiest link carried {link_delivery_fraction:.0%} of its rate (need "
                   f"{MIN_LINK_DELIVERY_FRACTION:.0%})")
        if bandwidth_bound:
            problems.append(f"{message}: the emulator, not the emulated links, limited the "
                            "traffic")
        else:
            notes.append(f"{message}; the workload is not bandwidth-bound, so this decides nothing")
    if cpu_stolen_fraction is not None and cpu_stolen_fraction >= STOLEN_NOTE_FRACTION:
        notes.append(f"the hypervisor took {cpu_stolen_fraction:.0%} of the CPUs' time (steal, "
                     "counted as busy): wake-ups came late")
    threads = {p: (th, round(c, 4)) for p, (th, c) in (threads or {}).items()}
    for process, (thread, cores) in threads.items():
        if cores > MAX_THREAD_CORES:
            problems.append(f"{process}'s thread {thread} used {cores:.2f} of a core (limit "
                            f"{MAX_THREAD_CORES:g}): a saturated thread cannot keep time")
    excess = rtt.get("p50_excess_ms") if rtt else None
    if excess is not None and excess > rtt["limit_ms"]:
        problems.append(f"the probe's RTT under load exceeded its idle RTT plus every emulated "
                        f"queue on its path by {excess:.1f} ms at the median (limit "
                        f"{rtt['limit_ms']:.1f} ms): the emulator added delay")
    queue_checks, queue_problems = backlog_checks(backlogged, marker, setup)
    problems += queue_problems
    reasons = problems or [f"CPU {cpu_busy_fraction:.0%} busy, switches lost "
                           f"{emulator_loss_fraction:.3%} of packets outside emulated queues, "
                           f"busiest link at {link_delivery_fraction:.0%} of its rate "
                           f"(ovs-vswitchd {vswitchd_cores:.2f} cores)"]
    stolen = ("" if cpu_stolen_fraction is None else
              f" ({cpu_stolen_fraction:.0%} of its time stolen by the hypervisor)")
    checks = [
        at_most("machine CPU busy", round(cpu_busy_fraction, 4), MAX_CPU_BUSY_FRACTION,
                "fraction", f"the machine had idle CPU left, so the emulator kept time{stolen}",
                setup),
        at_most("packets lost inside the switches", round(emulator_loss_fraction, 6),
                MAX_EMULATOR_LOSS_FRACTION, "fraction of received",
                "every packet a switch received left it or was dropped by an emulated queue",
                setup),
    ]
    if bandwidth_bound:
        checks.append(at_least("busiest link delivery", round(link_delivery_fraction, 4),
                               MIN_LINK_DELIVERY_FRACTION, "fraction of its rate",
                               "the bottleneck link carried close to its configured rate",
                               setup))
    for process, (thread, cores) in threads.items():
        checks.append(at_most(f"{process} busiest thread", cores, MAX_THREAD_CORES,
                              "cores", f"its thread {thread} had idle time left", setup))
    if rtt and rtt.get("limit_ms") is not None:
        checks.append(at_most("probe RTT beyond idle and the emulated queues",
                              None if excess is None else round(excess, 2), rtt["limit_ms"],
                              "ms", "a probe across the fabric waited no longer than the queues "
                              "the emulator models explain", setup))
    checks += queue_checks
    return FidelityVerdict(not problems, reasons, cpu_busy_fraction, vswitchd_cores,
                   link_delivery_fraction, emulator_loss_fraction, notes, checks,
                   {p: {"thread": th, "cores": c} for p, (th, c) in threads.items()}, rtt,
                   None if cpu_stolen_fraction is None else round(cpu_stolen_fraction, 4))


class Watch:
    """What the fidelity verdict needs, sampled around a measurement on a running fabric
    (testbed.system.running.RunningFabric): every link direction's bytes, the machine's and
    ovs-vswitchd's CPU (testbed.measure.telemetry.Sampler), and the switches' packet
    counters before and after. ``verdict`` judges a window of it."""

    def __init__(self, net: RunningFabric, interval_s: float = 0.25,
                 probe: tuple[str, str] | None = None):
        """``probe``: (source, destination) hosts to measure RTT under load between
        (testbed.measure.rtt), or None."""
        self.net = net
        self.probe = None
        if probe is not None:
            self.probe = RttProbe(net, *probe)
        threads = net.emulator_processes()
        queues = QueueReaders(net.port_backlogs, net.marker_backlogs)
        self.sampler = Sampler(link_directions(net.fabric), threads["ovs-vswitchd"], interval_s,
                               threads=threads, queues=queues)
        self.directions = {d.label: d for d in self.sampler.directions}
        self.before: dict[str, int] = {}
        self.switches: dict[str, int] = {}
        self.t_start = self.t_end = 0.0

    def __enter__(self) -> Watch:
        if self.probe is not None:
            self.probe.idle()
            self.probe.__enter__()
        self.before = self.net.switch_counters()
        self.sampler.__enter__()
        self.t_start = time.monotonic()
        return self

    def __exit__(self, *exc) -> None:
        self.t_end = time.monotonic()
        self.sampler.__exit__(*exc)
        if self.probe is not None:
            self.probe.__exit__(*exc)
        after = self.net.switch_counters()
        self.switches = {k: v - self.before[k] for k, v in after.items()}

    @property
    def series(self):
        return self.sampler.series

    def window_s(self, t0_monotonic: float | None = None,
                 t1_monotonic: float | None = None) -> tuple[float, float]:
        """A CLOCK_MONOTONIC interval (default: the whole watch) in sampler seconds."""
        t0 = self.t_start if t0_monotonic is None else t0_monotonic
        t1 = self.t_end if t1_monotonic is None else t1_monotonic
        return self.sampler.since_start_s(t0), self.sampler.since_start_s(t1)

    def rates_mbit(self, window_s: tuple[float, float]) -> dict[str, float]:
        return window_rates_mbit(self.series, *window_s)

    def utilisation(self, window_s: tuple[float, float]) -> dict[str, float]:
        """Every shaped link direction's rate over the window as a fraction of its rate."""
        rates = self.rates_mbit(window_s)
        return {label: rates[label] / d.rate_mbit for label, d in self.directions.items()
                if d.rate_mbit}

    def emulator_lost(self) -> int:
        """Packets the switches lost outside any emulated queue over the watch. Impairments'
        losses are intended, and so are those of links and switches the run cut: while a cut
        lasts, packets forwarded to a port that is down vanish before any counter sees them,
        as on a real switch (``RunningFabric.failure_losses``, windows inside the watch)."""
        s = self.switches
        lost = emulator_losses(s["rx_packets"], s["tx_packets"],
                               s["queue_drops"] + s.get("impairment_drops", 0))
        return max(0, lost - self.failure_lost())

    def failure_lost(self) -> int:
        """Packets lost to the run's own cuts in failure windows that lie inside the watch."""
        return sum(w["lost_packets"] for w in self.net.failure_losses()
                   if self.t_start <= w["start_s"] and w["end_s"] <= self.t_end)

    def verdict(self, window_s: tuple[float, float] | None = None, bottleneck: str | None = None,
                bandwidth_bound: bool = True, setup: str | None = None) -> FidelityVerdict:
        """The fidelity verdict over ``window_s`` (default: the whole watch); delivery is
        judged on ``bottleneck`` (a link direction label) or else the busiest link."""
        window = window_s or self.window_s()
        util = self.utilisation(window)
        delivery = util.get(bottleneck, 0.0) if bottleneck else max(util.values(), default=0.0)
        received = max(self.switches.get("rx_packets", 0), 1)
        rtt = None
        if self.probe is not None:
            t0 = self.sampler._t0
            rtt = self.probe.result((t0 + window[0], t0 + window[1])).to_dict()
        backlogged, marker = self.queue_signals(window)
        verdict = judge(window_mean(self.series.cpu_busy_fraction, self.series, *window),
                     window_mean(self.series.vswitchd_cores, self.series, *window),
                     delivery, self.emulator_lost() / received, bandwidth_bound, setup,
                     self.busiest_threads(window), rtt,
                     window_mean(self.series.cpu_stolen_fraction, self.series, *window),
                     backlogged, marker)
        cut = self.failure_lost()
        if not cut:
            return verdict
        return replace(verdict, notes=[*verdict.notes, f"{cut} packets sent into links and "
                                       "switches the run cut, while they were down, are the "
                                       "failures' losses, not counted against the emulator"])

    def queue_signals(self, window_s: tuple[float, float]) -> tuple[dict | None, dict | None]:
        """The standing ports' delivery and the marked ports' divergence over the window
        (``judge``'s ``backlogged`` and ``marker``); None where not sampled."""
        s = self.series
        if self.sampler.queues is None:
            return None, None
        if s.queue_error is not None:
            return {"error": s.queue_error}, None
        frame = self.net.fabric.mtu_bytes + ETHERNET_HEADER_BYTES
        t0 = self.sampler._t0
        # a port owes its rate neither while PFC paused it nor while the pause agent's finer
        # samples (every 10 ms) found its lossless queues empty between two of these (an
        # incast's rounds leave such gaps)
        span = (t0 + window_s[0], t0 + window_s[1])
        paused, empty = self.net.paused_spans(*span), self.net.empty_spans(*span)
        paused = {label: [(a - t0, b - t0) for a, b in union_spans(paused.get(label, []),
                                                                    empty.get(label, []))]
                  for label in set(paused) | set(empty)}
        rates = {label: d.rate_mbit for label, d in self.directions.items() if d.rate_mbit}
        sent = {label: [counts[i] for i in s.queue_index]
                for label, counts in s.link_bytes.items()}
        delivery = backlogged_delivery(s.queue_t_s, s.backlog_bytes, sent, rates, paused,
                                       window_s, frame)
        marker = None
        if s.model_bytes:  # each port judged by the thresholds of its own link's rate
            queue, mtu = self.net.queue, self.net.fabric.mtu_bytes

            def tolerance(rate_mbit: float) -> int:
                at_rate = queue.for_rate(rate_mbit)
                return marker_tolerance_bytes(at_rate.ecn, frame, htb_burst_bytes(
                    rate_mbit, mtu, at_rate.uses_classes))

            marker = {label: {**entry,
                              "tolerance_bytes": tolerance(self.directions[label].rate_mbit)}
                      for label, entry in marker_divergence(s.queue_t_s, s.model_bytes,
                                                            s.backlog_bytes, window_s,
                                                            s.model_swing_bytes).items()}
        return delivery, marker

    def busiest_threads(self, window_s: tuple[float, float]) -> dict[str, tuple[str, float]]:
        """Per watched process, the thread busiest in most intervals of the window and the
        mean cores of the busiest thread over it."""
        out = {}
        for process, cores in self.series.thread_cores.items():
            names = [n for n, t in zip(self.series.thread_names[process], self.series.t_s)
                     if window_s[0] <= t <= window_s[1] and n]
            if names:
                out[process] = (max(set(names), key=names.count),
                                window_mean(cores, self.series, *window_s))
        return out
