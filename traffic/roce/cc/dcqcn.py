"""DCQCN (Zhu et al., "Congestion Control for Large-Scale RDMA Deployments", SIGCOMM 2015):
the notification point (NP, receiver side) and the reaction point (RP, sender side) of one QP.

NP: a data packet arriving CE-marked makes the NP send a CNP to the sender's QP, at most one
per ``cnp_interval_s`` per QP.

RP: current rate Rc, target rate Rt, congestion estimate alpha.

- On a CNP: Rt <- Rc; Rc <- Rc (1 - alpha/2); alpha <- (1 - g) alpha + g; the timer and byte
  counter stages restart from 0 and both timers restart.
- Every ``alpha_interval_s`` without a CNP: alpha <- (1 - g) alpha.
- Rate increase events come from the timer (every ``rate_timer_s``; stage T counts them) and
  the byte counter (every ``byte_counter_bytes`` sent; stage BC). After each event, with
  F = ``fast_recovery_steps``:
    max(T, BC) <= F:  fast recovery      Rc <- (Rt + Rc) / 2
    min(T, BC) >  F:  hyper increase     Rt <- Rt + i R_HAI, i = min(T, BC) - F; then Rc as above
    otherwise:        additive increase  Rt <- Rt + R_AI; then Rc as above
  (the QCN stage rule the paper adopts: F events of fast recovery, then additive increase,
  hyper increase once both counters are past F). Rates stay within [min rate, line rate].
  The timers run only while the RP is below line rate, so an idle QP wakes nobody.

Alpha decays by a closed form (alpha (1-g)^n after n intervals), so it needs no wake-ups.

Parameters come from the paper at 40 Gbit/s (``PAPER``) and are scaled to an emulated link by
``params_for_link``: rates with the link rate; times by the inverse, so that a timer spans the
same number of packet times; the byte counter unchanged, which at the scaled rate lasts the
same multiple of the scaled timers. The function returns how each one was scaled.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, fields

from .base import TimeSeries

PAPER_LINK_RATE_BPS = 40e9
RECOVERED_FRACTION = 1e-6   # Rc within this fraction of the line rate counts as recovered


@dataclass(frozen=True)
class DcqcnParams:
    line_rate_bps: float = PAPER_LINK_RATE_BPS
    g: float = 1 / 256                    # alpha gain
    initial_alpha: float = 1.0
    alpha_interval_s: float = 55e-6       # alpha decay period (K)
    rate_timer_s: float = 55e-6           # rate-increase timer (T)
    byte_counter_bytes: float = 10e6      # rate-increase byte counter (B), 10 MB
    fast_recovery_steps: int = 5          # F
    rai_bps: float = 40e6                 # additive increase step R_AI
    rhai_bps: float = 400e6               # hyper increase step R_HAI (assumed 10 R_AI, as in QCN)
    min_rate_bps: float = 40e6            # floor of Rc (one R_AI)
    cnp_interval_s: float = 50e-6         # NP: at most one CNP per interval per QP


PAPER = DcqcnParams()

# How each parameter follows the link rate: "rate" scales with it, "time" inversely,
# "bytes" and "none" do not change.
_SCALING = {
    "line_rate_bps": "rate", "g": "none", "initial_alpha": "none",
    "alpha_interval_s": "time", "rate_timer_s": "time", "byte_counter_bytes": "bytes",
    "fast_recovery_steps": "none", "rai_bps": "rate", "rhai_bps": "rate",
    "min_rate_bps": "rate", "cnp_interval_s": "time",
}
_RULE_TEXT = {
    "rate": "x link/40G (rates scale with the link)",
    "time": "x 40G/link (the same number of packet times)",
    "bytes": "unchanged (at the scaled rate it lasts the same multiple of the scaled timers)",
    "none": "unchanged (dimensionless)",
}


@dataclass(frozen=True)
class ScaledParameter:
    name: str
    paper_value: float
    value: float
    rule: str


def params_for_link(link_rate_bps: float, base: DcqcnParams = PAPER,
                    anchor_rate_bps: float = PAPER_LINK_RATE_BPS
                    ) -> tuple[DcqcnParams, list[ScaledParameter]]:
    """The paper's parameters scaled to ``link_rate_bps``, and a record of each scaling."""
    if link_rate_bps <= 0:
        raise ValueError("link rate must be positive")
    ratio = link_rate_bps / anchor_rate_bps
    factor = {"rate": ratio, "time": 1 / ratio, "bytes": 1.0, "none": 1.0}
    values, record = {}, []
    for field in fields(DcqcnParams):
        rule = _SCALING[field.name]
        paper_value = getattr(base, field.name)
        value = paper_value if rule == "none" else paper_value * factor[rule]
        values[field.name] = value
        record.append(ScaledParameter(field.name, paper_value, value, _RULE_TEXT[rule]))
    return DcqcnParams(**values), record



