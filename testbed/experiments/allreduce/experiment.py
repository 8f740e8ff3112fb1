"""Ring AllReduce across every host of a fabric: real float32 data, verified on every rank,
reported as nccl-tests does (algbw, and busbw = algbw * 2(n-1)/n, which approaches the
bottleneck link rate for a bandwidth-optimal ring).

One rank per host (testbed.traffic.collectives.allreduce), ``channels`` TCP connections per
peer as NCCL's channels, ``warmup`` then ``iters`` timed iterations; the ring by default, or
recursive halving-doubling, a double binary tree or the hierarchical algorithm over the
fabric's nodes (``algorithm``). Measured beside it: every link
direction's utilisation over the timed window, the ECMP spread over each select group's
uplinks, TCP retransmissions, queue drops, and whether the emulator kept up.
"""
from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path
from typing import Literal

from pydantic import Field, field_validator

from testbed.controllers.routing.fabric_state import FabricState
from testbed.controllers.routing.forwarding import group_ports
from testbed.drive.ranks import RANK_TIMEOUT_S, all_ranks_window, collect_ranks, window_of
from testbed.experiments.roce_common.roce_setups import ROCE_HEADERS_BYTES, ack_timeout_s
from testbed.harness import plots
from testbed.harness.experiment import Experiment, Params, SetupRun
from testbed.measure.stats import jain_index
from testbed.model.records import PORT_STATS_FILE
from testbed.model.rows import Number, Row
from testbed.model.verdict import at_least, holds
from testbed.plan.port_queue import default_buffer_bytes
from testbed.plan.training import groups_argument, node_groups
from testbed.traffic.collectives.allreduce import expected_digest
from testbed.traffic.collectives.cost import ALLREDUCE, algbw_gbyte, busbw_factor

RANK_PORT = 29500
ALGORITHMS = ("ring", "hd", "tree", "hierarchical")


class AllReduceParams(Params):
    """The collective: size per rank, channels, iterations; and the busbw the run expects
    as a fraction of the link rate (a ring on a non-blocking fabric approaches 1)."""

    size_bytes: int = Field(2 * 1024 * 1024, ge=1024, le=1 << 31,
                            description="bytes each rank reduces (float32, a multiple of 4)")
    channels: int = Field(4, ge=1, le=16, description="connections (or QPs) per peer, as "
                          "NCCL's channels")
    warmup: int = Field(1, ge=0, le=100, description="untimed iterations first")
    iters: int = Field(3, ge=1, le=1000, description="timed iterations")
    expect_busbw_fraction: float = Field(0.9, gt=0, le=1, description="the busbw the check "
                                         "expects, as a fraction of the link rate")
    algorithm: Literal["ring", "hd", "tree", "hierarchical"] = Field(
        "ring", description="ring, recursive halving-doubling (hd), double binary tree, or "
                            "hierarchical over the fabric's nodes")
    transport: Literal["tcp", "roce"] = Field("tcp", description="TCP connections, or RoCE "
                                              "QPs (RDMA WRITE into the peer's registered "
                                              "buffer) paced at the link rate per channel")
    timeout_s: float = Field(RANK_TIMEOUT_S, gt=0, le=86_400, description="seconds the "
                             "ranks may take, from their start; a rank still running then "
                             "fails the run, named (a stopped one as stopped)")

    @field_validator("size_bytes")
    @classmethod
    def _float32(cls, value: int) -> int:
        if value % 4:
            raise ValueError("must be a multiple of 4 (float32 elements)")
        return value


ALGORITHM_NAMES = {"ring": "ring", "hd": "halving-doubling", "tree": "tree",
                   "hierarchical": "hierarchical"}


