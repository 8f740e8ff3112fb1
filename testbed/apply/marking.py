"""ECN marking on a running fabric: the thin layer around the marker that each switch port's
queue plan (``testbed.plan.port_queue``) attaches. ``testbed.apply.network.FabricNetwork``
applies every port's whole queue, marking included, in one ``tc -batch`` (and, on the eBPF
path, one ``bpftool batch`` filling the marker's maps); ``EcnMarking`` gets the marker ready
before that batch, starts the anchor agent after it, reads the counters and queue depths
back, and removes what it left.

Before the batch, on the eBPF path: build the marker object if it is missing or older than
its source (the ``make bpf`` command, ``ecn_plan.compile_command``, into the run-independent
cache); write the maps' pin paths into the run ledger, so ``testbed clean`` removes them
after a killed run, and remove pins an unrecorded earlier run left (their entries would be
inherited). After the batch, when any port marks: start the anchor agent
(``testbed.apply.ecn_anchor``; ``AnchorAgentProcess``), which grounds the marker's virtual
FIFOs in the real queues every few milliseconds (docs/ecn.md), beside the hosts on their CPUs
as the pause agent runs. The marker's maps are read with the bpf system call
(``testbed.apply.bpf_syscall``), so a queue-depth sample costs a system call, not a process.
Tear-down stops the agent and removes the pins; the interfaces' deletion takes the filters
and qdiscs along.

The marking path is decided once, before the fabric exists: by the harness
(``testbed.harness.plans.ecn_path_for``), or by ``machine_ecn_path`` for callers that leave
it to this machine.
"""
from __future__ import annotations

import os
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

from testbed.apply.agent_process import AgentProcess
from testbed.apply.bpf_syscall import PinnedMap
from testbed.apply.ecn_anchor import COUNTERS_FILE, LOG_FILE, PLAN_FILE, READY_FILE
from testbed.apply.state import Ledger, remove_pins
from testbed.capabilities import detect
from testbed.errors import ConfigError, TestbedError
from testbed.model.topology.base import Fabric
from testbed.plan.anchoring import AnchorPlan, anchor_plan
from testbed.plan.ecn_plan import (
    BPF_OBJECT,
    BPF_SOURCE,
    COUNTERS_LAYOUT,
    ECN_PATH_EBPF,
    MAPS,
    check_ecn_path,
    choose_ecn_path,
    compile_command,
    layout_struct,
    pack_value,
    pinned_map_path,
    pinned_map_paths,
    unpack_value,
)
from testbed.plan.port_queue import Impairment, Port, depths_from_qdepth
from testbed.plan.profiles import QueueConfig
from testbed.system.counters import buffer_stats, port_counters, read_qdiscs
from testbed.system.process import run_tool

def object_is_current(obj: Path = BPF_OBJECT, source: Path = BPF_SOURCE) -> bool:
    """Whether the marker object exists and is no older than its source (make's rule)."""
    return obj.exists() and obj.stat().st_mtime >= source.stat().st_mtime


def machine_ecn_path(prefer: str | None = None) -> str:
    """The marking path this machine takes (its capabilities report's, or ``prefer``),
    decided once for a fabric whose caller did not decide it."""
    return choose_ecn_path(detect(), prefer, object_built=object_is_current())


def build_object(obj: Path = BPF_OBJECT, source: Path = BPF_SOURCE) -> bool:
    """Compile the marker unless it is current; returns whether it was compiled."""
    if object_is_current(obj, source):
        return False
    obj.parent.mkdir(parents=True, exist_ok=True)
    run_tool(compile_command(source, obj), what="clang could not build the ECN marker")
    return True


def read_ifindex(intf: str) -> int:
    return int(Path(f"/sys/class/net/{intf}/ifindex").read_text())


class AnchorAgentProcess(AgentProcess):
    """The ECN anchor agent of one fabric, as a process recorded in the run's ledger."""

    module = "testbed.apply.ecn_anchor"
    title = "the ECN anchor agent"
    plan_file, log_file, ready_file, counters_file = PLAN_FILE, LOG_FILE, READY_FILE, COUNTERS_FILE

    def start(self, plan: AnchorPlan, cpus: Sequence[int] = ()) -> None:
        """Launch the agent for ``plan`` on ``cpus`` (empty: any); the pause agent's
        reasons for the hosts' CPUs hold here too (``PauseAgentProcess.start``): a real-time
        process on ovs-vswitchd's CPU takes it from the forwarding, and beside it its polls
        wait for the forwarding thread's kernel work."""
        self.launch(plan.to_json(), cpus)
        self.log(f"ECN: anchor agent reading {len(plan.ports)} marked ports' queues every "
                 f"{plan.poll_s * 1000:g} ms"
                 + (f", on CPU {','.join(map(str, cpus))} with the hosts" if cpus else ""))


