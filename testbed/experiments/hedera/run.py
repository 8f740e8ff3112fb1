"""ECMP measured against single-path routing and a non-blocking switch.

1. Hedera's experiment (Al-Fares et al., NSDI 2010) on the k=4 fat-tree: one long TCP flow
   per host for each traffic pattern (testbed.traffic.patterns), under ECMP, under single-path
   routing, and on the non-blocking reference: one switch carrying all 16 hosts on the same
   host links (a spine-leaf with a single leaf; its spine stays idle). The figure of merit
   is the aggregate throughput as a fraction of what the 16 host links could carry.
2. Uplink spread: many TCP flows from the two hosts of edge switch p0e0 to other pods, and
   the bytes each of the edge's k/2 uplinks carried: their Jain fairness index under ECMP,
   and under single-path routing, which puts everything on one uplink.

The non-blocking reference doubles as the fidelity check: when it does not deliver nearly
all of its host links, the emulator, not the routing, limited the flows.

Flows are iperf3 clients and servers inside the emulated hosts; received rates come from the
servers' side of iperf3 (``sum_received``), after ``omit_s`` seconds of TCP start-up.
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

from testbed.apply.network import FabricNetwork
from testbed.errors import ConfigError, TestbedError
from testbed.harness.flows import run_flows
from testbed.harness.run import interrupts_as_exceptions, machine, new_run_id
from testbed.measure.stats import jain_index
from testbed.model.topology.base import Fabric
from testbed.model.topology.fattree import fat_tree
from testbed.model.topology.spineleaf import spine_leaf
from testbed.traffic.patterns import HEDERA_PATTERNS, pattern_pairs

NONBLOCKING_MIN_FRACTION = 0.85  # the reference below this: the emulator did not keep up
SPREAD_EDGE = "p0e0"
SPREAD_DESTINATIONS = ("p1e0h0", "p1e1h1", "p2e0h1", "p2e1h0", "p3e0h0", "p3e1h1", "p1e0h1",
                       "p2e1h1")  # hosts in other pods
SPREAD_STREAMS = 4         # parallel TCP streams per (source, destination): 2 x 8 x 4 = 64
ROUTINGS = ("ecmp", "single")
NONBLOCKING = "nonblocking"


@dataclass
class HederaConfig:
    rate_mbit: float = 10.0
    seconds: int = 10
    omit_s: int = 2
    patterns: tuple[str, ...] = HEDERA_PATTERNS
    seed: int = 1
    spread: bool = True
    results_dir: str = "results"

    def validate(self) -> None:
        if not self.rate_mbit > 0:
            raise ConfigError("rate_mbit", f"must be positive, got {self.rate_mbit}")
        if not (isinstance(self.seconds, int) and self.seconds >= 2):
            raise ConfigError("seconds", f"must be an integer >= 2, got {self.seconds!r}")
        if not (isinstance(self.omit_s, int) and self.omit_s >= 0):
            raise ConfigError("omit_s", f"must be an integer >= 0, got {self.omit_s!r}")
        for name in self.patterns:
            try:
                pattern_pairs(name, 16, self.seed)
            except ValueError as exc:
                raise ConfigError("patterns", str(exc)) from None


@dataclass
class PatternResult:
    """Received Mbit/s of every flow of one pattern, and their sum as a fraction of the host
    links' capacity."""

    pattern: str
    pairs: list[tuple[str, str]]
    flow_mbit: list[float]
    fraction_of_capacity: float
    errors: list[str] = field(default_factory=list)


@dataclass
class SpreadResult:
    """Bytes each uplink of the edge switch sent while the flows ran, and their Jain index."""

    uplinks: list[str]
    uplink_bytes: list[int]
    jain: float
    flows: int
    flow_mbit_total: float
    errors: list[str] = field(default_factory=list)


@dataclass
class HederaResult:
    config: dict
    patterns: dict[str, dict[str, PatternResult]] = field(default_factory=dict)
    spread: dict[str, SpreadResult] = field(default_factory=dict)


def measure_pairs(net: FabricNetwork, name: str, pairs: list[tuple[str, str]],
                  config: HederaConfig) -> PatternResult:
    """One long flow per (source, destination) pair, all at once: the received aggregate as
    a fraction of the sources' host links."""
    rates, errors = run_flows(net, pairs, config.seconds, config.omit_s)
    capacity = len(pairs) * config.rate_mbit
    return PatternResult(name, pairs, rates, sum(rates) / capacity, errors)


def index_pattern(name: str, seed: int):
    """A testbed.traffic.patterns pattern as a function of the fabric: its hosts in fabric order."""
    def pairs(fabric: Fabric) -> list[tuple[str, str]]:
        hosts = [h.name for h in fabric.hosts]
        return [(hosts[s], hosts[d]) for s, d in pattern_pairs(name, len(hosts), seed)]
    return pairs