class AllReduce(Experiment):
    name = "allreduce"
    title = "AllReduce"
    Params = AllReduceParams
    defaults_scenario = "fattree-allreduce"
    captions = {
        "link_rates.png": ("Host uplink rates should sit flat near the configured rate through "
                           "the shaded window, with CPU below 100%; dips mark stalls of the "
                           "ring."),
        "link_utilisation.png": ("A ring keeps every host's link busy: the dots of links from "
                                 "hosts should sit near 100%; a fabric link far above the "
                                 "others of its tier means ECMP put two flows on one path."),
        "openflow_link_utilisation.png": ("The switches' own counters should agree with the "
                                          "host-side rates: the busiest directions near 100% "
                                          "only inside the measured window."),
        "queue_depth.png": ("Queues that stay under the marking threshold mean ECN held them; "
                            "ones pinned at the buffer line mean drops."),
    }

    def headline(self) -> str:
        fabric = self.fabric()
        return (f"{self.algorithm_name()} {self.title}, {len(fabric.hosts)} ranks, "
                f"{self.params.size_bytes / 2**20:g} MiB float32, {self.params.channels} channels "
                f"on {fabric.label()} at {self.rate_mbit:g} Mbit/s"
                + (" over RoCE" if self.params.transport == "roce" else ""))

    def algorithm_name(self) -> str:
        return ALGORITHM_NAMES[self.params.algorithm]

    def setups(self):
        return [self.scenario_setup()]

    def measure(self, run: SetupRun) -> dict:
        hosts = run.net.fabric.hosts
        world = len(hosts)
        p = self.params
        digest = expected_digest(world, p.size_bytes, self.scenario.seed)
        run.log(f"{p.algorithm} AllReduce: {world} ranks, {p.size_bytes / 2**20:g} MiB float32, "
                f"{p.channels} channels, {p.warmup} warm-up + {p.iters} timed iterations")
        drops_before = run.net.queue_drops()
        queues: dict = {}
        probe = (hosts[0].name, hosts[-1].name)  # the farthest pair of the fabric's order
        with run.watch(probe=probe) as watch, run.queues(queues):
            procs = []
            for rank, host in enumerate(hosts):
                argv = [sys.executable, "-m", "testbed.traffic.collectives.allreduce",
                        "--rank", str(rank), "--hosts", ",".join(h.ip for h in hosts),
                        "--port", str(RANK_PORT), "--size-bytes", str(p.size_bytes),
                        "--channels", str(p.channels), "--algo", p.algorithm,
                        "--seed", str(self.scenario.seed), "--warmup", str(p.warmup),
                        "--iters", str(p.iters), "--expect-sha256", digest,
                        *groups_argv(run.net.fabric, p.algorithm),
                        *transport_argv(p.transport, self.rate_mbit, p.channels,
                                        run.net.fabric.mtu_bytes, port_buffer_bytes(run.setup.queue, self.rate_mbit,
                                                          run.net.fabric.mtu_bytes))]
                with open(run.workdir / f"rank{rank}.err", "wb") as err:
                    procs.append(run.net.popen(host.name, argv, stdout=subprocess.PIPE,
                                               stderr=err))
            results = collect_ranks(procs, run.workdir, run.progress, p.warmup + p.iters,
                                    "AllReduce iterations", timeout_s=p.timeout_s)
        summary = summarise(results, p.size_bytes, self.rate_mbit)
        summary["transport"] = p.transport
        if summary["channels_used"] < p.channels:
            run.log(f"the ranks ran {summary['channels_used']} of the {p.channels} channels: "
                    "a small message takes fewer, as NCCL's tuner does")
        window = watch.window_s(*summary["timed_window_monotonic_s"])
        util = watch.utilisation(window)
        fidelity = watch.verdict(window, bandwidth_bound=True)
        (run.workdir / "samples.json").write_text(json.dumps(
            {"t_s": watch.series.t_s, "cpu_busy_fraction": watch.series.cpu_busy_fraction,
             "vswitchd_cores": watch.series.vswitchd_cores,
             "link_bytes": watch.series.link_bytes, "window_s": window}))
        if "ecn" in queues and queues["ecn"].get("samples"):
            (run.workdir / "queue_depth.json").write_text(json.dumps(queues["ecn"].pop("samples")))
        return {**summary,
                "link_utilisation": {k: round(v, 4) for k, v in util.items()},
                "packets": {"queue_drops": run.net.queue_drops() - drops_before,
                            "switches": watch.switches, "emulator_lost": watch.emulator_lost()},
                "ecmp": ecmp_spread(run.net.fabric, run.setup.routing, watch.rates_mbit(window)),
                "queues": queues.get("ecn"), "fidelity": fidelity.to_dict(),
                "window_s": window}

    def checks(self, results):
        r = results["fabric"]
        expect = self.params.expect_busbw_fraction
        checks = [
            holds("data verified on every rank", r["verified_ranks"] == r["world"],
                  f"{r['verified_ranks']}/{r['world']} ranks hold the exact sum",
                  measured=r["verified_ranks"], expected=r["world"]),
            at_least("busbw / link rate", round(r["busbw_fraction_of_link"], 4), expect,
                     "fraction", f"busbw {r['busbw_mbit_s']:.2f} Mbit/s is "
                     f"{r['busbw_fraction_of_link']:.0%} of the {r['link_rate_mbit']:g} Mbit/s "
                     f"link rate (expected at least {expect:.0%})"),
        ]
        e = r["ecmp"]
        if self.scenario.routing == "ecmp" and e["switches"]:
            statement = (f"{e['uplinks_used']}/{e['uplinks_in_groups']} uplinks of select "
                         f"groups carried traffic, mean Jain index {e['jain_mean']}")
            # a ring on one channel sends one flow to each neighbour: nothing to spread
            judged = r["channels_used"] > 1 or self.params.algorithm != "ring"
            if not judged:
                statement += "; not judged: one ring channel, one flow to each neighbour"
            checks.append(holds("ECMP spread flows over group uplinks",
                                e["spread"] if judged else None, statement,
                                measured=e["uplinks_used"], expected=f"> {len(e['switches'])}"))
        return checks

    def rows(self, results):
        r = results["fabric"]
        util = r["link_utilisation"]
        used = [v for v in util.values() if v > 0.01]
        busiest, mean_used = max(util.values(), default=0), sum(used) / len(used) if used else 0
        e, tcp = r["ecmp"], r["tcp"]
        algbw_mbit = r["algbw_gbyte_s"] * 8e3
        return [
            Row("data verified", f"{'yes' if r['verified'] else 'NO'} ({r['verified_ranks']}/"
                                 f"{r['world']} ranks)",
                Number("verified ranks", r["verified_ranks"], "")),
            Row("AllReduce size", f"{r['size_bytes'] / 2**20:g} MiB float32",
                Number("AllReduce size", r["size_bytes"], "bytes")),
            Row("time per iteration", f"{r['time_s']:.3f} s (iterations: "
                                      f"{', '.join(f'{x:.2f}' for x in r['iteration_s'])})",
                Number("time per iteration", r["time_s"], "s")),
            Row("algbw", f"{algbw_mbit:.2f} Mbit/s", Number("algbw", algbw_mbit, "Mbit/s")),
            Row("busbw", f"{r['busbw_mbit_s']:.2f} Mbit/s = {r['busbw_fraction_of_link']:.0%} "
                         f"of the {r['link_rate_mbit']:g} Mbit/s link rate",
                Number("busbw", r["busbw_mbit_s"], "Mbit/s"),
                Number("of the link rate", r["busbw_fraction_of_link"], "fraction")),
            Row("link utilisation", f"max {busiest:.0%}, mean over used links {mean_used:.0%}",
                Number("max", busiest, "fraction"),
                Number("mean over used links", mean_used, "fraction")),
            Row("ECMP spread", f"{'yes' if e['spread'] else 'no'}: {e['uplinks_used']}/"
                               f"{e['uplinks_in_groups']} group uplinks carried traffic, mean "
                               f"Jain index {e['jain_mean']}",
                Number("group uplinks used", e["uplinks_used"], ""),
                Number("mean Jain index", e["jain_mean"], "")),
            Row("TCP", f"{tcp['segments_sent']} segments, {tcp['segments_retransmitted']} "
                       "retransmitted",
                Number("segments", tcp["segments_sent"], ""),
                Number("retransmitted", tcp["segments_retransmitted"], "")),
        ]

    def plots(self, results, folder: Path, title: str) -> list[Path]:
        r = results["fabric"]
        fabric = self.fabric()
        run_dir = Path(r["dir"])
        samples = json.loads((run_dir / "samples.json").read_text())
        title = (f"{title} | {self.algorithm_name()} AllReduce busbw "
                 f"{r['busbw_mbit_s']:.2f} Mbit/s")
        faults = r.get("fault_windows")  # the failure schedule's, shaded on the timelines
        t0_monotonic_s = (r["timed_window_monotonic_s"][0] - samples["window_s"][0]
                          if faults else None)  # the samples' zero
        paths = [
            plots.plot_timeseries(samples, samples["window_s"], self.rate_mbit, fabric, title,
                                  folder / "link_rates.png", faults, t0_monotonic_s),
            plots.plot_utilisation(r["link_utilisation"], fabric, title,
                                   folder / "link_utilisation.png"),
        ]
        openflow = plots.plot_openflow_utilisation(fabric, run_dir / PORT_STATS_FILE,
                                                   r["timed_window_monotonic_s"], title,
                                                   folder / "openflow_link_utilisation.png",
                                                   faults=faults)
        if openflow is not None:
            paths.append(openflow)
        depth = run_dir / "queue_depth.json"
        if r.get("queues") and depth.exists():
            paths.append(plots.plot_queue_depth(json.loads(depth.read_text()), r["queues"],
                                                title, folder / "queue_depth.png"))
        return paths


