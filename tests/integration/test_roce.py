"""RoCE between emulated hosts: verified data over the user-space engine with and without
loss (the eBPF loss program, no netem), a capture decoded by tshark with every ICRC verified
by scapy, and the softRoCE (rxe) path where the kernel has it (the scenarios are in
test_roce_scenarios.py). Needs root; runs alone.

    l0h0 --- l0 --- l0h1        (a spine-leaf with one leaf, 20 Mbit/s, MTU 1500)
"""
from __future__ import annotations

import pytest

from testbed.apply.network import FabricNetwork
from testbed.capabilities import detect
from testbed.drive.roce_flows import RoceCapture, RoceSettings, run_roce_flows
from testbed.measure.roce import capture_checks, decode_capture
from testbed.model.bench import bench_fabric
from testbed.plan.loss_plan import Loss, link_cuts

RATE_MBIT = 20.0
MTU = 1500
LOSS = 0.01                   # 1% each way on the sender's link
MESSAGES, MESSAGE_BYTES = 20, 200_000
LOSS_TOLERANCE = 0.5          # the applied fraction within half of 1% (binomial, ~4000 packets)


def fabric():
    return bench_fabric(1, RATE_MBIT, MTU)


def flows(net, tmp_path, **settings):
    run = run_roce_flows(net, [("l0h0", "l0h1")], RoceSettings(
        count=MESSAGES, message_bytes=MESSAGE_BYTES, **settings), tmp_path)
    return run, run.senders[0]


def test_verified_data_between_two_hosts_with_a_decoded_capture(ledger, tmp_path):
    with FabricNetwork(fabric(), tmp_path, ledger, log=lambda m: None) as net:
        with RoceCapture(net, "l0h1", tmp_path) as capture:
            run, sent = flows(net, tmp_path, link_rate_mbit=RATE_MBIT)
    assert run.errors == [] and sent["data_verified"], run.errors
    assert sent["messages"] == MESSAGES and sent["retransmitted_packets"] == 0
    assert sent["sha256_sender"] == sent["sha256_receiver"]
    decoded = decode_capture(capture.path)
    print(decoded)
    assert decoded["error"] is None
    assert decoded["tshark"]["frames"] >= 100
    # every frame decodes down to the BTH, every ICRC verifies, every IP ID is 0
    assert all(c.passed for c in capture_checks(decoded)), decoded
    assert decoded["scapy"]["ip_id_zero"] == decoded["scapy"]["packets"]


def test_verified_data_through_the_ebpf_loss_program(ledger, tmp_path):
    f = fabric()
    with FabricNetwork(f, tmp_path, ledger, log=lambda m: None,
                       losses=[(cut, Loss(LOSS)) for cut in link_cuts(f, "l0h0", "l0")]) as net:
        run, sent = flows(net, tmp_path, link_rate_mbit=RATE_MBIT)
        counters = net.loss_counters()
        switches = net.switch_counters()
    print(sent and {k: sent[k] for k in ("goodput_mbit", "retransmitted_packets", "naks",
                                         "timeouts")}, counters)
    assert run.errors == [] and sent["data_verified"], run.errors
    assert sent["retransmitted_packets"] > 0 and sent["naks"] + sent["timeouts"] > 0
    assert counters["dropped"] > 0
    applied = counters["dropped"] / counters["matched"]
    assert abs(applied - LOSS) <= LOSS_TOLERANCE * LOSS, applied
    assert switches["impairment_drops"] == counters["dropped"]


def test_softroce_moves_data_between_two_hosts(ledger, tmp_path):
    """The rxe path: a device on each host's interface, perftest's RDMA WRITE between them.
    Where the kernel has no rdma_rxe, or the rxe probe finds that it does not connect two
    namespaces (testbed.apply.rxe_probe), this is reported as skipped with the reason, never
    as a pass. (The stock-kernel suite asserts either outcome: tests/vm/test_roce_rxe.py.)"""
    from testbed.apply.rxe_probe import probe
    from testbed.capabilities import with_probe

    rxe = detect().capabilities["rdma_rxe"]
    if not rxe.available:
        pytest.skip(f"this kernel has no rdma_rxe: {rxe.detail}")
    probed = probe(ledger, log=print).capability()
    if with_probe(detect(), probed).paths.rdma != "rxe":
        pytest.skip(f"rxe does not connect two namespaces here: {probed.detail}")
    with FabricNetwork(fabric(), tmp_path, ledger, log=lambda m: None) as net:
        with RoceCapture(net, "l0h1", tmp_path) as capture:
            run = run_roce_flows(net, [("l0h0", "l0h1")], RoceSettings(
                duration_s=5.0, message_bytes=65536, transport="rxe"), tmp_path)
    print(run.senders, run.servers, run.errors)
    assert run.errors == [], run.errors
    sent = run.senders[0]
    assert sent["transport"] == "rxe" and sent["goodput_mbit"] > 0.5 * RATE_MBIT
    decoded = decode_capture(capture.path)
    # the kernel's own RoCEv2 packets: tshark decodes them and scapy verifies their ICRC
    assert all(c.passed for c in capture_checks(decoded)), decoded
