"""The plans the fabric layer applies (testbed.plan.bring_up): the hosts' set-up scripts, the
OVS transaction. (Each port's queue: test_port_queue.py.)"""
from __future__ import annotations

import pytest

from testbed.model.topology.fattree import fat_tree
from testbed.plan.bring_up import (
    OFFLOADS_OFF,
    host_script,
    link_ends,
    machine_resolvers,
    ovs_transaction,
)
from testbed.plan.port_queue import Impairment, default_buffer_bytes, port_plan
from testbed.plan.profiles import QueueConfig, StepEcn

BUFFER_TIME_S = 0.050  # the documented 50 ms of buffering at the link rate
MIN_FRAMES = 8         # and never fewer than 8 full frames


@pytest.mark.parametrize("rate_mbit", [0.5, 3.0, 10.0, 250.0, 10_000.0])
@pytest.mark.parametrize("mtu_bytes", [1500, 9000])
def test_default_buffer_bytes_is_the_larger_of_time_and_frames(rate_mbit, mtu_bytes):
    by_time = int(rate_mbit * 1e6 / 8 * BUFFER_TIME_S)
    assert default_buffer_bytes(rate_mbit, mtu_bytes) == max(MIN_FRAMES * mtu_bytes, by_time)


def test_offloads_off_pairs():
    assert OFFLOADS_OFF[1::2] == ["off"] * (len(OFFLOADS_OFF) // 2)
    assert set(OFFLOADS_OFF[::2]) == {"tx", "rx", "tso", "gso", "gro"}


def test_host_script_configures_the_hosts_own_interface():
    fabric = fat_tree(4, host_rate_mbit=6.0)
    script = host_script(fabric, "p1e0h1")
    lines = script.splitlines()
    assert "addr add 10.1.0.3/8 dev p1e0h1-eth0" in lines
    assert "link set dev p1e0h1-eth0 address 02:00:0a:01:00:03 mtu 9000" in lines
    assert "qdisc replace dev p1e0h1-eth0 root handle 5: htb default 1" in lines
    assert sum(line.startswith(("ip ", "tc ", "ethtool ")) for line in lines) == 3  # processes
    # the here-documents close: every "<<'EOF'" has its own EOF line
    assert script.count("<<'EOF'") == lines.count("EOF") == 2
    assert sum(line.startswith("neigh replace ") for line in lines) == len(fabric.hosts) - 1
    assert "p1e0-eth" not in script  # never touches the switch side
    assert "gso_max_size" not in script and "ethtool -K p1e0h1-eth0" in script


def test_with_offloads_on_a_hosts_gso_packets_are_a_millisecond_of_its_link():
    fast = fat_tree(4, host_rate_mbit=200.0)  # a millisecond is 25000 bytes
    lines = host_script(fast, "p1e0h1", offloads_on=True).splitlines()
    assert "link set dev p1e0h1-eth0 gso_max_size 25000" in lines
    assert not any(line.startswith("ethtool") for line in lines)
    slow = host_script(fat_tree(4, host_rate_mbit=6.0), "p1e0h1", offloads_on=True)
    assert "gso_max_size 18028" in slow  # 750 bytes a millisecond: two frames at least


def test_a_hosts_nic_gets_its_ports_plan_with_its_impairment_and_no_marking():
    fabric = fat_tree(4, host_rate_mbit=6.0)
    slow = Impairment(delay_ms=5)
    queue = QueueConfig(90_000, StepEcn(30_000))  # no classes: the host keeps its default
    script = host_script(fabric, "p1e0h1", queue=queue,
                         impairments={"p1e0h1-eth0": slow, "p1e0-eth2": slow})
    lines = script.splitlines()
    tc = lines[lines.index("tc -batch - <<'EOF'") + 1:-1]
    assert tc == port_plan("p1e0h1-eth0", 6.0, 9000, impairment=slow).tc
    assert tc[0].startswith("qdisc replace dev p1e0h1-eth0 root handle 1: netem")
    assert host_script(fabric, "p1e0h1", queue=queue) == host_script(fabric, "p1e0h1")


def test_ovs_transaction_creates_each_bridge_once_with_numbered_ports():
    fabric = fat_tree(4, host_rate_mbit=6.0)
    args = ovs_transaction(fabric, "netdev", 6653)
    assert args[0] != "--"
    assert args.count("add-br") == len(fabric.switches)
    assert args.count("add-port") == sum(1 for _ in fabric.links for _ in (0, 1)) - len(fabric.hosts)
    i = args.index("p0e0-eth3")  # edge port 3 is its first uplink
    assert args[i + 1:i + 7] == ["qos=@noop", "--", "set", "interface", "p0e0-eth3",
                                 "ofport_request=3"]
    # one shared linux-noop QoS, so OVS leaves the ports' qdiscs (the shaping) alone
    assert args[:4] == ["--id=@noop", "create", "qos", "type=linux-noop"]
    assert args.count("qos=@noop") == args.count("add-port")
    assert "tcp:127.0.0.1:6653" in args and "fail_mode=secure" in args
    assert "other-config:datapath-id=0000000100000000" in args


def test_the_machines_resolvers_are_unreachable_from_the_hosts():
    """Hosts read the machine's resolv.conf; a resolver inside 10.0.0.0/8 would otherwise be
    looked for by ARP on the fabric, where no one answers and the switches drop the request."""
    conf = ("# generated\nnameserver 10.255.255.53\nnameserver fe80::1\nnameserver bogus\n"
            "search example\nnameserver 192.0.2.1 # second\n")
    assert machine_resolvers(conf) == ["10.255.255.53", "192.0.2.1"]
    fabric = fat_tree(4, host_rate_mbit=6.0)
    host = fabric.hosts[0]
    script = host_script(fabric, host.name, unreachable_ips=["10.255.255.53", fabric.hosts[1].ip])
    assert "route add unreachable 10.255.255.53/32" in script
    assert f"unreachable {fabric.hosts[1].ip}/" not in script  # never a fabric host
    assert "unreachable" not in host_script(fabric, host.name)


def test_a_links_ends_say_which_namespace_holds_each():
    fabric = fat_tree(4, host_rate_mbit=6.0)
    assert link_ends(fabric, "p0e0h0", "p0e0") == [("p0e0h0-eth0", "p0e0h0", 6.0),
                                                   ("p0e0-eth1", None, 6.0)]
    assert [host for _, host, _ in link_ends(fabric, "p0a0", "p0e0")] == [None, None]
