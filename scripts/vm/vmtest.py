#!/usr/bin/env python3
"""``make vm-test``: the stock-kernel suite in a booted Debian 12 guest under qemu.

The development and CI machines run a kernel that loads no modules, so every run there takes
the fallback paths. This boots Debian 12's own kernel (linux-image-amd64), where the testbed
takes the kernel's paths (OVS kernel datapath, RED, DCTCP, netem, softRoCE), and runs the
tests written for them (tests/vm, and the integration tests marked ``stock_kernel``).
Standard library only: it runs before any venv exists.

    python3 scripts/vm/vmtest.py run      build or reuse the image, boot it, run the suite,
                                          bring the results back (what `make vm-test` runs)
    python3 scripts/vm/vmtest.py build    build or reuse the image only
    python3 scripts/vm/vmtest.py plan     the cache key, its inputs, and every command line
                                          a run uses; runs nothing, needs no root
    python3 scripts/vm/vmtest.py console  boot the image with a root login on this terminal
                                          and the disks of a run attached, no suite
                                          (debugging; Ctrl-A X ends qemu)

``run``, step by step (each logged with its time; every command line is built by one of the
``*_argv`` functions below and printed before it runs):

1. host tools: debootstrap, qemu-system-x86, qemu-utils, e2fsprogs (apt-get; only what is
   missing).
2. image: /var/cache/testbed/vm/<key>/ holds base.img (an ext4 root file system), vmlinuz,
   initrd.img and manifest.json. The key hashes everything scripts/install.sh's venv stamp
   covers (requirements*.txt, pyproject.toml, setup.cfg, setup.py, the extras and the torch
   index),
   install.sh itself (its package list), the guest's package list and kernel, and the guest
   files baked in below; a new key builds a new image. Building, in <key>.build/: debootstrap
   of Debian 12 with the kernel; in a chroot (/proc, /sys, /dev bind-mounted, unmounted in a
   ``finally``) the machine's CA bundle copied in and the project's own scripts/install.sh
   run, as everywhere else; the guest unit written; ``mkfs.ext4 -d``. Each stage leaves a
   marker, so a failed build restarts where it stopped.
3. disks: tree.img, the project's files as git lists them (tracked, and untracked but not
   ignored), copied in fresh every run (``mkfs.ext4 -d``); results.img, an empty ext4; and a
   qcow2 overlay over base.img, so the cached image is never written.
4. boot: qemu with software emulation (TCG), no network device. The guest's
   testbed-vmtest.service mounts the tree where the image's editable install points and runs
   the tree's scripts/vm/guest.sh, which writes everything to the results disk with the
   suite's exit status, then the guest powers itself off. The serial console goes to
   console.log and, condensed, to this terminal. A guest still running after the timeout
   (45 minutes unless told) is ended by killing qemu by its PID.
5. results: ``debugfs rdump`` copies the results disk out (no loop device, no mount).
6. the check that nothing is left: no qemu process, mount or loop device of this run.

Everything lands in results/vm/<run-id>/: vmtest.log (this runner's steps and commands),
console.log, run.json, image-build.log (when an image was built) and guest/ (what the guest
wrote: status, pytest.log, junit.xml, doctor.txt, the runs' folders under pytest-tmp/).

Exit status: 0 the suite passed; 1 a test failed; 2 bad input; 3 the run failed (image,
boot, timeout, no status from the guest, something left behind); 130 interrupted.
"""
from __future__ import annotations

import argparse
import datetime
import fcntl
import hashlib
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import threading
import time
import uuid
import xml.etree.ElementTree as ElementTree
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path

EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_RUN_FAILED, EXIT_INTERRUPTED = 0, 1, 2, 3, 130

ROOT = Path(__file__).resolve().parents[2]
CACHE_DIR = Path("/var/cache/testbed/vm")
RESULTS_DIR = Path("results/vm")

# --- what the guest is --------------------------------------------------------------------------

SUITE = "bookworm"  # Debian 12
DEFAULT_MIRROR = "http://deb.debian.org/debian"
# The guest's base packages (debootstrap --include); scripts/install.sh adds the rest.
GUEST_PACKAGES = ("linux-image-amd64", "systemd-sysv", "udev", "kmod", "iproute2",
                  "openvswitch-switch", "python3", "python3-venv", "ca-certificates")
# Which kernel boots: Debian 12's own, or bookworm-backports' newer one (installed over it).
KERNELS = {"stock": None, "backports": "bookworm-backports"}
KERNEL_PACKAGE = "linux-image-amd64"
IMAGE_SIZE = "8G"  # sparse: only what the root file system holds takes disk space
RESULTS_SIZE = "4G"
TREE_HEADROOM_MB = 256  # the guest writes caches and build outputs into its tree
DISK_NEEDED_BYTES = 12 * 1024**3  # a build: the root file system twice (tree, then image)
KEEP_IMAGES = 2  # images of older keys beyond this many are removed after a build

GUEST_TREE = "/opt/testbed"  # where the tree disk is mounted, and where install.sh ran
GUEST_VENV = "/opt/testbed-venv"  # outside the tree: the tree is replaced every run
GUEST_RESULTS = "/mnt/results"
RESULTS_OUT = "out"  # the folder on the results disk the guest writes into
GUEST_ENV_FILE = ".vmtest-run.env"  # in the tree disk's root: this run's settings
TREE_LABEL, RESULTS_LABEL, ROOT_LABEL = "testbed-tree", "testbed-results", "testbed-root"
KERNEL_FLAG = "testbed.vmtest=1"  # the guest unit runs only when the kernel is given this

# The files baked into the image (their text is part of the cache key). The unit runs once
# per boot, after Open vSwitch has started, when the kernel command line asks for it, and
# powers the guest off however it ends.
GUEST_UNIT = f"""\
[Unit]
Description=testbed stock-kernel suite (make vm-test)
ConditionKernelCommandLine={KERNEL_FLAG}
After=openvswitch-switch.service ovs-vswitchd.service systemd-user-sessions.service

[Service]
Type=oneshot
ExecStart=/usr/local/sbin/testbed-vmtest
StandardOutput=journal+console
StandardError=journal+console
TimeoutStartSec=infinity
SuccessAction=poweroff-force
FailureAction=poweroff-force

[Install]
WantedBy=multi-user.target
"""
GUEST_UNIT_PATH = "etc/systemd/system/testbed-vmtest.service"
GUEST_UNIT_LINK = "etc/systemd/system/multi-user.target.wants/testbed-vmtest.service"
GUEST_ENTRY_PATH = "usr/local/sbin/testbed-vmtest"
GUEST_ENTRY = f"""\
#!/bin/sh
# testbed-vmtest.service: mount the results and tree disks, run the tree's own
# scripts/vm/guest.sh, and leave its exit status on the results disk.
set -u
out={GUEST_RESULTS}/{RESULTS_OUT}
mkdir -p {GUEST_TREE} {GUEST_RESULTS}
if ! mount -L {RESULTS_LABEL} {GUEST_RESULTS}; then
  echo "[vm-guest] cannot mount the results disk ({RESULTS_LABEL})"
  exit 1
fi
mkdir -p "$out"
status=3
if mount -L {TREE_LABEL} {GUEST_TREE}; then
  bash {GUEST_TREE}/scripts/vm/guest.sh "$out"
  status=$?
else
  echo "[vm-guest] cannot mount the tree disk ({TREE_LABEL})"
fi
echo "$status" > "$out/status"
sync
umount {GUEST_RESULTS}
umount {GUEST_TREE} 2>/dev/null
echo "[vm-guest] finished with status $status; powering off"
# The unit's SuccessAction did not power a Debian 12 guest off (it sat idle until the
# host's timeout): power off here, from a state with nothing left to write.
systemctl poweroff --force --force || echo o > /proc/sysrq-trigger
exit 0
"""
IMAGE_RECIPE = 1  # bump when the build below changes in a way the key does not see

