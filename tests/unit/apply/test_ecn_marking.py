"""ECN marking wired into a run, without root: the ``ecn`` / ``tcp_ecn`` / ``tcp_cc`` config
from YAML, the hosts' sysctls, the plan of commands for a whole fabric and the order the
apply layer runs them in (with the commands faked: one tc batch, then one bpftool batch),
the path decided once, the ledger's record of pinned maps, and the summary a run writes.
Nothing here touches /sys/fs/bpf, tc or a namespace."""
from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
from tests.unit.stand_ins import StandInFabric

import testbed.apply.marking as apply
import testbed.apply.network as network
import testbed.apply.state as state
import testbed.errors as errors
from testbed.apply.network import FabricNetwork
from testbed.apply.state import Ledger, clean
from testbed.capabilities import (
    IMPLEMENTED_FEATURES,
    Platform,
    choose_paths,
    probe_capabilities,
)
from testbed.errors import ConfigError
from testbed.harness.console import doctor_report
from testbed.harness.plots import plot_queue_depth
from testbed.experiments.registry import load
from testbed.measure.queues import (
    QueueSeries,
    anchor_errors,
    depth_stats,
    ecn_monitoring,
    ecn_report,
    percentile,
    queue_sampling,
)
from testbed.model.topology import build
from testbed.plan.anchoring import ANCHOR_POLL_S
from testbed.plan.bring_up import host_script
from testbed.plan.ecn_plan import (
    BPF_SOURCE,
    CONFIG_LAYOUT,
    COUNTERS_LAYOUT,
    MAPS,
    MODE_OFF,
    MODE_STEP,
    QDEPTH_LAYOUT,
    layout_struct,
    pack_value,
    unpack_value,
)
from testbed.plan.port_queue import (
    Impairment,
    Port,
    default_buffer_bytes,
    depths_from_qdepth,
    htb_burst_bytes,
    switch_queue_plan,
)
from testbed.plan.profiles import QueueConfig, RedEcn, StepEcn
from testbed.plan.settings import (
    EcnSettings,
    ecn_settings,
    queue_record,
    sysctl_lines,
    tcp_settings,
)
from testbed.system.counters import (
    buffer_stats,
    counter_delta,
    counter_totals,
    parse_qdiscs,
    port_counters,
)

RATE_MBIT = 20.0
MTU = 1500
BUFFER_BYTES = default_buffer_bytes(RATE_MBIT, MTU)  # 50 ms at 20 Mbit/s: 125000 B
K_BYTES = 30_000
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
SAMPLE_INTERVAL_S = 0.002
SAMPLING_WINDOW_S = 0.05
MIN_SAMPLES = 5  # of the 25 a 50 ms window holds at 2 ms, on a loaded CI machine


@pytest.fixture(autouse=True)
def state_dir(tmp_path, monkeypatch) -> Path:
    """The run ledger in a temporary folder, never /run/testbed."""
    folder = tmp_path / "state"
    monkeypatch.setattr(state, "STATE_DIR", folder)
    monkeypatch.setattr(state, "LOCK_PATH", folder / "lock")
    monkeypatch.setattr(state, "LEDGER_PATH", folder / "state.json")
    return folder


def three_hosts_one_leaf():
    """l0h0, l0h1 and l0h2 on leaf l0 (ports 1..3), one spine on port 4."""
    return build("spineleaf", leaves=1, spines=1, hosts_per_leaf=3, host_rate_mbit=RATE_MBIT,
                 mtu_bytes=MTU)


def platform(kconfig: dict[str, str] | None = None, **tools) -> Platform:
    """A machine: the dev VM's kernel (no RED, no DCTCP) unless ``kconfig`` says otherwise;
    every tool present unless named False."""
    config = kconfig or {"CONFIG_MODULES": "n", "CONFIG_NET_SCH_RED": "n",
                         "CONFIG_NET_CLS_BPF": "y", "CONFIG_TCP_CONG_DCTCP": "n",
                         "CONFIG_TCP_CONG_CUBIC": "y"}
    present = {name: True for name in ("tc", "clang", "bpftool")} | tools
    caps = probe_capabilities(config, set(), set(), {"reno", "cubic"}, present)
    return Platform("test", caps, choose_paths(caps))


STOCK_KERNEL = {"CONFIG_NET_SCH_RED": "y", "CONFIG_NET_CLS_BPF": "y", "CONFIG_TCP_CONG_DCTCP": "y",
                "CONFIG_TCP_CONG_CUBIC": "y"}


def scenario(tmp_path, queue: str | None = None, hosts: str | None = None):
    """A one-leaf scenario with the given queue and hosts sections, loaded and resolved."""
    path = tmp_path / "run.yaml"
    path.write_text("name: t\ntopology: {name: spineleaf, leaves: 1, spines: 1, "
                    f"hosts_per_leaf: 3}}\nlink_rate_mbit: {RATE_MBIT}\nmtu_bytes: {MTU}\n"
                    + (f"queue: {queue}\n" if queue else "")
                    + (f"hosts: {hosts}\n" if hosts else ""))
    return load(path)


# --- the queue section from YAML ----------------------------------------------------------------


def test_step_profile_from_yaml(tmp_path):
    resolved = scenario(tmp_path, "{ecn: {profile: step, k_bytes: 30000}}", "{tcp_ecn: true}")
    setup = resolved.setups[0]
    assert setup.queue == QueueConfig(BUFFER_BYTES, StepEcn(K_BYTES))
    assert setup.queue_record["ecn"] is None  # a profile as given: no scaling record
    assert resolved.scenario.queue.path is None and resolved.scenario.queue.sample_ms == 10.0
    assert setup.tcp.ecn is True and setup.tcp.congestion_control is None


