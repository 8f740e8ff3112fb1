"""The anycast request/response service over loopback: each answer names the replica."""
from __future__ import annotations

import io
import json
import socket
import threading

from testbed.traffic.anycast_service import probe, serve


def free_udp_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_probe_logs_every_answer_with_the_replica_name():
    port = free_udp_port()
    threading.Thread(target=serve, args=("127.0.0.1", port, "replica-a"), daemon=True).start()
    for _ in range(100):  # until the server thread has bound its socket
        warm = io.StringIO()
        probe("127.0.0.1", port, interval_s=0.01, duration_s=0.02, out=warm)
        if warm.getvalue():
            break
    out = io.StringIO()
    probe("127.0.0.1", port, interval_s=0.01, duration_s=0.3, out=out)
    answers = [json.loads(line) for line in out.getvalue().splitlines()]
    assert len(answers) >= 20
    assert {a["replica"] for a in answers} == {"replica-a"}
    seqs = [a["seq"] for a in answers]
    assert seqs == sorted(seqs) and len(set(seqs)) == len(seqs)
    times = [a["t_monotonic_s"] for a in answers]
    assert times == sorted(times)
