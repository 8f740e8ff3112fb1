"""Queues on fabrics whose links have rates of their own (spine-leaf uplinks, NVSwitch nodes'
NVLinks): every shaped port's queue, planned from the scenario's one queue section, must be
sized for the rate its own HTB sends at, in the switch ports' plans, the hosts' NIC queues,
the pause agent's plan, the run's records and the verdict's marker tolerance; and a fabric
whose links all run at the scenario's rate gets exactly the plans it got from one queue."""
from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
from tests.unit.stand_ins import StandInFabric

from testbed.errors import ConfigError
from testbed.experiments.allreduce.experiment import port_buffer_bytes
from testbed.harness.plans import queue_plan
from testbed.harness.plots import plot_queue_depth
from testbed.experiments.registry import load
from testbed.harness.scenario import SCENARIO_DIR, QueueSpec
from testbed.measure.fidelity import Watch, marker_tolerance_bytes
from testbed.measure.queues import QueueSeries, ecn_report, marking_starts_bytes
from testbed.model.topology import build
from testbed.model.topology.spineleaf import spine_leaf
from testbed.plan.bring_up import host_script
from testbed.plan.ecn_plan import ECN_PATH_EBPF, ECN_PATH_RED
from testbed.plan.pfc import agent_plan, switch_fan_in
from testbed.plan.port_queue import (
    default_buffer_bytes,
    htb_burst_bytes,
    port_plan,
    switch_queue_plan,
)
from testbed.plan.profiles import QueueConfig, StepEcn
from testbed.plan.scaling import DEFAULT_PFC_REACTION_TIME_S, dctcp_step, pfc_thresholds
from testbed.plan.settings import EcnSettings, ecn_settings, queue_record

MTU = 1500
HOST_RATE_MBIT = 20.0
UPLINK_RATE_MBIT = 4 * HOST_RATE_MBIT
# Holds PFC's headroom at the uplink rate for every port that can feed a queue.
PFC_BUFFER_BYTES = 2_000_000
POLL_S = 0.004
RTT_S = 0.010  # DCTCP's K > C * RTT / 7 then grows with the rate above the frame floor
PATHS = (ECN_PATH_RED, ECN_PATH_EBPF)
PNG_MAGIC = b"\x89PNG"


def fast_uplinks(leaves: int = 2, spines: int = 2, hosts_per_leaf: int = 2):
    """A spine-leaf whose uplinks run at four times the host rate."""
    return spine_leaf(leaves=leaves, spines=spines, hosts_per_leaf=hosts_per_leaf,
                      host_rate_mbit=HOST_RATE_MBIT, uplink_rate_mbit=UPLINK_RATE_MBIT,
                      mtu_bytes=MTU)


def switch_ends_at(fabric, rate_mbit: float) -> list[str]:
    """The switch interfaces of the links at ``rate_mbit``."""
    ends = [intf for _, _, intf, link in fabric.switch_ends() if link.rate_mbit == rate_mbit]
    assert ends, f"the fabric has switch ports at {rate_mbit} Mbit/s"
    return ends


def fake_ifindex(intf: str) -> int:
    return 100 + sum(map(ord, intf))


def port_lines(plan, intf: str) -> list[str]:
    return [line for line in plan.tc if f" dev {intf} " in line]


def dctcp_queue(fabric):
    return queue_plan(QueueSpec(ecn={"scheme": "dctcp", "rtt_s": RTT_S}), HOST_RATE_MBIT, MTU,
                      fabric)


# --- every port's queue at its own link's rate --------------------------------------------------


@pytest.mark.parametrize("path", PATHS)
def test_an_uplink_port_gets_the_buffer_and_k_of_its_own_rate(path):
    fabric = fast_uplinks()
    queue, _ = dctcp_queue(fabric)
    plan = switch_queue_plan(fabric, queue, path, ifindex=fake_ifindex)
    sized = QueueConfig(buffer_bytes=default_buffer_bytes(UPLINK_RATE_MBIT, MTU),
                        ecn=dctcp_step(UPLINK_RATE_MBIT, MTU, RTT_S)[0])
    for intf in switch_ends_at(fabric, UPLINK_RATE_MBIT):
        own = port_plan(intf, UPLINK_RATE_MBIT, MTU, sized, path, ifindex=fake_ifindex(intf))
        assert port_lines(plan, intf) == own.tc
        for command in own.bpftool:
            assert command in plan.bpftool


