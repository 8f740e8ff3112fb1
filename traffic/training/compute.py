"""Modelled compute: a rank stands for a GPU by waiting as long as its work would take,
either sleeping (leaves the CPU to the emulator; the default) or busy-waiting (holds a core,
as a host that cannot hide compute would). Waits run to absolute deadlines on the monotonic
clock, so a sequence of them does not accumulate scheduling delays."""
from __future__ import annotations

import time

SLEEP, BUSY = "sleep", "busy"
COMPUTE_MODES = (SLEEP, BUSY)


def wait_until(deadline_s: float, mode: str = SLEEP) -> None:
    """Return at ``deadline_s`` (time.monotonic()), or at once if it has passed."""
    if mode == BUSY:
        while time.monotonic() < deadline_s:
            pass
        return
    if mode != SLEEP:
        raise ValueError(f"unknown compute mode {mode!r}; known: {', '.join(COMPUTE_MODES)}")
    remaining = deadline_s - time.monotonic()
    if remaining > 0:
        time.sleep(remaining)


def compute(seconds: float, mode: str = SLEEP) -> float:
    """Model ``seconds`` of compute from now; returns when it ended."""
    end = time.monotonic() + seconds
    wait_until(end, mode)
    return end


def add_compute_argument(ap) -> None:
    ap.add_argument("--compute", choices=COMPUTE_MODES, default=SLEEP,
                    help="how modelled compute waits: sleep (default) or busy")
