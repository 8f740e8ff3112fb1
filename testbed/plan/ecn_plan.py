"""ECN marking's plans beside the queue: which path marks (``choose_ecn_path``), the RED
qdisc's parameters, and the eBPF marker's object, maps and bpftool commands; computed here,
run as root by the fabric layer. The queue itself, marker and RED included, is each port's
plan (``testbed.plan.port_queue``).

Two paths, chosen from the capabilities report (``testbed.capabilities``):

- ``red-qdisc``, where the kernel has sch_red: a RED qdisc with ``ecn`` is each buffer (with
  traffic classes each class's queue), so each marks on its own backlog. Linux RED marks on
  an average queue, whose weight 2^-Wlog tc derives from ``burst``; the smallest burst tc
  accepts is used, so the average follows the queue closely, but it is not the
  instantaneous queue (see ``red_parameters``).
- ``ebpf`` otherwise: ``bpf/ecn_marker.c`` as a clsact egress classifier keeps a virtual
  copy of the port's FIFO and marks on its instantaneous backlog (with traffic classes, the
  port's backlog over all its classes). The real FIFO has the queue's byte limit (the copy
  assumes it); after tc attaches the marker, bpftool writes the port's config entry (and
  zeroed state) into the pinned maps::

    bpftool map update pinned /sys/fs/bpf/tc/globals/ecn_config key hex <ifindex> \\
        value hex <MarkerConfig bytes>

  The first attach creates and pins the maps; later attaches reuse them, so every port
  shares them, keyed by ifindex (root namespace only). Pins outlive the programs: remove
  ``pinned_map_paths()`` after the last port is detached, or a later run inherits them.

The ports join their bridges with OVS's ``linux-noop`` QoS, so OVS leaves the root qdisc
alone; OVS does delete a port's ingress qdisc when it configures policing, but by kind
("ingress"), which the kernel refuses for a clsact, so the marker's hook survives too.
"""
from __future__ import annotations

import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import astuple, dataclass
from pathlib import Path, PurePosixPath

from testbed.capabilities import (
    ECN_PATH_EBPF,
    ECN_PATH_NEEDS,
    ECN_PATH_RED,
    Platform,
    missing_capabilities,
)
from testbed.errors import ConfigError, TestbedError
from testbed.model.topology.checks import check_count, check_mtu, check_rate
# pack_value and unpack_value are imported from here by the marker's callers too
from testbed.plan.bpf_maps import (  # noqa: F401
    Layout,
    layout_struct,
    pack_value,
    pin_path,
    unpack_value,
    update_command,
)
from testbed.plan.profiles import (
    U32_MAX,
    EcnProfile,
    QueueConfig,
    RedEcn,
    StepEcn,
    drained_bytes,
)

ECN_PATHS = (ECN_PATH_RED, ECN_PATH_EBPF)  # the values of testbed.capabilities.Paths.ecn_marking

BPF_SOURCE = Path(__file__).resolve().parents[1] / "apply" / "bpf" / "ecn_marker.c"


def cache_dir() -> Path:
    """Where built artefacts go: never next to the installed package, which may not be
    writable. TESTBED_CACHE_DIR, else /var/cache/testbed for root, else ~/.cache/testbed."""
    if os.environ.get("TESTBED_CACHE_DIR"):
        return Path(os.environ["TESTBED_CACHE_DIR"])
    if os.geteuid() == 0:
        return Path("/var/cache/testbed")
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "testbed"


BPF_OBJECT = cache_dir() / "bpf" / "ecn_marker.o"
BPF_SECTION = "classifier"
# Kept equal to the Makefile's ``bpf`` target (a unit test compares them). Debian keeps
# asm/types.h under the multiarch directory, which clang -target bpf does not search.
BPF_CFLAGS = ("-O2", "-g", "-Wall", "-target", "bpf",
              f"-I/usr/include/{os.uname().machine}-linux-gnu")

MODE_OFF, MODE_STEP, MODE_RED = 0, 1, 2  # ECN_MODE_* in ecn_marker.c
# drained_bytes in ecn_marker.c multiplies the rate by up to 1e9 ns in 64 bits.
MAX_RATE_BYTES_PER_S = U32_MAX

# Map value layouts, field by field as the C structs declare them (testbed.plan.bpf_maps packs
# and unpacks them).
CONFIG_LAYOUT: Layout = (("rate_bytes_per_s", "Q"), ("limit_bytes", "I"), ("mode", "I"),
                         ("k_bytes", "I"), ("kmin_bytes", "I"), ("kmax_bytes", "I"),
                         ("pmax", "I"))
STATE_LAYOUT: Layout = (("lock", "I"), ("pad", "I"), ("queue_bytes", "Q"), ("last_ns", "Q"),
                        ("anchor_seq", "Q"))
