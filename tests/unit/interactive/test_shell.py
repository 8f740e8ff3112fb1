"""``testbed cli`` and what it runs through (testbed.interactive.shell, testbed.interactive.attach):
lines parsed into commands, host names turned into IPs, the prompt fed from a pipe against a
stand-in fabric, and the pure answers (pingall, links, net, the OpenFlow tables, the argv
that enters a host). Expected listings are written out by hand from the fabric below."""
from __future__ import annotations

import io
import subprocess

import pytest

from testbed.interactive.attach import (
    exec_argv,
    flow_lines,
    group_lines,
    link_lines,
    net_lines,
    ping_report,
)
from testbed.interactive.shell import (
    DEFAULT_IPERF_S,
    Command,
    CommandError,
    FabricShell,
    parse_command,
    substitute_hosts,
)
from testbed.model.topology.explicit import explicit
from testbed.model.topology.fattree import fat_tree

IPS = {"h1": "10.0.0.1", "h2": "10.0.0.2", "h3": "10.0.0.3"}
SWITCHES = ["s1", "s2"]

GROUPS = """OFPST_GROUP_DESC reply (OF1.3) (xid=0x2):
 group_id=1,type=select,bucket=weight:1,actions=output:3,bucket=weight:1,actions=output:4
 group_id=2,type=select,bucket=weight:1,actions=output:4
"""
FLOWS = """OFPST_FLOW reply (OF1.3) (xid=0x2):
 cookie=0x0, duration=12.345s, table=0, n_packets=10, n_bytes=980, priority=100,ip,nw_dst=10.0.0.2 actions=output:1
 cookie=0x0, duration=12.345s, table=0, n_packets=0, n_bytes=0, priority=0 actions=drop
"""  # noqa: E501 (as OVS prints it)


def small_fabric():
    """h1 - s1 - s2 - h2, and h3 on s2."""
    return explicit([{"name": "h1", "role": "host"}, {"name": "h2", "role": "host"},
                     {"name": "h3", "role": "host"}, {"name": "s1"}, {"name": "s2"}],
                    [["h1", "s1"], ["s1", "s2"], ["s2", "h2"], ["s2", "h3"]], 10.0, 1500)


# --- parsing ---------------------------------------------------------------------------------


def parse(line: str) -> Command:
    return parse_command(line, IPS, SWITCHES)


def test_host_names_become_their_ips_and_nothing_else_changes():
    assert substitute_hosts(["ping", "-c1", "h2", "h22", "xh1"], IPS) == [
        "ping", "-c1", "10.0.0.2", "h22", "xh1"]


@pytest.mark.parametrize("line, command", [
    ("h1 ping -c1 h2", Command("host", ("h1",), ("ping", "-c1", "10.0.0.2"))),
    ("h1 sh -c 'ping -c1 h2 | tail -1'", Command("host", ("h1",),
                                                  ("sh", "-c", "ping -c1 h2 | tail -1"))),
    ("", Command("empty")), ("   ", Command("empty")),
    ("pingall", Command("pingall")), ("nodes", Command("nodes")), ("links", Command("links")),
    ("net", Command("net")),
    ("iperf h1 h3", Command("iperf", ("h1", "h3", str(DEFAULT_IPERF_S)))),
    ("iperf h1 h3 10", Command("iperf", ("h1", "h3", "10"))),
    ("dump-flows s1", Command("dump-flows", ("s1",))),
    ("dump-groups s2", Command("dump-groups", ("s2",))),
    ("link down s1 s2", Command("link", ("s1", "s2", "down"))),
    ("link s2 h2 up", Command("link", ("s2", "h2", "up"))),  # as Mininet writes it
    ("exit", Command("exit")), ("quit", Command("exit")), ("EOF", Command("exit")),
    ("help", Command("help")), ("help iperf", Command("help", ("iperf",))),
])
def test_lines_parse_into_commands(line, command):
    assert parse(line) == command


