"""What this machine's kernel and userland can do, and which path each testbed feature takes.

Development VMs run a stripped kernel (no openvswitch module, no RED or netem qdisc, no DCTCP,
no RDMA, no module loading at all) while a stock Ubuntu kernel has everything, so the testbed
detects instead of assuming (docs/platforms.md).

Compute, then apply: ``probe_capabilities`` and ``choose_paths`` are pure functions of plain
inputs (kernel config, module names, congestion-control names, tool presence) and are unit
tested without root. ``detect`` is the thin layer that reads those inputs from /proc, /boot,
/lib/modules, PATH (with the system's sbin folders, which an ordinary user's PATH lacks) and
the Python it runs in (Mininet is a Python package: it counts only when it imports); it
changes nothing on the machine.

Availability rule for a kernel feature, first match wins:
  1. its module is loaded                                    -> available
  2. its CONFIG_ option is ``y``, or modules.builtin lists it -> available (built in)
  3. a module file for it exists and modules can be loaded   -> available (loadable)
  4. otherwise                                               -> unavailable
``m`` alone proves nothing (the module may be missing from disk, or loading may be impossible),
so an ``m`` counts only through rule 3. Module files are the ones modprobe would load:
modules.dep under /lib/modules/<release> lists them (else the module trees are walked).
Module loading counts as impossible only when the kernel config says ``# CONFIG_MODULES is not
set``. With no readable kernel config the decision rests on rules 1 to 3 and the detail says
so. A loadable feature is loaded by whatever takes its path, before use
(testbed.apply.modules).

One capability is decided by trying, not by reading: ``rxe_netns``, whether softRoCE connects
two network namespaces on this kernel (testbed.apply.rxe_probe; ``testbed doctor`` runs it as
root). ``with_probe`` adds its result, and where it failed RoCE takes the user-space engine.
"""
from __future__ import annotations

import gzip
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

# --- data types -----------------------------------------------------------------------------


@dataclass(frozen=True)
class Capability:
    """One thing the machine can or cannot do, and how that was decided."""

    name: str  # e.g. "ovs_kernel_module"
    available: bool
    detail: str  # how it was determined, e.g. "CONFIG_OPENVSWITCH not set"


@dataclass(frozen=True)
class Paths:
    """Which implementation each testbed feature uses on this machine."""

    ovs_datapath: str  # "kernel" (datapath_type=system) or "userspace" (datapath_type=netdev)
    ecn_marking: str  # "red-qdisc" or "ebpf"
    tcp_congestion: str  # "dctcp", "cubic+ecn", or "reno+ecn" if cubic is missing
    rdma: str  # "rxe" or "userspace-roce"
    delay_loss: str  # "netem", "ebpf-loss" (loss only, testbed/apply/bpf/loss.c) or "none"
    pfc: str  # always "tbf-pause-agent": no kernel has PFC on veths, so it is emulated
    # How packets cross the switches: "kernel" (the kernel datapath, offloads native),
    # "userspace-tso" (the userspace datapath passing segmentation-offloaded packets) or
    # "userspace" (one MTU-sized packet at a time, offloads off)
    ovs_offload: str = "userspace"


@dataclass(frozen=True)
class Platform:
    """What ``detect`` found: the running kernel, every capability, and the chosen paths."""

    kernel_release: str
    capabilities: dict[str, Capability]
    paths: Paths


@dataclass(frozen=True)
class KernelFeature:
    """A kernel feature decided from a CONFIG_ option, a module, and (for TCP) a CC name."""

    name: str
    config_option: str
    module: str | None = None  # None: a bool option, never a module
    congestion: str | None = None  # name in tcp_available_congestion_control


