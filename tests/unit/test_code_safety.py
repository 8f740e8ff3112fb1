"""What the shipped code may do with a shell and with folders, checked by reading it.

- No subprocess call goes through a shell (``shell=True``, ``os.system``, ``os.popen``,
  ``subprocess.getoutput``), and every ``sh -c``/``bash -c`` argument list is a constant or
  quotes what it interpolates with shlex.quote.
- Mininet's ``cmd``/``sendCmd`` join their arguments into a line for the host's bash: every
  call site is listed below with why nothing a user typed reaches that line unchecked.
- Folders are created in four places only (docs/reliability.md): the results folder and run
  folders in it, the testbed's run-state folder (TESTBED_STATE_DIR, /run/testbed), its cache
  (TESTBED_CACHE_DIR) and calibration (TESTBED_CALIBRATION), and the folder of an output path
  the user named. Every ``mkdir``/``makedirs`` call site is listed with which it is.
A new call site fails here until it is reviewed and listed; a listed one that went away too.
"""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SHIPPED = ("testbed", "controllers", "traffic")
SHELL_FUNCTIONS = {("os", "system"), ("os", "popen"), ("subprocess", "getoutput"),
                   ("subprocess", "getstatusoutput"), ("asyncio", "create_subprocess_shell")}
SHELLS = {"sh", "bash", "/bin/sh", "/bin/bash"}

# (file, enclosing function) -> why the line a host's shell reads is safe.
HOST_SHELL_LINES = {
    ("testbed/apply/network.py", "FabricNetwork._first_packet"): "ping of a fabric address",
    ("testbed/apply/network.py", "FabricNetwork._configure_hosts"):
        "the set-up script's path, shlex-quoted (setup_command)",
    ("testbed/apply/network.py", "FabricNetwork.ping_all"): "fping of fabric addresses",
    ("testbed/apply/network.py", "FabricNetwork.cmd"):
        "RunningFabric.cmd: its callers' lines, each listed here (net.cmd)",
    ("testbed/apply/rxe_probe.py", "probe"):
        "rdma link add on the probe's own fixed interface names",
    ("testbed/capacity/bench.py", "iperf_mbit"): "iperf3 to the bench's own addresses",
    ("testbed/capacity/bench.py", "direct_capacity"): "the bench's own interface and MTU",
    ("testbed/capacity/bench.py", "kernel_forwarding_capacity"):
        "the bench's own fixed addresses, routes and interfaces",
    ("testbed/drive/flows.py", "start_iperf_server"): "a port number",
    ("testbed/experiments/dctcp/experiment.py", "idle_rtt"): "ping of a fabric address",
    ("testbed/harness/fabric_checks.py", "anycast_reachable"):
        "the anycast address, validated as IPv4 by the scenario schema",
    ("testbed/system/counters.py", "read_host_qdiscs"): "a constant tc command",
    ("testbed/measure/rtt.py", "RttProbe.idle"): "ping of a fabric address",
}

# (file, enclosing function) -> which allowed folder it creates.
FOLDER_MAKERS = {
    ("testbed/apply/marking.py", "build_object"): "cache: the compiled eBPF programs",
    ("testbed/apply/network.py", "FabricNetwork._start"): "run folder (the fabric's)",
    ("testbed/apply/network.py", "FabricNetwork._configure_hosts"): "run folder: host-setup/",
    ("testbed/apply/ovs.py", "PrivateSwitchd.start"): "run state: ovs/",
    ("testbed/apply/ovs.py", "PrivateSwitchd._start_shard"): "run state: ovs/<shard>/",
    ("testbed/apply/state.py", "Ledger.save"): "run state",
    ("testbed/apply/state.py", "RunLock.__enter__"): "run state",
    ("testbed/capacity/bench.py", "failover_times"): "run folder of bench --output",
    ("testbed/capacity/bench.py", "anycast_times"): "run folder of bench --output",
    ("testbed/capacity/bench.py", "run_bench"): "user-named: the folder of bench --output",
    ("testbed/harness/calibration.py", "save_calibration"): "calibration",
    ("testbed/chaos/command.py", "cmd_chaos"):
        "run folder in the results folder: the suite's chaos-<stamp>-seed<N>/",
    ("testbed/chaos/suite.py", "results_folder"):
        "the suite's folder: mnt/, where a trial's tmpfs is mounted",
    ("testbed/chaos/suite.py", "Suite.run_trial"): "the suite's folder: trials/<trial>/",
    ("testbed/chaos/suite.py", "Suite.observe"): "the suite's folder: a trial's next/",
    ("testbed/cli.py", "cmd_topo"): "results folder (the default drawing's)",
    ("testbed/cli.py", "cmd_up"): "run folder in the results folder",
    ("testbed/experiments/dctcp/replot.py", "replot"): "run folder (user-named): plots/",
    ("testbed/experiments/incast/experiment.py", "Incast.measure_fanin"): "run folder",
    ("testbed/harness/repeat.py", "finish_repeat"): "a repeat's folder: plots/",
    ("testbed/harness/run.py", "write_config"): "run folder in the results folder",
    ("testbed/harness/run.py", "bring_up"): "run folder: setups/<name>/",
    ("testbed/harness/run.py", "write_results"): "run folder: plots/",
    ("testbed/interactive/attach.py", "SessionState.save"): "run state",
    ("testbed/lab/index.py", "write_index"): "results folder: labs/ (the labs' index)",
    ("testbed/lab/runner.py", "run_lab"): "run folder in the results folder: labs/<lab>/",
}