def measure_setups(run_name: str, setups: dict, patterns: dict, config: HederaConfig, log,
                   per_setup=None) -> tuple[dict[str, dict[str, PatternResult]], Path]:
    """Bring up each setup ({name: (fabric, routing)}) in turn, prove it reachable, and
    measure every pattern ({name: fabric -> pairs}) on it; ``per_setup(setup, net)`` runs any
    extra measurement while the setup is up. Returns the results and the run folder."""
    run_id = new_run_id(run_name)
    workdir = Path(config.results_dir) / run_id
    results: dict[str, dict[str, PatternResult]] = {}
    with interrupts_as_exceptions(), machine(run_id, log) as ledger:
        workdir.mkdir(parents=True, exist_ok=True)
        for setup, (fabric, routing) in setups.items():
            log(f"{setup}: bringing up {fabric.kind} ({len(fabric.hosts)} hosts, "
                f"{config.rate_mbit:g} Mbit/s links, {routing} routing)")
            (workdir / setup).mkdir()
            with FabricNetwork(fabric, workdir / setup, ledger, routing=routing, log=log) as net:
                sent, answered = net.ping_all()
                if answered != sent:
                    raise TestbedError(f"{setup}: only {answered}/{sent} probes answered")
                results[setup] = {}
                for name, pairs_of in patterns.items():
                    r = measure_pairs(net, name, pairs_of(fabric), config)
                    results[setup][name] = r
                    log(f"  {name:8s} {r.fraction_of_capacity:6.1%} of the host links"
                        + (f"; {len(r.errors)} flows failed: {r.errors[0]}" if r.errors else ""))
                if per_setup is not None:
                    per_setup(setup, net)
    return results, workdir


def uplinks(fabric: Fabric, switch: str) -> list[str]:
    """Interfaces of ``switch`` toward other switches, in port order."""
    ends = []
    for sw, port, intf, link in fabric.switch_ends():
        other = link.b if link.a == sw else link.a
        if sw == switch and not fabric.nodes[other].is_host:
            ends.append((port, intf))
    return [intf for _, intf in sorted(ends)]


def tx_bytes(intf: str) -> int:
    with open(f"/sys/class/net/{intf}/statistics/tx_bytes") as fh:
        return int(fh.read())


def measure_spread(net: FabricNetwork, config: HederaConfig) -> SpreadResult:
    sources = [h.name for h in net.fabric.hosts if h.name.startswith(SPREAD_EDGE + "h")]
    pairs = [(src, dst) for src in sources for dst in SPREAD_DESTINATIONS]
    ports = uplinks(net.fabric, SPREAD_EDGE)
    before = [tx_bytes(intf) for intf in ports]
    rates, errors = run_flows(net, pairs, config.seconds, config.omit_s, streams=SPREAD_STREAMS)
    sent = [tx_bytes(intf) - b for intf, b in zip(ports, before)]
    return SpreadResult(ports, sent, jain_index([float(b) for b in sent]),
                        len(pairs) * SPREAD_STREAMS, sum(rates), errors)


def run_hedera(config: HederaConfig, log=print) -> HederaResult:
    """Every pattern under ECMP, single-path and the non-blocking switch, then the spread."""
    config.validate()
    result = HederaResult(config=asdict(config))
    setups = {routing: (fat_tree(4, host_rate_mbit=config.rate_mbit), routing)
              for routing in ROUTINGS}
    setups[NONBLOCKING] = (spine_leaf(leaves=1, spines=1, hosts_per_leaf=16,
                                      host_rate_mbit=config.rate_mbit), "ecmp")

    def spread(setup: str, net: FabricNetwork) -> None:
        if config.spread and setup in ROUTINGS:
            s = measure_spread(net, config)
            result.spread[setup] = s
            log(f"  spread: {s.flows} flows from {SPREAD_EDGE}, uplink bytes "
                f"{s.uplink_bytes}, Jain index {s.jain:.3f}"
                + (f"; {len(s.errors)} flows failed: {s.errors[0]}" if s.errors else ""))

    patterns = {name: index_pattern(name, config.seed) for name in config.patterns}
    result.patterns, workdir = measure_setups("hedera", setups, patterns, config, log, spread)
    write_hedera_results(result, workdir)
    log(format_hedera(result))
    log(f"results in {workdir}")
    return result


# Hedera's hardware testbed (k=4, 1 Gbit/s links): average bisection bandwidth in Mbit/s of
# ECMP and of a non-blocking switch, the data behind Hedera's Figure 9 (Al-Fares et al., NSDI
# 2010) as kept with the Mininet-HiFi reproduction (mininet/mininet-tests,
# hedera/hedera/hedera_results.csv). "random" is the mean of its patterns rand0-rand2.
PUBLISHED_SOURCE = ("Hedera (NSDI 2010) hardware testbed, Figure 9 data: "
                    "mininet/mininet-tests hedera/hedera/hedera_results.csv")
