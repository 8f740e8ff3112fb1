from __future__ import annotations

import pytest

from testbed.experiments.dragonfly.run import (
    DRAGONFLY,
    SHIFT,
    UNIFORM,
    predicted_fraction,
    shift_pairs,
    verdict,
)
from testbed.experiments.hedera.run import HederaResult, PatternResult, format_table
from testbed.model.topology.dragonfly import dragonfly


def test_shift_sends_every_host_to_the_next_group():
    fabric = dragonfly(host_rate_mbit=10.0, **DRAGONFLY)
    pairs = shift_pairs(fabric)
    assert len(pairs) == len(fabric.hosts)
    g = DRAGONFLY["g"]
    for src, dst in pairs:
        assert fabric.nodes[dst].coords[0] == (fabric.nodes[src].coords[0] + 1) % g


def test_the_fluid_model_separates_minimal_from_valiant_on_this_dragonfly():
    fabric = dragonfly(host_rate_mbit=10.0, **DRAGONFLY)
    assert predicted_fraction(fabric, "minimal") == pytest.approx(1 / 3)
    assert predicted_fraction(fabric, "valiant") > 0.6


def result_with(fractions):
    result = HederaResult(config={"rate_mbit": 10.0})
    for setup, (shift, uniform) in fractions.items():
        result.patterns[setup] = {SHIFT: PatternResult(SHIFT, [], [], shift),
                                  UNIFORM: PatternResult(UNIFORM, [], [], uniform)}
    return result


def test_verdict_checks_kim_et_al_claims():
    good = verdict(result_with({"minimal": (0.33, 0.8), "valiant": (0.6, 0.6),
                                "ugal": (0.5, 0.75), "ecmp": (0.5, 0.8)}))
    assert good["shift_valiant_beats_minimal"] and good["shift_ugal_beats_minimal"]
    assert good["uniform_minimal_at_least_valiant"]
    bad = verdict(result_with({"minimal": (0.5, 0.5), "valiant": (0.5, 0.9),
                               "ugal": (0.5, 0.5), "ecmp": (0.5, 0.5)}))
    assert not bad["shift_valiant_beats_minimal"] and not bad["uniform_minimal_at_least_valiant"]
    assert "33.0%" in format_table(result_with({"minimal": (0.33, 0.8)}), ["minimal"],
                                   [SHIFT, UNIFORM])
