"""Open vSwitch as a service: is it up, start and stop it, list and delete bridges.

The testbed starts OVS only when it is not already running, and then stops it again at the
end of the run (the ledger remembers), so a machine is left as it was found.
"""
from __future__ import annotations

import subprocess
import time

from testbed.errors import TestbedError

OVS_CTL = "/usr/share/openvswitch/scripts/ovs-ctl"
VSWITCHD_PIDFILE = "/var/run/openvswitch/ovs-vswitchd.pid"
START_TIMEOUT_S = 30.0


def _vsctl(*args: str, timeout_s: int = 10) -> subprocess.CompletedProcess:
    return subprocess.run(["ovs-vsctl", f"--timeout={timeout_s}", *args],
                          capture_output=True, text=True)


def is_running() -> bool:
    try:
        return _vsctl("show", timeout_s=2).returncode == 0
    except FileNotFoundError:
        return False


def start() -> None:
    """Start ovsdb-server and ovs-vswitchd (without the kernel module if it is absent)."""
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
    out = _vsctl("list-br")
    return out.stdout.split() if out.returncode == 0 else []


def delete_bridges(names: list[str]) -> None:
    """Delete bridges in one ovs-vsctl transaction."""
    if not names:
        return
    args: list[str] = []
    for name in names:
        args += ["--", "--if-exists", "del-br", name]
    _vsctl(*args[1:], timeout_s=30)


def dump_groups(bridge: str) -> str:
    out = subprocess.run(["ovs-ofctl", "-O", "OpenFlow13", "dump-groups", bridge],
                         capture_output=True, text=True)
    return out.stdout


def dump_flows(bridge: str) -> str:
    out = subprocess.run(["ovs-ofctl", "-O", "OpenFlow13", "dump-flows", bridge],
                         capture_output=True, text=True)
    return out.stdout
