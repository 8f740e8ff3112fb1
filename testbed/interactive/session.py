"""A fabric kept up between commands: ``testbed up`` starts a holder process that brings a
scenario's fabric up and keeps it until ``testbed down`` signals it.

Mininet hosts are shells owned by the process that made them, so the fabric lives in a process
that stays: the holder. It runs the Python API's bring-up (testbed.api.LiveFabric: the machine's
run lock and ledger, FabricNetwork, reachability, select groups, exactly as ``testbed run``
brings up a setup), then writes what other processes need to reach the fabric into the state
file /run/testbed/session.json (``SessionState``: its hosts' shell PIDs, whose namespaces
``testbed exec`` and ``testbed cli`` join, its switches, its OVS, its controller port), and
waits. ::

    testbed up SCENARIO --spawns--> holder (own session; log: RUN_FOLDER/holder.log)
      waits on a pipe for "ready"     lock + ledger, fabric up and proven, session.json
      or the bring-up's error         ... waits for a signal ...
    testbed down ----SIGTERM------>   fabric down (FabricNetwork.stop, the ledger swept),
      (PID checked against its         session.json removed, exits
       start time), waits for it

A holder killed outright (SIGKILL) leaves its ledger, and its run lock goes with it, so
``testbed clean`` removes what it left as after any killed run (and the stale session.json).
"""
from __future__ import annotations

import datetime
import json
import os
import select
import signal
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import testbed
from testbed.errors import TestbedError
from testbed.experiments.registry import load
from testbed.harness.run import interrupts_as_exceptions
from testbed.interactive.attach import SessionState
from testbed.interactive.live import LiveFabric

HOLDER_LOG = "holder.log"
READY_TIMEOUT_S = 900.0  # a k=8 fat-tree is up in about 10 s; slow machines take longer
DOWN_TIMEOUT_S = 180.0   # the holder's tear-down, before ``testbed down`` gives up on it
POLL_S = 0.1


def running_session() -> SessionState:
    """The fabric ``testbed up`` keeps, with its holder alive; a one-line error otherwise."""
    state = SessionState.load()
    if state is None:
        raise TestbedError("no fabric is up: start one with `testbed up SCENARIO`")
    if not state.holder_alive():
        raise TestbedError(f"the fabric of run {state.run_id} lost its holder (pid "
                           f"{state.holder_pid}): run `testbed clean` to remove what it left")
    return state


def describe(state: SessionState, fabric, live_hosts: int, now: datetime.datetime) -> list[str]:
    """``testbed status``'s lines for a fabric that is up."""
    started = datetime.datetime.fromisoformat(state.started_at)
    up_s = max(0, int((now - started).total_seconds()))
    ovs = (f"the run's own OVS ({state.ovs_rundir})" if state.ovs_rundir
           else "the machine's OVS")
    hosts = " ".join(f"{name}={ip}" for name, ip in state.ips.items())
    return [
        f"fabric up: run {state.run_id} (scenario {state.scenario}, setup {state.setup}), "
        f"up {up_s // 3600}h{up_s // 60 % 60:02d}m{up_s % 60:02d}s since {state.started_at}",
        f"  {fabric.label()}: {len(fabric.hosts)} hosts ({live_hosts} shells alive), "
        f"{len(fabric.switches)} switches, {len(fabric.links)} links",
        f"  OVS {state.datapath} datapath in {ovs}; controller on 127.0.0.1:"
        f"{state.controller_port}",
        f"  held by pid {state.holder_pid}; files in {state.workdir}",
        f"  hosts: {hosts}",
    ]


def usage_lines(state: SessionState, fabric) -> list[str]:
    """How to use a fabric that has just come up (``testbed up``'s last words), with two of
    its hosts, the first one's switch and a cable of that switch as examples."""
    a, b = fabric.hosts[0].name, fabric.hosts[-1].name
    switch, _ = fabric.host_attachment(a)
    peers = [link.b if link.a == switch else link.a for link in fabric.links
             if switch in (link.a, link.b)]
    uplink = next((peer for peer in peers if not fabric.nodes[peer].is_host), a)
    return [
        f"fabric up: run {state.run_id}, held by pid {state.holder_pid}",
        "  what is up:           testbed status",
        f"  a command on a host:  testbed exec {a} -- ping -c1 {state.ips[b]}",
        f"  a prompt:             testbed cli   ({a} ping {b}, pingall, iperf {a} {b}, links, "
        f"dump-groups {switch}, link down {switch} {uplink}, help)",
        "  take it all down:     testbed down",
        f"log: {Path(state.workdir) / HOLDER_LOG}",
    ]


# --- the holder ----------------------------------------------------------------------------------


@dataclass
class HolderSpec:
    """What ``testbed up`` hands its holder: the scenario as given, with the flags' overrides,
    the setup to bring up, the run id and folder, and the pipe to report readiness on."""

    source: str
    overrides: dict
    setup: str | None
    run_id: str
    workdir: str
    ready_fd: int

    def argv(self) -> list[str]:
        return [sys.executable, "-m", "testbed.interactive.session", json.dumps(asdict(self))]

    @classmethod
    def from_argv(cls, argv: list[str]) -> HolderSpec:
        return cls(**json.loads(argv[0]))


