"""A scenario's common sections turned into plans: the fabric description, every port's queue,
the hosts' TCP, and the checks of names and kernel features those sections need. Pure but for
reading the machine's capabilities (given as a testbed.capabilities.Platform)."""
from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace

from testbed.apply.marking import object_is_current
from testbed.capabilities import missing_capabilities
from testbed.controllers.routing.fabric_state import anycast_problem, routing_problem
from testbed.errors import ConfigError, TestbedError
from testbed.harness.scenario import (
    HostsSpec,
    Problem,
    QueueSpec,
    Scenario,
    topology_problems,
)
from testbed.model.topology import build
from testbed.model.topology.base import Fabric
from testbed.model.topology.explicit import explicit
from testbed.plan.ecn_plan import choose_ecn_path
from testbed.plan.fault_schedule import entry_problems
from testbed.plan.loss_plan import Loss, every_link_cuts, link_cuts
from testbed.plan.pfc import switch_fan_in
from testbed.plan.port_queue import ALL_LINKS, Impairment, default_buffer_bytes, link_impairments
from testbed.plan.profiles import QueueConfig
from testbed.plan.scaling import DEFAULT_PFC_REACTION_TIME_S, pfc_thresholds
from testbed.plan.settings import ecn_settings, tcp_settings


def build_fabric(spec, rate_mbit: float, mtu_bytes: int) -> Fabric:
    """The fabric a topology section describes, at the run's link rate and MTU."""
    if spec.family == "explicit":
        return explicit([n.model_dump() for n in spec.nodes],
                        [link if isinstance(link, list) else link.model_dump()
                         for link in spec.links], rate_mbit, mtu_bytes)
    try:
        return build(spec.name, **spec.params, host_rate_mbit=rate_mbit, mtu_bytes=mtu_bytes)
    except ConfigError as err:
        field = err.field if err.field.startswith("topology") else f"topology.{err.field}"
        raise ConfigError(field, err.problem) from None


def queue_plan(spec: QueueSpec | None, rate_mbit: float, mtu_bytes: int,
               fabric: Fabric) -> tuple:
    """Every shaped port's queue (testbed.plan.profiles.QueueConfig) from a queue section,
    and the record of how its thresholds were chosen; (None, None) without a section.

    The queue is sized for the scenario's ``rate_mbit``; where the fabric's links run at
    other rates (spine-leaf uplinks, fat-tree fabric links, NVLinks, an explicit link's own
    rate), it carries one queue per such rate (``QueueConfig.for_rate``), sized alike: the
    section's explicit values as given, a default buffer and a scheme's thresholds at that
    rate. The record then lists every rate's under ``rates``. Errors name the field inside
    ``queue``."""
    if spec is None:
        return None, None
    for key in ("buffer_bytes", "path", "sample_ms"):
        if key in (spec.ecn or {}):
            raise ConfigError(f"queue.ecn.{key}", f"set it on the queue (queue.{key}), not "
                              "under ecn")

    fan_in = switch_fan_in(fabric)
    queue, record = _rate_queue(spec, rate_mbit, mtu_bytes, fan_in)
    others = sorted({link.rate_mbit for link in fabric.links
                     if link.rate_mbit is not None} - {rate_mbit})
    if not others:
        return queue, record
    planned = [_rate_queue(spec, other, mtu_bytes, fan_in, f" (links at {other:g} Mbit/s)")
               for other in others]
    queue = replace(queue, rate_mbit=rate_mbit,
                    other_rates=tuple(replace(q, rate_mbit=r)
                                      for r, (q, _) in zip(others, planned)))
    records = [(rate_mbit, record)] + [(r, rec) for r, (_, rec) in zip(others, planned)]
    record["rates"] = [{"rate_mbit": r, **rec} for r, rec in sorted(records)]
    return queue, record


def _rate_queue(spec: QueueSpec, rate_mbit: float, mtu_bytes: int, fan_in: int,
                where: str = "") -> tuple:
    """The queue section's queue for ports at ``rate_mbit`` and its record; errors name the
    field inside ``queue`` and end with ``where``."""
    buffer_bytes = spec.buffer_bytes or default_buffer_bytes(rate_mbit, mtu_bytes)
    record: dict = {"buffer_bytes": buffer_bytes,
                    "buffer_rule": "as configured" if spec.buffer_bytes else
                    "50 ms at the link rate, at least 8 frames"}
    try:
        queue = QueueConfig(buffer_bytes=buffer_bytes, class_queues=spec.classes)
        if spec.ecn is not None:
            settings = ecn_settings({**spec.ecn, "buffer_bytes": buffer_bytes}, rate_mbit,
                                    mtu_bytes, buffer_bytes)
            queue = replace(settings.queue, class_queues=spec.classes)
            record["ecn"] = settings.scaling
        if spec.pfc:
            reaction = (spec.pfc.reaction_time_s if not isinstance(spec.pfc, bool)
                        and spec.pfc.reaction_time_s is not None else DEFAULT_PFC_REACTION_TIME_S)
            pfc, record["pfc"] = pfc_thresholds(rate_mbit, mtu_bytes, buffer_bytes,
                                                reaction_time_s=reaction, fan_in=fan_in)
            queue = replace(queue, pfc=pfc)
    except ConfigError as err:
        raise ConfigError(f"queue.{err.field}", err.problem + where) from None
    return queue, record


