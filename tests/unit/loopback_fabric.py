"""A running fabric for training experiments' ``measure`` without root: every rank program an
experiment starts runs for real as a local process on 127.0.0.1, its addresses rewritten
(each rank its own free port, gloo on ``lo``) by the one stand-in fabric, while the emulator's
Watch is the stand-in whose verdict is given (tests/unit/stand_ins.py)."""
from __future__ import annotations

import os
import subprocess
from pathlib import Path

from testbed.harness.experiment import Setup
from tests.unit.ranks import REPO, free_ports
from tests.unit.stand_ins import StandInFabric, StandInRun, StandInWatch


class LoopbackStart:
    """How StandInFabric starts a rank program here: with loopback addresses. ``--hosts
    ip,ip,..`` becomes 127.0.0.1 with a free port per rank (the same for every rank of one
    launch), ``--ifname X`` becomes ``lo``."""

    def __init__(self):
        self._ports: dict[tuple, list[int]] = {}

    def loopback_argv(self, argv: list[str]) -> list[str]:
        out = list(argv)
        if "--hosts" in out:
            i = out.index("--hosts")
            ips = out[i + 1].split(",")
            port = out[out.index("--port") + 1] if "--port" in out else ""
            key = (out[i + 1], port, out[out.index("-m") + 1])
            rank = int(out[out.index("--rank") + 1])
            if rank == 0 or key not in self._ports:
                self._ports[key] = free_ports(len(ips) + 1)
            ports = self._ports[key]
            if "torch_ddp" in out[out.index("-m") + 1]:
                out[i + 1] = ",".join("127.0.0.1" for _ in ips)
                out[out.index("--port") + 1] = str(ports[-1])
            else:
                out[i + 1] = ",".join(f"127.0.0.1:{p}" for p in ports[:len(ips)])
        if "--ifname" in out:
            out[out.index("--ifname") + 1] = "lo"
        return out

    def __call__(self, host: str, argv: list[str], kwargs: dict) -> subprocess.Popen:
        env = {**(kwargs.pop("env", None) or os.environ), "PYTHONPATH": str(REPO)}
        return subprocess.Popen(self.loopback_argv(argv), cwd=REPO, env=env, **kwargs)


class LoopbackRun(StandInRun):
    """A SetupRun around the stand-in fabric starting rank programs on loopback
    (LoopbackStart), whose Watch saw every link direction carry 1 Mbit/s."""

    def __init__(self, fabric, workdir: Path, setup_name: str = "fabric", queue=None):
        net = StandInFabric(fabric, workdir, queue=queue, start=LoopbackStart())
        watch = StandInWatch(rates={f"{link.a}->{link.b}": 1.0 for link in fabric.links})
        super().__init__(net, Setup(setup_name, fabric, queue=queue), workdir, watch)


def measure_setups(resolved, folder: Path) -> dict[str, dict]:
    """Every setup of a resolved scenario measured as the harness would (each in a folder of
    its own, its ``dir`` added), on loopback fabrics."""
    results = {}
    for setup in resolved.setups:
        workdir = folder / setup.name
        workdir.mkdir(parents=True, exist_ok=True)
        run = LoopbackRun(setup.fabric, workdir, setup.name, setup.queue)
        results[setup.name] = {**resolved.experiment.measure(run), "dir": str(workdir)}
    return results