# --- time ---------------------------------------------------------------------------------------

DEFAULT_TIMEOUT_MIN = 45.0  # the guest, from qemu's start to its power-off
GUEST_OVERHEAD_S = 300.0  # boot, install.sh's check, doctor, collection and power-off
COLLECT_MARGIN_S = 120.0  # after qemu: reading the results disk and cleaning up
MIN_GUEST_S = 600.0  # a deadline that leaves less than this is refused before booting
BUILD_TIMEOUT_S = {"debootstrap": 3600, "install": 3600, "mkfs": 1200}
HEARTBEAT_S = 300.0  # a line on the terminal at least this often while the guest runs
KILL_WAIT_S = 30.0

# --- configuration ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Config:
    """Everything a run depends on, from flags and TESTBED_VM_* variables."""

    root: Path = ROOT
    cache_dir: Path = CACHE_DIR
    results_dir: Path = RESULTS_DIR
    timeout_s: float = DEFAULT_TIMEOUT_MIN * 60
    deadline_unix: float | None = None  # a wall-clock time the whole run must end by
    smp: int = 2
    memory_mb: int = 4096
    kernel: str = "stock"
    mirror: str = DEFAULT_MIRROR
    extras: str = ""  # install.sh extras for the guest's venv (the suite needs none)
    torch_index_url: str = ""
    pytest_args: tuple[str, ...] = ()
    rebuild: bool = False
    keep_disks: bool = False


def parse_debian_mirror(texts: list[str], suite: str = SUITE) -> str | None:
    """The first Debian archive URI that apt's sources (deb822 ``.sources`` or one-line
    ``.list`` text) use for ``suite``; None when none does."""
    for text in texts:
        for stanza in re.split(r"\n\s*\n", text):
            fields = dict(re.findall(r"^(\w[\w-]*):\s*(.*)$", stanza, re.MULTILINE))
            if fields.get("Types", "").split()[:1] == ["deb"] and \
                    suite in fields.get("Suites", "").split():
                for uri in fields.get("URIs", "").split():
                    if "security" not in uri:
                        return uri.rstrip("/")
        for line in text.splitlines():
            words = line.split("#", 1)[0].split()
            if words[:1] == ["deb"]:
                words = [w for w in words[1:] if not w.startswith("[")]
                if len(words) >= 2 and words[1] == suite and "security" not in words[0]:
                    return words[0].rstrip("/")
    return None


def host_mirror() -> str:
    """The mirror this machine's apt uses for Debian 12, else deb.debian.org."""
    texts = []
    for path in [Path("/etc/apt/sources.list"),
                 *sorted(Path("/etc/apt/sources.list.d").glob("*.sources")),
                 *sorted(Path("/etc/apt/sources.list.d").glob("*.list"))]:
        try:
            texts.append(path.read_text())
        except OSError:
            continue
    return parse_debian_mirror(texts) or DEFAULT_MIRROR


def config_from(args, environ) -> Config:
    """The run's configuration: flags first, then TESTBED_VM_* variables, then defaults. A
    bad value is a ValueError naming its flag."""
    def pick(flag_value, env_name, default):
        if flag_value is not None:
            return flag_value
        return environ.get(env_name) or default

    def number(value, name, kind=float, minimum=0):
        try:
            parsed = kind(value)
        except (TypeError, ValueError):
            raise ValueError(f"{name}: expected a number, got {value!r}") from None
        if parsed <= minimum:
            raise ValueError(f"{name}: must be more than {minimum}, got {value!r}")
        return parsed

    timeout_min = number(pick(args.timeout_min, "TESTBED_VM_TIMEOUT_MIN", DEFAULT_TIMEOUT_MIN),
                         "--timeout-min")
    deadline = pick(args.deadline, "TESTBED_VM_DEADLINE", None)
    kernel = pick(args.kernel, "TESTBED_VM_KERNEL", "stock")
    if kernel not in KERNELS:
        raise ValueError(f"--kernel: expected one of {', '.join(KERNELS)}, got {kernel!r}")
    return Config(
        root=ROOT,
        cache_dir=Path(pick(args.cache_dir, "TESTBED_VM_CACHE", str(CACHE_DIR))),
        results_dir=Path(pick(args.results, "TESTBED_VM_RESULTS", str(RESULTS_DIR))),
        timeout_s=timeout_min * 60,
        deadline_unix=None if deadline is None else number(deadline, "--deadline"),
        smp=number(pick(args.smp, "TESTBED_VM_SMP", 2), "--smp", int),
        memory_mb=number(pick(args.memory_mb, "TESTBED_VM_MEMORY_MB", 4096), "--memory-mb",
                         int, 511),
        kernel=kernel,
        mirror=pick(args.mirror, "TESTBED_VM_MIRROR", None) or host_mirror(),
        extras=pick(args.extras, "TESTBED_VM_EXTRAS", ""),
        torch_index_url=environ.get("TESTBED_TORCH_INDEX_URL", ""),
        pytest_args=tuple(shlex.split(pick(args.pytest_args, "TESTBED_VM_PYTEST_ARGS", ""))),
        rebuild=bool(args.rebuild),
        keep_disks=bool(args.keep_disks),
    )


# --- the cache key ------------------------------------------------------------------------------


def stamp_files(root: Path) -> list[Path]:
    """The files scripts/install.sh's venv stamp hashes, and install.sh itself."""
    return [*sorted(root.glob("requirements*.txt")), root / "pyproject.toml",
            root / "setup.cfg", root / "setup.py", root / "scripts" / "install.sh"]


def key_inputs(config: Config, files: dict[str, str]) -> dict:
    """Everything the image depends on, as plain data: ``files`` (relative path -> text) and
    the guest's make-up."""
    extras = ",".join(["test", *(e for e in config.extras.split(",") if e and e != "test")])
    return {"recipe": IMAGE_RECIPE, "suite": SUITE, "kernel": config.kernel,
            "kernel_package": KERNEL_PACKAGE, "packages": list(GUEST_PACKAGES),
            "extras": extras, "torch_index_url": config.torch_index_url,
            "venv": GUEST_VENV, "tree": GUEST_TREE,
            "guest_unit": GUEST_UNIT, "guest_entry": GUEST_ENTRY,
            "files": {name: hashlib.sha256(text.encode()).hexdigest()
                      for name, text in sorted(files.items())}}


