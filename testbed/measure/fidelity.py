"""Did the emulator keep up? A verdict computed from what a run measured (Mininet-HiFi's rule:
numbers from a CPU-bound emulator are not to be trusted).

The verdict rests on three signals, as totals or means over the workload:
- machine CPU: an emulator with no idle CPU left is not keeping time;
- emulator losses, measured by packet conservation at the switches: every packet a switch
  port received either left through another port or was dropped by an emulated egress queue;
  the rest was lost inside the emulator (a switch that could not read its ports fast enough);
- delivery, for bandwidth-bound workloads: the busiest link (the bottleneck) must carry close
  to its configured rate. An emulator that falls behind without losing packets adds delay
  instead, and this is where it shows.
Reported beside them: TCP retransmissions and ovs-vswitchd's CPU. The last is no signal by
itself: with the userspace datapath its main loop makes a fixed-cost pass over every port per
wake-up and stays near one core under any load, absorbing more load in bigger batches.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field

# Named tolerances.
MAX_CPU_BUSY_FRACTION = 0.95       # the machine needs idle time left to be keeping up
# Packets lost inside switches / packets they received. The drop-tail fabrics here drop about
# 3% of packets at their own queues under a bandwidth-bound ring; emulator losses must stay
# an order of magnitude below what the emulated network itself does.
MAX_EMULATOR_LOSS_FRACTION = 0.005
MIN_LINK_DELIVERY_FRACTION = 0.85  # busiest link vs its configured rate (bandwidth-bound)


@dataclass(frozen=True)
class Verdict:
    trustworthy: bool
    reasons: list[str]
    cpu_busy_fraction: float
    vswitchd_cores: float
    link_delivery_fraction: float
    emulator_loss_fraction: float
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict:
        return asdict(self)


def emulator_losses(rx_packets: int, tx_packets: int, queue_drops: int) -> int:
    """Packets the switches received but neither sent on nor dropped in an emulated queue."""
    return max(0, rx_packets - tx_packets - queue_drops)


def judge(cpu_busy_fraction: float, vswitchd_cores: float, link_delivery_fraction: float,
          emulator_loss_fraction: float, bandwidth_bound: bool = True) -> Verdict:
    """Trustworthy when the CPU had headroom, the switches lost (almost) nothing and, for a
    bandwidth-bound workload, the bottleneck link carried close to its rate."""
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
    reasons = problems or [f"CPU {cpu_busy_fraction:.0%} busy, switches lost "
                           f"{emulator_loss_fraction:.3%} of packets outside emulated queues, "
                           f"busiest link at {link_delivery_fraction:.0%} of its rate "
                           f"(ovs-vswitchd {vswitchd_cores:.2f} cores)"]
    return Verdict(not problems, reasons, cpu_busy_fraction, vswitchd_cores,
                   link_delivery_fraction, emulator_loss_fraction, notes)
