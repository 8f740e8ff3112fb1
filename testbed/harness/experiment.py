"""The experiment protocol: what an experiment supplies, and what the harness does with it.

An experiment is a class in its own folder (testbed/experiments/<name>/) registered in
testbed.experiments.registry. It supplies:

- ``Params``: a pydantic model of its own scenario parameters (``params:`` in YAML);
- ``setups()``: the fabrics it measures on, as plain data (``Setup``: a fabric description,
  routing, the port queue, the hosts' TCP), one after the other;
- ``measure(run)``: what it does on one running fabric (``SetupRun``), returning plain data;
- ``checks(results)``: its claims judged from every setup's results (testbed.model.verdict);
- ``plots(results, folder, title)`` with a one-line caption per figure (``captions``), and
  ``rows(results)`` (the printed summary: testbed.model.rows.Row, carrying the numbers
  each row shows with their units).

The harness (testbed.harness.run) owns everything else: the scenario, the machine's lock and
ledger, the results folder and its layout, bring-up and reachability of each setup, the
failure schedule and impairments, the emulator's trust, the report and the exit status.
Experiments import no other experiment; what they share lives in testbed.plan,
testbed.measure and testbed.drive.flows.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar

from pydantic import BaseModel, ConfigDict

from testbed.capabilities import Platform
from testbed.harness.calibration import default_rate
from testbed.harness.plans import build_fabric, queue_plan, tcp_plan
from testbed.harness.progress import Progress
from testbed.harness.scenario import (
    SCENARIO_DIR,
    FamilyTopology,
    Problem,
    Scenario,
    parse_yaml,
    read_text,
)
from testbed.measure.fidelity import Watch
from testbed.measure.queues import ecn_monitoring
from testbed.model.topology.base import Fabric
from testbed.model.verdict import Check
from testbed.plan.profiles import QueueConfig
from testbed.plan.settings import EcnSettings, TcpSettings, queue_record
from testbed.system.running import RunningFabric


# Named sections of a scenario an experiment may honour; the rest are refused for it.
TOPOLOGY, ROUTING, QUEUE, HOSTS, ANYCAST = "topology", "routing", "queue", "hosts", "anycast"
COMMON_SECTIONS = frozenset({TOPOLOGY, ROUTING, QUEUE, HOSTS, ANYCAST})


class Params(BaseModel):
    """Base of every experiment's parameters: unknown keys are errors, values are taken as
    written (no bool for a number, no NaN or infinity)."""

    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False)


def distinct(values: list, what: str = "a value", keys: list | None = None) -> list:
    """``values`` unchanged, or a ValueError (a Params validator's message) when one of them
    (compared by ``keys`` where given) is listed twice."""
    keys = values if keys is None else keys
    if len(set(keys)) != len(keys):
        raise ValueError(f"lists {what} twice: {values}")
    return values


@dataclass(frozen=True)
class Setup:
    """One fabric an experiment brings up and measures on, as plain data."""

    name: str
    fabric: Fabric
    routing: str = "ecmp"
    queue: QueueConfig | None = None
    queue_record: dict | None = None  # how the queue was chosen (scaling, thresholds)
    tcp: TcpSettings | None = None
    sysctls: dict[str, str] = field(default_factory=dict)  # beyond the TCP settings
    anycast: dict | None = None  # {"service_ip": ..., "replicas": [...]}
    description: str = ""

    def host_sysctls(self) -> dict[str, str]:
        return {**(self.tcp.sysctls() if self.tcp else {}), **self.sysctls}

    def describe(self) -> dict:
        return {"name": self.name, "fabric": {"kind": self.fabric.kind,
                                              "label": self.fabric.label(),
                                              "params": self.fabric.params,
                                              "hosts": len(self.fabric.hosts),
                                              "switches": len(self.fabric.switches),
                                              "links": len(self.fabric.links),
                                              "mtu_bytes": self.fabric.mtu_bytes},
                "routing": self.routing, "description": self.description,
                "queue": None if self.queue is None else {
                    **queue_record(self.queue), "classes": self.queue.uses_classes,
                    "pfc": None if self.queue.pfc is None else vars(self.queue.pfc),
                    "record": self.queue_record},
                "host_tcp": None if self.tcp is None else self.tcp.to_dict(),
                "anycast": self.anycast}


@dataclass
class SetupRun:
    """What ``Experiment.measure`` gets for one setup: the running network, the setup, its
    folder for raw files, and the run's log and progress."""

    net: RunningFabric
    setup: Setup
    workdir: Path
    log: Callable[[str], None]
    progress: Progress
    ecn: EcnSettings | None = None

    def watch(self, interval_s: float = 0.25, probe: tuple[str, str] | None = None):
        """Sample what the fidelity verdict needs around a measurement
        (testbed.measure.fidelity.Watch); ``probe``: two hosts to measure RTT under load
        between (testbed.measure.rtt)."""
        return Watch(self.net, interval_s, probe)

    def queues(self, report: dict):
        """Count marks and drops at every port, and sample queue depths, while the block runs;
        the report lands in ``report["ecn"]`` (testbed.measure.queues.ecn_monitoring)."""
        return ecn_monitoring(self.net, self.ecn, report)


class Experiment:
    """Base of every experiment; see the module docstring for what a subclass supplies."""

    name: ClassVar[str]
    title: ClassVar[str]
    Params: ClassVar[type[Params]] = Params
    default_rate_mbit: ClassVar[float] = 6.0
    default_mtu_bytes: ClassVar[int] = 9000
    sections: ClassVar[frozenset[str]] = COMMON_SECTIONS  # the common sections it honours
    cli_aliases: ClassVar[dict[str, str]] = {}  # extra flag of ``testbed NAME`` -> Params field
    # The bundled scenario holding its defaults, by name ("": the one named after the experiment).
    defaults_scenario: ClassVar[str] = ""
    # A one-line caption per figure ``plots`` draws, by file name (a glob: "queue-*.png"),
    # saying what to look at; the report puts it under the figure.
    captions: ClassVar[dict[str, str]] = {}

    max_default_rate_mbit: ClassVar[float | None] = None  # a calibrated default is capped here
    # The fewest CPUs the hosts keep when forwarding gets CPUs of its own
    # (testbed.plan.shards.cpu_layout); where the machine cannot leave that many, nothing is
    # pinned. 1 suits bandwidth-bound runs; 2 suits latency-bound ones whose ranks answer each
    # other, which on one CPU wait for each other at every exchange.
    min_host_cpus: ClassVar[int] = 1

    def __init__(self, scenario: Scenario, params, platform: Platform):
        self.scenario = scenario
        self.params = params
        self.platform = platform
        self._rate: tuple[float, str] | None = None

    @classmethod
    def defaults_path(cls) -> Path | None:
        """The bundled scenario holding this experiment's defaults (what ``testbed NAME`` and
        ``fab.run`` start from), or None when it has none."""
        path = SCENARIO_DIR / f"{cls.defaults_scenario or cls.name}.yaml"
        return path if path.is_file() else None

    @classmethod
    def defaults(cls) -> dict:
        """Its defaults scenario's mapping, unvalidated ({} without one: Params' defaults)."""
        path = cls.defaults_path()
        return {} if path is None else parse_yaml(read_text(path), str(path))

    # -- what the scenario fixes, with this experiment's defaults ------------------------------
    @property
    def rate_mbit(self) -> float:
        return self.rate_decision[0]

    @property
    def rate_decision(self) -> tuple[float, str]:
        """The link rate and why: the scenario's, else this machine's calibrated rate times
        its margin (testbed.harness.calibration), else the experiment's safe default."""
        if self._rate is None:
            if self.scenario.link_rate_mbit:
                self._rate = (self.scenario.link_rate_mbit, "set by the scenario")
            else:
                self._rate = default_rate(self.platform, self.default_rate_mbit,
                                          self.max_default_rate_mbit)
        return self._rate

    @property
    def mtu_bytes(self) -> int:
        return self.scenario.mtu_bytes or self.default_mtu_bytes

    def fabric(self, **overrides) -> Fabric:
        """The scenario's topology (or ``default_topology``) at the run's rate and MTU."""
        spec = self.scenario.topology or self.default_topology()
        return build_fabric(spec, overrides.get("rate_mbit", self.rate_mbit),
                            overrides.get("mtu_bytes", self.mtu_bytes))

    def default_topology(self):
        return FamilyTopology(name="fattree", k=4)

    def scenario_setup(self, name: str = "fabric", **kwargs) -> Setup:
        """The one setup the scenario describes: its fabric, routing, queue and hosts."""
        fabric = self.fabric()
        queue, record = queue_plan(self.scenario.queue, self.rate_mbit, self.mtu_bytes, fabric)
        anycast = (self.scenario.anycast.model_dump() if self.scenario.anycast is not None
                   else None)
        return Setup(name, fabric, self.scenario.routing, queue, record,
                     tcp_plan(self.scenario.hosts, self.platform), anycast=anycast, **kwargs)

    # -- what a subclass supplies ---------------------------------------------------------------
    def problems(self) -> list[Problem]:
        """What is wrong with the scenario for this experiment beyond the schema (field paths
        as in the scenario); building ``setups()`` is tried by the harness as well."""
        return []

    def setups(self) -> list[Setup]:
        raise NotImplementedError

    def measure(self, run: SetupRun) -> dict:
        raise NotImplementedError

    def checks(self, results: dict[str, dict]) -> list[Check]:
        return []

    def trust(self, results: dict[str, dict]) -> list[Check]:
        """Checks of whether the emulator kept up beyond each setup's fidelity verdict (which
        the harness takes from ``results[setup]["fidelity"]``)."""
        return []

    def plots(self, results: dict[str, dict], folder: Path, title: str) -> list[Path]:
        return []

    def rows(self, results: dict[str, dict]) -> list[tuple[str, str]]:
        """The rows of the printed summary: ``Row(what, text, *numbers)``
        (testbed.model.rows), or plain (what, text) pairs for rows that show no number."""
        return []

    def headline(self) -> str:
        """One line naming what runs (the start of the run's log and of plot titles)."""
        return self.title


@dataclass
class Resolved:
    """A valid scenario with its experiment, parameters and this machine's platform."""

    scenario: Scenario
    experiment: Experiment
    platform: Platform
    setups: list[Setup]
    ecn_path: str | None  # how marked queues are marked here (decided once, for every setup)