@pytest.mark.parametrize("path", PATHS)
def test_a_host_port_keeps_the_queue_of_the_scenarios_rate(path):
    fabric = fast_uplinks()
    queue, _ = dctcp_queue(fabric)
    plan = switch_queue_plan(fabric, queue, path, ifindex=fake_ifindex)
    alone, _ = dctcp_queue(spine_leaf(leaves=2, spines=2, hosts_per_leaf=2,
                                      host_rate_mbit=HOST_RATE_MBIT, mtu_bytes=MTU))
    assert queue.buffer_bytes == alone.buffer_bytes and queue.ecn == alone.ecn
    for intf in switch_ends_at(fabric, HOST_RATE_MBIT):
        own = port_plan(intf, HOST_RATE_MBIT, MTU, alone, path, ifindex=fake_ifindex(intf))
        assert port_lines(plan, intf) == own.tc


def test_the_pause_agent_watches_an_uplink_port_against_the_thresholds_of_its_rate():
    fabric = fast_uplinks()
    queue, _ = queue_plan(QueueSpec(buffer_bytes=PFC_BUFFER_BYTES, pfc=True), HOST_RATE_MBIT,
                          MTU, fabric)
    plan = agent_plan(fabric, queue, POLL_S)
    for rate in (HOST_RATE_MBIT, UPLINK_RATE_MBIT):
        pfc, _ = pfc_thresholds(rate, MTU, PFC_BUFFER_BYTES, fan_in=switch_fan_in(fabric))
        for intf in switch_ends_at(fabric, rate):
            entry = plan.interfaces[intf]
            assert (entry["xoff_bytes"], entry["xon_bytes"]) == (pfc.xoff_bytes, pfc.xon_bytes)


def test_the_pause_agent_holds_each_port_with_the_buffer_of_its_rate():
    # one spine and one host per leaf: every queue has one feeding port, so PFC's headroom
    # fits the default buffer at either rate
    fabric = fast_uplinks(spines=1, hosts_per_leaf=1)
    queue, _ = queue_plan(QueueSpec(pfc=True), HOST_RATE_MBIT, MTU, fabric)
    plan = agent_plan(fabric, queue, POLL_S)
    assert {info["buffer_bytes"] for info in plan.interfaces.values()} == {
        default_buffer_bytes(HOST_RATE_MBIT, MTU), default_buffer_bytes(UPLINK_RATE_MBIT, MTU)}
    for intf, info in plan.interfaces.items():
        assert info["buffer_bytes"] == default_buffer_bytes(info["rate_mbit"], MTU), intf
    assert (plan.quanta, plan.storm_threshold_ms) == (queue.pfc.quanta,
                                                      queue.pfc.storm_threshold_ms)


def test_a_gpu_nic_queues_with_the_buffer_of_its_nvlink():
    fabric = build("nvswitch", base="spineleaf", leaves=1, spines=1, hosts_per_leaf=1,
                   gpus_per_node=2, host_rate_mbit=HOST_RATE_MBIT, mtu_bytes=MTU)
    queue, _ = queue_plan(QueueSpec(classes=True), HOST_RATE_MBIT, MTU, fabric)
    gpu = fabric.hosts[0].name
    link, end = fabric.host_link(gpu)
    assert link.rate_mbit != HOST_RATE_MBIT
    buffer_bytes = default_buffer_bytes(link.rate_mbit, MTU)
    script = host_script(fabric, gpu, queue=queue)
    assert f"dev {link.intf(end)} parent 5:10 handle 20: bfifo limit {buffer_bytes}" in script


# --- what the section sets, and what the plan scales ---------------------------------------------


def test_explicit_values_are_kept_at_every_rate():
    queue, _ = queue_plan(QueueSpec(buffer_bytes=90_000, ecn={"profile": "step",
                                                              "k_bytes": 30_000}),
                          HOST_RATE_MBIT, MTU, fast_uplinks())
    assert [q.rate_mbit for q in queue.by_rate] == [HOST_RATE_MBIT, UPLINK_RATE_MBIT]
    for q in queue.by_rate:
        assert (q.buffer_bytes, q.ecn) == (90_000, StepEcn(30_000))


