"""Start the os-ken controller with the fabric app, listening on 127.0.0.1 only.

os-ken ships no manager command; this is the small launcher the testbed runs as a separate
process: ``python -m controllers.launcher --fabric F --status S --port 6653``.
"""
from __future__ import annotations

import argparse
import logging
import os

from os_ken import cfg
from os_ken.base import app_manager

from controllers.routing import MODES

APPS = ["controllers.fabric_app", "os_ken.controller.ofp_handler"]


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--fabric", required=True, help="fabric description JSON")
    ap.add_argument("--status", required=True, help="status JSON the app keeps up to date")
    ap.add_argument("--port", type=int, default=6653, help="OpenFlow TCP port on 127.0.0.1")
    ap.add_argument("--routing", choices=MODES, default="ecmp")
    args = ap.parse_args(argv)
    os.environ["TESTBED_FABRIC_JSON"] = args.fabric
    os.environ["TESTBED_STATUS_JSON"] = args.status
    os.environ["TESTBED_ROUTING"] = args.routing
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    cfg.CONF(args=["--ofp-listen-host", "127.0.0.1", "--ofp-tcp-listen-port", str(args.port)],
             project="os_ken")
    app_manager.AppManager.run_apps(APPS)


if __name__ == "__main__":
    main()