def test_red_profile_with_buffer_path_and_sampling_from_yaml(tmp_path):
    resolved = scenario(tmp_path, "{ecn: {profile: red, kmin_bytes: 5000, kmax_bytes: 60000, "
                                  "pmax: 0.01}, buffer_bytes: 90000, path: ebpf, sample_ms: 0}",
                        "{tcp_cc: auto}")
    assert resolved.setups[0].queue == QueueConfig(90_000, RedEcn(5_000, 60_000, 0.01))
    assert (resolved.scenario.queue.path, resolved.scenario.queue.sample_ms) == ("ebpf", 0.0)
    assert resolved.ecn_path == "ebpf"
    assert resolved.setups[0].tcp.requested == "auto"


def test_schemes_take_scaled_defaults_and_keep_the_record(tmp_path):
    setup = scenario(tmp_path, "{ecn: {scheme: dctcp}}").setups[0]
    # 20 packets at 1 Gbit/s scaled to 20 Mbit/s is 600 B, under the floor of two frames.
    assert setup.queue.ecn == StepEcn(2 * MTU)
    (k_record,) = setup.queue_record["ecn"]["ecn"]
    assert k_record["decided_by"] == "frames" and k_record["emulated_rate_mbit"] == RATE_MBIT
    setup = scenario(tmp_path, "{ecn: {scheme: dcqcn}}").setups[0]
    assert isinstance(setup.queue.ecn, RedEcn)
    assert setup.queue.pfc is None and "pfc" not in setup.queue_record  # PFC only when asked
    json.dumps(setup.queue_record)
    setup = scenario(tmp_path, "{ecn: {scheme: dctcp, rtt_s: 0.1}}").setups[0]
    assert setup.queue.ecn.k_bytes == int(RATE_MBIT * 1e6 / 8 * 0.1 / 7) + 1


INVALID_SECTIONS = [
    # (queue section, field named in the error)
    ("{ecn: {profile: step}}", "queue.ecn.k_bytes"),
    ("{ecn: {profile: step, k_bytes: 30000.5}}", "queue.ecn.k_bytes"),
    ("{ecn: {profile: step, k_bytes: 0}}", "queue.ecn.k_bytes"),
    ("{ecn: {profile: step, k_bytes: 125000}}", "queue.ecn.k_bytes"),  # at the buffer
    ("{ecn: {profile: step, k_bytes: 30000, pmax: 0.1}}", "queue.ecn.pmax"),
    ("{ecn: {profile: red, kmin_bytes: 5000, kmax_bytes: 60000}}", "queue.ecn.pmax"),
    ("{ecn: {profile: red, kmin_bytes: 5000, kmax_bytes: 60000, pmax: 2}}", "queue.ecn.pmax"),
    ("{ecn: {profile: red, kmin_bytes: 60000, kmax_bytes: 5000, pmax: 0.1}}",
     "queue.ecn.kmin_bytes"),
    ("{ecn: {profile: red, kmin_bytes: 5000, kmax_bytes: 200000, pmax: 0.1}}",
     "queue.ecn.kmax_bytes"),
    ("{ecn: {profile: pie, k_bytes: 30000}}", "queue.ecn.profile"),
    ("{ecn: {scheme: timely}}", "queue.ecn.scheme"),
    ("{ecn: {scheme: dcqcn, rtt_s: 0.001}}", "queue.ecn.rtt_s"),
    ("{ecn: {scheme: dctcp, k_bytes: 30000}}", "queue.ecn.k_bytes"),
    ("{ecn: {scheme: dctcp, profile: step, k_bytes: 30000}}", "queue.ecn"),
    ("{ecn: {}}", "queue.ecn"),
    ("{buffer_bytes: 0, ecn: {profile: step, k_bytes: 30000}}", "queue.buffer_bytes"),
    ("{path: pie, ecn: {profile: step, k_bytes: 30000}}", "queue.path"),
    ("{sample_ms: -1, ecn: {profile: step, k_bytes: 30000}}", "queue.sample_ms"),
    ("{sample_ms: true, ecn: {profile: step, k_bytes: 30000}}", "queue.sample_ms"),
    ("{ecn: {profile: step, k_bytes: 30000, kbytes: 1}}", "queue.ecn.kbytes"),
    ("{ecn: {profile: step, k_bytes: 30000, path: ebpf}}", "queue.ecn.path"),
    ("{ecn: [step, 30000]}", "queue.ecn"),
]


@pytest.mark.parametrize(("queue", "field"), INVALID_SECTIONS,
                         ids=[text for text, _ in INVALID_SECTIONS])
def test_invalid_queue_sections_name_the_field(tmp_path, queue, field):
    with pytest.raises(ConfigError) as err:
        scenario(tmp_path, queue)
    assert [p.field for p in err.value.problems] == [field], err.value.problems


@pytest.mark.parametrize(("hosts", "field"), [("{tcp_ecn: 1}", "hosts.tcp_ecn"),
                                              ("{tcp_ecn: 'on'}", "hosts.tcp_ecn"),
                                              ("{tcp_cc: bbr}", "hosts.tcp_cc"),
                                              ("{tcp_cc: 3}", "hosts.tcp_cc")])
def test_invalid_hosts_sections_name_the_field(tmp_path, hosts, field):
    with pytest.raises(ConfigError) as err:
        scenario(tmp_path, hosts=hosts)
    assert [p.field for p in err.value.problems] == [field], err.value.problems