def tcp_plan(spec: HostsSpec, platform):
    """The hosts' congestion control and ECN on this machine (testbed.plan.settings)."""
    try:
        return tcp_settings(spec.tcp_ecn, spec.tcp_cc, platform)
    except ConfigError as err:
        raise ConfigError(f"hosts.{err.field}", err.problem) from None


def common_problems(scenario: Scenario, cls, platform) -> list[Problem]:
    """What is wrong with the sections every experiment shares: the topology's family and
    parameters, routing against the family, and kernel features the impairments need."""
    problems: list[Problem] = []
    if scenario.topology is not None:
        problems += topology_problems(scenario.topology)
    family = (scenario.topology or cls(scenario, None, platform).default_topology()).family
    problem = routing_problem(family, scenario.routing)
    if problem:
        problems.append(Problem(("routing",), problem))
    problems += impairment_problems(scenario.impairments, platform)
    return problems


# --- impairments: netem where the kernel has it, else loss by the eBPF program ---------------

IMPAIRMENT_NETEM = "netem"  # delay, jitter and loss by a netem qdisc at each impaired end
IMPAIRMENT_EBPF_LOSS = "ebpf-loss"  # loss only, by testbed/apply/bpf/loss.c per direction
LOSS_PROGRAM_NEEDS = ("cls_bpf", "tc", "clang", "bpftool")


def impairment_path(platform) -> str:
    """How impairments are made here: netem where the kernel has it, else the eBPF loss
    program (which can lose packets but not delay them)."""
    netem = platform.capabilities.get("sch_netem")
    return IMPAIRMENT_NETEM if netem is not None and netem.available else IMPAIRMENT_EBPF_LOSS


def impairment_problems(specs, platform) -> list[Problem]:
    """Impairments this machine cannot make: without netem, a delay (or jitter) is refused,
    and loss needs what the eBPF loss program needs."""
    if impairment_path(platform) == IMPAIRMENT_NETEM:
        return []
    netem = platform.capabilities.get("sch_netem")
    detail = netem.detail if netem is not None else "not detected"
    lacking = missing_capabilities(platform.capabilities, LOSS_PROGRAM_NEEDS)
    problems = []
    for i, spec in enumerate(specs):
        if spec.delay_ms or spec.jitter_ms:
            problems.append(Problem(("impairments", i), f"delay needs the netem qdisc, which "
                                    f"this kernel lacks ({detail}); loss_percent alone runs on "
                                    "the eBPF loss program"))
        elif lacking:
            problems.append(Problem(("impairments", i), "loss without netem needs the eBPF "
                                    "loss program, which cannot run here: "
                                    + "; ".join(cap.detail for cap in lacking)))
    return problems


@dataclass(frozen=True)
class ImpairmentPlan:
    """A setup's impairments on ``path``: netem per interface (``netem``, the form
    testbed.apply.network.FabricNetwork's ``impairments`` takes), or, on the eBPF path, each
    lossy link direction's cut and its loss (``losses``, FabricNetwork's ``losses``). Links a
    failure schedule impairs (``scheduled``) get a netem, or a cut, that does nothing until
    the fault."""

    path: str | None
    netem: dict = field(default_factory=dict)
    losses: list = field(default_factory=list)
    links: list = field(default_factory=list)
    scheduled: list = field(default_factory=list)

    def record(self) -> dict:
        """The plan as plain data for a setup's results."""
        return {"path": self.path, "links": self.links,
                "scheduled": [list(link) for link in self.scheduled],
                "cuts": [{**asdict(cut), "loss_percent": 0.0 if loss is None
                          else loss.fraction * 100} for cut, loss in self.losses]}


