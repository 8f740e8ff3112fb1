"""Record a training workload's traffic as a message trace, replay it with its original timing
on another topology, and compare completion times.

Two setups. ``record``: the scenario's fabric (a k=4 fat-tree by default); ``world`` ranks of
testbed.traffic.training.ddp (DDP buckets of ``model`` scaled by ``scale``, ring AllReduce,
modelled compute) record every message their transport carries (``--trace-out``: time,
source, destination, bytes, tag), optionally with a pcap of ``capture_packets`` TCP packets
at rank 0's interface; the ranks' events are merged into one trace (send paired with
receive), then replayed on the same fabric (testbed.traffic.training.replay: every message
sent at its recorded time, per-pair order kept, its payload checked on arrival), which shows
how faithfully a replay reproduces the recording. ``replay``: a spine-leaf of
``replay_leaves`` leaves and one spine, whose uplinks run at ``replay_uplink_fraction`` of
the link rate; the same trace replayed there, rank i on the i-th host, so ring neighbours on
different leaves share the narrower uplinks. Completion times compared: recorded, replayed
on the recording fabric, replayed on the other.
"""
from __future__ import annotations

import math
from contextlib import nullcontext
from pathlib import Path
from typing import Literal

from pydantic import Field

from testbed.capabilities import missing_capabilities
from testbed.drive.ranks import RANK_PORT, RankWatch, host_problems, launches
from testbed.errors import TestbedError
from testbed.experiments.replay.plots import plot_completion
from testbed.harness.experiment import HOSTS, TOPOLOGY, Experiment, Params, Setup, SetupRun
from testbed.harness.scenario import Problem
from testbed.measure.capture import HostCapture, capture_argv
from testbed.model.topology.spineleaf import spine_leaf
from testbed.model.verdict import at_least, holds, near
from testbed.plan.training import PACKED, cost_links, place_hosts
from testbed.traffic.training.replay import load_trace, write_trace

DDP_MODULE = "testbed.traffic.training.ddp"
REPLAY_MODULE = "testbed.traffic.training.replay"
RECORD, REPLAY = "record", "replay"
TRACE_FILE = "trace.jsonl"
PCAP_FILE, PCAP_LOG = "record.pcap", "record-capture.log"
PCAP_SNAPLEN_BYTES = 128  # headers and the payload's start: enough to see the flows
CAPTURE_TOOLS = ("tcpdump",)


def rank_trace_path(folder: Path) -> str:
    """Where each recording rank writes its events ({rank} filled in by the rank)."""
    return str(folder / "trace-rank{rank}.jsonl")


class ReplayParams(Params):
    """The recorded workload (ranks, where, model, bytes sent per byte of gradient, modelled
    compute, steps), the pcap sample, the replay fabric (leaves, uplink rate as a fraction of
    the link rate), and the tolerances: how close a replay on the recording fabric must
    finish to the recording, how much longer the narrower fabric must take."""

    world: int = Field(4, ge=2, le=64, description="ranks recorded")
    placement: Literal["packed", "spread"] = Field("spread", description="recording hosts")
    model: Literal["resnet50", "gpt2_small"] = Field("resnet50", description="the model")
    scale: float = Field(0.002, gt=0, le=1, description="bytes sent per byte of gradient")
    forward_ms: float = Field(20.0, ge=0, le=60_000, description="forward compute per step")
    backward_ms: float = Field(40.0, ge=0, le=60_000, description="backward compute per step")
    steps: int = Field(3, ge=1, le=100, description="recorded steps")
    capture_packets: int = Field(0, ge=0, le=1_000_000,
                                 description="TCP packets kept as a pcap (0: none)")
    replay_leaves: int = Field(2, ge=2, le=16, description="leaves of the replay fabric")
    replay_uplink_fraction: float = Field(0.5, gt=0, le=10,
                                          description="replay fabric's uplink rate / link rate")
    replay_tolerance: float = Field(0.25, gt=0, le=10,
                                    description="|replay / recording - 1| on the same fabric")
    min_stretch: float = Field(1.2, gt=0, le=100,
                               description="replay fabric / recording fabric completion, "
                                           "at least")


