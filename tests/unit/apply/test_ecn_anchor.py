"""The ECN anchor agent without root: its plan and one poll's anchors (testbed.plan.anchoring),
one poll and the agent's loop over stand-in maps and qdiscs, and the real agent refusing to
start without the marker's maps. Nothing here touches /sys/fs/bpf, tc or a namespace; the
anchored rule itself and the marker's C are in plan/test_qos.py, the bpf(2) wrapper in
test_bpf_syscall.py, the process lifecycle in test_agent_process.py."""
from __future__ import annotations

import errno
import json
import os
import threading
import time
from dataclasses import replace

import pytest

import testbed.apply.ecn_anchor as ecn_anchor
import testbed.apply.state as state
import testbed.errors as errors
from testbed.apply import bpf_syscall
from testbed.apply.state import Ledger
from testbed.plan.anchoring import (
    ANCHOR_POLL_S,
    AnchorPlan,
    AnchorPort,
    accepted_bytes,
    anchor_plan,
    anchor_values,
    port_backlog,
)
from testbed.plan.ecn_plan import ANCHOR_LAYOUT, QDEPTH_LAYOUT, pack_value, unpack_value
from testbed.plan.port_queue import Handles, Impairment, Port
from testbed.plan.profiles import QueueConfig, RedEcn, StepEcn

RATE_MBIT = 20.0
RATE_BYTES_PER_S = 2_500_000
BUFFER_BYTES = 125_000
PORTS = [Port("l0-eth1", 40, RATE_MBIT), Port("l0-eth3", 42, RATE_MBIT)]
HTB, NETEM = Handles.HTB_MAJOR, Handles.IMPAIRMENT_MAJOR


# --- the agent's plan and its anchors -----------------------------------------------------------


def test_only_marking_ports_are_anchored_and_a_delayed_port_reads_its_delay_line():
    queue = QueueConfig(BUFFER_BYTES, StepEcn(30_000))
    plan = anchor_plan(PORTS, queue, {"l0-eth3": Impairment(delay_ms=1.5, jitter_ms=0.5)})
    assert plan.poll_s == ANCHOR_POLL_S
    assert plan.ports == (AnchorPort("l0-eth1", 40, RATE_BYTES_PER_S, 0),
                          AnchorPort("l0-eth3", 42, RATE_BYTES_PER_S, 1_500_000))
    assert plan.backlog_keys() == {(40, HTB), (42, HTB), (42, NETEM)}
    assert AnchorPlan.from_json(json.loads(json.dumps(plan.to_json()))) == plan
    assert plan.anchor_pin == "/sys/fs/bpf/tc/globals/ecn_anchor"
    assert anchor_plan(PORTS, QueueConfig(BUFFER_BYTES)) is None  # MODE_OFF: counts only
    assert anchor_plan([], queue) is None
    assert anchor_plan(PORTS, QueueConfig(BUFFER_BYTES, RedEcn(5_000, 50_000, 0.01))) is not None
    with pytest.raises(ValueError):
        anchor_plan(PORTS, queue, poll_s=0)


def test_a_ports_backlog_is_its_htb_tree_and_what_its_delay_line_will_add():
    plain = AnchorPort("l0-eth1", 40, RATE_BYTES_PER_S)
    assert port_backlog(plain, {(40, HTB): 64_000}) == 64_000
    assert port_backlog(plain, {}) is None
    delayed = AnchorPort("l0-eth3", 42, RATE_BYTES_PER_S, delay_ns=2_000_000)  # drains 5000 B
    assert port_backlog(delayed, {(42, HTB): 30_000, (42, NETEM): 8_000}) == 33_000
    assert port_backlog(delayed, {(42, HTB): 1_000, (42, NETEM): 3_000}) == 0
    assert port_backlog(delayed, {(42, HTB): 30_000}) is None  # the line unread


