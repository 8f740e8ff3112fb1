"""What an emulated switch egress queue does: its byte buffer, ECN marking profile, traffic
classes (from DSCP) and PFC thresholds. Each dataclass validates itself on construction and
raises a one-line ``ConfigError`` naming the field, so an invalid queue cannot exist.

The rules the eBPF marker (``bpf/ecn_marker.c``) runs per packet are here too, in Python:
``mark_probability`` (the profile) and ``virtual_queue_step`` (the queue it applies to).
Queue depths are the instantaneous backlog in bytes that an arriving packet finds, as
DCTCP and DCQCN switches mark (no averaging).
"""
from __future__ import annotations

from dataclasses import dataclass

from testbed.errors import ConfigError
from testbed.model.topology.checks import check_count, check_rate

U32_MAX = 2**32 - 1  # the eBPF marker keeps thresholds and buffers in 32-bit fields
MAX_PAUSE_QUANTA = 0xFFFF  # 802.1Qbb pause times are 16-bit counts of quanta
PFC_CLASSES = 8  # priorities 0..7, one pause timer each
DSCP_VALUES = 64
# PFC watchdogs' usual detection time for a pause storm (SONiC's default: 200 ms).
DEFAULT_STORM_THRESHOLD_MS = 200.0
NSEC_PER_S = 1_000_000_000


def check_bytes(field: str, value, minimum: int = 1) -> int:
    """A byte count that fits the marker's 32-bit fields."""
    return check_count(field, value, minimum, U32_MAX)


def check_fraction(field: str, value) -> float:
    """A probability in (0, 1]."""
    check_rate(field, value)
    if value > 1:
        raise ConfigError(field, f"must be in (0, 1], got {value!r}")
    return value


# --- ECN profiles -----------------------------------------------------------------------------


@dataclass(frozen=True)
class StepEcn:
    """DCTCP marking: CE on every ECT packet that finds more than ``k_bytes`` queued."""

    k_bytes: int

    def __post_init__(self):
        check_bytes("k_bytes", self.k_bytes)

    @property
    def start_bytes(self) -> int:
        """The backlog above which marking starts."""
        return self.k_bytes


@dataclass(frozen=True)
class RedEcn:
    """RED-ECN as DCQCN configures it, on the instantaneous queue: no marks up to
    ``kmin_bytes``, probability rising linearly to ``pmax`` at ``kmax_bytes``, every ECT
    packet above ``kmax_bytes``."""

    kmin_bytes: int
    kmax_bytes: int
    pmax: float

    def __post_init__(self):
        check_bytes("kmin_bytes", self.kmin_bytes, minimum=0)
        check_bytes("kmax_bytes", self.kmax_bytes)
        if self.kmin_bytes >= self.kmax_bytes:
            raise ConfigError("kmin_bytes", f"must be below kmax_bytes ({self.kmax_bytes}), "
                                            f"got {self.kmin_bytes}")
        check_fraction("pmax", self.pmax)

    @property
    def start_bytes(self) -> int:
        return self.kmin_bytes


EcnProfile = StepEcn | RedEcn


def mark_probability(profile: EcnProfile | None, queue_bytes: float) -> float:
    """Probability that an ECT packet finding ``queue_bytes`` queued is marked CE."""
    if queue_bytes < 0:
        raise ValueError(f"queue_bytes must be >= 0, got {queue_bytes!r}")
    if profile is None:
        return 0.0
    if isinstance(profile, StepEcn):
        return 1.0 if queue_bytes > profile.k_bytes else 0.0
    if queue_bytes <= profile.kmin_bytes:
        return 0.0
    if queue_bytes > profile.kmax_bytes:
        return 1.0
    span = profile.kmax_bytes - profile.kmin_bytes
    return profile.pmax * (queue_bytes - profile.kmin_bytes) / span


# --- the virtual FIFO the eBPF marker keeps ---------------------------------------------------