class Replay(Experiment):
    name = "replay"
    title = "trace record and replay"
    Params = ReplayParams
    captions = {
        "completion.png": ("The replay on the same fabric should match the recording; on the "
                           "narrower fabric completion should stretch."),
    }
    sections = frozenset({TOPOLOGY, HOSTS})

    def __init__(self, scenario, params, platform):
        super().__init__(scenario, params, platform)
        self.trace_path: Path | None = None

    def replay_fabric(self):
        p = self.params
        return spine_leaf(leaves=p.replay_leaves, spines=1,
                          hosts_per_leaf=math.ceil(p.world / p.replay_leaves),
                          host_rate_mbit=self.rate_mbit,
                          uplink_rate_mbit=self.rate_mbit * p.replay_uplink_fraction,
                          mtu_bytes=self.mtu_bytes)

    def problems(self) -> list[Problem]:
        p = self.params
        problems = host_problems(self.fabric(), "world", p.world)
        if p.capture_packets:
            for cap in missing_capabilities(self.platform.capabilities, CAPTURE_TOOLS):
                problems.append(Problem(("params", "capture_packets"), f"needs {cap.name}, "
                                        f"which this machine lacks ({cap.detail}; "
                                        "scripts/install.sh installs it)"))
        return problems

    def setups(self) -> list[Setup]:
        record = self.scenario_setup(RECORD, description="the recording fabric: the workload "
                                     "runs and is recorded, then replayed")
        replay = Setup(REPLAY, self.replay_fabric(), "ecmp", None, None, record.tcp,
                       description=f"the replay fabric: uplinks at "
                       f"{self.params.replay_uplink_fraction:g} x the link rate")
        return [record, replay]

    def headline(self) -> str:
        p = self.params
        return (f"{self.title}: {p.model} DDP on {p.world} ranks of {self.fabric().label()} "
                f"recorded, replayed there and on {self.replay_fabric().label()} (uplinks x"
                f"{p.replay_uplink_fraction:g}) at {self.rate_mbit:g} Mbit/s")

    def ddp_args(self, folder: Path, cost) -> list[str]:
        p = self.params
        return ["--model", p.model, "--scale", repr(p.scale), "--steps", str(p.steps),
                "--warmup-steps", "0", "--forward-ms", repr(p.forward_ms),
                "--backward-ms", repr(p.backward_ms), "--seed", str(self.scenario.seed),
                "--trace-out", rank_trace_path(folder), *cost.argv()]

    # -- on a running fabric ----------------------------------------------------------------
    def measure(self, run: SetupRun) -> dict:
        with RankWatch(run) as watch:
            result = (self.record(run, watch) if run.setup.name == RECORD
                      else {"replay": self.replay(run, watch, place_hosts(run.net.fabric,
                                                                          self.params.world,
                                                                          PACKED))})
        return {**result, "fidelity": watch.fidelity(),
                "window_monotonic_s": [watch.watch.t_start, watch.watch.t_end]}

    def record(self, run: SetupRun, watch: RankWatch) -> dict:
        p = self.params
        fabric = run.net.fabric
        hosts = place_hosts(fabric, p.world, p.placement)
        ips = [fabric.nodes[h].ip for h in hosts]
        ranks = launches(DDP_MODULE, hosts, ips, self.ddp_args(run.workdir,
                                                               cost_links(fabric, hosts)))
        capture = self.capture(run, hosts[0]) if p.capture_packets else None
        with capture if capture is not None else nullcontext():
            results = watch.run_ranks(ranks, "recording DDP", p.steps, prefix="ddp-rank")
        messages = load_trace([rank_trace_path(run.workdir).format(rank=r)
                               for r in range(p.world)])
        self.trace_path = run.workdir / TRACE_FILE
        write_trace(self.trace_path, messages)
        head = results[0]
        recording = {"hosts": hosts, "step_s": head.get("job_mean_step_s") or head["mean_step_s"],
                     "verified": all(x["verified"] for x in results),
                     "verified_ranks": sum(bool(x["verified"]) for x in results),
                     "messages": len(messages), "bytes": sum(m.bytes for m in messages),
                     "trace": str(self.trace_path)}
        run.log(f"recorded {len(messages)} messages, {recording['bytes']} B, from {p.world} "
                f"ranks ({'verified' if recording['verified'] else 'NOT verified'})")
        out = {"recording": recording, "replay": self.replay(run, watch, hosts)}
        if capture is not None:
            out["pcap"] = {"file": str(capture.path), "stats": capture.stats,
                           "packets": capture.stats.get("captured")}
        return out

    def capture(self, run: SetupRun, host: str) -> HostCapture:
        """A sample of the workload's TCP packets as they reach ``host`` (rank 0)."""
        link, end = run.net.fabric.host_link(host)
        path = (run.workdir / PCAP_FILE).absolute()
        argv = capture_argv(link.intf(end), path, ["tcp"], self.params.capture_packets,
                            PCAP_SNAPLEN_BYTES)
        return HostCapture(run.net, host, argv, path, run.workdir / PCAP_LOG)

    def replay(self, run: SetupRun, watch: RankWatch, hosts: list[str]) -> dict:
        if self.trace_path is None:
            raise TestbedError("the replay setup needs the recording setup's trace first")
        fabric = run.net.fabric
        ips = [fabric.nodes[h].ip for h in hosts]
        results = watch.run_ranks(launches(REPLAY_MODULE, hosts, ips,
                                           ["--trace", str(self.trace_path)], RANK_PORT),
                                  f"replay on {run.setup.name}", prefix="replay-rank")
        head = results[0]
        summary = {"hosts": hosts, **head["comparison"], "corrupt_total": head["corrupt_total"],
                   "max_send_lateness_s": head["max_send_lateness_s_all"],
                   "verified": bool(head["verified"]) and all(x["verified"] for x in results),
                   "tcp_retransmits": sum(x["tcp_retrans_segs"] for x in results)}
        run.log(f"replay on {run.setup.name}: {replay_cell(summary)}")
        return summary

    # -- judging and showing ----------------------------------------------------------------
    def checks(self, results):
        p = self.params
        checks = []
        record = results.get(RECORD)
        if record is not None:
            rec = record["recording"]
            checks.append(holds("recorded workload verified", rec["verified"],
                                f"{rec['verified_ranks']}/{p.world} ranks held every bucket's "
                                "exact sum", setup=RECORD, measured=rec["verified_ranks"],
                                expected=p.world))
        for name, r in results.items():
            x = r["replay"]
            checks.append(holds("every replayed message arrived intact", x["verified"],
                                f"{x['compared']}/{x['messages']} messages compared, "
                                f"{x['corrupt_total']} corrupt", setup=name,
                                measured=x["corrupt_total"], expected=0))
        if record is not None:
            ratio = record["replay"]["completion_ratio"]
            checks.append(near("replay / recording completion on the same fabric",
                               None if ratio is None else round(ratio, 4), 1.0,
                               p.replay_tolerance, "ratio",
                               "replayed with its original timing on the fabric it was recorded "
                               "on, the trace finishes when the recording did", setup=RECORD))
        stretch = completion_stretch(results)
        checks.append(at_least("replay fabric / recording fabric completion",
                               None if stretch is None else round(stretch, 4), p.min_stretch,
                               "ratio", f"the uplinks at {p.replay_uplink_fraction:g} x the link "
                               "rate stretch the same trace's completion", setup=REPLAY))
        return checks

    def rows(self, results):
        rows = []
        record = results.get(RECORD)
        if record is not None:
            rec = record["recording"]
            rows.append(("recording", f"{rec['messages']} messages, {rec['bytes']} B on "
                                      f"{', '.join(rec['hosts'])}, step {rec['step_s']:.3f} s"))
            if record.get("pcap"):
                rows.append(("pcap", f"{record['pcap']['packets']} packets in "
                                     f"{record['pcap']['file']}"))
        for name, r in results.items():
            rows.append((f"replay on {name}", replay_cell(r["replay"])))
        stretch = completion_stretch(results)
        if stretch is not None:
            rows.append(("completion, replay fabric / recording fabric", f"{stretch:.2f}"))
        return rows

    def plots(self, results, folder: Path, title: str) -> list[Path]:
        if not results:
            return []
        return [plot_completion(results, title, folder / "completion.png")]


def completion_stretch(results: dict) -> float | None:
    """The replay fabric's completion over the recording fabric's replay of the same trace."""
    if RECORD not in results or REPLAY not in results:
        return None
    same = results[RECORD]["replay"]["replayed_completion_s"]
    other = results[REPLAY]["replay"]["replayed_completion_s"]
    return other / same if same else None


def replay_cell(x: dict) -> str:
    ratio = "-" if x["completion_ratio"] is None else f"{x['completion_ratio']:.2f}"
    return (f"{x['messages']} messages: recorded completion {x['recorded_completion_s']:.3f} s, "
            f"replayed {x['replayed_completion_s']:.3f} s (x{ratio}), mean delay "
            f"{(x['mean_delta_s'] or 0) * 1e3:.1f} ms, worst {(x['max_delta_s'] or 0) * 1e3:.1f} "
            f"ms; {x['corrupt_total']} corrupt")
