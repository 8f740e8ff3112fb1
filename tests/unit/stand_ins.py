"""Stand-ins for what tests touch on a running fabric and on the machine, so unit tests can
drive experiments, the drivers, measurement, the ``testbed`` command, the run lifecycle, the
Python API and ``testbed up`` without root: the one running fabric (``StandInFabric``, a
testbed.system.running.RunningFabric), a Watch whose fidelity verdict is given, a SetupRun
around them, ``run_scenario`` replaced by a recorder; the machine's lock and ledger, Mininet
hosts without a shell, and a small experiment measuring on them. Nothing here makes a
namespace or a switch, and a process only where a test hands the fabric its own ``start``."""
from __future__ import annotations

import os
import time
from contextlib import contextmanager, nullcontext
from pathlib import Path
from types import SimpleNamespace

import pytest

import testbed.cli
import testbed.experiments.registry
import testbed.harness.run
import testbed.interactive.live
from testbed.apply.network import Timings
from testbed.apply.pfc_agent import EVENTS_FILE as PAUSE_EVENTS_FILE
from testbed.controllers.routing.fabric_state import FabricState
from testbed.errors import TestbedError
from testbed.harness.experiment import Experiment, Setup, SetupRun
from testbed.harness.progress import QuietProgress
from testbed.harness.run import Outcome
from testbed.measure.fidelity import judge
from testbed.model.records import read_json_lines
from testbed.model.verdict import Verdict, holds
from testbed.plan.shards import CpuLayout
from testbed.system.sockets import read_listening_ports

WINDOW_OFFSET_S = 100.0  # the stand-in sampler started this long before CLOCK_MONOTONIC's 0


class StandInWatch:
    """testbed.measure.fidelity.Watch with nothing sampled. Its sampler's clock runs
    ``offset_s`` behind CLOCK_MONOTONIC; every link direction in ``rates`` carried that many
    Mbit/s (``utilisation``: that share of its rate); the verdict finds the CPU ``cpu_busy``
    busy and the busiest link delivering ``delivery`` of its rate (a fraction, or a function of
    the judged window) and no packet lost by a switch. It keeps what it was asked: ``windows``
    (the monotonic windows converted), ``asked`` (the verdict's window, bottleneck and
    bandwidth_bound) and ``asked_setup``."""

    switches = {"rx_packets": 1000, "tx_packets": 1000, "queue_drops": 0}
    t_start, t_end = 1.0, 2.0

    def __init__(self, rates: dict[str, float] | None = None,
                 utilisation: dict[str, float] | None = None, delivery=0.98,
                 cpu_busy: float = 0.3, offset_s: float = WINDOW_OFFSET_S):
        self.rates, self.utilisations = dict(rates or {}), dict(utilisation or {})
        self.delivery, self.cpu_busy, self.offset_s = delivery, cpu_busy, offset_s
        self.windows: list[tuple[float, float]] = []
        self.asked = None
        self.asked_setup = None

    def __enter__(self) -> StandInWatch:
        return self

    def __exit__(self, *exc) -> None:
        pass

    def window_s(self, t0_monotonic: float, t1_monotonic: float) -> tuple[float, float]:
        self.windows.append((t0_monotonic, t1_monotonic))
        return t0_monotonic - self.offset_s, t1_monotonic - self.offset_s

    def rates_mbit(self, window_s) -> dict[str, float]:
        return dict(self.rates)

    def utilisation(self, window_s) -> dict[str, float]:
        return dict(self.utilisations)

    def emulator_lost(self) -> int:
        return 0

    def verdict(self, window_s=None, bottleneck=None, bandwidth_bound=True, setup=None):
        self.asked, self.asked_setup = (window_s, bottleneck, bandwidth_bound), setup
        delivery = self.delivery(window_s) if callable(self.delivery) else self.delivery
        return judge(self.cpu_busy, 1.0, delivery, 0.0, bandwidth_bound, setup)


class StandInRun:
    """testbed.harness.experiment.SetupRun around a stand-in fabric: quiet, its queues not
    monitored, its Watch ``watched`` (a StandInWatch unless one is given)."""

    def __init__(self, net, setup, workdir: Path = Path("."), watch: StandInWatch | None = None):
        self.net, self.setup, self.workdir = net, setup, workdir
        self.log = lambda message: None
        self.progress = QuietProgress()
        self.watched = watch if watch is not None else StandInWatch()

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

    monkeypatch.setattr(testbed.cli, "run_scenario", fake_run)  # where main looks it up
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
        self.fabric, self.routing = fabric, routing

    @property
    def tables(self):
        return FabricState(self.fabric, self.routing).tables

    def dump_groups(self, bridge: str) -> str:
        return "\n".join(f" group_id={i},type=select,bucket=actions=output:1"
                         for i in range(len(self.tables[bridge].groups)))

    def describe(self) -> dict:
        return {"processes": 1, "datapath_type": "netdev", "bridges_per_process": [20],
                "pinned_cpus": [0], "allocator": "tcmalloc"}


