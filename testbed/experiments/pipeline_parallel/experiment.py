"""Pipeline parallelism: GPipe and 1F1B between emulated hosts, their bubble and memory.

``stages`` ranks of testbed.traffic.training.pipeline, one per host (``placement``), run
``micro_batches`` micro-batches per flush with each schedule in turn: GPipe (Huang et al.
2019: all forwards, then all backwards) and 1F1B (PipeDream-Flush, Narayanan et al. 2021:
warm-up forwards, then one forward one backward). Activations go forward and gradients back
as real bytes between the stage hosts (``activation_bytes`` each, checked on arrival);
compute is modelled (``forward_ms``, ``backward_ms``). Every operation's start and end is
recorded on the machine's monotonic clock. Measured per schedule: the bubble (the idle share
of stages x makespan), against (p-1)/(m+p-1); the peak number of micro-batches in flight per
stage, counted from the operations as they ran (1F1B at most p - s on stage s, GPipe m);
a Gantt chart of the last flush.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Literal

from pydantic import Field, field_validator

from testbed.drive.ranks import RANK_PORT, RankWatch, host_problems, launches
from testbed.harness.experiment import Experiment, Params, SetupRun, distinct
from testbed.harness.scenario import Problem
from testbed.model.verdict import holds, near
from testbed.plan.training import place_hosts
from testbed.traffic.training.gantt import plot_gantt
from testbed.traffic.training.pipeline import F, OpRecord, bubble_fraction

PIPELINE_MODULE = "testbed.traffic.training.pipeline"
GPIPE, ONE_F_ONE_B = "gpipe", "1f1b"


def expected_peak_in_flight(schedule: str, stages: int, micro_batches: int) -> list[int]:
    """Micro-batches in flight at most per stage: GPipe holds all m; 1F1B holds p - s on
    stage s (its warm-up forwards and one more), never more than m."""
    if schedule == GPIPE:
        return [micro_batches] * stages
    return [min(stages - s, micro_batches) for s in range(stages)]


def measured_peak_in_flight(records: list[dict], stages: int) -> list[int]:
    """Per stage, the most micro-batches whose forward had run and whose backward had not,
    walking the stage's operations in the order they started."""
    peaks = []
    for stage in range(stages):
        ops = sorted((r for r in records if r["stage"] == stage), key=lambda r: r["start_s"])
        held = peak = 0
        for op in ops:
            held += 1 if op["kind"] == F else -1
            peak = max(peak, held)
        peaks.append(peak)
    return peaks


class PipelineParams(Params):
    """Stages (one host each) and micro-batches per flush, the schedules, one micro-batch's
    activation bytes, the modelled compute per micro-batch and stage, the flushes, where the
    stages run, and the bubble's relative tolerance."""

    stages: int = Field(4, ge=2, le=64, description="pipeline stages (p), one host each")
    micro_batches: int = Field(8, ge=1, le=1024, description="micro-batches per flush (m)")
    schedules: list[Literal["gpipe", "1f1b"]] = Field(
        default_factory=lambda: [GPIPE, ONE_F_ONE_B], min_length=1,
        description="pipeline schedules to run, in order")
    activation_bytes: int = Field(4096, ge=4, le=1 << 30,
                                  description="a micro-batch's activation (and gradient)")
    forward_ms: float = Field(50.0, gt=0, le=60_000, description="forward compute per stage")
    backward_ms: float = Field(100.0, gt=0, le=60_000, description="backward compute per stage")
    steps: int = Field(2, ge=1, le=100, description="pipeline flushes per schedule")
    placement: Literal["packed", "spread"] = Field("spread", description="which hosts")
    bubble_tolerance: float = Field(0.1, gt=0, le=1,
                                    description="|measured - theory| / theory allowed")

    @field_validator("schedules")
    @classmethod
    def _schedules(cls, values: list[str]) -> list[str]:
        return distinct(values, "a schedule")


