"""The incast workload on a running fabric: which hosts answer, the command lines of the
request/response program (testbed.traffic.incast) on each end, and one measurement's run of
it (a server on every sender, the client on the receiver)."""
from __future__ import annotations

import json
import select
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

from testbed.errors import ConfigError, TestbedError
from testbed.model.topology.base import Fabric
from testbed.traffic.incast import DEFAULT_CONNECT_TIMEOUT_S, WARMED_LINE

CLIENT_GRACE_S = 30.0  # beyond the rounds' own time limits, before the client counts as hung
SERVER_EXIT_S = 5.0  # servers exit once the client closes its connections


@dataclass(frozen=True)
class Queries:
    """What every query asks: ``response_bytes`` from each sender in every traffic-class
    ``dscp`` packet, ``warmup`` rounds then ``rounds`` recorded ones ``gap_s`` apart, each
    round given up after ``round_timeout_s``."""

    response_bytes: int
    rounds: int
    warmup: int
    gap_s: float
    dscp: int
    round_timeout_s: float

    def client_limit_s(self) -> float:
        """How long a client may take before it counts as hung."""
        return (DEFAULT_CONNECT_TIMEOUT_S + (self.warmup + self.rounds)
                * (self.round_timeout_s + self.gap_s) + CLIENT_GRACE_S)


@dataclass
class IncastMeasurement:
    """One mode at one fan-in: the client's timings (seconds; ``flow_s`` per round, per
    sender in ``senders`` order; the warm-up rounds' apart) and the counters' increase over
    the measurement, which also covers connection set-up and the warm-up rounds.
    ``queue_drops`` counts every emulated queue (switch ports and host NICs), ``switches``
    the switch ports' packets and drops; ``queues`` the marker's totals and the bottleneck
    port's own counters; ``tcp`` per host {"timeouts", "retransmits"}; ``pfc`` the pause
    counters' increase (testbed.apply.network.FabricNetwork.pfc_summary)."""

    mode: str
    fanin: int
    receiver: str
    senders: list[str]
    response_bytes: int
    round_s: list[float] = field(default_factory=list)
    flow_s: list[list[float]] = field(default_factory=list)
    send_spread_s: list[float] = field(default_factory=list)
    warmup_round_s: list[float] = field(default_factory=list)
    tcp: dict[str, dict[str, int]] = field(default_factory=dict)
    queue_drops: int = 0
    switches: dict[str, int] = field(default_factory=dict)
    queues: dict | None = None
    pfc: dict | None = None
    error: str | None = None


def sender_hosts(fabric: Fabric, receiver: str, fanin: int) -> list[str]:
    """The first ``fanin`` senders, taken from the pods in turn, starting with the pod after
    the receiver's and ending with its own: a fan-in of 3 comes from the 3 other pods, and
    every fan-in spreads over as many pods (and core paths) as it can."""
    k = fabric.params["k"]
    home = fabric.nodes[receiver].coords[0]
    by_pod: dict[int, list[str]] = {pod: [] for pod in range(k)}
    for host in fabric.hosts:
        if host.name != receiver:
            by_pod[host.coords[0]].append(host.name)
    pods = [(home + step) % k for step in range(1, k + 1)]
    deepest = max(len(hosts) for hosts in by_pod.values())
    order = [by_pod[pod][depth] for depth in range(deepest) for pod in pods
             if depth < len(by_pod[pod])]
    if fanin > len(order):
        raise ConfigError("fanins", f"{fanin} senders asked, the fabric has {len(order)} "
                                    f"besides {receiver}")
    return order[:fanin]


def bottleneck_port(fabric: Fabric, receiver: str) -> str:
    """The switch port that sends to the receiver: where incast queues build."""
    link, end = fabric.host_link(receiver)
    return link.intf(1 - end)


def client_argv(servers: list[str], port: int, queries: Queries) -> list[str]:
    return [sys.executable, "-m", "testbed.traffic.incast", "query", "--servers",
            ",".join(servers), "--port", str(port), "--response-bytes",
            str(queries.response_bytes), "--rounds", str(queries.rounds), "--warmup",
            str(queries.warmup), "--gap-s", repr(queries.gap_s), "--dscp", str(queries.dscp),
            "--round-timeout-s", repr(queries.round_timeout_s), "--hold-after-warmup"]


def server_argv(port: int, dscp: int) -> list[str]:
    return [sys.executable, "-m", "testbed.traffic.incast", "serve", "--port", str(port),
            "--dscp", str(dscp), "--connections", "1"]


def read_line(stream, timeout_s: float) -> bytes:
    """One line from a child's pipe, or TimeoutExpired after ``timeout_s`` (b"" at its end)."""
    ready, _, _ = select.select([stream], [], [], timeout_s)
    if not ready:
        raise subprocess.TimeoutExpired("incast client", timeout_s)
    return stream.readline()


def run_programs(net, receiver: str, senders: list[str], port: int, queries: Queries,
                 outdir: Path, warmed=lambda: None) -> dict:
    """A server on every sender, the client on the receiver; the client's result (its raw
    output is kept in ``outdir``/client.json, every program's errors beside it).
    ``warmed`` is called between the warm-up queries and the recorded ones, while the
    client waits (the caller reads its counters there)."""
    ips = [net.fabric.nodes[s].ip for s in senders]
    procs = []
    try:
        for sender in senders:
            with open(outdir / f"{sender}.err", "wb") as err:
                procs.append(net.popen(sender, server_argv(port, queries.dscp),
                                       stdout=subprocess.DEVNULL, stderr=err))
        with open(outdir / "client.err", "wb") as err:
            client = net.popen(receiver, client_argv(ips, port, queries),
                               stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=err)
        procs.append(client)
        try:
            first = read_line(client.stdout, queries.client_limit_s())
            if first.strip() == WARMED_LINE.encode():
                warmed()
                client.stdin.write(b"go\n")
                client.stdin.flush()
                first = b""
            out, _ = client.communicate(timeout=queries.client_limit_s())
            out = first + out
        except subprocess.TimeoutExpired:
            raise TestbedError(f"the incast client on {receiver} did not finish in "
                               f"{queries.client_limit_s():.0f} s") from None
        (outdir / "client.json").write_bytes(out)
        if client.returncode not in (0, 1) or not out.strip():
            tail = (outdir / "client.err").read_text(errors="replace")[-400:].strip()
            raise TestbedError(f"the incast client on {receiver} failed "
                               f"(exit {client.returncode}): {tail}")
        for proc in procs[:-1]:
            try:
                proc.wait(timeout=SERVER_EXIT_S)
            except subprocess.TimeoutExpired:
                pass  # killed below
        return json.loads(out)
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
            proc.wait()
