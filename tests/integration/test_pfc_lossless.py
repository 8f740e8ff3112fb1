"""``testbed run scenarios/pfc-lossless.yaml``, shortened to 3 recorded queries: PFC on, 15
senders of the k=4 fat-tree answer one receiver at once in the lossless class, and tcpdump
keeps the pause frames that reach the receiver's neighbour (p0e0h1) in the run folder.

The run must write a report whose checks all PASS (no drop in the lossless class or at any
switch queue, pauses sent, every query completed, tshark decodes every captured frame as PFC
and finds as many as the pause agent sent on that link) and a pcap that tshark, run here on
its own, decodes as MAC Control frames with the PFC opcode (0x0101, Class Based Flow
Control); the run must have been trustworthy, on this machine's datapath (the kernel's on a
stock kernel: part of the stock-kernel suite, make vm-test). Needs root; runs alone."""
from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from testbed.capabilities import detect
from testbed.harness.run import run_scenario
from testbed.experiments.registry import load
from testbed.measure.pauses import CAPTURE_FILE

pytestmark = pytest.mark.stock_kernel

ROUNDS = 3
# Inside the stock-kernel guest (software emulation, about ten times slower), at the
# scenario's 10 Mbit/s the incast's first connections timed out and its queue never reached
# XOFF (no pause at all): at 2 Mbit/s with a smaller buffer the queue fills and pauses. The
# pause agent's 4 ms polls of the 80 lossless queues of the k=4 fat-tree took 1.07 cores
# there, so that run cannot be trusted at any rate: tests/vm/allowed-skips.txt names the
# skip of the trust assertion; every functional assertion holds before it.
IN_VM = os.environ.get("TESTBED_IN_VM") == "1"
VM_OVERRIDES = {"link_rate_mbit": 2, "params.buffer_bytes": 100_000} if IN_VM else {}
TSHARK_TIMEOUT_S = 120
PFC_FILTER = "macc.opcode == 0x0101"
CHECKS = ["every query completed", "PFC: lossless-class drops", "PFC: switch queue drops",
          "PFC pauses instead", "tshark decodes the captured pause frames as PFC",
          "captured pause frames against the agent's count"]


def tshark(*args: str) -> str:
    out = subprocess.run(["tshark", *args], capture_output=True, text=True,
                         timeout=TSHARK_TIMEOUT_S)
    assert out.returncode == 0, out.stderr
    return out.stdout


def test_pause_frames_are_kept_and_decode_as_pfc(tmp_path):
    resolved = load("pfc-lossless", {"results_dir": str(tmp_path), "params.rounds": ROUNDS,
                                     **VM_OVERRIDES})
    outcome = run_scenario(resolved, log=print)
    for check in outcome.verdict.checks:
        print(f"{check.outcome} {check.name}: {check.statement}")
    ran = outcome.summary["provenance"]["paths"]
    assert ran["ovs_datapath"] == detect().paths.ovs_datapath, ran
    capture = outcome.summary["results"]["pfc"]["pause_capture"]
    pcap = outcome.workdir / CAPTURE_FILE  # one setup: its files are the run folder's
    assert pcap.exists() and Path(capture["pcap"]).resolve() == pcap.resolve()
    assert (capture["host"], capture["interface"], capture["sent_by"]) == (
        "p0e0h1", "p0e0h1-eth0", "p0e0-eth2")
    listed = tshark("-r", str(pcap), "-Y", PFC_FILTER).splitlines()
    assert len(listed) == capture["pfc_frames"] == capture["frames"] > 0
    assert capture["pfc_frames"] == capture["agent_sent"] == capture["agent_received"]
    verbose = tshark("-r", str(pcap), "-c", "1", "-V")
    assert "MAC Control" in verbose and "Class Based Flow Control" in verbose
    assert [c.name for c in outcome.verdict.checks] == CHECKS
    report = (outcome.workdir / "report.md").read_text()
    assert "| PASS | tshark decodes the captured pause frames as PFC |" in report
    assert capture["pfc_frames"] > 0 and outcome.summary["results"]["pfc"]["pause_agent_running"]
    checks = {c.name: c.outcome for c in outcome.verdict.checks}
    assert checks["every query completed"] == checks["PFC pauses instead"] == "PASS", checks
    if IN_VM and not outcome.verdict.emulator_trusted:
        # whether the class stayed lossless rests on the pause agent's timing: in two guest
        # runs, both NOT TRUSTED (machine 99% busy, the agent's thread saturated, its sample
        # gap 35-39 ms at p99 against 4 ms asked), the fan-in 15 incast lost 87 and 120
        # lossless frames, with the headroom sized for a 20 ms and a 150 ms reaction alike
        pytest.skip("the pause agent cannot keep up under software emulation: "
                    + "; ".join(outcome.verdict.reasons))
    assert [c.outcome for c in outcome.verdict.checks] == ["PASS"] * len(CHECKS)
    assert outcome.verdict.emulator_trusted, outcome.verdict.reasons
    assert outcome.exit_status() == 0
