"""ECMP measured against single-path routing and a non-blocking switch (Hedera, Al-Fares et
al., NSDI 2010).

1. Hedera's traffic patterns on the k=4 fat-tree: one long TCP flow per host for each pattern
   (testbed.traffic.patterns), under ECMP, under single-path routing, and on the non-blocking
   reference: one switch carrying all 16 hosts on the same host links (a spine-leaf with a
   single leaf; its spine stays idle). The figure of merit is the received aggregate as a
   fraction of what the 16 host links could carry; beside it, ECMP over non-blocking against
   the same ratio on Hedera's hardware testbed.
2. Uplink spread: 64 TCP flows (2 hosts x 8 destinations in other pods x 4 streams) from
   edge switch p0e0, and the rate each of its k/2 uplinks carried: their Jain fairness index
   under ECMP, and under single-path routing, which puts everything on one uplink.

The non-blocking reference is also a trust check: when it does not deliver nearly all of its
host links, the emulator, not the routing, limited the flows. Flows are iperf3 clients and
servers in the emulated hosts (testbed.drive.flows.run_pattern); rates are the servers'
(``sum_received``), after ``omit_s`` seconds of TCP start-up.
"""
from __future__ import annotations

from pathlib import Path

from pydantic import Field, field_validator

from testbed.harness.experiment import HOSTS, Experiment, Setup, SetupRun
from testbed.drive.flows import LongFlowParams, run_pattern, run_patterns
from testbed.harness.plans import tcp_plan
from testbed.measure.patterns import (
    PatternResult,
    completion_checks,
    fraction,
    fraction_numbers,
    fraction_row,
    fractions,
    host_pairs,
    plot_fractions,
    plot_grouped_bars,
    setup_results,
)
from testbed.measure.stats import jain_index
from testbed.model.rows import Number, Row
from testbed.model.topology.base import Fabric
from testbed.model.topology.fattree import fat_tree
from testbed.model.topology.spineleaf import spine_leaf
from testbed.model.verdict import Check, at_least, holds
from testbed.traffic.patterns import HEDERA_PATTERNS, pattern_pairs

FAT_TREE_K = 4
FAT_TREE_HOSTS = FAT_TREE_K ** 3 // 4
ECMP, SINGLE, NONBLOCKING = "ecmp", "single", "nonblocking"
LABELS = {NONBLOCKING: "non-blocking", ECMP: "ECMP", SINGLE: "single-path"}  # setup -> label
FRACTION_UNIT = "fraction of the host links"

# Named tolerances.
NONBLOCKING_MIN_FRACTION = 0.85  # the reference below this: the emulator did not keep up
ORDERING_SLACK = 0.02    # non-blocking may trail ECMP by 2% of ECMP's throughput (noise)
ECMP_GAIN_MIN = 0.05     # "ECMP delivers more than single-path": by 5% of the host links
GAP_RATIO = 0.9          # ECMP below 90% of the non-blocking switch: ECMP has a gap
JAIN_MIN_ECMP = 0.9      # 64 flows over the edge's 2 uplinks under ECMP
SINGLE_PATH_SHARE_MIN = 0.99  # single-path: one uplink carries (nearly) all the bytes

# The layer of the k=4 fat-tree a stride's flows climb to (hosts pod by pod, edge by edge):
# stride 1 mostly stays under an edge switch, stride 2 crosses the pod, 4 and 8 the core.
LAYERS = (("stride1",), ("stride2",), ("stride4", "stride8"))

SPREAD = "spread"
SPREAD_SETUPS = (ECMP, SINGLE)
SPREAD_EDGE = "p0e0"
SPREAD_DESTINATIONS = ("p1e0h0", "p1e1h1", "p2e0h1", "p2e1h0", "p3e0h0", "p3e1h1", "p1e0h1",
                       "p2e1h1")  # hosts in other pods