def drained_bytes(rate_bytes_per_s: int, elapsed_ns: int) -> int:
    """Whole bytes a queue served at ``rate_bytes_per_s`` sends in ``elapsed_ns`` (rounded
    down, as the marker's integer arithmetic does)."""
    return rate_bytes_per_s * elapsed_ns // NSEC_PER_S


def virtual_queue_step(queue_bytes: int, elapsed_ns: int, packet_bytes: int,
                       rate_bytes_per_s: int, limit_bytes: int) -> tuple[int, int, bool, int]:
    """One packet arriving ``elapsed_ns`` after the FIFO's drain clock at a FIFO that held
    ``queue_bytes`` then: the Lindley recursion of the marker.

    Returns (backlog the packet finds, backlog after it, whether the FIFO drops it, the
    nanoseconds the drain clock advances). The packet joins at the end of the interval, so
    it does not drain during it; it is dropped, as by a bfifo, when backlog + packet > limit.
    The queue drains in whole bytes, and while it stays busy the clock advances only by the
    time those bytes took: the part of a byte left over carries to the next packet instead of
    being lost (lost, it made the queue drain up to a byte per packet slow, and with a queue
    that never emptied the model climbed from 9 to 15 KB above the real one over the ECN
    test's 8 s window at 1,650 packets a second). An emptied queue takes the whole interval.
    """
    drained = drained_bytes(rate_bytes_per_s, elapsed_ns)
    if queue_bytes > drained:
        backlog, used_ns = queue_bytes - drained, drained * NSEC_PER_S // rate_bytes_per_s
    else:
        backlog, used_ns = 0, elapsed_ns
    if backlog + packet_bytes > limit_bytes:
        return backlog, backlog, True, used_ns
    return backlog, backlog + packet_bytes, False, used_ns


def anchored_backlog(anchor_backlog_bytes: int, anchor_time_ns: int, anchor_accepted_bytes: int,
                     accepted_bytes: int, now_ns: int, rate_bytes_per_s: int,
                     limit_bytes: int) -> int:
    """The marker's virtual backlog at ``now_ns`` grounded in a reading of the real one: the
    backlog read at ``anchor_time_ns``, plus the bytes the virtual FIFO accepted since
    (``accepted_bytes`` now against ``anchor_accepted_bytes`` read just before the backlog,
    so packets that arrived after the reading are not lost), less what the rate drained
    since; never below 0 nor above the FIFO's limit. A reading stamped after ``now_ns``
    drains nothing, and a count that went backwards adds nothing (as the marker's unsigned
    arithmetic guards them)."""
    queue = anchor_backlog_bytes + max(0, accepted_bytes - anchor_accepted_bytes)
    queue -= drained_bytes(rate_bytes_per_s, max(0, now_ns - anchor_time_ns))
    return min(max(0, queue), limit_bytes)


# --- traffic classes --------------------------------------------------------------------------


@dataclass(frozen=True)
class TrafficClass:
    """A priority (the 802.1p priority and PFC class, 0..7) and the DSCP values mapped to it."""

    priority: int
    name: str
    dscp: tuple[int, ...]
    lossless: bool = False  # paused by PFC instead of dropped

    def __post_init__(self):
        check_count(f"classes.{self.name}.priority", self.priority, 0, PFC_CLASSES - 1)
        for value in self.dscp:
            check_count(f"classes.{self.name}.dscp", value, 0, DSCP_VALUES - 1)


# The usual RoCEv2 fabric set-up: RoCE data in DSCP 26 on lossless priority 3, congestion
# notification packets (CNPs) in DSCP 48 on priority 6 so they overtake the data they
# throttle, everything else best effort on priority 0.
DEFAULT_PRIORITY = 0
DEFAULT_CLASSES: tuple[TrafficClass, ...] = (
    TrafficClass(DEFAULT_PRIORITY, "best-effort", (0,)),
    TrafficClass(3, "roce", (26,), lossless=True),
    TrafficClass(6, "cnp", (48,)),
)