def cache_key(inputs: dict) -> str:
    """16 hex digits of the SHA-256 of the inputs, as canonical JSON."""
    text = json.dumps(inputs, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def read_key_inputs(config: Config) -> dict:
    files = {str(path.relative_to(config.root)): path.read_text()
             for path in stamp_files(config.root) if path.exists()}
    return key_inputs(config, files)


# --- time budgets -------------------------------------------------------------------------------


def guest_timeout_s(configured_s: float, deadline_unix: float | None, now_unix: float,
                    margin_s: float = COLLECT_MARGIN_S,
                    minimum_s: float = MIN_GUEST_S) -> tuple[float, str | None]:
    """How long the guest may run: the configured timeout, cut to end ``margin_s`` before
    the deadline; with a reason to refuse when that leaves less than ``minimum_s``."""
    if deadline_unix is None:
        return configured_s, None
    left_s = deadline_unix - now_unix - margin_s
    timeout = min(configured_s, left_s)
    if timeout < minimum_s:
        return timeout, (f"the deadline leaves the guest {max(0.0, left_s) / 60:.1f} min, "
                         f"less than {minimum_s / 60:.0f}")
    return timeout, None


def suite_budget_s(timeout_s: float, overhead_s: float = GUEST_OVERHEAD_S) -> int:
    """The guest's pytest budget: its timeout less boot, checks and power-off, so that a
    hung test still leaves logs and a status behind."""
    return max(60, int(timeout_s - overhead_s))


# --- command lines ------------------------------------------------------------------------------


def host_tool_packages(which) -> list[str]:
    """The Debian packages of the host tools that ``which`` does not find."""
    tools = {"debootstrap": "debootstrap", "qemu-system-x86_64": "qemu-system-x86",
             "qemu-img": "qemu-utils", "mkfs.ext4": "e2fsprogs", "debugfs": "e2fsprogs"}
    missing = []
    for tool, package in tools.items():
        if which(tool) is None and package not in missing:
            missing.append(package)
    return missing


def apt_install_argv(packages: list[str]) -> list[str]:
    return ["apt-get", "install", "-y", "-q", "--no-install-recommends", *packages]


def debootstrap_argv(rootfs: Path, mirror: str) -> list[str]:
    return ["debootstrap", "--variant=minbase", f"--include={','.join(GUEST_PACKAGES)}", SUITE,
            str(rootfs), mirror]


def mount_argvs(rootfs: Path) -> list[tuple[Path, list[str]]]:
    """(mount point, command) for what a chroot needs of the host, in mounting order."""
    return [(rootfs / sub, ["mount", "--bind", f"/{sub}", str(rootfs / sub)])
            for sub in ("proc", "sys", "dev", "dev/pts")]


# Variables handed into the chroot: how this machine reaches the package registries.
PASSED_VARIABLES = ("http_proxy", "https_proxy", "no_proxy", "HTTP_PROXY", "HTTPS_PROXY",
                    "NO_PROXY", "PIP_INDEX_URL", "PIP_EXTRA_INDEX_URL", "PIP_TRUSTED_HOST",
                    "PIP_CERT", "PIP_DEFAULT_TIMEOUT", "PIP_RETRIES")
CHROOT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


def chroot_argv(rootfs: Path, argv: list[str]) -> list[str]:
    return ["chroot", str(rootfs), *argv]


def chroot_env(environ: dict[str, str], extra_env: dict[str, str] | None = None
               ) -> dict[str, str]:
    """A chroot's whole environment: a clean one, the registry variables this machine has
    (their values never go on a command line or into a log), and ``extra_env``."""
    env = {"PATH": CHROOT_PATH, "HOME": "/root", "LANG": "C.UTF-8",
           "DEBIAN_FRONTEND": "noninteractive"}
    env.update({k: environ[k] for k in PASSED_VARIABLES if environ.get(k)})
    env.update(extra_env or {})
    return env


def shown_env(env: dict[str, str]) -> str:
    """How a command's environment is logged: ours with values, the machine's by name."""
    mine = " ".join(f"{k}={shlex.quote(v)}" for k, v in env.items() if k not in PASSED_VARIABLES)
    passed = [k for k in env if k in PASSED_VARIABLES]
    return f"env -i {mine}" + (f" (and {', '.join(passed)} from this machine)" if passed
                               else "")


def install_env(config: Config) -> dict[str, str]:
    """install.sh's settings in the chroot and in the guest: the same venv and extras."""
    env = {"TESTBED_VENV": GUEST_VENV, "TESTBED_EXTRAS": config.extras}
    if config.torch_index_url:
        env["TESTBED_TORCH_INDEX_URL"] = config.torch_index_url
    return env


def backports_argvs(mirror: str, suite: str) -> list[list[str]]:
    """In the chroot: the backports suite's kernel over the stock one."""
    source = f"deb {mirror} {suite} main"
    return [["sh", "-c", f"echo {shlex.quote(source)} > /etc/apt/sources.list.d/{suite}.list"],
            ["apt-get", "update", "-q"],
            ["apt-get", "install", "-y", "-q", "--no-install-recommends", "-t", suite,
             KERNEL_PACKAGE]]


def mkfs_argv(image: Path, label: str, size: str, source: Path | None = None) -> list[str]:
    """An ext4 file system in the file ``image``, filled from ``source`` when given."""
    argv = ["mkfs.ext4", "-q", "-F", "-L", label]
    if source is not None:
        argv += ["-d", str(source)]
    return [*argv, str(image), size]


def overlay_argv(base: Path, overlay: Path) -> list[str]:
    return ["qemu-img", "create", "-q", "-f", "qcow2", "-F", "raw", "-b", str(base.resolve()),
            str(overlay)]


def qemu_argv(image_dir: Path, overlay: Path, tree: Path, results: Path, smp: int,
              memory_mb: int, run_suite: bool = True) -> list[str]:
    """The guest: software emulation (TCG), no network device, the serial console on
    stdio, off on reboot; the root through its overlay, the tree and results disks after it.
    ``run_suite`` False boots to a login prompt instead of the suite."""
    append = ["root=/dev/vda", "rw", "console=ttyS0", "panic=1"]
    if run_suite:
        append.append(KERNEL_FLAG)
    return ["qemu-system-x86_64", "-name", "testbed-vmtest", "-accel", "tcg,thread=multi",
            "-cpu", "max", "-smp", str(smp), "-m", str(memory_mb), "-nographic",
            "-no-reboot", "-nic", "none",
            "-kernel", str(image_dir / "vmlinuz"), "-initrd", str(image_dir / "initrd.img"),
            "-append", " ".join(append),
            "-drive", f"file={overlay},format=qcow2,if=virtio",
            "-drive", f"file={tree},format=raw,if=virtio",
            "-drive", f"file={results},format=raw,if=virtio"]


def rdump_argv(image: Path, folder: str, destination: Path) -> list[str]:
    """Copy ``folder`` of an ext4 image out into ``destination``, without mounting it."""
    return ["debugfs", "-R", f'rdump /{folder} "{destination}"', str(image)]


def tree_disk_mb(total_bytes: int, files: int, headroom_mb: int = TREE_HEADROOM_MB) -> int:
    """The tree disk's size: the files twice over (ext4's blocks and inodes), plus room."""
    return int((2 * total_bytes + 4096 * files) / 2**20) + headroom_mb


def guest_env_text(values: dict[str, str]) -> str:
    """The guest's settings file: shell assignments, every value quoted."""
    return "".join(f"{name}={shlex.quote(value)}\n" for name, value in values.items())


def newest_kernel(names: list[str]) -> str | None:
    """The newest kernel release among ``vmlinuz-<release>`` file names."""
    def version(release: str):
        return [int(n) if n.isdigit() else n for n in re.split(r"[.-]", release)]

    releases = [n.removeprefix("vmlinuz-") for n in names if n.startswith("vmlinuz-")]
    return max(releases, key=lambda r: [(0, p) if isinstance(p, int) else (1, p)
                                        for p in version(r)], default=None)


# --- the console --------------------------------------------------------------------------------

ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]|\x1b[()][A-Z0-9]|\r")
PYTEST_RESULT = re.compile(r"^(tests/\S+::\S+.*?) (PASSED|FAILED|ERROR|SKIPPED|XFAIL|XPASS)\b")
PYTEST_SUMMARY = re.compile(r"^(=+ .*\b(passed|failed|error|errors|skipped|deselected)\b.* =+"
                            r"|(FAILED|ERROR|SKIPPED) .*)$")
