"""Open vSwitch for a run: where its switches live, how to talk to them, how they go away.

Two homes, chosen by datapath:

- ``PrivateSwitchd`` (userspace datapath, ``datapath_type=netdev``): the run starts its own
  ovsdb-server and ovs-vswitchd, with a fresh database under /run/testbed/ovs, as child
  processes it knows by PID. A userspace datapath lives and dies with its process, so the
  run ends by stopping the two daemons and deleting the bridges' tap devices in one netlink
  request. Deleting the bridges through OVS instead costs one datapath reconfiguration per
  port (about 10 s for a k=8 fat-tree's 80 bridges and 256 ports). The machine's own OVS, if
  any, is never touched.
- ``SystemSwitchd`` (kernel datapath): the kernel module's datapath belongs to the machine's
  OVS service, so bridges are created there and deleted by name at the end; the service is
  started only when it is not running, and then stopped again (the ledger remembers).

The module-level functions manage the machine's OVS service (also for plain Mininet, the
baseline ``testbed bench`` compares against).
"""
from __future__ import annotations

import os
import shutil
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path

from testbed.errors import TestbedError
from testbed.system.ovs_tables import parse_vsctl_json

OVS_CTL = "/usr/share/openvswitch/scripts/ovs-ctl"
VSWITCHD_PIDFILE = "/var/run/openvswitch/ovs-vswitchd.pid"
VSWITCH_SCHEMA = "/usr/share/openvswitch/vswitch.ovsschema"
START_TIMEOUT_S = 30.0
NETDEV_DATAPATH_TAP = "ovs-netdev"  # the tap device every userspace datapath opens
USERSPACE_TSO_KEY = "userspace-tso-enable"
# Every pass of ovs-vswitchd's main loop hands each system port's recvmmsg a batch of
# MTU-sized packet buffers and frees the unused ones: thousands of 9 KB allocations per pass
# on a fabric's 80 ports, a sixth of the machine's CPU in glibc's malloc. tcmalloc serves
# them from a per-thread cache (measured in docs/capacity.md).
TCMALLOC_LIBRARY = "tcmalloc_minimal"


def allocator_preload() -> str | None:
    """The tcmalloc library to preload into ovs-vswitchd (its soname, which the dynamic
    linker finds as it finds any library), or None (glibc malloc)."""
    import ctypes.util

    return ctypes.util.find_library(TCMALLOC_LIBRARY)


def _vsctl(*args: str, timeout_s: int = 10) -> subprocess.CompletedProcess:
    return subprocess.run(["ovs-vsctl", f"--timeout={timeout_s}", *args],
                          capture_output=True, text=True)


def is_running() -> bool:
    """Is the machine's OVS service answering?"""
    try:
        return _vsctl("show", timeout_s=2).returncode == 0
    except FileNotFoundError:
        return False


def start() -> None:
    """Start the machine's ovsdb-server and ovs-vswitchd (without the kernel module if it is
    absent)."""
    try:
        proc = subprocess.run([OVS_CTL, "start", "--no-monitor"], capture_output=True, text=True)
    except FileNotFoundError:
        raise TestbedError("Open vSwitch is not installed: run `sudo make install`") from None
    deadline = time.monotonic() + START_TIMEOUT_S
    while not is_running():
        if time.monotonic() > deadline:
            raise TestbedError(f"Open vSwitch did not start: {proc.stderr.strip()[-300:]}")
        time.sleep(0.2)


def stop() -> None:
    subprocess.run([OVS_CTL, "stop"], capture_output=True)


def vswitchd_pid() -> int | None:
    try:
        with open(VSWITCHD_PIDFILE) as fh:
            return int(fh.read().strip())
    except (OSError, ValueError):
        return None


def list_bridges() -> list[str]:
    """The bridges of the machine's OVS, read from its database as JSON."""
    out = _vsctl("--format=json", "--columns=name", "list", "Bridge")
    return [row["name"] for row in parse_vsctl_json(out.stdout)] if out.returncode == 0 else []


def delete_bridges(names: list[str]) -> None:
    """Delete bridges of the machine's OVS in one ovs-vsctl transaction."""
    if not names:
        return
    args: list[str] = []
    for name in names:
        args += ["--", "--if-exists", "del-br", name]
    _vsctl(*args[1:], timeout_s=60)