SPREAD_STREAMS = 4       # parallel TCP streams per (source, destination): 2 x 8 x 4 = 64
SPREAD_FLOWS = FAT_TREE_K // 2 * len(SPREAD_DESTINATIONS) * SPREAD_STREAMS

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


class HederaParams(LongFlowParams):
    """Hedera's traffic patterns (strideN, random; ``random`` seeded by the scenario's
    ``seed``), each run for ``seconds`` after ``omit_s`` of TCP start-up on every setup, and
    whether to measure ECMP's uplink spread as well."""

    patterns: list[str] = Field(list(HEDERA_PATTERNS), min_length=1,
                                description="strideN or random, each run on every setup")
    spread: bool = Field(True, description="also send 64 flows from edge switch p0e0 and "
                                           "measure how its uplinks share them")

    @field_validator("patterns")
    @classmethod
    def _known_once(cls, value: list[str]) -> list[str]:
        for name in value:
            pattern_pairs(name, FAT_TREE_HOSTS)  # its ValueError names the pattern
        if len(set(value)) != len(value):
            raise ValueError("names a pattern twice")
        return value


def ratio(numerator: float | None, denominator: float | None) -> float | None:
    """numerator / denominator, None when either is missing or the denominator is 0."""
    if numerator is None or not denominator:
        return None
    return numerator / denominator


def rounded(value: float | None, digits: int = 4) -> float | None:
    return None if value is None else round(value, digits)


def ordering_checks(table: dict, pattern: str) -> list[Check]:
    """Hedera's ordering on one pattern: non-blocking >= ECMP (within ORDERING_SLACK of
    ECMP), and ECMP above single-path by ECMP_GAIN_MIN where single-path lost anything."""
    nb, ecmp, single = (fraction(table, s, pattern) for s in (NONBLOCKING, ECMP, SINGLE))
    nb_over_ecmp = rounded(ratio(nb, ecmp))
    checks = [Check(
        f"{pattern}: non-blocking >= ECMP", nb_over_ecmp, ">= 1", ORDERING_SLACK,
        "non-blocking / ECMP", None if nb_over_ecmp is None else
        nb_over_ecmp >= 1.0 - ORDERING_SLACK,
        f"non-blocking {nb:.1%} against ECMP {ecmp:.1%} of the host links (the reference "
        f"may trail ECMP by {ORDERING_SLACK:.0%} of ECMP's throughput: noise)"
        if nb_over_ecmp is not None else "not measured on both")]
    gain = rounded(None if ecmp is None or single is None else ecmp - single)
    single_lost_nothing = (nb is not None and single is not None
                           and single >= nb * (1.0 - ORDERING_SLACK))
    if single_lost_nothing:
        checks.append(Check(f"{pattern}: ECMP > single-path", gain, f">= {ECMP_GAIN_MIN:g}",
                            None, FRACTION_UNIT, None,
                            f"not judged: single-path routing lost nothing here ({single:.1%} "
                            f"against the non-blocking {nb:.1%}), so there is nothing for "
                            "ECMP to gain"))
    else:
        checks.append(at_least(f"{pattern}: ECMP > single-path", gain, ECMP_GAIN_MIN,
                               FRACTION_UNIT, f"ECMP {ecmp:.1%} against single-path "
                               f"{single:.1%} of the host links" if gain is not None
                               else "not measured on both"))
    return checks


def published_check(table: dict, pattern: str) -> Check:
    """ECMP / non-blocking here beside Hedera's: a gap (below GAP_RATIO) where Hedera's
    hardware had one, none where it had none; not judged where Hedera published nothing."""
    ours = rounded(ratio(fraction(table, ECMP, pattern), fraction(table, NONBLOCKING, pattern)),
                   3)
    theirs = published_ratio(pattern)
    name = f"{pattern}: ECMP / non-blocking beside Hedera's"
    if theirs is None:
        return Check(name, ours, None, None, "ECMP / non-blocking", None,
                     "Hedera published no figure for this pattern")
    gap = theirs < GAP_RATIO
    expected = f"{'<' if gap else '>='} {GAP_RATIO:g} (Hedera {theirs:.2f})"
    return Check(name, ours, expected, None, "ECMP / non-blocking",
                 None if ours is None else (ours < GAP_RATIO) == gap,
                 f"ECMP delivered {ours:.2f} of the non-blocking switch's throughput here, "
                 f"{theirs:.2f} on Hedera's hardware (its Figure 9 data)"
                 if ours is not None else "not measured on both")


