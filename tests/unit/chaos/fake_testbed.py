"""A stand-in for ``python -m testbed`` in the suite's unit tests: ``run SCENARIO --results
DIR`` goes through the ledger's three phases (FAKE_PHASE_S each) in TESTBED_STATE_DIR and
ends as the scenario's name says (a plain or survivable run completes verified, ``chaos-rank-
kill`` fails loudly in its workload, ``chaos-concurrent-run`` is refused); ``clean`` removes
the ledger. Nothing else is touched."""
from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import yaml

STATE = Path(os.environ["TESTBED_STATE_DIR"])
LEDGER = STATE / "state.json"
PHASE_S = float(os.environ.get("FAKE_PHASE_S", "0.3"))


def set_phase(phase: str) -> None:
    tmp = LEDGER.with_suffix(".tmp")
    tmp.write_text(json.dumps({"run_id": "fake", "owner_pid": os.getpid(), "phase": phase,
                               "phase_t_monotonic_s": time.monotonic()}))
    tmp.replace(LEDGER)


def fail(line: str) -> int:
    LEDGER.unlink(missing_ok=True)
    print(f"testbed: error: {line}", file=sys.stderr)
    return 3


def main(argv: list[str]) -> int:
    if argv[0] == "clean":
        LEDGER.unlink(missing_ok=True)
        print("removed what run fake left")
        return 0
    scenario = yaml.safe_load(Path(argv[1]).read_text())
    results = Path(argv[argv.index("--results") + 1])
    name = scenario["name"]
    if name == "chaos-concurrent-run":
        return fail("another testbed run is active (pid 1, run holder); one emulation per "
                    "machine at a time: wait for it to finish")
    STATE.mkdir(parents=True, exist_ok=True)
    for phase in ("bring-up", "workload", "tear-down"):
        set_phase(phase)
        time.sleep(PHASE_S)
        if phase == "workload" and name == "chaos-rank-kill":
            return fail("AllReduce iterations: rank 3 died: killed by SIGKILL")
    LEDGER.unlink()
    run = results / "fake-run"
    run.mkdir(parents=True)
    windows = [{"fault": f"{f['action']} x", "start_monotonic_s": 1.0, "end_monotonic_s": 2.0}
               for f in scenario.get("failures", [])]
    (run / "summary.json").write_text(json.dumps({
        "status": "complete", "results_dir": str(run),
        "results": {"fabric": {"failures": [], "fault_windows": windows}},
        "verdict": {"checks": [{"name": "data verified on every rank", "outcome": "PASS"}]}}))
    print(f"results: {run}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