# In report order. Module names use underscores, as /proc/modules does.
KERNEL_FEATURES: tuple[KernelFeature, ...] = (
    KernelFeature("ovs_kernel_module", "CONFIG_OPENVSWITCH", "openvswitch"),
    KernelFeature("sch_red", "CONFIG_NET_SCH_RED", "sch_red"),
    KernelFeature("sch_netem", "CONFIG_NET_SCH_NETEM", "sch_netem"),
    KernelFeature("sch_htb", "CONFIG_NET_SCH_HTB", "sch_htb"),
    KernelFeature("sch_tbf", "CONFIG_NET_SCH_TBF", "sch_tbf"),
    KernelFeature("cls_bpf", "CONFIG_NET_CLS_BPF", "cls_bpf"),
    KernelFeature("act_mirred", "CONFIG_NET_ACT_MIRRED", "act_mirred"),
    KernelFeature("bpf_jit", "CONFIG_BPF_JIT"),
    KernelFeature("tcp_dctcp", "CONFIG_TCP_CONG_DCTCP", "tcp_dctcp", congestion="dctcp"),
    KernelFeature("tcp_cubic", "CONFIG_TCP_CONG_CUBIC", "tcp_cubic", congestion="cubic"),
    KernelFeature("rdma_rxe", "CONFIG_RDMA_RXE", "rdma_rxe"),
    KernelFeature("ip_route_multipath", "CONFIG_IP_ROUTE_MULTIPATH"),
)

# Capability name -> command looked up on PATH and in SYSTEM_BIN_DIRS, or (MININET_MODULE) a
# Python module that must import. ``probe_capabilities`` takes ``tools`` keyed by these.
MININET_MODULE = "mininet.node"
TOOL_COMMANDS: dict[str, str] = {
    "ovs_vswitchd": "ovs-vswitchd",
    "mininet": MININET_MODULE,
    "iperf3": "iperf3",
    "tcpdump": "tcpdump",
    "tshark": "tshark",
    "clang": "clang",
    "ethtool": "ethtool",
    "tc": "tc",
    "bpftool": "bpftool",
}

PYTHON_MODULES = frozenset({MININET_MODULE})
# Where tc, ethtool, bpftool and ovs-vswitchd live; root's PATH has them, a user's often not.
SYSTEM_BIN_DIRS = ("/usr/local/sbin", "/usr/sbin", "/sbin")

PFC_PATH = "tbf-pause-agent"  # per-class tbf queues paused by real 802.1Qbb frames (testbed.apply.pfc_agent)
ECN_PATH_RED = "red-qdisc"
ECN_PATH_EBPF = "ebpf"
# What each ECN marking path needs (testbed.plan.ecn_plan plans it, testbed.apply.marking runs
# it): RED takes the place of each port's FIFO; the eBPF marker is compiled by clang,
# attached by tc and configured and read through its pinned maps by bpftool.
ECN_PATH_NEEDS: dict[str, tuple[str, ...]] = {
    ECN_PATH_RED: ("sch_red", "tc"),
    ECN_PATH_EBPF: ("cls_bpf", "tc", "clang", "bpftool"),
}
ECN_PATH_WAYS = {
    ECN_PATH_RED: "a RED qdisc with ecn in place of each switch port's FIFO",
    ECN_PATH_EBPF: "the eBPF marker, a tc egress classifier beside each switch port's FIFO",
}

# Where ``detect`` looks; module trees are relative to /lib/modules/<release>.
PROC_CONFIG_GZ = Path("/proc/config.gz")
BOOT_DIR = Path("/boot")
PROC_MODULES = Path("/proc/modules")
LIB_MODULES = Path("/lib/modules")
MODULE_SUBTREES = ("kernel/net", "kernel/drivers/infiniband")
TCP_CONGESTION_AVAILABLE = Path("/proc/sys/net/ipv4/tcp_available_congestion_control")
MODULE_SUFFIXES = (".ko", ".ko.xz", ".ko.zst", ".ko.gz")
MODULES_DEP = "modules.dep"  # under /lib/modules/<release>: every module modprobe can load
MODULES_BUILTIN = "modules.builtin"  # ... and every module built into the kernel

# --- pure parsing -----------------------------------------------------------------------------