def shape_check(table: dict, patterns: list[str]) -> Check:
    """The gap opens as flows climb the tree (LAYERS): every stride that stays lower keeps
    more of the non-blocking throughput under ECMP than every stride that climbs higher, as
    on Hedera's hardware; judged when at least two layers were measured."""
    layers = []
    for layer in LAYERS:
        ratios = [ratio(fraction(table, ECMP, p), fraction(table, NONBLOCKING, p))
                  for p in layer if p in patterns]
        ratios = [r for r in ratios if r is not None]
        if ratios:
            layers.append((layer, ratios))
    opens = None if len(layers) < 2 else all(
        min(lower) > max(higher) for (_, lower), (_, higher) in zip(layers, layers[1:]))
    measured = " > ".join("/".join(f"{r:.2f}" for r in ratios) for _, ratios in layers) or None
    published = " > ".join("/".join(f"{published_ratio(p):.2f}" for p in layer)
                           for layer in LAYERS)
    return holds("the gap opens as flows climb the tree", opens,
                 "ECMP / non-blocking by the layer the stride climbs to (edge, pod, core), "
                 f"as on Hedera's hardware ({published})" if opens is not None else
                 "not judged: needs strides of at least two layers (stride1; stride2; "
                 "stride4 or stride8)", measured=measured, expected="decreasing")


def uplinks(fabric: Fabric, switch: str) -> list[str]:
    """The link directions from ``switch`` toward other switches (``p0e0->p0a0``), in port
    order."""
    ends = []
    for link in fabric.links:
        for (node, port), other in (((link.a, link.a_port), link.b),
                                    ((link.b, link.b_port), link.a)):
            if node == switch and not fabric.nodes[other].is_host:
                ends.append((port, f"{switch}->{other}"))
    return [label for _, label in sorted(ends)]


def spread_pairs(fabric: Fabric) -> list[tuple[str, str]]:
    """Every host under SPREAD_EDGE to every SPREAD_DESTINATIONS host."""
    sources = [h.name for h in fabric.hosts if h.name.startswith(SPREAD_EDGE + "h")]
    return [(src, dst) for src in sources for dst in SPREAD_DESTINATIONS]


def spread_summary(uplink_mbit: dict[str, float], flows: PatternResult) -> dict:
    """How SPREAD_EDGE's uplinks ({direction: Mbit/s in the flows' window}) shared the
    spread's flows: their Jain index and the busiest uplink's share."""
    loads = list(uplink_mbit.values())
    total = sum(loads)
    return {"edge": SPREAD_EDGE, "uplinks": list(uplink_mbit),
            "uplink_mbit": [round(x, 3) for x in loads],
            "jain": round(jain_index(loads), 4),
            "busiest_share": round(max(loads) / total, 4) if total > 0 else None,
            "flows": len(flows.pairs) * SPREAD_STREAMS,
            "flow_mbit_total": round(sum(flows.flow_mbit), 3), "errors": flows.errors}


def spread_checks(results: dict) -> list[Check]:
    """ECMP spreads the 64 flows over the uplinks; single-path puts them on one."""
    ecmp = results.get(ECMP, {}).get(SPREAD)
    single = results.get(SINGLE, {}).get(SPREAD)
    return [
        at_least("uplink spread: Jain index under ECMP", ecmp and ecmp["jain"], JAIN_MIN_ECMP,
                 "Jain index", f"{ecmp['flows']} flows from {SPREAD_EDGE}: "
                 f"{', '.join(f'{x:.2f}' for x in ecmp['uplink_mbit'])} Mbit/s on its "
                 f"{len(ecmp['uplinks'])} uplinks" if ecmp else "not measured", ECMP),
        at_least("uplink spread: busiest uplink's share under single-path",
                 single and single["busiest_share"], SINGLE_PATH_SHARE_MIN,
                 "fraction of the uplink bytes", f"single-path routing put "
                 f"{single['busiest_share']:.1%} of {SPREAD_EDGE}'s uplink bytes on one uplink"
                 if single and single["busiest_share"] is not None else "not measured", SINGLE),
    ]


