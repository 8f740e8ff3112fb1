"""ECN marking on a running fabric: the thin layer around the marker that each switch port's
queue plan (``testbed.plan.port_queue``) attaches. ``testbed.apply.network.FabricNetwork``
applies every port's whole queue, marking included, in one ``tc -batch`` (and, on the eBPF
path, one ``bpftool batch`` filling the marker's maps); ``EcnMarking`` gets the marker ready
before that batch, reads the counters and queue depths back, and removes what it left.

Before the batch, on the eBPF path: build the marker object if it is missing or older than
its source (the ``make bpf`` command, ``ecn_plan.compile_command``, into the run-independent
cache); write the maps' pin paths into the run ledger, so ``testbed clean`` removes them
after a killed run, and remove pins an unrecorded earlier run left (their entries would be
inherited). Tear-down removes the pins; the interfaces' deletion takes the filters and
qdiscs along.

The marking path is decided once, before the fabric exists: by the harness
(``testbed.harness.plans.ecn_path_for``), or by ``machine_ecn_path`` for callers that leave
it to this machine.
"""
from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager, nullcontext
from pathlib import Path

from testbed.apply.state import Ledger, remove_pins
from testbed.errors import ConfigError, TestbedError
from testbed.measure.counters import (
    buffer_stats,
    counter_delta,
    port_counters,
    read_qdiscs,
)
from testbed.measure.queues import depths_from_qdepth, ecn_report, queue_sampling
from testbed.model.topology.base import Fabric
from testbed.plan.ecn_plan import (
    BPF_OBJECT,
    BPF_SOURCE,
    ECN_PATH_EBPF,
    batch_input,
    check_ecn_path,
    choose_ecn_path,
    compile_command,
    counter_reset_commands,
    map_dump_command,
    parse_map_dump,
    pinned_map_paths,
)
from testbed.plan.port_queue import Port
from testbed.plan.profiles import QueueConfig
from testbed.plan.settings import EcnSettings

TOOL_TIMEOUT_S = 120


def object_is_current(obj: Path = BPF_OBJECT, source: Path = BPF_SOURCE) -> bool:
    """Whether the marker object exists and is no older than its source (make's rule)."""
    return obj.exists() and obj.stat().st_mtime >= source.stat().st_mtime


def machine_ecn_path(prefer: str | None = None) -> str:
    """The marking path this machine takes (its capabilities report's, or ``prefer``),
    decided once for a fabric whose caller did not decide it."""
    from testbed.capabilities import detect

    return choose_ecn_path(detect(), prefer, object_built=object_is_current())


def build_object(obj: Path = BPF_OBJECT, source: Path = BPF_SOURCE) -> bool:
    """Compile the marker unless it is current; returns whether it was compiled."""
    if object_is_current(obj, source):
        return False
    obj.parent.mkdir(parents=True, exist_ok=True)
    run_tool(compile_command(source, obj), what="clang could not build the ECN marker")
    return True


def run_tool(argv: Sequence[str], stdin: str | None = None, what: str = "") -> str:
    """Run one tool (tc, bpftool, clang) to completion; its stdout, or a one-line error."""
    out = subprocess.run(list(argv), input=stdin, capture_output=True, text=True,
                         timeout=TOOL_TIMEOUT_S)
    if out.returncode != 0:
        raise TestbedError(f"{what or argv[0] + ' failed'}: {out.stderr.strip()[-300:]}")
    return out.stdout


def read_ifindex(intf: str) -> int:
    return int(Path(f"/sys/class/net/{intf}/ifindex").read_text())


class EcnMarking:
    """``queue``'s marking on ``path`` ("red-qdisc" or "ebpf", decided by the caller) on
    every shaped switch port of a running ``fabric``."""

    def __init__(self, fabric: Fabric, queue: QueueConfig, ledger: Ledger, path: str,
                 obj: Path = BPF_OBJECT, log=print):
        if path is None:
            raise ConfigError("ecn_path", "must be decided before the marking is made")
        check_ecn_path(path)
        self.fabric = fabric
        self.queue = queue
        self.ledger = ledger
        self.path = path
        self.obj = obj
        self.log = log
        self.ports: list[Port] = []
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

    # -- reading ----------------------------------------------------------------------------
    def _marker_dump(self, map_name: str) -> dict[int, dict[str, int]]:
        return parse_map_dump(map_name, run_tool(map_dump_command(map_name),
                                                 what=f"bpftool could not read {map_name}"))

    def _buffers(self) -> dict[str, dict]:
        return buffer_stats(read_qdiscs(), self.queue)

    def counters(self) -> dict[str, dict]:
        """Every port's counters since the marking was applied (testbed.measure.counters)."""
        buffers = self._buffers()
        marker = self._marker_dump("ecn_counters") if self.path == ECN_PATH_EBPF else None
        return port_counters(self.ports, marker, buffers)

    def reset_counters(self) -> None:
        """Zero the marker's counters (eBPF path; the virtual queues run on)."""
        if self.path == ECN_PATH_EBPF:
            run_tool(["bpftool", "batch", "file", "-"],
                     batch_input(counter_reset_commands(p.ifindex for p in self.ports),
                                 "bpftool"),
                     "bpftool could not reset the ECN counters")

    def queue_depths(self) -> dict[str, int]:
        """Every port's queue in bytes now: the marker's virtual FIFO (eBPF), or the RED
        qdisc's backlog. One process reads all ports."""
        if self.path == ECN_PATH_EBPF:
            samples = self._marker_dump("ecn_qdepth")
            return depths_from_qdepth(self.ports, samples, time.monotonic_ns())
        buffers = self._buffers()
        return {p.intf: buffers.get(p.intf, {}).get("backlog_bytes", 0) for p in self.ports}

    # -- tear-down --------------------------------------------------------------------------
    def remove(self) -> None:
        """Remove the pinned maps; safe at any point of bring-up."""
        if self._pins_claimed:
            remove_pins([str(path) for path in pinned_map_paths()])


@contextmanager
def ecn_monitoring(marking: EcnMarking | None, settings: EcnSettings | None,
                   result: dict) -> Iterator[None]:
    """Sample queue depths while the block runs; when it ends, put the ECN report (counters
    over the block, depth statistics, queue, path, scaling record) in ``result["ecn"]``.
    Without marking it does nothing."""
    if marking is None or settings is None:
        yield
        return
    before = marking.counters()
    sampling = (queue_sampling(marking.queue_depths, [p.intf for p in marking.ports],
                               settings.sample_ms / 1000) if settings.sample_ms > 0
                else nullcontext())
    with sampling as series:
        yield
    counters = counter_delta(before, marking.counters())
    result["ecn"] = ecn_report(settings, marking.path, counters, series)

