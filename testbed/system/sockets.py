"""Which TCP ports a namespace listens on, from the kernel's socket tables
(``/proc/PID/net/tcp`` and ``tcp6`` show the namespace of process PID): a server started in
a host is ready for its client once its port shows here, so a client never races its
server's start-up. The parser is pure; the reader and the wait at the end read /proc."""
from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from pathlib import Path

from testbed.errors import TestbedError

TCP_LISTEN = "0A"  # the kernel's TCP_LISTEN state, as /proc/net/tcp prints it
POLL_S = 0.02


def listening_ports(proc_net_tcp: str) -> set[int]:
    """The local ports of the listening sockets in one /proc/net/tcp or tcp6 table."""
    ports = set()
    for line in proc_net_tcp.splitlines()[1:]:  # the first line names the columns
        fields = line.split()
        if len(fields) > 3 and fields[3] == TCP_LISTEN:
            ports.add(int(fields[1].rsplit(":", 1)[1], 16))
    return ports


def read_listening_ports(pid: int) -> set[int]:
    """The TCP ports listening in the network namespace of process ``pid``, IPv4 and IPv6."""
    ports = set()
    for table in ("tcp", "tcp6"):
        try:
            ports |= listening_ports(Path(f"/proc/{pid}/net/{table}").read_text())
        except FileNotFoundError:  # no IPv6 in this kernel, or the process is gone
            continue
    return ports


def wait_listening(pid: int, ports: Iterable[int], timeout_s: float, what: str) -> float:
    """Wait until every port in ``ports`` listens in the namespace of process ``pid``;
    returns the seconds waited. ``what`` names the namespace in the error on timeout."""
    return wait_ports(lambda: read_listening_ports(pid), ports, timeout_s, what)


def wait_ports(listening: Callable[[], set[int]], ports: Iterable[int], timeout_s: float,
               what: str) -> float:
    """Wait until every port in ``ports`` is among ``listening()`` (the ports listening in
    one namespace, read again every POLL_S); returns the seconds waited. ``what`` names the
    namespace in the error on timeout."""
    wanted, start = set(ports), time.monotonic()
    while True:
        missing = wanted - listening()
        if not missing:
            return time.monotonic() - start
        if time.monotonic() - start > timeout_s:
            raise TestbedError(f"{what}: nothing listening on TCP port(s) "
                               f"{', '.join(map(str, sorted(missing)))} after {timeout_s:.0f} s")
        time.sleep(POLL_S)
