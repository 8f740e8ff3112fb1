"""The emulated hosts reach nothing of the machine's, and the testbed's own processes listen
only where nothing else can reach them.

With a fabric kept up (``testbed up``): every host's only routes are the fabric's 10.0.0.0/8,
no address outside it is routable from a host, and a TCP connection from a host to any address
of the machine's own (root) namespace fails, on the controller's port, the OVS database's
default port, SSH and every port anything listens on in the root namespace. The processes of
the run (the holder ``testbed up`` leaves, the controller, ovsdb-server, ovs-vswitchd) listen
on 127.0.0.1 (or ::1) only, and on unix sockets that root owns in folders only root may
write to."""
from __future__ import annotations

import ipaddress
import json
import os
import stat
import subprocess
from pathlib import Path

import pytest
from tests.integration.conftest import assert_clean, kept_up, run_testbed

from testbed.apply.state import Ledger
from testbed.interactive.session import SessionState

SCENARIO = "fattree-allreduce"
HOST = "p0e0h0"
FABRIC_NET = ipaddress.ip_network("10.0.0.0/8")
OVSDB_TCP_PORT, SSH_PORT = 6640, 22
CONNECT_TIMEOUT_S = 0.5
LOOPBACK = {"127.0.0.1", "::1"}
TCP_LISTEN = "0A"  # the state column of /proc/net/tcp

# Run inside a host: try a TCP connection to each ADDR:PORT argument, print what happened.
PROBE = """
import json, socket, sys
out = {}
for spec in sys.argv[1:]:
    host, port = spec.rsplit(":", 1)
    s = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
    s.settimeout(%s)
    try:
        s.connect((host.strip("[]"), int(port)))
        out[spec] = "connected"
    except OSError as exc:
        out[spec] = type(exc).__name__
    finally:
        s.close()
print(json.dumps(out))
""" % CONNECT_TIMEOUT_S


@pytest.fixture(scope="module")
def fabric_up(tmp_path_factory):
    with kept_up(SCENARIO, tmp_path_factory.mktemp("isolation")) as (_, state):
        yield state
    assert_clean()


def in_host(*argv: str) -> subprocess.CompletedProcess:
    return run_testbed("exec", HOST, "--", *argv)


def root_addresses() -> list[str]:
    """Every address of the machine's own namespace (where this test runs)."""
    out = subprocess.run(["ip", "-j", "addr", "show"], capture_output=True, text=True,
                         check=True).stdout
    return sorted({a["local"] for link in json.loads(out) for a in link.get("addr_info", [])
                   if not a["local"].startswith("fe80:")})


def decode_address(hex_addr: str) -> str:
    """/proc/net/tcp's ``0100007F`` (little-endian words) -> ``127.0.0.1``; tcp6 too."""
    raw = bytes.fromhex(hex_addr)
    words = b"".join(raw[i:i + 4][::-1] for i in range(0, len(raw), 4))
    return str(ipaddress.ip_address(words))


def inet_sockets(pid: int | str = "self") -> list[dict]:
    """The TCP and UDP sockets of the network namespace ``pid`` is in."""
    sockets = []
    for table in ("tcp", "tcp6", "udp", "udp6"):
        path = Path(f"/proc/{pid}/net/{table}")
        if not path.exists():
            continue
        for line in path.read_text().splitlines()[1:]:
            fields = line.split()
            addr, port = fields[1].split(":")
            sockets.append({"table": table, "address": decode_address(addr),
                            "port": int(port, 16), "state": fields[3], "inode": fields[9]})
    return sockets


def socket_inodes(pid: int) -> set[str]:
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            target = os.readlink(fd)
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[len("socket:["):-1])
    return inodes


def unix_listeners(inodes: set[str]) -> list[str]:
    """Paths of the listening unix sockets among ``inodes`` ("@name" for abstract ones)."""
    paths = []
    for line in Path("/proc/net/unix").read_text().splitlines()[1:]:
        fields = line.split()
        listening = int(fields[3], 16) & 0x10000  # __SO_ACCEPTCON
        if listening and fields[6] in inodes and len(fields) > 7:
            paths.append(fields[7])
    return paths