KERNEL_TROUBLE = ("Kernel panic", "BUG:", "Oops", "Call Trace:", "soft lockup", "hung_task",
                  "Out of memory")


def clean_line(raw: str) -> str:
    return ANSI.sub("", raw).rstrip()


def condense(line: str) -> str | None:
    """What the terminal shows of a console line: the guest script's own lines, each test's
    result, pytest's summary, the kernel's release and its troubles, failed units and the
    power-off; None for the rest (console.log keeps every line)."""
    text = line.strip()
    if not text:
        return None
    if text.startswith("[vm-guest]"):
        return text
    result = PYTEST_RESULT.match(text)
    if result:
        return f"{result.group(2):7s} {result.group(1)}"
    if PYTEST_SUMMARY.match(text):
        return text
    if "Linux version" in text:
        return "kernel " + text.split("Linux version", 1)[1].strip().split(" (", 1)[0]
    if any(word in text for word in KERNEL_TROUBLE) or "Failed to start" in text:
        return text
    if "reboot: Power down" in text:
        return "guest powered off"
    return None


@dataclass
class GuestRun:
    """How the guest's qemu ended: its exit code, whether the timeout killed it, its PID."""

    pid: int
    returncode: int | None
    timed_out: bool
    seconds: float
    last_line: str = ""


def watch_guest(argv: list[str], console_log: Path, timeout_s: float, say=print,
                heartbeat_s: float = HEARTBEAT_S, interactive: bool = False) -> GuestRun:
    """Run qemu (``argv``) until it exits or ``timeout_s`` passes, then kill it by its PID.
    Every console line goes to ``console_log``, the condensed ones to ``say``; at least one
    line every ``heartbeat_s``. ``interactive``: the console is this terminal instead."""
    t0 = time.monotonic()
    if interactive:
        proc = subprocess.Popen(argv)
        return GuestRun(proc.pid, proc.wait(), False, time.monotonic() - t0)
    proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, start_new_session=True)
    state = {"last": "", "said": time.monotonic()}

    def pump() -> None:
        with open(console_log, "w", errors="replace") as log:
            for raw in iter(proc.stdout.readline, b""):
                line = clean_line(raw.decode(errors="replace"))
                log.write(line + "\n")
                log.flush()
                if line.strip():
                    state["last"] = line.strip()
                shown = condense(line)
                if shown is not None:
                    say(f"[vm +{time.monotonic() - t0:4.0f}s] {shown}")
                    state["said"] = time.monotonic()

    reader = threading.Thread(target=pump, daemon=True)
    reader.start()
    timed_out = False
    try:
        while True:
            try:
                proc.wait(timeout=min(5.0, max(0.1, t0 + timeout_s - time.monotonic())))
                break
            except subprocess.TimeoutExpired:
                pass
            now = time.monotonic()
            if now - t0 >= timeout_s:
                timed_out = True
                break
            if now - state["said"] >= heartbeat_s:
                say(f"[vm +{now - t0:4.0f}s] still running; last console line: "
                    f"{state['last'][:120]}")
                state["said"] = now
    finally:
        if proc.poll() is None:  # the timeout, or this runner interrupted: qemu goes
            os.kill(proc.pid, signal.SIGKILL)
            try:
                proc.wait(timeout=KILL_WAIT_S)
            except subprocess.TimeoutExpired:
                pass
        reader.join(timeout=KILL_WAIT_S)
    return GuestRun(proc.pid, None if timed_out else proc.returncode, timed_out,
                    time.monotonic() - t0, state["last"])


def exit_status(guest_status: int | None, run: GuestRun | None, left: list[str]) -> int:
    """The runner's exit status: the suite's verdict when the guest ran it to the end and
    nothing was left behind, else 3 (the run failed)."""
    if run is None or run.timed_out or guest_status is None or left:
        return EXIT_RUN_FAILED
    if guest_status == 0:
        return EXIT_OK
    return EXIT_FAILED if guest_status == 1 else EXIT_RUN_FAILED


# --- what is left -------------------------------------------------------------------------------


def unescape_mount(path: str) -> str:
    """/proc/mounts writes spaces and tabs in paths as octal escapes."""
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), path)


def mounts_under(mounts_text: str, folder: Path) -> list[str]:
    """Mount points (from /proc/mounts text) at or below ``folder``, deepest first."""
    base = str(folder.resolve())
    points = [unescape_mount(line.split()[1]) for line in mounts_text.splitlines()
              if len(line.split()) > 1]
    inside = [p for p in points if p == base or p.startswith(base + "/")]
    return sorted(set(inside), key=lambda p: (-p.count("/"), p))


def loop_devices_on(backing: dict[str, str], folder: Path) -> list[str]:
    """Loop devices (name -> backing file) whose file lies below ``folder``."""
    base = str(folder.resolve())
    return sorted(name for name, path in backing.items()
                  if path.strip() == base or path.strip().startswith(base + "/"))


def read_mounts() -> str:
    try:
        return Path("/proc/mounts").read_text()
    except OSError:
        return ""


def read_loop_backing() -> dict[str, str]:
    backing = {}
    for path in Path("/sys/block").glob("loop*/loop/backing_file"):
        try:
            backing[path.parts[3]] = path.read_text()
        except OSError:
            continue
    return backing


