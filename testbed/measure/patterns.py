"""Long-flow traffic patterns, summarised: which host sends one long TCP flow to which
(testbed.traffic.patterns by host index, here by host name), what the flows received as a
fraction of what their senders' host links could carry, whether the emulator kept up in
every window the flows were measured in, and the figure comparing setups pattern by pattern.

The experiments that compare routings by the throughput a pattern gets (hedera,
dragonfly-routing) share it; testbed.drive.flows.run_pattern runs the flows and returns a
``PatternResult``. Everything here is pure but ``windows_fidelity`` and ``setup_results``,
which read a testbed.measure.fidelity.Watch, and the plots, which write a PNG.
"""
from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

from testbed.measure.fidelity import FidelityVerdict, judge
from testbed.model.rows import Number
from testbed.model.topology.base import Fabric
from testbed.model.verdict import Check, at_most
from testbed.traffic.patterns import pattern_pairs

Fractions = dict[str, dict[str, float]]  # setup -> pattern -> fraction of the host links


@dataclass(frozen=True)
class PatternResult:
    """Every flow of one pattern: the Mbit/s each destination received, their sum as a
    fraction of the senders' host links, the flows that failed, and the CLOCK_MONOTONIC
    window the rates were measured over (after TCP start-up)."""

    pattern: str
    pairs: list[tuple[str, str]]
    flow_mbit: list[float]
    fraction_of_capacity: float
    errors: list[str] = field(default_factory=list)
    window_monotonic_s: tuple[float, float] = (0.0, 0.0)

    def to_dict(self) -> dict:
        d = asdict(self)
        d["pairs"] = [list(pair) for pair in self.pairs]
        d["flow_mbit"] = [round(rate, 3) for rate in self.flow_mbit]
        d["fraction_of_capacity"] = round(self.fraction_of_capacity, 4)
        d["window_monotonic_s"] = list(self.window_monotonic_s)
        return d


def host_pairs(fabric: Fabric, pattern: str, seed: int = 1) -> list[tuple[str, str]]:
    """A named pattern (testbed.traffic.patterns: strideN, random) over the fabric's hosts in
    fabric order, as (source, destination) host names."""
    hosts = [h.name for h in fabric.hosts]
    return [(hosts[s], hosts[d]) for s, d in pattern_pairs(pattern, len(hosts), seed)]


def fraction_of_capacity(flow_mbit: Sequence[float], host_rate_mbit: float) -> float:
    """The received aggregate over what the senders' host links carry (one flow per link);
    0 for no flows."""
    if not flow_mbit:
        return 0.0
    return sum(flow_mbit) / (len(flow_mbit) * host_rate_mbit)


def fractions(results: Mapping[str, dict]) -> Fractions:
    """{setup: {pattern: fraction}} from every setup's results (``{"patterns": {name:
    PatternResult.to_dict()}}``); setups that measured no pattern are left out."""
    return {setup: {name: r["fraction_of_capacity"] for name, r in result["patterns"].items()}
            for setup, result in results.items() if result.get("patterns")}


def fraction(table: Fractions, setup: str, pattern: str) -> float | None:
    """One setup's fraction on one pattern; None when it was not measured (a partial run)."""
    return table.get(setup, {}).get(pattern)


def failed_flows(result: dict) -> list[str]:
    """The errors of every flow of one setup's results that did not run to its end."""
    return [e for r in result.get("patterns", {}).values() for e in r["errors"]]


def completion_checks(results: Mapping[str, dict],
                      more_errors: Mapping[str, list[str]] | None = None) -> list[Check]:
    """Per setup: every flow of its patterns (and of ``more_errors``' flows, {setup: errors})
    ran to its end. A flow that died counts as nothing received, so the setup's fractions
    would understate what the fabric carried."""
    checks = []
    for setup, result in results.items():
        if "patterns" not in result:
            continue
        failed = failed_flows(result) + list((more_errors or {}).get(setup, []))
        checks.append(at_most("flows that failed", len(failed), 0, "flows",
                              "every iperf3 flow ran to its end" if not failed else
                              f"{len(failed)} flows failed, first: {failed[0]}", setup))
    return checks


def fraction_row(table: Fractions, pattern: str, setups: Mapping[str, str]) -> str:
    """``non-blocking 98.4%, ECMP 43.1%``: one pattern across ``setups`` ({setup: label})."""
    cells = []
    for setup, label in setups.items():
        value = fraction(table, setup, pattern)
        cells.append(f"{label} {'-' if value is None else format(value, '.1%')}")
    return ", ".join(cells)


def fraction_numbers(table: Fractions, pattern: str,
                     setups: Mapping[str, str]) -> tuple[Number, ...]:
    """``fraction_row``'s numbers: one pattern's fraction of the host links per setup
    ({setup: label}), named by the label."""
    return tuple(Number(label, fraction(table, setup, pattern), "fraction")
                 for setup, label in setups.items())