def test_one_polls_anchors_carry_the_reading_its_time_and_the_accepted_bytes():
    plan = anchor_plan(PORTS, QueueConfig(BUFFER_BYTES, StepEcn(30_000)))
    qdepth = {40: pack_value(QDEPTH_LAYOUT, {"queue_bytes": 1, "accepted_bytes": 7_000}),
              42: pack_value(QDEPTH_LAYOUT, {"accepted_bytes": 9_000_000})}
    accepted = accepted_bytes(qdepth)
    assert accepted == {40: 7_000, 42: 9_000_000}
    values = anchor_values(plan, accepted, {(40, HTB): 3_000, (42, HTB): 450_000}, 10**9, 17)
    assert {k: unpack_value(ANCHOR_LAYOUT, v) for k, v in values.items()} == {
        40: {"lock": 0, "pad": 0, "backlog_bytes": 3_000, "time_ns": 10**9,
             "accepted_bytes": 7_000, "seq": 17},
        42: {"lock": 0, "pad": 0, "backlog_bytes": 450_000, "time_ns": 10**9,
             "accepted_bytes": 9_000_000, "seq": 17}}
    # a port missing a reading keeps its last anchor
    assert set(anchor_values(plan, {40: 1}, {(40, HTB): 0, (42, HTB): 0}, 1, 18)) == {40}
    assert set(anchor_values(plan, accepted, {(42, HTB): 0}, 1, 18)) == {42}
    with pytest.raises(ValueError):
        anchor_values(plan, accepted, {}, 1, 0)  # seq 0 is "no reading"


# --- the agent over stand-in maps and qdiscs ----------------------------------------------------


class Calls(list):
    """The order in which the agent touched the kernel."""


class StandInMap:
    def __init__(self, calls: Calls, name: str, entries: dict[int, bytes]):
        self.calls, self.name, self.entries, self.closed = calls, name, entries, False

    def items(self):
        self.calls.append(("read", self.name))
        return dict(self.entries)

    def update_many(self, entries, flags=0):
        self.calls.append(("write", self.name, flags))
        self.entries.update(entries)

    def close(self):
        self.closed = True


class StandInBacklogs:
    def __init__(self, calls: Calls, backlogs: dict[tuple[int, int], int]):
        self.calls, self.backlogs = calls, backlogs

    def send(self):
        self.calls.append(("send",))
        return {1: "pending"}

    def receive(self, pending):
        assert pending == {1: "pending"}
        self.calls.append(("receive",))
        return dict(self.backlogs)


@pytest.fixture
def stand_ins(monkeypatch):
    calls = Calls()
    maps = {"ecn_qdepth": StandInMap(calls, "ecn_qdepth", {
                40: pack_value(QDEPTH_LAYOUT, {"accepted_bytes": 5_000}),
                42: pack_value(QDEPTH_LAYOUT, {"accepted_bytes": 8_000}),
                99: pack_value(QDEPTH_LAYOUT, {"accepted_bytes": 1})}),  # an unmarked port
            "ecn_anchor": StandInMap(calls, "ecn_anchor", {})}

    def open_map(path, value_size):
        name = str(path).rsplit("/", 1)[1]
        assert value_size == len(pack_value(QDEPTH_LAYOUT if name == "ecn_qdepth"
                                            else ANCHOR_LAYOUT, {}))
        return maps[name]

    monkeypatch.setattr(ecn_anchor, "PinnedMap", open_map)
    monkeypatch.setattr(ecn_anchor, "QdiscBacklogs", lambda wanted: StandInBacklogs(
        calls, {key: 1_500 * key[0] for key in wanted}))
    monkeypatch.setattr(ecn_anchor, "realtime_priority", lambda: "stand-in")
    return calls, maps


def anchored_plan(poll_s: float = ANCHOR_POLL_S) -> AnchorPlan:
    return anchor_plan(PORTS, QueueConfig(BUFFER_BYTES, StepEcn(30_000)), poll_s=poll_s)


