"""One run per machine, and a ledger of everything a run creates, so any leftover can go.

The lock is an flock on /run/testbed/lock: the kernel releases it when the holder dies, so a
SIGKILLed run never blocks the next one. The ledger (/run/testbed/state.json) is written
*before* each thing is created (names come from the fabric description, PIDs as processes
start), so ``testbed clean`` or the next run can remove exactly what a killed run left and
nothing else: processes by PID (checked against their start time, so a reused PID is never
signalled), OVS bridges by name, interfaces by name, pinned BPF maps by path, OVS itself only
if the run started it, and kernel settings the run changed for a while, back to their old
values. The ledger also says which phase the run is in (``phase``: bring-up, workload,
tear-down), so whoever finds it, or watches it, knows how far the run got.
"""
from __future__ import annotations

import fcntl
import json
import os
import shutil
import signal
import subprocess
import time
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path

from testbed.apply import ovs
from testbed.errors import BusyError

STATE_DIR = Path(os.environ.get("TESTBED_STATE_DIR", "/run/testbed"))
LOCK_PATH = STATE_DIR / "lock"
LEDGER_PATH = STATE_DIR / "state.json"
KILL_GRACE_S = 3.0
BRING_UP, WORKLOAD, TEAR_DOWN = "bring-up", "workload", "tear-down"  # a run's phases
PHASES = (BRING_UP, WORKLOAD, TEAR_DOWN)
BPF_FS = Path("/sys/fs/bpf")  # clean removes recorded pins only below it


def process_start_ticks(pid: int) -> int | None:
    """Start time of a live process in clock ticks since boot (field 22 of /proc/PID/stat);
    None when it is gone or a zombie (dead, waiting for a parent that may never reap it)."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            fields = fh.read().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return None if fields[0] == "Z" else int(fields[19])


def process_state(pid: int) -> str | None:
    """The state letter of a process (field 3 of /proc/PID/stat: R running, S sleeping, T
    stopped by a signal, Z zombie...), None when it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return None


