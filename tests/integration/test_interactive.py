"""A fabric kept up and used: ``testbed up`` leaves the fat-tree running in its holder,
``status`` shows it, ``exec`` runs commands in a host (their exit status passed through),
``cli`` takes commands from a pipe (pingall, dump-groups, a cable cut and restored), a second
``up`` is refused, and ``testbed down`` leaves nothing behind. A holder killed outright is
recovered by ``testbed clean``. The Python API: its example script runs, and Mininet's host
idioms answer on a fabric brought up in this process."""
from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import time

import pytest
from tests.integration.conftest import (
    REPO,
    UP_TIMEOUT_S,
    assert_clean,
    kept_up,
    leftovers,
    run_testbed,
)

import testbed.api
from testbed.apply.controller import EVENTS_FILE
from testbed.controllers.routing.fabric_state import FabricState
from testbed.interactive.attach import SessionState
from testbed.interactive.session import signal_holder, wait_gone
from testbed.measure.failover import ping_received, wait_for_event
from testbed.model.topology.fattree import fat_tree

SCENARIO = "fattree-allreduce"
A, B = "p0e0h0", "p3e1h1"              # hosts in different pods: their traffic crosses a core
CUT = ("p0e0", "p0a0")                 # A's edge switch's first uplink (p0e0-eth3, p0a0-eth1)
CUT_ENDS = "p0e0-eth3<->p0a0-eth1"
HOLDER_EXIT_S = 30


def expected_groups(switch: str) -> int:
    """Select groups the controller computes for ``switch`` on the scenario's fabric."""
    return len(FabricState(fat_tree(4, host_rate_mbit=6.0), "ecmp").tables[switch].groups)


@pytest.fixture
def fabric_up(tmp_path):
    """``testbed up`` of the scenario; the published state. Down (or cleaned) at the end,
    whatever the test did."""
    with kept_up(SCENARIO, tmp_path) as (stdout, state):
        assert "fabric up: run" in stdout and f"testbed exec {A} --" in stdout
        yield state


def test_up_status_exec_cli_and_down_leave_nothing(fabric_up):
    state = fabric_up
    status = run_testbed("status")
    assert status.returncode == 0 and f"fabric up: run {state.run_id}" in status.stdout
    assert "16 hosts (16 shells alive), 20 switches, 48 links" in status.stdout
    shown = json.loads(run_testbed("status", "--json").stdout)
    assert shown["holder_pid"] == state.holder_pid and len(shown["live_hosts"]) == 16

    # exec: the command runs in the host, with its output and exit status
    ping = run_testbed("exec", A, "--", "ping", "-c1", "-W2", state.ips[B])
    assert ping.returncode == 0 and ping_received(ping.stdout) == 1, ping.stdout + ping.stderr
    assert run_testbed("exec", A, "--", "sh", "-c", "exit 7").returncode == 7
    addr = run_testbed("exec", A, "--", "ip", "-o", "-4", "addr", "show", "dev", f"{A}-eth0")
    assert f"inet {state.ips[A]}/8" in addr.stdout
    assert run_testbed("exec", "nowhere", "--", "true").returncode == 2

    # one emulation at a time, even while nothing runs on the fabric
    again = run_testbed("up", SCENARIO)
    assert again.returncode == 3 and "another testbed run is active" in again.stderr

    # cli from a pipe: every pair reachable, the select groups OVS holds, a cable cut
    t_before_cut = time.monotonic()  # one clock for every process of the machine
    cli = run_testbed("cli", stdin=f"pingall\ndump-groups {CUT[0]}\n"
                                  f"link down {CUT[0]} {CUT[1]}\nlinks\n")
    assert cli.returncode == 0, cli.stdout
    assert "*** Results: 0% dropped (240/240 received)" in cli.stdout
    groups = expected_groups(CUT[0])
    assert f"{CUT[0]}: {groups} group" in cli.stdout
    assert len(re.findall(r"group \d+ select", cli.stdout)) == groups
    assert f"{CUT_ENDS} (DOWN: p0e0-eth3, p0a0-eth1)" in cli.stdout
    events = f"{state.workdir}/{EVENTS_FILE}"
    assert wait_for_event(events, "link_down", t_before_cut)

    # the controller routed around the cut: host names in commands become addresses
    # (links after iperf: the restored ends have had seconds to report their state)
    cli = run_testbed("cli", stdin=f"{A} ping -c3 -W2 {B}\nlink up {CUT[0]} {CUT[1]}\n"
                                  f"iperf {A} {B} 2\nlinks\nexit\n")
    assert cli.returncode == 0, cli.stdout
    assert ping_received(cli.stdout) == 3
    assert f"{CUT_ENDS} (up)" in cli.stdout
    assert re.search(r"iperf3 p0e0h0 -> p3e1h1: \d+\.\d+ Mbit/s received", cli.stdout)

    # a failing command fails the cli, and the prompt goes on
    cli = run_testbed("cli", stdin=f"{A} false\nnodes\n")
    assert cli.returncode == 1 and f"*** {A}: false exited with status 1" in cli.stdout
    assert "switches: c0 c1 c2 c3" in cli.stdout

    down = run_testbed("down")
    assert down.returncode == 0 and "fabric down in" in down.stdout, down.stdout + down.stderr
    assert run_testbed("status").returncode == 1
    assert SessionState.load() is None
    assert "the fabric is down" in open(f"{state.workdir}/holder.log").read()
    assert_clean()