def test_no_section_is_no_marking(tmp_path):
    resolved = scenario(tmp_path)
    assert resolved.setups[0].queue is None and resolved.ecn_path is None
    assert ecn_settings(None, RATE_MBIT, MTU, BUFFER_BYTES) is None


# --- host TCP ---------------------------------------------------------------------------------


def test_auto_takes_the_best_congestion_control_the_machine_has_and_turns_ecn_on():
    tcp = tcp_settings(False, "auto", platform())
    assert (tcp.congestion_control, tcp.ecn) == ("cubic", True)
    assert tcp.sysctls() == {"net.ipv4.tcp_ecn": "1", "net.ipv4.tcp_congestion_control": "cubic"}
    assert "cubic+ecn" in tcp.decided_by
    assert tcp_settings(False, "auto", platform(STOCK_KERNEL)).congestion_control == "dctcp"


def test_a_named_congestion_control_is_taken_as_asked_or_refused():
    with pytest.raises(ConfigError) as err:
        tcp_settings(True, "dctcp", platform())
    assert err.value.field == "tcp_cc" and "CONFIG_TCP_CONG_DCTCP not set" in str(err.value)
    dctcp = tcp_settings(False, "dctcp", platform(STOCK_KERNEL))
    assert dctcp.ecn  # DCTCP negotiates ECN by itself
    assert tcp_settings(False, "reno", platform()).sysctls() == {
        "net.ipv4.tcp_congestion_control": "reno"}
    assert tcp_settings(True, None, platform()).sysctls() == {"net.ipv4.tcp_ecn": "1"}
    assert tcp_settings(False, None, platform()).sysctls() == {}
    record = tcp_settings(True, "cubic", platform()).to_dict()
    assert record["requested"] == record["congestion_control"] == "cubic"
    assert record["sysctls"]["net.ipv4.tcp_ecn"] == "1"


def test_host_script_sets_the_sysctls_in_the_hosts_namespace_before_the_link_comes_up():
    fabric = three_hosts_one_leaf()
    plain = host_script(fabric, "l0h0")
    assert "tcp_ecn" not in plain and "congestion" not in plain
    script = host_script(fabric, "l0h0", {"net.ipv4.tcp_ecn": "1",
                                          "net.ipv4.tcp_congestion_control": "cubic"})
    lines = script.splitlines()
    assert lines.index("echo 1 > /proc/sys/net/ipv4/tcp_ecn") < lines.index("ip -batch - <<'EOF'")
    assert "echo cubic > /proc/sys/net/ipv4/tcp_congestion_control" in lines
    assert [line for line in lines if line not in sysctl_lines(
        {"net.ipv4.tcp_ecn": "1", "net.ipv4.tcp_congestion_control": "cubic"})] \
        == plain.splitlines()


@pytest.mark.parametrize("setting", [{"net.ipv4.tcp_ecn": "1; reboot"},
                                     {"net/ipv4/tcp_ecn": "1"}, {"../../x": "1"},
                                     {"net.ipv4.tcp_ecn": ""}])
def test_sysctls_that_are_not_plain_words_are_refused(setting):
    with pytest.raises(ValueError):
        sysctl_lines(setting)


# --- the plan for a fabric --------------------------------------------------------------------

IFINDEX_BASE = 40
OBJ = Path("/opt/tb/ecn_marker.o")


def ifindex_of(fabric):
    names = [intf for _, _, intf, _ in fabric.switch_ends()]
    return lambda intf: IFINDEX_BASE + names.index(intf)


def fabric_plan(path: str, queue: QueueConfig, fabric=None):
    fabric = fabric or three_hosts_one_leaf()
    return switch_queue_plan(fabric, queue, path, ifindex=ifindex_of(fabric), obj=OBJ)


def test_every_shaped_switch_port_is_planned_in_fabric_order():
    plan = fabric_plan("ebpf", QueueConfig(BUFFER_BYTES, StepEcn(K_BYTES)))
    assert [p.intf for p in plan.ports] == ["l0-eth1", "l0-eth2", "l0-eth3", "l0-eth4",
                                            "s0-eth1"]
    assert [p.ifindex for p in plan.ports] == [40, 41, 42, 43, 44]


def test_ebpf_plan_queues_each_port_once_with_the_marker_beside_its_buffer():
    queue = QueueConfig(BUFFER_BYTES, StepEcn(K_BYTES))
    plan = fabric_plan("ebpf", queue)
    lines = plan.tc_batch().splitlines()
    assert len(lines) == 5 * len(plan.ports)
    for i, port in enumerate(plan.ports):
        assert lines[5 * i:5 * i + 5] == [
            f"qdisc replace dev {port.intf} root handle 5: htb default 1",
            f"class replace dev {port.intf} parent 5: classid 5:1 htb rate {RATE_MBIT}mbit "
            f"burst {htb_burst_bytes(RATE_MBIT, MTU)} cburst {htb_burst_bytes(RATE_MBIT, MTU)} "
            f"quantum {MTU + 64}",
            f"qdisc replace dev {port.intf} parent 5:1 handle 10: bfifo limit {BUFFER_BYTES}",
            f"qdisc replace dev {port.intf} clsact",
            f"filter replace dev {port.intf} egress prio 2 handle 1 bpf da obj {OBJ} "
            "sec classifier"]
    # per port: zeroed state, counters, sample and anchor, then the config that switches it on
    assert len(plan.bpftool) == 5 * len(plan.ports)
    for i, port in enumerate(plan.ports):
        group = plan.bpftool[5 * i:5 * i + 5]
        assert [argv[4].rsplit("/", 1)[1] for argv in group] == [
            "ecn_state", "ecn_counters", "ecn_qdepth", "ecn_anchor", "ecn_config"]
        key = group[-1][group[-1].index("key") + 2:][:4]
        assert bytes(int(b, 16) for b in key) == port.ifindex.to_bytes(4, "little")
        start = group[-1].index("value") + 2
        config = unpack_value(CONFIG_LAYOUT, bytes(int(b, 16) for b in group[-1][start:]))
        assert config["mode"] == MODE_STEP and config["k_bytes"] == K_BYTES
        assert config["limit_bytes"] == BUFFER_BYTES
        assert config["rate_bytes_per_s"] == RATE_MBIT * 1e6 / 8
    assert plan.bpftool_batch().splitlines()[0].startswith("map update pinned /sys/fs/bpf/")


