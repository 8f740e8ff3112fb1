"""What the RoCE experiments that load one bottleneck share (roce-dcqcn, roce-incast-pfc,
roce-dctcp): their common parameters, and an Experiment base whose ``measure`` runs every
sender of a setup's bench (testbed.experiments.roce_common.roce_setups) into its receiver with the
bottleneck's real queue sampled (testbed.drive.roce_flows.measure_bottleneck), and whose
``trust`` and ``plots`` serve them all. A subclass supplies its parameters, ``setups``, the
congestion control of each setup (``cc_of``), its ``checks`` and ``rows``.
"""
from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal

from pydantic import AfterValidator, Field

from testbed.drive.roce_flows import (
    ENGINE,
    RoceSettings,
    bottleneck_result,
    measure_bottleneck,
)
from testbed.experiments.roce_common.roce_plots import plot_setup_series
from testbed.experiments.roce_common.roce_setups import (
    ETHERNET_HEADER_BYTES,
    LOSSLESS_QUEUE,
    ack_timeout_s,
    roce_frame_bytes,
)
from testbed.harness.experiment import Experiment, Params, Setup, SetupRun, distinct
from testbed.harness.scenario import Problem
from testbed.model.bench import bench_of
from testbed.plan.port_queue import Handles
from testbed.plan.profiles import RedEcn, StepEcn

MAX_SECONDS = 600
SAMPLE_S = 0.010        # the real queue every 10 ms, as mininet-tests/dctcp sampled it
ROCE_TIMEOUT_S = 60.0   # the host programs' wait for their peer or their completions
WINDOWED_CCS = ("dctcp",)  # controls that limit by a window: their QPs are not paced


# A list that names each entry once (setups are named after them).
Distinct = AfterValidator(lambda values: distinct(values, "an entry"))
SenderCounts = Annotated[list[Annotated[int, Field(ge=1, le=8)]], Distinct]


class TransportParams(Params):
    """Which RoCE runs: the user-space engine everywhere, or the kernel's softRoCE."""

    transport: Literal["engine", "rxe"] = Field(
        "engine", description="the user-space RoCEv2 engine, or the kernel's softRoCE (rxe) "
                              "driven by perftest where the kernel has rdma_rxe")


class RoceParams(Params):
    """The RoCE flows' shape, and whether a sample of their packets is kept."""

    message_bytes: int = Field(1 << 20, ge=4096, le=64 << 20, description="RDMA WRITE size")
    roce_mtu_bytes: Literal[1024, 2048, 4096] = Field(1024, description="RoCE path MTU")
    capture: bool = Field(True, description="keep a sample of RoCE packets per setup")


class BottleneckParams(RoceParams):
    """How long the flows run, and the part left out at their start."""

    seconds: int = Field(20, ge=3, le=MAX_SECONDS, description="seconds the flows run")
    settle_s: float = Field(3.0, ge=0, le=MAX_SECONDS, description="seconds left out first")


def roce_problems(experiment: Experiment, max_rate_mbit: float) -> list[Problem]:
    """The rate this experiment can run at, and a RoCE path MTU the fabric's MTU carries."""
    p = experiment.params
    problems = []
    if experiment.rate_mbit > max_rate_mbit:
        problems.append(Problem(("link_rate_mbit",), f"{experiment.name} runs at most "
                                f"{max_rate_mbit:g} Mbit/s, got {experiment.rate_mbit:g}"))
    packet = roce_frame_bytes(p.roce_mtu_bytes) - ETHERNET_HEADER_BYTES
    if packet > experiment.mtu_bytes:
        problems.append(Problem(("params", "roce_mtu_bytes"), f"{p.roce_mtu_bytes}-byte RoCE "
                                f"payloads need an MTU of {packet}, the fabric has "
                                f"{experiment.mtu_bytes}"))
    return problems


def queue_facts(setup: Setup) -> dict:
    """A setup's queue thresholds (K, or Kmin and Kmax; XOFF with PFC; the buffer) and the
    record of how they were chosen, for its results."""
    queue = setup.queue
    facts: dict = {"buffer_bytes": queue.buffer_bytes, "queue_record": setup.queue_record}
    if isinstance(queue.ecn, StepEcn):
        facts["k_bytes"] = queue.ecn.k_bytes
    elif isinstance(queue.ecn, RedEcn):
        facts.update(kmin_bytes=queue.ecn.kmin_bytes, kmax_bytes=queue.ecn.kmax_bytes)
    if queue.pfc is not None:
        facts["xoff_bytes"] = queue.pfc.xoff_bytes
    return facts


