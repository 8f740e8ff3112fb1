"""The controller process end to end against scripted switches on loopback TCP (no OVS, no
namespaces, no root): it programs every switch with its table, reroutes a cut link with
exactly the planned update messages and logs the event once the switches confirm, writes the
port counters it polls, and under UGAL rewrites source groups when a global link is busy."""
from __future__ import annotations

import socket
import time

import pytest
from tests.integration.openflow_switch import ScriptedSwitch, wait_for
from os_ken.ofproto import ofproto_v1_3 as ofp

from testbed.apply.controller import ControllerProcess
from testbed.controllers.routing.fabric_state import FabricState
from testbed.controllers.routing.forwarding import Barrier, Wipe
from testbed.measure.openflow import reaction_times
from testbed.model.records import port_samples, read_json_lines
from testbed.model.topology import build
from testbed.model.topology.spineleaf import spine_leaf

PROGRAMMED_TIMEOUT_S = 30.0
EVENT_TIMEOUT_S = 10.0
STATS_INTERVAL_S = 0.2
UGAL_LOAD = 0.8  # of the link rate, on one global link


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def connect_all(fabric, port: int, tx_bytes=None) -> dict[str, ScriptedSwitch]:
    ports: dict[str, dict[int, bool]] = {s.name: {} for s in fabric.switches}
    for switch, number, _, _ in fabric.switch_ends():
        ports[switch][number] = True
    return {s.name: ScriptedSwitch(s.dpid, ports[s.name], port,
                                   **({"tx_bytes": tx_bytes(s.name)} if tx_bytes else {}))
            for s in fabric.switches}


@pytest.fixture
def controller(tmp_path):
    """Start a controller for a fabric in ``tmp_path``; stopped after the test."""
    started = []

    def start(fabric, routing: str = "ecmp") -> ControllerProcess:
        fabric.dump_json(tmp_path / "fabric.json")
        proc = ControllerProcess(tmp_path / "fabric.json", tmp_path, port=free_port(),
                                 routing=routing, port_stats_interval_s=STATS_INTERVAL_S)
        started.append(proc)
        proc.start()
        return proc

    yield start
    for proc in started:
        proc.stop()


def modification_count(plan) -> int:
    return sum(not isinstance(m, (Barrier, Wipe)) for m in plan)


def test_programs_reroutes_and_measures(controller):
    fabric = spine_leaf(leaves=2, spines=2, hosts_per_leaf=1)
    proc = controller(fabric)
    switches = connect_all(fabric, proc.port)
    try:
        proc.wait_programmed(set(switches), PROGRAMMED_TIMEOUT_S)
        expected = FabricState(fabric)
        for name, switch in switches.items():
            table = expected.tables[name]
            got = switch.modifications()  # all in before the barrier that said "programmed"
            # the wipe (flows, groups), then every group, then every flow
            assert [(r.kind, r.command) for r in got[:2]] == [("flow", ofp.OFPFC_DELETE),
                                                              ("group", ofp.OFPGC_DELETE)]
            assert sum(r.kind == "group" for r in got[2:]) == len(table.groups)
            assert sum(r.kind == "flow" for r in got[2:]) == len(table.flows)

        link = next(link for link in fabric.links
                    if {link.a, link.b} == {"l0", "s0"})
        for end in ((link.a, link.a_port), (link.b, link.b_port)):
            expected.port_status(*end, up=True)
        expected.port_status(link.a, link.a_port, up=False)
        plans = expected.refresh()
        assert plans
        t_cut = time.monotonic()
        switches[link.a].port_status(link.a_port, up=False)
        switches[link.b].port_status(link.b_port, up=False)  # the peer notices too
        events = wait_for(lambda: read_json_lines(proc.events_path), EVENT_TIMEOUT_S,
                          "the link_down event")
        (reaction,) = reaction_times(events, t_cut)
        assert reaction.link == {"a": link.a, "a_port": link.a_port, "b": link.b,
                                 "b_port": link.b_port}
        assert reaction.switches_updated == len(plans)
        assert 0 <= reaction.detected_s <= reaction.applied_s < EVENT_TIMEOUT_S
        for name, switch in switches.items():
            sent = switch.modifications(since_s=t_cut)
            assert len(sent) == modification_count(plans.get(name, [])), name

        switches[link.a].port_status(link.a_port, up=True)
        switches[link.b].port_status(link.b_port, up=True)
        events = wait_for(lambda: [e for e in read_json_lines(proc.events_path)
                                   if e["event"] == "link_up"], EVENT_TIMEOUT_S, "link_up")
        assert events[0]["switches_updated"] == len(plans)

        # a switch that disconnects is routed around, and reprogrammed when it is back
        for end in ((link.a, link.a_port), (link.b, link.b_port)):
            expected.port_status(*end, up=True)
        expected.refresh()
        expected.switch_status("s1", up=False)
        plans = expected.refresh()
        switches["s1"].close()
        events = wait_for(lambda: [e for e in read_json_lines(proc.events_path)
                                   if e["event"] == "switch_down"], EVENT_TIMEOUT_S,
                          "switch_down")
        # every switch whose table changes, except the one that is gone
        assert (events[0]["switch"], events[0]["switches_updated"]) == (
            "s1", len(set(plans) - {"s1"}))
        t_back = time.monotonic()
        switches["s1"] = ScriptedSwitch(fabric.nodes["s1"].dpid, dict(switches["s1"].ports),
                                        proc.port)
        wait_for(lambda: [e for e in read_json_lines(proc.events_path)
                          if e["event"] == "switch_up"], EVENT_TIMEOUT_S, "switch_up")
        table = FabricState(fabric).tables["s1"]
        got = switches["s1"].modifications(since_s=t_back)
        assert len(got) == 2 + len(table.groups) + len(table.flows)  # wipe, then all of it

        samples = wait_for(lambda: [s for s in port_samples(read_json_lines(
            proc.port_stats_path)) if s.switch == "l0"], EVENT_TIMEOUT_S, "port counters")
        assert {s.port for s in samples} == set(switches["l0"].ports)
    finally:
        for switch in switches.values():
            switch.close()


def test_ugal_rewrites_source_groups_off_a_busy_global_link(controller):
    fabric = build("dragonfly", p=1, a=2, h=1)
    busy = next(link for link in fabric.links if link.a == "g0r0" and link.b[:2] != "g0"
                and not fabric.nodes[link.b].is_host)
    t0 = time.monotonic()

    def tx_bytes(switch: str):
        def counter(port: int) -> int:
            if (switch, port) != (busy.a, busy.a_port):
                return 0
            return int(UGAL_LOAD * busy.rate_mbit * 1e6 / 8 * (time.monotonic() - t0))
        return counter

    proc = controller(fabric, routing="ugal")
    switches = connect_all(fabric, proc.port, tx_bytes)
    try:
        proc.wait_programmed(set(switches), PROGRAMMED_TIMEOUT_S)
        t_programmed = time.monotonic()
        rewritten = wait_for(
            lambda: [r for r in switches["g0r0"].modifications(since_s=t_programmed)
                     if r.kind == "group" and r.command == ofp.OFPGC_MODIFY],
            EVENT_TIMEOUT_S, "a UGAL group modification at g0r0")
        group = fabric.nodes[busy.b].coords[0]
        assert {r.group_id for r in rewritten} == {group + 1}  # its source group toward there
    finally:
        for switch in switches.values():
            switch.close()
