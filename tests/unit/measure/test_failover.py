from __future__ import annotations

import pytest

from testbed.measure.failover import Failover, ping_received


def test_ping_summary_is_parsed():
    out = "--- 10.0.0.2 ping statistics ---\n150 packets transmitted, 146 received, 2.7% packet loss"
    assert ping_received(out) == 146
    assert ping_received("connect: Network is unreachable") == 0


def test_outage_is_lost_probes_times_their_interval():
    f = Failover("p0e0-eth3", 0.028, 0.053, 4, 0.02, 0.05)
    assert f.outage_s == pytest.approx(0.08)
    assert f.to_dict()["outage_s"] == pytest.approx(0.08)