def processes_mentioning(text: str) -> list[int]:
    """PIDs of live processes whose command line contains ``text``."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(
                errors="replace")
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if text in cmdline and state != "Z":
            found.append(int(entry.name))
    return found


def leftovers(config: Config, run_dir: Path | None, qemu_pid: int | None) -> list[str]:
    """What this runner could have left: its qemu, mounts and loop devices in the cache."""
    left = []
    if qemu_pid is not None and Path(f"/proc/{qemu_pid}").exists():
        try:
            state = Path(f"/proc/{qemu_pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            state = "Z"
        if state != "Z":
            left.append(f"qemu pid {qemu_pid}")
    if run_dir is not None:
        left += [f"process {pid}" for pid in processes_mentioning(str(run_dir))
                 if pid != qemu_pid]
    left += [f"mount {p}" for p in mounts_under(read_mounts(), config.cache_dir)]
    left += [f"loop device {d}" for d in loop_devices_on(read_loop_backing(), config.cache_dir)]
    return left


# --- the runner's log ---------------------------------------------------------------------------


class Log:
    """The runner's lines: on the terminal and in vmtest.log, each step with its time."""

    def __init__(self, path: Path | None = None):
        self.path = path
        self.steps: list[dict] = []
        self.commands: list[str] = []
        self._fh = None

    def open(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self._fh = open(path, "a")

    def __call__(self, message: str) -> None:
        self.raw(f"[vm-test] {message}")

    def raw(self, line: str) -> None:
        """A line as it is (the guest's console lines carry their own prefix)."""
        print(line, flush=True)
        if self._fh is not None:
            self._fh.write(f"{datetime.datetime.now():%H:%M:%S} {line}\n")
            self._fh.flush()

    @contextmanager
    def step(self, name: str):
        t0 = time.monotonic()
        self(f"{name} ...")
        record = {"step": name, "seconds": None, "ok": False}
        self.steps.append(record)
        try:
            yield record
        except BaseException:
            record["seconds"] = round(time.monotonic() - t0, 1)
            self(f"{name}: FAILED after {record['seconds']:.1f} s")
            raise
        record["seconds"], record["ok"] = round(time.monotonic() - t0, 1), True
        self(f"{name}: done in {record['seconds']:.1f} s")


class StepFailed(Exception):
    """A step could not be done; the message says what and where its output is."""


class BuildOnly(Exception):
    """`vmtest.py build` has its image: the run stops there."""


def run_command(argv: list[str], log: Log, output: Path | None = None,
                timeout_s: float | None = None, env: dict[str, str] | None = None) -> None:
    """Run one command, its line logged first; its output appended to ``output`` (or
    discarded). ``env``: its whole environment (logged by ``shown_env``). A non-zero exit is
    a StepFailed with the output's last lines."""
    line = shlex.join(argv) if env is None else f"{shown_env(env)} {shlex.join(argv)}"
    log.commands.append(line)
    log(f"$ {line}")
    if output is None:
        out = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, text=True,
                             timeout=timeout_s, env=env)
        if out.returncode != 0:
            raise StepFailed(f"{argv[0]} exited {out.returncode}: "
                             f"{(out.stderr or out.stdout).strip()[-600:]}")
        return
    with open(output, "a") as fh:
        fh.write(f"\n$ {line}\n")
        fh.flush()
        try:
            returncode = subprocess.run(argv, stdin=subprocess.DEVNULL, stdout=fh,
                                        stderr=subprocess.STDOUT, timeout=timeout_s,
                                        env=env).returncode
        except subprocess.TimeoutExpired:
            raise StepFailed(f"{argv[0]} did not finish in {timeout_s:.0f} s; see {output}") \
                from None
    if returncode != 0:
        last = output.read_text(errors="replace").strip().splitlines()[-15:]
        raise StepFailed(f"{argv[0]} exited {returncode}; the end of {output}:\n  "
                         + "\n  ".join(last))


# --- the image ----------------------------------------------------------------------------------


@dataclass
class Image:
    """A built image: its folder (base.img, vmlinuz, initrd.img) and manifest."""

    folder: Path
    manifest: dict = field(default_factory=dict)

    @property
    def base(self) -> Path:
        return self.folder / "base.img"


def ensure_host_tools(log: Log) -> None:
    missing = host_tool_packages(shutil.which)
    if not Path("/usr/share/keyrings/debian-archive-keyring.gpg").exists():
        missing.append("debian-archive-keyring")
    if not missing:
        log("host tools present: debootstrap, qemu-system-x86_64, qemu-img, mkfs.ext4, "
            "debugfs")
        return
    run_command(["apt-get", "update", "-q"], log)
    run_command(apt_install_argv(missing), log)


@contextmanager
def chroot_mounts(rootfs: Path, log: Log):
    """/proc, /sys, /dev and /dev/pts of the host inside ``rootfs`` for the block; all
    unmounted when it ends, however it ends (lazily if busy), and checked."""
    mounted: list[Path] = []
    try:
        for point, argv in mount_argvs(rootfs):
            point.mkdir(parents=True, exist_ok=True)
            run_command(argv, log)
            mounted.append(point)
        yield
    finally:
        unmount_all(rootfs, log)


def unmount_all(folder: Path, log: Log) -> None:
    """Unmount everything mounted at or below ``folder``, deepest first; raise if any
    mount stays."""
    for point in mounts_under(read_mounts(), folder):
        out = subprocess.run(["umount", point], capture_output=True, text=True)
        if out.returncode != 0:
            log(f"umount {point}: {out.stderr.strip()}; unmounting lazily")
            subprocess.run(["umount", "-l", point], capture_output=True, text=True)
    left = mounts_under(read_mounts(), folder)
    if left:
        raise StepFailed(f"still mounted below {folder}: {', '.join(left)}")


def remove_tree(folder: Path, log: Log) -> None:
    """Delete ``folder``, but only once nothing is mounted below it (a bind-mounted /dev
    must never be deleted through)."""
    if not folder.exists():
        return
    unmount_all(folder, log)
    shutil.rmtree(folder)


def tree_files(root: Path) -> list[str]:
    """The project's files, as git lists them: tracked, and untracked but not ignored."""
    # safe.directory: under sudo the checkout belongs to someone else, which git refuses
    out = subprocess.run(["git", "-c", f"safe.directory={root}", "-C", str(root), "ls-files",
                          "-z", "--cached", "--others", "--exclude-standard"],
                         capture_output=True)
    if out.returncode != 0:
        raise StepFailed("vm-test copies the files git lists: run it from a git checkout "
                         f"({out.stderr.decode(errors='replace').strip()})")
    names = sorted({n for n in out.stdout.decode().split("\0") if n})
    return [n for n in names if (root / n).exists() or (root / n).is_symlink()]


def copy_tree(root: Path, names: list[str], destination: Path) -> int:
    """Copy ``names`` (relative to ``root``) into ``destination``; returns their bytes."""
    total = 0
    for name in names:
        source, target = root / name, destination / name
        target.parent.mkdir(parents=True, exist_ok=True)
        if source.is_symlink():
            os.symlink(os.readlink(source), target)
        else:
            shutil.copy2(source, target)
            total += target.stat().st_size
    return total


def write_into(rootfs: Path, name: str, data: bytes, mode: int = 0o644) -> Path:
    """Write file ``name`` (relative) of the root file system. A symlink already there is
    replaced, never followed: it would point into this machine's own files."""
    target = rootfs / name
    if not target.resolve().is_relative_to(rootfs.resolve()) and not target.is_symlink():
        raise StepFailed(f"{target} lies outside {rootfs}")
    target.parent.mkdir(parents=True, exist_ok=True)
    if target.is_symlink() or target.exists():
        target.unlink()
    target.write_bytes(data)
    target.chmod(mode)
    return target


