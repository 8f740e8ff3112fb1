"""The iperf3 flow program's command line, as the flow driver writes it, and the bound on its
report's size that sizes the binding's pipe."""
from __future__ import annotations

from testbed.drive.flows import FLOW_PROGRAM, client_argv, server_argv
from testbed.traffic.iperf3_flow import (
    REPORT_BASE_BYTES,
    arguments,
    report_bytes,
)

# Reports measured over loopback with libiperf 3.12 (1 stream for 1 s; 4 streams for 1 s
# omitted + 2 s), which the bound must cover.
MEASURED_REPORT_BYTES = {(1, 0, 1): 2678, (2, 1, 4): 9242}


def test_the_driver_runs_the_program_by_its_module_name():
    assert server_argv(5400)[1:3] == ["-m", FLOW_PROGRAM]
    assert client_argv("10.0.0.2", 5400, 10, 2, 1, 0)[1:3] == ["-m", FLOW_PROGRAM]


def test_the_driver_s_client_line_parses_to_the_flow_it_asked_for():
    args = arguments().parse_args(client_argv("10.0.3.3", 5401, 12, 3, 4, 0x20)[3:])
    assert (args.role, args.server, args.port, args.seconds, args.omit_s, args.streams,
            args.tos) == ("client", "10.0.3.3", 5401, 12, 3, 4, 0x20)


def test_the_driver_s_server_line_parses_to_one_port():
    args = arguments().parse_args(server_argv(5402)[3:])
    assert (args.role, args.port) == ("server", 5402)


def test_the_report_bound_covers_measured_reports_and_grows_with_the_flow():
    for (seconds, omit_s, streams), measured in MEASURED_REPORT_BYTES.items():
        assert report_bytes(seconds, omit_s, streams) >= measured
    assert report_bytes(1, 0, 1) > REPORT_BASE_BYTES
    assert report_bytes(20, 0, 1) > report_bytes(10, 0, 1)
    assert report_bytes(10, 2, 1) > report_bytes(10, 0, 1)
    assert report_bytes(10, 0, 8) > report_bytes(10, 0, 1)
