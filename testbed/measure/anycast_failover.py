"""How fast anycast clients follow the nearest live replica: a request/response service
(testbed.traffic.anycast_service) on two replicas behind one address, a client probing it, the near
replica's link cut and restored.

               p0a0 ------ core ------ p3a0     k=4 fat-tree; 10.255.0.1 on both
              /    \\                    |       replicas; one request every 10 ms
          p0e0      p0e1               p3e1
 p0e0-eth1  X         |                 |
          p0e0h0    p0e1h0            p3e1h1
          (near)    (client)           (far)

The answers name the replica that served each request; pure functions turn them into the
switch-over time to the far replica, the time back to the near one, and the requests lost.
Used by ``testbed bench`` (the measured figures) and by the integration tests (the behaviour).
Times are CLOCK_MONOTONIC, shared by this process and the probe.
"""
from __future__ import annotations

import json
import subprocess
import sys
import time
from dataclasses import asdict, dataclass

from testbed.controllers.routing.anycast import anycast_routes, replica_for_hosts
from testbed.controllers.routing.fabric_state import AnycastService
from testbed.errors import ConfigError, TestbedError
from testbed.system.running import RunningFabric

SERVER_START_S = 0.5        # servers bound before the first request
CLIENT_GRACE_S = 30.0       # beyond the probe's own duration before it counts as hung
IN_FLIGHT_S = 0.3           # answers to requests sent before the move back may still arrive


@dataclass(frozen=True)
class AnycastCut:
    """The set-up: which client probes which service, which replica is near and which far,
    the switch end of the near replica's link, and when (seconds after the probe starts) the
    link goes down and comes back."""

    service: AnycastService
    client: str
    near: str
    far: str
    interface: str
    port: int = 7000
    interval_s: float = 0.01
    down_at_s: float = 1.5
    up_at_s: float = 3.5
    duration_s: float = 6.0


# k=4 fat-tree: p0e1h0 shares pod 0 with p0e0h0, so it is nearer to it than to p3e1h1.
FAT_TREE_K4 = AnycastCut(AnycastService("10.255.0.1", ("p0e0h0", "p3e1h1")),
                         client="p0e1h0", near="p0e0h0", far="p3e1h1", interface="p0e0-eth1")


def anycast_cut(fabric, service: AnycastService, client: str, routing: str) -> AnycastCut:
    """The cut that moves ``client`` off its nearest replica: that replica's own link (at its
    switch), and the replica the client should reach instead (the nearest of the others)."""
    hosts = {h.name for h in fabric.hosts}
    if client not in hosts or client in service.replicas:
        raise ConfigError("anycast_failover", f"must be a host that is not a replica, got "
                                              f"{client!r}")
    if len(service.replicas) < 2:
        raise ConfigError("anycast_failover", "needs at least two replicas, one to cut and "
                                              "one to move to")

    def nearest(replicas) -> str:
        routes = anycast_routes(fabric, service.service_ip, list(replicas), mode=routing)
        return replica_for_hosts(fabric, routes, list(replicas))[client]
    near = nearest(service.replicas)
    far = nearest([r for r in service.replicas if r != near])
    link, end = fabric.host_link(near)
    return AnycastCut(service, client=client, near=near, far=far, interface=link.intf(1 - end))


@dataclass
class AnycastFailover:
    """One cut and repair, as the client saw it: how long after the cut it was first answered
    by the far replica, how long after the repair by the near one again, which requests went
    unanswered, and which replicas answered before the cut, while the link was down, and once
    the move back had settled."""

    service_ip: str
    client: str
    near: str
    far: str
    interface: str
    to_far_s: float
    back_to_near_s: float
    lost_seqs: list[int]
    requests: int
    probe_interval_s: float
    replicas_before: list[str]
    replicas_while_down: list[str]
    replicas_after: list[str]

    @property
    def requests_lost(self) -> int:
        return len(self.lost_seqs)

    @property
    def outage_s(self) -> float:
        return self.requests_lost * self.probe_interval_s

    def to_dict(self) -> dict:
        return {**asdict(self), "requests_lost": self.requests_lost, "outage_s": self.outage_s}


def parse_answers(probe_output: str) -> list[dict]:
    """The probe's JSON lines: [{"t_monotonic_s", "seq", "replica"}, ...]."""
    return [json.loads(line) for line in probe_output.splitlines() if line.strip()]


def replicas_between(answers: list[dict], start_s: float, end_s: float) -> list[str]:
    """The replicas (sorted, each once) that answered in [start_s, end_s)."""
    return sorted({a["replica"] for a in answers if start_s <= a["t_monotonic_s"] < end_s})


