"""The os-ken controller as a child process of the run, bound to 127.0.0.1.

It is started before the switches (Mininet switches wait for their controller) and reports
which switches it has programmed through a status file. Its other files, all in the run
directory: failure events (controller-events.jsonl) and port counters polled over OpenFlow
(port-stats.jsonl), read by testbed.measure.openflow; the wiring check's verdicts (wiring.jsonl,
testbed.controllers.routing.wiring); and, when the run directory holds anycast.json (``write_anycast``), the
anycast service it routes.
"""
from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
from pathlib import Path

from testbed.controllers.apps.config import DEFAULT_PORT_STATS_INTERVAL_S
from testbed.errors import TestbedError
from testbed.model.records import (
    ANYCAST_FILE,
    EVENTS_FILE,
    PORT_STATS_FILE,
    WIRING_FILE,
)
from testbed.system.process import stop_process

LISTEN_HOST = "127.0.0.1"
DEFAULT_PORT = 6653
STOP_TIMEOUT_S = 5.0  # the controller exits on SIGTERM within this, or is killed


def write_anycast(workdir: Path, anycast: dict) -> Path:
    """Leave the anycast service ({"service_ip": ..., "replicas": [...]}) where the run's
    controller picks it up when it starts."""
    path = workdir / ANYCAST_FILE
    path.write_text(json.dumps(anycast))
    return path


class ControllerProcess:
    """Runs ``python -m testbed.controllers.apps.launcher`` for a fabric JSON; logs go to ``log_path``.
    Port counters are polled every ``port_stats_interval_s`` (None: not polled); the cabling
    is checked with LLDP unless ``wiring_check`` is False (two frames a switch port per change)."""

    def __init__(self, fabric_json: Path, workdir: Path, port: int = DEFAULT_PORT,
                 routing: str = "ecmp",
                 port_stats_interval_s: float | None = DEFAULT_PORT_STATS_INTERVAL_S,
                 wiring_check: bool = True):
        self.fabric_json = fabric_json
        self.status_path = workdir / "controller-status.json"
        self.log_path = workdir / "controller.log"
        self.events_path = workdir / EVENTS_FILE
        self.port_stats_path = workdir / PORT_STATS_FILE
        self.anycast_path = workdir / ANYCAST_FILE
        self.wiring_path = workdir / WIRING_FILE
        self.wiring_check = wiring_check
        self.port = port
        self.routing = routing
        self.port_stats_interval_s = port_stats_interval_s
        self.proc: subprocess.Popen | None = None

    def argv(self) -> list[str]:
        """The launcher's command line."""
        argv = [sys.executable, "-m", "testbed.controllers.apps.launcher", "--fabric", str(self.fabric_json),
                "--status", str(self.status_path), "--port", str(self.port),
                "--routing", self.routing, "--events", str(self.events_path)]
        if self.port_stats_interval_s is not None:
            argv += ["--port-stats", str(self.port_stats_path),
                     "--port-stats-interval", repr(self.port_stats_interval_s)]
        if self.anycast_path.exists():
            argv += ["--anycast", str(self.anycast_path)]
        if self.wiring_check:
            argv += ["--wiring-check", str(self.wiring_path)]
        return argv

    def start(self, timeout_s: float = 20.0) -> int:
        """Launch the controller and wait until it listens; returns its PID."""
        pid = self.launch()
        self.wait_listening(timeout_s)
        return pid

    def launch(self) -> int:
        """Start the controller process without waiting for it; returns its PID."""
        if port_in_use(self.port):
            raise TestbedError(f"OpenFlow port {LISTEN_HOST}:{self.port} is already in use; "
                               "stop whatever listens there or run `testbed clean`")
        for path in (self.status_path, self.events_path, self.port_stats_path, self.wiring_path):
            path.unlink(missing_ok=True)  # an earlier controller's, in this run directory
        log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(
            self.argv(), stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            start_new_session=True)
        log.close()
        return self.proc.pid

    def wait_listening(self, timeout_s: float = 20.0) -> None:
        deadline = time.monotonic() + timeout_s
        while not port_in_use(self.port):
            if self.proc.poll() is not None:
                raise TestbedError(f"controller exited ({self.proc.returncode}); see {self.log_path}")
            if time.monotonic() > deadline:
                raise TestbedError(f"controller did not listen within {timeout_s:.0f} s; see {self.log_path}")
            time.sleep(0.05)

    def programmed(self) -> set[str]:
        try:
            return set(json.loads(self.status_path.read_text())["programmed"])
        except (OSError, ValueError, KeyError):
            return set()

    def wait_programmed(self, switches: set[str], timeout_s: float = 60.0) -> float:
        """Block until every switch is programmed; returns the seconds waited."""
        t0 = time.monotonic()
        while not switches <= self.programmed():
            if self.proc and self.proc.poll() is not None:
                raise TestbedError(f"controller died ({self.proc.returncode}); see {self.log_path}")
            if time.monotonic() - t0 > timeout_s:
                missing = sorted(switches - self.programmed())
                raise TestbedError(f"controller programmed {len(switches) - len(missing)}/"
                                   f"{len(switches)} switches in {timeout_s:.0f} s; missing "
                                   f"{', '.join(missing[:5])}; see {self.log_path}")
            time.sleep(0.1)
        return time.monotonic() - t0

    def stop(self) -> None:
        stop_process(self.proc, STOP_TIMEOUT_S)


def port_in_use(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.settimeout(0.2)
        return s.connect_ex((LISTEN_HOST, port)) == 0