def test_red_plan_makes_each_buffer_red_and_nothing_else():
    plan = fabric_plan("red-qdisc", QueueConfig(BUFFER_BYTES, StepEcn(K_BYTES)))
    assert plan.bpftool == [] and plan.bpftool_batch() == ""
    buffers = [line for line in plan.tc if " handle 10: " in line]
    assert [line.split()[3] for line in buffers] == [p.intf for p in plan.ports]
    assert all(line.split()[8] == "red" and line.endswith("ecn nodrop") for line in buffers)
    assert not any(line.startswith(("qdisc del", "qdisc add")) for line in plan.tc)


def test_a_queue_without_ecn_still_sizes_the_buffer_and_the_marker_only_counts():
    queue = QueueConfig(90_000)
    red = fabric_plan("red-qdisc", queue)
    assert [line.split()[8:] for line in red.tc if " handle 10: " in line] == \
        [["bfifo", "limit", "90000"]] * len(red.ports)
    ebpf = fabric_plan("ebpf", queue)
    config_argv = ebpf.bpftool[4]
    start = config_argv.index("value") + 2
    assert unpack_value(CONFIG_LAYOUT, bytes(int(b, 16) for b in config_argv[start:]))[
        "mode"] == MODE_OFF


def test_a_fabric_without_shaped_ports_or_an_unknown_path_is_refused():
    queue = QueueConfig(BUFFER_BYTES, StepEcn(K_BYTES))
    with pytest.raises(ConfigError) as err:
        fabric_plan("ebpf", queue, build("line", switches=2))
    assert err.value.field == "queue"
    with pytest.raises(ConfigError):
        fabric_plan("pie", queue)


# --- the apply layer, with its commands faked -------------------------------------------------


class FakeCommands:
    """Stands in for run_tool: records every command and its input, and answers reads."""

    def __init__(self, ledger_path: Path):
        self.ledger_path = ledger_path
        self.calls: list[tuple[list[str], str | None]] = []
        self.pins_on_record_at_tc: list[str] | None = None
        self.answers: dict[str, str] = {}

    def __call__(self, argv, stdin=None, what=""):
        self.calls.append((list(argv), stdin))
        if argv[:2] == ["tc", "-batch"]:
            self.pins_on_record_at_tc = json.loads(self.ledger_path.read_text())["pinned"]
        for marker, answer in self.answers.items():
            if marker in argv:
                return answer
        return ""


@pytest.fixture
def pins(tmp_path, monkeypatch) -> Path:
    """The marker's pins and the BPF filesystem moved into a temporary folder."""
    folder = tmp_path / "bpffs"
    (folder / "tc" / "globals").mkdir(parents=True)
    monkeypatch.setattr(state, "BPF_FS", folder)
    monkeypatch.setattr(apply, "pinned_map_paths",
                        lambda: [folder / "tc" / "globals" / name for name in
                                 ("ecn_config", "ecn_state", "ecn_counters", "ecn_qdepth")])
    return folder / "tc" / "globals"


@pytest.fixture
def fake(monkeypatch, state_dir, pins) -> FakeCommands:
    """Every tool the apply layer runs faked; the marker already built; interfaces numbered
    from IFINDEX_BASE in fabric order; this machine any detection would find refused."""
    fabric = three_hosts_one_leaf()
    monkeypatch.setattr(network, "read_ifindex", ifindex_of(fabric))
    monkeypatch.setattr(apply, "build_object", lambda obj: False)

    def no_detection():
        raise AssertionError("the path is decided once, by the caller")

    monkeypatch.setattr(apply, "detect", no_detection)
    commands = FakeCommands(state.LEDGER_PATH)
    monkeypatch.setattr(apply, "run_tool", commands)
    monkeypatch.setattr(network, "run_tool", commands)
    return commands


def saved_ledger() -> Ledger:
    ledger = Ledger("run-1", os.getpid())
    ledger.save()
    return ledger


@pytest.fixture
def marking(fake):
    fabric = three_hosts_one_leaf()
    mark = apply.EcnMarking(fabric, QueueConfig(BUFFER_BYTES, StepEcn(K_BYTES)), saved_ledger(),
                            "ebpf", log=lambda m: None)
    return mark, fake