PUBLISHED_MBIT = {  # pattern -> (ECMP, non-blocking)
    "stride1": (12079, 11739), "stride2": (6525, 12395), "stride4": (3482, 12465),
    "stride8": (3408, 13851),
    "random": ((4103 + 3485 + 5013) / 3, (7935 + 9646 + 9220) / 3),
}


def published_ratio(pattern: str) -> float | None:
    """ECMP over non-blocking on Hedera's testbed for ``pattern`` (None if not published)."""
    if pattern not in PUBLISHED_MBIT:
        return None
    ecmp, nonblocking = PUBLISHED_MBIT[pattern]
    return ecmp / nonblocking


def verdict(result: HederaResult) -> dict:
    """Did the emulator keep up (the non-blocking reference near its capacity), and did the
    ordering non-blocking >= ECMP > single-path hold, per pattern."""
    reference = result.patterns.get(NONBLOCKING, {})
    kept_up = bool(reference) and all(r.fraction_of_capacity >= NONBLOCKING_MIN_FRACTION
                                      for r in reference.values())
    ordering = {}
    for name, r in reference.items():
        ecmp = result.patterns["ecmp"][name].fraction_of_capacity
        single = result.patterns["single"][name].fraction_of_capacity
        ordering[name] = {"nonblocking": r.fraction_of_capacity, "ecmp": ecmp,
                          "single": single, "gap_ecmp_vs_nonblocking": r.fraction_of_capacity - ecmp,
                          "ecmp_over_nonblocking": ecmp / r.fraction_of_capacity
                          if r.fraction_of_capacity else None,
                          "published_ecmp_over_nonblocking": published_ratio(name),
                          "ordering_holds": r.fraction_of_capacity >= ecmp * 0.98 and ecmp > single}
    return {"emulator_kept_up": kept_up, "nonblocking_min_fraction": NONBLOCKING_MIN_FRACTION,
            "patterns": ordering, "published_source": PUBLISHED_SOURCE}


def format_table(result: HederaResult, setups, patterns) -> str:
    """Fraction of the host links delivered, a row per pattern, a column per setup."""
    lines = ["", "pattern   " + "".join(f"{setup:>12s}" for setup in setups)]
    for name in patterns:
        lines.append(f"{name:10s}" + "".join(
            f"{result.patterns[setup][name].fraction_of_capacity:12.1%}" for setup in setups))
    return "\n".join(lines)


def format_hedera(result: HederaResult) -> str:
    v = verdict(result)
    lines = ["", "pattern    non-blocking   ECMP   single-path   ECMP/non-blocking (published)"
                 "   (fraction of the host links)"]
    for name, row in v["patterns"].items():
        ours, theirs = row["ecmp_over_nonblocking"], row["published_ecmp_over_nonblocking"]
        ratios = (f"{'-' if ours is None else format(ours, '.2f'):>8s} "
                  f"({'-' if theirs is None else format(theirs, '.2f')})")
        held = "ordering holds" if row["ordering_holds"] else "ordering BROKEN"
        lines.append(f"{name:10s} {row['nonblocking']:10.1%} {row['ecmp']:8.1%} "
                     f"{row['single']:10.1%}   {ratios}   {held}")
    lines.append(f"published: {v['published_source']}")
    for routing, s in result.spread.items():
        lines.append(f"uplink spread, {routing}: Jain index {s.jain:.3f} over {len(s.uplinks)} "
                     f"uplinks ({s.flows} flows)")
    lines.append("emulator kept up: " + ("yes" if v["emulator_kept_up"] else
                                         "NO: the non-blocking reference fell below "
                                         f"{NONBLOCKING_MIN_FRACTION:.0%}; do not trust the gaps"))
    return "\n".join(lines)


def write_hedera_results(result: HederaResult, workdir: Path, verdict_of=None,
                         title: str = "k=4 fat-tree", figure: str = "hedera.png") -> list[Path]:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    summary = {"result": asdict(result), "verdict": (verdict_of or verdict)(result)}
    (workdir / "summary.json").write_text(json.dumps(summary, indent=1))
    setups = list(result.patterns)
    names = list(next(iter(result.patterns.values()), {}))
    fig, ax = plt.subplots(figsize=(7, 3.5))
    width = 0.8 / max(len(setups), 1)
    for k, setup in enumerate(setups):
        values = [result.patterns[setup][n].fraction_of_capacity * 100 for n in names]
        ax.bar([i + k * width for i in range(len(names))], values, width, label=setup)
    ax.set_xticks([i + width * (len(setups) - 1) / 2 for i in range(len(names))], names)
    ax.set_ylabel("aggregate throughput, % of host links")
    ax.set_ylim(0, 110)
    ax.set_title(f"{title}, one TCP flow per host, {result.config['rate_mbit']:g} Mbit/s links")
    ax.legend()
    fig.tight_layout()
    path = workdir / figure
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return [workdir / "summary.json", path]
