"""One experiment, end to end: lock the machine, recover leftovers, bring the fabric up, prove
reachability, run the workload with samplers running, judge fidelity, write results, tear down.

Results go to ``results/<run-id>/``: config.json, fabric.json, summary.json, per-rank output,
controller log and files (failure events, port counters polled over OpenFlow), samples.json
and plots. The caller gets the summary dict.
"""
from __future__ import annotations

import hashlib
import json
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from testbed.apply.controller import (
    EVENTS_FILE,
    PORT_STATS_FILE,
    WIRING_FILE,
    write_anycast,
)
from testbed.apply.marking import ecn_monitoring, object_is_current
from testbed.apply.network import FabricNetwork, default_buffer_bytes
from testbed.capabilities import detect
from testbed.controllers.routing.anycast import anycast_routes, replica_for_hosts
from testbed.controllers.routing.fabric_state import (
    AnycastService,
    FabricState,
    anycast_problem,
    routing_problem,
)
from testbed.controllers.routing.forwarding import group_ports
from testbed.controllers.routing.wiring import wiring_summary
from testbed.errors import ConfigError, TestbedError
from testbed.experiments.allreduce.report import write_results
from testbed.harness.run import interrupts_as_exceptions, machine, new_run_id
from testbed.measure.fidelity import emulator_losses, judge
from testbed.measure.openflow import link_rate_summary
from testbed.measure.stats import jain_index
from testbed.measure.telemetry import (
    Sampler,
    link_directions,
    window_mean,
    window_rates_mbit,
)
from testbed.model.port_stats import port_samples, read_json_lines
from testbed.model.topology import build
from testbed.model.topology.limits import check_fits
from testbed.plan.ecn_plan import choose_ecn_path
from testbed.plan.settings import EcnSettings, check_tcp, ecn_settings, tcp_settings
from testbed.traffic.ring import algbw_gbyte, allreduce_busbw_factor, expected_sum

# Chosen from measurement on a 2-core machine with the OVS userspace datapath (README,
# "Capacity"): at 6 Mbit/s the k=4 fat-tree's 16-rank ring delivers >90% of the link rate with
# no emulator losses; at 10 Mbit/s and above the 20-bridge datapath falls behind.
DEFAULT_LINK_RATE_MBIT = 6.0
DEFAULT_SIZE_BYTES = 2 * 1024 * 1024
RANK_PORT = 29500
RANK_TIMEOUT_S = 600.0


