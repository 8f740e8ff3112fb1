"""Start the os-ken controller with the fabric apps, listening on 127.0.0.1 only.

os-ken ships no manager command; this is the small launcher the testbed runs as a separate
process:

    python -m testbed.controllers.apps.launcher --fabric F --status S --port 6653 [--routing MODE]
        [--events EVENTS.jsonl] [--port-stats STATS.jsonl] [--port-stats-interval 0.5]
        [--anycast ANYCAST.json] [--wiring-check WIRING.jsonl]

It hands the settings to the apps as environment variables (testbed.controllers.apps.config).
"""
from __future__ import annotations

import argparse
import logging
import os

from os_ken import cfg
from os_ken.base import app_manager

from testbed.controllers.apps.config import (
    DEFAULT_PORT_STATS_INTERVAL_S,
    ControllerConfig,
)
from testbed.controllers.routing.fabric_state import ROUTING_MODES, routing_problem
from testbed.model.topology.base import Fabric

APPS = ["testbed.controllers.apps.fabric_app", "testbed.controllers.apps.arp_app", "testbed.controllers.apps.port_stats_app",
        "testbed.controllers.apps.lldp_app", "os_ken.controller.ofp_handler"]


def parse_args(argv=None) -> tuple[ControllerConfig, int]:
    """The launcher's arguments: the apps' configuration and the OpenFlow port. Usage errors
    (a dragonfly mode for another fabric, a bad anycast service) exit with one line, before
    os-ken starts."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--fabric", required=True, help="fabric description JSON")
    ap.add_argument("--status", required=True, help="status JSON the app keeps up to date")
    ap.add_argument("--port", type=int, default=6653, help="OpenFlow TCP port on 127.0.0.1")
    ap.add_argument("--routing", choices=ROUTING_MODES, default="ecmp")
    ap.add_argument("--events", help="failure events, JSON lines (default: none written)")
    ap.add_argument("--port-stats", help="port counters per poll, JSON lines (default: no "
                    "polling, except under ugal routing)")
    ap.add_argument("--port-stats-interval", type=float, default=DEFAULT_PORT_STATS_INTERVAL_S,
                    metavar="S", help="seconds between port-counter polls (0.5)")
    ap.add_argument("--anycast", help='anycast service JSON {"service_ip": ..., "replicas": '
                    '[host names]} (a file, or the JSON text)')
    ap.add_argument("--wiring-check", metavar="WIRING.jsonl", help="check the cabling against "
                    "the fabric with LLDP and write the verdicts there, JSON lines (default: "
                    "no check)")
    args = ap.parse_args(argv)
    if not args.port_stats_interval > 0:
        ap.error(f"--port-stats-interval must be > 0, got {args.port_stats_interval}")
    config = ControllerConfig(
        fabric_path=args.fabric, status_path=args.status, routing=args.routing,
        events_path=args.events, port_stats_path=args.port_stats,
        port_stats_interval_s=args.port_stats_interval, anycast=args.anycast,
        wiring_path=args.wiring_check)
    fabric = Fabric.load_json(args.fabric)
    problem = routing_problem(fabric.kind, args.routing)
    if problem:
        ap.error(f"--routing: {problem}")
    try:
        service = config.anycast_service()
        if service is not None:
            service.check(fabric, args.routing)
    except (OSError, ValueError) as exc:
        ap.error(f"--anycast: {exc}")
    return config, args.port


def main(argv=None) -> None:
    config, port = parse_args(argv)
    os.environ.update(config.to_env())
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    cfg.CONF(args=["--ofp-listen-host", "127.0.0.1", "--ofp-tcp-listen-port", str(port)],
             project="os_ken")
    app_manager.AppManager.run_apps(APPS)


if __name__ == "__main__":
    main()