COUNTERS_LAYOUT: Layout = (*((name, "Q") for name in (
    "packets", "bytes", "ect_packets", "ce_marks", "ce_arrived", "not_ect_over",
    "fifo_drops", "max_queue_bytes", "anchors")),
    ("anchor_error_bytes", "q"),  # signed: the model above the anchored backlog is > 0
    ("anchor_abs_error_bytes", "Q"), ("anchor_max_abs_error_bytes", "Q"))
QDEPTH_LAYOUT: Layout = (("queue_bytes", "Q"), ("time_ns", "Q"), ("accepted_bytes", "Q"))
# A reading of a port's real backlog, written by the anchor agent (testbed.apply.ecn_anchor)
# in place under the element's lock (bpf_syscall.BPF_F_LOCK), so the marker never reads it torn.
ANCHOR_LAYOUT: Layout = (("lock", "I"), ("pad", "I"), ("backlog_bytes", "Q"), ("time_ns", "Q"),
                         ("accepted_bytes", "Q"), ("seq", "Q"))
# Map name -> value layout; each map's value is the C struct of the same name.
MAPS: dict[str, Layout] = {
    "ecn_config": CONFIG_LAYOUT,
    "ecn_state": STATE_LAYOUT,
    "ecn_counters": COUNTERS_LAYOUT,
    "ecn_qdepth": QDEPTH_LAYOUT,
    "ecn_anchor": ANCHOR_LAYOUT,
}
# --- the marker's per-port config -------------------------------------------------------------


@dataclass(frozen=True)
class MarkerConfig:
    """One port's ``struct ecn_config`` (fields in its order)."""

    rate_bytes_per_s: int
    limit_bytes: int
    mode: int
    k_bytes: int = 0
    kmin_bytes: int = 0
    kmax_bytes: int = 0
    pmax: int = 0  # probability at kmax, as pmax / 2^32

    def pack(self) -> bytes:
        return layout_struct(CONFIG_LAYOUT).pack(*astuple(self))


def pmax_to_u32(pmax: float) -> int:
    """A probability as the marker's 32-bit fraction (pmax / 2^32; 1.0 is 2^32 - 1)."""
    return min(round(pmax * 2**32), U32_MAX)


def rate_bytes_per_s(rate_mbit: float) -> int:
    """The HTB class rate in bytes/s, as tc's ``{rate_mbit}mbit`` sets it."""
    check_rate("rate_mbit", rate_mbit)
    rate = round(rate_mbit * 1e6 / 8)
    if not 1 <= rate <= MAX_RATE_BYTES_PER_S:
        raise ConfigError("rate_mbit", f"{rate_mbit} is outside what the eBPF marker handles "
                                       f"(1 B/s to {MAX_RATE_BYTES_PER_S * 8 / 1e6:.0f} Mbit/s)")
    return rate


def marker_config(rate_mbit: float, queue: QueueConfig) -> MarkerConfig:
    """The marker's config for a port shaped to ``rate_mbit`` with ``queue``; a queue
    without ECN gets MODE_OFF (the marker then only counts and samples)."""
    common = {"rate_bytes_per_s": rate_bytes_per_s(rate_mbit), "limit_bytes": queue.buffer_bytes}
    ecn = queue.ecn
    if isinstance(ecn, StepEcn):
        return MarkerConfig(mode=MODE_STEP, k_bytes=ecn.k_bytes, **common)
    if isinstance(ecn, RedEcn):
        return MarkerConfig(mode=MODE_RED, kmin_bytes=ecn.kmin_bytes, kmax_bytes=ecn.kmax_bytes,
                            pmax=pmax_to_u32(ecn.pmax), **common)
    return MarkerConfig(mode=MODE_OFF, **common)


# --- commands ---------------------------------------------------------------------------------


def compile_command(source: Path = BPF_SOURCE, output: Path = BPF_OBJECT) -> list[str]:
    """clang compiling the marker (as ``make bpf`` does)."""
    return ["clang", *BPF_CFLAGS, "-c", str(source), "-o", str(output)]


def pinned_map_path(map_name: str) -> PurePosixPath:
    if map_name not in MAPS:
        raise ValueError(f"no map {map_name!r}; the marker has {', '.join(MAPS)}")
    return pin_path(map_name)


def pinned_map_paths() -> list[PurePosixPath]:
    return [pinned_map_path(name) for name in MAPS]


def map_update_command(map_name: str, ifindex: int, value: bytes) -> list[str]:
    """bpftool writing ``value`` for ``ifindex`` into one of the marker's pinned maps."""
    check_count("ifindex", ifindex, 1, U32_MAX)
    pinned_map_path(map_name)  # one of the marker's
    return update_command(map_name, ifindex, value)