def test_the_fabric_records_the_pins_then_runs_one_tc_batch_then_one_bpftool_batch(fake, pins,
                                                                                   tmp_path):
    fabric = three_hosts_one_leaf()
    queue = QueueConfig(BUFFER_BYTES, StepEcn(K_BYTES))
    net = FabricNetwork(fabric, tmp_path, saved_ledger(), queue=queue, ecn_path="ebpf",
                        log=lambda m: None)
    (pins / "ecn_config").write_text("left by an unrecorded run")
    net._queue_switch_ports()
    plan = switch_queue_plan(fabric, queue, "ebpf", ifindex=ifindex_of(fabric),
                             obj=net.marking.obj)
    assert fake.calls == [(["tc", "-batch", "-"], plan.tc_batch()),
                          (["bpftool", "batch", "file", "-"], plan.bpftool_batch())]
    assert net.marking.ports == plan.ports and net.marking.path == "ebpf"
    # on record (on disk) before tc created them; the stale pin was removed first
    assert fake.pins_on_record_at_tc == [str(p) for p in apply.pinned_map_paths()]
    assert not (pins / "ecn_config").exists()


def test_without_a_queue_the_fabric_shapes_in_one_batch_and_marks_nothing(fake, tmp_path):
    fabric = three_hosts_one_leaf()
    net = FabricNetwork(fabric, tmp_path, saved_ledger(), ecn_path="ebpf", log=lambda m: None)
    assert net.marking is None and net.ecn_path is None
    net._queue_switch_ports()
    assert fake.calls == [(["tc", "-batch", "-"], switch_queue_plan(fabric).tc_batch())]
    assert fake.pins_on_record_at_tc == []


def test_remove_unlinks_the_pins_and_clean_does_after_a_killed_run(marking, pins, tmp_path):
    mark, _ = marking
    mark.prepare([])
    for path in apply.pinned_map_paths():
        path.write_text("pinned map")  # as tc would have left them
    mark.remove()
    assert not any(p.exists() for p in apply.pinned_map_paths())
    # a killed run: the ledger on disk still lists them, and clean removes them
    for path in apply.pinned_map_paths():
        path.write_text("pinned map")
    outside = tmp_path / "not-bpf"
    outside.write_text("keep me")
    stale = Ledger.load()
    stale.pinned += [str(outside), str(pins / ".." / ".." / ".." / "not-bpf")]
    removed = clean(stale, log=lambda m: None)
    assert removed["pinned"] == 4
    assert not any(p.exists() for p in apply.pinned_map_paths())
    assert outside.read_text() == "keep me"


def test_pins_round_trip_in_the_ledger_and_an_older_ledger_still_loads(state_dir):
    ledger = Ledger("run-1", 4242)
    ledger.add_names(pinned=["/sys/fs/bpf/tc/globals/ecn_config"] * 2)
    assert Ledger.load().pinned == ["/sys/fs/bpf/tc/globals/ecn_config"]
    older = json.loads(state.LEDGER_PATH.read_text())
    del older["pinned"]
    state.LEDGER_PATH.write_text(json.dumps(older))
    assert Ledger.load().pinned == []


def test_remove_before_apply_touches_nothing(marking, pins):
    mark, fake = marking
    (pins / "ecn_state").write_text("not ours to remove: never claimed")
    mark.remove()
    assert (pins / "ecn_state").exists() and fake.calls == []


def test_the_red_path_claims_no_pins(fake, pins):
    mark = apply.EcnMarking(three_hosts_one_leaf(), QueueConfig(BUFFER_BYTES), saved_ledger(),
                            "red-qdisc", log=lambda m: None)
    mark.prepare([Port("l0-eth3", 42, RATE_MBIT)])
    assert Ledger.load().pinned == [] and fake.calls == []


def test_a_path_the_machine_cannot_take_is_refused_before_anything_runs(monkeypatch, tmp_path,
                                                                         state_dir):
    monkeypatch.setattr(apply, "detect", lambda: platform(bpftool=False))
    monkeypatch.setattr(apply, "object_is_current", lambda: False)
    with pytest.raises(errors.TestbedError) as err:
        apply.machine_ecn_path()
    assert "bpftool not on PATH" in str(err.value)
    with pytest.raises(errors.TestbedError):  # a fabric left to decide decides before it builds
        FabricNetwork(three_hosts_one_leaf(), tmp_path, Ledger("r", 1),
                      queue=QueueConfig(BUFFER_BYTES))
    monkeypatch.setattr(apply, "detect", lambda: platform(STOCK_KERNEL))
    assert apply.machine_ecn_path() == "red-qdisc"
    assert apply.machine_ecn_path(prefer="ebpf") == "ebpf"
    for undecided in ("pie", None):  # the marking itself never decides
        with pytest.raises(ConfigError):
            apply.EcnMarking(three_hosts_one_leaf(), QueueConfig(BUFFER_BYTES), Ledger("r", 1),
                             undecided)


class FakeMaps:
    """The marker's pinned maps as the bpf system call reads and writes them
    (testbed.apply.bpf_syscall.PinnedMap): {map name: {ifindex: value bytes}}."""

    def __init__(self, entries: dict[str, dict[int, bytes]]):
        self.entries = entries
        self.opened: list[FakeMap] = []
        self.writes: list[tuple[str, dict[int, bytes], int]] = []

    def open(self, path, value_size: int) -> FakeMap:
        name = str(path).rsplit("/", 1)[1]
        assert value_size == layout_struct(MAPS[name]).size
        self.opened.append(FakeMap(self, name))
        return self.opened[-1]


class FakeMap:
    def __init__(self, maps: FakeMaps, name: str):
        self.maps, self.name, self.closed = maps, name, False

    def lookup_many(self, keys):
        wanted = set(keys)
        return {k: v for k, v in self.maps.entries.get(self.name, {}).items() if k in wanted}

    def update_many(self, entries, flags=0):
        self.maps.writes.append((self.name, dict(entries), flags))

    def close(self):
        self.closed = True


