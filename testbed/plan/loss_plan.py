"""Link loss without netem (testbed/apply/bpf/loss.c), as plain data: where on the fabric each
direction of a lossy link is cut (always at the sending end's egress), the program's
per-cut configuration, and the tc and bpftool commands that attach and configure it.

A direction a -> b is lost at a's egress: a root-namespace switch port, keyed by its ifindex,
or a host's own interface inside the host's namespace, keyed by the host's MAC (host_key).
Not at the switch port's ingress: a userspace switch reads its ports with packet sockets,
which see a packet before tc ingress could drop it. On a switch port the loss filter runs
before the ECN marker (tc prio 1 and 2), so a lost packet never reaches the emulated queue,
as a packet lost on the wire between two switches would not.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from testbed.errors import ConfigError
from testbed.model.topology.base import Fabric
from testbed.plan.bpf_maps import Layout, pack_value, update_command
from testbed.plan.ecn_plan import BPF_CFLAGS, cache_dir

LOSS_SOURCE = Path(__file__).resolve().parents[1] / "apply" / "bpf" / "loss.c"
BPF_SECTION = "classifier"  # a switch port's egress, keyed by ifindex
HOST_SECTION = "host"  # a host's egress in its namespace, keyed by host_key
HOST_KEY_FLAG = 0x80000000  # HOST_KEY_FLAG in loss.c; root-namespace ifindexes never set it
FILTER_PRIO = "1"  # before the ECN marker's filter
FILTER_HANDLE = "1"
MODE_OFF, MODE_RANDOM, MODE_NTH = 0, 1, 2  # LOSS_MODE_* in loss.c
ANY_DSCP = 0xFF
CONFIG_LAYOUT: Layout = (("mode", "I"), ("probability", "I"), ("every_nth", "I"),
                         ("dscp", "I"))
COUNTERS_LAYOUT: Layout = (("matched", "Q"), ("dropped", "Q"))
MAPS = {"loss_config": CONFIG_LAYOUT, "loss_counters": COUNTERS_LAYOUT}


@dataclass(frozen=True)
class Loss:
    """How one direction loses packets: at random with ``fraction`` (0..1), or every
    ``every_nth`` packet; only packets of ``dscp`` (a traffic class) when given."""

    fraction: float = 0.0
    every_nth: int | None = None
    dscp: int | None = None

    def __post_init__(self):
        if (self.every_nth is None) == (not self.fraction):
            raise ConfigError("loss", "give a loss fraction in (0, 1] or every_nth, one of them")
        if not 0 <= self.fraction <= 1:
            raise ConfigError("loss_percent", f"must be in [0, 100], got {self.fraction * 100:g}")
        if self.every_nth is not None and self.every_nth < 1:
            raise ConfigError("every_nth", f"must be at least 1, got {self.every_nth}")
        if self.dscp is not None and not 0 <= self.dscp <= 63:
            raise ConfigError("dscp", f"must be in [0, 63], got {self.dscp}")

    def config(self) -> bytes:
        """The program's config entry (struct loss_config)."""
        if self.every_nth is not None:
            values = {"mode": MODE_NTH, "every_nth": self.every_nth}
        else:
            values = {"mode": MODE_RANDOM, "probability": probability_u32(self.fraction)}
        return pack_value(CONFIG_LAYOUT, {**values,
                                          "dscp": ANY_DSCP if self.dscp is None else self.dscp})


def is_lost(loss: Loss, seen: int, random_u32: int) -> bool:
    """The program's rule for the ``seen``-th matching packet (1-based) given the random
    number it drew: the same rule as ``lost`` in loss.c."""
    if loss.every_nth is not None:
        return seen % loss.every_nth == 0
    return random_u32 < probability_u32(loss.fraction)


def probability_u32(fraction: float) -> int:
    """``fraction`` as the program compares it with a random u32 (saturated at 2^32 - 1)."""
    return min(2**32 - 1, round(fraction * 2**32))


@dataclass(frozen=True)
class Cut:
    """Where one direction of a link is lost: the egress of interface ``intf`` of ``src``;
    ``host_key`` is set when ``src`` is a host (its interface lives in its namespace)."""

    src: str
    dst: str
    intf: str
    host_key: int | None = None

    @property
    def section(self) -> str:
        return BPF_SECTION if self.host_key is None else HOST_SECTION


def host_key(mac: str) -> int:
    """The loss program's key for a host: its MAC's low 31 bits with HOST_KEY_FLAG set."""
    value = int(mac.replace(":", ""), 16)
    return HOST_KEY_FLAG | (value & (HOST_KEY_FLAG - 1))


def direction_cut(fabric: Fabric, src: str, dst: str) -> Cut:
    """Where direction src -> dst of their link is lost."""
    for link in fabric.links:
        for end, (node, other) in enumerate(((link.a, link.b), (link.b, link.a))):
            if (node, other) != (src, dst):
                continue
            node = fabric.nodes[src]
            if not node.is_host:
                return Cut(src, dst, link.intf(end))
            if node.mac is None:
                raise ConfigError("link", f"host {src} has no MAC address to key its loss by")
            return Cut(src, dst, link.intf(end), host_key(node.mac))
    raise ConfigError("link", f"{src} and {dst} are not cabled together")


def link_cuts(fabric: Fabric, a: str, b: str) -> list[Cut]:
    """Both directions of the link between a and b."""
    return [direction_cut(fabric, a, b), direction_cut(fabric, b, a)]


def every_link_cuts(fabric: Fabric) -> list[Cut]:
    return [cut for link in fabric.links for cut in link_cuts(fabric, link.a, link.b)]


def attach_commands(cut: Cut, obj: Path) -> list[list[str]]:
    """tc commands hooking the program on ``cut`` (the clsact qdisc may exist already), run
    in the namespace of ``cut.intf`` (a host's, when ``cut.host_key`` is set)."""
    return [
        ["tc", "qdisc", "replace", "dev", cut.intf, "clsact"],
        ["tc", "filter", "replace", "dev", cut.intf, "egress", "prio", FILTER_PRIO, "handle",
         FILTER_HANDLE, "bpf", "da", "obj", str(obj), "sec", cut.section],
    ]


def off_config() -> bytes:
    """The config entry of a cut that loses nothing (yet): a failure schedule's ``impair``
    sets its loss later."""
    return pack_value(CONFIG_LAYOUT, {"mode": MODE_OFF, "dscp": ANY_DSCP})


def config_commands(key: int, loss: Loss | None) -> list[list[str]]:
    """bpftool commands zeroing a cut's counters, then writing its config (None: losing
    nothing until a scheduled fault); ``key``: the switch port's ifindex or the host's
    host_key."""
    return [update_command("loss_counters", key, pack_value(COUNTERS_LAYOUT, {})),
            loss_config_command(key, loss)]


def loss_config_command(key: int, loss: Loss | None) -> list[str]:
    """The bpftool command setting one cut's loss (None: none), counters untouched."""
    return update_command("loss_config", key, off_config() if loss is None else loss.config())


def cache_object() -> Path:
    """Where the compiled program is kept (beside the ECN marker's, in the cache)."""
    return cache_dir() / "bpf" / "loss.o"


def compile_command(source: Path = LOSS_SOURCE, output: Path | None = None) -> list[str]:
    return ["clang", *BPF_CFLAGS, "-c", str(source), "-o", str(output or cache_object())]


def loss_counters_total(counters: dict[int, dict[str, int]]) -> dict[str, int]:
    return {"matched": sum(c["matched"] for c in counters.values()),
            "dropped": sum(c["dropped"] for c in counters.values())}


