"""The Python API's live fabric (``LiveFabric``, ``up``): a fabric brought up from a scenario
or a topology and kept up, its hosts used as Mininet hosts, commands, workloads and whole
experiments run on it, its metrics read, then taken down. ``testbed.api`` is its public face;
``testbed up`` (testbed.interactive.session) keeps one up between commands.

A fabric comes up exactly as a setup of ``testbed run`` does (testbed.harness.run.bring_up):
under the machine's run lock and ledger, built, every host pair proven reachable, OVS's
select groups checked. Leaving the ``with`` block, an exception, Ctrl-C or SIGTERM take
everything down; a process killed outright leaves the ledger for ``testbed clean``. The
fabric's files (fabric.json, controller.log, OVS logs) go to ``fab.workdir``, each
``fab.run`` to a folder of its own below it. Everything needs root. docs/api.md has the whole
API.
"""
from __future__ import annotations

import os
import subprocess
import threading
import time
from contextlib import ExitStack, contextmanager
from pathlib import Path

from testbed.apply.state import process_start_ticks
from testbed.errors import ConfigError, TestbedError
from testbed.experiments.registry import experiment_classes, load, validate
from testbed.harness.progress import Progress, QuietProgress
from testbed.harness.run import (
    add_fabric_records,
    bring_up,
    give_to_invoking_user,
    interrupts_as_exceptions,
    machine,
    measure_setup,
    new_run_id,
    recorded,
    start_summary,
    write_config,
)
from testbed.interactive.attach import Attached, SessionState, links_not_up, read_operstate
from testbed.interactive.shell import FabricShell
from testbed.measure.telemetry import (
    CLOCK_TICKS_PER_S,
    CpuTimes,
    Series,
    cpu_times,
    link_directions,
    process_cpu_ticks,
    read_int,
    window_rates_mbit,
)
from testbed.system.ovs_tables import parse_flows, parse_groups

SETUP_FIELDS = ("fabric", "routing", "queue", "tcp", "sysctls", "anycast")
METRICS_INTERVAL_S = 1.0


def scenario_data(scenario: str | Path | None = None, *, topology: str | dict | None = None,
                  rate_mbit: float | None = None, mtu_bytes: int | None = None,
                  routing: str | None = None, results_dir: str | Path | None = None,
                  overrides: dict | None = None) -> tuple[str | None, dict]:
    """The scenario source (a file or bundled name, None for none) and the dotted field
    overrides the keyword arguments of ``up`` make; without a scenario the topology is the
    scenario (``{"name": "fattree", "k": 4}``, or a family name with its defaults)."""
    fields = dict(overrides or {})
    if topology is not None:
        fields["topology"] = {"name": topology} if isinstance(topology, str) else dict(topology)
    for name, value in (("link_rate_mbit", rate_mbit), ("mtu_bytes", mtu_bytes),
                        ("routing", routing), ("results_dir", results_dir)):
        if value is not None:
            fields[name] = str(value) if name == "results_dir" else value
    if scenario is None and "topology" not in fields:
        raise ConfigError("topology", "give a scenario or a topology to bring up")
    return (None if scenario is None else str(scenario)), fields


def resolve_scenario(source: str | None, fields: dict):
    """A testbed.harness.experiment.Resolved for ``up``: the scenario file with ``fields``
    set, or a scenario of the fields alone (named after the topology)."""
    if source is not None:
        return load(source, fields)
    topology = fields["topology"]
    return validate({"name": str(topology.get("name", "fabric")), **fields}, "testbed.api.up")


def run_data(scenario, experiment: str, params: dict | None = None) -> dict:
    """The scenario ``fab.run(experiment, params)`` validates: the live fabric's scenario
    (its topology, rate, queue...) with ``experiment`` put in and, as its params, the
    experiment's defaults scenario's (the ones ``testbed EXPERIMENT`` and ``testbed run``
    take) updated with ``params``; the fabric's own params belong to its experiment."""
    data = scenario.model_dump(mode="json", exclude_unset=True)
    cls = experiment_classes().get(experiment)  # an unknown name: validate names it
    defaults = (cls.defaults().get("params") or {}) if cls is not None else {}
    data.update(experiment=experiment, params={**defaults, **(params or {})})
    return data


def choose_setup(resolved, name: str | None = None):
    """The setup to bring up: the one the scenario has, or the one named."""
    setups = {s.name: s for s in resolved.setups}
    if name is None and len(setups) == 1:
        return resolved.setups[0]
    if name in setups:
        return setups[name]
    what = "name one with setup=" if name is None else f"no setup {name!r}"
    raise ConfigError("setup", f"{what}; {resolved.scenario.name} has {', '.join(setups)}")


