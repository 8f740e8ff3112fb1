"""The one interface of a running fabric: what experiments, the traffic drivers (testbed.drive)
and measurement (testbed.measure) may ask of a fabric that is up, and nothing else.

It speaks plain data: node, link and interface names (as the fabric description spells
them), rates, counters, samples, processes started in hosts. No machine-layer type, ifindex or
Mininet host crosses it. ``testbed.apply.network.FabricNetwork`` implements it on one machine
(Mininet hosts, Open vSwitch, tc and eBPF queues); a routed L3 fabric (FRR daemons speaking
BGP) or a fabric spread over several machines can implement it later, and everything written
against it runs there unchanged. Two members still name this machine's resources, and say
so: ``netns`` (a host's namespace, for the readers that open sockets in it) and
``emulator_processes`` (the processes whose CPU the fidelity verdict watches); another
implementation answers them for the machine the caller runs on.

Link directions are written ``src->dst`` (testbed.measure.telemetry's labels); switch ports
by their interface name (``l0-eth3``, testbed.model.topology.base.intf_name). The protocol is
checked structurally (``isinstance``, with ``runtime_checkable``) and by signature in
tests/unit/system/test_running.py, against FabricNetwork and the unit tests' stand-in.
"""
from __future__ import annotations

import subprocess
from collections.abc import Sequence
from pathlib import Path
from typing import Protocol, runtime_checkable

from testbed.model.topology.base import Fabric
from testbed.plan.loss_plan import Cut, Loss
from testbed.plan.profiles import QueueConfig


@runtime_checkable
class RunningFabric(Protocol):
    """A fabric that is up. Times are CLOCK_MONOTONIC seconds; byte and packet counts are
    totals since the fabric came up unless a member says otherwise."""

    fabric: Fabric  # the description it was built from
    workdir: Path  # its files: the controller's log and events, the agents' events
    queue: QueueConfig | None  # every shaped switch port's queue (None: none)
    ecn_path: str | None  # how marked queues are marked ("red-qdisc", "ebpf"), None: no queue

    # -- hosts ------------------------------------------------------------------------------
    def popen(self, host: str, argv: list[str], **kwargs) -> subprocess.Popen:
        """Start ``argv`` in ``host``; it goes with the fabric."""

    def cmd(self, host: str, *args: object) -> str:
        """Run a command line in ``host`` to its end; its output."""

    def listening_ports(self, host: str) -> set[int]:
        """The TCP ports listening in ``host`` now."""

    def netns(self, host: str) -> str:
        """The path of ``host``'s network namespace on this machine."""

    # -- links and switches -----------------------------------------------------------------
    def set_link(self, a: str, b: str, up: bool) -> float:
        """The cable between nodes ``a`` and ``b`` down or up; the time just before."""

    def set_interface(self, intf: str, up: bool) -> float:
        """A switch port down or up by its name; the time just before."""

    def lose(self, losses: Sequence[tuple[Cut, Loss]]) -> None:
        """Start losing packets on the link directions ``losses`` name."""

    # -- counters and samples ---------------------------------------------------------------
    def switch_counters(self) -> dict[str, int]:
        """Packets the switch ports received and sent, and dropped by queues and impairments
        (testbed.measure.fidelity's packet conservation)."""

    def queue_drops(self) -> int:
        """Packets dropped by the emulated egress queues, hosts' and switches'."""

    def port_queue_drops(self) -> dict[str, int]:
        """Packets each switch port's egress queue dropped, by interface."""

    def wait_switches_drained(self, timeout_s: float = ...) -> int:
        """Wait (at most ``timeout_s``) until the switches' queues are empty; the packets
        still queued."""

    def failure_losses(self) -> list[dict]:
        """Packets lost to the links and switches the run itself cut, one record per window of
        overlapping failures (``start_s``, ``end_s``, ``lost_packets``): sent to a port that
        was down, they vanish as on a real switch, and are not the emulator's."""

    def loss_counters(self) -> dict:
        """What the loss program did: packets applied to and dropped, total and by
        interface."""

    def port_backlogs(self) -> dict[str, int]:
        """Bytes queued now at every shaped egress port, by link direction."""

    def marker_backlogs(self) -> dict[str, int]:
        """The ECN marker's model of each queue it marks, in bytes now, by link direction
        (empty where no marker models a queue)."""

    def marked_ports(self) -> list[str]:
        """The switch ports whose queues mark (or drop), by interface; empty without a
        queue."""

    def ecn_counters(self) -> dict[str, dict]:
        """Every marked port's counters so far (marks, drops, its rate, ...), by interface."""

    def marker_depths(self) -> dict[str, int]:
        """Every marked port's queue in bytes now as the marking sees it (the eBPF marker's
        model, or the RED qdisc's backlog), by interface."""

    def ecn_anchoring(self) -> dict | None:
        """How the eBPF marker's anchoring went (None where nothing anchors)."""

    # -- PFC ---------------------------------------------------------------------------------
    @property
    def lossless(self) -> bool:
        """Whether the queues have a lossless class under PFC."""

    def pause_counters(self) -> dict[str, dict]:
        """The pause agent's counters by interface (pause frames, time paused); empty
        without PFC."""

    def pause_agent_running(self) -> bool:
        """Whether the pause agent still runs (False without PFC)."""

    def pfc_summary(self) -> dict:
        """PFC so far: pause frames, time paused, storms, lossless drops, the agent alive."""

    def pause_events(self) -> list[dict]:
        """The pause agent's events so far, one a pause or resume of a lossless priority at
        an interface (``t``, ``event``, ``intf``, ``priority``); empty without PFC."""

    def paused_spans(self, t0_monotonic: float,
                     t1_monotonic: float) -> dict[str, list[tuple[float, float]]]:
        """When each egress port's lossless class was paused within the interval, by link
        direction."""

    def empty_spans(self, t0_monotonic: float,
                    t1_monotonic: float) -> dict[str, list[tuple[float, float]]]:
        """When each egress port's lossless queues read empty within the interval, by link
        direction, where the pause agent samples them; empty without PFC."""

    # -- the emulator -----------------------------------------------------------------------
    def emulator_processes(self) -> dict[str, list[int]]:
        """The processes that emulate the fabric on this machine (ovs-vswitchd first, then
        the agents), by name: whose CPU the fidelity verdict watches."""
