"""Hosts answer as Mininet hosts: each host's eth0, made over netlink and configured by its
set-up script, is registered as its mininet Intf without a command run or a move, and then
Mininet's own Host methods and reachability helpers work on it. The hosts here are real
mininet.node.Host objects without a shell (tests/unit/stand_ins.py), so every command Mininet
would send is seen."""
from __future__ import annotations

import pytest
from tests.unit.stand_ins import shell_less_host

from testbed.api import MininetView
from testbed.apply.network import (
    HOST_PREFIX_LEN,
    FabricNetwork,
    host_script,
    register_host_interface,
)
from testbed.model.topology.fattree import fat_tree

PING_ANSWERED = ("1 packets transmitted, 1 received, 0% packet loss, time 0ms\n"
                 "rtt min/avg/max/mdev = 0.1/0.1/0.1/0.0 ms\n")
PING_LOST = "1 packets transmitted, 0 received, 100% packet loss, time 0ms\n"


def test_a_registered_interface_answers_mininets_questions_without_a_command():
    host = shell_less_host("h1")
    assert host.defaultIntf() is None  # what Mininet says of a host it made no Intf for
    intf = register_host_interface(host, "h1-eth0", "10.0.0.2", "02:00:0a:00:00:02")
    assert host.IP() == "10.0.0.2" and host.MAC() == "02:00:0a:00:00:02"
    assert host.defaultIntf() is intf and host.intf("h1-eth0") is intf
    assert host.intfNames() == ["h1-eth0"] and host.intfList() == [intf]
    assert (intf.name, intf.node, intf.prefixLen, intf.link) == ("h1-eth0", host, 8, None)
    assert host.ports[intf] == 0  # eth0 is port 0, as Mininet numbers a host's first port
    assert "h1-eth0:10.0.0.2" in repr(host)
    assert host.commands == []  # nothing created, moved, addressed or brought up again


def test_registration_keeps_the_prefix_the_set_up_script_gave():
    fabric = fat_tree(4, host_rate_mbit=6.0)
    node = fabric.hosts[0]
    assert f"addr add {node.ip}/{HOST_PREFIX_LEN} dev {node.name}-eth0" in host_script(
        fabric, node.name)


def test_the_network_registers_every_hosts_own_end_of_its_link(tmp_path):
    fabric = fat_tree(4, host_rate_mbit=6.0)
    net = FabricNetwork(fabric, tmp_path, ledger=None)
    net.hosts = {h.name: shell_less_host(h.name) for h in fabric.hosts}
    net._register_host_interfaces()
    for node in fabric.hosts:
        host = net.host(node.name)
        link, end = fabric.host_link(node.name)
        assert host.intfNames() == [link.intf(end)] == [f"{node.name}-eth0"]
        assert (host.IP(), host.MAC()) == (node.ip, node.mac)
        assert host.commands == []
    assert len({net.host(n.name).IP() for n in fabric.hosts}) == len(fabric.hosts) == 16


@pytest.mark.parametrize("answers, loss_percent", [
    ({"ping": PING_ANSWERED}, 0.0),
    ({"10.0.0.3": PING_LOST, "ping": PING_ANSWERED}, 100 * 2 / 6),  # h3 unreachable
])
def test_mininets_ping_runs_over_the_hosts(answers, loss_percent, capsys):
    hosts = [shell_less_host(f"h{i}", answers) for i in (1, 2, 3)]
    for i, host in enumerate(hosts, 1):
        register_host_interface(host, f"h{i}-eth0", f"10.0.0.{i}", f"02:00:00:00:00:0{i}")
    from mininet.log import setLogLevel
    from mininet.net import Mininet

    setLogLevel("output")
    loss = Mininet.ping(MininetView(hosts))
    assert loss == pytest.approx(loss_percent)
    assert hosts[0].commands == ["ping -c1  10.0.0.2", "ping -c1  10.0.0.3"]
    assert len(hosts[1].commands) == len(hosts[2].commands) == 2  # each to the 2 others


def test_the_machines_resolvers_are_unreachable_from_the_hosts():
    """Hosts read the machine's resolv.conf; a resolver inside 10.0.0.0/8 would otherwise be
    looked for by ARP on the fabric, where no one answers and the switches drop the request."""
    from testbed.apply.network import machine_resolvers

    conf = ("# generated\nnameserver 10.255.255.53\nnameserver fe80::1\nnameserver bogus\n"
            "search example\nnameserver 192.0.2.1 # second\n")
    assert machine_resolvers(conf) == ["10.255.255.53", "192.0.2.1"]
    fabric = fat_tree(4, host_rate_mbit=6.0)
    host = fabric.hosts[0]
    script = host_script(fabric, host.name, unreachable_ips=["10.255.255.53", fabric.hosts[1].ip])
    assert "route add unreachable 10.255.255.53/32" in script
    assert f"unreachable {fabric.hosts[1].ip}/" not in script  # never a fabric host
    assert "unreachable" not in host_script(fabric, host.name)