def write_guest_files(rootfs: Path) -> None:
    """The guest's unit, its entry script, its name, and a root login without password
    (the serial console of `vmtest.py console`; the guest has no network)."""
    write_into(rootfs, GUEST_UNIT_PATH, GUEST_UNIT.encode())
    link = rootfs / GUEST_UNIT_LINK
    link.parent.mkdir(parents=True, exist_ok=True)
    if link.is_symlink() or link.exists():
        link.unlink()
    link.symlink_to(f"/{GUEST_UNIT_PATH}")
    write_into(rootfs, GUEST_ENTRY_PATH, GUEST_ENTRY.encode(), 0o755)
    write_into(rootfs, "etc/hostname", b"testbed-vm\n")
    write_into(rootfs, "etc/hosts", b"127.0.0.1 localhost\n127.0.1.1 testbed-vm\n")


def build_image(config: Config, key: str, inputs: dict, log: Log, build_log: Path) -> Image:
    """Build the image of ``key`` in <key>.build/, stage by stage, each stage skipped when
    its marker says it is done, then move it into place as <key>/."""
    build = config.cache_dir / f"{key}.build"
    rootfs, out = build / "rootfs", build / "out"
    build.mkdir(parents=True, exist_ok=True)
    unmount_all(build, log)  # a killed earlier build may have left its chroot mounts
    free = shutil.disk_usage(build).free
    if free < DISK_NEEDED_BYTES:
        raise StepFailed(f"{build}: {free / 2**30:.1f} GiB free, a build needs about "
                         f"{DISK_NEEDED_BYTES / 2**30:.0f}")
    timings = {}

    def stage(name: str):
        return build / f"{name}.done"

    with log.step("image: debootstrap (Debian 12 and its kernel)") as record:
        if stage("debootstrap").exists():
            log("done by an earlier build")
        else:
            remove_tree(rootfs, log)
            run_command(debootstrap_argv(rootfs, config.mirror), log, build_log,
                        BUILD_TIMEOUT_S["debootstrap"])
            stage("debootstrap").touch()
    timings["debootstrap_s"] = record["seconds"]

    with log.step("image: scripts/install.sh in a chroot") as record:
        if stage("install").exists():
            log("done by an earlier build")
        else:
            install_in_chroot(config, rootfs, log, build_log)
            stage("install").touch()
    timings["install_s"] = record["seconds"]

    with log.step("image: mkfs.ext4 -d (the root file system)") as record:
        kernels = sorted(p.name for p in (rootfs / "boot").glob("vmlinuz-*"))
        release = newest_kernel(kernels)
        if release is None:
            raise StepFailed(f"no kernel in {rootfs / 'boot'}")
        remove_tree(out, log)
        out.mkdir()
        shutil.copy2(rootfs / "boot" / f"vmlinuz-{release}", out / "vmlinuz")
        shutil.copy2(rootfs / "boot" / f"initrd.img-{release}", out / "initrd.img")
        packages = subprocess.run(["chroot", str(rootfs), "dpkg-query", "-W",
                                   "-f=${Package} ${Version}\\n"], capture_output=True,
                                  text=True).stdout
        (out / "packages.txt").write_text(packages)
        run_command(mkfs_argv(out / "base.img", ROOT_LABEL, IMAGE_SIZE, rootfs), log,
                    build_log, BUILD_TIMEOUT_S["mkfs"])
    timings["mkfs_s"] = record["seconds"]

    manifest = {"key": key, "kernel_release": release, "built_at": now_text(),
                "mirror": config.mirror, "timings": timings,
                "packages": len(packages.splitlines()), "inputs": inputs}
    (out / "manifest.json").write_text(json.dumps(manifest, indent=1))
    shutil.copy2(build_log, out / "image-build.log")
    final = config.cache_dir / key
    remove_tree(final, log)
    os.rename(out, final)
    remove_tree(build, log)
    return Image(final, manifest)


def install_in_chroot(config: Config, rootfs: Path, log: Log, build_log: Path) -> None:
    """The project's install.sh inside the root file system, as on any Debian machine:
    the CA bundle and pip's system configuration copied in first, services kept from
    starting, the chroot's mounts undone however it ends."""
    for name in ("etc/ssl/certs/ca-certificates.crt", "etc/pip.conf", "etc/resolv.conf"):
        source = Path("/") / name
        if source.exists():
            write_into(rootfs, name, source.read_bytes())
    tree = rootfs / GUEST_TREE.lstrip("/")
    remove_tree(tree, log)
    tree.mkdir(parents=True)
    copy_tree(config.root, tree_files(config.root), tree)
    policy = write_into(rootfs, "usr/sbin/policy-rc.d", b"#!/bin/sh\nexit 101\n", 0o755)
    env = chroot_env(dict(os.environ))  # no service starts inside the chroot (policy-rc.d)
    try:
        with chroot_mounts(rootfs, log):
            suite = KERNELS[config.kernel]
            if suite is not None:
                for argv in backports_argvs(config.mirror, suite):
                    run_command(chroot_argv(rootfs, argv), log, build_log,
                                BUILD_TIMEOUT_S["install"], env)
            run_command(chroot_argv(rootfs, ["bash", f"{GUEST_TREE}/scripts/install.sh"]), log,
                        build_log, BUILD_TIMEOUT_S["install"],
                        chroot_env(dict(os.environ), install_env(config)))
            run_command(chroot_argv(rootfs, ["passwd", "-d", "root"]), log, build_log, env=env)
            run_command(chroot_argv(rootfs, ["apt-get", "clean"]), log, build_log, env=env)
    finally:
        policy.unlink(missing_ok=True)
    write_guest_files(rootfs)
    for entry in tree.iterdir():  # the tree disk is mounted here at every boot
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry)
        else:
            entry.unlink()


def prune_images(config: Config, keep_key: str, log: Log) -> None:
    """Remove other keys' images beyond the newest KEEP_IMAGES - 1, and their unfinished
    builds."""
    others = [p for p in config.cache_dir.iterdir()
              if p.is_dir() and p.name != keep_key and re.fullmatch(r"[0-9a-f]{16}", p.name)]
    others.sort(key=lambda p: p.stat().st_mtime, reverse=True)
    for old in others[KEEP_IMAGES - 1:]:
        log(f"removing the image of an older key: {old}")
        remove_tree(old, log)
    for build in config.cache_dir.glob("*.build"):
        if build.name != f"{keep_key}.build":
            log(f"removing an unfinished build of another key: {build}")
            remove_tree(build, log)


