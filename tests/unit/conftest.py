"""What every unit test runs inside: no calibration of this machine and no fabric.

A run's default link rate must not depend on whether someone calibrated the machine
(testbed.harness.calibration). And unit tests build no network: a FabricNetwork that would
start (namespaces, veths, switches, a controller) fails the test instead, so a stand-in that
no longer reaches the code it replaced cannot start a real run on a shared machine."""
from __future__ import annotations

import pytest

from testbed.apply.network import FabricNetwork


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
