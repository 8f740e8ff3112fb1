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
from pathlib import Path

from testbed.errors import TestbedError
from testbed.measure.ovs_tables import parse_vsctl_json

OVS_CTL = "/usr/share/openvswitch/scripts/ovs-ctl"
VSWITCHD_PIDFILE = "/var/run/openvswitch/ovs-vswitchd.pid"
VSWITCH_SCHEMA = "/usr/share/openvswitch/vswitch.ovsschema"
START_TIMEOUT_S = 30.0
NETDEV_DATAPATH_TAP = "ovs-netdev"  # the tap device every userspace datapath opens
USERSPACE_TSO_KEY = "userspace-tso-enable"


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

    def start(self, workdir: Path, bridges: list[str]) -> None:
        """Be ready for ``bridges`` (recorded in the run ledger first); logs go to ``workdir``."""
        raise NotImplementedError

    def stop(self) -> None:
        raise NotImplementedError

    def taps(self) -> list[str]:
        """Interfaces the bridges leave in the root namespace after ``stop``."""
        return []

    def vsctl_argv(self) -> list[str]:
        """``ovs-vsctl`` talking to the database that holds the bridges."""
        raise NotImplementedError

    def vsctl(self, args: list[str], timeout_s: int = 60) -> None:
        """One ``ovs-vsctl`` transaction; a one-line TestbedError if OVS refuses it."""
        out = subprocess.run([*self.vsctl_argv(), f"--timeout={timeout_s}", *args],
                             capture_output=True, text=True)
        if out.returncode != 0:
            raise TestbedError(f"ovs-vsctl failed: {out.stderr.strip()[-300:]}")

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

    def start(self, workdir: Path, bridges: list[str]) -> None:
        self.bridges = list(bridges)
        self.ledger.add_names(bridges=self.bridges)
        if not is_running():
            self.ledger.ovs_started = True
            self.ledger.save()
            self.log("starting Open vSwitch")
            start()

    def vsctl_argv(self) -> list[str]:
        return ["ovs-vsctl"]

    @property
    def pids(self) -> list[int]:
        pid = vswitchd_pid()
        return [] if pid is None else [pid]

    def stop(self) -> None:
        present = set(list_bridges()) if is_running() else set()
        delete_bridges([b for b in self.bridges if b in present])


class PrivateSwitchd(Switchd):
    """The run's own ovsdb-server + ovs-vswitchd (userspace datapath) under ``rundir``.

    One instance per machine: every userspace datapath opens a tap device named
    ``ovs-netdev``, so a second ovs-vswitchd in the same network namespace cannot start its
    datapath (the machine's OVS with a netdev bridge collides the same way: refused with a
    one-line error).
    """

    datapath_type = "netdev"

    def __init__(self, ledger, rundir: Path, log=print, userspace_tso: bool = False):
        """``userspace_tso``: ports exchange segmentation-offloaded packets with the kernel
        (virtio-net headers on their packet sockets), so a TCP flow's 64 KiB super-packets
        cross each switch as one packet instead of dozens (Open vSwitch's userspace TSO)."""
        self.ledger = ledger
        self.rundir = rundir
        self.log = log
        self.userspace_tso = userspace_tso
        self.bridges: list[str] = []
        self.daemons: list[subprocess.Popen] = []

    def start(self, workdir: Path, bridges: list[str]) -> None:
        for tool in ("ovsdb-tool", "ovsdb-server", "ovs-vswitchd", "ovs-vsctl", "ovs-appctl"):
            if shutil.which(tool) is None:
                raise TestbedError(f"{tool} not found: Open vSwitch is not installed; run "
                                   "`sudo make install`")
        if os.path.exists(f"/sys/class/net/{NETDEV_DATAPATH_TAP}"):
            raise TestbedError(f"another OVS userspace datapath is running ({NETDEV_DATAPATH_TAP} "
                               "exists; the machine's OVS has a datapath_type=netdev bridge?): "
                               "remove it, or run `testbed clean` after a killed run")
        self.bridges = list(bridges)
        # The tap devices outlive a killed ovs-vswitchd: clean deletes them by name.
        self.ledger.add_names(interfaces=self.taps())
        shutil.rmtree(self.rundir, ignore_errors=True)
        self.rundir.mkdir(parents=True)
        db = self.rundir / "conf.db"
        subprocess.run(["ovsdb-tool", "create", str(db), VSWITCH_SCHEMA], check=True,
                       capture_output=True)
        common = ["--no-chdir", "-vconsole:off", "-vsyslog:off"]
        self._spawn(["ovsdb-server", str(db), f"--remote=punix:{self.rundir / 'db.sock'}",
                     f"--unixctl={self.rundir / 'ovsdb-server.ctl'}", *common,
                     f"--log-file={workdir / 'ovsdb-server.log'}"])
        init = [*self.vsctl_argv(), "--timeout=2", "--no-wait", "init"]
        self._wait(lambda: subprocess.run(init, capture_output=True).returncode == 0,
                   "ovsdb-server")
        if self.userspace_tso:  # read by ovs-vswitchd when it starts, so set before it does
            self.vsctl(["--no-wait", "set", "Open_vSwitch", ".",
                        f"other_config:{USERSPACE_TSO_KEY}=true"])
        ctl = str(self.rundir / "ovs-vswitchd.ctl")
        self._spawn(["ovs-vswitchd", f"unix:{self.rundir / 'db.sock'}", f"--unixctl={ctl}",
                     *common, f"--log-file={workdir / 'ovs-vswitchd.log'}"])
        self._wait(lambda: subprocess.run(["ovs-appctl", "-t", ctl, "version"],
                                          capture_output=True).returncode == 0, "ovs-vswitchd")

    def _spawn(self, argv: list[str]) -> None:
        # OVS_RUNDIR puts the bridges' OpenFlow management sockets in our directory.
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL, start_new_session=True,
                                env={**os.environ, "OVS_RUNDIR": str(self.rundir)})
        self.daemons.append(proc)
        self.ledger.add_process(proc.pid)

    def _wait(self, ready, name: str) -> None:
        deadline = time.monotonic() + START_TIMEOUT_S
        while not ready():
            if any(p.poll() is not None for p in self.daemons):
                raise TestbedError(f"{name} exited at start; see its log in the run folder")
            if time.monotonic() > deadline:
                raise TestbedError(f"{name} did not answer within {START_TIMEOUT_S:.0f} s")
            time.sleep(0.05)

    def vsctl_argv(self) -> list[str]:
        return ["ovs-vsctl", f"--db=unix:{self.rundir / 'db.sock'}"]

    def taps(self) -> list[str]:
        """The bridges' taps and the datapath's own, once ``start`` has claimed them."""
        return [*self.bridges, NETDEV_DATAPATH_TAP] if self.bridges else []

    def bridge_target(self, bridge: str) -> str:
        return f"unix:{self.rundir / bridge}.mgmt"

    @property
    def pids(self) -> list[int]:
        vswitchd = self.daemons[1:]
        return [p.pid for p in vswitchd if p.poll() is None]

    def stop(self) -> None:
        """Stop both daemons. The bridges' tap devices outlive ovs-vswitchd: the caller deletes
        them (they are in the run's link group, see testbed.apply.network)."""
        for proc in reversed(self.daemons):
            if proc.poll() is None:
                proc.kill()  # nothing to save: the datapath and database die with the run
            proc.wait()
        self.daemons = []
        shutil.rmtree(self.rundir, ignore_errors=True)