def hold(spec: HolderSpec, log=print) -> int:
    """The holder's life: bring the fabric up, publish it, report ready, wait for a signal,
    take it down. Returns the exit status."""
    os.set_inheritable(spec.ready_fd, False)  # the fabric's processes never hold the pipe
    ready = os.fdopen(spec.ready_fd, "w")

    def report(message: dict) -> None:
        if ready.closed:
            return
        try:
            ready.write(json.dumps(message) + "\n")
            ready.close()
        except BrokenPipeError:  # ``testbed up`` stopped waiting (Ctrl-C): nobody to tell
            log(f"nobody waits for the report {message}")

    log(f"holder pid {os.getpid()}: bringing up {spec.source} (run {spec.run_id})")
    try:
        with interrupts_as_exceptions():
            return hold_fabric(spec, report, log)
    except KeyboardInterrupt:
        report({"error": "interrupted while bringing the fabric up"})
        log("interrupted; everything the fabric had was removed")
        return 130
    except TestbedError as exc:
        report({"error": str(exc)})
        log(f"failed: {exc}")
        return 3
    except BaseException as exc:
        report({"error": repr(exc)})
        raise
    finally:
        state = SessionState.load()
        if state is not None and state.holder_pid == os.getpid():
            SessionState.discard()


def hold_fabric(spec: HolderSpec, report, log) -> int:
    """Up, published, ready, then down at the first SIGTERM, SIGHUP or SIGINT."""
    resolved = load(spec.source, spec.overrides)
    with LiveFabric(resolved, spec.setup, log=log, run_id=spec.run_id,
                workdir=Path(spec.workdir)) as fab:
        fab.session_state(spec.source).save()
        try:
            report({"ready": True})
            log("ready: waiting for `testbed down` (SIGTERM)")
            while True:
                signal.pause()
        except KeyboardInterrupt as stop:
            log(f"{stop or 'interrupted'}: taking the fabric down")
    log("the fabric is down")
    return 0


def holder_environment() -> dict[str, str]:
    """This environment, with the testbed package that runs ``testbed up`` first on the
    holder's import path: the holder runs the same code, wherever it is started from."""
    root = str(Path(testbed.__file__).resolve().parents[1])
    path = os.environ.get("PYTHONPATH")
    return {**os.environ, "PYTHONPATH": root if not path else f"{root}{os.pathsep}{path}"}


def start_holder(spec_without_fd: dict, log_path: Path) -> tuple[subprocess.Popen, int]:
    """Start the holder detached (its own session, so the terminal's Ctrl-C and hang-up do
    not reach it; its output to ``log_path``); returns it and the read end of its pipe."""
    read_fd, write_fd = os.pipe()
    spec = HolderSpec(**spec_without_fd, ready_fd=write_fd)
    try:
        with open(log_path, "ab") as out:
            proc = subprocess.Popen(spec.argv(), stdin=subprocess.DEVNULL, stdout=out,
                                    stderr=subprocess.STDOUT, start_new_session=True,
                                    pass_fds=(write_fd,), env=holder_environment())
    except BaseException:
        os.close(read_fd)
        raise
    finally:
        os.close(write_fd)  # the holder's copy alone: its end, or its death, ends the pipe
    return proc, read_fd


class LogFollower:
    """Calls ``show`` with each complete line appended to a log file since the last call."""

    def __init__(self, path: Path, show):
        self.path = path
        self.show = show
        self.offset = 0
        self.partial = b""

    def __call__(self) -> None:
        try:
            with open(self.path, "rb") as fh:
                fh.seek(self.offset)
                data = fh.read()
        except OSError:
            return
        self.offset += len(data)
        *lines, self.partial = (self.partial + data).split(b"\n")
        for line in lines:
            self.show(line.decode(errors="replace"))


def read_report(read_fd: int, timeout_s: float, meanwhile=lambda: None) -> dict | None:
    """The holder's one-line report, None if it closed the pipe without one (it died);
    TestbedError after ``timeout_s``. ``meanwhile`` is called while waiting (about every
    POLL_S)."""
    data = b""
    deadline = time.monotonic() + timeout_s
    try:
        while b"\n" not in data:
            meanwhile()
            left = deadline - time.monotonic()
            if left <= 0:
                raise TestbedError(f"the fabric was not up after {timeout_s:.0f} s")
            readable, _, _ = select.select([read_fd], [], [], min(left, POLL_S))
            if readable:
                chunk = os.read(read_fd, 4096)
                if not chunk:
                    break
                data += chunk
    finally:
        os.close(read_fd)
    line = data.split(b"\n", 1)[0]
    return json.loads(line) if line else None


def signal_holder(state: SessionState, sig: int = signal.SIGTERM) -> None:
    """Signal the holder, checked against its start time (a reused PID is never signalled)."""
    if not state.holder_alive():
        raise TestbedError(f"the holder of run {state.run_id} (pid {state.holder_pid}) is gone")
    os.kill(state.holder_pid, sig)


def wait_gone(state: SessionState, timeout_s: float = DOWN_TIMEOUT_S) -> bool:
    """Wait for the holder to exit; False if it still runs after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while state.holder_alive():
        if time.monotonic() > deadline:
            return False
        try:
            os.waitpid(state.holder_pid, os.WNOHANG)  # when it is our child (``up`` cancelled)
        except ChildProcessError:
            pass
        time.sleep(POLL_S)
    return True


def main(argv: list[str] | None = None) -> int:
    spec = HolderSpec.from_argv(sys.argv[1:] if argv is None else argv)

    def log(message: str) -> None:
        stamp = datetime.datetime.now().strftime("%H:%M:%S")
        print(f"[{stamp}] {message}", flush=True)

    return hold(spec, log)


if __name__ == "__main__":
    # ``python -m`` runs this file as __main__; the holder runs the module everyone imports,
    # so that there is one SessionState class and one set of its settings.
    from testbed.interactive.session import main as holder_main

    sys.exit(holder_main())