class Hedera(Experiment):
    name = "hedera"
    title = "ECMP vs single-path vs a non-blocking switch"
    Params = HederaParams
    defaults_scenario = "ecmp-hedera"
    captions = {
        "fractions.png": ("ECMP's bars below the non-blocking switch's are hash collisions; "
                          "the gap should widen as the patterns cross more layers."),
        "ecmp_over_nonblocking.png": ("The ratio here beside Hedera's hardware testbed, per "
                                      "pattern: the same trend, not the same values, is what "
                                      "to check."),
        "uplink_spread.png": ("Even bars mean ECMP split the flows evenly over the edge "
                              "switch's uplinks; one tall bar is a collision."),
    }
    default_rate_mbit = 10.0
    sections = frozenset({HOSTS})  # it builds its own fabrics, one per setup
    cli_aliases = {"--omit": "omit_s", "--pattern": "patterns"}

    def headline(self) -> str:
        p = self.params
        return (f"{self.title}: k={FAT_TREE_K} fat-tree (ECMP, single-path) and one "
                f"{FAT_TREE_HOSTS}-host switch, patterns {', '.join(p.patterns)}, {p.seconds} s "
                f"per pattern after {p.omit_s} s at {self.rate_mbit:g} Mbit/s"
                + (f"; uplink spread of {SPREAD_FLOWS} flows"
                   if p.spread else ""))

    def setups(self) -> list[Setup]:
        rate, mtu = self.rate_mbit, self.mtu_bytes
        tcp = tcp_plan(self.scenario.hosts, self.platform)
        tree = fat_tree(FAT_TREE_K, host_rate_mbit=rate, mtu_bytes=mtu)
        switch = spine_leaf(leaves=1, spines=1, hosts_per_leaf=FAT_TREE_HOSTS,
                            host_rate_mbit=rate, mtu_bytes=mtu)
        return [
            Setup(ECMP, tree, ECMP, tcp=tcp, description=f"k={FAT_TREE_K} fat-tree, ECMP over "
                  "the equal-cost paths (OpenFlow select groups)"),
            Setup(SINGLE, tree, SINGLE, tcp=tcp, description=f"k={FAT_TREE_K} fat-tree, one "
                  "path per destination"),
            Setup(NONBLOCKING, switch, ECMP, tcp=tcp, description=f"one switch carrying all "
                  f"{FAT_TREE_HOSTS} hosts on the same host links (the non-blocking reference)"),
        ]

    def measure(self, run: SetupRun) -> dict:
        p = self.params
        fabric = run.net.fabric
        patterns = {name: host_pairs(fabric, name, self.scenario.seed) for name in p.patterns}
        spread = None
        with run.watch() as watch:
            measured = run_patterns(run, patterns, p.seconds, p.omit_s, self.rate_mbit)
            if p.spread and run.setup.name in SPREAD_SETUPS:
                spread = run_pattern(run.net, SPREAD, spread_pairs(fabric), p.seconds, p.omit_s,
                                     self.rate_mbit, streams=SPREAD_STREAMS)
        result = setup_results(watch, measured, run.setup.name, [spread] if spread else [])
        if spread is not None:
            rates = watch.rates_mbit(watch.window_s(*spread.window_monotonic_s))
            result[SPREAD] = spread_summary({u: rates[u] for u in uplinks(fabric, SPREAD_EDGE)},
                                            spread)
            s = result[SPREAD]
            run.log(f"{run.setup.name}: spread: {s['flows']} flows from {SPREAD_EDGE}, uplinks "
                    f"{s['uplink_mbit']} Mbit/s, Jain index {s['jain']:.3f}")
        return result

    def checks(self, results: dict[str, dict]) -> list[Check]:
        table = fractions(results)
        checks = []
        for pattern in self.params.patterns:
            checks += ordering_checks(table, pattern)
            checks.append(published_check(table, pattern))
        checks.append(shape_check(table, self.params.patterns))
        if self.params.spread:
            checks += spread_checks(results)
        return checks

    def trust(self, results: dict[str, dict]) -> list[Check]:
        table = fractions(results)
        checks = [at_least(f"{pattern}: non-blocking reference delivery",
                           rounded(fraction(table, NONBLOCKING, pattern)),
                           NONBLOCKING_MIN_FRACTION, FRACTION_UNIT,
                           "the non-blocking switch carried nearly all of its host links: "
                           "the emulator kept up, so the gaps belong to the routing", NONBLOCKING)
                  for pattern in self.params.patterns]
        errors = {setup: r[SPREAD]["errors"] for setup, r in results.items() if SPREAD in r}
        return checks + completion_checks(results, errors)

    def rows(self, results: dict[str, dict]) -> list[tuple[str, str]]:
        table = fractions(results)
        rows = []
        for pattern in self.params.patterns:
            ours = ratio(fraction(table, ECMP, pattern), fraction(table, NONBLOCKING, pattern))
            theirs = published_ratio(pattern)
            rows.append(Row(pattern, f"{fraction_row(table, pattern, LABELS)} of the host "
                                     f"links; ECMP / non-blocking "
                                     f"{'-' if ours is None else f'{ours:.2f}'} (Hedera "
                                     f"{'-' if theirs is None else f'{theirs:.2f}'})",
                            *fraction_numbers(table, pattern, LABELS),
                            Number("ECMP / non-blocking", ours, "")))
        rows.append(("published", PUBLISHED_SOURCE))
        for setup in SPREAD_SETUPS:
            s = results.get(setup, {}).get(SPREAD)
            if s:
                rows.append(Row(f"uplink spread, {LABELS[setup]}",
                                f"Jain index {s['jain']:.3f} over {len(s['uplinks'])} uplinks "
                                f"of {s['edge']} ({s['flows']} flows; "
                                f"{', '.join(f'{x:.2f}' for x in s['uplink_mbit'])} Mbit/s)",
                                Number("Jain index", s["jain"], "")))
        return rows

    def plots(self, results: dict[str, dict], folder: Path, title: str) -> list[Path]:
        table = fractions(results)
        if not table:
            return []
        paths = [plot_fractions(table, LABELS, title, folder / "fractions.png")]
        ours = {p: ratio(fraction(table, ECMP, p), fraction(table, NONBLOCKING, p))
                for p in self.params.patterns}
        ratios = {"here": {p: r for p, r in ours.items() if r is not None},
                  "Hedera's hardware testbed": {p: published_ratio(p) for p in ours
                                                if published_ratio(p) is not None}}
        if ratios["here"]:
            paths.append(plot_grouped_bars(
                ratios, "traffic pattern", "ECMP / non-blocking (throughput ratio)",
                f"{title}\nECMP over the non-blocking switch, here and on Hedera's hardware",
                folder / "ecmp_over_nonblocking.png"))
        spread = {LABELS[s]: dict(zip(results[s][SPREAD]["uplinks"],
                                      results[s][SPREAD]["uplink_mbit"]))
                  for s in SPREAD_SETUPS if SPREAD in results.get(s, {})}
        if spread:
            paths.append(plot_grouped_bars(
                spread, f"uplink of {SPREAD_EDGE}", "rate in the flows' window (Mbit/s)",
                f"{title}\n{SPREAD_FLOWS} flows from "
                f"{SPREAD_EDGE} to other pods: what each uplink carried",
                folder / "uplink_spread.png"))
        return paths
