"""Miswiring on real OVS: the controller checks the cabling against the description the
fabric was built from, with LLDP (testbed.controllers.apps.lldp_app). An intact fabric is all ok and its
switches catch the LLDP frames with the rule that keeps them from the fabric's forwarding;
two uplinks swapped between leaves (interfaces moved between bridges of the run's own OVS)
are flagged, the two moved ports and their two far ends, and nothing else; cabled back, the
fabric is all ok again."""
from __future__ import annotations

import re
import subprocess
import time

from testbed.apply.network import FabricNetwork
from testbed.controllers.routing.forwarding import PRIORITY_LLDP
from testbed.controllers.routing.wiring import (
    MISWIRED,
    OK,
    expected_neighbours,
    wiring_checks,
)
from testbed.measure.failover import ping_received
from testbed.model.records import read_json_lines
from testbed.model.topology.base import intf_name
from testbed.model.topology.spineleaf import spine_leaf

# A check is judged once the fabric has been quiet for 2.5 s (testbed.controllers.routing.wiring); bring-up
# and re-cabling settle well within this.
CHECK_TIMEOUT_S = 30.0
# l0's uplink to s0 and l1's uplink to s1 (leaf i: port 1 its host, 2 + j spine j).
ONE, OTHER = ("l0", 2), ("l1", 3)

End = tuple[str, int]


def checks_after(net: FabricNetwork, after_s: float) -> list[dict]:
    """The complete wiring checks the controller started at or after ``after_s``."""
    return [c for c in wiring_checks(read_json_lines(net.controller.wiring_path))
            if c["started_monotonic_s"] >= after_s]


def flagged(check: dict) -> dict[End, tuple[str, End | None, End | None]]:
    """(switch, port) -> (status, expected, seen) for every port of a check that is not ok."""
    def end(peer):
        return None if peer is None else (peer["node"], peer["port"])
    return {(v["switch"], v["port"]): (v["status"], end(v["expected"]), end(v["seen"]))
            for v in check["verdicts"] if v["status"] != OK}


def wait_for_check(net: FabricNetwork, after_s: float, want: dict, ports: int) -> dict:
    """The first complete check started at or after ``after_s`` that covers ``ports`` ports
    and flags exactly ``want`` (as ``flagged`` gives it); AssertionError naming the latest
    check seen if none does within CHECK_TIMEOUT_S."""
    deadline = time.monotonic() + CHECK_TIMEOUT_S
    latest = None
    while time.monotonic() < deadline:
        for check in checks_after(net, after_s):
            latest = check
            if check["ports_checked"] == ports and flagged(check) == want:
                return check
        time.sleep(0.1)
    raise AssertionError(f"no wiring check flagged exactly {want} within {CHECK_TIMEOUT_S} s; "
                         f"latest: {flagged(latest) if latest else None}")


def plug(net: FabricNetwork, plugs: dict[str, End]) -> None:
    """Move each interface to the given (switch, port): all are unplugged first, in one
    transaction, so every port number is free when it is asked for in the next. The ports
    get the linux-noop QoS every fabric port has (testbed.plan.bring_up.ovs_transaction)."""
    unplug: list[str] = []
    for intf in plugs:
        unplug += ["--", "del-port", intf]
    net.switchd.vsctl(unplug[1:])
    args = ["--id=@noop", "create", "qos", "type=linux-noop"]
    for intf, (switch, port) in plugs.items():
        args += ["--", "add-port", switch, intf, "qos=@noop",
                 "--", "set", "interface", intf, f"ofport_request={port}"]
    net.switchd.vsctl(args)
    for intf, (switch, port) in plugs.items():
        out = subprocess.run([*net.switchd.vsctl_argv(), "get", "interface", intf, "ofport"],
                             capture_output=True, text=True, check=True)
        assert int(out.stdout) == port, f"{intf} came back as port {out.stdout.strip()}"


def lldp_caught(net: FabricNetwork, bridge: str) -> int:
    """Packets the bridge's LLDP rule has sent to the controller."""
    found = re.search(rf"n_packets=(\d+),.*priority={PRIORITY_LLDP},dl_type=0x88cc "
                      r"actions=CONTROLLER", net.switchd.dump_flows(bridge))
    assert found, f"{bridge} has no LLDP rule"
    return int(found.group(1))


def test_swapped_uplinks_are_flagged_exactly_and_clear_when_cabled_back(ledger, tmp_path):
    fabric = spine_leaf(leaves=2, spines=2, hosts_per_leaf=1)
    expected = expected_neighbours(fabric)
    far_one, far_other = ((p.node, p.port) for p in (expected[ONE], expected[OTHER]))
    assert (far_one, far_other) == (("s0", 1), ("s1", 2))
    with FabricNetwork(fabric, tmp_path, ledger, log=lambda m: None) as net:
        wait_for_check(net, 0.0, {}, len(expected))
        for switch in fabric.switches:
            assert lldp_caught(net, switch.name) > 0, switch.name  # frames crossed its links
        dst = fabric.nodes["l1h0"].ip
        assert ping_received(net.host("l0h0").cmd("ping", "-c", "3", "-i", "0.1", dst)) == 3

        t_swap = time.monotonic()
        plug(net, {intf_name(*ONE): OTHER, intf_name(*OTHER): ONE})
        check = wait_for_check(net, t_swap, {
            ONE: (MISWIRED, far_one, far_other),
            OTHER: (MISWIRED, far_other, far_one),
            far_one: (MISWIRED, ONE, OTHER),
            far_other: (MISWIRED, OTHER, ONE)}, len(expected))
        assert check[OK] == len(expected) - 4
        assert "WIRING l0:2 miswired: expected s0:1, saw s1:2" in (
            tmp_path / "controller.log").read_text()

        t_back = time.monotonic()
        plug(net, {intf_name(*ONE): ONE, intf_name(*OTHER): OTHER})
        wait_for_check(net, t_back, {}, len(expected))
        assert ping_received(net.host("l0h0").cmd("ping", "-c", "3", "-i", "0.1", dst)) == 3