def image_for(config: Config, log: Log, run_dir: Path) -> Image:
    """The image of this tree's key: the cached one, or a new build."""
    inputs = read_key_inputs(config)
    key = cache_key(inputs)
    folder = config.cache_dir / key
    log(f"image key {key} (install.sh's stamp inputs, install.sh, the guest's kernel "
        f"'{config.kernel}' and packages): {folder}")
    manifest_path = folder / "manifest.json"
    if manifest_path.exists() and not config.rebuild:
        manifest = json.loads(manifest_path.read_text())
        log(f"image cached: kernel {manifest.get('kernel_release')}, built "
            f"{manifest.get('built_at')}")
        return Image(folder, manifest)
    if config.rebuild:
        log("rebuilding the image (--rebuild)")
        remove_tree(folder, log)
        remove_tree(config.cache_dir / f"{key}.build", log)
    image = build_image(config, key, inputs, log, run_dir / "image-build.log")
    prune_images(config, key, log)
    return image


# --- a run --------------------------------------------------------------------------------------


def duration_text(seconds: float) -> str:
    """``45 min``, or ``90 s`` below two minutes."""
    return f"{seconds / 60:.0f} min" if seconds >= 120 else f"{seconds:.0f} s"


def now_text() -> str:
    return datetime.datetime.now().isoformat(timespec="seconds")


def new_run_id() -> str:
    return f"{datetime.datetime.now():%Y%m%d-%H%M%S}-vm-{uuid.uuid4().hex[:4]}"


@contextmanager
def cache_lock(cache_dir: Path):
    """One vm-test per machine at a time (one image build, one guest)."""
    cache_dir.mkdir(parents=True, exist_ok=True)
    path = cache_dir / "vmtest.lock"
    with open(path, "w") as fh:  # the kernel drops the lock when its holder dies
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise StepFailed(f"another vm-test holds {path}; one at a time") from None
        yield


def make_disks(config: Config, disks: Path, image: Image, run_id: str, budget_s: int,
               log: Log) -> tuple[Path, Path, Path]:
    """This run's tree disk, empty results disk, and overlay over the image."""
    staging = disks / "tree"
    names = tree_files(config.root)
    total = copy_tree(config.root, names, staging)
    settings = {"TESTBED_VM_RUN_ID": run_id, "TESTBED_VM_SUITE_BUDGET_S": str(budget_s),
                "TESTBED_VM_PYTEST_ARGS": shlex.join(config.pytest_args),
                **install_env(config)}
    (staging / GUEST_ENV_FILE).write_text(guest_env_text(settings))
    log(f"tree: {len(names)} files, {total / 2**20:.1f} MiB, as git lists them")
    tree, results, overlay = disks / "tree.img", disks / "results.img", disks / "overlay.qcow2"
    run_command(mkfs_argv(tree, TREE_LABEL, f"{tree_disk_mb(total, len(names))}M", staging),
                log)
    shutil.rmtree(staging)
    run_command(mkfs_argv(results, RESULTS_LABEL, RESULTS_SIZE), log)
    run_command(overlay_argv(image.base, overlay), log)
    return tree, results, overlay


def read_status(guest_dir: Path) -> int | None:
    try:
        return int((guest_dir / "status").read_text().strip())
    except (OSError, ValueError):
        return None


def failed_tests(junit_xml: str, width: int = 200) -> list[str]:
    """One line per failed or errored test in the guest's junit.xml: its id and the
    first line of its message, so a CI log that keeps only the tail names them."""
    try:
        root = ElementTree.fromstring(junit_xml)
    except ElementTree.ParseError:
        return []
    lines = []
    for case in root.iter("testcase"):
        for outcome in ("failure", "error"):
            found = case.find(outcome)
            if found is None:
                continue
            name = "::".join(part for part in (case.get("classname", ""),
                                               case.get("name", "")) if part)
            message = (found.get("message") or found.text or "").strip().splitlines()
            first = message[0] if message else ""
            lines.append(f"{outcome.upper()} {name}: {first}"[:width])
    return lines


def hand_to_sudo_user(folder: Path, environ) -> None:
    """The results belong to whoever ran sudo, as the testbed's own run folders do."""
    uid, gid = environ.get("SUDO_UID"), environ.get("SUDO_GID")
    if not (uid and gid and uid.isdigit() and gid.isdigit()):
        return
    for path in [folder, *folder.rglob("*")]:
        try:
            os.lchown(path, int(uid), int(gid))
        except OSError:
            pass


def run(config: Config, log: Log, build_only: bool = False, interactive: bool = False) -> int:
    run_id = new_run_id()
    run_dir = (config.results_dir / run_id).resolve()
    log.open(run_dir / "vmtest.log")
    log(f"run {run_id}: results in {run_dir}")
    record: dict = {"run_id": run_id, "started_at": now_text(), "config": {
        k: str(v) if isinstance(v, Path) else v for k, v in asdict(config).items()}}
    disks = config.cache_dir / "runs" / run_id
    guest: GuestRun | None = None
    status: int | None = None
    code = EXIT_RUN_FAILED
    try:
        with cache_lock(config.cache_dir):
            with log.step("host tools"):
                ensure_host_tools(log)
            with log.step("image"):
                image = image_for(config, log, run_dir)
            record["image"] = {"folder": str(image.folder),
                               "kernel_release": image.manifest.get("kernel_release"),
                               "key": image.manifest.get("key")}
            if build_only:
                code = EXIT_OK
                raise BuildOnly
            timeout_s, problem = guest_timeout_s(config.timeout_s, config.deadline_unix,
                                                 time.time())
            if problem:
                raise StepFailed(f"not booting: {problem}")
            budget_s = suite_budget_s(timeout_s)
            record.update(timeout_s=timeout_s, suite_budget_s=budget_s)
            with log.step("disks (tree, results, overlay)"):
                disks.mkdir(parents=True, exist_ok=True)
                tree, results, overlay = make_disks(config, disks, image, run_id, budget_s, log)
            argv = qemu_argv(image.folder, overlay, tree, results, config.smp,
                             config.memory_mb, run_suite=not interactive)
            log.commands.append(shlex.join(argv))
            log(f"$ {shlex.join(argv)}")
            what = ("guest (interactive, no timeout: Ctrl-A X ends qemu)" if interactive else
                    f"guest (software emulation; killed after {duration_text(timeout_s)})")
            with log.step(what):
                guest = watch_guest(argv, run_dir / "console.log", timeout_s, say=log.raw,
                                    interactive=interactive)
            record["guest"] = asdict(guest)
            if guest.timed_out:
                log(f"the guest did not finish within {duration_text(timeout_s)}: qemu (pid "
                    f"{guest.pid}) killed; last console line: {guest.last_line[:160]}")
            with log.step("results (debugfs rdump of the results disk)"):
                run_command(rdump_argv(results, RESULTS_OUT, run_dir), log)
                if (run_dir / RESULTS_OUT).exists():
                    os.rename(run_dir / RESULTS_OUT, run_dir / "guest")
            status = read_status(run_dir / "guest")
            junit = run_dir / "guest" / "junit.xml"
            if status and junit.exists():
                for line in failed_tests(junit.read_text(errors="replace")):
                    log(line)
            if interactive:
                code = EXIT_OK
            elif status is None and not guest.timed_out:
                log(f"the guest wrote no status (qemu exited {guest.returncode}); see "
                    f"{run_dir / 'console.log'}")
    except BuildOnly:
        pass
    except StepFailed as err:
        log(f"vm-test failed: {err}")
    except KeyboardInterrupt:
        log("interrupted")
        code = EXIT_INTERRUPTED
    except Exception as err:  # still one line, the clean-up and the check below
        import traceback

        log(f"vm-test failed: {type(err).__name__}: {err}")
        log.raw(traceback.format_exc().rstrip())
    finally:
        if not config.keep_disks and disks.exists():
            try:
                remove_tree(disks, log)
            except (StepFailed, OSError) as err:
                log(f"could not remove {disks}: {err}")
        left = leftovers(config, disks, guest.pid if guest else None)
        log("nothing left: no qemu process, mount or loop device" if not left
            else f"LEFT BEHIND: {'; '.join(left)}")
        if code != EXIT_INTERRUPTED and not build_only and not interactive:
            code = exit_status(status, guest, left)
        elif left:
            code = EXIT_RUN_FAILED
        record.update(finished_at=now_text(), steps=log.steps, commands=log.commands,
                      guest_status=status, left=left, exit=code)
        run_dir.mkdir(parents=True, exist_ok=True)
        (run_dir / "run.json").write_text(json.dumps(record, indent=1))
        hand_to_sudo_user(run_dir, os.environ)
        if not build_only and not interactive:
            log(summary_line(status, guest, code, run_dir))
    return code


