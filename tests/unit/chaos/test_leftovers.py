"""What a run left, as the difference of two snapshots (testbed.chaos.leftovers), and which
command lines are the testbed's."""
from __future__ import annotations

from testbed.apply.state import STATE_DIR
from testbed.chaos.leftovers import OURS, Snapshot, count, describe, leftovers

SETTING = "/sys/kernel/rcu_expedited"


def machine(**fields) -> Snapshot:
    base = {"namespaces": frozenset({1}), "interfaces": {"lo": "", "eth0": ""},
            "processes": {(10, 100): "sshd"}, "settings": {SETTING: "0"}}
    return Snapshot(**{**base, **fields})


def test_a_machine_as_it_was_has_nothing_left():
    found = leftovers(machine(), machine())
    assert count(found) == 0 and describe(found) == "nothing"
    assert set(found) == {"namespaces", "veths", "taps", "bridges", "processes", "settings",
                          "pins", "state"}


def test_whatever_is_new_after_a_run_is_left_behind():
    after = machine(namespaces=frozenset({1, 4026532100}),
                    interfaces={"lo": "", "eth0": "", "p0e0-eth1": "veth", "ovs-netdev": "tun",
                                "p0e0": "tun", "br9": "bridge", "ifb0": "ifb"},
                    ovs_bridges=frozenset({"c0"}),
                    processes={(10, 100): "sshd", (77, 500): "mininet:p0e0h0",
                               (10, 900): "python -m testbed.traffic.collectives.allreduce"},
                    settings={SETTING: "1"}, pins=frozenset({"/sys/fs/bpf/tc/globals/loss_config"}),
                    state=frozenset({f"{STATE_DIR}/state.json"}))
    found = leftovers(machine(), after)
    assert found["namespaces"] == ["net:[4026532100]"]
    assert found["veths"] == ["p0e0-eth1 (veth)"]
    assert found["taps"] == ["ovs-netdev (tun)", "p0e0 (tun)"]
    assert found["bridges"] == ["br9 (bridge)", "c0 (Open vSwitch)"]
    # pid 10 came back as another process (other start ticks): that one is new
    assert found["processes"] == ["pid 10: python -m testbed.traffic.collectives.allreduce",
                                  "pid 77: mininet:p0e0h0"]
    assert found["settings"] == [f"{SETTING} is '1', was '0'"]
    assert found["pins"] == ["/sys/fs/bpf/tc/globals/loss_config"]
    assert found["state"] == [f"{STATE_DIR}/state.json"]
    assert count(found) == 11
    assert describe(found).startswith("1 namespaces (net:[4026532100]); 1 veths (p0e0-eth1 (veth))")


def test_what_was_there_before_the_run_is_not_the_runs():
    before = machine(interfaces={"lo": "", "eth0": "", "docker0": "bridge", "veth1": "veth"})
    after = machine(interfaces={"lo": "", "eth0": "", "docker0": "bridge", "veth1": "veth"})
    assert count(leftovers(before, after)) == 0
    gone = machine(settings={})  # a setting that vanished counts as changed
    assert leftovers(machine(), gone)["settings"] == [f"{SETTING} is None, was '0'"]


def test_the_testbeds_command_lines_are_recognised_and_the_suites_own_is_not():
    ours = ["python -m testbed.controllers.apps.launcher --port 6653",
            "python -m testbed.traffic.collectives.allreduce --rank 3",
            "python -m testbed.apply.pfc_agent plan.json /r", "mnexec -cd bash",
            "bash --norc -is mininet:p0e0h0", "iperf3 -s -p 5201",
            f"ovs-vswitchd unix:{STATE_DIR}/ovs/db.sock",
            "python -m testbed.apply.ecn_anchor plan.json /r"]
    assert all(OURS.search(cmd) for cmd in ours)
    assert not any(OURS.search(cmd) for cmd in (
        "python -m testbed chaos --profile ci", "python -m testbed run x.yaml", "sshd: root",
        "/usr/sbin/ovs-vswitchd unix:/var/run/openvswitch/db.sock"))
