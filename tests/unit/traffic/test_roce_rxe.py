"""The softRoCE path's pure parts (testbed.traffic.roce.rxe): the rdma and perftest command
lines, the devices rdma lists on an interface, perftest's report and its failures. The path
itself needs a kernel with rdma_rxe (tests/integration/test_roce.py)."""
from __future__ import annotations

import json

from testbed.traffic.roce import rxe

PERFTEST_OUTPUT = """\
---------------------------------------------------------------------------------------
                    RDMA_Write BW Test
 Dual-port       : OFF          Device         : rxe_l0h0-eth0
---------------------------------------------------------------------------------------
 #bytes     #iterations    BW peak[Gb/sec]    BW average[Gb/sec]   MsgRate[Mpps]
 65536      1520           0.019              0.018                0.000035
---------------------------------------------------------------------------------------
"""


def test_the_device_is_named_after_its_interface_and_made_by_rdma():
    assert rxe.device_name("l0h0-eth0") == "rxe_l0h0-eth0"
    assert rxe.link_add_argv("l0h0-eth0") == ["rdma", "link", "add", "rxe_l0h0-eth0", "type",
                                              "rxe", "netdev", "l0h0-eth0"]
    shown = json.dumps([{"ifindex": 1, "ifname": "rxe_l0h0-eth0", "port": 1,
                         "netdev": "l0h0-eth0"},
                        {"ifindex": 2, "ifname": "rxe_other", "port": 1, "netdev": "eth9"}])
    assert rxe.devices_on(shown, "l0h0-eth0") == ["rxe_l0h0-eth0"]
    assert rxe.devices_on("", "l0h0-eth0") == []


def test_perftest_runs_rdma_write_through_rdma_cm():
    server = rxe.perftest_argv("rxe_a", 10.4, 65536, 1024, 18516)
    assert server == ["ib_write_bw", "-d", "rxe_a", "-R", "-F", "--report_gbits", "-p",
                      "18516", "-s", "65536", "-m", "1024", "-D", "10"]
    assert rxe.perftest_argv("rxe_a", 0.2, 65536, 1024, 18516, "10.0.0.3")[-3:] == \
        ["-D", "1", "10.0.0.3"]


def test_perftests_report_and_its_failures():
    report = rxe.parse_perftest(PERFTEST_OUTPUT)
    assert report == {"message_bytes": 65536, "iterations": 1520, "peak_gbit": 0.019,
                      "average_gbit": 0.018, "msg_rate_mpps": 0.000035}
    assert rxe.parse_perftest("Couldn't connect to 10.0.0.3:18515\n") is None
    assert "could not connect over rxe" in rxe.rxe_problem("Failed to create QP\n")
    assert rxe.rxe_problem(" No IB devices found\n").startswith("no rxe device")
    assert rxe.rxe_problem("") == "perftest printed nothing"


def test_a_host_without_the_path_prints_its_error_as_json(capsys):
    code = rxe.main(["send", "--bind", "192.0.2.1", "--peer", "192.0.2.2", "--duration-s", "1"])
    out = json.loads(capsys.readouterr().out)
    assert code == 1 and out["transport"] == "rxe" and out["errors"]
    assert out["data_verified"] is None  # perftest never checks the bytes