@dataclass
class RunConfig:
    """What to run. Units are in the names; validated by ``validate``. ``routing``: ecmp or
    single on any fabric; minimal, valiant or ugal on a dragonfly. ``anycast``: optionally
    {"service_ip": "10.255.0.1", "replicas": [host names]}, a service address every switch
    sends to its nearest live replica (ecmp or single routing)."""

    name: str = "fattree-allreduce"
    topology: str = "fattree"
    topology_params: dict = field(default_factory=lambda: {"k": 4})
    link_rate_mbit: float = DEFAULT_LINK_RATE_MBIT
    mtu_bytes: int = 9000
    routing: str = "ecmp"
    workload: str = "allreduce"
    size_bytes: int = DEFAULT_SIZE_BYTES
    channels: int = 4
    warmup: int = 1
    iters: int = 3
    seed: int = 1
    results_dir: str = "results"
    anycast: dict | None = None  # {"service_ip": ..., "replicas": [...]}: testbed.controllers.routing.anycast
    anycast_failover: str | None = None  # a client: its nearest replica's link is cut and
    #                                      restored before the workload (testbed.experiments.anycast.run)
    ecn: dict | None = None  # switch-port ECN marking: testbed.plan.settings
    tcp_ecn: bool = False  # hosts ask for ECN
    tcp_cc: str | None = None  # hosts' congestion control, or "auto"

    def validate(self) -> None:
        checks = [
            ("link_rate_mbit", 0 < self.link_rate_mbit <= 10000, "must be in (0, 10000]"),  # NaN fails too
            ("mtu_bytes", 576 <= self.mtu_bytes <= 9000, "must be in [576, 9000]"),
            ("workload", self.workload == "allreduce", "only 'allreduce' is available"),
            ("size_bytes", self.size_bytes >= 1024 and self.size_bytes % 4 == 0,
             "must be a multiple of 4 and at least 1024 (float32 elements)"),
            ("channels", 1 <= self.channels <= 16, "must be in [1, 16]"),
            ("warmup", 0 <= self.warmup <= 100, "must be in [0, 100]"),
            ("iters", 1 <= self.iters <= 1000, "must be in [1, 1000]"),
        ]
        for name, ok, problem in checks:
            if not ok:
                raise ConfigError(name, f"{problem}, got {getattr(self, name)!r}")
        problem = routing_problem(self.topology, self.routing)
        if problem:
            raise ConfigError("routing", problem)
        for name, instead in (("host_rate_mbit", "link_rate_mbit"), ("mtu_bytes", "mtu_bytes")):
            if name in self.topology_params:
                raise ConfigError(f"topology.{name}", f"set it as the run's {instead}, not "
                                  "under topology")
        fabric = self.fabric()
        check_fits(fabric)  # the builder checks parameters; this, the machine's size
        if self.anycast is not None:
            problem = anycast_problem(fabric, self.anycast, self.routing)
            if problem:
                raise ConfigError("anycast", problem)
        if self.anycast_failover is not None:
            if self.anycast is None:
                raise ConfigError("anycast_failover", "needs an anycast service to fail over")
            from testbed.experiments.anycast.run import anycast_cut
            anycast_cut(fabric, AnycastService.from_dict(self.anycast), self.anycast_failover,
                        self.routing)
        check_tcp(self.tcp_ecn, self.tcp_cc)
        self.ecn_settings()

    def ecn_settings(self) -> EcnSettings | None:
        """The ``ecn`` section as the queue every shaped switch port gets; None without one."""
        return ecn_settings(self.ecn, self.link_rate_mbit, self.mtu_bytes,
                            default_buffer_bytes(self.link_rate_mbit, self.mtu_bytes))

    def fabric(self):
        return build(self.topology, **self.topology_params, host_rate_mbit=self.link_rate_mbit,
                     mtu_bytes=self.mtu_bytes)


def run_experiment(config: RunConfig, log=print) -> dict:
    config.validate()
    fabric = config.fabric()
    run_id = new_run_id(config.name)
    platform = detect()
    datapath = "kernel" if platform.paths.ovs_datapath == "kernel" else "user"
    ecn = config.ecn_settings()
    ecn_path = (choose_ecn_path(platform, ecn.prefer_path, object_built=object_is_current())
                if ecn is not None else None)
    tcp = tcp_settings(config.tcp_ecn, config.tcp_cc, platform)
    t_run = time.monotonic()
    with interrupts_as_exceptions(), machine(run_id, log) as ledger:
        workdir = Path(config.results_dir) / run_id
        workdir.mkdir(parents=True, exist_ok=True)
        (workdir / "config.json").write_text(json.dumps(asdict(config), indent=1))
        if config.anycast is not None:
            write_anycast(workdir, config.anycast)
        log(f"run {run_id}: {fabric.kind} {fabric.params}, {len(fabric.hosts)} hosts, "
            f"{len(fabric.switches)} switches, {len(fabric.links)} links at "
            f"{config.link_rate_mbit:g} Mbit/s, MTU {config.mtu_bytes}, OVS {datapath} datapath")
        summary: dict = {"run_id": run_id, "results_dir": str(workdir), "config": asdict(config),
                         "paths": asdict(platform.paths), "host_tcp": tcp.to_dict()}
        with FabricNetwork(fabric, workdir, ledger, datapath=datapath, routing=config.routing,
                           log=log, queue=ecn.queue if ecn is not None else None,
                           ecn_path=ecn_path, host_sysctls=tcp.sysctls()) as net:
            t = net.timings
            log(f"fabric up: built in {t.build_s:.1f} s; all {len(fabric.switches)} switches "
                f"programmed by the controller {t.programmed_s:.1f} s later")
            summary["groups"] = check_groups(net, config)
            t0 = time.monotonic()
            sent, received = net.ping_all()
            n = len(fabric.hosts)
            log(f"reachability: {received}/{sent} probes answered, covering all {n * (n - 1)} "
                f"ordered host pairs ({time.monotonic() - t0:.1f} s)")
            summary["reachability"] = {"probes": sent, "answered": received,
                                       "ordered_pairs": n * (n - 1)}
            if received != sent:
                raise TestbedError(f"only {received}/{sent} reachability probes were answered; "
                                   f"see {workdir}/controller.log")
            if config.anycast is not None:
                summary["anycast"] = start_anycast(
                    net, AnycastService.from_dict(config.anycast), config.routing, log)
            if config.anycast_failover is not None:
                summary["anycast"]["failover"] = anycast_failover(net, config, log)
            with ecn_monitoring(net.marking, ecn, summary):
                summary["workload"] = run_allreduce(net, config, workdir, log)
        summary["fabric_timings_s"] = asdict(net.timings)
        summary["openflow"] = openflow_summary(workdir, fabric,
                                               summary["workload"]["timed_window_monotonic_s"])
    summary["wall_s"] = time.monotonic() - t_run
    summary["plots"] = [str(p) for p in write_results(summary, workdir, fabric)]
    return summary


