"""The stock-kernel suite's rules (tests/vm/skip_policy.py, applied by tests/vm/conftest.py):
its tests are deselected outside the guest, and inside it a skip fails the session unless the
allowlist names it. The pure rules directly, then the conftest in a pytest session of its own
on a copy of tests/vm, beside a stand-in for tests/integration/conftest.py (no root)."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.vm import skip_policy as policy

VM_TESTS = Path(__file__).resolve().parents[2] / "vm"
SESSION_TIMEOUT_S = 120


def test_the_guest_is_told_by_its_environment():
    assert policy.in_vm({"TESTBED_IN_VM": "1"})
    assert not policy.in_vm({}) and not policy.in_vm({"TESTBED_IN_VM": "0"})


def test_the_allowlist_names_each_test_with_its_reason():
    text = ("# comment\n\n"
            "tests/vm/test_a.py::test_x -- the ring saturates the CPU under emulation\n"
            "tests/integration/test_b.py::test_y[2] -- pauses late under emulation\n")
    assert policy.parse_allowlist(text) == {
        "tests/vm/test_a.py::test_x": "the ring saturates the CPU under emulation",
        "tests/integration/test_b.py::test_y[2]": "pauses late under emulation"}
    with pytest.raises(ValueError, match="line 1: expected"):
        policy.parse_allowlist("tests/vm/test_a.py::test_x\n")
    with pytest.raises(ValueError, match="listed twice"):
        policy.parse_allowlist("a -- why\na -- why again\n")
    # the committed list parses
    policy.parse_allowlist((VM_TESTS / "allowed-skips.txt").read_text())


def test_only_allowed_skips_pass_and_the_list_is_printed():
    allowed = {"t::a": "emulation too slow"}
    assert policy.unexpected_skips({"t::a": "slow", "t::b": "no rxe"}, allowed) == [
        "t::b: skipped (no rxe) but not in tests/vm/allowed-skips.txt"]
    assert policy.header_lines(allowed) == [
        "stock-kernel suite: 1 skip(s) allowed (tests/vm/allowed-skips.txt):",
        "  t::a -- emulation too slow"]
    assert "no skip is allowed" in policy.header_lines({})[0]


STAND_IN_INTEGRATION_CONFTEST = '''
from pathlib import Path
import pytest
REPO = Path(__file__).resolve().parents[2]
@pytest.fixture(scope="session", autouse=True)
def require_root():
    pass
@pytest.fixture(scope="module")
def ledger():
    yield None
def leftovers():
    return {}
'''

A_SUITE = '''
import pytest
def test_passes():
    assert 1 + 1 == 2
def test_skips():
    pytest.skip("the emulator did not keep up")
'''


def session(tmp_path: Path, in_vm: bool, allow: str = "") -> subprocess.CompletedProcess:
    """pytest on a copy of tests/vm holding A_SUITE, with ``allow`` as its allowlist, in a
    tests package of its own."""
    tests = tmp_path / "tests"
    shutil.copytree(VM_TESTS, tests / "vm", ignore=shutil.ignore_patterns("test_*.py",
                                                                          "__pycache__"))
    (tests / "vm" / "test_suite.py").write_text(A_SUITE)
    (tests / "vm" / "allowed-skips.txt").write_text(allow)
    (tests / "integration").mkdir()
    (tests / "integration" / "conftest.py").write_text(STAND_IN_INTEGRATION_CONFTEST)
    for package in (tests, tests / "integration"):
        (package / "__init__.py").write_text("")
    env = {k: v for k, v in os.environ.items() if k != "TESTBED_IN_VM"}
    if in_vm:
        env["TESTBED_IN_VM"] = "1"
    return subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider",
                           "--rootdir", str(tmp_path), "-c", os.devnull, "-rs", "tests/vm"],
                          cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=SESSION_TIMEOUT_S)


def test_outside_the_guest_the_suite_is_deselected_not_skipped(tmp_path):
    out = session(tmp_path, in_vm=False)
    assert out.returncode == pytest.ExitCode.NO_TESTS_COLLECTED, out.stdout
    assert "2 deselected" in out.stdout and "skipped" not in out.stdout


def test_in_the_guest_a_skip_not_allowed_fails_the_session(tmp_path):
    out = session(tmp_path, in_vm=True)
    assert out.returncode == pytest.ExitCode.TESTS_FAILED, out.stdout
    assert "no skip is allowed" in out.stdout  # the header, at the start
    assert ("tests/vm/test_suite.py::test_skips: skipped (the emulator did not keep up) but "
            "not in tests/vm/allowed-skips.txt") in out.stdout


def test_in_the_guest_an_allowed_skip_is_printed_and_passes(tmp_path):
    out = session(tmp_path, in_vm=True,
                  allow="tests/vm/test_suite.py::test_skips -- slow under emulation\n")
    assert out.returncode == pytest.ExitCode.OK, out.stdout
    assert "  tests/vm/test_suite.py::test_skips -- slow under emulation" in out.stdout
    assert "1 passed, 1 skipped" in out.stdout
