"""Link loss on a running fabric without netem: the eBPF loss program (testbed/apply/bpf/loss.c)
attached where testbed.plan.loss_plan says, configured per port, its counters read back, its
pinned maps recorded in the run ledger and removed at the end."""
from __future__ import annotations

import os

from testbed.apply.marking import build_object, read_ifindex, run_tool
from testbed.apply.state import Ledger, remove_pins
from testbed.plan.bpf_maps import dump_command, parse_dump, pin_path
from testbed.plan.ecn_plan import batch_input
from testbed.plan.loss_plan import (
    COUNTERS_LAYOUT,
    LOSS_SOURCE,
    MAPS,
    Cut,
    Loss,
    attach_commands,
    cache_object,
    config_commands,
)


class LinkLoss:
    """``cuts``: (where, how) pairs; ``apply`` after the ports are shaped and marked."""

    def __init__(self, cuts: list[tuple[Cut, Loss]], ledger: Ledger, log=print):
        self.cuts = list(cuts)
        self.ledger = ledger
        self.log = log
        self.obj = cache_object()
        self.ifindexes: dict[str, int] = {}
        self._pins_claimed = False

    def apply(self) -> None:
        if not self.cuts:
            return
        if build_object(self.obj, LOSS_SOURCE):
            self.log(f"built the loss program: {self.obj}")
        paths = [str(pin_path(name)) for name in MAPS]
        self.ledger.add_names(pinned=paths)
        self._pins_claimed = True
        remove_pins([p for p in paths if os.path.exists(p)])  # an earlier run's
        tc, bpftool = [], []
        for cut, loss in self.cuts:
            tc += attach_commands(cut, self.obj)
            self.ifindexes[cut.intf] = read_ifindex(cut.intf)
        for cut, loss in self.cuts:
            bpftool += config_commands(self.ifindexes[cut.intf], loss)
        run_tool(["tc", "-batch", "-"], batch_input(tc, "tc"),
             "tc could not attach the loss program")
        run_tool(["bpftool", "batch", "file", "-"], batch_input(bpftool, "bpftool"),
             "bpftool could not configure the loss program")
        self.log(f"loss on {len(self.cuts)} link directions by the eBPF loss program")

    def counters(self) -> dict[str, dict[str, int]]:
        """Per interface: packets the loss applied to and packets dropped."""
        if not self.cuts:
            return {}
        raw = parse_dump(COUNTERS_LAYOUT, run_tool(dump_command("loss_counters"),
                                               what="bpftool could not read loss_counters"))
        return {intf: raw.get(index, {"matched": 0, "dropped": 0})
                for intf, index in self.ifindexes.items()}

    def remove(self) -> None:
        if self._pins_claimed:
            remove_pins([str(pin_path(name)) for name in MAPS])
