"""Traffic helpers experiments share, run on a running fabric
(testbed.apply.network.FabricNetwork): long TCP flows between host pairs (iperf3), a traffic
pattern's flows summarised (testbed.measure.patterns), and every host's TCP loss counters
read in its own namespace."""
from __future__ import annotations

import json
import subprocess
import time

from pydantic import Field

from testbed.errors import TestbedError
from testbed.harness.experiment import Params
from testbed.measure.patterns import PatternResult, fraction_of_capacity
from testbed.system.sockets import wait_listening, wait_ports

BASE_PORT = 5400
SERVER_START_S = 0.5       # the iperf3 servers' head start before the clients connect
LISTEN_TIMEOUT_S = 10.0    # beyond it, a server that does not listen is a failed start
CLIENT_GRACE_S = 30.0      # beyond the flow time, before a client counts as hung
COUNTER_READ_TIMEOUT_S = 10.0
PROC_TCP_FILES = ("/proc/net/netstat", "/proc/net/snmp")


def wait_servers(net, listeners: list[tuple[str, int]], servers: list) -> None:
    """Wait until every (host, port) in ``listeners`` listens: a client that connects before
    its server listens is refused, and the server then waits for a client that never comes.
    On a failed start the ``servers`` are ended before the error is raised."""
    ports: dict[str, list[int]] = {}
    for host, port in listeners:
        ports.setdefault(host, []).append(port)
    try:
        for host, wanted in ports.items():
            wait_ports(lambda h=host: net.listening_ports(h), wanted, LISTEN_TIMEOUT_S,
                       f"iperf3 server in {host}")
    except TestbedError:
        for proc in servers:
            if proc.poll() is None:
                proc.kill()
            proc.wait()
        raise


def start_iperf_server(host, port: int) -> None:
    """One iperf3 server (one test, then it exits), daemonised in ``host`` (a Mininet host),
    listening on ``port`` when this returns."""
    host.cmd("iperf3", "-s", "-D", "-1", "-p", str(port))
    wait_listening(host.pid, [port], LISTEN_TIMEOUT_S, f"iperf3 server in {host.name}")


