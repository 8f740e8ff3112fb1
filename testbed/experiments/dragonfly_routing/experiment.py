"""Dragonfly routing measured: minimal, Valiant and UGAL-like routing (and shortest-path ECMP)
on the adversarial pattern and on uniform traffic (Kim, Dally, Scott, Abts, ISCA 2008).

When every host of group i sends to group i+1 ("shift"), minimal routing squeezes a whole
group's traffic onto the one global link between the two groups, while Valiant routing
(through a random intermediate group) spreads it over the other global links at the price of
a second global hop; on uniform traffic (a random permutation) minimal routing is best. UGAL
chooses between the two per flow from the load it sees (testbed.controllers.routing.ugal).

The fabric is the dragonfly p=1, a=3, h=2 with g=7 groups (21 hosts, 21 routers): every pair
of groups has exactly one global link, so shift puts a group's three hosts on one global
link, and five other groups are there to detour through. The fluid model
(testbed.controllers.routing.dragonfly.link_loads_mbit) predicts the busiest link at 3.0x its
rate under minimal routing and 1.4x under Valiant; smaller dragonflies do not separate them
(p=1, a=2, h=2, g=5: 2.0x both ways, measured alike). The prediction is reported beside the
measurement. One long TCP flow per host (testbed.drive.flows.run_patterns), summarised as
the received aggregate over the host links (testbed.measure.patterns).
"""
from __future__ import annotations

from pathlib import Path

from testbed.controllers.routing.dragonfly import (
    MINIMAL,
    UGAL,
    VALIANT,
    group_shift_traffic,
    link_loads_mbit,
    link_utilisation,
)
from testbed.harness.experiment import HOSTS, Experiment, Setup, SetupRun
from testbed.drive.flows import LongFlowParams, run_patterns
from testbed.harness.plans import tcp_plan
from testbed.measure.patterns import (
    completion_checks,
    fraction,
    fraction_numbers,
    fraction_row,
    fractions,
    host_pairs,
    plot_fractions,
    setup_results,
)
from testbed.model.rows import Number, Row
from testbed.model.topology.base import Fabric
from testbed.model.topology.dragonfly import dragonfly
from testbed.model.verdict import Check, at_least, near

DRAGONFLY = {"p": 1, "a": 3, "h": 2, "g": 7}
ECMP = "ecmp"
ROUTINGS = (MINIMAL, VALIANT, UGAL, ECMP)
LABELS = {MINIMAL: "minimal", VALIANT: "Valiant", UGAL: "UGAL",
          ECMP: "ECMP (shortest path)"}  # setup -> label
SHIFT, UNIFORM = "shift", "random"
MODELLED = (MINIMAL, VALIANT)  # the routings the fluid model predicts for the shift
FRACTION_UNIT = "fraction of the host links"

# Named tolerances.
BETTER_BY = 0.05        # "delivers more": at least 5% of the host links more
MODEL_TOLERANCE = 0.05  # minimal on the shift within 5% of the host links of the fluid model


class DragonflyParams(LongFlowParams):
    """How long the shift and the random permutation run on every routing: ``seconds`` each
    after ``omit_s`` of TCP start-up (the permutation is seeded by the scenario's ``seed``)."""


def shift_pairs(fabric: Fabric) -> list[tuple[str, str]]:
    """Kim et al.'s adversarial pattern: every host of group i to its peer in group i+1."""
    return list(group_shift_traffic(fabric, 1.0))


def predicted_fraction(fabric: Fabric, mode: str) -> float:
    """Fluid-model throughput of the shift pattern as a fraction of the host links: every
    flow slowed by the busiest link it shares, approximated by 1 / the busiest utilisation."""
    busiest = max(link_utilisation(fabric, link_loads_mbit(fabric, mode, group_shift_traffic(
        fabric, fabric.params["host_rate_mbit"]))).values())
    return min(1.0, 1.0 / busiest)


def gain(table: dict, better: str, worse: str, pattern: str) -> float | None:
    """How much more of the host links ``better`` delivered than ``worse`` on ``pattern``."""
    a, b = fraction(table, better, pattern), fraction(table, worse, pattern)
    return None if a is None or b is None else round(a - b, 4)


