"""The rxe probe's pure parts (testbed.apply.rxe_probe): the GID it picks, the ways it tries to
connect, its verdict on each, and when ``testbed doctor`` runs it. The probe itself builds
namespaces and needs a kernel with rdma_rxe (tests/vm/test_roce_rxe.py runs it)."""
from __future__ import annotations

from contextlib import contextmanager

import pytest

from testbed.apply import rxe_probe
from testbed.apply.rxe_probe import (
    Outcome,
    RxeProbe,
    Variant,
    ipv4_mapped_gid,
    judge,
    read_gid_table,
    roce_v2_gid_index,
    variants,
)
from testbed.capabilities import Capability, Platform, choose_paths
from testbed.errors import BusyError

CLIENT_GID = "0000:0000:0000:0000:0000:ffff:0afe:0001"
PERFTEST_ROW = (" #bytes     #iterations    BW peak[Gb/sec]    BW average[Gb/sec]   MsgRate[Mpps]\n"
                " 65536      1520             0.019              0.018               0.000035\n")


def test_the_gid_of_an_ipv4_address_as_sysfs_writes_it():
    assert ipv4_mapped_gid("10.254.0.1") == CLIENT_GID


def test_the_roce_v2_gid_of_the_address_is_chosen():
    table = {0: ("fe80:0000:0000:0000:0000:00ff:fe00:0001", "IB/RoCE v1"),
             1: ("fe80:0000:0000:0000:0000:00ff:fe00:0001", "RoCE v2"),
             2: (CLIENT_GID, "IB/RoCE v1"), 3: (CLIENT_GID, "RoCE v2")}
    assert roce_v2_gid_index(table, "10.254.0.1") == 3
    assert roce_v2_gid_index({k: v for k, v in table.items() if k != 3}, "10.254.0.1") is None


def test_the_gid_table_is_read_from_sysfs(tmp_path):
    port = tmp_path / "rxe_a" / "ports" / "1"
    (port / "gids").mkdir(parents=True)
    (port / "gid_attrs" / "types").mkdir(parents=True)
    entries = {0: ("fe80:0000:0000:0000:0000:00ff:fe00:0001\n", "IB/RoCE v1\n"),
               1: (CLIENT_GID + "\n", "RoCE v2\n"),
               10: ("0000:0000:0000:0000:0000:0000:0000:0000\n", None)}  # empty: no type
    for index, (gid, kind) in entries.items():
        (port / "gids" / str(index)).write_text(gid)
        if kind is not None:
            (port / "gid_attrs" / "types" / str(index)).write_text(kind)
    assert read_gid_table("rxe_a", root=tmp_path) == {
        0: ("fe80:0000:0000:0000:0000:00ff:fe00:0001", "IB/RoCE v1"), 1: (CLIENT_GID, "RoCE v2")}


def test_every_variant_connects_a_client_to_a_server_in_the_other_namespace():
    tried = variants(("rxe_c", "rxe_s"), (3, 5), "10.254.0.2", port=18600)
    assert [v.name for v in tried] == ["perftest-rdma-cm", "perftest-gid", "rc-pingpong-gid",
                                       "rping"]
    cm, gid, pingpong, rping = tried
    assert "-R" in cm.server and "-R" in cm.client and cm.client[-1] == "10.254.0.2"
    assert cm.client[cm.client.index("-d") + 1] == "rxe_c"
    assert "-R" not in gid.client and gid.client[gid.client.index("-x") + 1] == "3"
    assert gid.server[gid.server.index("-x") + 1] == "5"
    assert gid.server[gid.server.index("-d") + 1] == "rxe_s"
    assert pingpong.client[-1] == "10.254.0.2" and "-g" in pingpong.server
    assert rping.server[:2] == ["rping", "-s"] and rping.client[:2] == ["rping", "-c"]
    assert rping.client[rping.client.index("-a") + 1] == "10.254.0.2"


def test_variants_that_need_a_gid_the_kernel_did_not_make_say_so():
    tried = variants(("rxe_c", "rxe_s"), (None, 5), "10.254.0.2")
    assert [v if isinstance(v, str) else v.name for v in tried] == [
        "perftest-rdma-cm", "perftest-gid: no RoCE v2 GID for the address of rxp0",
        "rc-pingpong-gid: no RoCE v2 GID for the address of rxp0", "rping"]


