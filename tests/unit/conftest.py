"""Unit tests never read this machine's calibration (testbed.capacity.calibrate): a run's
default link rate must not depend on whether someone calibrated the machine.

Property-based tests (hypothesis) run the ``ci`` profile: FUZZ_EXAMPLES examples per test,
derandomized so that CI runs the same examples each time. TESTBED_FUZZ_PROFILE=nightly runs
NIGHTLY_EXAMPLES fresh random examples per test instead (a few hours in all):

    TESTBED_FUZZ_PROFILE=nightly .venv/bin/python -m pytest tests/unit/test_input_fuzz.py
"""
from __future__ import annotations

import os

import pytest
from hypothesis import HealthCheck, settings

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
