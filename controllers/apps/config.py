"""The controller's inputs and outputs, as the launcher hands them to its apps: environment
variables, since os-ken instantiates apps itself and passes them no arguments.

    TESTBED_FABRIC_JSON             fabric description (path), the one the network was built from
    TESTBED_STATUS_JSON             status file: switches programmed so far (path)
    TESTBED_ROUTING                 ecmp | single | minimal | valiant | ugal (default ecmp)
    TESTBED_EVENTS_JSONL            failure events, one JSON object a line (path; unset: none)
    TESTBED_PORT_STATS_JSONL        port counters per poll, one JSON object a line (path;
                                    unset: no polling)
    TESTBED_PORT_STATS_INTERVAL_S   seconds between polls (default 0.5)
    TESTBED_ANYCAST_JSON            anycast service {"service_ip": ..., "replicas": [...]}: a
                                    path to that JSON, or the JSON text itself (unset: none)
    TESTBED_WIRING_JSONL            wiring check reports, one JSON object a line (path; unset:
                                    no check, see testbed.controllers.apps.lldp_app)
    TESTBED_WIRING_RECHECK_INTERVAL_S
                                    seconds from one wiring verdict to the next periodic check
                                    (default 10; 0: check only when something changes)
"""
from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping
from dataclasses import dataclass

from testbed.controllers.routing.ecmp import ECMP
from testbed.controllers.routing.fabric_state import AnycastService
from testbed.controllers.routing.wiring import RECHECK_INTERVAL_S

ENV_FABRIC = "TESTBED_FABRIC_JSON"
ENV_STATUS = "TESTBED_STATUS_JSON"
ENV_ROUTING = "TESTBED_ROUTING"
ENV_EVENTS = "TESTBED_EVENTS_JSONL"
ENV_PORT_STATS = "TESTBED_PORT_STATS_JSONL"
ENV_PORT_STATS_INTERVAL = "TESTBED_PORT_STATS_INTERVAL_S"
ENV_ANYCAST = "TESTBED_ANYCAST_JSON"
ENV_WIRING = "TESTBED_WIRING_JSONL"
ENV_WIRING_RECHECK_INTERVAL = "TESTBED_WIRING_RECHECK_INTERVAL_S"
DEFAULT_PORT_STATS_INTERVAL_S = 0.5
DEFAULT_WIRING_RECHECK_INTERVAL_S = RECHECK_INTERVAL_S


@dataclass(frozen=True)
class ControllerConfig:
    fabric_path: str
    status_path: str | None = None
    routing: str = ECMP
    events_path: str | None = None
    port_stats_path: str | None = None
    port_stats_interval_s: float = DEFAULT_PORT_STATS_INTERVAL_S
    anycast: str | None = None  # as TESTBED_ANYCAST_JSON holds it: a path or JSON text
    wiring_path: str | None = None
    wiring_recheck_interval_s: float = DEFAULT_WIRING_RECHECK_INTERVAL_S  # 0: none

    @classmethod
    def from_env(cls, environ: Mapping[str, str] = os.environ) -> ControllerConfig:
        interval = float(environ.get(ENV_PORT_STATS_INTERVAL, DEFAULT_PORT_STATS_INTERVAL_S))
        if not interval > 0:  # NaN fails too
            raise ValueError(f"{ENV_PORT_STATS_INTERVAL} must be > 0, got {interval}")
        recheck = float(environ.get(ENV_WIRING_RECHECK_INTERVAL,
                                    DEFAULT_WIRING_RECHECK_INTERVAL_S))
        if not 0 <= recheck < math.inf:  # NaN fails too
            raise ValueError(f"{ENV_WIRING_RECHECK_INTERVAL} must be >= 0 (0: no periodic "
                             f"check), got {recheck}")
        return cls(fabric_path=environ[ENV_FABRIC], status_path=environ.get(ENV_STATUS),
                   routing=environ.get(ENV_ROUTING, ECMP), events_path=environ.get(ENV_EVENTS),
                   port_stats_path=environ.get(ENV_PORT_STATS), port_stats_interval_s=interval,
                   anycast=environ.get(ENV_ANYCAST), wiring_path=environ.get(ENV_WIRING),
                   wiring_recheck_interval_s=recheck)

    def to_env(self) -> dict[str, str]:
        """The environment variables that give this configuration (unset ones left out, as is
        the wiring re-check interval at its default, so that one set in the launcher's own
        environment reaches the apps)."""
        recheck = (repr(self.wiring_recheck_interval_s)
                   if self.wiring_recheck_interval_s != DEFAULT_WIRING_RECHECK_INTERVAL_S
                   else None)
        env = {ENV_FABRIC: self.fabric_path, ENV_STATUS: self.status_path,
               ENV_ROUTING: self.routing, ENV_EVENTS: self.events_path,
               ENV_PORT_STATS: self.port_stats_path,
               ENV_PORT_STATS_INTERVAL: repr(self.port_stats_interval_s),
               ENV_ANYCAST: self.anycast, ENV_WIRING: self.wiring_path,
               ENV_WIRING_RECHECK_INTERVAL: recheck}
        return {name: value for name, value in env.items() if value is not None}

    def anycast_service(self) -> AnycastService | None:
        """The anycast service, read from its file or its JSON text; None when unset."""
        if self.anycast is None:
            return None
        text = self.anycast
        if not text.lstrip().startswith("{"):
            with open(text) as fh:
                text = fh.read()
        return AnycastService.from_dict(json.loads(text))