def test_counters_and_depths_are_read_per_port_by_system_calls(marking, monkeypatch):
    mark, fake = marking
    mark.prepare(fabric_plan("ebpf", mark.queue).ports)
    l0_eth3 = next(p for p in mark.ports if p.intf == "l0-eth3")
    counters = {"packets": 900, "bytes": 10**6, "ect_packets": 800, "ce_marks": 120,
                "ce_arrived": 0, "not_ect_over": 3, "fifo_drops": 2, "max_queue_bytes": 33_000,
                "anchors": 40, "anchor_error_bytes": -12_000, "anchor_abs_error_bytes": 20_000,
                "anchor_max_abs_error_bytes": 3_000}
    later = time.monotonic_ns() + 10**12  # a sample from the future: nothing drained yet
    maps = FakeMaps({
        "ecn_counters": {l0_eth3.ifindex: pack_value(COUNTERS_LAYOUT, counters)},
        "ecn_qdepth": {l0_eth3.ifindex: pack_value(QDEPTH_LAYOUT, {
            "queue_bytes": 9_000, "time_ns": later, "accepted_bytes": 5 * 10**6})}})
    monkeypatch.setattr(apply, "PinnedMap", maps.open)
    monkeypatch.setattr(apply, "read_qdiscs", lambda: [
        {"kind": "bfifo", "handle": "10:", "dev": "l0-eth3", "packets": 880, "drops": 4,
         "backlog": 1500}])
    read = mark.counters()["l0-eth3"]
    assert (read["marks"], read["ect_packets"], read["max_queue_bytes"]) == (120, 800, 33_000)
    assert (read["virtual_fifo_drops"], read["fifo_drops"], read["sent_packets"]) == (2, 4, 880)
    assert (read["anchors"], read["anchor_error_bytes"], read["anchor_abs_error_bytes"],
            read["anchor_max_abs_error_bytes"]) == (40, -12_000, 20_000, 3_000)
    assert mark.counters()["l0-eth1"]["marks"] == 0
    assert mark.queue_depths() == {p.intf: 9_000 if p is l0_eth3 else 0 for p in mark.ports}
    assert fake.calls == []  # no bpftool process: system calls
    assert [m.name for m in maps.opened] == ["ecn_counters", "ecn_qdepth"]  # each opened once
    mark.reset_counters()
    assert maps.writes == [("ecn_counters", {p.ifindex: bytes(len(pack_value(
        COUNTERS_LAYOUT, {}))) for p in mark.ports}, 0)]
    mark.remove()
    assert all(m.closed for m in maps.opened)


class FakeAgent:
    """Stands in for AnchorAgentProcess: records the plan it was started with."""

    started: list = []

    def __init__(self, workdir, ledger, log):
        self.workdir, self.stopped, self.proc = workdir, False, None

    def start(self, plan, cpus=()):
        FakeAgent.started.append((plan, tuple(cpus)))
        self.proc = SimpleNamespace(pid=4242)

    @property
    def pid(self):
        return self.proc.pid if self.proc is not None else None

    def stop(self):
        self.stopped = True

    def counters(self):
        return {"polls": 10, "poll_gap_ms": {"count": 9, "p50": 2.0, "p99": 2.4, "max": 3.1}}

    def alive(self):
        return not self.stopped


def test_anchoring_starts_where_ports_mark_by_ebpf_and_stops_with_the_marking(
        fake, monkeypatch, tmp_path):
    monkeypatch.setattr(apply, "AnchorAgentProcess", FakeAgent)
    FakeAgent.started = []
    fabric = three_hosts_one_leaf()
    impaired = {"l0-eth3": Impairment(delay_ms=2.0)}
    for queue, path, anchored in [(QueueConfig(BUFFER_BYTES, StepEcn(K_BYTES)), "ebpf", True),
                                  (QueueConfig(BUFFER_BYTES), "ebpf", False),  # only counts
                                  (QueueConfig(BUFFER_BYTES, StepEcn(K_BYTES)), "red-qdisc",
                                   False)]:
        mark = apply.EcnMarking(fabric, queue, saved_ledger(), path, log=lambda m: None,
                                workdir=tmp_path)
        mark.prepare(fabric_plan(path, queue).ports)
        mark.start_anchoring([1], impaired)
        assert (mark.anchor is not None) is anchored
        assert mark.anchor_pids == ([4242] if anchored else [])
        if anchored:
            plan, cpus = FakeAgent.started[-1]
            assert cpus == (1,) and plan.poll_s == ANCHOR_POLL_S
            assert [p.intf for p in plan.ports] == [p.intf for p in mark.ports]
            assert {p.intf: p.delay_ns for p in plan.ports}["l0-eth3"] == 2_000_000
            assert mark.anchoring() == {**FakeAgent(None, None, None).counters(),
                                        "running": True}
            mark.remove()
            assert mark.anchor.stopped and mark.anchoring()["running"] is False
        else:
            assert mark.anchoring() is None
    assert len(FakeAgent.started) == 1


def test_the_fabric_gives_the_marking_its_folder_for_the_anchor_agent(fake, tmp_path):
    net = FabricNetwork(three_hosts_one_leaf(), tmp_path, saved_ledger(),
                        queue=QueueConfig(BUFFER_BYTES, StepEcn(K_BYTES)), ecn_path="ebpf",
                        log=lambda m: None)
    assert net.marking.workdir == tmp_path


# --- what a run reports -----------------------------------------------------------------------


def ports3() -> list[Port]:
    return [Port("l0-eth1", 40, RATE_MBIT), Port("l0-eth3", 42, RATE_MBIT)]