def check_groups(net: FabricNetwork, config: RunConfig) -> dict:
    """Compare the select groups OVS holds with the ones the controller was to install."""
    anycast = AnycastService.from_dict(config.anycast) if config.anycast is not None else None
    tables = FabricState(net.fabric, config.routing, anycast).tables
    expected = sum(len(t.groups) for t in tables.values())
    found = sum(net.switchd.dump_groups(name).count("type=select") for name in tables)
    if found != expected:
        raise TestbedError(f"OVS holds {found} select groups, the controller should have "
                           f"installed {expected}")
    return {"select_groups": found}


def anycast_address_argv(service: AnycastService) -> list[str]:
    """What a replica runs to hold the service address: on lo, so it answers for the address
    but never claims it on the fabric, where the controller answers ARP for it."""
    return ["ip", "addr", "add", f"{service.service_ip}/32", "dev", "lo"]


def start_anycast(net: FabricNetwork, service: AnycastService, routing: str, log=print) -> dict:
    """Give every replica the service address, then prove every host reaches the service;
    returns which replica each host's requests should reach (testbed.controllers.routing.anycast)."""
    for name in service.replicas:
        out = net.host(name).cmd(*anycast_address_argv(service))
        if out.strip():
            raise TestbedError(f"{name} cannot take the anycast address: {out.strip()[-200:]}")
    hosts = [h.name for h in net.fabric.hosts]
    answered = [name for name in hosts if service.service_ip in net.host(name).cmd(
        "fping", "-a", "-q", "-r", "3", "-t", "1000", service.service_ip).split()]
    log(f"anycast {service.service_ip}: replicas {', '.join(service.replicas)}; "
        f"{len(answered)}/{len(hosts)} hosts reach it")
    if len(answered) != len(hosts):
        missing = sorted(set(hosts) - set(answered))
        raise TestbedError(f"{len(missing)} hosts do not reach anycast {service.service_ip}, "
                           f"first {missing[0]}; see {net.workdir}/controller.log")
    routes = anycast_routes(net.fabric, service.service_ip, service.replicas, mode=routing)
    return {**service.to_dict(), "hosts_reaching": len(answered),
            "replica_for_host": replica_for_hosts(net.fabric, routes, service.replicas)}