def test_a_poll_reads_the_accepted_bytes_then_the_backlogs_and_writes_under_the_lock(
        stand_ins, tmp_path):
    calls, maps = stand_ins
    agent = ecn_anchor.AnchorAgent(anchored_plan(), tmp_path)
    before = time.monotonic_ns()
    agent.poll()
    agent.poll()
    assert calls == [("read", "ecn_qdepth"), ("send",), ("receive",),
                     ("write", "ecn_anchor", bpf_syscall.BPF_F_LOCK)] * 2
    written = {k: unpack_value(ANCHOR_LAYOUT, v) for k, v in maps["ecn_anchor"].entries.items()}
    assert set(written) == {40, 42}  # the marked ports only
    assert (written[40]["backlog_bytes"], written[40]["accepted_bytes"]) == (60_000, 5_000)
    assert (written[42]["backlog_bytes"], written[42]["accepted_bytes"]) == (63_000, 8_000)
    assert written[40]["seq"] == written[42]["seq"] == 2  # a new seq every poll
    assert before <= written[40]["time_ns"] <= time.monotonic_ns()
    assert agent.polls == 2 and agent.read_window_us.count == 2


def test_the_agent_says_ready_polls_until_stopped_and_records_its_polls(stand_ins, tmp_path):
    calls, maps = stand_ins
    agent = ecn_anchor.AnchorAgent(anchored_plan(poll_s=0.001), tmp_path)
    stopper = threading.Timer(0.1, agent.stop_event.set)
    stopper.start()
    assert agent.run() == 0
    stopper.join()
    assert (tmp_path / ecn_anchor.READY_FILE).exists()
    record = json.loads((tmp_path / ecn_anchor.COUNTERS_FILE).read_text())
    assert record["polls"] == agent.polls > 1 and record["seq"] == agent.polls
    assert record["poll_gap_ms"]["count"] == agent.polls - 2  # gaps between loop polls
    assert record["scheduling"] == "stand-in" and record["error"] is None
    assert record["ports"] == ["l0-eth1", "l0-eth3"] and record["cpu_s"] >= 0
    assert all(m.closed for m in maps.values())


def test_a_failing_read_ends_the_agent_with_the_error_recorded(stand_ins, tmp_path):
    calls, maps = stand_ins
    agent = ecn_anchor.AnchorAgent(anchored_plan(), tmp_path)

    def gone():
        raise OSError(errno.ENODEV, "reading qdisc 5: on ifindex 42: No such device")

    agent.backlogs.send = gone
    with pytest.raises(OSError):
        agent.run()
    record = json.loads((tmp_path / ecn_anchor.COUNTERS_FILE).read_text())
    assert "No such device" in record["error"]
    assert not (tmp_path / ecn_anchor.READY_FILE).exists()  # it never polled once


def test_the_anchor_agent_cannot_start_without_the_markers_maps(tmp_path, monkeypatch):
    """The real agent, its maps pinned where none are: it ends before it is ready, and says
    why."""
    from testbed.apply.marking import AnchorAgentProcess

    monkeypatch.setattr(state, "STATE_DIR", tmp_path / "state")
    monkeypatch.setattr(state, "LEDGER_PATH", tmp_path / "state" / "state.json")
    workdir = tmp_path / "run"
    workdir.mkdir()
    ledger = Ledger("run-1", os.getpid())
    agent = AnchorAgentProcess(workdir, ledger, log=lambda m: None)
    missing = tmp_path / "no-bpffs"
    plan = replace(anchored_plan(), qdepth_pin=str(missing / "ecn_qdepth"),
                   anchor_pin=str(missing / "ecn_anchor"))
    with pytest.raises(errors.TestbedError) as err:
        agent.start(plan)
    assert "the ECN anchor agent exited" in str(err.value)
    assert "no-bpffs/ecn_qdepth" in str(err.value)  # the map it could not open
    assert not (workdir / ecn_anchor.READY_FILE).exists()