def test_port_counters_from_the_marker_or_from_red():
    buffers = buffer_stats(parse_qdiscs(json.dumps([
        {"kind": "htb", "handle": "5:", "dev": "l0-eth3", "drops": 9},
        {"kind": "red", "handle": "10:", "dev": "l0-eth3", "packets": 500, "drops": 1,
         "backlog": 3000, "marked": 77},
        {"kind": "bfifo", "handle": "10:", "parent": "5:1"},  # a host's, without dev
    ])))
    assert buffers == {"l0-eth3": {"kind": "red", "packets": 500, "drops": 1,
                                   "backlog_bytes": 3000, "marked": 77}}
    red = port_counters(ports3(), None, buffers)
    assert red["l0-eth3"]["marks"] == 77 and red["l0-eth3"]["ect_packets"] is None
    assert red["l0-eth1"]["marks"] == 0 and red["l0-eth1"]["fifo_drops"] == 0
    ebpf = port_counters(ports3(), {42: {"ce_marks": 5, "max_queue_bytes": 31_000}}, buffers)
    assert ebpf["l0-eth3"]["marks"] == 5 and ebpf["l0-eth3"]["max_queue_bytes"] == 31_000
    assert ebpf["l0-eth3"]["fifo_drops"] == 1 and ebpf["l0-eth1"]["ect_packets"] == 0


def test_counters_over_a_window_and_their_totals():
    before = {"l0-eth3": {"marks": 10, "ect_packets": 100, "max_queue_bytes": 3_000,
                          "fifo_drops": 0, "rate_mbit": RATE_MBIT}}
    after = {"l0-eth3": {"marks": 70, "ect_packets": 900, "max_queue_bytes": 33_000,
                         "fifo_drops": 2, "rate_mbit": RATE_MBIT},
             "l0-eth1": {"marks": 0, "ect_packets": None, "max_queue_bytes": None,
                         "fifo_drops": 1, "rate_mbit": RATE_MBIT}}
    delta = counter_delta(before, after)
    assert delta["l0-eth3"] == {"marks": 60, "ect_packets": 800, "max_queue_bytes": 33_000,
                                "fifo_drops": 2, "rate_mbit": RATE_MBIT}
    assert delta["l0-eth1"] == after["l0-eth1"]  # new in the window: as read
    totals = counter_totals(delta)
    assert (totals["marks"], totals["ect_packets"], totals["fifo_drops"]) == (60, 800, 3)
    assert totals["max_queue_bytes"] == 33_000 and totals["ports_marking"] == 1
    assert totals["virtual_fifo_drops"] is None


def test_the_anchoring_errors_over_a_window_per_port_and_in_all():
    before = {"l0-eth3": {"anchors": 100, "anchor_error_bytes": 50_000,
                          "anchor_abs_error_bytes": 90_000, "anchor_max_abs_error_bytes": 6_000}}
    after = {"l0-eth3": {"anchors": 600, "anchor_error_bytes": -450_000,
                         "anchor_abs_error_bytes": 1_590_000,
                         "anchor_max_abs_error_bytes": 9_000},
             "l0-eth1": {"anchors": 500, "anchor_error_bytes": 250_000,
                         "anchor_abs_error_bytes": 250_000, "anchor_max_abs_error_bytes": 1_500},
             "l0-eth2": {"anchors": 0, "anchor_error_bytes": 0, "anchor_abs_error_bytes": 0,
                         "anchor_max_abs_error_bytes": 0}}
    window = counter_delta(before, after)
    errors = anchor_errors(window)
    assert errors["ports"]["l0-eth3"] == {"anchors": 500, "mean_error_bytes": -1_000,
                                          "mean_abs_error_bytes": 3_000,
                                          "max_abs_error_bytes": 9_000}  # a peak, as read
    assert set(errors["ports"]) == {"l0-eth3", "l0-eth1"}  # a port without anchors is left out
    assert (errors["anchors"], errors["mean_error_bytes"], errors["mean_abs_error_bytes"],
            errors["max_abs_error_bytes"]) == (1_000, -250, 1_750, 9_000)
    totals = counter_totals(window)
    assert (totals["anchors"], totals["anchor_max_abs_error_bytes"]) == (1_000, 9_000)
    assert anchor_errors({"l0-eth3": {"anchors": None}}) is None  # the RED path


