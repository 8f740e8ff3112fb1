"""The run lifecycle every experiment shares: run ids, the machine's run lock and ledger
(anything an earlier killed run left is swept first, and everything this run creates is swept
at the end), and signals that end a run through the same clean-up path as Ctrl-C."""
from __future__ import annotations

import datetime
import os
import signal
import uuid
from contextlib import contextmanager

from testbed.apply.network import check_root
from testbed.apply.state import Ledger, RunLock, clean


def new_run_id(name: str) -> str:
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    return f"{stamp}-{name}-{uuid.uuid4().hex[:4]}"


@contextmanager
def interrupts_as_exceptions():
    """SIGTERM and SIGHUP end a run like Ctrl-C does: through the clean-up path."""
    def raise_interrupt(signum, frame):
        raise KeyboardInterrupt(f"signal {signum}")

    old = {s: signal.signal(s, raise_interrupt) for s in (signal.SIGTERM, signal.SIGHUP)}
    try:
        yield
    finally:
        for s, handler in old.items():
            signal.signal(s, handler)


@contextmanager
def shielded():
    """Ignore Ctrl-C while tearing down, so a second Ctrl-C cannot leave half a fabric."""
    old = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, old)


@contextmanager
def machine(run_id: str, log=print):
    """Hold the run lock, sweep what an earlier killed run left, and always sweep on exit."""
    check_root()
    with RunLock(run_id):
        stale = Ledger.load()
        if stale is not None:
            removed = clean(stale, log)
            log(f"recovered from interrupted run {stale.run_id}: removed {removed}")
        ledger = Ledger(run_id, os.getpid())
        ledger.save()
        try:
            yield ledger
        finally:
            with shielded():
                clean(ledger, log)