def parse_kernel_config(text: str) -> dict[str, str]:
    """Kernel .config text -> {option: value}.

    ``CONFIG_X=y`` gives {"CONFIG_X": "y"}; ``# CONFIG_Y is not set`` gives {"CONFIG_Y": "n"};
    quoted string values lose their quotes; other comments and blank lines are ignored.
    """
    options: dict[str, str] = {}
    for raw_line in text.splitlines():
        line = raw_line.strip()
        if line.startswith("# CONFIG_") and line.endswith(" is not set"):
            options[line[2 : -len(" is not set")].strip()] = "n"
        elif line.startswith("CONFIG_") and "=" in line:
            option, value = line.split("=", 1)
            value = value.strip()
            if len(value) >= 2 and value[0] == value[-1] == '"':
                value = value[1:-1]
            options[option.strip()] = value
    return options


def parse_proc_modules(text: str) -> set[str]:
    """/proc/modules text -> names of loaded modules (first field of each line)."""
    return {line.split()[0] for line in text.splitlines() if line.strip()}


def module_name_from_filename(filename: str) -> str | None:
    """``sch_red.ko.zst`` -> ``sch_red``; dashes become underscores like the kernel's names.

    None if the file is not a kernel module.
    """
    for suffix in MODULE_SUFFIXES:
        if filename.endswith(suffix) and len(filename) > len(suffix):
            return filename[: -len(suffix)].replace("-", "_")
    return None


def parse_module_list(text: str) -> set[str]:
    """modules.dep or modules.builtin text -> module names: each line starts with the
    module's path (``kernel/net/sched/sch_red.ko.xz:`` ...)."""
    names = set()
    for line in text.splitlines():
        path = line.split(":", 1)[0].strip()
        name = module_name_from_filename(path.rsplit("/", 1)[-1]) if path else None
        if name is not None:
            names.add(name)
    return names


def parse_congestion_available(text: str) -> set[str]:
    """tcp_available_congestion_control text (``reno bbr cubic``) -> {"reno", "bbr", "cubic"}."""
    return set(text.split())


# --- pure decisions ---------------------------------------------------------------------------


def _probe_kernel_feature(
    feature: KernelFeature,
    kconfig: dict[str, str] | None,
    loaded_modules: set[str],
    module_files: set[str],
    congestion_available: set[str],
    builtin_modules: set[str] = frozenset(),
) -> Capability:
    """Apply the module docstring's availability rule to one kernel feature."""

    def result(available: bool, detail: str) -> Capability:
        return Capability(feature.name, available, detail)

    if feature.congestion is not None and feature.congestion in congestion_available:
        return result(True, f"{feature.congestion} in tcp_available_congestion_control")
    module = feature.module
    if module is not None and module in loaded_modules:
        return result(True, f"module {module} loaded")

    has_file = module is not None and module in module_files
    if kconfig is None:
        prefix = "no kernel config readable"
        if module is not None and module in builtin_modules:
            return result(True, f"{prefix}; {module} in modules.builtin (built in)")
        if module is None:
            return result(False, f"{prefix}; {feature.config_option} unknown")
        if has_file:
            return result(True, f"{prefix}; loadable module {module}")
        return result(False, f"{prefix}; module {module} not loaded and no module file")

    value = kconfig.get(feature.config_option)
    modules_loadable = kconfig.get("CONFIG_MODULES") != "n"
    if value == "y":
        return result(True, f"{feature.config_option}=y (built in)")
    if value is None:
        config_says = f"{feature.config_option} not in kernel config"
    elif value == "n":
        config_says = f"{feature.config_option} not set"
    else:
        config_says = f"{feature.config_option}={value}"
    if has_file and modules_loadable:
        return result(True, f"loadable module {module} ({config_says})")
    if has_file:
        return result(
            False,
            f"{config_says}; module file {module} present but CONFIG_MODULES not set",
        )
    if value == "m":
        return result(False, f"{config_says} but no module file {module} (cannot load)")
    return result(False, config_says)


USERSPACE_TSO_SINCE = {"ovs": (2, 13), "kernel": (4, 19)}  # OVS's userspace TSO; AF_PACKET GSO fix


def version_tuple(text: str | None) -> tuple[int, ...] | None:
    """``3.1.0`` or ``6.18.44-fc-v782`` -> (3, 1, 0) / (6, 18, 44); None when unreadable."""
    import re

    match = re.match(r"(\d+)\.(\d+)(?:\.(\d+))?", text or "")
    return tuple(int(x) for x in match.groups(default="0")) if match else None