class StandInFabric:
    """The unit tests' one running fabric: a testbed.system.running.RunningFabric with no
    machine behind it (tests/unit/system/test_running.py checks it against the protocol, as
    it checks FabricNetwork). It is made as FabricNetwork is, so the harness builds it in
    place of one, with what the harness reads besides (switchd, timings, CPU layout). Its
    hosts are shell-less Mininet hosts; what a test needs of it is set by keywords:

    - ``start(host, argv, kwargs)``: how ``popen`` starts a process. None (the default)
      starts nothing: the argv is recorded and a process that has finished answers
      (``FinishedProcess``); a test that runs programs for real (on loopback, or stand-in
      servers) passes its own;
    - ``answers``: what a host's ``cmd`` prints, by a word of the command line;
    - ``steps``: counters that move on at every reading, by how much (``queue_drops``,
      ``switch_packets``, ``pause_frames``); zero by default;
    - ``marked``: marked ports and the depth the marker's model reads for each (marking on
      ``ecn_path``), with ``ecn_reading(n)`` the ports' counters at the n-th reading and
      ``anchoring`` the eBPF marker's anchoring record;
    - ``pause``: the pause agent's counters (a function called at each reading), which makes
      the fabric lossless; its events are what the test's programs append to the agent's
      events file in ``workdir``;
    - ``vital``: the (name, process) pairs the harness's watchdog watches
      (``vital_daemons``); ``signalled``: the PIDs a failure schedule's stop or kill signals
      (``signal_daemon``), whatever daemon it names.
    Every port is listened on where this process listens, and nothing queues."""

    made: list[StandInFabric] = []

    def __init__(self, fabric, workdir=None, ledger=None, datapath="user",
                 routing="ecmp", log=print, queue=None, ecn_path=None, host_sysctls=None,
                 impairments=None, losses=(), userspace_tso=False, switchd_shards=None,
                 pin_cpus=True, min_host_cpus=1, *, start=None, answers=None, steps=None,
                 marked=None, ecn_reading=None, anchoring=None, pause=None, vital=(),
                 signalled=()):
        self.fabric, self.ledger, self.queue = fabric, ledger, queue
        self.workdir = Path(workdir) if workdir is not None else Path(".")
        self.ecn_path = ecn_path if marked is not None else None
        self.cpu_layout = (CpuLayout((0,), (1,)) if pin_cpus and min_host_cpus <= 1
                           else CpuLayout())
        self.pin_cpus, self.min_host_cpus = pin_cpus, min_host_cpus
        self.datapath, self.routing = datapath, routing
        self.switchd = StandInSwitchd(fabric, routing)
        self.timings = Timings(build_s=1.0, programmed_s=0.5)
        self.hosts = {h.name: shell_less_host(h.name, answers)
                      for h in getattr(fabric, "hosts", [])}
        self.controller = SimpleNamespace(port=6653)
        self.start, self.steps = start, dict(steps or {})
        self.marked, self.ecn_reading, self.pause = marked, ecn_reading, pause
        self.anchoring = anchoring
        self.started: list[tuple[str, list[str]]] = []
        self.envs: list[dict | None] = []
        self.calls: list[tuple] = []  # (what, ..., the monotonic time asked)
        self.links_set: list[tuple[str, str, bool]] = []
        self.readings: dict[str, int] = {}
        self.stopped = False
        self.vital, self.signalled = list(vital), list(signalled)
        self.workloads_ended = 0
        if workdir is not None:  # as the network writes it, where the harness builds one
            self.workdir.mkdir(parents=True, exist_ok=True)
            fabric.dump_json(self.workdir / "fabric.json")
        StandInFabric.made.append(self)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stopped = True
        self.timings.stop_s = 0.25

    def _read(self, counter: str) -> int:
        self.readings[counter] = self.readings.get(counter, 0) + 1
        return self.readings[counter]

    # -- hosts ------------------------------------------------------------------------------
    def host(self, name):
        return self.hosts[name]

    def popen(self, host, argv, **kwargs):
        self.started.append((host, argv))
        self.envs.append(kwargs.get("env"))
        if self.start is None:
            return FinishedProcess(f"{host} ran {' '.join(argv)}\n")
        return self.start(host, argv, kwargs)

    def cmd(self, host, *args):
        return self.hosts[host].cmd(*args)

    def listening_ports(self, host):
        return read_listening_ports(os.getpid())

    def netns(self, host):
        return f"/proc/{os.getpid()}/ns/net"

    def ping_all(self):
        n = len(self.fabric.hosts)
        return n * (n // 2), n * (n // 2)

    # -- links, switches, the controller ----------------------------------------------------
    def set_link(self, a, b, up):
        self.links_set.append((a, b, up))
        self.calls.append(("link", a, b, up, time.monotonic()))
        return 1.5  # the time just before, as the API reports it

    def set_interface(self, intf, up):
        self.calls.append(("interface", intf, up, time.monotonic()))
        return time.monotonic()

    def set_switch(self, name, up):
        self.calls.append(("switch", name, up, time.monotonic()))
        return time.monotonic()

    def restart_controller(self):
        self.calls.append(("controller", time.monotonic()))
        return 0.25

    def impair_link(self, a, b, impairment):
        self.calls.append(("impair", a, b, impairment, time.monotonic()))
        return time.monotonic()

    def signal_daemon(self, daemon, host, sig):
        self.calls.append(("signal", daemon, host, sig, time.monotonic()))
        for pid in self.signalled:
            os.kill(pid, sig)
        return time.monotonic(), list(self.signalled)

    def lose(self, losses):
        self.calls.append(("lose", list(losses), time.monotonic()))

    def loss_counters(self):
        return {"applied": 0, "dropped": 0, "interfaces": {}}

    def failure_losses(self):
        return []

    # -- counters and samples ---------------------------------------------------------------
    def queue_drops(self):
        return self.steps.get("queue_drops", 0) * self._read("queue_drops")

    def switch_counters(self):
        n = self.steps.get("switch_packets", 0) * self._read("switch_packets")
        return {"rx_packets": n, "tx_packets": n, "queue_drops": 0, "impairment_drops": 0}

    def port_queue_drops(self):
        return {intf: 0 for _, _, intf, _ in self.fabric.switch_ends()}

    def wait_switches_drained(self, timeout_s=0.0):
        return 0

    def port_backlogs(self):
        return {}

    def marker_backlogs(self):
        return {}

    def marked_ports(self):
        return list(self.marked or {})

    def ecn_counters(self):
        if self.marked is None:
            return {}
        return self.ecn_reading(self._read("ecn")) if self.ecn_reading else {}

    def marker_depths(self):
        return dict(self.marked or {})

    def ecn_anchoring(self):
        return self.anchoring

    # -- PFC ---------------------------------------------------------------------------------
    @property
    def lossless(self):
        return self.pause is not None

    def pause_counters(self):
        return self.pause() if self.pause is not None else {}

    def pause_agent_running(self):
        return self.lossless

    def pfc_summary(self):
        if not self.lossless:
            raise TestbedError("this fabric runs without PFC (its queue has no pfc thresholds)")
        return {"pause_frames_sent": self.steps.get("pause_frames", 0) * self._read("pfc"),
                "pause_frames_received": 0, "paused_time_s": 0.0, "pause_storms": 0,
                "lossless_drops": 0, "agent_running": True}

    def pause_events(self):
        """What the programs a test starts appended to the pause agent's events file."""
        path = self.workdir / PAUSE_EVENTS_FILE
        return read_json_lines(path) if self.lossless and path.exists() else []

    def paused_spans(self, t0_monotonic, t1_monotonic):
        return {}

    def empty_spans(self, t0_monotonic, t1_monotonic):
        return {}

    def emulator_processes(self):
        return {"ovs-vswitchd": list(self.switchd.pids)}

    # -- what the harness's watchdog asks (testbed.apply.watchdog) ----------------------------
    def vital_daemons(self):
        return list(self.vital)

    def end_workload(self):
        self.workloads_ended += 1


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

    StandInFabric.made = []
    StandInExperiment.runs = []
    StandInLedger.phases = []
    monkeypatch.setattr(StandInExperiment, "fail_with", None)
    for module in (testbed.harness.run, testbed.interactive.live):  # where they are looked up
        monkeypatch.setattr(module, "machine", machine)
    monkeypatch.setattr(testbed.harness.run, "check_can_build", lambda: None)
    monkeypatch.setattr(testbed.harness.run, "FabricNetwork", StandInFabric)
    monkeypatch.setitem(testbed.experiments.registry.EXPERIMENTS, "standin",
                        "tests.unit.stand_ins:StandInExperiment")
    monkeypatch.setitem(testbed.experiments.registry.EXPERIMENTS, "standin-two",
                        "tests.unit.stand_ins:TwoFabrics")
    return held
