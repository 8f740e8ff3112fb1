"""ECMP on the wire: Hedera's ordering (non-blocking >= ECMP > single-path) on the k=4
fat-tree, and many flows spread over an edge switch's uplinks (Jain index), measured with
real TCP flows through OVS select groups."""
from __future__ import annotations

import pytest

from testbed.experiments.hedera.run import HederaConfig, run_hedera, verdict

JAIN_MIN_ECMP = 0.9            # the bar for 64 flows over 2 uplinks
SINGLE_PATH_SHARE_MIN = 0.99   # single-path: one uplink carries (nearly) all the bytes
ECMP_GAIN_MIN = 0.05           # ECMP above single-path by at least 5% of the host links
NONBLOCKING_SLACK = 0.02       # the reference may trail ECMP by 2% (measurement noise)


@pytest.fixture(scope="module")
def hedera(tmp_path_factory):
    config = HederaConfig(rate_mbit=10.0, seconds=4, omit_s=1, patterns=("stride4", "stride8"),
                          results_dir=str(tmp_path_factory.mktemp("hedera")))
    return run_hedera(config, log=lambda m: None)


def test_the_emulator_kept_up(hedera):
    assert verdict(hedera)["emulator_kept_up"], verdict(hedera)
    failed = [e for setup in hedera.patterns.values() for r in setup.values() for e in r.errors]
    assert not failed, failed


def test_ordering_nonblocking_ecmp_single(hedera):
    fraction = {setup: sum(r.fraction_of_capacity for r in hedera.patterns[setup].values())
                / len(hedera.patterns[setup]) for setup in hedera.patterns}
    assert fraction["nonblocking"] >= fraction["ecmp"] - NONBLOCKING_SLACK, fraction
    assert fraction["ecmp"] >= fraction["single"] + ECMP_GAIN_MIN, fraction


def test_ecmp_spreads_64_flows_over_the_uplinks(hedera):
    spread = hedera.spread["ecmp"]
    assert spread.flows == 64
    assert spread.jain >= JAIN_MIN_ECMP, spread


def test_single_path_puts_everything_on_one_uplink(hedera):
    spread = hedera.spread["single"]
    assert max(spread.uplink_bytes) >= SINGLE_PATH_SHARE_MIN * sum(spread.uplink_bytes), spread
