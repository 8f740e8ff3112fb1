"""What a run may leave on the machine, as a snapshot taken before and after it, and the
difference (what was there after and not before): network namespaces, veths, tap devices and
bridges, bridges in the machine's Open vSwitch, processes of ours, the root namespace's
kernel settings a fabric changes (testbed.apply.network.ROOT_SETTINGS) and their values,
pinned BPF maps, the run ledger and the private OVS folder. ``snapshot`` reads the machine;
everything else is pure.
"""
from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path

from testbed.apply import ovs
from testbed.apply.network import ROOT_SETTINGS
from testbed.apply.state import LEDGER_PATH, STATE_DIR, process_cmdline, process_start_ticks
from testbed.plan.bpf_maps import PIN_DIR
from testbed.plan.ecn_plan import MAPS as MARKER_MAPS
from testbed.plan.loss_plan import MAPS as LOSS_MAPS

# Command lines of the processes a run starts: the controller, the host programs, Mininet's
# shells, iperf3, the agents, and the run's own ovsdb-server and ovs-vswitchd (their files
# live under the state folder); and the holder of a fabric `testbed up` keeps.
OURS = re.compile(r"testbed\.controllers\.apps\.launcher|testbed\.traffic\.|mnexec|iperf3|"
                  r"mininet:|testbed\.apply\.(pfc_agent|ecn_anchor)|"
                  + re.escape(f"{STATE_DIR}/ovs/") + r"|testbed\.harness\.session")
INTERFACE_KINDS = {"veth": "veths", "tun": "taps", "bridge": "bridges", "openvswitch": "bridges"}
CATEGORIES = ("namespaces", "veths", "taps", "bridges", "processes", "settings", "pins",
              "state")


@dataclass(frozen=True)
class Snapshot:
    """The machine as far as a run could leave something on it."""

    namespaces: frozenset = frozenset()  # network namespace inodes held by any process or name
    interfaces: dict = field(default_factory=dict)  # root namespace: name -> kind
    ovs_bridges: frozenset = frozenset()  # in the machine's Open vSwitch
    processes: dict = field(default_factory=dict)  # (pid, start ticks) -> command line, ours
    settings: dict = field(default_factory=dict)  # kernel setting path -> value
    pins: frozenset = frozenset()  # pinned BPF objects the testbed uses
    state: frozenset = frozenset()  # the ledger, the private OVS folder, when present


def leftovers(before: Snapshot, after: Snapshot) -> dict[str, list[str]]:
    """Per category, what ``after`` holds that ``before`` did not: one line each, sorted; a
    kernel setting counts when its value differs (or it went missing)."""
    found: dict[str, list[str]] = {name: [] for name in CATEGORIES}
    found["namespaces"] = [f"net:[{inode}]" for inode in sorted(after.namespaces - before.namespaces)]
    for name, kind in sorted(after.interfaces.items()):
        if name not in before.interfaces and kind in INTERFACE_KINDS:
            found[INTERFACE_KINDS[kind]].append(f"{name} ({kind})")
    found["bridges"] += [f"{name} (Open vSwitch)" for name in sorted(after.ovs_bridges - before.ovs_bridges)]
    found["processes"] = [f"pid {pid}: {cmd[:120]}" for (pid, ticks), cmd in sorted(after.processes.items())
                          if (pid, ticks) not in before.processes]
    found["settings"] = [f"{path} is {after.settings.get(path)!r}, was {value!r}"
                         for path, value in sorted(before.settings.items())
                         if after.settings.get(path) != value]
    found["pins"] = sorted(after.pins - before.pins)
    found["state"] = sorted(after.state - before.state)
    return found


def count(found: dict[str, list[str]]) -> int:
    return sum(len(items) for items in found.values())


def describe(found: dict[str, list[str]]) -> str:
    """``2 veths (p0e0-eth1 (veth), ...), 1 processes (...)``, or ``nothing``."""
    parts = [f"{len(items)} {name} ({', '.join(items[:3])}{', ...' if len(items) > 3 else ''})"
             for name, items in found.items() if items]
    return "; ".join(parts) or "nothing"


# --- reading the machine ----------------------------------------------------------------------


def our_processes() -> dict[tuple[int, int], str]:
    """(pid, start ticks) -> command line of every live process of ours (``OURS``)."""
    found = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        cmdline = process_cmdline(int(entry))
        ticks = process_start_ticks(int(entry))
        if ticks is not None and OURS.search(cmdline):
            found[(int(entry), ticks)] = cmdline
    return found


def namespaces() -> frozenset:
    """Network namespaces held by a process (its /proc/PID/ns/net) or a name (/run/netns)."""
    inodes = set()
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                inodes.add(os.stat(f"/proc/{entry}/ns/net").st_ino)
            except OSError:
                pass
    named = Path("/run/netns")
    for path in named.iterdir() if named.is_dir() else ():
        try:
            inodes.add(path.stat().st_ino)
        except OSError:
            pass
    return frozenset(inodes)


def interfaces() -> dict[str, str]:
    """Every root-namespace interface's name -> its kind (veth, tun, bridge, ...; "" for a
    physical one), over netlink."""
    from pyroute2 import IPRoute

    found = {}
    with IPRoute() as ipr:
        for link in ipr.get_links():
            info = link.get_attr("IFLA_LINKINFO")
            found[link.get_attr("IFLA_IFNAME")] = (info.get_attr("IFLA_INFO_KIND") or ""
                                                   if info is not None else "")
    return found


def snapshot() -> Snapshot:
    """The machine now (root: the namespaces and processes of every user)."""
    settings = {}
    for path in ROOT_SETTINGS:
        try:
            settings[path] = Path(path).read_text().strip()
        except OSError:
            pass
    pins = frozenset(str(PIN_DIR / name) for name in (*MARKER_MAPS, *LOSS_MAPS)
                     if Path(PIN_DIR / name).exists())
    state = frozenset(str(p) for p in (LEDGER_PATH, STATE_DIR / "ovs") if p.exists())
    return Snapshot(namespaces(), interfaces(),
                    frozenset(ovs.list_bridges()) if ovs.is_running() else frozenset(),
                    our_processes(), settings, pins, state)