def run_flows(net, pairs: list[tuple[str, str]], seconds: int, omit_s: int,
              streams: int = 1, tos: int = 0) -> tuple[list[float], list[str]]:
    """One iperf3 flow (of ``streams`` parallel TCP connections) per (source, destination)
    host pair, all at once, its packets carrying IP TOS ``tos`` (DSCP << 2: the traffic
    class); returns the Mbit/s each destination received, and the errors of flows that
    failed."""
    servers = [net.popen(dst, ["iperf3", "-s", "-1", "-p", str(BASE_PORT + i)],
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
               for i, (_, dst) in enumerate(pairs)]
    time.sleep(SERVER_START_S)
    wait_servers(net, [(dst, BASE_PORT + i) for i, (_, dst) in enumerate(pairs)], servers)
    clients = [net.popen(src, ["iperf3", "-c", net.fabric.nodes[dst].ip, "-p", str(BASE_PORT + i),
                               "-t", str(seconds), "-O", str(omit_s), "-P", str(streams),
                               "-S", str(tos), "-J"],
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
               for i, (src, dst) in enumerate(pairs)]
    rates, errors = [], []
    try:
        for (src, dst), client in zip(pairs, clients):
            out, _ = client.communicate(timeout=seconds + omit_s + CLIENT_GRACE_S)
            try:
                report = json.loads(out)
            except ValueError:
                raise TestbedError(f"iperf3 {src} -> {dst} failed: {out.strip()[-200:]}") from None
            received = report.get("end", {}).get("sum_received")
            # A flow that died mid-run (a TCP connection timing out under heavy loss) counts
            # as nothing received, and is reported.
            rates.append(received["bits_per_second"] / 1e6 if received else 0.0)
            if "error" in report:
                errors.append(f"{src} -> {dst}: {report['error']}")
    finally:
        for proc in clients + servers:
            if proc.poll() is None:
                proc.kill()
            proc.wait()
    return rates, errors


class LongFlowParams(Params):
    """How long each traffic pattern's flows run: ``seconds`` measured after ``omit_s``
    seconds of TCP start-up that are left out."""

    seconds: int = Field(10, ge=2, le=3600, description="measured seconds per pattern")
    omit_s: int = Field(2, ge=0, le=60, description="TCP start-up seconds left out")


def flow_window(start_monotonic_s: float, seconds: int, omit_s: int) -> tuple[float, float]:
    """When ``run_flows`` started at ``start_monotonic_s`` measures its rates: after its
    servers' head start and the omitted start-up, for ``seconds``."""
    begin = start_monotonic_s + SERVER_START_S + omit_s
    return begin, begin + seconds


def run_pattern(net, pattern: str, pairs: list[tuple[str, str]], seconds: int, omit_s: int,
                host_rate_mbit: float, streams: int = 1) -> PatternResult:
    """One long flow per (source, destination) pair, all at once: what each destination
    received, and the aggregate as a fraction of the senders' host links."""
    start = time.monotonic()
    rates, errors = run_flows(net, pairs, seconds, omit_s, streams=streams)
    return PatternResult(pattern, list(pairs), rates, fraction_of_capacity(rates, host_rate_mbit),
                         errors, flow_window(start, seconds, omit_s))


def run_patterns(run, patterns: dict[str, list[tuple[str, str]]], seconds: int, omit_s: int,
                 host_rate_mbit: float) -> dict[str, PatternResult]:
    """Every pattern ({name: pairs}) in turn on one running setup
    (testbed.harness.experiment.SetupRun), logged as it goes."""
    results = {}
    with run.progress.phase(f"{run.setup.name}: traffic patterns", total=len(patterns)) as phase:
        for name, pairs in patterns.items():
            r = run_pattern(run.net, name, pairs, seconds, omit_s, host_rate_mbit)
            results[name] = r
            run.log(f"{run.setup.name}: {name}: {r.fraction_of_capacity:.1%} of the host links"
                    + (f"; {len(r.errors)} flows failed: {r.errors[0]}" if r.errors else ""))
            phase.advance(note=name)
    return results


def parse_proc_net(text: str) -> dict[str, dict[str, int]]:
    """/proc/net/netstat and /proc/net/snmp (either, or both concatenated) as tables: each
    prefix (``TcpExt``, ``Tcp``, ...) comes as a line of names, then a line of values."""
    tables: dict[str, dict[str, int]] = {}
    names: dict[str, list[str]] = {}
    for line in text.splitlines():
        prefix, sep, rest = line.partition(":")
        if not sep:
            continue
        fields = rest.split()
        if prefix in names:
            tables[prefix] = dict(zip(names.pop(prefix), (int(v) for v in fields)))
        else:
            names[prefix] = fields
    return tables


def tcp_loss_counters(text: str) -> dict[str, int]:
    """Retransmission timeouts (TcpExt TCPTimeouts), tail-loss probes that repaired a loss
    (TcpExt TCPLossProbeRecovery: Linux's timer that fires before the RTO and resends a
    flow's last segment) and retransmitted segments (Tcp RetransSegs) from the two files'
    text."""
    tables = parse_proc_net(text)
    try:
        return {"timeouts": tables["TcpExt"]["TCPTimeouts"],
                "probe_recoveries": tables["TcpExt"]["TCPLossProbeRecovery"],
                "retransmits": tables["Tcp"]["RetransSegs"]}
    except KeyError as missing:
        raise TestbedError(f"no {missing} counter in {' and '.join(PROC_TCP_FILES)}") from None


def counter_deltas(before: dict[str, dict[str, int]],
                   after: dict[str, dict[str, int]]) -> dict[str, dict[str, int]]:
    """Per host, every counter's increase between two readings."""
    return {host: {name: value - before[host][name] for name, value in values.items()}
            for host, values in after.items()}


def read_tcp_counters(net, hosts: list[str]) -> dict[str, dict[str, int]]:
    """Every host's TCP loss counters, read in its own namespace, all hosts at once."""
    procs = {host: net.popen(host, ["cat", *PROC_TCP_FILES], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True) for host in hosts}
    counters = {}
    for host, proc in procs.items():
        try:
            out, err = proc.communicate(timeout=COUNTER_READ_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            raise TestbedError(f"{host}: reading its TCP counters took over "
                               f"{COUNTER_READ_TIMEOUT_S:g} s") from None
        if proc.returncode != 0:
            raise TestbedError(f"{host}: cannot read its TCP counters: {err.strip()[-200:]}")
        counters[host] = tcp_loss_counters(out)
    return counters