THRESHOLD_NAMES = {"k_bytes": "K", "kmin_bytes": "Kmin", "kmax_bytes": "Kmax",
                   "xoff_bytes": "XOFF"}


def thresholds(result: dict) -> dict[str, float]:
    """The lines a queue figure draws: K, Kmin, Kmax, XOFF where the setup has them, else
    the buffer."""
    lines = {name: result[key] for key, name in THRESHOLD_NAMES.items()
             if result.get(key) is not None}
    return lines or {"buffer": result["buffer_bytes"]}


class BottleneckExperiment(Experiment):
    """Every sender of a setup's one-switch bench into its receiver (module docstring)."""

    captions = {
        "queue-*.png": ("The real queue over time with the marking thresholds: under "
                        "congestion control it should settle between them; without it, fill to "
                        "the buffer."),
        "cc-*.png": ("Each QP's rate (or window), its alpha and the CNPs it got: rates should "
                     "converge to a fair share as alpha settles."),
    }

    default_rate_mbit = 20.0
    default_mtu_bytes = 1500  # thresholds in frames of a standard Ethernet MTU
    sections = frozenset()  # every setup has its own bench, queue and congestion control
    max_rate_mbit = 100.0
    # The receiver's engine is woken per packet; left one CPU beside a pinned ovs-vswitchd on
    # the 2-core VM it waited 0.25-0.27 threads for a core in the shortened DCQCN bench
    # (limit 0.25), 0.15-0.20 with the hosts on both CPUs (docs/capacity.md).
    min_host_cpus = 2

    def cc_of(self, setup: Setup) -> str:
        raise NotImplementedError

    def bandwidth_bound(self, setup: Setup) -> bool:
        """Whether the bottleneck must carry its rate for the setup to be trusted: with no
        congestion control it must; a control that leaves the link short is what the run
        measures (a check of its own where it matters), not the emulator's fault."""
        return self.cc_of(setup) == "none"

    def problems(self) -> list[Problem]:
        p = self.params
        problems = roce_problems(self, self.max_rate_mbit)
        if p.settle_s >= p.seconds - 1:
            problems.append(Problem(("params", "settle_s"), f"must leave at least a second of "
                                    f"the {p.seconds} s to judge, got {p.settle_s:g}"))
        return problems

    def settings(self, setup: Setup) -> RoceSettings:
        """The senders of ``setup``: its control, paced at the link rate unless windowed."""
        p = self.params
        cc = self.cc_of(setup)
        return RoceSettings(message_bytes=p.message_bytes, mtu_bytes=p.roce_mtu_bytes, cc=cc,
                            link_rate_mbit=None if cc in WINDOWED_CCS else self.rate_mbit,
                            duration_s=float(p.seconds),
                            ack_timeout_s=ack_timeout_s(setup.queue.buffer_bytes,
                                                        self.rate_mbit),
                            timeout_s=ROCE_TIMEOUT_S, seed=self.scenario.seed,
                            transport=getattr(p, "transport", ENGINE))

    def measure(self, run: SetupRun) -> dict:
        p, setup = self.params, run.setup
        bench = bench_of(run.net.fabric)
        settings = self.settings(setup)
        handle = LOSSLESS_QUEUE if setup.queue.uses_classes else Handles.BUFFER
        run.log(f"{setup.name}: {len(bench.senders)} RoCE QPs (cc {settings.cc}) into "
                f"{bench.receiver} for {p.seconds} s; real queue {handle} of "
                f"{bench.bottleneck_intf} every {SAMPLE_S * 1000:g} ms")
        measured = measure_bottleneck(run, bench, settings, handle, SAMPLE_S, p.capture)
        result = bottleneck_result(measured, bench, settings, p.settle_s,
                                   roce_frame_bytes(p.roce_mtu_bytes), SAMPLE_S,
                                   self.bandwidth_bound(setup), setup.name)
        result.update(rate_mbit=self.rate_mbit, **queue_facts(setup))
        q, pfc = result["queue"], result["pfc"] or {}
        run.log(f"{setup.name}: median real queue {q['median_bytes']} B, utilisation "
                f"{(result['utilisation'] or 0):.1%}, goodputs "
                f"{', '.join(f'{x:.2f}' for x in result['goodput_mbit'])} Mbit/s, "
                f"{result['marks']} marks, {pfc.get('pause_frames_sent')} pause frames, "
                f"{len(result['errors'])} errors")
        return result

    def plots(self, results, folder: Path, title: str) -> list[Path]:
        return [path for name, r in results.items() if "queue" in r
                for path in plot_setup_series(name, r, thresholds(r), title, folder)]