def summary_line(status: int | None, guest: GuestRun | None, code: int, run_dir: Path) -> str:
    if guest is not None and guest.timed_out:
        what = "the guest timed out"
    elif status is None:
        what = "the guest did not report a status"
    else:
        what = f"the suite exited {status} ({'passed' if status == 0 else 'FAILED'})"
    return f"{what}; exit {code}; logs in {run_dir} (guest/pytest.log, console.log)"


def plan(config: Config) -> int:
    """Print the key, its inputs and every command line; run nothing."""
    inputs = read_key_inputs(config)
    key = cache_key(inputs)
    folder = config.cache_dir / key
    build = config.cache_dir / f"{key}.build"
    rootfs = build / "rootfs"
    disks = config.cache_dir / "runs" / "<run-id>"
    built = (folder / "manifest.json").exists()
    timeout_s, problem = guest_timeout_s(config.timeout_s, config.deadline_unix, time.time())
    print(f"image key {key}: {folder} ({'built' if built else 'not built yet'})")
    print(json.dumps({k: v for k, v in inputs.items() if k not in ("guest_unit",
                                                                   "guest_entry")}, indent=1))
    print(f"guest timeout {timeout_s / 60:.1f} min, suite budget {suite_budget_s(timeout_s)} s"
          + (f"; refused: {problem}" if problem else ""))
    print("\nhost tools:  " + shlex.join(apt_install_argv(["debootstrap", "qemu-system-x86",
                                                           "qemu-utils", "e2fsprogs"])))
    print("image:       " + shlex.join(debootstrap_argv(rootfs, config.mirror)))
    for _, argv in mount_argvs(rootfs):
        print("             " + shlex.join(argv))
    env = chroot_env(dict(os.environ))
    if KERNELS[config.kernel]:
        for argv in backports_argvs(config.mirror, KERNELS[config.kernel]):
            print(f"             {shown_env(env)} {shlex.join(chroot_argv(rootfs, argv))}")
    install = chroot_argv(rootfs, ["bash", f"{GUEST_TREE}/scripts/install.sh"])
    print(f"             {shown_env(chroot_env(dict(os.environ), install_env(config)))} "
          f"{shlex.join(install)}")
    print("             umount (each mount above, deepest first)")
    print("             " + shlex.join(mkfs_argv(build / "out" / "base.img", ROOT_LABEL,
                                                  IMAGE_SIZE, rootfs)))
    print("disks:       " + shlex.join(mkfs_argv(disks / "tree.img", TREE_LABEL, "<size>M",
                                                  disks / "tree")))
    print("             " + shlex.join(mkfs_argv(disks / "results.img", RESULTS_LABEL,
                                                  RESULTS_SIZE)))
    print("             " + shlex.join(overlay_argv(folder / "base.img",
                                                     disks / "overlay.qcow2")))
    print("guest:       " + shlex.join(qemu_argv(folder, disks / "overlay.qcow2",
                                                  disks / "tree.img", disks / "results.img",
                                                  config.smp, config.memory_mb)))
    print("results:     " + shlex.join(rdump_argv(disks / "results.img", RESULTS_OUT,
                                                   config.results_dir / "<run-id>")))
    print("in the guest: bash scripts/vm/guest.sh (install.sh offline, doctor, pytest tests/vm "
          "tests/integration -m stock_kernel)")
    return EXIT_OK


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="vmtest.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("command", choices=("run", "build", "plan", "console"))
    parser.add_argument("--timeout-min", help="end a guest still running after "
                        f"this many minutes (default {DEFAULT_TIMEOUT_MIN:g}; "
                        "TESTBED_VM_TIMEOUT_MIN)")
    parser.add_argument("--deadline", help="a Unix time the run must end by: the guest's "
                        "timeout is cut to fit (TESTBED_VM_DEADLINE; CI sets it)")
    parser.add_argument("--cache-dir", help=f"image cache (default {CACHE_DIR}; "
                        "TESTBED_VM_CACHE)")
    parser.add_argument("--results", help=f"results folder (default {RESULTS_DIR}; "
                        "TESTBED_VM_RESULTS)")
    parser.add_argument("--kernel", help="stock (Debian 12's) or backports "
                        "(bookworm-backports'); TESTBED_VM_KERNEL")
    parser.add_argument("--mirror", help="Debian mirror (default: this machine's apt source "
                        "for bookworm; TESTBED_VM_MIRROR)")
    parser.add_argument("--extras", help="install.sh extras for the guest's venv (default "
                        "none; TESTBED_VM_EXTRAS)")
    parser.add_argument("--smp", help="guest CPUs (default 2; TESTBED_VM_SMP)")
    parser.add_argument("--memory-mb", help="guest memory (default 4096; "
                        "TESTBED_VM_MEMORY_MB)")
    parser.add_argument("--pytest-args", help="more arguments for the guest's pytest, e.g. "
                        "'-k doctor' (TESTBED_VM_PYTEST_ARGS)")
    parser.add_argument("--rebuild", action="store_true", help="build the image even if the "
                        "cache has it")
    parser.add_argument("--keep-disks", action="store_true", help="keep the run's disks "
                        "(under the cache's runs/) for a look afterwards")
    return parser


def interrupted(signum, frame):
    raise KeyboardInterrupt(f"signal {signum}")


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        config = config_from(args, os.environ)
    except ValueError as err:
        print(f"vm-test: {err}", file=sys.stderr)
        return EXIT_USAGE
    if args.command == "plan":
        return plan(config)
    if os.geteuid() != 0:
        print("vm-test: needs root (it installs packages, builds a root file system and boots "
              "qemu): sudo make vm-test", file=sys.stderr)
        return EXIT_USAGE
    signal.signal(signal.SIGTERM, interrupted)  # ends the guest like Ctrl-C does
    return run(config, Log(), build_only=args.command == "build",
               interactive=args.command == "console")


if __name__ == "__main__":
    sys.exit(main())