def userspace_tso_capability(ovs_version: str | None, kernel_release: str | None) -> Capability:
    """Whether the userspace datapath can pass segmentation-offloaded packets: Open vSwitch
    2.13 or later (userspace-tso-enable) on a kernel of 4.19 or later (AF_PACKET with
    virtio-net headers)."""
    ovs, kernel = version_tuple(ovs_version), version_tuple(kernel_release)
    need_ovs, need_kernel = USERSPACE_TSO_SINCE["ovs"], USERSPACE_TSO_SINCE["kernel"]
    if ovs is None:
        return Capability("ovs_userspace_tso", False, "Open vSwitch's version is unknown")
    if ovs[:2] < need_ovs:
        return Capability("ovs_userspace_tso", False, f"Open vSwitch {ovs_version} is older "
                          f"than {'.'.join(map(str, need_ovs))}")
    if kernel is None or kernel[:2] < need_kernel:
        return Capability("ovs_userspace_tso", False, f"kernel {kernel_release} is older than "
                          f"{'.'.join(map(str, need_kernel))}")
    return Capability("ovs_userspace_tso", True, f"Open vSwitch {ovs_version} on kernel "
                      f"{kernel_release}: userspace-tso-enable")


def probe_capabilities(
    kconfig: dict[str, str] | None,
    loaded_modules: set[str],
    module_files: set[str],
    congestion_available: set[str],
    tools: dict[str, bool],
    ovs_version: str | None = None,
    kernel_release: str | None = None,
    builtin_modules: set[str] = frozenset(),
) -> dict[str, Capability]:
    """Decide every capability from plain inputs; reads nothing.

    kconfig: parsed kernel config, or None if none could be read.
    loaded_modules: module names as in /proc/modules.
    module_files: module basenames found on disk, without .ko/.ko.xz/.ko.zst.
    builtin_modules: module names modules.builtin lists (built into the kernel).
    congestion_available: names from tcp_available_congestion_control.
    tools: command or module name (a value of TOOL_COMMANDS, e.g. "tc") -> found on PATH
        (a module: imports); a missing key counts as not found.
    Returns capabilities keyed by name, kernel features first, in report order.
    """
    loaded = {name.replace("-", "_") for name in loaded_modules}
    files = {name.replace("-", "_") for name in module_files}
    builtin = {name.replace("-", "_") for name in builtin_modules}
    caps: dict[str, Capability] = {}
    for feature in KERNEL_FEATURES:
        caps[feature.name] = _probe_kernel_feature(
            feature, kconfig, loaded, files, congestion_available, builtin
        )
    for name, command in TOOL_COMMANDS.items():
        found = tools.get(command, False)
        if command in PYTHON_MODULES:
            detail = f"import {command} {'works' if found else 'fails'}"
        else:
            detail = f"{command} {'on' if found else 'not on'} PATH"
        caps[name] = Capability(name, found, detail)
    caps["ovs_userspace_tso"] = userspace_tso_capability(ovs_version, kernel_release)
    return caps


# TESTBED_DATAPATH=user: the userspace datapath even where the kernel module exists (to
# compare the two on one machine, as `testbed bench --userspace-datapath` does).
DATAPATH_ENV = "TESTBED_DATAPATH"
USERSPACE_DATAPATH = "user"