def setup_differences(setups: list, live) -> list[str]:
    """Why an experiment's setups cannot be measured on the live setup: it must measure on
    one fabric, the same in everything that was built (fabric, routing, queue, hosts' TCP,
    sysctls, anycast)."""
    if len(setups) != 1:
        return [f"it measures on {len(setups)} fabrics of its own "
                f"({', '.join(s.name for s in setups)})"]
    return [f"its {name} differs" for name in SETUP_FIELDS
            if getattr(setups[0], name) != getattr(live, name)]


def link_rates_mbit(before: dict[str, int], after: dict[str, int],
                    interval_s: float) -> dict[str, float]:
    """Each link direction's mean rate between two readings of its byte counter."""
    series = Series(t_s=[0.0, interval_s],
                    link_bytes={label: [before[label], after[label]] for label in after})
    return window_rates_mbit(series, 0.0, interval_s)


class MininetView:
    """What Mininet's reachability helpers (mininet.net.Mininet.ping) read of a network."""

    def __init__(self, hosts: list):
        from mininet.net import Mininet

        self.hosts = hosts
        self._parsePing = Mininet._parsePing


class LiveFabric:
    """A fabric brought up from a resolved scenario (testbed.harness.experiment.Resolved) and
    kept up until ``close()``; use as ``with LiveFabric(...) as fab:`` or through ``up()``.

    ``setup`` names which of the scenario's setups to bring up (needed only when it has
    several); ``log`` gets the progress lines (none by default); ``run_id`` and ``workdir``
    default to a new run id and a folder of that name in the scenario's results folder."""

    def __init__(self, resolved, setup: str | None = None, *, log=None,
                 run_id: str | None = None, workdir: Path | None = None):
        self.resolved = resolved
        self.setup = choose_setup(resolved, setup)
        self.log = log or (lambda message: None)
        self.progress = Progress(log, live=False) if log else QuietProgress()
        self.run_id = run_id or new_run_id(resolved.scenario.name)
        self.workdir = Path(workdir or Path(resolved.scenario.results_dir) / self.run_id)
        self.live = None  # testbed.harness.run.LiveSetup, while up
        self._stack: ExitStack | None = None

    # -- up and down --------------------------------------------------------------------------
    def start(self) -> LiveFabric:
        """Take the machine (run lock and ledger), bring the setup up and prove it ready."""
        if self._stack is not None:
            raise TestbedError(f"fabric {self.run_id} is already up")
        stack = ExitStack()
        try:
            if threading.current_thread() is threading.main_thread():
                stack.enter_context(interrupts_as_exceptions())
            ledger = stack.enter_context(machine(self.run_id, self.log))
            write_config(self.workdir, {
                "scenario": self.resolved.scenario.model_dump(mode="json"),
                "params": self.resolved.experiment.params.model_dump(mode="json")})
            self.live = stack.enter_context(bring_up(self.resolved, self.setup, ledger,
                                                     self.workdir, self.log))
        except BaseException:
            stack.close()
            raise
        self._stack = stack
        return self

    def close(self) -> None:
        """Take everything down (safe to call twice); the folder goes to the user who ran
        sudo."""
        stack, self._stack = self._stack, None
        if stack is None:
            return
        try:
            stack.close()
        finally:
            self.live = None
            give_to_invoking_user(self.workdir)

    def __enter__(self) -> LiveFabric:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.close()

    # -- what is there ------------------------------------------------------------------------
    @property
    def net(self):
        """The running testbed.apply.network.FabricNetwork."""
        if self.live is None:
            raise TestbedError("the fabric is not up")
        return self.live.net

    @property
    def description(self):
        """The fabric's description (testbed.model.topology.base.Fabric): nodes, links,
        addresses."""
        return self.setup.fabric

    @property
    def hosts(self) -> list:
        """Every host, a mininet.node.Host, in the description's order (Mininet's
        ``net.hosts``)."""
        return [self.net.host(node.name) for node in self.description.hosts]

    @property
    def switches(self) -> list[str]:
        """The switches' names (OVS bridges, not Mininet nodes)."""
        return [node.name for node in self.description.switches]

    def host(self, name: str):
        """The mininet.node.Host called ``name``: ``IP()``, ``MAC()``, ``defaultIntf()``,
        ``intfNames()``, ``cmd()``, ``popen()`` work as in Mininet."""
        if name in self.switches:
            raise KeyError(f"{name} is a switch (an OVS bridge), not a host: see "
                           "dump_flows and dump_groups")
        if name not in self.net.hosts:
            raise KeyError(f"no host {name}")
        return self.net.host(name)

    def get(self, *names: str):
        """One host, or a list of them, as Mininet's ``net.get``."""
        hosts = [self.host(name) for name in names]
        return hosts[0] if len(hosts) == 1 else hosts

    def __getitem__(self, name: str):
        return self.host(name)

    def __contains__(self, name: str) -> bool:
        return name in self.description.nodes

    def attached(self):
        """This fabric as testbed.interactive.attach.Attached: what ``testbed cli`` works on."""
        return Attached(self.description, {name: h.pid for name, h in self.net.hosts.items()},
                        self.net.switchd, self.net.workdir)

    # -- commands and workloads ----------------------------------------------------------------
    def _name(self, host) -> str:
        return host if isinstance(host, str) else host.name

    def popen(self, host, argv: list[str], **kwargs) -> subprocess.Popen:
        """Start ``argv`` on a host (a name or a Host); recorded in the run's ledger, so it
        goes with the fabric."""
        return self.net.popen(self._name(host), argv, **kwargs)

    def exec(self, host, argv: list[str], timeout_s: float | None = None
             ) -> subprocess.CompletedProcess:
        """Run ``argv`` on a host to its end; its exit status and output (text)."""
        proc = self.popen(host, argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          text=True)
        try:
            out, err = proc.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            raise TestbedError(f"{self._name(host)}: {argv[0]} ran over {timeout_s:g} s") \
                from None
        return subprocess.CompletedProcess(argv, proc.returncode, out, err)

    def ping_all(self) -> tuple[int, int]:
        """The testbed's reachability probe (each host pings the next half of the hosts):
        (probes, answered)."""
        return self.net.ping_all()

    def ping(self, hosts: list | None = None, timeout: str | None = None) -> float:
        """Mininet's ``net.ping``: every ordered pair of ``hosts`` (default all), one ping
        each, printed as Mininet prints it; returns the loss in percent."""
        from mininet.net import Mininet

        return Mininet.ping(MininetView(self.hosts), hosts=hosts, timeout=timeout)

    def pingAll(self, timeout: str | None = None) -> float:  # noqa: N802 (Mininet's name)
        """Mininet's ``net.pingAll``: ``ping`` over every host."""
        return self.ping(timeout=timeout)

    def iperf(self, client, server, seconds: int = 5) -> float:
        """Mbit/s ``server`` received from one iperf3 TCP flow from ``client`` (names or
        Hosts). Unlike Mininet's ``net.iperf``, a number, and iperf3."""
        return self.attached().iperf(self._name(client), self._name(server), seconds)

    def run(self, experiment: str, params: dict | None = None):
        """An experiment's measurement on this fabric (its ``measure``, as ``testbed run``
        would run it on a fabric like this one), its checks and the emulator's trust judged,
        its summary.json, report and plots written to a folder below ``workdir``. Returns a
        testbed.harness.run.Outcome. The experiment sees the scenario this fabric came from
        with ``experiment`` and its parameters put in (``run_data``), and must measure on one
        fabric equal to this one."""
        data = run_data(self.resolved.scenario, experiment, params)
        resolved = validate(data, f"{experiment} on {self.run_id}")
        problems = setup_differences(resolved.setups, self.setup)
        if problems:
            raise TestbedError(f"{experiment} cannot measure on this fabric: "
                               f"{'; '.join(problems)}; run it with `testbed run`")
        (setup,) = resolved.setups
        live = self.live
        if live is None:
            raise TestbedError("the fabric is not up")
        run_id = new_run_id(f"{resolved.scenario.name}-{experiment}")
        folder = self.workdir / "runs" / run_id
        summary = start_summary(resolved, run_id, folder)
        summary["fabric_run_id"] = self.run_id

        def measure(results: dict) -> None:
            write_config(folder, summary)
            result = measure_setup(resolved, setup, live, folder, self.log, self.progress)
            results[setup.name] = add_fabric_records(result, live.net, self.workdir,
                                                     self.description)

        self.log(f"run {run_id}: {resolved.experiment.headline()}")
        return recorded(summary, resolved.experiment, folder, self.log, measure)

    # -- failures -------------------------------------------------------------------------------
    def link_down(self, a: str, b: str) -> float:
        """Cut the cable between nodes ``a`` and ``b``; the monotonic time just before."""
        return self.net.set_link(a, b, up=False)

    def link_up(self, a: str, b: str) -> float:
        return self.net.set_link(a, b, up=True)

    def switch_down(self, name: str) -> float:
        """Fail a switch: every port down, its OpenFlow connection dropped."""
        return self.net.set_switch(name, up=False)

    def switch_up(self, name: str) -> float:
        return self.net.set_switch(name, up=True)

    # -- what it does ---------------------------------------------------------------------------
    def metrics(self, interval_s: float = METRICS_INTERVAL_S) -> dict:
        """The fabric over the next ``interval_s``: every link direction's rate (Mbit/s) and
        utilisation of its configured rate, the machine's and ovs-vswitchd's CPU; and so far:
        packets dropped by the emulated queues, the switches' packet counters, the links
        that are down, ECN marking counters per port and PFC (when the queues have them)."""
        net = self.net
        directions = link_directions(self.description)
        pids = net.switchd.pids

        def reading() -> tuple[float, dict[str, int], CpuTimes, int]:
            return (time.monotonic(), {d.label: read_int(d.counter_path) for d in directions},
                    cpu_times(), process_cpu_ticks(pids))

        t0, bytes0, cpu0, vsw0 = reading()
        time.sleep(interval_s)
        t1, bytes1, cpu1, vsw1 = reading()
        ticks = max(cpu1.total - cpu0.total, 1)
        rates = link_rates_mbit(bytes0, bytes1, t1 - t0)
        return {
            "interval_s": round(t1 - t0, 3),
            "link_rate_mbit": rates,
            "link_utilisation": {d.label: rates[d.label] / d.rate_mbit for d in directions
                                 if d.rate_mbit},
            "cpu_busy_fraction": (cpu1.busy - cpu0.busy) / ticks,
            "cpu_stolen_fraction": (cpu1.steal - cpu0.steal) / ticks,
            "vswitchd_cores": (vsw1 - vsw0) / CLOCK_TICKS_PER_S / (t1 - t0),
            "queue_drops": net.queue_drops(),
            "switch_packets": net.switch_counters(),
            "links_down": [f"{link.a}-{link.b}" for link, down
                           in links_not_up(self.description, read_operstate) if down],
            "ecn": net.ecn_counters() if net.ecn_path is not None else None,
            "pfc": net.pfc_summary() if net.lossless else None,
        }

    def dump_flows(self, switch: str) -> list:
        """A switch's flows as OVS holds them (testbed.system.ovs_tables.FlowEntry)."""
        return parse_flows(self.attached().dump_flows(switch))

    def dump_groups(self, switch: str) -> list:
        """A switch's groups as OVS holds them (testbed.system.ovs_tables.GroupEntry)."""
        return parse_groups(self.attached().dump_groups(switch))

    def cli(self) -> int:
        """The ``testbed cli`` prompt on this fabric, on this terminal; returns how many
        commands failed."""
        return FabricShell(self.attached()).loop()

    # -- for testbed up -------------------------------------------------------------------------
    def session_state(self, source: str) -> SessionState:
        """What the holder of this fabric publishes (testbed.interactive.attach.SessionState)."""
        net = self.net
        return SessionState(
            run_id=self.run_id, scenario=self.resolved.scenario.name, source=source,
            setup=self.setup.name, workdir=str(self.workdir.resolve()), holder_pid=os.getpid(),
            holder_start_ticks=process_start_ticks(os.getpid()),
            hosts={name: h.pid for name, h in net.hosts.items()},
            host_start_ticks={name: process_start_ticks(h.pid) for name, h in net.hosts.items()},
            ips={node.name: node.ip for node in self.description.hosts},
            switches=self.switches, datapath=net.datapath,
            ovs_rundir=str(net.switchd.rundir) if net.datapath == "user" else None,
            controller_port=net.controller.port)



@contextmanager
def up(scenario: str | Path | None = None, *, topology: str | dict | None = None,
       rate_mbit: float | None = None, mtu_bytes: int | None = None,
       routing: str | None = None, setup: str | None = None,
       results_dir: str | Path | None = None, overrides: dict | None = None, log=None):
    """A fabric up for the ``with`` block, down after it however it ends.

    ``scenario``: a scenario file or a bundled scenario's name; or, without one,
    ``topology``: a family name (``"fattree"``) or a topology section (``{"name": "fattree",
    "k": 4}``). ``rate_mbit``, ``mtu_bytes``, ``routing``, ``results_dir`` and ``overrides``
    (dotted scenario fields, e.g. ``{"queue.classes": True}``) set scenario fields; ``setup``
    picks one of a scenario's several fabrics; ``log`` gets progress lines (e.g. ``print``)."""
    source, fields = scenario_data(scenario, topology=topology, rate_mbit=rate_mbit,
                                   mtu_bytes=mtu_bytes, routing=routing,
                                   results_dir=results_dir, overrides=overrides)
    with LiveFabric(resolve_scenario(source, fields), setup, log=log) as fab:
        yield fab