class PipelineParallel(Experiment):
    name = "pipeline-parallel"
    title = "pipeline parallelism (GPipe, 1F1B)"
    Params = PipelineParams
    captions = {
        "gantt-*.png": ("Idle gaps at the start and end of each stage are the bubble; 1F1B "
                        "interleaves forward and backward to keep fewer micro-batches in "
                        "flight."),
    }

    def problems(self) -> list[Problem]:
        return host_problems(self.fabric(), "stages", self.params.stages, "stages")

    def setups(self):
        return [self.scenario_setup()]

    def headline(self) -> str:
        p = self.params
        return (f"{self.title}: {p.stages} stages, {p.micro_batches} micro-batches, "
                f"{', '.join(p.schedules)}, {p.activation_bytes} B activations on "
                f"{self.fabric().label()} at {self.rate_mbit:g} Mbit/s")

    def rank_args(self, schedule: str) -> list[str]:
        p = self.params
        return ["--schedule", schedule, "--micro-batches", str(p.micro_batches),
                "--activation-bytes", str(p.activation_bytes), "--forward-ms", repr(p.forward_ms),
                "--backward-ms", repr(p.backward_ms), "--steps", str(p.steps),
                "--seed", str(self.scenario.seed), "--channels", "1"]

    def measure(self, run: SetupRun) -> dict:
        fabric = run.net.fabric
        p = self.params
        hosts = place_hosts(fabric, p.stages, p.placement)
        ips = [fabric.nodes[h].ip for h in hosts]
        schedules = {}
        with RankWatch(run) as watch:
            for schedule in p.schedules:
                results = watch.run_ranks(launches(PIPELINE_MODULE, hosts, ips,
                                                   self.rank_args(schedule), RANK_PORT),
                                          f"{schedule} pipeline", p.steps,
                                          prefix=f"{schedule}-rank")
                head = results[0]
                (run.workdir / f"records-{schedule}.json").write_text(json.dumps(head["records"]))
                schedules[schedule] = schedule_summary(schedule, results, p.stages,
                                                       p.micro_batches)
                run.log(f"{schedule}: {schedule_cell(schedules[schedule])}")
        return {"hosts": hosts, "schedules": schedules, "fidelity": watch.fidelity(),
                "window_monotonic_s": [watch.watch.t_start, watch.watch.t_end]}

    def checks(self, results):
        r = results["fabric"]
        p = self.params
        checks = []
        for name, s in r["schedules"].items():
            theory = s["bubble_theory"]
            checks += [
                holds(f"{name}: data verified", s["verified"],
                      f"{s['verified_ranks']}/{p.stages} stages received every activation and "
                      "gradient exactly", measured=s["verified_ranks"], expected=p.stages),
                near(f"{name}: bubble fraction", round(s["bubble_measured"], 4), round(theory, 4),
                     round(p.bubble_tolerance * theory, 4), "fraction",
                     f"the stages idled {s['bubble_measured']:.1%} of the flush, (p-1)/(m+p-1) = "
                     f"{theory:.1%} (within {p.bubble_tolerance:.0%} of it)"),
                holds(f"{name}: micro-batches in flight per stage",
                      s["peak_in_flight_measured"] == s["peak_in_flight_expected"],
                      f"measured {s['peak_in_flight_measured']}, expected "
                      f"{s['peak_in_flight_expected']}",
                      measured=str(s["peak_in_flight_measured"]),
                      expected=str(s["peak_in_flight_expected"])),
            ]
        return checks

    def rows(self, results):
        return [(name, schedule_cell(s)) for name, s in results["fabric"]["schedules"].items()]

    def plots(self, results, folder: Path, title: str) -> list[Path]:
        r = results["fabric"]
        paths = []
        for name, s in r["schedules"].items():
            source = Path(r["dir"]) / f"records-{name}.json"
            if not source.exists():
                continue
            records = [OpRecord(**x) for x in json.loads(source.read_text())]
            path = folder / f"gantt-{name}.png"
            plot_gantt(records, path, f"{title}\n{name}: {self.params.stages} stages, "
                                      f"{self.params.micro_batches} micro-batches, bubble "
                                      f"{s['bubble_measured']:.3f} (theory "
                                      f"{s['bubble_theory']:.3f}), peak in flight "
                                      f"{s['peak_in_flight_measured']}")
            paths.append(path)
        return paths


def schedule_summary(schedule: str, results: list[dict], stages: int, micro_batches: int) -> dict:
    head = results[0]
    return {"bubble_measured": head["bubble_measured"],
            "bubble_theory": bubble_fraction(stages, micro_batches),
            "bubble_per_flush": [s["bubble"] for s in head["steps"]],
            "makespan_s": [s["makespan_s"] for s in head["steps"]],
            "makespan_predicted_s": head["makespan_predicted_s"],
            "peak_in_flight_measured": measured_peak_in_flight(head["records"], stages),
            "peak_in_flight_expected": expected_peak_in_flight(schedule, stages, micro_batches),
            "verified": all(x["verified"] for x in results),
            "verified_ranks": sum(bool(x["verified"]) for x in results),
            "tcp_retransmits": sum(x["tcp_retrans_segs"] for x in results)}


def schedule_cell(s: dict) -> str:
    return (f"bubble {s['bubble_measured']:.3f} (theory {s['bubble_theory']:.3f}; per flush "
            f"{', '.join(f'{b:.3f}' for b in s['bubble_per_flush'])}), makespan "
            f"{', '.join(f'{m:.2f}' for m in s['makespan_s'])} s (predicted "
            f"{s['makespan_predicted_s']:.2f} s), peak in flight per stage "
            f"{s['peak_in_flight_measured']}; {'verified' if s['verified'] else 'NOT verified'}")
