"""A running fabric reached from any process on the machine: by the PIDs of its hosts' shells
(whose network and mount namespaces a command joins with ``mnexec -a PID``), its description
(the fabric.json it was built from) and its OVS. ``testbed exec`` and ``testbed cli`` use it on
the fabric ``testbed up`` keeps (``SessionState``, what its holder publishes); the Python API
(testbed.api) on the fabric it brought up.

The pure parts (argv building, the answers of pingall, the ``links`` and ``net`` listings, the
tables) are functions of plain data; ``Attached`` applies them, and needs root as the fabric
does. Processes it starts in a host live in that host's namespace, which the run's ledger
records, so they go with the fabric whatever becomes of this process.
"""
from __future__ import annotations

import datetime
import json
import os
import subprocess
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path

from testbed.apply import ovs
from testbed.apply.network import set_interfaces
from testbed.apply.state import STATE_DIR, process_start_ticks
from testbed.drive.flows import run_flows
from testbed.errors import TestbedError
from testbed.measure.failover import wait_for_event
from testbed.model.records import EVENTS_FILE
from testbed.model.topology.base import Fabric, Link
from testbed.plan.bring_up import fping_argv, link_interfaces, root_ends
from testbed.system.ovs_tables import parse_flows, parse_groups
from testbed.system.sockets import read_listening_ports

SESSION_PATH = STATE_DIR / "session.json"  # the fabric ``testbed up`` keeps (SessionState)
MNEXEC = "mnexec"
PING_TIMEOUT_MS = 1000
PING_RETRIES = 2  # a probe lost on a busy machine is not a host out of reach
PING_WAIT_S = 60.0  # a whole pingall, before it counts as hung
DEFAULT_IPERF_S = 5  # as Mininet's iperf
# How long ``link down``/``link up`` between two switches waits for the controller to have
# rewritten the switches' flows around the change (its event in the run's events file); under
# software emulation that took longer than the next ping's first probe.
REROUTE_WAIT_S = 10.0


def exec_argv(pid: int, argv: list[str]) -> list[str]:
    """``argv`` run in the network and mount namespaces of process ``pid`` (a host's shell),
    as Mininet's own ``popen`` does, without detaching it from the terminal."""
    if not argv:
        raise TestbedError("no command given")
    return [MNEXEC, "-a", str(pid), *argv]


def ping_report(hosts: list[str], ips: dict[str, str],
                answered: dict[str, set[str]]) -> tuple[list[str], int, int]:
    """Mininet's pingall answer from which addresses each host heard back from: one line per
    host naming the hosts it reached (X for the rest), then the loss; returns the lines,
    probes sent and probes answered."""
    lines = ["*** Ping: testing ping reachability"]
    sent = received = 0
    for host in hosts:
        reached = [other if ips[other] in answered.get(host, set()) else "X"
                   for other in hosts if other != host]
        sent += len(reached)
        received += sum(r != "X" for r in reached)
        lines.append(f"{host} -> {' '.join(reached)}")
    dropped = 100 * (sent - received) / sent if sent else 0
    lines.append(f"*** Results: {int(dropped)}% dropped ({received}/{sent} received)")
    return lines, sent, received


def links_not_up(fabric: Fabric,
                 operstate: Callable[[str], str]) -> list[tuple[Link, list[str]]]:
    """Every link with its root-namespace ends that are not up (``operstate`` reads one
    interface's state): none for a link that is up."""
    return [(link, [intf for intf in root_ends(fabric, link) if operstate(intf) != "up"])
            for link in fabric.links]


def link_lines(fabric: Fabric, operstate: Callable[[str], str]) -> list[str]:
    """Mininet's ``links`` listing: ``a-ethN<->b-ethM (up)``, or ``(DOWN: ...)`` naming the
    root-namespace ends that are not up."""
    lines = []
    for link, down in links_not_up(fabric, operstate):
        state = f"DOWN: {', '.join(down)}" if down else "up"
        lines.append(f"{link.intf(0)}<->{link.intf(1)} ({state})")
    return lines