class EcnMarking:
    """``queue``'s marking on ``path`` ("red-qdisc" or "ebpf", decided by the caller) on
    every shaped switch port of a running ``fabric``; ``workdir``: the run's folder, for the
    anchor agent's files (needed once a port marks on the eBPF path)."""

    def __init__(self, fabric: Fabric, queue: QueueConfig, ledger: Ledger, path: str,
                 obj: Path = BPF_OBJECT, log=print, workdir: Path | None = None):
        if path is None:
            raise ConfigError("ecn_path", "must be decided before the marking is made")
        check_ecn_path(path)
        self.fabric = fabric
        self.queue = queue
        self.ledger = ledger
        self.path = path
        self.obj = obj
        self.log = log
        self.workdir = workdir
        self.ports: list[Port] = []
        self.anchor: AnchorAgentProcess | None = None
        self._maps: dict[str, PinnedMap] = {}  # the marker's pinned maps, opened on first use
        self._maps_lock = threading.Lock()  # samplers in several threads read the maps
        self._pins_claimed = False

    @property
    def models_queue(self) -> bool:
        """Whether the marker marks by a model of the queue: the eBPF path with ECN on."""
        return self.path == ECN_PATH_EBPF and self.queue.ecn is not None

    # -- bring-up ---------------------------------------------------------------------------
    def prepare(self, ports: Sequence[Port]) -> None:
        """Before the ports' queues are applied: remember the ``ports`` to read, and on the
        eBPF path build the marker and claim its pins."""
        self.ports = list(ports)
        if self.path != ECN_PATH_EBPF:
            return
        if build_object(self.obj):
            self.log(f"built the ECN marker: {self.obj}")
        self._claim_pins()

    def _claim_pins(self) -> None:
        """Record the pin paths before tc creates them; remove any an earlier run left."""
        paths = [str(path) for path in pinned_map_paths()]
        self.ledger.add_names(pinned=paths)
        self._pins_claimed = True
        stale = [path for path in paths if os.path.exists(path)]
        if stale:
            self.log(f"removing the ECN marker's maps an earlier run left: {', '.join(stale)}")
            remove_pins(stale)

    def start_anchoring(self, cpus: Sequence[int] = (),
                        impairments: Mapping[str, Impairment] | None = None) -> None:
        """Once the queues and the marker's entries are in place: on the eBPF path, when any
        port marks, start the anchor agent on ``cpus`` (the hosts' CPUs of the fabric's CPU
        layout; empty: any). ``impairments`` (interface -> Impairment): a delayed port's
        anchor also counts its netem delay line (``testbed.plan.anchoring``)."""
        if not self.models_queue or self.anchor is not None:
            return
        plan = anchor_plan(self.ports, self.queue, impairments)
        if plan is None:
            return
        if self.workdir is None:
            raise TestbedError("the ECN anchor agent needs the run's folder (workdir)")
        self.anchor = AnchorAgentProcess(self.workdir, self.ledger, self.log)
        self.anchor.start(plan, cpus)

    @property
    def anchor_pids(self) -> list[int]:
        """The anchor agent's PID (none without one), for the verdict's thread check."""
        pid = self.anchor.pid if self.anchor is not None else None
        return [] if pid is None else [pid]

    def anchoring(self) -> dict | None:
        """The anchor agent's record so far (polls, poll gaps, CPU seconds; its counters
        file) and whether it still runs; None when no anchor agent runs."""
        if self.anchor is None:
            return None
        return {**self.anchor.counters(), "running": self.anchor.alive()}

    # -- reading ----------------------------------------------------------------------------
    def _map(self, map_name: str) -> PinnedMap:
        with self._maps_lock:
            if map_name not in self._maps:
                self._maps[map_name] = PinnedMap(pinned_map_path(map_name),
                                                 layout_struct(MAPS[map_name]).size)
            return self._maps[map_name]

    def read_map(self, map_name: str) -> dict[int, dict[str, int]]:
        """The ports' entries of one of the marker's maps, {ifindex: fields}: one system
        call for all of them."""
        try:
            raw = self._map(map_name).lookup_many(p.ifindex for p in self.ports)
        except OSError as err:
            raise TestbedError(f"cannot read the ECN marker's {map_name}: "
                               f"{err.strerror or err}") from None
        return {ifindex: unpack_value(MAPS[map_name], value) for ifindex, value in raw.items()}

    def _buffers(self) -> dict[str, dict]:
        return buffer_stats(read_qdiscs(), self.queue)

    def counters(self) -> dict[str, dict]:
        """Every port's counters since the marking was applied (testbed.system.counters)."""
        buffers = self._buffers()
        marker = self.read_map("ecn_counters") if self.path == ECN_PATH_EBPF else None
        return port_counters(self.ports, marker, buffers)

    def reset_counters(self) -> None:
        """Zero the marker's counters (eBPF path; the virtual queues run on, and a packet
        counted while this runs may be lost from the new totals)."""
        if self.path == ECN_PATH_EBPF:
            zero = pack_value(COUNTERS_LAYOUT, {})
            try:
                self._map("ecn_counters").update_many({p.ifindex: zero for p in self.ports})
            except OSError as err:
                raise TestbedError(f"cannot reset the ECN counters: {err.strerror or err}") \
                    from None

    def queue_depths(self) -> dict[str, int]:
        """Every port's queue in bytes now: the marker's virtual FIFO (eBPF), or the RED
        qdisc's backlog. One system call (eBPF) or one tc process (RED) reads all ports."""
        if self.path == ECN_PATH_EBPF:
            samples = self.read_map("ecn_qdepth")
            return depths_from_qdepth(self.ports, samples, time.monotonic_ns())
        buffers = self._buffers()
        return {p.intf: buffers.get(p.intf, {}).get("backlog_bytes", 0) for p in self.ports}

    # -- tear-down --------------------------------------------------------------------------
    def remove(self) -> None:
        """Stop the anchor agent, close the maps and remove their pins; safe at any point of
        bring-up. Call it while the ports still exist: the agent reads their queues."""
        if self.anchor is not None:
            self.anchor.stop()
        with self._maps_lock:
            for pinned in self._maps.values():
                pinned.close()
            self._maps = {}
        if self._pins_claimed:
            remove_pins([str(path) for path in pinned_map_paths()])