def process_cmdline(pid: int) -> str:
    """A process's command line, its arguments joined by blanks ("" when it is gone)."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            return fh.read().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return ""


def exit_description(returncode: int | None) -> str:
    """How a process ended, from its Popen return code: ``killed by SIGKILL``, ``exited with
    status 2``."""
    if returncode is None:
        return "still running"
    if returncode < 0:
        try:
            return f"killed by {signal.Signals(-returncode).name}"
        except ValueError:
            return f"killed by signal {-returncode}"
    return f"exited with status {returncode}"


@dataclass
class Ledger:
    """What a run created. ``processes`` maps PID -> start ticks."""

    run_id: str
    owner_pid: int
    processes: dict[int, int] = field(default_factory=dict)
    bridges: list[str] = field(default_factory=list)
    interfaces: list[str] = field(default_factory=list)
    netns_inodes: list[int] = field(default_factory=list)
    ovs_started: bool = False
    settings: dict[str, str] = field(default_factory=dict)  # kernel setting path -> value to restore
    pinned: list[str] = field(default_factory=list)  # BPF objects pinned under BPF_FS
    phase: str = ""  # BRING_UP, WORKLOAD or TEAR_DOWN while a run's setup goes through them
    phase_t_monotonic_s: float | None = None  # when that phase began (CLOCK_MONOTONIC)

    def save(self) -> None:
        STATE_DIR.mkdir(parents=True, exist_ok=True)
        tmp = LEDGER_PATH.with_suffix(".tmp")
        tmp.write_text(json.dumps(asdict(self)))
        os.replace(tmp, LEDGER_PATH)

    def set_phase(self, phase: str) -> None:
        """Record that the run entered ``phase`` (one of PHASES), and when."""
        self.phase, self.phase_t_monotonic_s = phase, round(time.monotonic(), 6)
        self.save()

    def add_process(self, pid: int) -> None:
        ticks = process_start_ticks(pid)
        if ticks is not None:
            self.processes[pid] = ticks
            self.save()

    def add_netns(self, pid: int) -> None:
        """Record the network namespace ``pid`` lives in: whatever runs there at clean-up
        time was started by this run (emulated hosts' commands, daemons they spawned)."""
        inode = netns_inode(pid)
        if inode is not None and inode != netns_inode(os.getpid()) and inode not in self.netns_inodes:
            self.netns_inodes.append(inode)
            self.save()

    @contextmanager
    def kernel_settings(self, values: dict[str, str]):
        """Write kernel settings (/proc/sys or /sys files) for the duration of the block, then
        put the old values back; the old values are in the ledger meanwhile, so ``clean``
        restores them after a killed run. Files missing on this kernel are skipped."""
        present = {path: value for path, value in values.items() if os.path.exists(path)}
        for path in present:
            if path not in self.settings:
                self.settings[path] = Path(path).read_text().strip()
        self.save()
        try:
            for path, value in present.items():
                Path(path).write_text(value)
            yield
        finally:
            restore_settings({path: self.settings.pop(path) for path in present})
            self.save()

    def add_names(self, bridges=(), interfaces=(), pinned=()) -> None:
        self.bridges.extend(b for b in bridges if b not in self.bridges)
        self.interfaces.extend(i for i in interfaces if i not in self.interfaces)
        self.pinned.extend(p for p in pinned if p not in self.pinned)
        self.save()

    @classmethod
    def load(cls) -> Ledger | None:
        try:
            data = json.loads(LEDGER_PATH.read_text())
        except (OSError, ValueError):
            return None
        data["processes"] = {int(k): v for k, v in data.get("processes", {}).items()}
        return cls(**data)

    @staticmethod
    def discard() -> None:
        LEDGER_PATH.unlink(missing_ok=True)


class RunLock:
    """Exclusive right to emulate on this machine, held for the life of a run."""

    def __init__(self, run_id: str):
        self.run_id = run_id
        self.fh = None

    def __enter__(self) -> RunLock:
        STATE_DIR.mkdir(parents=True, exist_ok=True)
        fh = open(LOCK_PATH, "a+")
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            fh.seek(0)
            holder = fh.read().strip() or "unknown"
            fh.close()
            raise BusyError(f"another testbed run is active ({holder}); one emulation per "
                            "machine at a time: wait for it to finish") from None
        fh.seek(0)
        fh.truncate()
        fh.write(f"pid {os.getpid()}, run {self.run_id}")
        fh.flush()
        self.fh = fh
        return self

    def __exit__(self, *exc) -> None:
        if self.fh:
            self.fh.truncate(0)
            fcntl.flock(self.fh, fcntl.LOCK_UN)
            self.fh.close()
            self.fh = None


def netns_inode(pid: int) -> int | None:
    try:
        return os.stat(f"/proc/{pid}/ns/net").st_ino
    except OSError:
        return None


def processes_in_netns(inodes: set[int]) -> dict[int, int]:
    """PID -> start ticks of every process whose network namespace is one of ``inodes``."""
    found = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit() and netns_inode(int(entry)) in inodes:
            ticks = process_start_ticks(int(entry))
            if ticks is not None:
                found[int(entry)] = ticks
    return found


def kill_processes(processes: dict[int, int], log=print) -> None:
    """SIGTERM then SIGKILL each process (and its group, if it leads one) that is still the
    process that was recorded."""
    alive = {pid for pid, ticks in processes.items() if process_start_ticks(pid) == ticks}
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in list(alive):
            try:
                if os.getpgid(pid) == pid:
                    os.killpg(pid, sig)
                else:
                    os.kill(pid, sig)
            except ProcessLookupError:
                alive.discard(pid)
        deadline = time.monotonic() + KILL_GRACE_S
        while alive and time.monotonic() < deadline:
            for pid in list(alive):
                try:
                    os.waitpid(pid, os.WNOHANG)
                except ChildProcessError:
                    pass
                if process_start_ticks(pid) != processes[pid]:
                    alive.discard(pid)
            time.sleep(0.05)
        if not alive:
            return
    if alive:
        log(f"processes that would not die: {sorted(alive)}")


def restore_settings(settings: dict[str, str]) -> None:
    for path, value in settings.items():
        try:
            Path(path).write_text(value)
        except OSError:
            pass  # the setting went away with what it belonged to


def existing_interfaces(names: list[str]) -> list[str]:
    return [n for n in names if os.path.exists(f"/sys/class/net/{n}")]


def remove_pins(paths: list[str]) -> int:
    """Unlink the recorded BPF pins that still exist below BPF_FS; returns how many. A pin
    holds its map only while the path exists; the map goes with its last program."""
    removed = 0
    for path in paths:
        path = os.path.normpath(path)  # no ".." out of BPF_FS
        if not Path(path).is_relative_to(BPF_FS):
            continue  # never remove anything else, whatever a ledger says
        try:
            os.unlink(path)
            removed += 1
        except FileNotFoundError:
            pass
    return removed


def clean(ledger: Ledger, log=print) -> dict:
    """Remove everything in the ledger that still exists; returns what was removed."""
    removed = {"processes": 0, "bridges": 0, "interfaces": 0, "pinned": 0}
    live = {pid: t for pid, t in ledger.processes.items() if process_start_ticks(pid) == t}
    live.update(processes_in_netns(set(ledger.netns_inodes)))
    live.pop(os.getpid(), None)
    kill_processes(live, log)
    removed["processes"] = len(live)
    if ledger.bridges and ovs.is_running():
        present = set(ovs.list_bridges())
        stale = [b for b in ledger.bridges if b in present]
        ovs.delete_bridges(stale)
        removed["bridges"] = len(stale)
    stale_intfs = existing_interfaces(ledger.interfaces)
    for name in stale_intfs:
        subprocess.run(["ip", "link", "del", "dev", name], capture_output=True)
    removed["interfaces"] = len(stale_intfs)
    removed["pinned"] = remove_pins(ledger.pinned)
    if ledger.ovs_started:
        ovs.stop()
    restore_settings(ledger.settings)
    shutil.rmtree(STATE_DIR / "ovs", ignore_errors=True)  # a private OVS's sockets and database
    Ledger.discard()
    return removed
