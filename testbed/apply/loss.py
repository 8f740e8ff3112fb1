"""Link loss on a running fabric without netem: the eBPF loss program (testbed/apply/bpf/loss.c)
attached where testbed.plan.loss_plan says, configured per port, its counters read back, its
pinned maps recorded in the run ledger and removed at the end."""
from __future__ import annotations

import os
from collections.abc import Callable

from testbed.apply.marking import build_object, read_ifindex
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
    loss_config_command,
)
from testbed.system.process import run_tool


class LinkLoss:
    """``cuts``: (where, how) pairs, how None for a cut that loses nothing until a failure
    schedule sets it (``set_loss``); ``apply`` after the ports are shaped and marked.
    ``host_pid``: a host's name -> a process in its namespace, for the cuts at a host's
    egress."""

    def __init__(self, cuts: list[tuple[Cut, Loss | None]], ledger: Ledger,
                 host_pid: Callable[[str], int], log=print):
        self.cuts = list(cuts)
        self.ledger = ledger
        self.host_pid = host_pid
        self.log = log
        self.obj = cache_object()
        self.keys: dict[str, int] = {}  # interface -> its key in the program's maps
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
        tc: dict[str | None, list[list[str]]] = {}  # host (None: the root namespace) -> commands
        bpftool = []
        for cut, loss in self.cuts:
            host = cut.src if cut.host_key is not None else None
            tc.setdefault(host, []).extend(attach_commands(cut, self.obj))
            self.keys[cut.intf] = cut.host_key or read_ifindex(cut.intf)
            bpftool += config_commands(self.keys[cut.intf], loss)
        for host, commands in tc.items():
            netns = [] if host is None else ["nsenter", f"--net=/proc/{self.host_pid(host)}/ns/net"]
            run_tool([*netns, "tc", "-batch", "-"], batch_input(commands, "tc"),
                     f"tc could not attach the loss program{f' in {host}' if host else ''}")
        run_tool(["bpftool", "batch", "file", "-"], batch_input(bpftool, "bpftool"),
                 "bpftool could not configure the loss program")
        self.log(f"loss on {len(self.cuts)} link directions by the eBPF loss program")

    def has(self, intfs: list[str]) -> bool:
        """Whether every one of ``intfs`` has a cut (after ``apply``)."""
        return all(intf in self.keys for intf in intfs)

    def set_loss(self, intfs: list[str], loss: Loss | None) -> None:
        """Change the loss of the cuts at ``intfs`` on the running program: ``loss``, or
        None for what they were given at the start."""
        base = {cut.intf: given for cut, given in self.cuts}
        commands = [loss_config_command(self.keys[intf], base[intf] if loss is None else loss)
                    for intf in intfs]
        run_tool(["bpftool", "batch", "file", "-"], batch_input(commands, "bpftool"),
                 "bpftool could not change the loss program's configuration")

    def counters(self) -> dict[str, dict[str, int]]:
        """Per interface: packets the loss applied to and packets dropped."""
        if not self.cuts:
            return {}
        raw = parse_dump(COUNTERS_LAYOUT, run_tool(dump_command("loss_counters"),
                                               what="bpftool could not read loss_counters"))
        return {intf: raw.get(key, {"matched": 0, "dropped": 0})
                for intf, key in self.keys.items()}

    def remove(self) -> None:
        if self._pins_claimed:
            remove_pins([str(pin_path(name)) for name in MAPS])