def impairment_plan(specs, fabric: Fabric, platform,
                    scheduled: list[tuple[str, str]] = ()) -> ImpairmentPlan:
    """The scenario's impairments (ImpairmentSpec entries) on ``fabric`` by this machine's
    path: netem at both ends of each impaired link (the later entry wins where they
    overlap), or both directions of each lossy link cut by the eBPF loss program (the later
    entry wins per direction); and the links a failure schedule impairs (``scheduled``, as
    (a, b)) prepared on the same path, doing nothing until their fault starts."""
    if not specs and not scheduled:
        return ImpairmentPlan(None)
    links = [spec.model_dump() for spec in specs]
    path = impairment_path(platform)
    scheduled = list(scheduled)
    if path == IMPAIRMENT_NETEM:
        netem = link_impairments(fabric, [(link, Impairment(scheduled=True))
                                          for link in scheduled])
        netem.update(link_impairments(fabric, [
            (spec.link, Impairment(spec.delay_ms, spec.jitter_ms, spec.loss_percent))
            for spec in specs]) if specs else {})
        return ImpairmentPlan(path, netem, links=links, scheduled=scheduled)
    by_direction: dict[tuple[str, str], tuple] = {}
    for link in scheduled:
        for cut in link_cuts(fabric, *link):
            by_direction[(cut.src, cut.dst)] = (cut, None)
    for spec in specs:
        if spec.delay_ms or spec.jitter_ms:
            raise ConfigError("impairments", "delay needs netem, which this kernel lacks")
        cuts = (every_link_cuts(fabric) if spec.link == ALL_LINKS
                else link_cuts(fabric, *spec.link))
        for cut in cuts:
            by_direction[(cut.src, cut.dst)] = (cut, Loss(spec.loss_percent / 100))
    return ImpairmentPlan(path, losses=list(by_direction.values()), links=links,
                          scheduled=scheduled)


def failure_problems(scenario: Scenario, setup, platform) -> list[Problem]:
    """What a failure schedule asks of one setup that it cannot do: targets the fabric
    lacks (testbed.plan.fault_schedule.entry_problems), a pause agent where the queues have
    no PFC, the machine's own Open vSwitch (kernel datapath) to stop or kill, a delay
    without netem."""
    problems: list[Problem] = []
    datapath = platform.paths.ovs_datapath if platform is not None else "user"
    for i, spec in enumerate(scenario.failures):
        for field_name, message in entry_problems(spec, setup.fabric):
            problems.append(Problem(("failures", i, *field_name.split(".")), message))
        if spec.daemon == "pause-agent" and (setup.queue is None or setup.queue.pfc is None):
            problems.append(Problem(("failures", i, "daemon"), "this fabric runs no pause "
                                    "agent: its queue has no PFC"))
        if spec.daemon == "ovs-vswitchd" and datapath == "kernel":
            problems.append(Problem(("failures", i, "daemon"), "the switches live in the "
                                    "machine's Open vSwitch here (kernel datapath), which a "
                                    "run may not stop or kill; the run's own ovs-vswitchd runs "
                                    "with TESTBED_DATAPATH=user"))
        if spec.action == "impair" and platform is not None:
            for problem in impairment_problems([spec], platform):
                problems.append(Problem(("failures", i), problem.message))
    return problems


def target_problems(scenario: Scenario, setups, platform=None) -> list[Problem]:
    """Links, switches and anycast replicas a scenario names that some setup's fabric lacks,
    and failures a setup cannot take (``failure_problems``; the machine's side of them when
    ``platform`` is given)."""
    problems: list[Problem] = []
    for setup in setups:
        fabric = setup.fabric
        cabled = {frozenset((link.a, link.b)) for link in fabric.links}
        where = f" (setup {setup.name})" if len(setups) > 1 else ""
        for problem in failure_problems(scenario, setup, platform):
            problems.append(Problem(problem.path, problem.message + where))
        for i, impairment in enumerate(scenario.impairments):
            if impairment.link != "all" and frozenset(impairment.link) not in cabled:
                problems.append(Problem(("impairments", i, "link"), f"{impairment.link[0]} and "
                                        f"{impairment.link[1]} are not cabled together{where}"))
        if setup.anycast is not None:
            problem = anycast_problem(fabric, setup.anycast, setup.routing)
            if problem:
                problems.append(Problem(("anycast",), problem))
    return problems


def ecn_path_for(setups, scenario: Scenario, platform) -> str | None:
    """How this machine marks and counts queues (red-qdisc or ebpf), decided once for every
    setup that has a queue; None when none has."""
    if not any(setup.queue is not None for setup in setups):
        return None

    prefer = scenario.queue.path if scenario.queue is not None else None
    try:
        return choose_ecn_path(platform, prefer, object_built=object_is_current())
    except ConfigError as err:
        raise ConfigError("queue.path", err.problem) from None
    except TestbedError:
        raise