def claims(table: dict, predicted: dict[str, float]) -> list[Check]:
    """Kim et al.'s claims on the measured fractions, and minimal routing against the fluid
    model's ``predicted`` shift fractions ({routing: fraction})."""
    def versus(better: str, worse: str, pattern: str) -> str:
        a, b = fraction(table, better, pattern), fraction(table, worse, pattern)
        if a is None or b is None:
            return "not measured on both"
        return f"{LABELS[better]} {a:.1%} against {LABELS[worse]} {b:.1%} of the host links"

    minimal_shift = fraction(table, MINIMAL, SHIFT)
    return [
        at_least("shift: Valiant beats minimal", gain(table, VALIANT, MINIMAL, SHIFT),
                 BETTER_BY, FRACTION_UNIT, versus(VALIANT, MINIMAL, SHIFT)),
        at_least("shift: UGAL beats minimal", gain(table, UGAL, MINIMAL, SHIFT), BETTER_BY,
                 FRACTION_UNIT, versus(UGAL, MINIMAL, SHIFT)),
        at_least("uniform: minimal at least Valiant", gain(table, MINIMAL, VALIANT, UNIFORM),
                 -BETTER_BY, FRACTION_UNIT, versus(MINIMAL, VALIANT, UNIFORM)),
        near("shift: minimal as the fluid model predicts",
             None if minimal_shift is None else round(minimal_shift, 4),
             round(predicted[MINIMAL], 4), MODEL_TOLERANCE, FRACTION_UNIT,
             f"a group's {DRAGONFLY['a'] * DRAGONFLY['p']} flows share one global link: "
             f"the fluid model predicts {predicted[MINIMAL]:.1%}", MINIMAL),
    ]


class DragonflyRouting(Experiment):
    name = "dragonfly-routing"
    title = "dragonfly routing: minimal vs Valiant vs UGAL vs ECMP"
    Params = DragonflyParams
    captions = {
        "fractions.png": ("On the shift pattern Valiant and UGAL should beat minimal routing "
                          "(dashed: the fluid model); on uniform traffic minimal should be "
                          "best."),
    }
    default_rate_mbit = 10.0
    sections = frozenset({HOSTS})  # it builds its own fabrics, one per routing
    cli_aliases = {"--omit": "omit_s"}

    def dragonfly_fabric(self) -> Fabric:
        return dragonfly(host_rate_mbit=self.rate_mbit, mtu_bytes=self.mtu_bytes, **DRAGONFLY)

    def headline(self) -> str:
        p = self.params
        return (f"{self.title}: dragonfly {' '.join(f'{k}={v}' for k, v in DRAGONFLY.items())}, "
                f"{SHIFT} and {UNIFORM}, {p.seconds} s per pattern after {p.omit_s} s at "
                f"{self.rate_mbit:g} Mbit/s")

    def setups(self) -> list[Setup]:
        tcp = tcp_plan(self.scenario.hosts, self.platform)
        fabric = self.dragonfly_fabric()
        return [Setup(routing, fabric, routing, tcp=tcp,
                      description=f"dragonfly, {LABELS[routing]} routing") for routing in ROUTINGS]

    def measure(self, run: SetupRun) -> dict:
        p = self.params
        fabric = run.net.fabric
        patterns = {SHIFT: shift_pairs(fabric),
                    UNIFORM: host_pairs(fabric, UNIFORM, self.scenario.seed)}
        with run.watch() as watch:
            measured = run_patterns(run, patterns, p.seconds, p.omit_s, self.rate_mbit)
        return setup_results(watch, measured, run.setup.name)

    def predicted(self) -> dict[str, float]:
        """The fluid model's shift fraction for each routing it models."""
        fabric = self.dragonfly_fabric()
        return {mode: predicted_fraction(fabric, mode) for mode in MODELLED}

    def checks(self, results: dict[str, dict]) -> list[Check]:
        return claims(fractions(results), self.predicted())

    def trust(self, results: dict[str, dict]) -> list[Check]:
        return completion_checks(results)

    def rows(self, results: dict[str, dict]) -> list[tuple[str, str]]:
        table = fractions(results)
        predicted = self.predicted()
        rows = [Row(pattern, f"{fraction_row(table, pattern, LABELS)} of the host links",
                    *fraction_numbers(table, pattern, LABELS)) for pattern in (SHIFT, UNIFORM)]
        rows.append(Row(f"{SHIFT}, fluid model", ", ".join(
            f"{LABELS[mode]} {value:.0%}" for mode, value in predicted.items())
            + " of the host links",
            *(Number(LABELS[mode], value, "fraction") for mode, value in predicted.items())))
        return rows

    def plots(self, results: dict[str, dict], folder: Path, title: str) -> list[Path]:
        table = fractions(results)
        if not table:
            return []
        marks = {(LABELS[mode], SHIFT): 100 * value for mode, value in self.predicted().items()}
        return [plot_fractions(table, LABELS, title, folder / "fractions.png", marks,
                               "fluid model")]
