"""Did the emulator keep up? A verdict computed from what a run measured (Mininet-HiFi's rule:
numbers from a CPU-bound emulator are not to be trusted).

Signals, as means over the timed phase of a run:
- machine CPU: an emulator with no idle CPU left is not keeping time;
- delivery: in a bandwidth-bound workload the busiest host link must carry close to its
  configured rate, or the emulator (not the emulated network) was the bottleneck;
- unexplained retransmissions: TCP retransmits beyond the drops the emulated queues counted
  mean packets were lost inside the emulator (a switch that could not read its ports fast
  enough) or timers fired because the emulator stalled.
ovs-vswitchd's CPU is reported but is no verdict on its own: with the userspace datapath its
main loop makes a fixed-cost pass over every port per wake-up and stays near one core under any
load (measured), absorbing more load in bigger batches until it starts dropping, which the
retransmission signal catches.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass

# Named tolerances.
MAX_CPU_BUSY_FRACTION = 0.95       # the machine needs idle time left to be keeping up
MIN_LINK_DELIVERY_FRACTION = 0.85  # busiest host link vs its configured rate
MAX_RETRANSMIT_FRACTION = 0.01     # unexplained TCP retransmits / segments sent


@dataclass(frozen=True)
class Verdict:
    trustworthy: bool
    reasons: list[str]
    cpu_busy_fraction: float
    vswitchd_cores: float
    link_delivery_fraction: float
    retransmit_fraction: float

    def to_dict(self) -> dict:
        return asdict(self)


def judge(cpu_busy_fraction: float, vswitchd_cores: float, link_delivery_fraction: float,
          retransmit_fraction: float, bandwidth_bound: bool = True) -> Verdict:
    """Trustworthy when the CPU had headroom, TCP saw no losses the emulated network did not
    cause and, for a bandwidth-bound workload, the busiest host link carried close to its rate."""
    problems = []
    if cpu_busy_fraction > MAX_CPU_BUSY_FRACTION:
        problems.append(f"machine CPU {cpu_busy_fraction:.0%} busy (limit "
                        f"{MAX_CPU_BUSY_FRACTION:.0%}): the emulator was CPU-bound")
    if bandwidth_bound and link_delivery_fraction < MIN_LINK_DELIVERY_FRACTION:
        problems.append(f"busiest host link delivered {link_delivery_fraction:.0%} of its "
                        f"configured rate (need {MIN_LINK_DELIVERY_FRACTION:.0%}): the "
                        "emulator, not the emulated links, limited the traffic")
    if retransmit_fraction > MAX_RETRANSMIT_FRACTION:
        problems.append(f"{retransmit_fraction:.1%} of TCP segments were retransmitted beyond "
                        f"the emulated queues' drops (limit {MAX_RETRANSMIT_FRACTION:.0%}): the "
                        "emulator lost packets")
    reasons = problems or [f"CPU {cpu_busy_fraction:.0%} busy, busiest host link at "
                           f"{link_delivery_fraction:.0%} of its rate, {retransmit_fraction:.2%} "
                           f"of TCP segments retransmitted beyond queue drops (ovs-vswitchd {vswitchd_cores:.2f} cores)"]
    return Verdict(not problems, reasons, cpu_busy_fraction, vswitchd_cores,
                   link_delivery_fraction, retransmit_fraction)
