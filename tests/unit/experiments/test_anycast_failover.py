"""Anycast switch-over from a client's answers: when it moved to the far replica after the
cut and back after the repair, which requests were lost, who answered when."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from testbed import errors
from testbed.measure.anycast_failover import (
    FAT_TREE_K4,
    first_answer_from,
    lost_seqs,
    parse_answers,
    replicas_between,
    switch_over,
)

CUT = FAT_TREE_K4
NEAR, FAR = CUT.near, CUT.far
INTERVAL_S = CUT.interval_s
T0_S = 1000.0                 # monotonic time of request 0
RTT_S = 0.002
DOWN_SEQ, UP_SEQ = 150, 350   # the first requests sent after the cut and after the repair
T_DOWN_S = T0_S + DOWN_SEQ * INTERVAL_S - INTERVAL_S / 2
T_UP_S = T0_S + UP_SEQ * INTERVAL_S - INTERVAL_S / 2
# The far replica answers from the 8th request after the cut, the near one again from the
# 4th after the repair; the requests in between are lost.
FAR_SEQ, BACK_SEQ = DOWN_SEQ + 8, UP_SEQ + 4
LOST = [*range(DOWN_SEQ, FAR_SEQ), *range(UP_SEQ, BACK_SEQ)]


def answers_for(replica_for_seq, lost=(), requests=600) -> list[dict]:
    """A request every INTERVAL_S from T0_S, answered RTT_S later by
    ``replica_for_seq(seq)`` unless its seq is in ``lost``."""
    return [{"t_monotonic_s": T0_S + seq * INTERVAL_S + RTT_S, "seq": seq,
             "replica": replica_for_seq(seq)} for seq in range(requests) if seq not in lost]


def served(seq: int) -> str:
    return FAR if FAR_SEQ <= seq < BACK_SEQ else NEAR


def test_switch_over_and_back_are_timed_from_the_cut_and_the_repair():
    result = switch_over(answers_for(served, LOST), CUT, T_DOWN_S, T_UP_S)
    assert result.to_far_s == pytest.approx(8.5 * INTERVAL_S + RTT_S)
    assert result.back_to_near_s == pytest.approx(4.5 * INTERVAL_S + RTT_S)
    assert result.lost_seqs == LOST
    assert result.requests_lost == 12
    assert result.outage_s == pytest.approx(12 * INTERVAL_S)
    assert result.requests == 600
    assert result.replicas_before == [NEAR]
    assert result.replicas_while_down == [FAR]
    assert result.replicas_after == [NEAR]


def test_the_result_is_json_with_the_derived_figures():
    d = switch_over(answers_for(served, LOST), CUT, T_DOWN_S, T_UP_S).to_dict()
    assert json.loads(json.dumps(d)) == d
    assert d["requests_lost"] == 12 and d["outage_s"] == pytest.approx(12 * INTERVAL_S)
    assert (d["service_ip"], d["client"], d["interface"]) == ("10.255.0.1", "p0e1h0",
                                                              "p0e0-eth1")


def test_far_answers_long_after_the_move_back_are_reported():
    def lingering(seq):  # the far replica still answers every 7th request a second later
        return FAR if seq > UP_SEQ + 100 and seq % 7 == 0 else served(seq)
    result = switch_over(answers_for(lingering, LOST), CUT, T_DOWN_S, T_UP_S)
    assert result.replicas_after == [NEAR, FAR]


def test_answers_in_flight_at_the_move_back_are_not_counted_as_after():
    back_s = T0_S + BACK_SEQ * INTERVAL_S + RTT_S
    straggler = {"t_monotonic_s": back_s + 0.1, "seq": UP_SEQ, "replica": FAR}
    answers = sorted(answers_for(served, LOST) + [straggler], key=lambda a: a["t_monotonic_s"])
    assert switch_over(answers, CUT, T_DOWN_S, T_UP_S, in_flight_s=0.3).replicas_after == [NEAR]
    assert switch_over(answers, CUT, T_DOWN_S, T_UP_S,
                       in_flight_s=0.05).replicas_after == [NEAR, FAR]


def test_a_client_that_never_moves_is_an_error():
    never_moved = answers_for(lambda seq: NEAR, lost=range(DOWN_SEQ, UP_SEQ))
    with pytest.raises(errors.TestbedError, match=f"never moved to {FAR}"):
        switch_over(never_moved, CUT, T_DOWN_S, T_UP_S)


def test_a_client_that_never_moves_back_is_an_error():
    stays_far = answers_for(lambda seq: FAR if seq >= FAR_SEQ else NEAR)
    with pytest.raises(errors.TestbedError, match=f"never moved back to {NEAR}") as err:
        switch_over(stays_far, CUT, T_DOWN_S, T_UP_S)
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("before", [FAR, None])
def test_the_client_must_be_on_the_near_replica_before_the_cut(before):
    if before is None:  # nothing answered before the cut
        answers = [a for a in answers_for(served) if a["t_monotonic_s"] >= T_DOWN_S]
    else:
        answers = answers_for(lambda seq: before if seq < DOWN_SEQ else served(seq))
    with pytest.raises(errors.TestbedError, match=f"not by {NEAR} alone"):
        switch_over(answers, CUT, T_DOWN_S, T_UP_S)


def test_lost_seqs_are_the_gaps_below_the_last_answer():
    answers = [{"t_monotonic_s": float(s), "seq": s, "replica": NEAR} for s in (0, 1, 4, 6)]
    assert lost_seqs(answers) == [2, 3, 5]
    assert lost_seqs([]) == []


def test_first_answer_and_replicas_between_respect_the_bounds():
    answers = [{"t_monotonic_s": 1.0, "seq": 0, "replica": NEAR},
               {"t_monotonic_s": 2.0, "seq": 1, "replica": FAR},
               {"t_monotonic_s": 3.0, "seq": 2, "replica": FAR}]
    assert first_answer_from(answers, FAR, 2.0) == 2.0
    assert first_answer_from(answers, FAR, 2.5) == 3.0
    assert first_answer_from(answers, NEAR, 1.5) is None
    assert replicas_between(answers, 1.0, 2.0) == [NEAR]
    assert replicas_between(answers, 0.0, 10.0) == [NEAR, FAR]


def test_probe_output_is_one_answer_per_line():
    out = ('{"t_monotonic_s": 1.5, "seq": 0, "replica": "p0e0h0"}\n'
           '{"t_monotonic_s": 1.51, "seq": 1, "replica": "p0e0h0"}\n\n')
    assert [a["seq"] for a in parse_answers(out)] == [0, 1]


def test_the_cut_moves_a_client_off_its_nearest_replica_to_the_next_nearest():
    from testbed.controllers.routing.fabric_state import AnycastService
    from testbed.errors import ConfigError
    from testbed.measure.anycast_failover import FAT_TREE_K4, anycast_cut
    from testbed.model.topology.fattree import fat_tree

    fabric = fat_tree(4, host_rate_mbit=6.0)
    service = AnycastService("10.255.0.1", ("p0e0h0", "p3e1h1"))
    assert anycast_cut(fabric, service, "p0e1h0", "ecmp") == FAT_TREE_K4
    # a client in p3e1h1's pod is cut off that one and falls back to p0e0h0
    other = anycast_cut(fabric, service, "p3e0h0", "ecmp")
    assert (other.near, other.far, other.interface) == ("p3e1h1", "p0e0h0", "p3e1-eth2")  # h1: port 2
    three = AnycastService("10.255.0.1", ("p0e0h0", "p0e1h1", "p3e1h1"))
    assert anycast_cut(fabric, three, "p0e0h1", "ecmp").far == "p0e1h1"  # same pod first
    for client in ("p0e0h0", "nohost"):
        with pytest.raises(ConfigError, match="anycast_failover"):
            anycast_cut(fabric, service, client, "ecmp")
    with pytest.raises(ConfigError, match="two replicas"):
        anycast_cut(fabric, AnycastService("10.255.0.1", ("p0e0h0",)), "p0e1h0", "ecmp")


FAILOVER = {"client": "p0e1h0", "far": "p3e1h1", "near": "p0e0h0", "interface": "p0e0-eth1",
            "to_far_s": 0.061, "back_to_near_s": 1.073, "requests_lost": 8, "requests": 600,
            "outage_s": 0.08}


def anycast_experiment():
    from testbed.experiments.registry import load

    return load("fattree-anycast-failover").experiment


def test_the_run_summary_names_the_failover():
    [(label, text)] = anycast_experiment().rows({"fabric": {"failover": FAILOVER}})
    assert label == "anycast failover"
    assert "61 ms" in text and "1073 ms" in text and "8 requests lost" in text


def test_the_checks_hold_both_moves_and_the_outage_to_the_goal():
    checks = anycast_experiment().checks({"fabric": {"failover": FAILOVER}})
    assert [(c.name, c.measured, c.outcome) for c in checks] == [
        ("switch-over to the far replica", 0.061, "PASS"),
        ("back to the near replica", 1.073, "FAIL"),  # over the 1 s goal
        ("outage (requests lost x interval)", 0.08, "PASS")]


def test_a_client_that_is_a_replica_is_refused_naming_params_client(tmp_path):
    from testbed.experiments.registry import load
    from testbed.harness.scenario import ScenarioError

    text = (Path(__file__).resolve().parents[3] / "scenarios" /
            "fattree-anycast-failover.yaml").read_text().replace("client: p0e1h0",
                                                                  "client: p0e0h0")
    (tmp_path / "s.yaml").write_text(text)
    with pytest.raises(ScenarioError) as info:
        load(tmp_path / "s.yaml")
    assert [p.field for p in info.value.problems] == ["params.client"]