def run_processes(state: SessionState) -> dict[int, str]:
    """PID -> command of the run's processes in the machine's namespace: the holder and
    what the ledger records (controller, ovsdb-server, ovs-vswitchd, agents)."""
    ledger = Ledger.load()
    assert ledger is not None, "no ledger while the fabric is up"
    own_netns = os.stat("/proc/self/ns/net").st_ino
    pids = {state.holder_pid, *ledger.processes}
    found = {}
    for pid in pids:
        try:
            if os.stat(f"/proc/{pid}/ns/net").st_ino != own_netns:
                continue  # a host's shell or what runs in it
            found[pid] = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
    return found


def test_a_host_routes_only_the_fabric(fabric_up):
    routes = in_host("ip", "-j", "-4", "route", "show", "table", "all")
    assert routes.returncode == 0, routes.stderr
    for route in json.loads(routes.stdout):
        dst = route["dst"]
        if route.get("table") == "local" or dst.startswith("127.") or dst == "broadcast":
            continue
        assert dst != "default" and ipaddress.ip_network(dst).subnet_of(FABRIC_NET), route
    six = in_host("ip", "-j", "-6", "route", "show")
    assert six.returncode == 0 and json.loads(six.stdout or "[]") == [], six.stdout
    for address in ["8.8.8.8", *(a for a in root_addresses() if ":" not in a
                                 and ipaddress.ip_address(a) not in FABRIC_NET
                                 and not a.startswith("127."))]:
        lookup = in_host("ip", "route", "get", address)
        assert lookup.returncode != 0 and "unreachable" in lookup.stderr, (address, lookup)


def test_a_host_cannot_connect_to_the_machine(fabric_up):
    listening = {s["port"] for s in inet_sockets() if s["table"].startswith("tcp")
                 and s["state"] == TCP_LISTEN}
    ports = sorted({fabric_up.controller_port, OVSDB_TCP_PORT, SSH_PORT, *listening})
    targets = [f"[{a}]:{p}" if ":" in a else f"{a}:{p}" for a in root_addresses() for p in ports]
    probe = in_host("python3", "-c", PROBE, *targets)
    assert probe.returncode == 0, probe.stderr
    answers = json.loads(probe.stdout)
    assert len(answers) == len(targets)
    assert [t for t, what in answers.items() if what == "connected"] == []


def test_the_run_listens_on_loopback_and_root_owned_unix_sockets_only(fabric_up):
    processes = run_processes(fabric_up)
    commands = " ".join(processes.values())
    assert "ovs-vswitchd" in commands and "ovsdb-server" in commands
    assert "testbed.controllers.apps.launcher" in commands and fabric_up.holder_pid in processes
    sockets = {s["inode"]: s for s in inet_sockets()}
    for pid, command in processes.items():
        inodes = socket_inodes(pid)
        for inode in inodes & sockets.keys():
            s = sockets[inode]
            bound = s["state"] == TCP_LISTEN or (s["table"].startswith("udp") and s["port"])
            if bound:
                assert s["address"] in LOOPBACK, (pid, command[:80], s)
        for path in unix_listeners(inodes):
            assert not path.startswith("@"), (pid, command[:80], path)  # abstract: anyone
            info, folder = os.stat(path), os.stat(Path(path).parent)
            assert info.st_uid == 0 and folder.st_uid == 0, (path, info.st_uid)
            assert not folder.st_mode & (stat.S_IWGRP | stat.S_IWOTH), (path, oct(folder.st_mode))
    controller = [s for s in sockets.values() if s["port"] == fabric_up.controller_port
                  and s["state"] == TCP_LISTEN]
    assert controller and all(s["address"] == "127.0.0.1" for s in controller), controller
