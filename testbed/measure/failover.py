"""How fast the fabric routes around a failed link: cut an interface, watch a probe stream and
the controller's events file, restore the interface.

Used by ``testbed bench`` (the measured figure) and by the integration tests (the behaviour).
Times are CLOCK_MONOTONIC, shared by this process, the controller and the probes.
"""
from __future__ import annotations

import re
import subprocess
import time
from dataclasses import asdict, dataclass

from testbed.errors import TestbedError
from testbed.measure.openflow import reaction_times
from testbed.model.records import EVENTS_FILE, read_json_lines
from testbed.system.running import RunningFabric

PROBE_INTERVAL_S = 0.02     # 50 probes a second across the failure
PROBE_COUNT = 150           # 3 s of probes
SETTLE_S = 0.5              # probes flowing before the cut
EVENT_TIMEOUT_S = 10.0


@dataclass
class Failover:
    """One cut and repair: when the controller noticed the cut and had every updated switch
    confirm its new rules, how many probes were lost, and the same for the repair."""

    interface: str
    down_detected_s: float
    down_applied_s: float
    probes_lost: int
    probe_interval_s: float
    up_applied_s: float

    @property
    def outage_s(self) -> float:
        return self.probes_lost * self.probe_interval_s

    def to_dict(self) -> dict:
        return {**asdict(self), "outage_s": self.outage_s}


def wait_for_event(events_path, kind: str, after_s: float, timeout_s: float = EVENT_TIMEOUT_S):
    """The controller's reactions of ``kind`` to something injected at ``after_s``."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        found = reaction_times(read_json_lines(events_path), after_s, kinds=(kind,))
        if found:
            return found
        time.sleep(0.05)
    return []


def ping_received(ping_output: str) -> int:
    """Replies counted in ``ping``'s summary line."""
    match = re.search(r"(\d+) received", ping_output)
    return int(match.group(1)) if match else 0


def cut_and_repair(net: RunningFabric, intf: str, src: str, dst: str) -> Failover:
    """Probe ``dst`` from ``src`` while ``intf`` (a switch end) goes down; then bring it back."""
    events = net.workdir / EVENTS_FILE
    ping = net.popen(src, ["ping", "-c", str(PROBE_COUNT), "-i", str(PROBE_INTERVAL_S), "-W",
                           "1", net.fabric.nodes[dst].ip], stdout=subprocess.PIPE,
                     stderr=subprocess.DEVNULL, text=True)
    time.sleep(SETTLE_S)
    t_down = net.set_interface(intf, False)
    down = wait_for_event(events, "link_down", t_down)
    lost = PROBE_COUNT - ping_received(ping.communicate()[0])
    t_up = net.set_interface(intf, True)
    up = wait_for_event(events, "link_up", t_up)
    if not down or not up:
        raise TestbedError(f"the controller did not report the cut and repair of {intf}: "
                           f"see {events}")
    return Failover(intf, down[0].detected_s, down[0].applied_s, lost, PROBE_INTERVAL_S,
                    up[0].applied_s)
