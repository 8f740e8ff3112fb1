"""RoCEv2 over the kernel's softRoCE (rxe) across the fabric on a stock kernel, with the
user-space engine's figure beside it on the same fabric.

The rxe probe (testbed.apply.rxe_probe) decides first whether rxe connects two network
namespaces on this kernel, by trying:

- it connects: perftest's RDMA WRITE from l0h0 to l0h1 through the leaf (OVS kernel datapath)
  moves at least RXE_MIN_SHARE of the link's rate, and a capture of it at l0h1 decodes in
  tshark as RoCE (every frame an InfiniBand BTH over UDP 4791) with every ICRC verified by
  scapy;
- it does not: the testbed takes the user-space engine for RoCE (doctor's rdma path), and the
  probe's capability says which way of connecting failed and how.

Either way the user-space engine moves verified data between the same two hosts, and both
figures are printed side by side. Runs only in the stock-kernel guest (make vm-test).

    l0h0 --- l0 --- l0h1        (a spine-leaf with one leaf, MTU 1500)
"""
from __future__ import annotations

from testbed.apply.network import FabricNetwork
from testbed.apply.rxe_probe import probe
from testbed.capabilities import RXE_NETNS, detect, fabric_datapath, with_probe
from testbed.drive.roce_flows import RoceCapture, RoceSettings, run_roce_flows
from testbed.model.bench import bench_fabric
from testbed.measure.roce import capture_checks, decode_capture

# The lead chooses these after measuring in the guest (software emulation is about ten times
# slower than the host; rxe has no congestion control, so the port's buffer decides its loss).
RATE_MBIT = 10.0
MTU = 1500
RXE_SECONDS = 5.0
RXE_MIN_SHARE = 0.5  # of the link's rate, moved by perftest's RDMA WRITE over rxe
ENGINE_MESSAGES, MESSAGE_BYTES = 10, 65536
PAIR = [("l0h0", "l0h1")]


def test_roce_runs_over_rxe_across_the_fabric_or_the_probe_sends_it_to_the_engine(ledger,
                                                                                   tmp_path):
    found = probe(ledger, log=print)
    print(f"rxe probe ({found.netns_mode}), GID indexes {found.gid_indexes}:")
    for row in found.rows():
        print("  ", *row)
    assert found.error is None, found.error  # the probe itself ran
    assert found.outcomes and found.outcomes[0].name == "perftest-rdma-cm"
    platform = with_probe(detect(), found.capability())
    over_rxe = platform.paths.rdma == "rxe"
    assert over_rxe is found.outcomes[0].connected

    folders = {name: tmp_path / name for name in ("fabric", "engine", "rxe")}
    for folder in folders.values():
        folder.mkdir()
    rxe_run = capture = None
    with FabricNetwork(bench_fabric(1, RATE_MBIT, MTU), folders["fabric"], ledger,
                       datapath=fabric_datapath(platform.paths), log=print) as net:
        engine_run = run_roce_flows(net, PAIR, RoceSettings(
            count=ENGINE_MESSAGES, message_bytes=MESSAGE_BYTES, link_rate_mbit=RATE_MBIT),
            folders["engine"])
        if over_rxe:
            with RoceCapture(net, "l0h1", folders["rxe"]) as capture:
                rxe_run = run_roce_flows(net, PAIR, RoceSettings(
                    duration_s=RXE_SECONDS, message_bytes=MESSAGE_BYTES, transport="rxe"),
                    folders["rxe"])
    engine = engine_run.senders[0]
    rxe = rxe_run.senders[0] if rxe_run is not None else None
    print(f"RoCE at {RATE_MBIT:g} Mbit/s: user-space engine "
          f"{engine and engine.get('goodput_mbit')} Mbit/s (data verified: "
          f"{engine and engine.get('data_verified')}); rxe "
          + (f"{rxe and rxe.get('goodput_mbit')} Mbit/s" if over_rxe
             else f"not taken: {platform.capabilities[RXE_NETNS].detail}"))

    assert engine_run.errors == [] and engine["data_verified"], engine_run.errors
    assert engine["messages"] == ENGINE_MESSAGES
    if not over_rxe:
        assert platform.paths.rdma == "userspace-roce"
        assert platform.capabilities[RXE_NETNS].detail.startswith(
            "perftest-rdma-cm between two namespaces: ")
        return
    assert rxe_run.errors == [], rxe_run.errors
    assert rxe["transport"] == "rxe" and rxe["bytes_delivered"] > 0
    assert rxe["goodput_mbit"] >= RXE_MIN_SHARE * RATE_MBIT, rxe
    decoded = decode_capture(capture.path)
    print(decoded)
    assert all(c.passed for c in capture_checks(decoded)), decoded