class NotificationPoint:
    """The receiver side: whether a data packet triggers a CNP."""

    def __init__(self, cnp_interval_s: float):
        self.cnp_interval_s = cnp_interval_s
        self.last_cnp_s = -math.inf
        self.ce_packets = 0
        self.cnps_sent = 0
        self.series = TimeSeries("t_s", "cnps_sent", "ce_packets")

    def on_data(self, now_s: float, ce: bool) -> bool:
        """Count a data packet; True when a CNP should be sent for it now."""
        if not ce:
            return False
        self.ce_packets += 1
        if now_s - self.last_cnp_s < self.cnp_interval_s:
            return False
        self.last_cnp_s = now_s
        self.cnps_sent += 1
        self.series.append(now_s, self.cnps_sent, self.ce_packets)
        return True

    def summary(self) -> dict:
        return {"cnp_interval_s": self.cnp_interval_s, "cnps_sent": self.cnps_sent,
                "ce_packets": self.ce_packets, "series": self.series.as_dict()}


class ReactionPoint:
    """The sender side: the rate of one QP (see the module docstring)."""
    name = "dcqcn"

    def __init__(self, params: DcqcnParams, now_s: float = 0.0):
        self.params = params
        self.rc_bps = self.rt_bps = params.line_rate_bps
        self.alpha = params.initial_alpha
        self.timer_stage = 0
        self.byte_stage = 0
        self.bytes_counted = 0.0
        self.alpha_due_s = math.inf
        self.rate_due_s = math.inf
        self.cnps_received = 0
        self.increases = {"fast_recovery": 0, "additive": 0, "hyper": 0}
        self.series = TimeSeries("t_s", "rate_bps", "target_bps", "alpha", "cnps_received")
        self._record(now_s)

    def rate_bps(self) -> float:
        return self.rc_bps

    def window_bytes(self) -> None:
        return None

    def on_cnp(self, now_s: float) -> None:
        p = self.params
        self.advance(now_s)
        self.cnps_received += 1
        self.rt_bps = self.rc_bps
        self.rc_bps = max(p.min_rate_bps, self.rc_bps * (1 - self.alpha / 2))
        self.alpha = (1 - p.g) * self.alpha + p.g
        self.timer_stage = self.byte_stage = 0
        self.bytes_counted = 0.0
        self.alpha_due_s = now_s + p.alpha_interval_s
        self.rate_due_s = now_s + p.rate_timer_s
        self._record(now_s)

    def on_sent(self, now_s: float, nbytes: int) -> None:
        if self.rate_due_s == math.inf:
            return   # at line rate: nothing to recover
        self.bytes_counted += nbytes
        while self.bytes_counted >= self.params.byte_counter_bytes and self.rate_due_s != math.inf:
            self.bytes_counted -= self.params.byte_counter_bytes
            self.byte_stage += 1
            self._increase(now_s)

    def on_ack(self, now_s: float, acked_bytes: int, marked_bytes: int, flight_bytes: int) -> None:
        pass

    def on_loss(self, now_s: float, timeout: bool, flight_bytes: int) -> None:
        pass

    def advance(self, now_s: float) -> None:
        while self.rate_due_s <= now_s:
            due = self.rate_due_s
            self.rate_due_s = due + self.params.rate_timer_s
            self.timer_stage += 1
            self._increase(due)
        self._decay_alpha(now_s)

    def next_event_s(self) -> float:
        return self.rate_due_s

    def _decay_alpha(self, now_s: float) -> None:
        if self.alpha_due_s > now_s:
            return
        intervals = math.floor((now_s - self.alpha_due_s) / self.params.alpha_interval_s) + 1
        self.alpha *= (1 - self.params.g) ** intervals
        self.alpha_due_s += intervals * self.params.alpha_interval_s

    def _increase(self, now_s: float) -> None:
        p = self.params
        low, high = sorted((self.timer_stage, self.byte_stage))
        if high <= p.fast_recovery_steps:
            self.increases["fast_recovery"] += 1
        elif low > p.fast_recovery_steps:
            self.increases["hyper"] += 1
            self.rt_bps += (low - p.fast_recovery_steps) * p.rhai_bps
        else:
            self.increases["additive"] += 1
            self.rt_bps += p.rai_bps
        self.rt_bps = min(self.rt_bps, p.line_rate_bps)
        self.rc_bps = min((self.rt_bps + self.rc_bps) / 2, p.line_rate_bps)
        if p.line_rate_bps - self.rc_bps <= RECOVERED_FRACTION * p.line_rate_bps:
            self.rc_bps = p.line_rate_bps
        self._decay_alpha(now_s)
        self._record(now_s)
        if self.rc_bps >= p.line_rate_bps and self.rt_bps >= p.line_rate_bps:
            self.rate_due_s = math.inf   # recovered: the timers sleep until the next CNP

    def _record(self, now_s: float) -> None:
        self.series.append(now_s, self.rc_bps, self.rt_bps, self.alpha, self.cnps_received)

    def summary(self) -> dict:
        return {"name": self.name, "params": asdict(self.params),
                "cnps_received": self.cnps_received, "increases": dict(self.increases),
                "rate_bps": self.rc_bps, "target_bps": self.rt_bps, "alpha": self.alpha,
                "series": self.series.as_dict()}
