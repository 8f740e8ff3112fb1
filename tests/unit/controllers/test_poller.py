"""The polling thread the controller's apps share (testbed.controllers.apps.poller), on real threads with
no switch: it polls at its interval from ``start``, ends with ``stop``, ``close`` closes the
report file, and an app that has no work for it gets none; os-ken still loads each app, not
the base class, from its module; and each app keeps its own rule for when it polls."""
from __future__ import annotations

import logging
import threading
import time

import pytest
from os_ken.base import app_manager

from testbed.controllers.apps.config import (
    ENV_FABRIC,
    ENV_PORT_STATS,
    ENV_ROUTING,
    ENV_WIRING,
)
from testbed.controllers.apps.lldp_app import LldpApp
from testbed.controllers.apps.poller import PollingApp
from testbed.controllers.apps.port_stats_app import PortStatsApp
from testbed.controllers.routing.dragonfly import UGAL
from testbed.model.topology.fattree import fat_tree

INTERVAL_S = 0.01
POLLS = 5
WAIT_S = 5.0  # generous: the thread needs POLLS * INTERVAL_S on an idle machine


class Counter(PollingApp):
    def __init__(self, out=None, polling: bool | None = None):
        super().__init__()
        self.poll_interval_s = INTERVAL_S
        self.out = out
        self.wanted = polling
        self.polls = 0
        self.enough = threading.Event()

    def polling(self) -> bool:
        return super().polling() if self.wanted is None else self.wanted

    def poll_description(self) -> str:
        return "counting"

    def poll(self) -> None:
        with self.lock:
            self.polls += 1
            if self.polls == POLLS:
                self.enough.set()


def test_the_thread_polls_from_start_to_stop_and_close_closes_the_file(tmp_path, caplog):
    out = open(tmp_path / "report.jsonl", "a")
    app = Counter(out)
    assert app.polling()
    with caplog.at_level(logging.INFO, logger=app.logger.name):
        app.start()
    try:
        assert app.enough.wait(WAIT_S)
    finally:
        app.stop()
    assert not any(t.is_alive() for t in app.threads)  # stop joined the poll thread too
    stopped_at = app.polls
    time.sleep(5 * INTERVAL_S)
    assert app.polls == stopped_at >= POLLS
    assert "counting" in caplog.messages
    assert not out.closed
    app.close()
    assert out.closed


def test_an_app_with_nothing_to_poll_gets_no_thread():
    app = Counter()  # no report file
    assert not app.polling()
    app.start()
    try:
        assert len(app.threads) == 1  # os-ken's event loop only
        time.sleep(5 * INTERVAL_S)
    finally:
        app.stop()
    assert app.polls == 0
    app.close()  # no file: nothing to close


def test_os_ken_loads_each_app_not_the_base_class():
    manager = app_manager.AppManager()
    assert manager.load_app("testbed.controllers.apps.lldp_app") is LldpApp
    assert manager.load_app("testbed.controllers.apps.port_stats_app") is PortStatsApp


@pytest.mark.parametrize(("files", "routing", "lldp_polls", "stats_polls"), [
    (False, "ecmp", False, False),
    (True, "ecmp", True, True),
    (False, UGAL, False, True),  # UGAL reweights from the counters: polled, not written
])
def test_each_app_keeps_its_own_rule_for_polling(tmp_path, monkeypatch, files, routing,
                                                 lldp_polls, stats_polls):
    fabric_json = tmp_path / "fabric.json"
    fat_tree(4).dump_json(fabric_json)
    monkeypatch.setenv(ENV_FABRIC, str(fabric_json))
    monkeypatch.setenv(ENV_ROUTING, routing)
    if files:
        monkeypatch.setenv(ENV_WIRING, str(tmp_path / "wiring.jsonl"))
        monkeypatch.setenv(ENV_PORT_STATS, str(tmp_path / "port-stats.jsonl"))
    for app, polls in ((LldpApp(), lldp_polls), (PortStatsApp(), stats_polls)):
        try:
            assert app.polling() == polls
        finally:
            app.close()
