"""ECN marking on a running fabric: the thin layer that runs ``testbed.plan.ecn_plan``'s plans
as root, reads the counters and queue depths back, and removes what the plans left.

Bring-up, after ``testbed.apply.network.FabricNetwork`` has shaped every switch port:

1. eBPF path: build the marker object if it is missing or older than its source (the
   ``make bpf`` command, ``ecn_plan.compile_command``, into the run-independent
   ``build/bpf/``); write the maps' pin paths into the run ledger, so ``testbed clean``
   removes them after a killed run, and remove pins an unrecorded earlier run left (their
   entries would be inherited);
2. one ``tc -batch`` for every port (buffer, clsact, filter; or RED in the buffer's place);
3. eBPF path: one ``bpftool batch`` writing every port's config and zeroed state.

Tear-down removes the pins; the interfaces' deletion takes the filters and qdiscs along.
"""
from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from pathlib import Path

from testbed.apply.state import Ledger, remove_pins
from testbed.capabilities import detect
from testbed.errors import TestbedError
from testbed.measure.queues import (
    counter_delta,
    depths_from_qdepth,
    ecn_report,
    port_counters,
    queue_sampling,
)
from testbed.model.topology.base import Fabric
from testbed.plan.ecn_plan import (
    BPF_OBJECT,
    BPF_SOURCE,
    ECN_PATH_EBPF,
    Port,
    batch_input,
    choose_ecn_path,
    compile_command,
    counter_reset_commands,
    fabric_marking_plan,
    map_dump_command,
    parse_buffer_stats,
    parse_map_dump,
    pinned_map_paths,
)
from testbed.plan.profiles import QueueConfig
from testbed.plan.settings import EcnSettings, queue_record

TOOL_TIMEOUT_S = 120
QDISC_STATS = ["tc", "-s", "-j", "qdisc", "show"]


def object_is_current(obj: Path = BPF_OBJECT, source: Path = BPF_SOURCE) -> bool:
    """Whether the marker object exists and is no older than its source (make's rule)."""
    return obj.exists() and obj.stat().st_mtime >= source.stat().st_mtime


def build_object(obj: Path = BPF_OBJECT, source: Path = BPF_SOURCE) -> bool:
    """Compile the marker unless it is current; returns whether it was compiled."""
    if object_is_current(obj, source):
        return False
    obj.parent.mkdir(parents=True, exist_ok=True)
    _run(compile_command(source, obj), what="clang could not build the ECN marker")
    return True


def _run(argv: list[str], stdin: str | None = None, what: str = "") -> str:
    out = subprocess.run(argv, input=stdin, capture_output=True, text=True,
                         timeout=TOOL_TIMEOUT_S)
    if out.returncode != 0:
        raise TestbedError(f"{what or argv[0] + ' failed'}: {out.stderr.strip()[-300:]}")
    return out.stdout


def read_ifindex(intf: str) -> int:
    return int(Path(f"/sys/class/net/{intf}/ifindex").read_text())


def shaped_ports(fabric: Fabric, ifindex: Callable[[str], int] = read_ifindex) -> list[Port]:
    """The switch ends that have a rate (an HTB class to queue under), in fabric order."""
    return [Port(intf, ifindex(intf), link.rate_mbit)
            for _, _, intf, link in fabric.switch_ends() if link.rate_mbit is not None]


class EcnMarking:
    """``queue`` on every shaped switch port of a running ``fabric``, marked by ``path``
    ("red-qdisc" or "ebpf"; None: what this machine's capabilities choose)."""

    def __init__(self, fabric: Fabric, queue: QueueConfig, ledger: Ledger,
                 path: str | None = None, obj: Path = BPF_OBJECT, log=print):
        self.fabric = fabric
        self.queue = queue
        self.ledger = ledger
        self.obj = obj
        self.log = log
        # Decided now, before anything is created: a path the machine cannot take is refused.
        self.path = choose_ecn_path(detect(), prefer=path, object_built=object_is_current(obj))
        self.ports: list[Port] = []
        self._pins_claimed = False

    # -- bring-up ---------------------------------------------------------------------------
    def apply(self) -> None:
        """Put the queue on every port (after the ports are shaped)."""
        self.ports = shaped_ports(self.fabric)
        plan = fabric_marking_plan(self.path, self.ports, self.queue, self.fabric.mtu_bytes,
                                   self.obj)
        if self.path == ECN_PATH_EBPF:
            if build_object(self.obj):
                self.log(f"built the ECN marker: {self.obj}")
            self._claim_pins()
        _run(["tc", "-batch", "-"], plan.tc_batch(),
             f"tc could not put ECN marking ({self.path}) on the switch ports")
        if plan.bpftool:
            _run(["bpftool", "batch", "file", "-"], plan.bpftool_batch(),
                 "bpftool could not configure the ECN marker's ports")
        self.log(f"queues on {len(self.ports)} switch ports by {self.path}: "
                 f"{queue_record(self.queue)}")

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
        return parse_map_dump(map_name, _run(map_dump_command(map_name),
                                             what=f"bpftool could not read {map_name}"))

    def counters(self) -> dict[str, dict]:
        """Every port's counters since the marking was applied (testbed.measure.queues)."""
        buffers = parse_buffer_stats(_run(QDISC_STATS, what="tc could not read the queues"),
                                     self.queue)
        marker = self._marker_dump("ecn_counters") if self.path == ECN_PATH_EBPF else None
        return port_counters(self.ports, marker, buffers)

    def reset_counters(self) -> None:
        """Zero the marker's counters (eBPF path; the virtual queues run on)."""
        if self.path == ECN_PATH_EBPF:
            _run(["bpftool", "batch", "file", "-"],
                 batch_input(counter_reset_commands(p.ifindex for p in self.ports), "bpftool"),
                 "bpftool could not reset the ECN counters")

    def queue_depths(self) -> dict[str, int]:
        """Every port's queue in bytes now: the marker's virtual FIFO (eBPF), or the RED
        qdisc's backlog. One process reads all ports."""
        if self.path == ECN_PATH_EBPF:
            samples = self._marker_dump("ecn_qdepth")
            return depths_from_qdepth(self.ports, samples, time.monotonic_ns())
        buffers = parse_buffer_stats(_run(QDISC_STATS, what="tc could not read the queues"),
                                     self.queue)
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