def test_the_verdict_on_each_variant():
    cm = Variant("perftest-rdma-cm", ["ib_write_bw"], ["ib_write_bw", "10.254.0.2"])
    assert judge(cm, 0, PERFTEST_ROW, "").connected
    assert judge(cm, 0, PERFTEST_ROW, "").detail == "connected, RDMA WRITE at 18.0 Mbit/s"
    unreachable = judge(cm, 1, "Unexpected CM event bl blka 7\n Unable to init the socket "
                        "connection\n", "")
    assert not unreachable.connected
    assert unreachable.detail == ("exit 1: Unexpected CM event bl blka 7 / Unable to init the "
                                  "socket connection")
    assert not judge(cm, 0, "no result row\n", "").connected  # perftest must report
    hung = judge(cm, None, "", "waiting for a client\n")
    assert not hung.connected and hung.detail.startswith("client hung past")
    rping = Variant("rping", ["rping", "-s"], ["rping", "-c"])
    assert judge(rping, 0, "ping data: rdma-ping-0\n", "").connected


def test_the_capability_is_the_testbeds_own_variant():
    found = RxeProbe("netns shared copy-on-fork on", (1, 1), [
        Outcome("perftest-rdma-cm", False, "exit 1: Unexpected CM event bl blka 7"),
        Outcome("perftest-gid", True, "connected, RDMA WRITE at 90.0 Mbit/s")])
    cap = found.capability()
    assert (cap.name, cap.available) == ("rxe_netns", False)
    assert cap.detail == ("perftest-rdma-cm between two namespaces: exit 1: Unexpected CM "
                          "event bl blka 7")
    assert found.rows()[1] == ("perftest-gid", "yes", "connected, RDMA WRITE at 90.0 Mbit/s")
    broken = RxeProbe("", (None, None), [], error="rdma link add on rxp0-eth0: failed")
    assert not broken.capability().available
    assert broken.capability().detail == "probe failed: rdma link add on rxp0-eth0: failed"


def stock_platform() -> Platform:
    caps = {"rdma_rxe": Capability("rdma_rxe", True, "loadable module rdma_rxe")}
    return Platform("6.1.0-test", caps, choose_paths(caps))


@contextmanager
def fake_machine(run_id, log=print):
    yield "ledger"


def test_doctor_probes_only_where_it_can():
    everything = lambda tool: f"/usr/bin/{tool}"  # noqa: E731
    no_rxe = Platform("6.18-test", {}, choose_paths({}))
    assert rxe_probe.probe_platform(no_rxe, fake_machine, is_root=True, which=everything)[2] \
        == "rxe probe: not run (no rdma_rxe here)"
    assert "needs root" in rxe_probe.probe_platform(stock_platform(), fake_machine,
                                                    is_root=False, which=everything)[2]
    line = rxe_probe.probe_platform(stock_platform(), fake_machine, is_root=True,
                                    which=lambda tool: None)[2]
    assert line == ("rxe probe: not run (rdma, ib_write_bw missing; scripts/install.sh "
                    "installs them)")

    @contextmanager
    def busy(run_id, log=print):
        raise BusyError("another testbed run is active (pid 1, run x)")
        yield

    platform, found, line = rxe_probe.probe_platform(stock_platform(), busy, is_root=True,
                                                     which=everything)
    assert found is None and platform.paths.rdma == "rxe"
    assert line == "rxe probe: not run (another testbed run is active (pid 1, run x))"


@pytest.mark.parametrize("connected, rdma", [(True, "rxe"), (False, "userspace-roce")])
def test_doctor_takes_the_probes_decision(monkeypatch, connected, rdma):
    found = RxeProbe("netns shared copy-on-fork on", (1, 1),
                     [Outcome("perftest-rdma-cm", connected, "detail")])
    monkeypatch.setattr(rxe_probe, "probe", lambda ledger, log, which: found)
    platform, got, line = rxe_probe.probe_platform(stock_platform(), fake_machine,
                                                   is_root=True, which=lambda t: t)
    assert got is found and platform.paths.rdma == rdma
    assert platform.capabilities["rxe_netns"].available is connected
    assert line.startswith("rxe probe (netns shared copy-on-fork on): rxe ")