def net_lines(fabric: Fabric) -> list[str]:
    """Mininet's ``net`` listing: every node, then each of its interfaces with the peer
    interface it is cabled to, by port."""
    ends: dict[str, list[tuple[int, str, str]]] = {name: [] for name in fabric.nodes}
    for link in fabric.links:
        ends[link.a].append((link.a_port, link.intf(0), link.intf(1)))
        ends[link.b].append((link.b_port, link.intf(1), link.intf(0)))
    return [" ".join([name, *(f"{mine}:{peer}" for _, mine, peer in sorted(ends[name]))])
            for name in fabric.nodes]


def plural(count: int, noun: str) -> str:
    return f"{count} {noun}{'' if count == 1 else 's'}"


def group_lines(switch: str, text: str) -> list[str]:
    """``ovs-ofctl dump-groups`` output, one line a group: id, type and buckets."""
    groups = parse_groups(text)
    return [f"{switch}: {plural(len(groups), 'group')}",
            *(f"  group {g.group_id} {g.type}: {' | '.join(g.buckets) or 'no buckets'}"
              for g in groups)]


def flow_lines(switch: str, text: str) -> list[str]:
    """``ovs-ofctl dump-flows`` output, one line a flow: table, priority, counters, match
    and actions."""
    flows = parse_flows(text)
    return [f"{switch}: {plural(len(flows), 'flow')}",
            *(f"  table {f.table} priority {f.priority} packets {f.packets} bytes {f.bytes}"
              f"  {f.match or '*'}  actions={f.actions}" for f in flows)]


def read_operstate(intf: str) -> str:
    """An interface's operational state in this namespace (``up``, ``down``, ...), or
    ``missing``."""
    try:
        return Path(f"/sys/class/net/{intf}/operstate").read_text().strip()
    except OSError:
        return "missing"


@dataclass
class Attached:
    """A running fabric, reached by its description, its hosts' shell PIDs and its OVS
    (testbed.apply.ovs.Switchd: private or the machine's, for ``ovs-ofctl``), and the run
    folder the controller writes its events to (None: not waited on)."""

    fabric: Fabric
    host_pids: dict[str, int]
    switchd: object
    workdir: Path | None = None

    @property
    def ips(self) -> dict[str, str]:
        return {h.name: h.ip for h in self.fabric.hosts}

    @property
    def host_names(self) -> list[str]:
        return [h.name for h in self.fabric.hosts]

    @property
    def switch_names(self) -> list[str]:
        return [s.name for s in self.fabric.switches]

    def pid(self, host: str) -> int:
        if host not in self.host_pids:
            raise TestbedError(f"no host {host}; hosts: {', '.join(self.host_names)}")
        return self.host_pids[host]

    def popen(self, host: str, argv: list[str], **kwargs) -> subprocess.Popen:
        """Start ``argv`` in ``host``'s namespaces (what testbed.drive.flows needs of a
        network)."""
        return subprocess.Popen(exec_argv(self.pid(host), argv), **kwargs)

    def listening_ports(self, host: str) -> set[int]:
        """The TCP ports listening in ``host`` now (what testbed.drive.flows waits on)."""
        return read_listening_ports(self.pid(host))

    def run(self, host: str, argv: list[str], **kwargs) -> subprocess.CompletedProcess:
        """Run ``argv`` in ``host``'s namespaces to its end."""
        return subprocess.run(exec_argv(self.pid(host), argv), **kwargs)

    def reachability(self) -> tuple[list[str], int, int]:
        """Every host pings every other host (one fping per host, all at once, paced);
        Mininet's pingall answer (``ping_report``)."""
        hosts, ips = self.host_names, self.ips

        def probe(host: str) -> set[str]:
            targets = [ips[other] for other in hosts if other != host]
            if not targets:
                return set()
            out = self.run(host, fping_argv(targets, len(hosts), PING_TIMEOUT_MS, PING_RETRIES),
                           capture_output=True, text=True, timeout=PING_WAIT_S)
            return set(out.stdout.split())

        with ThreadPoolExecutor(max(1, len(hosts))) as pool:
            answered = dict(zip(hosts, pool.map(probe, hosts)))
        return ping_report(hosts, ips, answered)

    def iperf(self, client: str, server: str, seconds: int = DEFAULT_IPERF_S) -> float:
        """Mbit/s ``server`` received from one iperf3 TCP flow from ``client``."""
        for host in (client, server):
            self.pid(host)
        rates, errors = run_flows(self, [(client, server)], seconds, 0)
        if errors:
            raise TestbedError(f"iperf3 {client} -> {server}: {errors[0]}")
        return rates[0]

    def set_link(self, a: str, b: str, up: bool):
        """Take the link between nodes ``a`` and ``b`` down or up, as a cut cable; between
        two switches, return once the controller has rerouted around the change (its
        reaction, testbed.measure.openflow.Reaction), or after ``REROUTE_WAIT_S`` with
        None."""
        since_s = time.monotonic()
        set_interfaces(link_interfaces(self.fabric, a, b), up)
        if self.workdir is None or not {a, b} <= set(self.switch_names):
            return None
        found = wait_for_event(Path(self.workdir) / EVENTS_FILE,
                               "link_up" if up else "link_down", since_s, REROUTE_WAIT_S)
        return found[0] if found else None

    def links(self) -> list[str]:
        return link_lines(self.fabric, read_operstate)

    def _switch(self, name: str) -> str:
        if name not in self.switch_names:
            raise TestbedError(f"no switch {name}; switches: {', '.join(self.switch_names)}")
        return name

    def dump_flows(self, switch: str) -> str:
        """``ovs-ofctl dump-flows`` of one switch, as OVS prints it."""
        return self.switchd.dump_flows(self._switch(switch))

    def dump_groups(self, switch: str) -> str:
        """``ovs-ofctl dump-groups`` of one switch, as OVS prints it."""
        return self.switchd.dump_groups(self._switch(switch))