def test_a_scheme_is_scaled_to_each_rate_and_recorded_per_rate():
    queue, record = queue_plan(QueueSpec(ecn={"scheme": "dcqcn"}, classes=True), HOST_RATE_MBIT,
                               MTU, fast_uplinks())
    for q in queue.by_rate:
        buffer_bytes = default_buffer_bytes(q.rate_mbit, MTU)
        sized = ecn_settings({"scheme": "dcqcn"}, q.rate_mbit, MTU, buffer_bytes)
        assert (q.buffer_bytes, q.ecn, q.uses_classes) == (buffer_bytes, sized.queue.ecn, True)
    assert [r["rate_mbit"] for r in record["rates"]] == [HOST_RATE_MBIT, UPLINK_RATE_MBIT]
    uplink = record["rates"][1]
    assert uplink["buffer_bytes"] == default_buffer_bytes(UPLINK_RATE_MBIT, MTU)
    assert {r["emulated_rate_mbit"] for r in uplink["ecn"]["ecn"]} == {UPLINK_RATE_MBIT}
    # the record's top level stays the scenario rate's, as on a fabric of one rate
    assert {k: v for k, v in record.items() if k != "rates"} == {
        k: v for k, v in record["rates"][0].items() if k != "rate_mbit"}


def test_an_error_names_the_field_and_the_rate_it_fails_at():
    # headroom at the host rate fits 600 KB; at four times the rate it does not
    with pytest.raises(ConfigError) as info:
        queue_plan(QueueSpec(buffer_bytes=600_000, pfc=True), HOST_RATE_MBIT, MTU,
                   fast_uplinks())
    assert info.value.field == "queue.buffer_bytes"
    assert f"links at {UPLINK_RATE_MBIT:g} Mbit/s" in info.value.problem


def test_a_queue_answers_only_for_rates_it_was_planned_for():
    queue, _ = dctcp_queue(fast_uplinks())
    assert queue.for_rate(HOST_RATE_MBIT) is queue and queue.for_rate(None) is queue
    assert queue.for_rate(UPLINK_RATE_MBIT).rate_mbit == UPLINK_RATE_MBIT
    with pytest.raises(ValueError, match="no queue planned"):
        queue.for_rate(3 * HOST_RATE_MBIT)
    plain = QueueConfig(buffer_bytes=90_000)
    assert plain.for_rate(UPLINK_RATE_MBIT) is plain and plain.by_rate == (plain,)


@pytest.mark.parametrize("other", [
    QueueConfig(buffer_bytes=90_000, rate_mbit=UPLINK_RATE_MBIT, class_queues=True),
    QueueConfig(buffer_bytes=90_000, rate_mbit=UPLINK_RATE_MBIT, ecn=StepEcn(3000)),
    QueueConfig(buffer_bytes=90_000, rate_mbit=HOST_RATE_MBIT),
    QueueConfig(buffer_bytes=90_000),
])
def test_every_rate_of_a_queue_has_the_same_classes_and_marking(other):
    with pytest.raises(ConfigError):
        QueueConfig(buffer_bytes=90_000, rate_mbit=HOST_RATE_MBIT, other_rates=(other,))


# --- the records, the reports and the verdict ----------------------------------------------------


def test_the_queue_record_lists_every_rate_only_when_there_are_several():
    queue, _ = dctcp_queue(fast_uplinks())
    record = queue_record(queue)
    assert [(r["rate_mbit"], r["buffer_bytes"], r["ecn"]["k_bytes"]) for r in record["rates"]] \
        == [(q.rate_mbit, q.buffer_bytes, q.ecn.k_bytes) for q in queue.by_rate]
    alone, _ = dctcp_queue(spine_leaf(leaves=1, spines=1, hosts_per_leaf=2,
                                      host_rate_mbit=HOST_RATE_MBIT, mtu_bytes=MTU))
    assert set(queue_record(alone)) == {"buffer_bytes", "ecn"}