def ebpf_config_commands(ifindex: int, config: MarkerConfig) -> list[list[str]]:
    """bpftool commands giving port ``ifindex`` a fresh virtual queue, zero counters, an
    anchor with seq 0 (none yet: the anchor agent then rewrites it in place) and ``config``;
    the config goes last, since the marker ignores ports without one."""
    zeroed = [map_update_command(name, ifindex, pack_value(layout, {}))
              for name, layout in MAPS.items() if name != "ecn_config"]
    return zeroed + [map_update_command("ecn_config", ifindex, config.pack())]


def queue_bytes_at(sample: Mapping[str, int], rate_bytes_per_s: int, now_ns: int) -> int:
    """A port's virtual backlog at ``now_ns`` (CLOCK_MONOTONIC, ``time.monotonic_ns()``)
    from its latest ``ecn_qdepth`` sample: drained since, with no arrivals."""
    elapsed = max(0, now_ns - sample["time_ns"])
    return max(0, sample["queue_bytes"] - drained_bytes(rate_bytes_per_s, elapsed))


def batch_input(commands: Iterable[Sequence[str]], program: str) -> str:
    """Commands of one ``program`` as ``tc -batch -`` / ``bpftool batch file -`` input.
    Batch lines are split on blanks, so no argument may contain one (or a quote)."""
    lines = []
    for argv in commands:
        if not argv or argv[0] != program:
            raise ValueError(f"not a {program} command: {argv!r}")
        for arg in argv[1:]:
            if not arg or any(ch.isspace() or ch in "\"'#\\" for ch in arg):
                raise ValueError(f"argument {arg!r} cannot go in a batch line")
        lines.append(" ".join(argv[1:]))
    return "\n".join(lines) + "\n"


# --- the standard path: RED qdisc -------------------------------------------------------------


def red_ewma_log(qmin_bytes: int, burst: int, avpkt_bytes: int) -> int | None:
    """Wlog that tc derives for RED's average (weight 2^-Wlog), or None where tc refuses:
    the smallest Wlog with burst + 1 - qmin/avpkt <= (1 - (1 - W)^burst) / W (iproute2
    tc/tc_red.c, tc_red_eval_ewma)."""
    a = burst + 1 - qmin_bytes / avpkt_bytes
    if a < 1.0:
        return None
    weight = 0.5
    for wlog in range(1, 32):
        if a <= (1 - (1 - weight) ** burst) / weight:
            return wlog
        weight /= 2
    return None


@dataclass(frozen=True)
class RedParameters:
    """Arguments of a ``tc ... red`` qdisc for an ECN profile."""

    min_bytes: int
    max_bytes: int
    probability: float
    avpkt_bytes: int
    burst: int
    ewma_log: int  # RED averages the queue with weight 2^-ewma_log


def red_parameters(profile: EcnProfile, mtu_bytes: int) -> RedParameters:
    """RED thresholds for ``profile``. A step at K is a ramp from K to K + 1 byte with
    probability 1; ``burst`` is the smallest tc accepts (tc's own hint, 1 + min/avpkt),
    which gives the average its largest weight."""
    check_mtu(mtu_bytes)
    if isinstance(profile, StepEcn):
        qmin, qmax, probability = profile.k_bytes, profile.k_bytes + 1, 1.0
    else:
        qmin, qmax, probability = profile.kmin_bytes, profile.kmax_bytes, profile.pmax
    burst = 1 + qmin // mtu_bytes
    wlog = red_ewma_log(qmin, burst, mtu_bytes)
    if wlog is None:
        raise ConfigError("ecn", f"the RED qdisc cannot average a threshold of {qmin} B with "
                                 f"{mtu_bytes}-byte packets: it must exceed one packet")
    return RedParameters(qmin, qmax, probability, mtu_bytes, burst, wlog)


# --- choosing and planning --------------------------------------------------------------------


def check_ecn_path(path: str | None, field: str = "ecn_path") -> None:
    """A marking path is one of ECN_PATHS (None: not chosen yet)."""
    if path is not None and path not in ECN_PATHS:
        raise ConfigError(field, f"must be one of {', '.join(ECN_PATHS)}, got {path!r}")


def choose_ecn_path(report: Platform, prefer: str | None = None,
                    object_built: bool = False) -> str:
    """The marking path for this machine: the capabilities report's choice, or ``prefer``
    (e.g. the eBPF path on a kernel with RED, to compare the two) when the machine can take
    it. Each path needs what ``testbed.capabilities.ECN_PATH_NEEDS`` lists, the eBPF path
    clang only while the object is not built."""
    check_ecn_path(prefer)
    path = prefer or report.paths.ecn_marking
    way = "RED qdisc" if path == ECN_PATH_RED else "eBPF"
    needed = [name for name in ECN_PATH_NEEDS[path] if not (object_built and name == "clang")]
    lacking = missing_capabilities(report.capabilities, needed)
    if lacking:
        raise TestbedError(f"ECN marking by {way} is not possible here: {lacking[0].detail}")
    return path