@pytest.mark.parametrize("line, message", [
    ("h1", "what should h1 run?"),
    ("h4 ping h1", "unknown command or host 'h4'"),
    ("pingall h1", "usage: pingall"),
    ("iperf h1", "usage: iperf A B [SECONDS]"),
    ("iperf h1 s1", "no host 's1'"),
    ("iperf h1 h2 0", "iperf seconds: a whole number from 1 to 3600, got '0'"),
    ("iperf h1 h2 fast", "got 'fast'"),
    ("dump-flows h1", "no switch 'h1'; switches: s1, s2"),
    ("dump-groups", "usage: dump-groups SWITCH"),
    ("link down s1", "usage: link down|up A B"),
    ("link sideways s1 s2", "usage: link down|up A B"),
    ("link down s1 s9", "no node 's9'"),
    ("h1 echo 'unbalanced", "cannot split the line"),
])
def test_bad_lines_say_what_is_wrong(line, message):
    with pytest.raises(CommandError) as info:
        parse(line)
    assert message in str(info.value)


# --- the prompt, fed from a pipe, against a stand-in fabric ------------------------------------


class StandInAttached:
    """What FabricShell uses of testbed.interactive.attach.Attached, recording every call."""

    def __init__(self):
        self.fabric = small_fabric()
        self.ips = {h.name: h.ip for h in self.fabric.hosts}
        self.host_names = [h.name for h in self.fabric.hosts]
        self.switch_names = [s.name for s in self.fabric.switches]
        self.calls: list[tuple] = []

    def run(self, host, argv, **kwargs):
        self.calls.append(("run", host, argv, kwargs.get("stdin")))
        code = 1 if argv[0] == "false" else 0
        return subprocess.CompletedProcess(argv, code, f"{host}: {' '.join(argv)}\n", "")

    def reachability(self):
        self.calls.append(("pingall",))
        return ping_report(self.host_names, self.ips, {"h1": {self.ips["h2"]}})

    def iperf(self, client, server, seconds):
        self.calls.append(("iperf", client, server, seconds))
        return 9.5

    def set_link(self, a, b, up):
        self.calls.append(("link", a, b, up))

    def links(self):
        return link_lines(self.fabric, lambda intf: "up")

    def dump_groups(self, switch):
        return GROUPS

    def dump_flows(self, switch):
        return FLOWS


def run_prompt(text: str) -> tuple[StandInAttached, FabricShell, str]:
    fabric, out = StandInAttached(), io.StringIO()
    shell = FabricShell(fabric, stdin=io.StringIO(text), stdout=out)
    shell.loop()
    return fabric, shell, out.getvalue()


def test_a_piped_session_runs_each_line_and_reads_as_a_transcript():
    fabric, shell, out = run_prompt("h1 ping -c1 h2\nlink down s1 s2\niperf h1 h3 2\n"
                                    "link up s1 s2\ndump-groups s2\nexit\nh1 never-run\n")
    assert fabric.calls == [
        ("run", "h1", ["ping", "-c1", fabric.ips["h2"]], subprocess.DEVNULL),
        ("link", "s1", "s2", False), ("iperf", "h1", "h3", 2), ("link", "s1", "s2", True)]
    assert out.splitlines() == [
        "testbed> h1 ping -c1 h2", f"h1: ping -c1 {fabric.ips['h2']}",
        "testbed> link down s1 s2", "*** link s1-s2 down",
        "testbed> iperf h1 h3 2", "*** iperf3 h1 -> h3: 9.50 Mbit/s received",
        "testbed> link up s1 s2", "*** link s1-s2 up",
        "testbed> dump-groups s2", "s2: 2 groups",
        "  group 1 select: weight:1,actions=output:3 | weight:1,actions=output:4",
        "  group 2 select: weight:1,actions=output:4",
        "testbed> exit"]
    assert shell.failures == 0


def test_failures_are_counted_and_the_prompt_goes_on_to_the_end_of_input():
    fabric, shell, out = run_prompt("h1 false\nh9 ls\npingall\nnodes\n")
    assert "*** h1: false exited with status 1" in out
    assert "*** unknown command or host 'h9'" in out
    assert "*** Results: 83% dropped (1/6 received)" in out  # only h1 -> h2 answered
    assert "hosts: h1 h2 h3" in out and "switches: s1 s2" in out  # after the failures
    assert shell.failures == 3


def test_an_error_of_the_fabric_is_a_failed_command_not_the_end(monkeypatch):
    from testbed.errors import TestbedError

    def refuse(self, a, b, up):
        raise TestbedError(f"{a} and {b} are not cabled together")

    monkeypatch.setattr(StandInAttached, "set_link", refuse)
    _, shell, out = run_prompt("link down h1 h2\nlinks\n")
    assert "*** h1 and h2 are not cabled together" in out
    assert "h1-eth0<->s1-eth1 (up)" in out and shell.failures == 1