def choose_paths(caps: dict[str, Capability]) -> Paths:
    """Pick each feature's implementation; a capability missing from caps counts as absent."""

    def has(name: str) -> bool:
        cap = caps.get(name)
        return cap is not None and cap.available

    if has("tcp_dctcp"):
        tcp_congestion = "dctcp"
    elif has("tcp_cubic"):
        tcp_congestion = "cubic+ecn"
    else:
        tcp_congestion = "reno+ecn"  # reno is always built in
    kernel_datapath = (has("ovs_kernel_module")
                       and os.environ.get(DATAPATH_ENV, "") != USERSPACE_DATAPATH)
    if kernel_datapath:
        offload = "kernel"
    elif has("ovs_userspace_tso") and os.environ.get("TESTBED_USERSPACE_TSO", "1") != "0":
        offload = "userspace-tso"
    else:
        offload = "userspace"
    return Paths(
        ovs_datapath="kernel" if kernel_datapath else "userspace",
        ecn_marking=ECN_PATH_RED if has("sch_red") else ECN_PATH_EBPF,
        tcp_congestion=tcp_congestion,
        rdma="rxe" if has("rdma_rxe") and rxe_connects(caps) else "userspace-roce",
        delay_loss="netem" if has("sch_netem") else "ebpf-loss" if has("cls_bpf") else "none",
        pfc=PFC_PATH,
        ovs_offload=offload,
    )


def fabric_datapath(paths: Paths) -> str:
    """The ``datapath`` argument of testbed.apply.network.FabricNetwork for ``paths``."""
    return "kernel" if paths.ovs_datapath == "kernel" else USERSPACE_DATAPATH


RXE_NETNS = "rxe_netns"  # the rxe probe's capability (testbed.apply.rxe_probe)


def rxe_connects(caps: dict[str, Capability]) -> bool:
    """Whether softRoCE may be taken: yes unless the rxe probe ran and failed."""
    probed = caps.get(RXE_NETNS)
    return probed is None or probed.available


def with_probe(platform: Platform, probed: Capability) -> Platform:
    """``platform`` with a capability decided by trying (the rxe probe's) added, and every
    path chosen again."""
    caps = {**platform.capabilities, probed.name: probed}
    return Platform(platform.kernel_release, caps, choose_paths(caps))


def missing_capabilities(caps: dict[str, Capability], names) -> list[Capability]:
    """The capabilities among ``names`` that this machine lacks; one never probed counts as
    lacking, with a detail that says so."""
    lacking = []
    for name in names:
        cap = caps.get(name)
        if cap is None:
            lacking.append(Capability(name, False, f"{name} was not probed"))
        elif not cap.available:
            lacking.append(cap)
    return lacking


def ecn_marking_summary(platform: Platform) -> str:
    """One line: the ECN marking path this machine takes, why, and whether it can run."""
    path = platform.paths.ecn_marking
    red = platform.capabilities.get("sch_red")
    why = "" if path == ECN_PATH_RED or red is None else f"; no sch_red: {red.detail}"
    lacking = missing_capabilities(platform.capabilities, ECN_PATH_NEEDS[path])
    state = ("ready" if not lacking
             else "cannot run: " + "; ".join(cap.detail for cap in lacking))
    return f"ECN marking here: {path}, by {ECN_PATH_WAYS[path]}{why}; {state}"


# Features whose code exists today; the others show the path they will take once built.
IMPLEMENTED_FEATURES = frozenset({"ovs_datapath", "ovs_offload", "ecn_marking",
                                  "tcp_congestion", "pfc", "delay_loss", "rdma"})
RDMA_WAYS = {
    "userspace-roce": "the user-space RoCEv2 engine (testbed.traffic.roce) in every host",
    "rxe": "the kernel's softRoCE (rdma_rxe) driven by perftest where asked (transport: rxe), "
           "and the user-space RoCEv2 engine (testbed.traffic.roce) everywhere",
}


def rdma_summary(platform: Platform) -> str:
    """One line: how RoCE runs here, and why not over rxe when it cannot."""
    path = platform.paths.rdma
    rxe = platform.capabilities.get("rdma_rxe")
    probed = platform.capabilities.get(RXE_NETNS)
    if path == "rxe" or rxe is None:
        why = ""
    elif not rxe.available:
        why = f"; no rxe: {rxe.detail}"
    else:
        why = f"; rxe does not connect two network namespaces here: {probed.detail}"
    return f"RDMA here: {path}, by {RDMA_WAYS[path]}{why}"


def capability_rows(platform: Platform) -> list[tuple[str, str, str]]:
    """(capability, yes/no, how it was decided), in report order."""
    return [(cap.name, "yes" if cap.available else "no", cap.detail)
            for cap in platform.capabilities.values()]


