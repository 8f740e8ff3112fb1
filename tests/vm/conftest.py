"""The stock-kernel suite: what ``make vm-test`` runs inside a booted Debian 12 guest with its
stock kernel (scripts/vm/), where every standard path is the kernel's: the OVS kernel
datapath, RED, DCTCP, netem and softRoCE.

The guest runs this folder's tests and the integration tests marked ``stock_kernel``
(``pytest tests/vm tests/integration -m stock_kernel`` with TESTBED_IN_VM=1). This folder's
tests make sense only there: anywhere else they are deselected, never skipped (``make test``
does not collect them at all). Inside the guest a skipped test fails the session unless
allowed-skips.txt names it with its reason, and that list is printed when the session starts
(skip_policy.py holds the rules).

The run ledger and root check of tests/integration/conftest.py serve this folder's tests too;
``leftovers`` is its check that a run left nothing.
"""
from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.integration import conftest as integration
from tests.integration.conftest import ledger, require_root  # noqa: F401 (fixtures used here)
from tests.vm.skip_policy import header_lines, in_vm, parse_allowlist, unexpected_skips

HERE = Path(__file__).resolve().parent
ALLOWLIST = HERE / "allowed-skips.txt"
IN_VM = in_vm(os.environ)


@pytest.fixture(scope="session")
def leftovers():
    """What a run could leave behind (tests/integration/conftest.py): call it after the run."""
    return integration.leftovers


def allowed() -> dict[str, str]:
    return parse_allowlist(ALLOWLIST.read_text())


def ours(item) -> bool:
    return Path(item.fspath).resolve().is_relative_to(HERE)


def pytest_report_header(config):
    return header_lines(allowed()) if IN_VM else None


@pytest.hookimpl(tryfirst=True)  # before -m deselects by marker: this folder's tests are marked
def pytest_collection_modifyitems(config, items):
    mine = [item for item in items if ours(item)]
    for item in mine:
        item.add_marker(pytest.mark.root)
        item.add_marker(pytest.mark.stock_kernel)
    if mine and not IN_VM:
        config.hook.pytest_deselected(items=mine)
        items[:] = [item for item in items if not ours(item)]


SKIPPED: dict[str, str] = {}  # node id -> reason, for every test skipped in the guest
UNEXPECTED: list[str] = []


def pytest_runtest_logreport(report):
    if not (IN_VM and report.skipped):
        return
    if hasattr(report, "wasxfail"):
        reason = f"expected to fail: {report.wasxfail}"
    elif isinstance(report.longrepr, tuple):  # (file, line, "Skipped: why")
        reason = report.longrepr[2].removeprefix("Skipped: ")
    else:
        reason = str(report.longrepr)
    SKIPPED.setdefault(report.nodeid, reason)


def pytest_sessionfinish(session, exitstatus):
    """In the guest, a skip the allowlist does not name fails the session."""
    if not IN_VM:
        return
    UNEXPECTED[:] = unexpected_skips(SKIPPED, allowed())
    if UNEXPECTED and session.exitstatus == pytest.ExitCode.OK:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_terminal_summary(terminalreporter):
    if IN_VM and UNEXPECTED:
        terminalreporter.section("stock-kernel suite: skips not allowed")
        for line in UNEXPECTED:
            terminalreporter.line(line, red=True)
