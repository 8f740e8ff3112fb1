"""Anycast on the wire: a request/response service (traffic.anycast_service) on two replicas
behind one address. A client is served by its nearest replica; when that replica's link
fails it is served by the other one, and when the link returns it moves back. The switch-over
time is printed; only a generous sanity bound is asserted (timing goals are measured, not
asserted on a noisy machine)."""
from __future__ import annotations

import json
import subprocess
import sys
import time

from controllers.fabric_state import AnycastService
from testbed.controller import write_anycast
from testbed.experiment import start_anycast
from testbed.fabric import FabricNetwork
from testbed.topology import build

SERVICE = {"service_ip": "10.255.0.1", "replicas": ["p0e0h0", "p3e1h1"]}
PORT = 7000
CLIENT = "p0e1h0"            # same pod as p0e0h0: nearer to it than to p3e1h1
NEAR, FAR = "p0e0h0", "p3e1h1"
NEAR_LINK = "p0e0-eth1"      # the switch end of p0e0h0's link
INTERVAL_S = 0.01
DOWN_AT_S, UP_AT_S, DURATION_S = 1.5, 3.5, 6.0
SANITY_BOUND_S = 3.0
IN_FLIGHT_S = 0.3            # answers to requests sent before the move may still arrive


def test_clients_follow_the_nearest_live_replica(ledger, tmp_path):
    fabric = build("fattree", k=4, host_rate_mbit=6.0)
    write_anycast(tmp_path, SERVICE)
    with FabricNetwork(fabric, tmp_path, ledger, log=lambda m: None) as net:
        expected = start_anycast(net, AnycastService.from_dict(SERVICE), "ecmp", lambda m: None)
        assert expected["replica_for_host"][CLIENT] == NEAR
        for name in SERVICE["replicas"]:
            net.popen(name, [sys.executable, "-m", "traffic.anycast_service", "serve", "--bind",
                             SERVICE["service_ip"], "--port", str(PORT), "--name", name],
                      stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(0.5)
        client = net.popen(CLIENT, [sys.executable, "-m", "traffic.anycast_service", "probe",
                                    "--service", SERVICE["service_ip"], "--port", str(PORT),
                                    "--interval-s", str(INTERVAL_S),
                                    "--duration-s", str(DURATION_S)],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        t0 = time.monotonic()
        time.sleep(DOWN_AT_S)
        t_down = time.monotonic()
        subprocess.run(["ip", "link", "set", NEAR_LINK, "down"], check=True)
        time.sleep(UP_AT_S - (time.monotonic() - t0))
        t_up = time.monotonic()
        subprocess.run(["ip", "link", "set", NEAR_LINK, "up"], check=True)
        out, err = client.communicate(timeout=DURATION_S + 30)
    answers = [json.loads(line) for line in out.splitlines()]
    assert answers, err
    before = [a["replica"] for a in answers if a["t_monotonic_s"] < t_down]
    assert before and set(before) == {NEAR}
    first_far = min((a["t_monotonic_s"] for a in answers
                     if a["replica"] == FAR and a["t_monotonic_s"] >= t_down), default=None)
    assert first_far is not None, "never moved to the other replica"
    back = min((a["t_monotonic_s"] for a in answers
                if a["replica"] == NEAR and a["t_monotonic_s"] >= t_up), default=None)
    assert back is not None, "never moved back"
    print(f"anycast: served by {FAR} {1000 * (first_far - t_down):.0f} ms after {NEAR}'s link "
          f"went down, back on {NEAR} {1000 * (back - t_up):.0f} ms after it returned")
    assert first_far - t_down < SANITY_BOUND_S and back - t_up < SANITY_BOUND_S
    late = [a["replica"] for a in answers if a["t_monotonic_s"] > back + IN_FLIGHT_S]
    assert late and set(late) == {NEAR}