def test_a_command_that_cannot_start_is_a_failed_command(monkeypatch):
    def cannot_start(self, host, argv, **kwargs):
        raise FileNotFoundError(2, "No such file or directory", "mnexec")

    monkeypatch.setattr(StandInAttached, "run", cannot_start)
    _, shell, out = run_prompt("h1 ls\nnodes\n")
    assert "*** [Errno 2] No such file or directory: 'mnexec'" in out
    assert "hosts: h1 h2 h3" in out and shell.failures == 1


def test_help_lists_every_command():
    _, _, out = run_prompt("help\n")
    for word in ("HOST CMD", "pingall", "iperf A B", "nodes", "links", "net",
                 "dump-flows SWITCH", "dump-groups SWITCH", "link down|up A B", "exit"):
        assert word in out


def test_completion_offers_commands_and_node_names():
    shell = FabricShell(StandInAttached(), stdin=io.StringIO(), stdout=io.StringIO())
    assert shell.completenames("h") == ["h1", "h2", "h3", "help"]
    assert shell.completenames("dump") == ["dump-flows", "dump-groups"]
    assert shell.completedefault("s") == ["s1", "s2"]


# --- the pure answers ------------------------------------------------------------------------


def test_the_command_enters_the_hosts_namespaces_by_its_shells_pid():
    assert exec_argv(4242, ["ping", "-c1", "10.0.0.2"]) == [
        "mnexec", "-a", "4242", "ping", "-c1", "10.0.0.2"]
    with pytest.raises(Exception, match="no command given"):
        exec_argv(4242, [])


def test_pingall_answers_as_mininet_does():
    lines, sent, received = ping_report(["h1", "h2", "h3"], IPS, {
        "h1": {"10.0.0.2", "10.0.0.3"}, "h2": {"10.0.0.1"}, "h3": set()})
    assert lines == ["*** Ping: testing ping reachability", "h1 -> h2 h3", "h2 -> h1 X",
                     "h3 -> X X", "*** Results: 50% dropped (3/6 received)"]
    assert (sent, received) == (6, 3)


def test_links_say_which_root_namespace_end_is_down():
    fabric = small_fabric()
    down = {"s1-eth2"}  # s1's end of s1-s2, as `link down s1 s2` leaves it with s2-eth1
    lines = link_lines(fabric, lambda intf: "down" if intf in down else "up")
    assert lines == ["h1-eth0<->s1-eth1 (up)", "s1-eth2<->s2-eth1 (DOWN: s1-eth2)",
                     "s2-eth2<->h2-eth0 (up)", "s2-eth3<->h3-eth0 (up)"]


def test_net_lists_each_nodes_interfaces_and_their_peers():
    assert net_lines(small_fabric()) == [
        "h1 h1-eth0:s1-eth1", "h2 h2-eth0:s2-eth2", "h3 h3-eth0:s2-eth3",
        "s1 s1-eth1:h1-eth0 s1-eth2:s2-eth1", "s2 s2-eth1:s1-eth2 s2-eth2:h2-eth0 "
        "s2-eth3:h3-eth0"]


def test_net_covers_every_link_end_of_a_fat_tree():
    lines = net_lines(fat_tree(4, host_rate_mbit=6.0))
    assert len(lines) == 36 and sum(len(line.split()) - 1 for line in lines) == 2 * 48


def test_tables_are_listed_from_ovs_output():
    assert flow_lines("s1", FLOWS) == [
        "s1: 2 flows",
        "  table 0 priority 100 packets 10 bytes 980  ip,nw_dst=10.0.0.2  actions=output:1",
        "  table 0 priority 0 packets 0 bytes 0  *  actions=drop"]
    assert group_lines("s1", "") == ["s1: 0 groups"]


def test_an_attached_fabric_offers_every_member_the_flow_driver_uses():
    """`testbed cli`'s iperf and the API's iperf hand an Attached fabric to
    testbed.drive.flows.run_flows: every ``net.<member>`` the driver reads must be there."""
    import re
    from dataclasses import fields
    from pathlib import Path

    import testbed.drive.flows as flows
    from testbed.interactive.attach import Attached

    used = set(re.findall(r"\bnet\.(\w+)", Path(flows.__file__).read_text()))
    offered = {f.name for f in fields(Attached)} | set(dir(Attached))
    assert used and used <= offered, used - offered
