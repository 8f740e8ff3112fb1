"""Stand-ins for what tests touch on a running fabric and on the machine, so unit tests can
drive experiments, the ``testbed`` command, the run lifecycle, the Python API and ``testbed up``
without root: a Watch whose fidelity verdict is given, a SetupRun around a stand-in network,
``run_scenario`` replaced by a recorder; the machine's lock and ledger, FabricNetwork, Mininet
hosts without a shell, and a small experiment measuring on them. Nothing here starts a
process, a namespace or a switch."""
from __future__ import annotations

from contextlib import contextmanager, nullcontext
from pathlib import Path
from types import SimpleNamespace

import pytest

import testbed.apply.network
import testbed.harness.registry
import testbed.harness.run
from testbed.apply.network import Timings
from testbed.controllers.routing.fabric_state import FabricState
from testbed.errors import TestbedError
from testbed.harness.experiment import Experiment, Setup, SetupRun
from testbed.harness.progress import QuietProgress
from testbed.harness.run import Outcome
from testbed.measure.fidelity import judge
from testbed.model.verdict import Verdict, holds

WINDOW_OFFSET_S = 100.0  # the stand-in sampler started this long before CLOCK_MONOTONIC's 0


class StandInWatch:
    """testbed.measure.fidelity.Watch with nothing sampled: no switch lost a packet, the CPU
    was 30% busy and the busiest link carried 98% of its rate; ``asked`` keeps what the
    verdict was asked about."""

    switches = {"rx_packets": 1000, "tx_packets": 1000, "queue_drops": 0}
    t_start, t_end = 1.0, 2.0

    def __init__(self):
        self.asked = None

    def __enter__(self) -> StandInWatch:
        return self

    def __exit__(self, *exc) -> None:
        pass

    def window_s(self, t0_monotonic: float, t1_monotonic: float) -> tuple[float, float]:
        return t0_monotonic - WINDOW_OFFSET_S, t1_monotonic - WINDOW_OFFSET_S

    def emulator_lost(self) -> int:
        return 0

    def verdict(self, window_s=None, bottleneck=None, bandwidth_bound=True, setup=None):
        self.asked = (window_s, bottleneck, bandwidth_bound)
        return judge(0.3, 1.0, 0.98, 0.0, bandwidth_bound, setup)


class StandInRun:
    """testbed.harness.experiment.SetupRun around a stand-in network: quiet, its queues not
    monitored, its Watch ``watched``."""

    def __init__(self, net, setup, workdir: Path):
        self.net, self.setup, self.workdir = net, setup, workdir
        self.log = lambda message: None
        self.progress = QuietProgress()
        self.watched = StandInWatch()

    def watch(self) -> StandInWatch:
        return self.watched

    def queues(self, report: dict):
        return nullcontext()


def record_runs(monkeypatch) -> list:
    """Replace ``run_scenario``: the scenarios the command resolves are kept in the returned
    list instead of run."""
    runs = []

    def fake_run(resolved, log=print, progress=None):
        runs.append(resolved)
        summary = {"run_id": "r1", "title": "t", "headline": "h", "status": "complete",
                   "error": None, "results_dir": "results/r1", "rows": [], "verdict": None}
        return Outcome(summary, Path("results/r1"), Verdict())

    monkeypatch.setattr(testbed.harness.run, "run_scenario", fake_run)
    return runs


def shell_less_host(name: str, answers: dict[str, str] | None = None):
    """A mininet.node.Host with Mininet's own bookkeeping but no shell: ``cmd`` records the
    command line it would send and answers from ``answers`` (first key found in it)."""
    from mininet.node import Host

    host = Host.__new__(Host)
    host.name, host.inNamespace, host.params = name, True, {}
    host.intfs, host.ports, host.nameToIntf = {}, {}, {}
    host.pid, host.shell, host.waiting = 1000 + len(name), None, False
    host.commands = []

    def cmd(*args, **kwargs):
        line = " ".join(str(a) for a in args)
        host.commands.append(line)
        return next((text for key, text in (answers or {}).items() if key in line), "")

    host.cmd = cmd
    return host


class StandInSwitchd:
    """Answers dump-groups with as many select groups as the controller computed."""

    pids: list[int] = []
    rundir = Path("/run/testbed/ovs")

    def __init__(self, fabric, routing):
        self.tables = FabricState(fabric, routing).tables

    def dump_groups(self, bridge: str) -> str:
        return "\n".join(f" group_id={i},type=select,bucket=actions=output:1"
                         for i in range(len(self.tables[bridge].groups)))

    def describe(self) -> dict:
        return {"processes": 1, "datapath_type": "netdev", "bridges_per_process": [20],
                "pinned_cpus": [0], "allocator": "tcmalloc"}