# --- PFC --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class PfcConfig:
    """802.1Qbb thresholds of a lossless class, in bytes of its queue.

    Crossing ``xoff_bytes`` sends a pause of ``quanta``; falling to ``xon_bytes`` sends a
    zero pause (resume). ``headroom_bytes`` above XOFF absorb what is in flight until the
    upstream port stops. A class paused for longer than ``storm_threshold_ms`` in one go
    counts as a pause storm.
    """

    xoff_bytes: int
    xon_bytes: int
    headroom_bytes: int
    quanta: int = MAX_PAUSE_QUANTA
    storm_threshold_ms: float = DEFAULT_STORM_THRESHOLD_MS

    def __post_init__(self):
        check_bytes("pfc.xoff_bytes", self.xoff_bytes)
        check_bytes("pfc.xon_bytes", self.xon_bytes, minimum=0)
        if self.xon_bytes >= self.xoff_bytes:
            raise ConfigError("pfc.xon_bytes", f"must be below xoff_bytes ({self.xoff_bytes}), "
                                               f"got {self.xon_bytes}")
        check_bytes("pfc.headroom_bytes", self.headroom_bytes)
        check_count("pfc.quanta", self.quanta, 1, MAX_PAUSE_QUANTA)
        check_rate("pfc.storm_threshold_ms", self.storm_threshold_ms)


# --- the queue --------------------------------------------------------------------------------


