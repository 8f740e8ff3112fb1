"""A running fabric for training experiments' ``measure`` without root: every rank program an
experiment starts runs for real as a local process on 127.0.0.1, its addresses rewritten
(each rank its own free port, gloo on ``lo``), while the emulator's Watch is the stand-in
whose verdict is given (tests/unit/stand_ins.py)."""
from __future__ import annotations

import os
import subprocess
from pathlib import Path

from testbed.harness.experiment import Setup
from tests.unit.ranks import REPO, free_ports
from tests.unit.stand_ins import StandInRun, StandInWatch


class LoopbackWatch(StandInWatch):
    """The stand-in Watch, with link rates: every link direction carried ``mbit`` Mbit/s."""

    def __init__(self, directions: list[str], mbit: float = 1.0):
        super().__init__()
        self.rates = {d: mbit for d in directions}

    def rates_mbit(self, window_s) -> dict[str, float]:
        return dict(self.rates)


class LoopbackNet:
    """What ``measure`` uses of a FabricNetwork: the fabric, ``popen`` (the rank programs,
    run here with loopback addresses: ``launches`` records each argv as started), no PFC,
    no OVS processes."""

    def __init__(self, fabric):
        self.fabric = fabric
        self.pfc = None
        self.switchd = type("Switchd", (), {"pids": []})()
        self.launched: list[tuple[str, list[str]]] = []
        self._ports: dict[tuple, list[int]] = {}

    def loopback_argv(self, argv: list[str]) -> list[str]:
        """``--hosts ip,ip,..`` becomes 127.0.0.1 with a free port per rank (the same for
        every rank of one launch), ``--ifname X`` becomes ``lo``."""
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

    def popen(self, host: str, argv: list[str], **kwargs):
        self.launched.append((host, argv))
        env = {**(kwargs.pop("env", None) or os.environ), "PYTHONPATH": str(REPO)}
        return subprocess.Popen(self.loopback_argv(argv), cwd=REPO, env=env, **kwargs)


class LoopbackRun(StandInRun):
    """A SetupRun around a LoopbackNet, with a LoopbackWatch."""

    def __init__(self, fabric, workdir: Path, setup_name: str = "fabric", queue=None):
        net = LoopbackNet(fabric)
        super().__init__(net, Setup(setup_name, fabric, queue=queue), workdir)
        self.watched = LoopbackWatch([f"{link.a}->{link.b}" for link in fabric.links])


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