ROCE_PATH_MTUS = (4096, 2048, 1024, 512, 256)


def port_buffer_bytes(queue, rate_mbit: float, mtu_bytes: int) -> int:
    """A switch port's buffer: the setup's queue's, else the default one. Where its links run
    at several rates (``QueueConfig.for_rate``), the buffer that takes longest to drain, as
    the bytes that take as long at ``rate_mbit``."""
    if queue is None:
        return default_buffer_bytes(rate_mbit, mtu_bytes)
    return max(q.buffer_bytes if q.rate_mbit in (None, rate_mbit)
               else math.ceil(q.buffer_bytes * rate_mbit / q.rate_mbit) for q in queue.by_rate)


def transport_argv(transport: str, rate_mbit: float, channels: int, mtu_bytes: int,
                   buffer_bytes: int) -> list[str]:
    """The rank program's transport arguments: nothing for TCP; for RoCE the largest path MTU
    the fabric's MTU carries, every QP paced at its channel's share of the link, and a local
    ACK timeout that outlasts the ports' buffers draining (roce_setups.ack_timeout_s: at a
    few Mbit/s a full buffer is longer than the verbs default, and a QP that times out
    resends its whole window)."""
    if transport == "tcp":
        return []
    roce_mtu = next(m for m in ROCE_PATH_MTUS if m + ROCE_HEADERS_BYTES <= mtu_bytes)
    return ["--transport", "roce", "--roce-mtu", str(roce_mtu),
            "--roce-rate-mbit", f"{rate_mbit / channels:g}",
            "--roce-ack-timeout-s", f"{ack_timeout_s(buffer_bytes, rate_mbit):g}"]