@dataclass(frozen=True)
class QueueConfig:
    """One switch egress port's queue: a drop-tail buffer of ``buffer_bytes`` served at the
    link rate, an optional ECN profile, traffic classes, and PFC for the lossless ones.

    A fabric whose links run at several rates has one queue per rate, from the same section
    (testbed.harness.plans.queue_plan): this one, sized for ``rate_mbit``, carries the others
    in ``other_rates``, and ``for_rate`` picks a port's. They share their classes and which
    of ECN and PFC they have, so a port's qdisc handles (testbed.plan.port_queue.Handles) do
    not depend on its rate. ``rate_mbit`` None: sized for no rate in particular, the queue of
    every port."""

    buffer_bytes: int
    ecn: EcnProfile | None = None
    classes: tuple[TrafficClass, ...] = DEFAULT_CLASSES
    pfc: PfcConfig | None = None
    class_queues: bool = False  # one queue per class (testbed.plan.port_queue); PFC implies it
    rate_mbit: float | None = None
    other_rates: tuple[QueueConfig, ...] = ()

    def __post_init__(self):
        check_bytes("buffer_bytes", self.buffer_bytes)
        self._check_ecn()
        self._check_classes()
        self._check_pfc()
        self._check_rates()

    def _check_ecn(self):
        ecn = self.ecn
        if ecn is None:
            return
        if not isinstance(ecn, (StepEcn, RedEcn)):
            raise ConfigError("ecn", f"must be StepEcn, RedEcn or None, got {ecn!r}")
        if isinstance(ecn, StepEcn) and ecn.k_bytes >= self.buffer_bytes:
            # backlog + packet <= buffer, so a K at the buffer would never mark
            raise ConfigError("ecn.k_bytes", f"must be below buffer_bytes ({self.buffer_bytes}),"
                                             f" got {ecn.k_bytes}")
        if isinstance(ecn, RedEcn) and ecn.kmax_bytes > self.buffer_bytes:
            raise ConfigError("ecn.kmax_bytes", f"must be at most buffer_bytes "
                                                f"({self.buffer_bytes}), got {ecn.kmax_bytes}")

    def _check_classes(self):
        if not self.classes:
            raise ConfigError("classes", "must name at least one traffic class")
        priorities: set[int] = set()
        dscps: set[int] = set()
        for tc in self.classes:
            if not isinstance(tc, TrafficClass):
                raise ConfigError("classes", f"must hold TrafficClass entries, got {tc!r}")
            if tc.priority in priorities:
                raise ConfigError("classes", f"priority {tc.priority} appears twice")
            repeated = dscps.intersection(tc.dscp)
            if repeated:
                raise ConfigError("classes", f"DSCP {min(repeated)} is mapped twice")
            priorities.add(tc.priority)
            dscps.update(tc.dscp)

    def _check_pfc(self):
        pfc = self.pfc
        if pfc is None:
            return
        if not any(tc.lossless for tc in self.classes):
            raise ConfigError("pfc", "needs a lossless traffic class to pause")
        if pfc.xoff_bytes > self.buffer_bytes:
            raise ConfigError("pfc.xoff_bytes", f"must be at most buffer_bytes "
                                                f"({self.buffer_bytes}), got {pfc.xoff_bytes}")
        if pfc.xoff_bytes + pfc.headroom_bytes > self.buffer_bytes:
            raise ConfigError("pfc.headroom_bytes",
                              f"xoff_bytes + headroom_bytes ({pfc.xoff_bytes} + "
                              f"{pfc.headroom_bytes}) exceeds buffer_bytes ({self.buffer_bytes})")
        if self.ecn is not None and self.ecn.start_bytes >= pfc.xoff_bytes:
            # DCQCN relies on marks reaching senders before the queue pauses its upstream
            raise ConfigError("ecn", f"marking must start below pfc.xoff_bytes "
                                     f"({pfc.xoff_bytes}), starts at {self.ecn.start_bytes}")

    def _check_rates(self):
        if self.rate_mbit is not None:
            check_rate("rate_mbit", self.rate_mbit)
        if not self.other_rates:
            return
        if self.rate_mbit is None:
            raise ConfigError("rate_mbit", "a queue with other rates' queues must have a rate")
        rates = [self.rate_mbit]
        for other in self.other_rates:
            if not isinstance(other, QueueConfig) or other.other_rates:
                raise ConfigError("other_rates", f"must hold plain QueueConfig entries, got "
                                                 f"{other!r}")
            if other.rate_mbit is None or other.rate_mbit in rates:
                raise ConfigError("other_rates", f"rate {other.rate_mbit!r} is missing or "
                                                 "appears twice")
            rates.append(other.rate_mbit)
            if (other.classes, other.uses_classes, type(other.ecn), other.pfc is None) != \
                    (self.classes, self.uses_classes, type(self.ecn), self.pfc is None):
                raise ConfigError("other_rates", f"the queue at {other.rate_mbit:g} Mbit/s "
                                                 "must have the same classes, ECN profile "
                                                 "and PFC as the others")

    def for_rate(self, rate_mbit: float | None) -> QueueConfig:
        """The queue of a port whose link runs at ``rate_mbit`` (None: unshaped, no queue of
        its own to size): this one at its own rate, or when it was sized for no rate."""
        if rate_mbit is None or self.rate_mbit is None or rate_mbit == self.rate_mbit:
            return self
        for other in self.other_rates:
            if other.rate_mbit == rate_mbit:
                return other
        planned = ", ".join(f"{q.rate_mbit:g}" for q in self.by_rate)
        raise ValueError(f"no queue planned for links at {rate_mbit:g} Mbit/s "
                         f"(planned: {planned})")

    @property
    def by_rate(self) -> tuple[QueueConfig, ...]:
        """Every rate's queue, in rate order (just this one when it has no others)."""
        if not self.other_rates:
            return (self,)
        return tuple(sorted((self, *self.other_rates), key=lambda q: q.rate_mbit))

    def priority_for_dscp(self, dscp: int) -> int:
        """The priority a packet with ``dscp`` is queued in; unmapped values are best effort."""
        check_count("dscp", dscp, 0, DSCP_VALUES - 1)
        for tc in self.classes:
            if dscp in tc.dscp:
                return tc.priority
        return DEFAULT_PRIORITY

    @property
    def uses_classes(self) -> bool:
        """Whether ports get one queue per traffic class instead of one FIFO."""
        return self.class_queues or self.pfc is not None

    @property
    def lossless_priorities(self) -> tuple[int, ...]:
        return tuple(sorted(tc.priority for tc in self.classes if tc.lossless))