def test_sampled_depths_drain_to_the_reading_time_and_give_percentiles():
    rate = int(RATE_MBIT * 1e6 / 8)
    samples = {42: {"queue_bytes": 30_000, "time_ns": 1_000_000_000}}
    now = 1_000_000_000 + 4_000_000  # 4 ms later: 10000 B drained
    assert depths_from_qdepth(ports3(), samples, now) == {"l0-eth1": 0,
                                                         "l0-eth3": 30_000 - rate // 250}
    series = QueueSeries(t_s=[0.0, 0.01, 0.02, 0.03],
                         depth_bytes={"l0-eth3": [0, 20_000, 40_000, 10_000]},
                         read_s=[0.001, 0.002, 0.001, 0.002])
    stats = depth_stats(series, threshold_bytes=K_BYTES)
    assert stats["samples"] == 4 and stats["interval_s_mean"] == pytest.approx(0.01)
    port = stats["ports"]["l0-eth3"]
    # sorted 0, 10000, 20000, 40000: p50 at rank 1.5 -> 15000; p99 at rank 2.97 -> 20000 + 0.97 * 20000
    assert (port["p50"], port["p99"], port["max"]) == pytest.approx((15_000, 39_400, 40_000))
    assert port["above_threshold_fraction"] == 0.25 and port["mean"] == 17_500
    assert depth_stats(QueueSeries()) is None
    assert percentile([5, 1, 3], 50) == 3 and percentile([7], 99) == 7


def test_the_sampler_samples_until_the_block_ends_and_records_a_failing_read():
    with queue_sampling(lambda: {"l0-eth3": 1500}, ["l0-eth3"], SAMPLE_INTERVAL_S) as series:
        time.sleep(SAMPLING_WINDOW_S)
    n = len(series.t_s)
    time.sleep(5 * SAMPLE_INTERVAL_S)
    assert len(series.t_s) == n  # stopped with the block
    assert n >= MIN_SAMPLES and series.depth_bytes["l0-eth3"] == [1500] * n
    assert series.t_s == sorted(series.t_s) and series.error is None

    def broken():
        raise RuntimeError("bpftool: no such map")

    with queue_sampling(broken, ["l0-eth3"], SAMPLE_INTERVAL_S) as series:
        time.sleep(SAMPLING_WINDOW_S)
    assert series.error == "RuntimeError: bpftool: no such map" and series.t_s == []


def marked_fabric() -> StandInFabric:
    """What ecn_monitoring needs of a running fabric, the stand-in's: marked ports whose
    counters grow, and depths."""
    def reading(n: int) -> dict:
        marks = 0 if n == 1 else 150
        return {"l0-eth3": {"rate_mbit": RATE_MBIT, "marks": marks, "ect_packets": 10 * marks,
                            "fifo_drops": 0, "max_queue_bytes": 34_000}}

    return StandInFabric(three_hosts_one_leaf(), ecn_path="ebpf", ecn_reading=reading,
                         marked={"l0-eth1": 0, "l0-eth3": 31_000},
                         anchoring={"polls": 25, "running": True})


def test_a_run_with_ecn_records_path_queue_scaling_counters_and_depths(tmp_path):
    settings = ecn_settings({"scheme": "dctcp", "sample_ms": SAMPLE_INTERVAL_S * 1000},
                            RATE_MBIT, MTU, BUFFER_BYTES)
    result: dict = {}
    with ecn_monitoring(marked_fabric(), settings, result):
        time.sleep(SAMPLING_WINDOW_S)
    ecn = result["ecn"]
    assert ecn["path"] == "ebpf"
    assert ecn["queue"] == queue_record(settings.queue) == {
        "buffer_bytes": BUFFER_BYTES, "ecn": {"profile": "step", "k_bytes": 2 * MTU}}
    assert ecn["scaling"]["scheme"] == "dctcp" and ecn["marking_starts_bytes"] == 2 * MTU
    assert ecn["ports"]["l0-eth3"]["marks"] == 150  # over the block only
    assert ecn["totals"]["marks"] == 150 and ecn["totals"]["max_queue_bytes"] == 34_000
    depth = ecn["queue_depth"]
    assert depth["samples"] >= MIN_SAMPLES and depth["ports"]["l0-eth3"]["max"] == 31_000
    assert depth["ports"]["l0-eth3"]["above_threshold_fraction"] == 1.0
    assert ecn["sampler_error"] is None
    assert ecn["samples"]["depth_bytes"]["l0-eth3"][0] == 31_000
    assert ecn["anchoring"] == {"agent": {"polls": 25, "running": True}, "errors": None}
    path = plot_queue_depth(ecn["samples"], ecn, "r1 | spineleaf | 20 Mbit/s", tmp_path / "q.png")
    assert path.read_bytes().startswith(PNG_MAGIC)


def test_without_marking_the_run_has_no_ecn_part():
    result: dict = {}
    with ecn_monitoring(StandInFabric(three_hosts_one_leaf()), None, result):
        pass
    assert result == {}
    settings = EcnSettings(QueueConfig(BUFFER_BYTES), None, None, 0.0)
    report = ecn_report(settings, "red-qdisc", {}, None)
    assert report["queue_depth"] is None and report["marking_starts_bytes"] is None
    assert report["anchoring"] is None


def test_doctor_says_which_ecn_path_this_machine_takes():
    report = doctor_report(platform())
    assert "ecn_marking     ebpf\n" in report + "\n"  # implemented: no "not built yet"
    assert "ecn_marking" in IMPLEMENTED_FEATURES
    last = report.splitlines()[-1]
    assert last.startswith("ECN marking here: ebpf, by the eBPF marker")
    assert "no sch_red: CONFIG_NET_SCH_RED not set" in last and last.endswith("; ready")
    assert doctor_report(platform(bpftool=False)).splitlines()[-1].endswith(
        "cannot run: bpftool not on PATH")
    red = doctor_report(platform(STOCK_KERNEL)).splitlines()[-1]
    assert red.startswith("ECN marking here: red-qdisc, by a RED qdisc") and red.endswith("ready")


# --- building the marker ----------------------------------------------------------------------


def test_the_marker_is_built_once_and_again_when_its_source_changes(tmp_path):
    if shutil.which("clang") is None:
        pytest.fail("clang is not installed; scripts/install.sh installs it")
    source = tmp_path / "ecn_marker.c"
    source.write_bytes(BPF_SOURCE.read_bytes())
    obj = tmp_path / "build" / "bpf" / "ecn_marker.o"
    assert not apply.object_is_current(obj, source)
    assert apply.build_object(obj, source) is True and obj.stat().st_size > 0
    assert apply.object_is_current(obj, source)
    assert apply.build_object(obj, source) is False  # up to date: skipped
    later = obj.stat().st_mtime + 10
    os.utime(source, (later, later))
    assert apply.build_object(obj, source) is True
