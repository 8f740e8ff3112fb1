"""The command lists and parsers the fabric layer applies: buffers, qdiscs, host set-up."""
from __future__ import annotations

import json

import pytest

from testbed.apply.network import (
    BUFFER_HANDLE,
    OFFLOADS_OFF,
    default_buffer_bytes,
    host_script,
    ovs_transaction,
    qdisc_drops,
    shaping_commands,
    switch_tc_batch,
)
from testbed.capacity.bench import mininet_topo
from testbed.model.topology.fattree import fat_tree

BUFFER_TIME_S = 0.050  # the documented 50 ms of buffering at the link rate
MIN_FRAMES = 8         # and never fewer than 8 full frames


@pytest.mark.parametrize(("rate_mbit", "mtu_bytes", "expected"), [
    (1000.0, 9000, 6_250_000),  # 1 Gbit/s * 50 ms = 6.25 MB
    (100.0, 1500, 625_000),
    (6.0, 9000, 72_000),        # 37 500 B of 50 ms is under 8 jumbo frames
    (6.0, 1500, 37_500),
    (1.0, 1500, 12_000),        # 6 250 B is under 8 frames of 1500
])
def test_default_buffer_bytes(rate_mbit, mtu_bytes, expected):
    assert default_buffer_bytes(rate_mbit, mtu_bytes) == expected
    assert isinstance(default_buffer_bytes(rate_mbit, mtu_bytes), int)


@pytest.mark.parametrize("rate_mbit", [0.5, 3.0, 10.0, 250.0, 10_000.0])
@pytest.mark.parametrize("mtu_bytes", [1500, 9000])
def test_default_buffer_bytes_is_the_larger_of_time_and_frames(rate_mbit, mtu_bytes):
    by_time = int(rate_mbit * 1e6 / 8 * BUFFER_TIME_S)
    assert default_buffer_bytes(rate_mbit, mtu_bytes) == max(MIN_FRAMES * mtu_bytes, by_time)


def tc_entry(kind, handle, drops, **extra) -> dict:
    return {"kind": kind, "handle": handle, "bytes": 1000, "packets": 10, "drops": drops,
            "overlimits": 0, "requeues": 0, "backlog": 0, "qlen": 0, **extra}


def test_qdisc_drops_counts_only_the_buffers():
    tc_output = json.dumps([
        # HTB root repeats the drops of the bfifo below it
        tc_entry("htb", "5:", 7, dev="p0e0-eth1", root=True, refcnt=2,
                 options={"r2q": 10, "default": "0x1"}),
        tc_entry("bfifo", "10:", 7, dev="p0e0-eth1", parent="5:1", options={"limit": 72000}),
        tc_entry("htb", "5:", 3, dev="p0e0-eth2", root=True),
        tc_entry("bfifo", "10:", 3, dev="p0e0-eth2", parent="5:1"),
        tc_entry("noqueue", "0:", 0, dev="lo", root=True),
        tc_entry("fq_codel", "0:", 11, dev="eth0", root=True),  # not a link buffer
        {"kind": "bfifo", "handle": "10:", "dev": "p0e0-eth3"},  # no statistics yet
    ])
    assert qdisc_drops(tc_output) == 10


@pytest.mark.parametrize("text", ["", "[]"])
def test_qdisc_drops_of_nothing(text):
    assert qdisc_drops(text) == 0


def test_offloads_off_pairs():
    assert OFFLOADS_OFF[1::2] == ["off"] * (len(OFFLOADS_OFF) // 2)
    assert set(OFFLOADS_OFF[::2]) == {"tx", "rx", "tso", "gso", "gro"}


def test_mininet_topo_carries_names_ports_dpids_addresses_and_rates():
    fabric = fat_tree(2, host_rate_mbit=6.0, fabric_rate_mbit=12.0)
    topo = mininet_topo(fabric)
    assert sorted(topo.nodes()) == sorted(fabric.nodes)
    assert topo.nodeInfo("p0e0") == {"isSwitch": True, "dpid": "0000000100000000"}
    assert topo.nodeInfo("p1e0h0") == {"ip": "10.1.0.2/8", "mac": "02:00:0a:01:00:02"}
    links = topo.links(withKeys=True, withInfo=True)
    assert len(links) == len(fabric.links)
    infos = {(info["node1"], info["node2"]): info for _, _, _, info in links}
    assert infos[("p0e0h0", "p0e0")]["port1"] == 0 and infos[("p0e0h0", "p0e0")]["port2"] == 1
    assert infos[("p0e0h0", "p0e0")]["bw"] == 6.0
    assert infos[("p1a0", "c0")] == {"node1": "p1a0", "node2": "c0", "port1": 2, "port2": 2,
                                     "bw": 12.0}


def test_shaping_commands_give_an_htb_rate_and_a_byte_buffer():
    cmds = shaping_commands("s1-eth1", 6.0, 9000)
    assert cmds[0] == "qdisc replace dev s1-eth1 root handle 5: htb default 1"
    assert "rate 6.0mbit" in cmds[1] and "quantum 9064" in cmds[1]
    assert cmds[2].endswith(f"handle {BUFFER_HANDLE} bfifo limit {default_buffer_bytes(6.0, 9000)}")
    assert shaping_commands("s1-eth1", None, 9000) == []


def test_switch_tc_batch_shapes_every_switch_end_and_no_host_end():
    fabric = fat_tree(4, host_rate_mbit=6.0)
    batch = switch_tc_batch(fabric).splitlines()
    switch_ends = [link.intf(end) for link in fabric.links for end, node in
                   ((0, link.a), (1, link.b)) if not fabric.nodes[node].is_host]
    assert len(batch) == 3 * len(switch_ends)
    assert {line.split()[3] for line in batch} == set(switch_ends)


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
