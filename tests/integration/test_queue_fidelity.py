"""The verdict's queue checks on a live fabric, each made to fail through a real mechanism:
two TCP flows converge on one switch port, l0-eth3, shaped to 20 Mbit/s with ECN at K.

    l0h0 --\\
            l0 --(l0-eth3, 20 Mbit/s, K = 30 KB)--> l0h2
    l0h1 --/

- As built, every check holds and the run is trusted: the bottleneck's queue stands and it
  sends at its rate; on the eBPF path the marker's model follows the real queue.
- The bottleneck's HTB class slowed below the rate the fabric says it has (``tc class
  change``, as a shaper that falls behind would): its backlog stands and it delivers about
  THROTTLE_FRACTION of its rate, so "backlogged ports deliver their rate" fails, naming it,
  and the run is NOT trusted.
- On the eBPF path, the marker configured with a wrong rate (WRONG_RATE_FACTOR times the
  port's): while the anchor agent grounds it in the real backlog the model still follows the
  queue; with the agent stopped it drains too fast, "ECN marker's model follows the real
  queue" fails and the run is NOT trusted.
Needs root; runs alone (one emulation per machine)."""
from __future__ import annotations

import json
import subprocess
import time

from testbed.apply.bpf_syscall import PinnedMap
from testbed.apply.network import FabricNetwork
from testbed.capabilities import detect
from testbed.measure.fidelity import MIN_BACKLOGGED_DELIVERY_FRACTION, Watch
from testbed.model.topology import build
from testbed.plan.ecn_plan import ECN_PATH_EBPF, marker_config, pinned_map_path
from testbed.plan.port_queue import HTB_OVERHEAD_BYTES, Handles, htb_burst_bytes
from testbed.plan.profiles import QueueConfig, StepEcn
from testbed.plan.settings import tcp_settings
from testbed.system.sockets import wait_listening

RATE_MBIT = 20.0
MTU = 1500
K_BYTES = 30_000
BUFFER_BYTES = 125_000
SENDERS = ("l0h0", "l0h1")
RECEIVER = "l0h2"
BOTTLENECK = "l0-eth3"
BOTTLENECK_LABEL = "l0->l0h2"
BASE_PORT = 5411
FLOW_S = 10
FLOW_TIMEOUT_S = FLOW_S + 20
LISTEN_TIMEOUT_S = 10.0
WARMUP_S = 2.0  # the judged window starts after TCP's slow start
END_MARGIN_S = 1.0
THROTTLE_FRACTION = 0.6  # the slowed shaper's share of the rate the fabric says it has
WRONG_RATE_FACTOR = 2.0  # the misconfigured marker drains its model this much too fast
DELIVERY_CHECK = "backlogged ports deliver their rate"
MARKER_CHECK = "ECN marker's model follows the real queue"


def fabric():
    return build("spineleaf", leaves=1, spines=1, hosts_per_leaf=3, host_rate_mbit=RATE_MBIT,
                 mtu_bytes=MTU)


def flows_under_watch(net) -> tuple:
    """Both flows for FLOW_S under the fidelity watch; the verdict over the judged window."""
    receiver_ip = net.fabric.nodes[RECEIVER].ip
    server = net.host(RECEIVER)
    for i, _ in enumerate(SENDERS):
        server.cmd("iperf3", "-s", "-D", "-1", "-p", str(BASE_PORT + i))
    wait_listening(net.pid(RECEIVER), [BASE_PORT + i for i in range(len(SENDERS))],
                   LISTEN_TIMEOUT_S, f"iperf3 server in {RECEIVER}")
    with Watch(net) as watch:
        t0 = time.monotonic()
        clients = [net.popen(sender, ["iperf3", "-c", receiver_ip, "-p", str(BASE_PORT + i),
                                      "-t", str(FLOW_S), "-J"])
                   for i, sender in enumerate(SENDERS)]
        outputs = [proc.communicate(timeout=FLOW_TIMEOUT_S)[0] for proc in clients]
    mbit = sum(json.loads(out)["end"]["sum_received"]["bits_per_second"] / 1e6
               for out in outputs)
    window = watch.window_s(t0 + WARMUP_S, t0 + FLOW_S - END_MARGIN_S)
    return watch.verdict(window, bandwidth_bound=False), mbit


def check(verdict, name):
    return next(c for c in verdict.checks if c.name == name)