def anycast_failover(net: FabricNetwork, config: RunConfig, log=print) -> dict:
    """Cut the link of the client's nearest replica while it probes the service, restore
    it, and report how fast the client moved away and back (testbed.experiments.anycast.run)."""
    from testbed.experiments.anycast.run import anycast_cut, cut_and_repair

    cut = anycast_cut(net.fabric, AnycastService.from_dict(config.anycast),
                      config.anycast_failover, config.routing)
    log(f"anycast failover: {cut.client} probes {cut.service.service_ip} every "
        f"{cut.interval_s * 1000:g} ms; {cut.near}'s link {cut.interface} goes down at "
        f"{cut.down_at_s:g} s and back at {cut.up_at_s:g} s")
    result = cut_and_repair(net, cut)
    log(f"anycast failover: served by {result.far} {result.to_far_s * 1000:.0f} ms after the "
        f"cut ({result.requests_lost} requests lost), back on {result.near} "
        f"{result.back_to_near_s * 1000:.0f} ms after the repair")
    return result.to_dict()


def openflow_summary(workdir: Path, fabric, window_monotonic_s: list[float]) -> dict:
    """The controller's files, summarised: its failure events as written, per link
    direction the rate the switches' own port counters saw during the timed window, and its
    latest wiring check (testbed.controllers.routing.wiring.wiring_summary; None if none completed)."""
    events = read_json_lines(workdir / EVENTS_FILE)
    samples = port_samples(read_json_lines(workdir / PORT_STATS_FILE))
    return {"events": events,
            "port_counters": link_rate_summary(fabric, samples, tuple(window_monotonic_s)),
            "wiring": wiring_summary(read_json_lines(workdir / WIRING_FILE))}


def run_allreduce(net: FabricNetwork, config: RunConfig, workdir: Path, log=print) -> dict:
    """Ring AllReduce across all hosts, with real data, verified on every rank."""
    hosts = net.fabric.hosts
    world = len(hosts)
    n_elems = config.size_bytes // 4
    digest = hashlib.sha256(expected_sum(world, n_elems, config.seed).tobytes()).hexdigest()
    directions = link_directions(net.fabric)
    log(f"ring AllReduce: {world} ranks, {config.size_bytes / 2**20:g} MiB float32, "
        f"{config.channels} channels, {config.warmup} warm-up + {config.iters} timed iterations")
    procs = []
    drops_before = net.queue_drops()
    switches_before = net.switch_counters()
    with Sampler(directions, net.switchd.pids) as sampler:
        for rank, host in enumerate(hosts):
            argv = [sys.executable, "-m", "testbed.traffic.allreduce", "--rank", str(rank),
                    "--world", str(world), "--next-ip", hosts[(rank + 1) % world].ip,
                    "--port", str(RANK_PORT), "--size-bytes", str(config.size_bytes),
                    "--channels", str(config.channels), "--seed", str(config.seed),
                    "--warmup", str(config.warmup), "--iters", str(config.iters),
                    "--expect-sha256", digest]
            err = open(workdir / f"rank{rank}.err", "wb")
            procs.append(net.popen(host.name, argv, stdout=subprocess.PIPE, stderr=err))
            err.close()
        results = collect_ranks(procs, workdir, log)
    queue_drops = net.queue_drops() - drops_before
    switches = {k: v - switches_before[k] for k, v in net.switch_counters().items()}
    return allreduce_summary(config, net.fabric, results, sampler, directions, queue_drops,
                             switches)