# --- what `testbed up` publishes -----------------------------------------------------------


def now_iso() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


@dataclass
class SessionState:
    """What the holder of a fabric kept up publishes: enough for any process to find it."""

    run_id: str
    scenario: str  # the scenario's name
    source: str  # the scenario file or bundled name ``testbed up`` was given
    setup: str
    workdir: str  # the run folder: fabric.json, controller.log, holder.log, OVS logs
    holder_pid: int
    holder_start_ticks: int
    hosts: dict[str, int]  # host name -> PID of its shell (its namespaces)
    host_start_ticks: dict[str, int]
    ips: dict[str, str]
    switches: list[str]
    datapath: str  # "user" (the run's own OVS, ovs_rundir) or "kernel" (the machine's)
    ovs_rundir: str | None
    controller_port: int
    started_at: str = field(default_factory=now_iso)

    def save(self, path: Path | None = None) -> None:
        path = path or SESSION_PATH
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(asdict(self), indent=1))
        os.replace(tmp, path)

    @classmethod
    def load(cls, path: Path | None = None) -> SessionState | None:
        try:
            return cls(**json.loads((path or SESSION_PATH).read_text()))
        except (OSError, ValueError, TypeError):
            return None

    @staticmethod
    def discard(path: Path | None = None) -> None:
        (path or SESSION_PATH).unlink(missing_ok=True)

    def holder_alive(self) -> bool:
        """Is the recorded holder still that process (not a reused PID)?"""
        return process_start_ticks(self.holder_pid) == self.holder_start_ticks

    def live_hosts(self) -> list[str]:
        return [name for name, pid in self.hosts.items()
                if process_start_ticks(pid) == self.host_start_ticks.get(name)]

    def fabric(self):
        """The description the fabric was built from (its fabric.json)."""
        return Fabric.load_json(Path(self.workdir) / "fabric.json")

    def attach(self):
        """The fabric as testbed.interactive.attach.Attached, for commands from this process."""
        switchd = (ovs.PrivateSwitchd(None, Path(self.ovs_rundir)) if self.ovs_rundir
                   else ovs.SystemSwitchd(None))
        return Attached(self.fabric(), dict(self.hosts), switchd, Path(self.workdir))