def run_window(windows_monotonic_s: Iterable[Sequence[float]]) -> list[float]:
    """The span from the first measured window's start to the last one's end."""
    windows = list(windows_monotonic_s)
    return [min(w[0] for w in windows), max(w[1] for w in windows)] if windows else []


def worst_verdict(verdicts: Sequence[FidelityVerdict], setup: str | None = None) -> FidelityVerdict:
    """One fidelity verdict (testbed.measure.fidelity.judge, bandwidth-bound) from the
    verdicts of several windows of one watch: the busiest window's CPU, the weakest window's
    busiest link, the switches' losses (the same in every window: they are counted over the
    whole watch). Every window had to keep up, so the worst one decides."""
    return judge(max(v.cpu_busy_fraction for v in verdicts),
                 max(v.vswitchd_cores for v in verdicts),
                 min(v.link_delivery_fraction for v in verdicts),
                 max(v.emulator_loss_fraction for v in verdicts),
                 bandwidth_bound=True, setup=setup,
                 cpu_stolen_fraction=max((v.cpu_stolen_fraction for v in verdicts
                                          if v.cpu_stolen_fraction is not None), default=None))


def windows_fidelity(watch, windows_monotonic_s: Sequence[Sequence[float]],
                     setup: str | None = None) -> FidelityVerdict:
    """The fidelity verdict of a testbed.measure.fidelity.Watch over each measured window
    (CLOCK_MONOTONIC), combined by ``worst_verdict``; the whole watch when there is none."""
    if not windows_monotonic_s:
        return watch.verdict(bandwidth_bound=True, setup=setup)
    return worst_verdict([watch.verdict(watch.window_s(*w), bandwidth_bound=True, setup=setup)
                          for w in windows_monotonic_s], setup)


def setup_results(watch, measured: Mapping[str, PatternResult], setup: str,
                  more: Sequence[PatternResult] = ()) -> dict:
    """What a setup's measurement returns: every pattern's result, the span they were
    measured in, and the fidelity verdict over their windows (and those of ``more`` flows
    measured beside the patterns)."""
    windows = [r.window_monotonic_s for r in [*measured.values(), *more]]
    return {"patterns": {name: r.to_dict() for name, r in measured.items()},
            "window_monotonic_s": run_window(windows),
            "fidelity": windows_fidelity(watch, windows, setup).to_dict()}


def plot_grouped_bars(values: Mapping[str, Mapping[str, float]], xlabel: str, ylabel: str,
                      title: str, path: Path,
                      marks: Mapping[tuple[str, str], float] | None = None,
                      mark_label: str = "", ylim: tuple[float, float] | None = None) -> Path:
    """A group of bars per x value (a pattern), a bar per series ({series: {x: value}}), and
    ``marks`` ({(series, x): value}) as a dashed black tick across that bar (a model's
    prediction)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    series = list(values)
    groups = list(dict.fromkeys(g for s in series for g in values[s]))
    width = 0.8 / max(len(series), 1)
    palette = plt.get_cmap("tab10")
    fig, ax = plt.subplots(figsize=(max(10.0, 1.4 * len(groups) + 3), 4))
    labelled = False
    for k, name in enumerate(series):
        xs = [i + k * width for i, g in enumerate(groups) if g in values[name]]
        ax.bar(xs, [values[name][g] for g in groups if g in values[name]], width,
               label=name, color=palette(k % 10))
        for i, g in enumerate(groups):
            if marks and (name, g) in marks:
                x = i + k * width
                ax.hlines(marks[(name, g)], x - width / 2, x + width / 2, colors="k",
                          linestyles="--", label=None if labelled else mark_label)
                labelled = True
    ax.set_xticks([i + width * (len(series) - 1) / 2 for i in range(len(groups))], groups)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    if ylim is not None:
        ax.set_ylim(*ylim)
    ax.set_title(title, fontsize=9, wrap=True)
    ax.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def fractions_percent(table: Fractions, setups: Mapping[str, str]) -> dict[str, dict[str, float]]:
    """{label: {pattern: percent of the host links}} for the setups measured, in ``setups``
    order ({setup: label})."""
    return {label: {p: 100 * f for p, f in table[setup].items()}
            for setup, label in setups.items() if setup in table}


def plot_fractions(table: Fractions, setups: Mapping[str, str], title: str, path: Path,
                   marks: Mapping[tuple[str, str], float] | None = None,
                   mark_label: str = "") -> Path:
    """The received aggregate per pattern and setup ({setup: label}) in % of the host links;
    ``marks`` ({(label, pattern): percent}) dashed across their bars."""
    return plot_grouped_bars(fractions_percent(table, setups), "traffic pattern",
                             "aggregate throughput (% of the host links)",
                             f"{title}\none long TCP flow per host, received aggregate per "
                             "pattern and setup", path, marks, mark_label, ylim=(0, 110))