def first_answer_from(answers: list[dict], replica: str, after_s: float) -> float | None:
    """When ``replica`` first answered at or after ``after_s``; None if it never did."""
    return min((a["t_monotonic_s"] for a in answers
                if a["replica"] == replica and a["t_monotonic_s"] >= after_s), default=None)


def lost_seqs(answers: list[dict]) -> list[int]:
    """Sequence numbers below the highest answered one that were never answered. Requests
    lost after the last answer cannot be told from requests never sent, and are not counted."""
    answered = {a["seq"] for a in answers}
    return [seq for seq in range(max(answered, default=-1) + 1) if seq not in answered]


def switch_over(answers: list[dict], cut: AnycastCut, t_down_s: float, t_up_s: float,
                in_flight_s: float = IN_FLIGHT_S) -> AnycastFailover:
    """The client's answers around a cut at ``t_down_s`` and a repair at ``t_up_s``.

    TestbedError unless the near replica alone served the client before the cut, the far one
    served it after the cut, and the near one served it again after the repair."""
    where = f"anycast {cut.service.service_ip}, {cut.interface} cut"
    before = replicas_between(answers, float("-inf"), t_down_s)
    if before != [cut.near]:
        raise TestbedError(f"{where}: before the cut {cut.client} was answered by "
                           f"{', '.join(before) or 'no replica'}, not by {cut.near} alone")
    first_far = first_answer_from(answers, cut.far, t_down_s)
    if first_far is None:
        raise TestbedError(f"{where}: {cut.client} never moved to {cut.far} after "
                           f"{cut.near}'s link went down")
    back = first_answer_from(answers, cut.near, t_up_s)
    if back is None:
        raise TestbedError(f"{where}: {cut.client} never moved back to {cut.near} after "
                           f"the link returned")
    return AnycastFailover(
        service_ip=cut.service.service_ip, client=cut.client, near=cut.near, far=cut.far,
        interface=cut.interface, to_far_s=first_far - t_down_s, back_to_near_s=back - t_up_s,
        lost_seqs=lost_seqs(answers), requests=max(a["seq"] for a in answers) + 1,
        probe_interval_s=cut.interval_s, replicas_before=before,
        replicas_while_down=replicas_between(answers, t_down_s, t_up_s),
        replicas_after=replicas_between(answers, back + in_flight_s, float("inf")))


def server_argv(cut: AnycastCut, name: str) -> list[str]:
    return [sys.executable, "-m", "testbed.traffic.anycast_service", "serve", "--bind",
            cut.service.service_ip, "--port", str(cut.port), "--name", name]


def probe_argv(cut: AnycastCut) -> list[str]:
    return [sys.executable, "-m", "testbed.traffic.anycast_service", "probe",
            "--service", cut.service.service_ip, "--port", str(cut.port),
            "--interval-s", str(cut.interval_s), "--duration-s", str(cut.duration_s)]


def anycast_cut_and_repair(net: RunningFabric, cut: AnycastCut) -> AnycastFailover:
    """Serve ``cut.service`` on its replicas, probe it from ``cut.client``, take
    ``cut.interface`` down and up again on schedule. The network must already carry the
    service (the controller's anycast file and testbed.experiments.allreduce.run.start_anycast)."""
    procs = []
    try:
        for name in cut.service.replicas:
            procs.append(net.popen(name, server_argv(cut, name), stdout=subprocess.DEVNULL,
                                   stderr=subprocess.DEVNULL))
        time.sleep(SERVER_START_S)
        client = net.popen(cut.client, probe_argv(cut), stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, text=True)
        procs.append(client)
        t0 = time.monotonic()
        time.sleep(cut.down_at_s)
        t_down = net.set_interface(cut.interface, False)
        time.sleep(max(0.0, cut.up_at_s - (time.monotonic() - t0)))
        t_up = net.set_interface(cut.interface, True)
        try:
            out, err = client.communicate(timeout=cut.duration_s + CLIENT_GRACE_S)
        except subprocess.TimeoutExpired:
            raise TestbedError(f"the anycast probe on {cut.client} did not finish in "
                               f"{cut.duration_s + CLIENT_GRACE_S:.0f} s") from None
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
            proc.wait()
    if client.returncode != 0:
        last_line = "".join(err.strip().splitlines()[-1:])[-200:]
        raise TestbedError(f"the anycast probe on {cut.client} failed "
                           f"(exit {client.returncode}): {last_line}")
    answers = parse_answers(out)
    if not answers:
        raise TestbedError(f"the anycast probe on {cut.client} got no answers from "
                           f"{cut.service.service_ip}; see {net.workdir}/controller.log")
    try:
        return switch_over(answers, cut, t_down, t_up)
    except TestbedError as e:
        raise TestbedError(f"{e}; see {net.workdir}/controller.log") from None
