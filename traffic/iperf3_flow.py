"""One end of an iperf3 TCP flow, driven through libiperf's Python binding (the ``iperf3``
package, a ctypes wrapper of the libiperf that the distribution's iperf3 package installs),
run inside a host as a program of its own:

    python -m testbed.traffic.iperf3_flow server --port 5400
    python -m testbed.traffic.iperf3_flow client --server 10.0.0.2 --port 5400 --seconds 10 \\
        --omit-s 2 --streams 1 --tos 0

``server`` answers one test, then exits (``iperf3 -s -1``). ``client`` prints the test's
report: the JSON document ``iperf3 -J`` prints, since libiperf writes both, or
{"error": "..."} when the test failed; its exit status is then 1.
"""
from __future__ import annotations

import argparse
import fcntl
import os
import sys

import iperf3

# Bounds on the size of a client's report, from reports of 1-4 streams over 1-3 s (about 2.7
# KB for 1 stream over 1 s, 9.2 KB for 4 over 3): the part every report has, and each
# second's and each stream's share, with room to spare.
REPORT_BASE_BYTES = 16 * 1024
REPORT_BYTES_PER_STREAM_SECOND = 1024
REPORT_BYTES_PER_STREAM = 2048


def report_bytes(seconds: int, omit_s: int, streams: int) -> int:
    """An upper bound on a client's JSON report: one interval per second (the omitted ones
    included), each with a record per stream and their sum, then a summary per stream."""
    return (REPORT_BASE_BYTES + (seconds + omit_s) * (streams + 1) * REPORT_BYTES_PER_STREAM_SECOND
            + streams * REPORT_BYTES_PER_STREAM)


def serve(port: int) -> None:
    """Answer one test on ``port``; the human-readable text libiperf prints goes to stdout."""
    server = iperf3.Server(verbose=False)
    server.port = port
    server.json_output = False  # libiperf then writes to stdout, not to the wrapper's pipe
    server.run()


def run_client(server_ip: str, port: int, seconds: int, omit_s: int, streams: int,
               tos: int) -> iperf3.TestResult:
    """One test of ``streams`` parallel TCP connections to ``server_ip``, measured for
    ``seconds`` after ``omit_s`` left out, its packets carrying IP TOS ``tos``; its report
    (``.text`` the JSON document, ``.error`` None unless the test failed)."""
    client = iperf3.Client(verbose=False)
    client.server_hostname = server_ip
    client.port = port
    client.duration = seconds
    client.omit = omit_s
    client.num_streams = streams
    # The wrapper has no setter for the TOS byte (iperf3 -S): libiperf's own, on its test.
    client.lib.iperf_set_test_tos(client._test, tos)
    # libiperf writes the report into the wrapper's pipe, which the wrapper reads only after
    # the test: a report larger than the pipe would block the writer for ever.
    fcntl.fcntl(client._pipe_in, fcntl.F_SETPIPE_SZ,
                max(report_bytes(seconds, omit_s, streams), os.sysconf("SC_PAGE_SIZE")))
    return client.run()


def arguments() -> argparse.ArgumentParser:
    """The command line: ``server`` or ``client`` and their flags."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="role", required=True)
    server = sub.add_parser("server", help="answer one test, then exit")
    server.add_argument("--port", type=int, required=True)
    client = sub.add_parser("client", help="run one test and print its JSON report")
    client.add_argument("--server", required=True, help="the server's IP address")
    client.add_argument("--port", type=int, required=True)
    client.add_argument("--seconds", type=int, required=True, help="measured seconds")
    client.add_argument("--omit-s", type=int, default=0, help="start-up seconds left out")
    client.add_argument("--streams", type=int, default=1, help="parallel TCP connections")
    client.add_argument("--tos", type=int, default=0, help="IP TOS byte (DSCP << 2)")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = arguments().parse_args(argv)
    if args.role == "server":
        serve(args.port)
        return 0
    result = run_client(args.server, args.port, args.seconds, args.omit_s, args.streams,
                        args.tos)
    sys.stdout.write(result.text + "\n")
    return 0 if result.error is None else 1


if __name__ == "__main__":
    sys.exit(main())