def groups_argv(fabric, algorithm: str) -> list[str]:
    """``--groups`` for the hierarchical algorithm: the hosts of each NVSwitch-like node (or,
    on other fabrics, of each edge switch), leader first, in rank order."""
    if algorithm != "hierarchical":
        return []
    return ["--groups", groups_argument(node_groups(fabric, [h.name for h in fabric.hosts]))]


def summarise(results: list[dict], size_bytes: int, rate_mbit: float) -> dict:
    """The ranks' results as nccl-tests reports them: an iteration ends when the slowest
    rank has its result."""
    world = len(results)
    iters = len(results[0]["times_s"])
    per_iter_s = [max(r["times_s"][i] for r in results) for i in range(iters)]
    mean_s = sum(per_iter_s) / iters
    algbw = algbw_gbyte(size_bytes, mean_s)
    busbw = algbw * busbw_factor(ALLREDUCE, world)
    return {
        "world": world, "size_bytes": size_bytes,
        "channels_used": max(r["channels_used"] for r in results),
        "verified": all(r["verified"] for r in results),
        "verified_ranks": sum(r["verified"] for r in results),
        "iteration_s": per_iter_s, "time_s": mean_s,
        "algbw_gbyte_s": algbw, "busbw_gbyte_s": busbw, "busbw_mbit_s": busbw * 8e3,
        "busbw_fraction_of_link": busbw * 8e3 / rate_mbit, "link_rate_mbit": rate_mbit,
        "tcp": {"segments_sent": sum(r["tcp_out_segs"] for r in results),
                "segments_retransmitted": sum(r["tcp_retrans_segs"] for r in results)},
        "timed_window_monotonic_s": all_ranks_window(results),
        "window_monotonic_s": window_of(results),
    }


# An uplink carried traffic when its mean rate over the window exceeded this fraction of the
# host link's rate (at 1 Mbit/s a ring channel's flow averages 0.2-0.3 Mbit/s on an uplink).
USED_UPLINK_FRACTION = 0.05


def ecmp_spread(fabric, routing: str, rates_mbit: dict[str, float]) -> dict:
    """For every switch with an ECMP group whose uplinks carried traffic, the rates on the
    group's ports and their Jain index."""
    ports_to_peer = {}
    for link in fabric.links:
        ports_to_peer[(link.a, link.a_port)] = link.b
        ports_to_peer[(link.b, link.b_port)] = link.a
    per_switch = {}
    host_rate_mbit = fabric.params.get("host_rate_mbit") or 1
    for name, table in FabricState(fabric, routing).tables.items():
        for ports in group_ports(table):
            loads = [rates_mbit[f"{name}->{ports_to_peer[(name, p)]}"] for p in ports]
            if sum(loads) > 0.01 * max(host_rate_mbit, 1):
                per_switch[name] = {"uplink_mbit": [round(x, 2) for x in loads],
                                    "jain": round(jain_index(loads), 3)}
    jains = [v["jain"] for v in per_switch.values()]
    floor_mbit = USED_UPLINK_FRACTION * host_rate_mbit
    used = sum(sum(1 for x in v["uplink_mbit"] if x > floor_mbit) for v in per_switch.values())
    total = sum(len(v["uplink_mbit"]) for v in per_switch.values())
    return {"switches": per_switch, "jain_mean": round(sum(jains) / len(jains), 3) if jains
            else None, "uplinks_used": used, "uplinks_in_groups": total,
            "spread": bool(jains) and used > len(jains)}