def call_name(call: ast.Call) -> tuple[str | None, str | None]:
    """(module or object name, attribute) of a call: ``os.system`` -> ("os", "system")."""
    func = call.func
    if isinstance(func, ast.Attribute):
        owner = func.value.id if isinstance(func.value, ast.Name) else None
        return owner, func.attr
    if isinstance(func, ast.Name):
        return None, func.id
    return None, None


def shipped_calls():
    """(file, enclosing function, call node) for every call in the shipped code."""
    for top in SHIPPED:
        for path in sorted((REPO / top).rglob("*.py")):
            rel = str(path.relative_to(REPO))
            stack: list[str] = []

            def visit(node, rel=rel, stack=stack):
                scoped = isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
                if scoped:
                    stack.append(node.name)
                if isinstance(node, ast.Call):
                    yield rel, ".".join(stack), node
                for child in ast.iter_child_nodes(node):
                    yield from visit(child)
                if scoped:
                    stack.pop()

            yield from visit(ast.parse(path.read_text(), str(path)))


CALLS = list(shipped_calls())


def is_quoted(node: ast.AST) -> bool:
    """A constant string, or an f-string whose every interpolation is shlex.quote(...)."""
    if isinstance(node, ast.Constant):
        return isinstance(node.value, str)
    if isinstance(node, ast.JoinedStr):
        return all(isinstance(part, ast.Constant) or (
            isinstance(part, ast.FormattedValue) and isinstance(part.value, ast.Call)
            and call_name(part.value)[1] == "quote") for part in node.values)
    return False


def test_no_call_passes_shell_true():
    found = [f"{rel}:{call.lineno}" for rel, _, call in CALLS
             for kw in call.keywords if kw.arg == "shell"
             and not (isinstance(kw.value, ast.Constant) and kw.value.value is False)]
    assert found == []


def test_no_call_runs_a_command_line_through_a_shell_function():
    found = [f"{rel}:{call.lineno} {'.'.join(filter(None, call_name(call)))}"
             for rel, _, call in CALLS if call_name(call) in SHELL_FUNCTIONS]
    assert found == []


def test_every_sh_c_is_constant_or_quoted():
    found = []
    for rel, _, call in CALLS:
        for arg in call.args:
            if not isinstance(arg, (ast.List, ast.Tuple)):
                continue
            items = arg.elts
            for i, item in enumerate(items[:-2]):
                if (isinstance(item, ast.Constant) and item.value in SHELLS
                        and isinstance(items[i + 1], ast.Constant) and items[i + 1].value == "-c"
                        and not is_quoted(items[i + 2])):
                    found.append(f"{rel}:{call.lineno}")
    assert found == []


def sites(names: set[str]) -> set[tuple[str, str]]:
    return {(rel, where) for rel, where, call in CALLS if call_name(call)[1] in names
            and isinstance(call.func, ast.Attribute)}


def test_every_line_for_a_host_shell_is_reviewed():
    found = sites({"cmd", "sendCmd", "cmdPrint"})
    assert found - HOST_SHELL_LINES.keys() == set(), "review these and list them"
    assert HOST_SHELL_LINES.keys() - found == set(), "these are gone: unlist them"


def test_folders_are_made_only_where_the_docs_say():
    found = sites({"mkdir", "makedirs"}) | {
        (rel, where) for rel, where, call in CALLS if call_name(call) == ("os", "makedirs")}
    assert found - FOLDER_MAKERS.keys() == set(), "review these and list them"
    assert FOLDER_MAKERS.keys() - found == set(), "these are gone: unlist them"


@pytest.mark.parametrize("source", ['["sh", "-c", f"echo {x}"]', '["bash", "-c", cmd]'])
def test_the_scan_finds_an_unquoted_sh_c(source):
    call = ast.parse(f"run({source})").body[0].value
    items = call.args[0].elts
    assert not is_quoted(items[2])


def test_the_scan_takes_a_quoted_sh_c():
    call = ast.parse('run(["sh", "-c", f"cat {shlex.quote(path)}"])').body[0].value
    assert is_quoted(call.args[0].elts[2])
