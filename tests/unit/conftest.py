"""Unit tests never read this machine's calibration (testbed.harness.calibration): a run's
default link rate must not depend on whether someone calibrated the machine."""
from __future__ import annotations

import pytest


@pytest.fixture(autouse=True)
def no_calibration(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("TESTBED_CALIBRATION",
                       str(tmp_path_factory.getbasetemp() / "no-calibration.json"))