def collect_ranks(procs, workdir: Path, log) -> list[dict]:
    deadline = time.monotonic() + RANK_TIMEOUT_S
    results = []
    for rank, proc in enumerate(procs):
        try:
            out, _ = proc.communicate(timeout=max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            raise TestbedError(f"rank {rank} did not finish in {RANK_TIMEOUT_S:.0f} s") from None
        (workdir / f"rank{rank}.json").write_bytes(out)
        if proc.returncode not in (0, 1) or not out.strip():
            tail = (workdir / f"rank{rank}.err").read_text()[-400:].strip()
            raise TestbedError(f"rank {rank} failed (exit {proc.returncode}): {tail}")
        results.append(json.loads(out))
    return results


def ecmp_spread(fabric, routing: str, rates_mbit: dict[str, float]) -> dict:
    """For every switch with an ECMP group whose uplinks carried traffic, the byte shares on
    the group's ports and their Jain index."""
    ports_to_peer = {}
    for link in fabric.links:
        ports_to_peer[(link.a, link.a_port)] = link.b
        ports_to_peer[(link.b, link.b_port)] = link.a
    per_switch = {}
    for name, table in FabricState(fabric, routing).tables.items():
        for ports in group_ports(table):
            loads = [rates_mbit[f"{name}->{ports_to_peer[(name, p)]}"] for p in ports]
            if sum(loads) > 0.01 * max(fabric.params["host_rate_mbit"], 1):
                per_switch[name] = {"uplink_mbit": [round(x, 2) for x in loads],
                                    "jain": round(jain_index(loads), 3)}
    jains = [v["jain"] for v in per_switch.values()]
    used = sum(sum(1 for x in v["uplink_mbit"] if x > 0.5) for v in per_switch.values())
    total = sum(len(v["uplink_mbit"]) for v in per_switch.values())
    return {"switches": per_switch, "jain_mean": round(sum(jains) / len(jains), 3) if jains else None,
            "uplinks_used": used, "uplinks_in_groups": total,
            "spread": bool(jains) and used > len(jains)}


def allreduce_summary(config, fabric, results, sampler, directions, queue_drops: int,
                      switches: dict[str, int]) -> dict:
    world = len(results)
    verified = all(r["verified"] for r in results)
    iters = len(results[0]["times_s"])
    # An iteration ends when the slowest rank has its result (nccl-tests reports the same).
    per_iter_s = [max(r["times_s"][i] for r in results) for i in range(iters)]
    mean_s = sum(per_iter_s) / iters
    algbw = algbw_gbyte(config.size_bytes, mean_s)
    busbw = algbw * allreduce_busbw_factor(world)
    busbw_mbit = busbw * 8e3
    start = sampler.since_start_s(min(r["timed_window_monotonic_s"][0] for r in results))
    end = sampler.since_start_s(max(r["timed_window_monotonic_s"][1] for r in results))
    rates = window_rates_mbit(sampler.series, start, end)
    util = {d.label: rates[d.label] / d.rate_mbit for d in directions}
    out_segs = sum(r["tcp_out_segs"] for r in results)
    retrans = sum(r["tcp_retrans_segs"] for r in results)
    lost = emulator_losses(switches["rx_packets"], switches["tx_packets"],
                           switches["queue_drops"])
    verdict = judge(window_mean(sampler.series.cpu_busy_fraction, sampler.series, start, end),
                    window_mean(sampler.series.vswitchd_cores, sampler.series, start, end),
                    max(util.values(), default=0.0), lost / max(switches["rx_packets"], 1))
    return {
        "kind": "allreduce", "world": world, "size_bytes": config.size_bytes,
        "verified": verified, "verified_ranks": sum(r["verified"] for r in results),
        "iteration_s": per_iter_s, "time_s": mean_s,
        "algbw_gbyte_s": algbw, "busbw_gbyte_s": busbw, "busbw_mbit_s": busbw_mbit,
        "busbw_fraction_of_link": busbw_mbit / config.link_rate_mbit,
        "link_rate_mbit": config.link_rate_mbit,
        "link_utilisation": {k: round(v, 4) for k, v in util.items()},
        "tcp": {"segments_sent": out_segs, "segments_retransmitted": retrans},
        "packets": {"queue_drops": queue_drops, "switch_rx": switches["rx_packets"],
                    "switch_tx": switches["tx_packets"],
                    "switch_queue_drops": switches["queue_drops"], "emulator_lost": lost},
        "ecmp": ecmp_spread(fabric, config.routing, rates),
        "fidelity": verdict.to_dict(),
        "timed_window_s": [start, end],
        "timed_window_monotonic_s": [min(r["timed_window_monotonic_s"][0] for r in results),
                                     max(r["timed_window_monotonic_s"][1] for r in results)],
        "samples": {"t_s": sampler.series.t_s, "cpu_busy_fraction": sampler.series.cpu_busy_fraction,
                    "vswitchd_cores": sampler.series.vswitchd_cores,
                    "link_bytes": sampler.series.link_bytes},
    }
