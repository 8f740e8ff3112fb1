"""The one fault table (testbed.chaos.table): every row the suite promises is there with one
expected outcome, its workloads exist, its error pattern matches the line the testbed really
prints for that fault, and the reliability page shows the table as the code has it."""
from __future__ import annotations

import errno
import os
import re
from pathlib import Path

import pytest

from testbed.apply.state import PHASES
from testbed.chaos.plan import WORKLOADS
from testbed.chaos.table import (
    FAILED_LOUDLY,
    FAULTS,
    FAULTS_BY_KEY,
    OUTCOMES,
    RECOVERED,
    REFUSED,
    SURVIVED,
    faults_markdown,
)

REPO = Path(__file__).resolve().parents[3]
PAGE = REPO / "docs" / "reliability-faults.md"
BEGIN, END = "<!-- fault table: begin -->", "<!-- fault table: end -->"


def test_every_promised_fault_is_a_row_with_one_expected_outcome():
    assert {f.key: f.expected for f in FAULTS} == {
        "controller-restart": SURVIVED, "link-flap": SURVIVED, "switch-flap": SURVIVED,
        "vswitchd-kill": FAILED_LOUDLY, "pause-agent-kill": FAILED_LOUDLY,
        "rank-kill": FAILED_LOUDLY, "rank-stop": FAILED_LOUDLY, "results-full": FAILED_LOUDLY,
        "results-read-only": FAILED_LOUDLY, "concurrent-run": REFUSED,
        "sigkill-bring-up": RECOVERED, "sigkill-workload": RECOVERED,
        "sigkill-tear-down": RECOVERED}
    assert len(FAULTS_BY_KEY) == len(FAULTS)
    assert FAULTS_BY_KEY["switch-flap"].workloads == ("allreduce", "roce", "anycast")
    assert tuple(f.phase for f in FAULTS if f.expected == RECOVERED) == PHASES
    for f in FAULTS:
        assert f.expected in OUTCOMES and f.how
        assert all(w in WORKLOADS for w in f.workloads), f.key
        if f.expected in (FAILED_LOUDLY, REFUSED):
            assert f.names, f.key  # a loud failure must name what died


def the_line_printed_for(key: str) -> str:
    """What the testbed prints (after ``testbed: error: ``) when the fault strikes (the run
    lock in the state folder the test points the module at)."""
    import testbed.apply.state as state
    from testbed.apply.pfc_runtime import PauseAgentProcess
    from testbed.errors import BusyError
    from testbed.apply.watchdog import death_line
    from testbed.drive.ranks import died, unfinished
    from testbed.harness.run import results_error

    class Killed:
        pid, returncode = 4242, -9

        def poll(self):
            return self.returncode

    if key == "vswitchd-kill":
        return death_line("ovs-vswitchd", 812, -9)
    if key == "pause-agent-kill":
        return death_line(PauseAgentProcess.title, 813, -9)
    if key == "rank-kill":
        return str(died("AllReduce iterations", [Killed()]))
    if key == "rank-stop":
        return unfinished("AllReduce iterations", {5: "T", 6: "S"}, 60.0)
    if key in ("results-full", "results-read-only"):
        code = errno.ENOSPC if key == "results-full" else errno.EROFS
        return str(results_error(OSError(code, os.strerror(code), "/r/run/config.json"),
                                 Path("/r/run")))
    assert key == "concurrent-run"
    with state.RunLock("the holder"), pytest.raises(BusyError) as info:
        with state.RunLock("the second run"):
            pass
    return str(info.value)


@pytest.mark.parametrize("key", [f.key for f in FAULTS if f.names])
def test_each_rows_pattern_matches_what_the_testbed_prints_for_it(key, tmp_path, monkeypatch):
    import testbed.apply.state as state

    monkeypatch.setattr(state, "STATE_DIR", tmp_path)
    monkeypatch.setattr(state, "LOCK_PATH", tmp_path / "lock")
    line = the_line_printed_for(key)
    assert re.search(FAULTS_BY_KEY[key].names, line), line
    others = [f.key for f in FAULTS if f.names and f.key != key]
    assert not any(re.search(FAULTS_BY_KEY[other].names, line)
                   for other in others)  # one fault's line never passes for another's


def test_the_reliability_page_shows_the_table_as_the_code_has_it():
    text = PAGE.read_text()
    assert BEGIN in text and END in text
    shown = text.split(BEGIN, 1)[1].split(END, 1)[0].strip()
    assert shown == faults_markdown(), ("docs/reliability-faults.md is out of date: paste "
                                        "testbed.chaos.table.faults_markdown() between the "
                                        "markers")