class StandInNetwork:
    """What the harness and the API use of testbed.apply.network.FabricNetwork; its hosts
    are shell-less Mininet hosts, ``popen`` starts nothing: it records the argv and answers
    with a process that has finished (``FinishedProcess``)."""

    made: list[StandInNetwork] = []

    def __init__(self, fabric, workdir, ledger, datapath="user", routing="ecmp", log=print,
                 queue=None, ecn_path=None, host_sysctls=None, impairments=None, losses=(),
                 userspace_tso=False, switchd_shards=None, pin_cpus=True, min_host_cpus=1):
        from testbed.plan.shards import CpuLayout

        self.fabric, self.workdir, self.ledger = fabric, workdir, ledger
        self.cpu_layout = (CpuLayout((0,), (1,)) if pin_cpus and min_host_cpus <= 1
                           else CpuLayout())
        self.pin_cpus, self.min_host_cpus = pin_cpus, min_host_cpus
        self.datapath, self.routing = datapath, routing
        self.switchd = StandInSwitchd(fabric, routing)
        self.timings = Timings(build_s=1.0, programmed_s=0.5)
        self.hosts = {h.name: shell_less_host(h.name) for h in fabric.hosts}
        self.links_set: list[tuple[str, str, bool]] = []
        self.started: list[tuple[str, list[str]]] = []
        self.stopped = False
        self.marking = self.pfc = None
        self.controller = SimpleNamespace(port=6653)
        self.vital: list = []  # (name, process) pairs the watchdog watches
        self.workload_ended = False
        Path(workdir).mkdir(parents=True, exist_ok=True)
        fabric.dump_json(Path(workdir) / "fabric.json")  # as the network writes it
        StandInNetwork.made.append(self)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stopped = True
        self.timings.stop_s = 0.25

    def host(self, name):
        return self.hosts[name]

    def ping_all(self):
        n = len(self.fabric.hosts)
        return n * (n // 2), n * (n // 2)

    def set_link(self, a, b, up):
        self.links_set.append((a, b, up))
        return 1.5

    def vital_daemons(self):
        return list(self.vital)

    def end_workload(self):
        self.workload_ended = True

    def popen(self, host, argv, **kwargs):
        self.started.append((host, argv))
        return FinishedProcess(f"{host} ran {' '.join(argv)}\n")


class FinishedProcess:
    """A subprocess.Popen whose command has already exited with ``returncode``."""

    def __init__(self, out: str, returncode: int = 0):
        self.out, self.returncode = out, returncode

    def communicate(self, timeout=None):
        return self.out, ""

    def poll(self):
        return self.returncode

    def kill(self):
        pass

    def wait(self, timeout=None):
        return self.returncode


class StandInExperiment(Experiment):
    """Measures nothing on the scenario's one fabric: ``value`` 7, or an error when
    ``fail_with`` is set on the class."""

    name = "standin"
    title = "stand-in"
    fail_with: str | None = None
    runs: list[SetupRun] = []

    def setups(self):
        return [self.scenario_setup()]

    def measure(self, run: SetupRun) -> dict:
        StandInExperiment.runs.append(run)
        if self.fail_with:
            raise TestbedError(self.fail_with)
        return {"value": 7}

    def checks(self, results):
        return [holds("value measured", results["fabric"]["value"] == 7)]

    def rows(self, results):
        return [("value", str(results["fabric"]["value"]))]


class TwoFabrics(StandInExperiment):
    """Measures on two fabrics of its own, as the comparison experiments do."""

    name = "standin-two"

    def setups(self):
        return [Setup("narrow", self.fabric(rate_mbit=1.0)), Setup("wide", self.fabric())]


class StandInLedger:
    """The run ledger as far as the harness writes to it during a run: the phases it
    enters, in order (``StandInLedger.phases``, across ledgers)."""

    phases: list[str] = []

    def set_phase(self, phase: str) -> None:
        StandInLedger.phases.append(phase)


@pytest.fixture
def standins(monkeypatch):
    """The machine's lock and ledger (and the root and Mininet check before them),
    FabricNetwork, and two stand-in experiments in the registry; returns the run ids the lock
    was taken for."""
    held = []

    @contextmanager
    def machine(run_id, log=print):
        held.append(run_id)
        yield StandInLedger()

    StandInNetwork.made = []
    StandInExperiment.runs = []
    StandInLedger.phases = []
    monkeypatch.setattr(StandInExperiment, "fail_with", None)
    monkeypatch.setattr(testbed.harness.run, "machine", machine)
    monkeypatch.setattr(testbed.harness.run, "check_can_build", lambda: None)
    monkeypatch.setattr(testbed.apply.network, "FabricNetwork", StandInNetwork)
    monkeypatch.setitem(testbed.harness.registry.EXPERIMENTS, "standin",
                        "tests.unit.stand_ins:StandInExperiment")
    monkeypatch.setitem(testbed.harness.registry.EXPERIMENTS, "standin-two", "tests.unit.stand_ins:TwoFabrics")
    return held