def test_a_scenario_with_fast_uplinks_describes_every_rates_queue(tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text(f"name: t\ntopology: {{name: spineleaf, leaves: 2, spines: 2, "
                    f"hosts_per_leaf: 2, uplink_rate_mbit: {UPLINK_RATE_MBIT}}}\n"
                    f"link_rate_mbit: {HOST_RATE_MBIT}\nmtu_bytes: {MTU}\n"
                    "queue: {ecn: {scheme: dctcp}}\n")
    (setup,) = load(path).setups
    described = setup.describe()["queue"]
    assert [r["rate_mbit"] for r in described["rates"]] == [HOST_RATE_MBIT, UPLINK_RATE_MBIT]
    assert [r["rate_mbit"] for r in described["record"]["rates"]] == \
        [HOST_RATE_MBIT, UPLINK_RATE_MBIT]


def test_the_ecn_report_takes_each_ports_marking_threshold(tmp_path):
    fabric = fast_uplinks()
    queue, record = dctcp_queue(fabric)
    host, uplink = (switch_ends_at(fabric, r)[0] for r in (HOST_RATE_MBIT, UPLINK_RATE_MBIT))
    counters = {host: {"rate_mbit": HOST_RATE_MBIT}, uplink: {"rate_mbit": UPLINK_RATE_MBIT}}
    starts = marking_starts_bytes(queue, counters)
    assert starts == {host: queue.ecn.k_bytes,
                      uplink: queue.for_rate(UPLINK_RATE_MBIT).ecn.k_bytes}
    between = (starts[host] + starts[uplink]) // 2  # above the host port's K, below the uplink's
    series = QueueSeries(t_s=[0.0, 0.01], depth_bytes={host: [between, 0], uplink: [between, 0]},
                         read_s=[0.001, 0.001])
    report = ecn_report(EcnSettings(queue, record["ecn"], ECN_PATH_EBPF, 10.0), ECN_PATH_EBPF,
                        counters, series)
    assert report["marking_starts_bytes"] == starts
    assert report["queue_depth"]["ports"][host]["above_threshold_fraction"] == 0.5
    assert report["queue_depth"]["ports"][uplink]["above_threshold_fraction"] == 0.0
    assert len(report["queue"]["rates"]) == 2
    png = plot_queue_depth(report["samples"], report, "spine-leaf, fast uplinks",
                           tmp_path / "q.png")
    assert png.read_bytes().startswith(PNG_MAGIC)
    single = QueueConfig(buffer_bytes=90_000, ecn=StepEcn(3000))
    assert marking_starts_bytes(single, counters) == 3000


def test_the_verdict_judges_each_marked_port_by_the_thresholds_of_its_rate():
    fabric = fast_uplinks()
    queue, _ = dctcp_queue(fabric)
    watch = Watch(StandInFabric(fabric, queue=queue))
    watch.sampler._t0 = 0.0
    labels = [d.label for d in watch.sampler.directions if d.rate_mbit]
    series = watch.series
    series.t_s = [0.0, 1.0]
    series.link_bytes = {label: [0, 0] for label in series.link_bytes}
    series.queue_t_s = [0.0, 1.0]
    series.queue_index = [0, 1]
    series.backlog_bytes = {label: [0, 0] for label in labels}
    series.model_bytes = {label: [0, 0] for label in labels}
    _, marker = watch.queue_signals((0.0, 1.0))
    frame = MTU + 14
    for label in labels:
        rate = watch.directions[label].rate_mbit
        assert marker[label]["tolerance_bytes"] == marker_tolerance_bytes(
            queue.for_rate(rate).ecn, frame, htb_burst_bytes(rate, MTU)), label
    assert len({marker[label]["tolerance_bytes"] for label in labels}) == 2


def test_a_roce_ack_timeout_outlasts_the_slowest_draining_rate():
    fast = QueueConfig(buffer_bytes=90_000, rate_mbit=UPLINK_RATE_MBIT)
    queue = QueueConfig(buffer_bytes=90_000, rate_mbit=HOST_RATE_MBIT, other_rates=(fast,))
    assert port_buffer_bytes(queue, HOST_RATE_MBIT, MTU) == 90_000  # the host port drains last
    slow = QueueConfig(buffer_bytes=90_000, rate_mbit=HOST_RATE_MBIT / 2)
    queue = QueueConfig(buffer_bytes=90_000, rate_mbit=HOST_RATE_MBIT, other_rates=(slow,))
    assert port_buffer_bytes(queue, HOST_RATE_MBIT, MTU) == 180_000  # as long as 90 KB at half


# --- fabrics of one rate: the plans they had -----------------------------------------------------


def single_queue_plan(spec: QueueSpec, rate_mbit: float, mtu_bytes: int, fabric) -> tuple:
    """The queue plan before queues were sized per link rate, restated as the reference: one
    queue for every port, its buffer, marking and PFC all sized for the scenario's rate."""
    buffer_bytes = spec.buffer_bytes or default_buffer_bytes(rate_mbit, mtu_bytes)
    rule = "as configured" if spec.buffer_bytes else "50 ms at the link rate, at least 8 frames"
    record: dict = {"buffer_bytes": buffer_bytes, "buffer_rule": rule}
    ecn = pfc = None
    if spec.ecn is not None:
        marking = ecn_settings({**spec.ecn, "buffer_bytes": buffer_bytes}, rate_mbit, mtu_bytes,
                               buffer_bytes)
        ecn, record["ecn"] = marking.queue.ecn, marking.scaling
    if spec.pfc:
        pfc, record["pfc"] = pfc_thresholds(rate_mbit, mtu_bytes, buffer_bytes,
                                            reaction_time_s=DEFAULT_PFC_REACTION_TIME_S,
                                            fan_in=switch_fan_in(fabric))
    return QueueConfig(buffer_bytes, ecn=ecn, pfc=pfc, class_queues=spec.classes), record


# A queue section of every kind: default buffer, explicit thresholds, both schemes, classes, PFC.
SECTIONS = (
    QueueSpec(),
    QueueSpec(buffer_bytes=90_000, ecn={"profile": "step", "k_bytes": 30_000}),
    QueueSpec(ecn={"profile": "red", "kmin_bytes": 5_000, "kmax_bytes": 60_000, "pmax": 0.01},
              buffer_bytes=120_000, classes=True),
    QueueSpec(ecn={"scheme": "dctcp"}),
    QueueSpec(ecn={"scheme": "dcqcn"}, classes=True),
    QueueSpec(buffer_bytes=PFC_BUFFER_BYTES, pfc=True, ecn={"scheme": "dctcp"}),
)


def switch_plan(fabric, queue, path):
    """The switch ports' plan, or the refusal (RED cannot average a threshold under a frame
    of a jumbo MTU)."""
    try:
        return switch_queue_plan(fabric, queue, path, ifindex=fake_ifindex)
    except ConfigError as err:
        return f"refused: {err}"


def plans(fabric, queue) -> dict:
    """Everything planned from a queue on ``fabric``: the switch ports on both marking paths,
    every host's script and, with PFC, the pause agent's plan."""
    out = {path: switch_plan(fabric, queue, path) for path in PATHS}
    out["hosts"] = [host_script(fabric, h.name, queue=queue) for h in fabric.hosts]
    if queue.pfc is not None:
        out["agent"] = agent_plan(fabric, queue, POLL_S).to_json()
    return out


def bundled_fabrics() -> list:
    """(scenario, setup, fabric, rate, MTU) of every bundled scenario's setups."""
    out = []
    for path in sorted(Path(SCENARIO_DIR).glob("*.yaml")):
        resolved = load(path)
        experiment = resolved.experiment
        for setup in resolved.setups:
            out.append((path.stem, setup.name, setup.fabric, experiment.rate_mbit,
                        experiment.mtu_bytes))
    return out


@pytest.fixture(scope="module")
def bundled():
    return bundled_fabrics()


def test_every_bundled_setup_of_one_rate_gets_the_plans_it_had(bundled):
    """On every bundled scenario's fabrics whose links all run at the scenario's rate (nearly
    all), each kind of queue section plans the same queue, record, ports, hosts and pause
    agent as one queue sized for that rate did; on the rest (NVLinks), the ports at the
    scenario's rate keep their plans."""
    seen: set[int] = set()
    single_rate = several = 0
    for name, setup, fabric, rate, mtu in bundled:
        if id(fabric) in seen:
            continue
        seen.add(id(fabric))
        rates = {link.rate_mbit for link in fabric.links if link.rate_mbit is not None}
        for spec in SECTIONS:
            where = f"{name}/{setup}: {spec}"
            try:
                before, before_record = single_queue_plan(spec, rate, mtu, fabric)
            except ConfigError:
                with pytest.raises(ConfigError):
                    queue_plan(spec, rate, mtu, fabric)
                continue
            if rates <= {rate}:
                single_rate += 1
                after, after_record = queue_plan(spec, rate, mtu, fabric)
                assert (after, after_record) == (before, before_record), where
                assert plans(fabric, after) == plans(fabric, before), where
                continue
            try:
                after, after_record = queue_plan(spec, rate, mtu, fabric)
            except ConfigError:
                continue  # PFC's headroom at an NVLink's rate overflows an explicit buffer
            several += 1
            assert replace(after, rate_mbit=None, other_rates=()) == before, where
            assert {k: v for k, v in after_record.items() if k != "rates"} == before_record
            for path in PATHS:
                now, then = (switch_plan(fabric, q, path) for q in (after, before))
                if isinstance(then, str):
                    continue
                for intf in switch_ends_at(fabric, rate):
                    assert port_lines(now, intf) == port_lines(then, intf), where
    assert single_rate and several  # both kinds of fabric were compared
