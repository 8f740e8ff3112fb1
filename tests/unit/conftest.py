"""What every unit test runs inside: no calibration of this machine and no fabric.

A run's default link rate must not depend on whether someone calibrated the machine
(testbed.harness.calibration). And unit tests build no network: a FabricNetwork that would
start (namespaces, veths, switches, a controller) fails the test instead, so a stand-in that
no longer reaches the code it replaced cannot start a real run on a shared machine.

Property-based tests (hypothesis) run the ``ci`` profile: FUZZ_EXAMPLES examples per test,
derandomized so that CI runs the same examples each time. TESTBED_FUZZ_PROFILE=nightly runs
NIGHTLY_EXAMPLES fresh random examples per test instead (a few hours in all):

    TESTBED_FUZZ_PROFILE=nightly .venv/bin/python -m pytest tests/unit/test_input_fuzz.py
"""
from __future__ import annotations

import os

import pytest
from hypothesis import HealthCheck, settings

from testbed.apply.network import FabricNetwork

FUZZ_EXAMPLES = 300
NIGHTLY_EXAMPLES = 20_000
PROFILE_ENV = "TESTBED_FUZZ_PROFILE"

# Examples take milliseconds to a second (a whole scenario validated): no per-example
# deadline, and slow data generation is expected.
settings.register_profile("ci", max_examples=FUZZ_EXAMPLES, deadline=None, derandomize=True,
                          suppress_health_check=[HealthCheck.too_slow], print_blob=True)
settings.register_profile("nightly", max_examples=NIGHTLY_EXAMPLES, deadline=None,
                          suppress_health_check=[HealthCheck.too_slow], print_blob=True)
settings.load_profile(os.environ.get(PROFILE_ENV, "ci"))


@pytest.fixture(autouse=True)
def no_calibration(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("TESTBED_CALIBRATION",
                       str(tmp_path_factory.getbasetemp() / "no-calibration.json"))


@pytest.fixture(autouse=True)
def no_fabric(monkeypatch):
    def refuse(self):
        raise RuntimeError("a unit test tried to build a fabric: stand in for the network "
                           "where the code under test looks it up")

    monkeypatch.setattr(FabricNetwork, "_start", refuse)
