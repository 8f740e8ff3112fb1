from __future__ import annotations

import pytest

from testbed.errors import ConfigError
from testbed.experiments.hedera.run import (
    HederaConfig,
    HederaResult,
    PatternResult,
    format_hedera,
    uplinks,
    verdict,
)
from testbed.model.topology.fattree import fat_tree


def result_with(fractions: dict[str, float]) -> HederaResult:
    result = HederaResult(config={"patterns": ["stride4"], "rate_mbit": 10.0})
    for setup, fraction in fractions.items():
        result.patterns[setup] = {"stride4": PatternResult("stride4", [], [], fraction)}
    return result


def test_verdict_ordering_and_fidelity():
    good = verdict(result_with({"nonblocking": 0.97, "ecmp": 0.6, "single": 0.25}))
    assert good["emulator_kept_up"] and good["patterns"]["stride4"]["ordering_holds"]
    assert good["patterns"]["stride4"]["gap_ecmp_vs_nonblocking"] == pytest.approx(0.37)
    slow = verdict(result_with({"nonblocking": 0.7, "ecmp": 0.6, "single": 0.25}))
    assert not slow["emulator_kept_up"]
    broken = verdict(result_with({"nonblocking": 0.97, "ecmp": 0.25, "single": 0.25}))
    assert not broken["patterns"]["stride4"]["ordering_holds"]
    assert "ordering BROKEN" in format_hedera(result_with({"nonblocking": 0.97, "ecmp": 0.25,
                                                           "single": 0.25}))


def test_edge_uplinks_are_the_ports_toward_aggregation():
    assert uplinks(fat_tree(4), "p0e0") == ["p0e0-eth3", "p0e0-eth4"]
    assert len(uplinks(fat_tree(8), "p0e0")) == 4


@pytest.mark.parametrize(("field", "value"), [("rate_mbit", 0), ("seconds", 1), ("omit_s", -1),
                                              ("patterns", ("stride16",)),
                                              ("patterns", ("bogus",))])
def test_bad_configs_are_one_line_errors(field, value):
    with pytest.raises(ConfigError):
        HederaConfig(**{field: value}).validate()


def test_the_published_gap_stands_beside_ours():
    from testbed.experiments.hedera.run import PUBLISHED_MBIT, published_ratio

    assert published_ratio("stride4") == pytest.approx(3482 / 12465)
    assert published_ratio("stride1") > 1.0  # ECMP matched the switch when flows stay local
    assert published_ratio("stagger") is None
    ordered = [published_ratio(f"stride{n}") for n in (1, 2, 4, 8)]
    assert ordered == sorted(ordered, reverse=True)  # the gap opens as flows cross more layers
    assert set(PUBLISHED_MBIT) >= {"stride1", "stride2", "stride4", "stride8", "random"}
    row = verdict(result_with({"nonblocking": 0.98, "ecmp": 0.49, "single": 0.25}))
    assert row["patterns"]["stride4"]["ecmp_over_nonblocking"] == pytest.approx(0.5)
    assert row["patterns"]["stride4"]["published_ecmp_over_nonblocking"] == pytest.approx(0.279,
                                                                                          abs=1e-3)
    text = format_hedera(result_with({"nonblocking": 0.98, "ecmp": 0.49, "single": 0.25}))
    assert "0.50 (0.28)" in text and "hedera_results.csv" in text