class Switchd:
    """The OVS instance(s) a run's switches live in: configure, query, take down."""

    datapath_type = ""
    bridges: list[str] = []

    def start(self, workdir: Path, groups: list[list[str]]) -> None:
        """Be ready for the bridges of ``groups`` (recorded in the run ledger first), a group
        per ovs-vswitchd where an instance can run several; logs go to ``workdir``."""
        raise NotImplementedError

    def stop(self) -> None:
        raise NotImplementedError

    def taps(self) -> list[str]:
        """Interfaces the bridges leave in the root namespace after ``stop``."""
        return []

    def forwarders(self) -> list[subprocess.Popen]:
        """The run's own ovs-vswitchd processes, which a workload cannot go on without (none
        when the switches live in the machine's OVS)."""
        return []

    def vsctl_argv(self, bridge: str | None = None) -> list[str]:
        """``ovs-vsctl`` talking to the database that holds ``bridge`` (None: the only one)."""
        raise NotImplementedError

    def vsctl(self, args: list[str], timeout_s: int = 60, bridge: str | None = None) -> None:
        """One ``ovs-vsctl`` transaction on the database holding ``bridge``; a one-line
        TestbedError if OVS refuses it."""
        self._vsctl_at(self.vsctl_argv(bridge), args, timeout_s)

    @staticmethod
    def _vsctl_at(argv: list[str], args: list[str], timeout_s: int) -> None:
        out = subprocess.run([*argv, f"--timeout={timeout_s}", *args],
                             capture_output=True, text=True)
        if out.returncode != 0:
            raise TestbedError(f"ovs-vsctl failed: {out.stderr.strip()[-300:]}")

    def configure(self, transaction, timeout_s: int) -> None:
        """Build the bridges: ``transaction(bridges, datapath_type)`` is the ``ovs-vsctl``
        argument list creating a group of bridges."""
        self.vsctl(["--no-wait", *transaction(self.bridges, self.datapath_type)], timeout_s)

    def describe(self) -> dict:
        """How the switches run, for a run's record."""
        return {"processes": 1, "datapath_type": self.datapath_type}

    def bridge_target(self, bridge: str) -> str:
        """What ``ovs-ofctl`` is given to reach ``bridge``."""
        return bridge

    def ofctl(self, *args: str) -> str:
        out = subprocess.run(["ovs-ofctl", "-O", "OpenFlow13", *args],
                             capture_output=True, text=True)
        return out.stdout

    def dump_groups(self, bridge: str) -> str:
        return self.ofctl("dump-groups", self.bridge_target(bridge))

    def dump_flows(self, bridge: str) -> str:
        return self.ofctl("dump-flows", self.bridge_target(bridge))

    @property
    def pids(self) -> list[int]:
        """PIDs of the ovs-vswitchd processes forwarding the run's packets (CPU accounting)."""
        raise NotImplementedError


class SystemSwitchd(Switchd):
    """Bridges in the machine's OVS service (needed for the kernel datapath)."""

    datapath_type = "system"

    def __init__(self, ledger, log=print):
        self.ledger = ledger
        self.log = log
        self.bridges: list[str] = []

    def start(self, workdir: Path, groups: list[list[str]]) -> None:
        self.bridges = [b for group in groups for b in group]
        self.ledger.add_names(bridges=self.bridges)
        if not is_running():
            self.ledger.ovs_started = True
            self.ledger.save()
            self.log("starting Open vSwitch")
            start()

    def vsctl_argv(self, bridge: str | None = None) -> list[str]:
        return ["ovs-vsctl"]

    @property
    def pids(self) -> list[int]:
        pid = vswitchd_pid()
        return [] if pid is None else [pid]

    def stop(self) -> None:
        present = set(list_bridges()) if is_running() else set()
        delete_bridges([b for b in self.bridges if b in present])