def test_a_killed_holder_is_recovered_by_clean(fabric_up):
    state = fabric_up
    signal_holder(state, signal.SIGKILL)  # nothing of the fabric is taken down
    assert wait_gone(state, HOLDER_EXIT_S)
    left = leftovers()
    assert left["taps"] and left["processes"], "a killed holder should have left something"
    status = run_testbed("status")
    assert status.returncode == 1 and "lost its holder" in status.stdout
    refused = run_testbed("exec", A, "--", "true")
    assert refused.returncode == 3 and "testbed clean" in refused.stderr
    clean = run_testbed("clean")
    assert clean.returncode == 0, clean.stderr
    assert f"removed what run {state.run_id} left" in clean.stdout
    assert f"removed the record of fabric {state.run_id}" in clean.stdout
    assert run_testbed("status").stdout.startswith("no fabric is up")
    assert_clean()


def test_the_api_example_runs(tmp_path):
    out = subprocess.run([sys.executable, "examples/api_example.py", "--results",
                          str(tmp_path)], cwd=REPO, capture_output=True, text=True,
                         timeout=UP_TIMEOUT_S)
    print(out.stdout)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "FAILED" not in out.stdout and out.stdout.rstrip().endswith("the fabric is down")
    (fabric_dir,) = tmp_path.iterdir()
    (run_dir,) = (fabric_dir / "runs").iterdir()
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "complete" and summary["fabric_run_id"] == fabric_dir.name
    assert_clean()


def test_hosts_answer_as_mininet_hosts(tmp_path):
    with testbed.api.up(SCENARIO, results_dir=tmp_path) as fab:
        h1, h2 = fab.get(A, B)
        node = fab.description.nodes[A]
        assert (h1.IP(), h1.MAC()) == (node.ip, node.mac)
        assert h1.defaultIntf().name == f"{A}-eth0" and h1.intfNames() == [f"{A}-eth0"]
        # Mininet asks the kernel (ifconfig in the host) and gets the same answers
        assert h1.defaultIntf().updateIP() == node.ip
        assert h1.defaultIntf().updateMAC() == node.mac
        assert ping_received(h1.cmd("ping -c1 -W2", h2.IP())) == 1
        proc = h1.popen(["cat", f"/sys/class/net/{A}-eth0/address"], text=True)
        assert proc.communicate(timeout=10)[0].strip() == node.mac
        assert fab.pingAll() == 0
        assert sum(g.type == "select" for g in fab.dump_groups(CUT[0])) == expected_groups(
            CUT[0])
        assert fab.dump_flows(CUT[0])
        fab.link_down(*CUT)
        metrics = fab.metrics(interval_s=0.5)
        assert metrics["links_down"] == ["-".join(CUT)]
        assert set(metrics["link_rate_mbit"]) == set(metrics["link_utilisation"])
        assert len(metrics["link_rate_mbit"]) == 2 * 48
        fab.link_up(*CUT)
    assert_clean()
