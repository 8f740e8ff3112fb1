"""Kernel modules a fabric's paths need, loaded before their first use.

A stock Debian or Ubuntu kernel builds the kernel datapath (openvswitch), the red and netem
qdiscs, DCTCP (tcp_dctcp) and softRoCE (rdma_rxe) as loadable modules, and
``testbed.capabilities`` counts a feature as available when it is built in or loadable. Not
everything that uses such a feature loads its module: the kernel loads a qdisc's module when
tc asks for the qdisc, but a congestion control must be loaded before it can be added to
``tcp_allowed_congestion_control`` (the write fails with ENOENT otherwise), and only the
machine's OVS service start loads openvswitch. So whatever takes a path that needs a module
loads it here first, with ``modprobe``, whether or not the kernel would have loaded it.

Pure: ``fabric_modules`` (what a fabric's paths need) and ``modules_to_load`` (which of them
are missing). Thin: ``load_modules`` reads what is loaded and built in, and runs modprobe for
the rest; a module that will not load is a one-line TestbedError naming it.
"""
from __future__ import annotations

import os
import subprocess
from collections.abc import Iterable

from testbed.capabilities import (
    PROC_MODULES,
    TCP_CONGESTION_AVAILABLE,
    parse_congestion_available,
    parse_proc_modules,
    read_builtin_modules,
)
from testbed.errors import TestbedError

OVS_MODULE = "openvswitch"
RED_MODULE = "sch_red"
NETEM_MODULE = "sch_netem"
RXE_MODULE = "rdma_rxe"
CONGESTION_PREFIX = "tcp_"  # tcp_dctcp holds the congestion control named dctcp
MODPROBE_TIMEOUT_S = 60


def congestion_module(name: str) -> str:
    """The module that holds congestion control ``name``: ``dctcp`` -> ``tcp_dctcp``."""
    return f"{CONGESTION_PREFIX}{name}"


def fabric_modules(kernel_datapath: bool, red_marking: bool, netem: bool,
                   congestion: str | None) -> list[str]:
    """The modules a fabric needs: the kernel datapath's, the RED qdisc's where it marks,
    netem's where links are impaired, and the hosts' congestion control's."""
    modules = []
    if kernel_datapath:
        modules.append(OVS_MODULE)
    if red_marking:
        modules.append(RED_MODULE)
    if netem:
        modules.append(NETEM_MODULE)
    if congestion:
        modules.append(congestion_module(congestion))
    return modules


def modules_to_load(wanted: Iterable[str], loaded: set[str], builtin: set[str],
                    congestion_available: set[str]) -> list[str]:
    """The modules of ``wanted`` still to load, in order: neither loaded nor built in, and
    for a congestion control module, its algorithm not yet available."""
    missing = []
    for module in wanted:
        name = module.replace("-", "_")
        if name in loaded or name in builtin or name in missing:
            continue
        if (name.startswith(CONGESTION_PREFIX)
                and name.removeprefix(CONGESTION_PREFIX) in congestion_available):
            continue
        missing.append(name)
    return missing


def modprobe_argv(module: str) -> list[str]:
    return ["modprobe", module]


def _read(path) -> str:
    try:
        with open(path) as fh:
            return fh.read()
    except OSError:
        return ""


def load_modules(wanted: Iterable[str], log=print) -> list[str]:
    """Load every module of ``wanted`` that is not there yet; returns those loaded. Raises a
    TestbedError naming the first module modprobe cannot load."""
    missing = modules_to_load(wanted, parse_proc_modules(_read(PROC_MODULES)),
                              read_builtin_modules(os.uname().release),
                              parse_congestion_available(_read(TCP_CONGESTION_AVAILABLE)))
    for module in missing:
        try:
            out = subprocess.run(modprobe_argv(module), capture_output=True, text=True,
                                 timeout=MODPROBE_TIMEOUT_S)
        except FileNotFoundError:
            raise TestbedError(f"kernel module {module} is needed but modprobe is not "
                               "installed (Debian and Ubuntu: package kmod)") from None
        if out.returncode != 0:
            raise TestbedError(f"kernel module {module} would not load: "
                               f"{(out.stderr or out.stdout).strip()[-300:]}")
    if missing:
        log(f"loaded kernel modules: {', '.join(missing)}")
    return missing