class PrivateSwitchd(Switchd):
    """The run's own ovsdb-server + ovs-vswitchd pairs (userspace datapath) under ``rundir``,
    one pair per group of bridges (testbed.plan.shards).

    One group: ``datapath_type=netdev`` and everything directly under ``rundir``. Its
    datapath opens a tap device named ``ovs-netdev`` and every bridge a tap of its own name,
    so a second such ovs-vswitchd in the same network namespace cannot start (the machine's
    OVS with a netdev bridge collides the same way: refused with a one-line error).

    Several groups: ``datapath_type=dummy`` (ovs-vswitchd ``--enable-dummy``), the same
    userspace datapath (dpif-netdev) registered under another name, whose bridge-local ports
    live inside the process instead of as tap devices; the switch ports are the same veths,
    opened the same way. So the pairs share the root namespace, each in ``rundir/shardN``
    with its own database, control and management sockets, and the controller reaches all
    of them on 127.0.0.1.
    """

    def __init__(self, ledger, rundir: Path, log=print, userspace_tso: bool = False,
                 cpus: Sequence[int] = ()):
        """``userspace_tso``: ports exchange segmentation-offloaded packets with the kernel
        (virtio-net headers on their packet sockets), so a TCP flow's 64 KiB super-packets
        cross each switch as one packet instead of dozens (Open vSwitch's userspace TSO);
        ``cpus``: the CPU each group's ovs-vswitchd is pinned to (testbed.plan.shards
        .cpu_layout; empty: not pinned)."""
        self.ledger = ledger
        self.rundir = rundir
        self.log = log
        self.userspace_tso = userspace_tso
        self.cpus = tuple(cpus)
        self.preload = allocator_preload()
        self.groups: list[list[str]] = []
        self.daemons: list[subprocess.Popen] = []
        self.switchds: list[subprocess.Popen] = []

    @property
    def bridges(self) -> list[str]:
        return [b for group in self.groups for b in group]

    @property
    def datapath_type(self) -> str:
        return "dummy" if len(self.groups) > 1 else "netdev"

    def shard_dir(self, index: int) -> Path:
        return self.rundir if len(self.groups) <= 1 else self.rundir / f"shard{index}"

    def start(self, workdir: Path, groups: list[list[str]]) -> None:
        for tool in ("ovsdb-tool", "ovsdb-server", "ovs-vswitchd", "ovs-vsctl", "ovs-appctl"):
            if shutil.which(tool) is None:
                raise TestbedError(f"{tool} not found: Open vSwitch is not installed; run "
                                   "`sudo make install`")
        self.groups = [list(g) for g in groups if g]
        if self.datapath_type == "netdev" and os.path.exists(
                f"/sys/class/net/{NETDEV_DATAPATH_TAP}"):
            raise TestbedError(f"another OVS userspace datapath is running ({NETDEV_DATAPATH_TAP} "
                               "exists; the machine's OVS has a datapath_type=netdev bridge?): "
                               "remove it, or run `testbed clean` after a killed run")
        # The tap devices outlive a killed ovs-vswitchd: clean deletes them by name.
        self.ledger.add_names(interfaces=self.taps())
        shutil.rmtree(self.rundir, ignore_errors=True)
        self.rundir.mkdir(parents=True)
        for index in range(len(self.groups)):
            self._start_shard(workdir, index)
        for index in range(len(self.switchds)):
            ctl = str(self.shard_dir(index) / "ovs-vswitchd.ctl")
            self._wait(lambda: subprocess.run(["ovs-appctl", "-t", ctl, "version"],
                                              capture_output=True).returncode == 0,
                       "ovs-vswitchd")

    def _start_shard(self, workdir: Path, index: int) -> None:
        """Start one ovsdb-server + ovs-vswitchd pair; its logs in ``workdir`` (numbered when
        there are several)."""
        home = self.shard_dir(index)
        home.mkdir(parents=True, exist_ok=True)
        suffix = f"-{index}" if len(self.groups) > 1 else ""
        db = home / "conf.db"
        subprocess.run(["ovsdb-tool", "create", str(db), VSWITCH_SCHEMA], check=True,
                       capture_output=True)
        common = ["--no-chdir", "-vconsole:off", "-vsyslog:off"]
        self._spawn(["ovsdb-server", str(db), f"--remote=punix:{home / 'db.sock'}",
                     f"--unixctl={home / 'ovsdb-server.ctl'}", *common,
                     f"--log-file={workdir / f'ovsdb-server{suffix}.log'}"], home)
        vsctl = ["ovs-vsctl", f"--db=unix:{home / 'db.sock'}"]
        init = [*vsctl, "--timeout=2", "--no-wait", "init"]
        self._wait(lambda: subprocess.run(init, capture_output=True).returncode == 0,
                   "ovsdb-server")
        if self.userspace_tso:  # read by ovs-vswitchd when it starts, so set before it does
            self._vsctl_at(vsctl, ["--no-wait", "set", "Open_vSwitch", ".",
                                   f"other_config:{USERSPACE_TSO_KEY}=true"], 60)
        dummy = ["--enable-dummy"] if self.datapath_type == "dummy" else []
        # taskset execs ovs-vswitchd pinned, so every thread it starts is pinned too
        pin = ["taskset", "-c", str(self.cpus[index])] if index < len(self.cpus) else []
        env = {"LD_PRELOAD": self.preload} if self.preload else {}
        self.switchds.append(self._spawn(
            [*pin, "ovs-vswitchd", f"unix:{home / 'db.sock'}",
             f"--unixctl={home / 'ovs-vswitchd.ctl'}", *dummy, *common,
             f"--log-file={workdir / f'ovs-vswitchd{suffix}.log'}"], home, env))

    def describe(self) -> dict:
        """How the switches run, for a run's record: processes, datapath type, pinning and
        allocator."""
        return {"processes": len(self.groups), "datapath_type": self.datapath_type,
                "bridges_per_process": [len(g) for g in self.groups],
                "pinned_cpus": list(self.cpus[:len(self.groups)]),
                "allocator": "tcmalloc" if self.preload else "glibc"}

    def _spawn(self, argv: list[str], home: Path, env: dict | None = None) -> subprocess.Popen:
        # OVS_RUNDIR puts the bridges' OpenFlow management sockets in the shard's directory.
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL, start_new_session=True,
                                env={**os.environ, "OVS_RUNDIR": str(home), **(env or {})})
        self.daemons.append(proc)
        self.ledger.add_process(proc.pid)
        return proc

    def _wait(self, ready, name: str) -> None:
        deadline = time.monotonic() + START_TIMEOUT_S
        while not ready():
            if any(p.poll() is not None for p in self.daemons):
                raise TestbedError(f"{name} exited at start; see its log in the run folder")
            if time.monotonic() > deadline:
                raise TestbedError(f"{name} did not answer within {START_TIMEOUT_S:.0f} s")
            time.sleep(0.05)

    def _home_of(self, bridge: str | None) -> Path:
        """The directory of the pair holding ``bridge`` (None: the only pair). Found on disk
        by its management socket, so a process attached to a running fabric finds it too;
        a bridge found nowhere is looked for where a single pair keeps it (and OVS says it
        is not there)."""
        shards = sorted(self.rundir.glob("shard*"))
        if bridge is None:
            if len(shards) > 1:
                raise TestbedError("the switches are spread over several ovs-vswitchd: name "
                                   "the bridge this ovs-vsctl command is for")
            return shards[0] if shards else self.rundir
        for home in shards:
            if (home / f"{bridge}.mgmt").exists():
                return home
        return self.rundir

    def vsctl_argv(self, bridge: str | None = None) -> list[str]:
        return ["ovs-vsctl", f"--db=unix:{self._home_of(bridge) / 'db.sock'}"]

    def configure(self, transaction, timeout_s: int) -> None:
        """Build each pair's bridges: ``transaction(bridges, datapath_type)`` is the
        ``ovs-vsctl`` argument list for a group's bridges."""
        for index, group in enumerate(self.groups):
            argv = ["ovs-vsctl", f"--db=unix:{self.shard_dir(index) / 'db.sock'}"]
            self._vsctl_at(argv, ["--no-wait", *transaction(group, self.datapath_type)],
                           timeout_s)

    def taps(self) -> list[str]:
        """The bridges' taps and the datapath's own, once ``start`` has claimed them (none
        for the dummy datapath)."""
        if not self.groups or self.datapath_type != "netdev":
            return []
        return [*self.bridges, NETDEV_DATAPATH_TAP]

    def bridge_target(self, bridge: str) -> str:
        return f"unix:{self._home_of(bridge) / bridge}.mgmt"

    def forwarders(self) -> list[subprocess.Popen]:
        return list(self.switchds)

    @property
    def pids(self) -> list[int]:
        return [p.pid for p in self.switchds if p.poll() is None]

    def stop(self) -> None:
        """Stop every daemon. The bridges' tap devices (one pair) outlive ovs-vswitchd: the
        caller deletes them (they are in the run's link group, see testbed.apply.network)."""
        for proc in reversed(self.daemons):
            if proc.poll() is None:
                proc.kill()  # nothing to save: the datapath and database die with the run
            proc.wait()
        self.daemons = []
        self.switchds = []
        shutil.rmtree(self.rundir, ignore_errors=True)