def path_rows(platform: Platform) -> list[tuple[str, str]]:
    """(feature, the path it takes here), saying which features are not built yet."""
    return [(feature, path if feature in IMPLEMENTED_FEATURES
             else f"{path}  (chosen path; feature not built yet)")
            for feature, path in vars(platform.paths).items()]


# --- thin layer: read the machine -------------------------------------------------------------


def _read_text(path: Path) -> str | None:
    try:
        return path.read_text()
    except OSError:
        return None


def read_kernel_config(release: str) -> dict[str, str] | None:
    """Parsed /proc/config.gz, else /boot/config-<release>, else None."""
    try:
        with gzip.open(PROC_CONFIG_GZ, "rt") as config_file:
            return parse_kernel_config(config_file.read())
    except (OSError, EOFError):
        pass
    text = _read_text(BOOT_DIR / f"config-{release}")
    return None if text is None else parse_kernel_config(text)


def read_builtin_modules(release: str) -> set[str]:
    """Modules built into the running kernel (its modules.builtin; empty when absent)."""
    return parse_module_list(_read_text(LIB_MODULES / release / MODULES_BUILTIN) or "")


def find_module_files(release: str) -> set[str]:
    """Kernel modules modprobe can load: those modules.dep lists, else the basenames under
    /lib/modules/<release>/kernel/{net,drivers/infiniband}."""
    listed = _read_text(LIB_MODULES / release / MODULES_DEP)
    if listed is not None:
        return parse_module_list(listed)
    names: set[str] = set()
    for subtree in MODULE_SUBTREES:
        root = LIB_MODULES / release / subtree
        for _dirpath, _dirnames, filenames in os.walk(root):
            for filename in filenames:
                name = module_name_from_filename(filename)
                if name is not None:
                    names.add(name)
    return names


def detect() -> Platform:
    """Read this machine's kernel config, modules, congestion controls and tools; decide."""
    release = os.uname().release
    caps = probe_capabilities(
        kconfig=read_kernel_config(release),
        loaded_modules=parse_proc_modules(_read_text(PROC_MODULES) or ""),
        module_files=find_module_files(release),
        congestion_available=parse_congestion_available(
            _read_text(TCP_CONGESTION_AVAILABLE) or ""
        ),
        tools={command: (import_problem(command) is None if command in PYTHON_MODULES
                         else find_tool(command) is not None)
               for command in TOOL_COMMANDS.values()},
        ovs_version=ovs_vswitchd_version(),
        kernel_release=release,
        builtin_modules=read_builtin_modules(release),
    )
    return Platform(kernel_release=release, capabilities=caps, paths=choose_paths(caps))


def tool_search_path(path: str | None = None) -> str:
    """PATH (``path``, else this process's) with the system's sbin folders after it."""
    given = [d for d in (os.environ.get("PATH", "") if path is None else path).split(os.pathsep)
             if d]
    return os.pathsep.join([*given, *(d for d in SYSTEM_BIN_DIRS if d not in given)])


def find_tool(command: str) -> str | None:
    """The full path of ``command`` on PATH or in the sbin folders, None when absent."""
    return shutil.which(command, path=tool_search_path())


def import_problem(module: str) -> str | None:
    """None when ``module`` imports in this Python, else why not (one line)."""
    import importlib

    try:
        importlib.import_module(module)
    except Exception as exc:  # any failure to import makes it unusable
        return f"cannot import {module}: {' '.join(str(exc).split()) or type(exc).__name__}"
    return None


def ovs_vswitchd_version() -> str | None:
    """``3.1.0`` from ``ovs-vswitchd --version``; None without Open vSwitch."""
    import subprocess

    vswitchd = find_tool("ovs-vswitchd")
    if vswitchd is None:
        return None
    try:
        out = subprocess.run([vswitchd, "--version"], capture_output=True, text=True,
                             timeout=5).stdout
    except (OSError, subprocess.TimeoutExpired):
        return None
    first = out.splitlines()[0] if out else ""
    return first.rsplit(" ", 1)[-1] or None