def misconfigure_marker(net, anchored: bool) -> None:
    """The bottleneck's marker entry rewritten with a rate WRONG_RATE_FACTOR too high; the
    anchor agent stopped unless ``anchored``."""
    if not anchored:
        net.marking.anchor.stop()
    port = next(p for p in net.marking.ports if p.intf == BOTTLENECK)
    config = marker_config(port.rate_mbit * WRONG_RATE_FACTOR, net.queue.for_rate(RATE_MBIT))
    with PinnedMap(pinned_map_path("ecn_config"), len(config.pack())) as entries:
        entries.update(port.ifindex, config.pack())


def run(ledger, workdir, throttle: bool = False, wrong_rate: str | None = None):
    """The flows on the fabric as built, or with the bottleneck's shaper slowed
    (``throttle``), or its marker given a wrong rate (``wrong_rate``: "anchored" or
    "unanchored")."""
    tcp = tcp_settings(True, "auto", detect())
    with FabricNetwork(fabric(), workdir, ledger, log=lambda m: None,
                       queue=QueueConfig(BUFFER_BYTES, StepEcn(K_BYTES)),
                       host_sysctls=tcp.sysctls()) as net:
        if wrong_rate is not None:
            misconfigure_marker(net, anchored=wrong_rate == "anchored")
        if throttle:
            burst = htb_burst_bytes(RATE_MBIT, MTU)
            subprocess.run(["tc", "class", "change", "dev", BOTTLENECK, "parent",
                            Handles.HTB, "classid", Handles.LINK_CLASS, "htb", "rate",
                            f"{RATE_MBIT * THROTTLE_FRACTION}mbit", "burst", str(burst),
                            "cburst", str(burst), "quantum", str(MTU + HTB_OVERHEAD_BYTES)],
                           check=True)
        verdict, mbit = flows_under_watch(net)
        path = net.marking.path
    return verdict, mbit, path


def test_as_built_every_queue_check_holds_and_the_run_is_trusted(ledger, tmp_path):
    verdict, mbit, path = run(ledger, tmp_path)
    context = {"path": path, "mbit": mbit, "checks": [c.to_dict() for c in verdict.checks],
               "reasons": verdict.reasons}
    delivery = check(verdict, DELIVERY_CHECK)
    assert delivery.passed and delivery.measured is not None, context  # the bottleneck stood
    assert BOTTLENECK_LABEL in delivery.statement or "1 ports" in delivery.statement, context
    if path == "ebpf":
        assert check(verdict, MARKER_CHECK).passed, context
    else:
        assert MARKER_CHECK not in [c.name for c in verdict.checks], context
    assert verdict.trustworthy, context


def test_a_shaper_draining_below_its_rate_makes_the_run_untrusted(ledger, tmp_path):
    verdict, mbit, path = run(ledger, tmp_path, throttle=True)
    context = {"path": path, "mbit": mbit, "checks": [c.to_dict() for c in verdict.checks],
               "reasons": verdict.reasons}
    delivery = check(verdict, DELIVERY_CHECK)
    assert delivery.passed is False, context
    assert delivery.measured < MIN_BACKLOGGED_DELIVERY_FRACTION, context
    assert BOTTLENECK_LABEL in delivery.statement, context
    assert not verdict.trustworthy, context
    assert any("shaper drained below its rate" in r for r in verdict.reasons), context


def test_a_marker_with_a_wrong_rate_follows_the_queue_only_while_anchored(ledger, tmp_path):
    if detect().paths.ecn_marking != ECN_PATH_EBPF:  # the RED qdisc marks on the real queue
        assert MARKER_CHECK not in [c.name for c in run(ledger, tmp_path)[0].checks]
        return
    verdict, mbit, _ = run(ledger, tmp_path / "anchored", wrong_rate="anchored")
    context = {"mbit": mbit, "checks": [c.to_dict() for c in verdict.checks]}
    assert check(verdict, MARKER_CHECK).passed, context
    verdict, mbit, _ = run(ledger, tmp_path / "unanchored", wrong_rate="unanchored")
    context = {"mbit": mbit, "checks": [c.to_dict() for c in verdict.checks],
               "reasons": verdict.reasons}
    assert check(verdict, MARKER_CHECK).passed is False, context
    assert not verdict.trustworthy, context
    assert any("marked another queue than the real one" in r for r in verdict.reasons), context
