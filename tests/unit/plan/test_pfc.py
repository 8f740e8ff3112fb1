"""PFC without root: the per-class queues' tc commands (testbed.plan.port_queue), the fast pause-frame decoder against
scapy's, the ports' state machines, the pause agent's plan, the headroom's fan-in, the
agent's netlink messages and parsers, the run summary's arithmetic, the kick frame, and
which ports feed which queue (and the acyclic pause dependencies that gives up/down routing).
No namespaces, no netlink socket is opened: the agent's kernel side is fed hand-built
bytes."""
from __future__ import annotations

import itertools
import json
import random
import struct

import networkx as nx
import pytest
from scapy.contrib.mac_control import MACControlPause
from scapy.layers.inet import IP, UDP
from scapy.layers.l2 import ARP, Ether

from testbed.apply.pfc_runtime import pfc_totals
from testbed.controllers.routing.dragonfly import DRAGONFLY_MODES
from testbed.controllers.routing.ecmp import MODES as ROUTING_MODES
from testbed.errors import ConfigError
from testbed.model import topology
from testbed.model.topology.base import AGGREGATION, CORE, EDGE, Fabric, intf_name
from testbed.model.topology.fattree import fat_tree
from testbed.plan import scaling
from testbed.plan.bring_up import host_script
from testbed.plan.pfc import (
    PAUSE,
    RESUME,
    SHORTEST_PATH_MODES,
    XOFF,
    XON,
    AgentPlan,
    PauseSender,
    PauseTimer,
    QueueWatch,
    agent_plan,
    feeding_ports,
    ports_to_pause,
    switch_fan_in,
)
from testbed.plan.pfc_frames import (
    KICK_ETHERTYPE,
    PFC_DST_MAC,
    PfcFrame,
    decode_pfc_frame,
    kick_frame,
    parse_pfc_frame,
    pause_duration_s,
    pfc_frame,
    refresh_interval_s,
    xoff_frame,
    xon_frame,
)
from testbed.plan.port_queue import (
    PAUSED_RATE,
    Handles,
    htb_burst_bytes,
    paused_tbf,
    port_plan,
    running_tbf,
    switch_queue_plan,
)
from testbed.plan.profiles import (
    DEFAULT_CLASSES,
    DEFAULT_PRIORITY,
    MAX_PAUSE_QUANTA,
    PFC_CLASSES,
    PfcConfig,
    QueueConfig,
    TrafficClass,
)
from testbed.system.counters import lossless_drops, parse_qdiscs, queue_drops
from testbed.system.netlink import QdiscBacklogs, rate_bytes_per_s, tbf_change_message

RATE_MBIT = 20.0
MTU = 1500
BUFFER_BYTES = 125_000  # 50 ms at 20 Mbit/s
REACTION_TIME_S = 0.005
INTF = "l0-eth1"
SRC_MAC = "02:00:00:00:00:01"
LOSSLESS = 3  # DEFAULT_CLASSES' RoCE priority
TIME_TOLERANCE_S = 1e-9  # float noise in sums of pause times
SHARE_TOLERANCE_MBIT = 1e-3  # the class rates are printed with 6 significant digits
# Kernel values the agent's netlink messages must carry (linux/rtnetlink.h, pkt_sched.h).
RTM_NEWQDISC = 36
NLM_F_REQUEST, NLM_F_ACK = 0x1, 0x4
TCA_KIND, TCA_OPTIONS, TCA_STATS = 1, 2, 3
TCA_TBF_PARMS, TCA_TBF_BURST = 1, 6
NLA_F_NESTED = 0x8000
TC_LINKLAYER_ETHERNET = 1
TC_STATS = struct.Struct("=QIIIIIII")  # bytes, packets, drops, overlimits, bps, pps, qlen, backlog


def pfc_queue(fan_in: int = 1, buffer_bytes: int = BUFFER_BYTES) -> QueueConfig:
    pfc, _ = scaling.pfc_thresholds(RATE_MBIT, MTU, buffer_bytes,
                                    reaction_time_s=REACTION_TIME_S, fan_in=fan_in)
    return QueueConfig(buffer_bytes=buffer_bytes, pfc=pfc)


def small_spine_leaf() -> Fabric:
    return topology.build("spineleaf", leaves=2, spines=2, hosts_per_leaf=2,
                          host_rate_mbit=RATE_MBIT, mtu_bytes=MTU)


def class_lines(queue: QueueConfig) -> list[str]:
    """A port's class queues and filters: its plan after the HTB root and the link class."""
    return port_plan(INTF, RATE_MBIT, MTU, queue).tc[2:]


def lines_starting(lines: list[str], prefix: str) -> list[str]:
    return [line for line in lines if line.startswith(prefix)]


def word_after(line: str, word: str) -> str:
    words = line.split()
    return words[words.index(word) + 1]


# --- handles ------------------------------------------------------------------------------


@pytest.mark.parametrize("priority", range(PFC_CLASSES))
def test_class_ids_handles_and_numbers_agree(priority):
    major, minor = Handles.class_id(priority).split(":")
    assert int(major, 16) == Handles.HTB_MAJOR
    assert Handles.class_id_number(priority) == (int(major, 16) << 16) | int(minor, 16)
    assert int(minor, 16) == Handles.class_minor(priority)
    leaf_major, rest = Handles.leaf(priority).split(":")
    assert rest == "" and int(leaf_major, 16) == Handles.leaf_major(priority)


def test_handles_are_distinct_and_clear_of_the_port_buffer_and_link_class():
    classes = [Handles.class_id(p) for p in range(PFC_CLASSES)]
    leaves = [Handles.leaf(p) for p in range(PFC_CLASSES)]
    assert len(set(classes)) == len(set(leaves)) == PFC_CLASSES
    assert Handles.LINK_CLASS not in classes
    assert not {Handles.BUFFER, Handles.HTB, Handles.IMPAIRMENT} & set(leaves)


def test_leaf_handles_of_the_default_classes():
    queue = pfc_queue()
    assert Handles.buffers(queue) == {"20:", "23:", "26:"}
    assert Handles.lossless(queue) == {"23:"}


def test_running_and_paused_tbf():
    running = running_tbf(RATE_MBIT, MTU, BUFFER_BYTES)
    paused = paused_tbf(MTU, BUFFER_BYTES)
    assert running == {"rate": "20000kbit", "burst": MTU + 64, "limit": BUFFER_BYTES}
    assert paused == {"rate": PAUSED_RATE, "burst": MTU + 64, "limit": BUFFER_BYTES}
    assert paused["burst"] >= MTU  # a bucket smaller than a frame would drop it
    # pausing changes the rate only: the queue and what it holds stay as they are
    assert {k: v for k, v in running.items() if k != "rate"} == \
           {k: v for k, v in paused.items() if k != "rate"}
    assert rate_bytes_per_s(paused["rate"]) * 1000 < rate_bytes_per_s(running["rate"])


# --- class queues: commands -----------------------------------------------------------------


def test_one_class_and_leaf_per_traffic_class():
    queue = pfc_queue()
    lines = class_lines(queue)
    classes = lines_starting(lines, "class replace")
    leaves = lines_starting(lines, "qdisc replace")
    assert len(classes) == len(leaves) == len(DEFAULT_CLASSES)
    assert len(lines) == len(classes) + len(leaves) + len(lines_starting(lines, "filter add"))
    for tc in DEFAULT_CLASSES:
        cid = Handles.class_id(tc.priority)
        [cls] = [c for c in classes if word_after(c, "classid") == cid]
        assert word_after(cls, "dev") == INTF
        assert word_after(cls, "parent") == Handles.LINK_CLASS
        assert word_after(cls, "ceil") == f"{RATE_MBIT}mbit"  # may borrow the whole link
        [leaf] = [q for q in leaves if word_after(q, "parent") == cid]
        assert word_after(leaf, "handle") == Handles.leaf(tc.priority)
        assert word_after(leaf, "limit") == str(BUFFER_BYTES)
        if tc.lossless:
            tbf = running_tbf(RATE_MBIT, MTU, BUFFER_BYTES)
            assert leaf.endswith(f"tbf rate {tbf['rate']} burst {tbf['burst']} "
                                 f"limit {tbf['limit']}")
        else:
            assert leaf.endswith(f"bfifo limit {BUFFER_BYTES}")
    # each class's leaf comes after its class, which must exist first
    for tc in DEFAULT_CLASSES:
        cid = Handles.class_id(tc.priority)
        class_at = next(i for i, c in enumerate(lines) if c.startswith("class") and cid in c)
        leaf_at = next(i for i, c in enumerate(lines) if c.startswith("qdisc") and cid in c)
        assert class_at < leaf_at


def test_classes_share_the_link_equally():
    lines = class_lines(pfc_queue())
    rates = [float(word_after(c, "rate").removesuffix("mbit"))
             for c in lines_starting(lines, "class replace")]
    assert rates == pytest.approx([RATE_MBIT / len(DEFAULT_CLASSES)] * len(DEFAULT_CLASSES),
                                  abs=SHARE_TOLERANCE_MBIT)
    assert sum(rates) == pytest.approx(RATE_MBIT, abs=SHARE_TOLERANCE_MBIT)


def test_a_filter_per_non_default_dscp_with_its_dsfield_and_flowid():
    classes = (TrafficClass(DEFAULT_PRIORITY, "best-effort", (0, 10)),
               TrafficClass(3, "roce", (26, 27), lossless=True),
               TrafficClass(6, "cnp", (48,)),
               TrafficClass(7, "storage", (63,), lossless=True))
    queue = QueueConfig(buffer_bytes=BUFFER_BYTES, classes=classes, class_queues=True)
    lines = class_lines(queue)
    filters = lines_starting(lines, "filter add")
    expected = {d for tc in classes if tc.priority != DEFAULT_PRIORITY for d in tc.dscp}
    assert len(filters) == len(expected)
    seen = set()
    for line in filters:
        assert word_after(line, "parent") == Handles.HTB
        assert word_after(line, "protocol") == "ip"
        words = line.split()
        value, mask = words[words.index("dsfield") + 1:words.index("dsfield") + 3]
        assert int(mask, 16) == 0xFC
        assert int(value, 16) & 0x03 == 0  # the ECN bits are left out of the match
        dscp = int(value, 16) >> 2
        assert word_after(line, "flowid") == Handles.class_id(queue.priority_for_dscp(dscp))
        seen.add(dscp)
    assert seen == expected
    assert "dsfield 0x68 0xfc flowid 5:13" in filters[0] + filters[1]  # DSCP 26 << 2
    # two lossless classes: two tbf leaves
    assert sum(" tbf " in line for line in lines) == 2


@pytest.mark.parametrize("dscp", [1, 26, 46, 48, 63])
def test_dsfield_value_is_the_dscp_shifted_past_the_ecn_bits(dscp):
    classes = (TrafficClass(DEFAULT_PRIORITY, "best-effort", (0,)),
               TrafficClass(5, "one", (dscp,)))
    queue = QueueConfig(buffer_bytes=BUFFER_BYTES, classes=classes, class_queues=True)
    [line] = lines_starting(class_lines(queue), "filter")
    words = line.split()
    assert int(words[words.index("dsfield") + 1], 16) == dscp << 2


def test_a_pfc_queue_defaults_to_best_effort_and_adds_the_classes():
    queue = pfc_queue()
    plain = port_plan(INTF, RATE_MBIT, MTU).tc
    cmds = port_plan(INTF, RATE_MBIT, MTU, queue).tc
    assert cmds[0] == f"qdisc replace dev {INTF} root handle 5: htb default 10"
    # htb reads "default" in hex: it names the best-effort class the class commands create
    default = f"5:{word_after(cmds[0], 'default')}"
    assert default == Handles.class_id(DEFAULT_PRIORITY)
    assert any(word_after(c, "classid") == default for c in lines_starting(cmds, "class"))
    # the same link class, its bucket two frames (a resumed lossless queue sends it at once)
    assert cmds[1] == plain[1].replace(f"burst {htb_burst_bytes(RATE_MBIT, MTU)} cburst "
                                       f"{htb_burst_bytes(RATE_MBIT, MTU)}",
                                       f"burst {2 * MTU} cburst {2 * MTU}")
    assert not any(f"handle {Handles.BUFFER}" in line for line in cmds)  # no single buffer


def test_a_queue_without_classes_is_one_buffer():
    plain = port_plan(INTF, RATE_MBIT, MTU).tc
    assert len(plain) == 3 and plain[0].endswith("htb default 1")
    assert port_plan(INTF, RATE_MBIT, MTU, QueueConfig(buffer_bytes=BUFFER_BYTES)).tc == plain
    assert port_plan(INTF, None, MTU, pfc_queue()).tc == []  # unshaped: nothing to queue


def test_class_queues_without_pfc_still_get_classes():
    queue = QueueConfig(buffer_bytes=BUFFER_BYTES, class_queues=True)
    assert queue.uses_classes and queue.pfc is None
    assert class_lines(queue) == class_lines(pfc_queue())


def test_switch_batch_and_host_script_carry_the_classes():
    fab = small_spine_leaf()
    queue = pfc_queue(fan_in=switch_fan_in(fab))
    per_port = len(port_plan(INTF, RATE_MBIT, MTU, queue).tc)
    batch = switch_queue_plan(fab, queue).tc
    assert len(batch) == per_port * len(fab.switch_ends())
    assert switch_queue_plan(fab).tc == switch_queue_plan(
        fab, QueueConfig(buffer_bytes=BUFFER_BYTES)).tc
    script = host_script(fab, "l0h0", queue=queue)
    for line in port_plan("l0h0-eth0", RATE_MBIT, MTU, queue).tc:
        assert line in script.splitlines()
    assert "root handle 5: htb default 10" in script
    assert host_script(fab, "l0h0") == host_script(fab, "l0h0",
                                                   queue=QueueConfig(buffer_bytes=BUFFER_BYTES))


# --- the pause-frame decoder against scapy's ----------------------------------------------


def assert_decoders_agree(data: bytes) -> PfcFrame | None:
    fast = decode_pfc_frame(data)
    assert fast == parse_pfc_frame(data)
    return fast


@pytest.mark.parametrize("cls", range(PFC_CLASSES))
def test_decoder_agrees_with_scapy_on_every_class(cls):
    for quanta in (0, 1, 2, 255, 256, 0x1234, MAX_PAUSE_QUANTA):
        decoded = assert_decoders_agree(pfc_frame(SRC_MAC, {cls: quanta}))
        assert decoded == PfcFrame(SRC_MAC, PFC_DST_MAC, {cls: quanta})
    assert assert_decoders_agree(xoff_frame(SRC_MAC, [cls])).pause_quanta == \
        {cls: MAX_PAUSE_QUANTA}
    assert assert_decoders_agree(xon_frame(SRC_MAC, [cls])).pause_quanta == {cls: 0}


def test_decoder_agrees_with_scapy_on_random_class_sets():
    rng = random.Random(802_1)
    subsets = [set(s) for n in (2, 3, PFC_CLASSES)
               for s in itertools.combinations(range(PFC_CLASSES), n)]
    for classes in rng.sample(subsets, 40):
        quanta = {c: rng.randrange(MAX_PAUSE_QUANTA + 1) for c in classes}
        mac = ":".join(f"{b:02x}" for b in [2, *rng.randbytes(5)])
        assert assert_decoders_agree(pfc_frame(mac, quanta)) == PfcFrame(mac, PFC_DST_MAC, quanta)
        assert assert_decoders_agree(xoff_frame(mac, classes, 7)).pause_quanta == \
            dict.fromkeys(classes, 7)
        assert assert_decoders_agree(xon_frame(mac, classes)).pause_quanta == \
            dict.fromkeys(classes, 0)


def test_decoder_agrees_with_scapy_on_random_bytes():
    """Untagged frames of any content: the decoder must pick out the same ones as scapy."""
    rng = random.Random(0x8808)
    picked = 0
    for _ in range(500):
        data = bytearray(rng.randbytes(rng.choice([34, 46, 60, 64])))
        data[12:14] = rng.choice([b"\x88\x08", b"\x88\x08", b"\x08\x00", b"\x88\xcc"])
        data[14:16] = rng.choice([b"\x01\x01", b"\x01\x01", b"\x00\x01", b"\x01\x02"])
        picked += assert_decoders_agree(bytes(data)) is not None
    assert picked > 0  # the loop did compare decoded frames, not only rejections


def test_decoder_ignores_the_reserved_byte_as_scapy_does():
    data = bytearray(pfc_frame(SRC_MAC, {3: 9}))
    data[16] = 0xFF  # the high byte of the class-enable vector is reserved
    assert assert_decoders_agree(bytes(data)).pause_quanta == {3: 9}


def test_decoder_rejects_frames_that_are_not_pfc():
    ipv4 = bytes(Ether(dst="02:00:00:00:00:02", src=SRC_MAC) / IP(dst="10.0.0.2") / UDP()
                 / (b"\x01\x01" * 20))
    pause = bytes(Ether(dst=PFC_DST_MAC, src=SRC_MAC, type=0x8808) / MACControlPause(pause_time=7))
    arp = bytes(Ether(src=SRC_MAC) / ARP())
    full = pfc_frame(SRC_MAC, {3: 9})
    for data in (ipv4, pause, arp):
        assert assert_decoders_agree(data) is None
    assert pause[14:16] == b"\x00\x01"  # really the 802.3x opcode, on the PFC ethertype
    for length in (0, 14, 16, 18, 33):
        assert decode_pfc_frame(full[:length]) is None
    assert decode_pfc_frame(full[:34]) == decode_pfc_frame(full)  # the padding is not needed


# --- the ports' state machines ------------------------------------------------------------


def test_queue_watch_hysteresis():
    watch = QueueWatch(xoff_bytes=10_000, xon_bytes=7_000)
    samples = [0, 9_999, 10_000, 8_000, 7_001, 7_000, 9_999, 10_000, 12_000, 0]
    changed = [watch.update(b) for b in samples]
    assert changed == [False, False, True, False, False, True, False, True, False, True]
    states = []
    watch = QueueWatch(xoff_bytes=10_000, xon_bytes=7_000)
    for b in samples:
        watch.update(b)
        states.append(watch.congested)
    assert states == [False, False, True, True, True, False, False, True, True, False]


def test_ports_to_pause_are_the_other_ports_of_a_congested_switch():
    ports = ["l0-eth1", "l0-eth2", "l0-eth3"]
    assert ports_to_pause(ports, set()) == dict.fromkeys(ports, False)
    assert ports_to_pause(ports, {"l0-eth1"}) == {"l0-eth1": False, "l0-eth2": True,
                                                  "l0-eth3": True}
    assert ports_to_pause(ports, {"l0-eth1", "l0-eth2"}) == dict.fromkeys(ports, True)


def test_pause_sender_xoff_refresh_xon():
    refresh_s = refresh_interval_s(MAX_PAUSE_QUANTA, RATE_MBIT)
    sender = PauseSender(refresh_s)
    timeline = [
        (0.0, True, XOFF),
        (refresh_s / 2, True, None),
        (refresh_s * 0.999, True, None),
        (refresh_s, True, XOFF),  # repeated before the neighbour's pause runs out
        (refresh_s * 1.5, True, None),
        (refresh_s * 2, True, XOFF),
        (refresh_s * 2.1, False, XON),
        (refresh_s * 2.2, False, None),  # nothing more to resume
        (refresh_s * 2.3, True, XOFF),  # a new pause goes out at once, not at the refresh
        (refresh_s * 2.4, True, None),
    ]
    for now, want, expected in timeline:
        assert sender.frame(want, now) == expected, now
    assert sender.asking and sender.last_xoff_s == refresh_s * 2.3


def test_pause_sender_sends_nothing_to_an_unpaused_neighbour():
    sender = PauseSender(0.01)
    assert [sender.frame(False, t / 100) for t in range(5)] == [None] * 5


QUANTA = 2000
PAUSE_S = pause_duration_s(QUANTA, RATE_MBIT)  # 51.2 ms at 20 Mbit/s
STORM_S = 0.1


def test_pause_timer_pause_refresh_and_xon():
    timer = PauseTimer(RATE_MBIT, STORM_S)
    assert timer.on_frame(QUANTA, 1.0) == PAUSE and timer.paused
    assert timer.paused_until_s == pytest.approx(1.0 + PAUSE_S)
    assert timer.on_frame(QUANTA, 1.02) is None  # a refresh extends the pause in place
    assert timer.paused_until_s == pytest.approx(1.02 + PAUSE_S)
    assert timer.expire(1.0 + PAUSE_S) is None  # the first pause would have run out here
    assert timer.paused_time_s(1.03) == pytest.approx(0.03, abs=TIME_TOLERANCE_S)
    assert timer.on_frame(0, 1.04) == RESUME and not timer.paused
    assert timer.on_frame(0, 1.05) is None  # XON while running: nothing to do
    assert timer.pauses == 1
    assert timer.paused_time_s(2.0) == pytest.approx(0.04, abs=TIME_TOLERANCE_S)
    assert timer.longest_pause_s == pytest.approx(0.04, abs=TIME_TOLERANCE_S)
    assert timer.storms == 0


def test_pause_timer_expires_after_the_quanta():
    timer = PauseTimer(RATE_MBIT, STORM_S)
    assert timer.on_frame(QUANTA, 2.0) == PAUSE
    assert timer.expire(2.0 + PAUSE_S * 0.999) is None and timer.paused
    late = 2.0 + PAUSE_S + 0.005  # the listener woke a little after the end
    assert timer.expire(late) == RESUME and not timer.paused
    assert timer.expire(late + 1) is None
    # the pause counts until it ran out, not until it was noticed
    assert timer.paused_time_s(late) == pytest.approx(PAUSE_S, abs=TIME_TOLERANCE_S)
    assert timer.longest_pause_s == pytest.approx(PAUSE_S, abs=TIME_TOLERANCE_S)


def test_paused_time_stops_at_expiry_even_before_it_is_noticed():
    """The counters are snapshot by another thread than the one that expires pauses: a pause
    that has run out must read the same before and after ``expire``."""
    timer = PauseTimer(RATE_MBIT, STORM_S)
    timer.on_frame(QUANTA, 5.0)
    late = 5.0 + 10 * PAUSE_S
    before = timer.paused_time_s(late)
    timer.expire(late)
    assert before == pytest.approx(timer.paused_time_s(late), abs=TIME_TOLERANCE_S)
    assert before == pytest.approx(PAUSE_S, abs=TIME_TOLERANCE_S)


def test_pause_storms_are_flagged_once_per_pause():
    timer = PauseTimer(RATE_MBIT, STORM_S)
    refresh_s = PAUSE_S / 2
    for start in (3.0, 4.0):
        assert timer.on_frame(QUANTA, start) == PAUSE
        flagged = []
        now = start
        while now < start + 0.25:
            assert timer.on_frame(QUANTA, now) in (None, PAUSE)
            assert timer.expire(now) is None  # refreshed in time: never runs out
            flagged.append((now, timer.check_storm(now)))
            now += refresh_s / 4
        storm_times = [t for t, storm in flagged if storm]
        assert len(storm_times) == 1
        assert storm_times[0] - start > STORM_S
        assert storm_times[0] - start <= STORM_S + refresh_s / 4 + TIME_TOLERANCE_S
        assert timer.on_frame(0, start + 0.25) == RESUME
        assert not timer.check_storm(start + 0.5)  # not paused: no storm
    assert timer.pauses == 2 and timer.storms == 2
    assert timer.longest_pause_s == pytest.approx(0.25, abs=TIME_TOLERANCE_S)
    assert timer.paused_time_s(9.0) == pytest.approx(0.5, abs=TIME_TOLERANCE_S)


def test_a_short_pause_is_not_a_storm():
    timer = PauseTimer(RATE_MBIT, STORM_S)
    timer.on_frame(QUANTA, 0.0)
    assert not timer.check_storm(STORM_S)  # "longer than" the threshold, not equal
    timer.on_frame(0, STORM_S)
    assert not timer.check_storm(STORM_S * 2)
    assert timer.storms == 0


def test_a_congested_port_pauses_the_other_neighbours_through_real_frames():
    """The watcher's and listener's loops in miniature: backlog samples on one switch port,
    frames on the wire, timers at the neighbours."""
    ports = ["l0-eth1", "l0-eth2", "l0-eth3"]
    neighbour_of = {"l0-eth1": "l0h0-eth0", "l0-eth2": "l0h1-eth0", "l0-eth3": "s0-eth1"}
    pfc = PfcConfig(xoff_bytes=40_000, xon_bytes=37_000, headroom_bytes=28_064, quanta=QUANTA)
    watches = {p: QueueWatch(pfc.xoff_bytes, pfc.xon_bytes) for p in ports}
    senders = {p: PauseSender(refresh_interval_s(pfc.quanta, RATE_MBIT)) for p in ports}
    timers = {n: PauseTimer(RATE_MBIT, STORM_S) for n in neighbour_of.values()}
    sent, actions = [], []
    backlog_by_ms = {0: 0, 10: 45_000, 20: 50_000, 40: 38_000, 50: 30_000}
    for ms in range(61):  # one sample a millisecond, as the agent polls
        now = ms / 1000
        if ms in backlog_by_ms:
            watches["l0-eth1"].update(backlog_by_ms[ms])
        congested = {p for p in ports if watches[p].congested}
        for port, want in ports_to_pause(ports, congested).items():
            kind = senders[port].frame(want, now)
            if kind is None:
                continue
            data = (xoff_frame(SRC_MAC, [LOSSLESS], pfc.quanta) if kind == XOFF
                    else xon_frame(SRC_MAC, [LOSSLESS]))
            sent.append((round(now, 3), port, kind))
            frame = decode_pfc_frame(data)
            neighbour = neighbour_of[port]
            action = timers[neighbour].on_frame(frame.pause_quanta[LOSSLESS], now)
            if action is not None:
                actions.append((round(now, 3), neighbour, action))
    assert sent == [(0.01, "l0-eth2", XOFF), (0.01, "l0-eth3", XOFF),
                    (0.036, "l0-eth2", XOFF), (0.036, "l0-eth3", XOFF),  # refresh at ~25.6 ms
                    (0.05, "l0-eth2", XON), (0.05, "l0-eth3", XON)]
    assert actions == [(0.01, "l0h1-eth0", PAUSE), (0.01, "s0-eth1", PAUSE),
                       (0.05, "l0h1-eth0", RESUME), (0.05, "s0-eth1", RESUME)]
    assert timers["l0h0-eth0"].pauses == 0  # the congested port's own neighbour sends on
    assert timers["s0-eth1"].paused_time_s(1.0) == pytest.approx(0.04, abs=1e-6)


# --- the agent's plan ---------------------------------------------------------------------


def test_agent_plan_covers_every_shaped_interface_with_its_peer():
    fab = small_spine_leaf()
    queue = pfc_queue(fan_in=switch_fan_in(fab))
    plan = agent_plan(fab, queue, poll_s=0.001)
    assert set(plan.interfaces) == set(fab.interface_names())
    for link in fab.links:
        for end, node in ((0, link.a), (1, link.b)):
            info = plan.interfaces[link.intf(end)]
            watched = ({} if fab.nodes[node].is_host else
                       {"xoff_bytes": queue.pfc.xoff_bytes, "xon_bytes": queue.pfc.xon_bytes})
            assert info == {"node": node, "host": fab.nodes[node].is_host,
                            "rate_mbit": link.rate_mbit, "peer": link.intf(1 - end),
                            "buffer_bytes": BUFFER_BYTES, **watched}
    for intf, info in plan.interfaces.items():
        assert plan.interfaces[info["peer"]]["peer"] == intf
    expected_ports: dict[str, list[str]] = {}
    for switch, _, intf, _ in fab.switch_ends():
        expected_ports.setdefault(switch, []).append(intf)
    assert plan.switch_ports == {s: sorted(p) for s, p in expected_ports.items()}
    assert set(plan.switch_ports) == {"l0", "l1", "s0", "s1"}
    assert len(plan.switch_ports["l0"]) == 4 and len(plan.switch_ports["s0"]) == 2
    assert all(not plan.interfaces[i]["host"] for ports in plan.switch_ports.values()
               for i in ports)
    assert plan.priorities == (LOSSLESS,)
    assert (plan.quanta, plan.storm_threshold_ms, plan.mtu_bytes, plan.poll_s) == \
           (queue.pfc.quanta, queue.pfc.storm_threshold_ms, MTU, 0.001)
    assert plan.refresh_s("l0-eth3") == refresh_interval_s(queue.pfc.quanta, RATE_MBIT)


def test_agent_plan_round_trips_through_json():
    fab = small_spine_leaf()
    plan = agent_plan(fab, pfc_queue(fan_in=switch_fan_in(fab)), poll_s=0.002)
    text = json.dumps(plan.to_json())
    again = AgentPlan.from_json(json.loads(text))
    assert again == plan
    assert again.to_json() == plan.to_json()


def test_agent_plan_leaves_unshaped_links_out():
    fab = small_spine_leaf()
    fab.add_link("s0", 3, "s1", 3, None)
    plan = agent_plan(fab, pfc_queue(fan_in=3), poll_s=0.001)
    assert "s0-eth3" not in plan.interfaces and "s1-eth3" not in plan.interfaces
    assert "s0-eth3" not in plan.switch_ports["s0"]


def test_agent_plan_needs_pfc():
    queue = QueueConfig(buffer_bytes=BUFFER_BYTES, class_queues=True)
    with pytest.raises(ValueError):
        agent_plan(small_spine_leaf(), queue, poll_s=0.001)


@pytest.mark.parametrize(("fab", "fan_in"), [
    (small_spine_leaf(), 3),  # a leaf: 2 hosts and 2 spines
    (fat_tree(4, host_rate_mbit=RATE_MBIT), 3),  # every switch has k ports
    (fat_tree(6, host_rate_mbit=RATE_MBIT), 5),
    (topology.build("spineleaf", leaves=6, spines=2, hosts_per_leaf=1,
                    host_rate_mbit=RATE_MBIT), 5),  # a spine with 6 leaves is the widest
])
def test_switch_fan_in(fab, fan_in):
    assert switch_fan_in(fab) == fan_in


# --- the headroom's fan-in ----------------------------------------------------------------


def test_headroom_scales_with_the_fan_in():
    # 2 * 2.5 MB/s * 5 ms in flight + 2 frames + a pause frame, per feeding port
    one = 25_000 + 2 * MTU + 64
    for fan_in in (1, 2, 3, 7):
        assert scaling.pfc_headroom_bytes(RATE_MBIT, MTU, reaction_time_s=REACTION_TIME_S,
                                          fan_in=fan_in) == fan_in * one
    assert scaling.pfc_headroom_bytes(RATE_MBIT, MTU, reaction_time_s=REACTION_TIME_S) == one


def test_thresholds_leave_the_fan_in_headroom_above_xoff():
    pfc, record = scaling.pfc_thresholds(RATE_MBIT, MTU, BUFFER_BYTES,
                                         reaction_time_s=REACTION_TIME_S, fan_in=3)
    headroom = scaling.pfc_headroom_bytes(RATE_MBIT, MTU, reaction_time_s=REACTION_TIME_S,
                                          fan_in=3)
    assert pfc.headroom_bytes == headroom
    assert pfc.xoff_bytes == BUFFER_BYTES - headroom
    assert pfc.xon_bytes == pfc.xoff_bytes - scaling.XON_HYSTERESIS_FRAMES * MTU
    assert record["fan_in"] == 3 and record["value"] == headroom
    queue, _ = scaling.scaled_queue_config("dcqcn", RATE_MBIT, MTU, BUFFER_BYTES,
                                           reaction_time_s=REACTION_TIME_S, fan_in=3)
    assert queue.pfc == pfc


@pytest.mark.parametrize("fan_in", [0, -1, True, 1.5])
def test_bad_fan_in_is_a_config_error(fan_in):
    with pytest.raises(ConfigError) as err:
        scaling.pfc_headroom_bytes(RATE_MBIT, MTU, fan_in=fan_in)
    assert err.value.field == "fan_in"


def test_a_fan_in_the_buffer_cannot_hold_is_refused():
    with pytest.raises(ConfigError) as err:
        scaling.pfc_thresholds(RATE_MBIT, MTU, BUFFER_BYTES, reaction_time_s=REACTION_TIME_S,
                               fan_in=5)  # 5 * 28 064 B > 125 000 B
    assert err.value.field == "buffer_bytes"


# --- the agent's netlink messages and parsers ---------------------------------------------


def rtattrs(data: bytes, start: int, end: int) -> list[tuple[int, bytes]]:
    """(type, payload) of each rtattr in data[start:end], by the kernel's alignment rules."""
    found = []
    off = start
    while off + 4 <= end:
        length, kind = struct.unpack_from("=HH", data, off)
        assert length >= 4
        found.append((kind, data[off + 4:off + length]))
        off += (length + 3) & ~3
    assert off == end  # the attributes fill the message exactly
    return found


def test_tbf_change_message_decodes_by_hand():
    ifindex, handle, parent, seq = 17, 0x23 << 16, 0x50013, 42
    rate, burst, limit = 2_500_000, MTU + 64, BUFFER_BYTES
    msg = tbf_change_message(ifindex, handle, parent, rate, burst, limit, seq)
    length, mtype, flags, mseq, pid = struct.unpack_from("=IHHII", msg, 0)
    assert length == len(msg)
    assert mtype == RTM_NEWQDISC
    assert flags == NLM_F_REQUEST | NLM_F_ACK  # a change in place: no CREATE, no REPLACE
    assert (mseq, pid) == (seq, 0)
    family, _, _, t_ifindex, t_handle, t_parent, info = struct.unpack_from("=BBHiIII", msg, 16)
    assert (family, t_ifindex, t_handle, t_parent, info) == (0, ifindex, handle, parent, 0)
    attrs = rtattrs(msg, 16 + 20, len(msg))
    assert [kind for kind, _ in attrs] == [TCA_KIND, TCA_OPTIONS | NLA_F_NESTED]
    assert attrs[0][1] == b"tbf\0"
    options = attrs[1][1]
    nested = dict(rtattrs(options, 0, len(options)))
    assert set(nested) == {TCA_TBF_PARMS, TCA_TBF_BURST}
    parms = nested[TCA_TBF_PARMS]
    assert len(parms) == 36  # struct tc_tbf_qopt: two tc_ratespec and three u32
    cell_log, linklayer, overhead, cell_align, mpu, rate_field = \
        struct.unpack_from("=BBHhHI", parms, 0)
    assert (linklayer, rate_field) == (TC_LINKLAYER_ETHERNET, rate)
    assert (cell_log, overhead, cell_align, mpu) == (0, 0, 0, 0)
    assert struct.unpack_from("=BBHhHI", parms, 12) == (0, 0, 0, 0, 0, 0)  # no peak rate
    assert struct.unpack_from("=III", parms, 24) == (limit, 0, 0)
    assert struct.unpack("=I", nested[TCA_TBF_BURST]) == (burst,)


def test_tbf_change_message_for_the_plans_pause_and_resume():
    for params in (running_tbf(RATE_MBIT, MTU, BUFFER_BYTES), paused_tbf(MTU, BUFFER_BYTES)):
        msg = tbf_change_message(3, Handles.leaf_major(LOSSLESS) << 16,
                                 Handles.class_id_number(LOSSLESS),
                                 rate_bytes_per_s(params["rate"]), params["burst"],
                                 params["limit"], 1)
        assert struct.unpack_from("=I", msg, 16 + 8)[0] == 0x230000  # handle 23:
        assert struct.unpack_from("=I", msg, 16 + 12)[0] == 0x50013  # parent 5:13
        rate_at = 16 + 20 + 8 + 4 + 4 + 8  # header, tcmsg, kind, options, parms, ratespec.rate
        assert struct.unpack_from("=I", msg, rate_at)[0] == rate_bytes_per_s(params["rate"])


def test_rate_bytes_per_s():
    assert rate_bytes_per_s("20000kbit") == 2_500_000
    assert rate_bytes_per_s("1kbit") == 125
    for bad in ("20mbit", "20000", "2500000bps", "kbit", "1.5kbit"):
        with pytest.raises(ValueError):
            rate_bytes_per_s(bad)


def rtattr(kind: int, payload: bytes) -> bytes:
    data = struct.pack("=HH", 4 + len(payload), kind) + payload
    return data + bytes(-len(data) % 4)


def tc_stats(backlog: int) -> bytes:
    # every other field is distinct, so reading the wrong offset cannot pass by chance
    return TC_STATS.pack(1_000_000, 900, 11, 22, 333, 44, 5, backlog) + bytes(4)


def test_backlog_is_found_after_another_attribute():
    prefix = b"\xee" * 20  # the tcmsg before the attributes
    kind = rtattr(TCA_KIND, b"bfifo\0")  # 10 bytes: padded to 12
    options = rtattr(TCA_OPTIONS, struct.pack("=I", 4096))
    buf = prefix + kind + options + rtattr(TCA_STATS, tc_stats(12_345))
    view = memoryview(buf)
    assert QdiscBacklogs._backlog(view, len(prefix), len(buf)) == 12_345


def test_backlog_without_stats_or_with_a_broken_attribute_is_zero():
    stats = rtattr(TCA_STATS, tc_stats(777))
    assert QdiscBacklogs._backlog(memoryview(rtattr(TCA_KIND, b"tbf\0")), 0, 8) == 0
    broken = struct.pack("=HH", 0, TCA_KIND) + stats  # a zero length would loop forever
    assert QdiscBacklogs._backlog(memoryview(broken), 0, len(broken)) == 0
    # the end bound is respected: stats beyond it are another message's
    buf = rtattr(TCA_KIND, b"tbf\0") + stats
    assert QdiscBacklogs._backlog(memoryview(buf), 0, 8) == 0
    assert QdiscBacklogs._backlog(memoryview(buf), 0, len(buf)) == 777


class FakeNetlink:
    """Answers the batched requests with the given chunks, as recv_into would."""

    def __init__(self, chunks: list[bytes]):
        self.chunks = list(chunks)
        self.sent: list[bytes] = []

    def send(self, data: bytes) -> int:
        self.sent.append(data)
        return len(data)

    def recv_into(self, buf) -> int:
        chunk = self.chunks.pop(0)
        buf[:len(chunk)] = chunk
        return len(chunk)


def qdisc_message(ifindex: int, major: int, backlog: int, seq: int) -> bytes:
    body = (struct.pack("=BBHiIII", 0, 0, 0, ifindex, major << 16, 0, 0)
            + rtattr(TCA_KIND, b"tbf\0") + rtattr(TCA_STATS, tc_stats(backlog)))
    return struct.pack("=IHHII", 16 + len(body), RTM_NEWQDISC, 0, seq, 0) + body


def error_message(seq: int, errno_value: int) -> bytes:
    return struct.pack("=IHHII", 20, 2, 0, seq, 0) + struct.pack("=i", -errno_value)


def backlogs_with(wanted, chunks) -> QdiscBacklogs:
    backlogs = QdiscBacklogs.__new__(QdiscBacklogs)  # no netlink socket in a unit test
    backlogs.wanted = sorted(wanted)
    backlogs.buf = bytearray(1 << 16)
    backlogs.seq = 0
    backlogs.sock = FakeNetlink(chunks)
    return backlogs


def test_backlogs_ask_for_exactly_the_wanted_queues_and_match_replies_by_sequence():
    # requests go out in (ifindex, major) order with seq 1, 2; replies may come in any order
    # and split over reads
    backlogs = backlogs_with({(5, 0x23), (4, 0x23)}, [
        qdisc_message(5, 0x23, 0, 2),
        qdisc_message(4, 0x23, 3000, 1),
    ])
    assert backlogs.read() == {(4, 0x23): 3000, (5, 0x23): 0}
    [batch] = backlogs.sock.sent
    asked = []
    off = 0
    while off < len(batch):
        length, mtype, flags, seq, _ = struct.unpack_from("=IHHII", batch, off)
        _, _, _, ifindex, handle, parent, _ = struct.unpack_from("=BBHiIII", batch, off + 16)
        assert (mtype, flags, parent) == (38, 0x1 | 0x8, 0)  # RTM_GETQDISC, request + echo
        asked.append((seq, ifindex, handle >> 16))
        off += length
    assert asked == [(1, 4, 0x23), (2, 5, 0x23)]
    # the next read numbers its requests on
    backlogs.sock.chunks = [qdisc_message(4, 0x23, 10, 3) + qdisc_message(5, 0x23, 20, 4)]
    assert backlogs.read() == {(4, 0x23): 10, (5, 0x23): 20}


def test_a_missing_queue_is_an_error_naming_it():
    import errno

    backlogs = backlogs_with({(4, 0x23)}, [error_message(1, errno.ENOENT)])
    with pytest.raises(OSError, match="reading qdisc 23: on ifindex 4"):
        backlogs.read()


# --- the run's summary --------------------------------------------------------------------


def intf_counters(node: str, xoff=0, xon=0, received=0, pauses=0, paused_s=0.0, longest=0.0,
                  storms=0, backlog=0) -> dict:
    return {"xoff_sent": xoff, "xon_sent": xon, "frames_received": received, "node": node,
            "pauses": pauses, "paused_s": paused_s, "longest_pause_s": longest,
            "storms": storms, "max_backlog_bytes": backlog}


def test_pfc_totals():
    counters = {
        "interfaces": {
            "l0-eth3": intf_counters("l0", xoff=5, xon=2, received=1, pauses=1, paused_s=0.1,
                                     longest=0.1, backlog=40_000),
            "l0h1-eth0": intf_counters("l0h1", received=7, pauses=3, paused_s=0.25,
                                       longest=0.2, storms=1),
            "s0-eth1": intf_counters("s0", xoff=1, xon=1, backlog=12_000),
        },
        "pause_apply_ms": {"count": 2, "p50": 1.5, "p99": 2.0, "max": 2.0},
        "sample_gap_ms": {"count": 0},
        "poll_s": 0.001,
    }
    totals = pfc_totals(counters)
    assert totals["pause_frames_sent"] == 9
    assert (totals["xoff_sent"], totals["xon_sent"]) == (6, 3)
    assert totals["pause_frames_received"] == 8
    assert totals["pauses"] == 4
    assert totals["paused_time_s"] == pytest.approx(0.35, abs=TIME_TOLERANCE_S)
    assert totals["longest_pause_s"] == 0.2
    assert totals["pause_storms"] == 1
    assert totals["max_lossless_backlog_bytes"] == 40_000
    assert totals["paused_interfaces"] == {
        "l0-eth3": {"node": "l0", "pauses": 1, "paused_s": 0.1},
        "l0h1-eth0": {"node": "l0h1", "pauses": 3, "paused_s": 0.25}}
    assert totals["pause_apply_ms"] == counters["pause_apply_ms"]
    assert totals["poll_s"] == 0.001
    json.dumps(totals)


def test_pfc_totals_of_an_agent_that_wrote_nothing():
    totals = pfc_totals({})
    assert totals["pause_frames_sent"] == totals["pauses"] == 0
    assert totals["longest_pause_s"] == 0.0 and totals["paused_interfaces"] == {}
    assert totals["poll_s"] is None


def tc_entry(kind: str, handle: str, drops: int, **extra) -> dict:
    return {"kind": kind, "handle": handle, "bytes": 1000, "packets": 10, "drops": drops,
            "overlimits": 0, "requeues": 0, "backlog": 0, "qlen": 0, **extra}


CLASS_QUEUES_TC_JSON = json.dumps([
    tc_entry("htb", "5:", 12, dev="l0-eth1", root=True),  # repeats its leaves' drops
    tc_entry("bfifo", "20:", 9, dev="l0-eth1", parent="5:10"),
    tc_entry("tbf", "23:", 2, dev="l0-eth1", parent="5:13"),
    tc_entry("bfifo", "26:", 1, dev="l0-eth1", parent="5:16"),
    tc_entry("tbf", "23:", 3, dev="l0-eth2", parent="5:13"),
    {"kind": "tbf", "handle": "23:", "dev": "l0-eth3"},  # no statistics yet
    tc_entry("fq_codel", "0:", 5, dev="eth0", root=True),
])


def test_lossless_drops_count_only_the_lossless_leaves():
    assert lossless_drops(parse_qdiscs(CLASS_QUEUES_TC_JSON), pfc_queue()) == 5
    assert lossless_drops(parse_qdiscs(""), pfc_queue()) == 0
    assert lossless_drops(parse_qdiscs("[]"), pfc_queue()) == 0


def test_queue_drops_count_every_class_leaf_once():
    assert queue_drops(parse_qdiscs(CLASS_QUEUES_TC_JSON)) == 9 + 2 + 1 + 3


# --- the kick frame -----------------------------------------------------------------------


MIN_FRAME_BYTES = 60  # the Ethernet minimum without the FCS, which the kernel adds


def test_kick_frame_is_a_minimum_frame_no_one_acts_on():
    data = kick_frame(SRC_MAC)
    assert len(data) == MIN_FRAME_BYTES
    assert KICK_ETHERTYPE == 0x88B5  # IEEE 802 local experimental ethertype 1
    assert data[:6] == bytes.fromhex("0180c2000001")
    assert data[6:12] == bytes.fromhex(SRC_MAC.replace(":", ""))
    assert struct.unpack_from("!H", data, 12) == (KICK_ETHERTYPE,)
    assert data[14:] == bytes(MIN_FRAME_BYTES - 14)
    assert assert_decoders_agree(data) is None  # the agent's listener must not take it as PFC


def test_kick_frame_lowercases_the_mac():
    assert kick_frame(SRC_MAC.upper()) == kick_frame(SRC_MAC)


@pytest.mark.parametrize("mac", ["02:00:00:00:00", "02-00-00-00-00-01", "02:00:00:00:00:0g",
                                 "", None, 2])
def test_kick_frame_with_a_bad_mac_is_a_config_error(mac):
    with pytest.raises(ConfigError) as err:
        kick_frame(mac)
    assert err.value.field == "src_mac"


# --- which ports feed which queue ---------------------------------------------------------


HALF = 2  # k/2 of the k=4 fat-tree: host ports 1..2 of an edge, down ports 1..2 of an aggregation


def k4_fat_tree() -> Fabric:
    return topology.build("fattree", k=4, host_rate_mbit=RATE_MBIT)


def ports(switch: str, numbers) -> list[str]:
    return sorted(intf_name(switch, n) for n in numbers)


def interface_owners(fab: Fabric) -> dict[str, str]:
    return {link.intf(end): (link.a, link.b)[end] for link in fab.links for end in (0, 1)}


def switch_interfaces(fab: Fabric) -> dict[str, list[str]]:
    found: dict[str, list[str]] = {}
    for switch, _, intf, _ in fab.switch_ends():
        found.setdefault(switch, []).append(intf)
    return found


def test_feeders_of_the_k4_fat_tree_by_hand():
    """Port numbers as the fat-tree documents them: an edge's ports 1..k/2 go to hosts and
    k/2+1..k up; an aggregation's 1..k/2 go down to edges and k/2+1..k up to cores; core port
    1+pod goes to that pod."""
    fab = k4_fat_tree()
    feeders = feeding_ports(fab)
    down, up = range(1, HALF + 1), range(HALF + 1, 2 * HALF + 1)
    assert feeders["p0e0-eth1"] == ["p0e0-eth2", "p0e0-eth3", "p0e0-eth4"]
    assert feeders["p0a0-eth3"] == ["p0a0-eth1", "p0a0-eth2"]
    for name, node in fab.nodes.items():
        if node.role == EDGE:
            for port in down:  # toward a host: its other host port and both uplinks
                others = [p for p in down if p != port]
                assert feeders[intf_name(name, port)] == ports(name, [*others, *up])
            for port in up:  # toward an aggregation: only the hosts, never the other uplink
                assert feeders[intf_name(name, port)] == ports(name, down)
        elif node.role == AGGREGATION:
            for port in down:  # toward an edge: the other edge and both cores
                others = [p for p in down if p != port]
                assert feeders[intf_name(name, port)] == ports(name, [*others, *up])
            for port in up:  # toward a core: only the edges; traffic never turns back up
                assert feeders[intf_name(name, port)] == ports(name, down)
        elif node.role == CORE:
            all_ports = range(1, 2 * HALF + 1)  # one per pod
            for port in all_ports:
                assert feeders[intf_name(name, port)] == \
                    ports(name, [p for p in all_ports if p != port])
    # the keys are exactly the switch egress interfaces: a host NIC is never a queue here,
    # nor a feeder (its pauses come from the edge port's feeders)
    switch_intfs = {i for intfs in switch_interfaces(fab).values() for i in intfs}
    assert set(feeders) == switch_intfs
    assert {i for ingress in feeders.values() for i in ingress} == switch_intfs
    owners = interface_owners(fab)
    assert not any(fab.nodes[owners[i]].is_host for i in feeders)


@pytest.mark.parametrize("fab", [
    k4_fat_tree(),
    topology.build("fattree", k=6, host_rate_mbit=RATE_MBIT),
    small_spine_leaf(),
    topology.build("spineleaf", leaves=3, spines=2, hosts_per_leaf=2, host_rate_mbit=RATE_MBIT),
], ids=["fattree-k4", "fattree-k6", "spineleaf-2x2", "spineleaf-3x2"])
def test_every_feeder_is_another_port_of_the_same_switch(fab):
    owner = interface_owners(fab)
    for egress, ingress in feeding_ports(fab).items():
        assert ingress, egress  # every queue carries some host's traffic
        assert ingress == sorted(set(ingress))
        assert egress not in ingress
        assert {owner[i] for i in ingress} == {owner[egress]}


def path_feeders(fab: Fabric) -> dict[str, list[str]]:
    """The same answer derived another way: walk every ECMP path (every shortest switch path
    between two hosts' edge switches) and note, at each switch, the port a packet came in on
    and the port it left by."""
    graph = fab.graph()
    switch_graph = graph.subgraph(s.name for s in fab.switches)
    found: dict[str, set[str]] = {}
    for src in fab.hosts:
        for dst in fab.hosts:
            if src.name == dst.name:
                continue
            first, _ = fab.host_attachment(src.name)
            last, _ = fab.host_attachment(dst.name)
            for path in nx.all_shortest_paths(switch_graph, first, last):
                hops = [src.name, *path, dst.name]
                for before, switch, after in zip(hops, hops[1:], hops[2:]):
                    egress = intf_name(switch, graph.edges[switch, after]["ports"][switch])
                    ingress = intf_name(switch, graph.edges[switch, before]["ports"][switch])
                    found.setdefault(egress, set()).add(ingress)
    return {egress: sorted(ingress) for egress, ingress in found.items()}


@pytest.mark.parametrize("fab", [
    k4_fat_tree(),
    small_spine_leaf(),
    topology.build("dragonfly", p=1, a=2, h=1),
], ids=["fattree-k4", "spineleaf-2x2", "dragonfly"])
def test_feeders_are_exactly_the_ports_ecmp_paths_use(fab):
    assert feeding_ports(fab) == path_feeders(fab)


def test_rail_port_routes_are_covered_by_the_feeders():
    """A rail fabric's node switches send a GPU's traffic out of its own rail's NIC whatever
    the shortest paths say; the feeders may pause more than that, never less."""
    from testbed.controllers.routing.ecmp import compute_rules

    fab = topology.build("rail", nodes=3, gpus_per_node=2, spines=2, host_rate_mbit=RATE_MBIT)
    feeders = feeding_ports(fab)
    rules = compute_rules(fab)
    port_routes = [(name, r) for name, sw in rules.items() for r in sw.port_routes]
    assert port_routes  # the rail fabric does pin GPUs to rails
    for name, route in port_routes:
        assert intf_name(name, route.in_port) in feeders[intf_name(name, route.out_port)]


def pause_dependencies(fab: Fabric, feeders: dict[str, list[str]]) -> nx.DiGraph:
    """Queue Q -> queue Q' when Q crossing XOFF pauses Q': Q' is the switch egress queue at the
    far end of a port that feeds Q (a host NIC at the far end ends the chain)."""
    peer = {}
    for link in fab.links:
        for end in (0, 1):
            peer[link.intf(end)] = (link.intf(1 - end), (link.a, link.b)[1 - end])
    deps = nx.DiGraph()
    for queue, ingress in feeders.items():
        deps.add_node(queue)
        for port in ingress:
            upstream, node = peer[port]
            if not fab.nodes[node].is_host:
                deps.add_edge(queue, upstream)
    return deps


def every_other_port(fab: Fabric) -> dict[str, list[str]]:
    """What a switch would pause without feeders: all its other ports, for every queue."""
    return {intf: [p for p in intfs if p != intf]
            for intfs in switch_interfaces(fab).values() for intf in intfs}


# edge down <- aggregation down <- core down <- aggregation up <- edge up (<- hosts)
FAT_TREE_LONGEST_PAUSE_CHAIN = 4


@pytest.mark.parametrize("fab", [
    k4_fat_tree(),
    topology.build("fattree", k=6, host_rate_mbit=RATE_MBIT),
    small_spine_leaf(),
], ids=["fattree-k4", "fattree-k6", "spineleaf-2x2"])
def test_pause_dependencies_of_shortest_path_routing_are_acyclic(fab):
    """Up/down routing's deadlock freedom: no cycle of queues each waiting for the next."""
    deps = pause_dependencies(fab, feeding_ports(fab))
    assert deps.number_of_edges() > 0
    assert nx.is_directed_acyclic_graph(deps)
    # pausing every other port instead closes cycles (core -> aggregation -> core), so the
    # check above is not acyclic by construction
    assert not nx.is_directed_acyclic_graph(pause_dependencies(fab, every_other_port(fab)))


def test_the_longest_pause_chain_of_the_fat_tree():
    fab = k4_fat_tree()
    deps = pause_dependencies(fab, feeding_ports(fab))
    assert nx.dag_longest_path_length(deps) == FAT_TREE_LONGEST_PAUSE_CHAIN
    # an aggregation's uplink queue never pauses a core, only the edges below it
    assert sorted(deps.successors("p0a0-eth3")) == ["p0e0-eth3", "p0e1-eth3"]
    # an edge's uplink queue is fed by hosts only: congestion there pauses no switch queue
    assert list(deps.successors("p0e0-eth3")) == []


def test_ports_to_pause_with_feeders_on_an_aggregation_switch():
    feeders = feeding_ports(k4_fat_tree())
    agg = ["p0a0-eth1", "p0a0-eth2", "p0a0-eth3", "p0a0-eth4"]
    own = {q: feeders[q] for q in agg}
    assert ports_to_pause(agg, set(), own) == dict.fromkeys(agg, False)
    # an uplink queue toward a core pauses the edges only
    assert ports_to_pause(agg, {"p0a0-eth3"}, own) == {
        "p0a0-eth1": True, "p0a0-eth2": True, "p0a0-eth3": False, "p0a0-eth4": False}
    # a downlink queue toward an edge pauses the other edge and both cores, not its own port
    assert ports_to_pause(agg, {"p0a0-eth1"}, own) == {
        "p0a0-eth1": False, "p0a0-eth2": True, "p0a0-eth3": True, "p0a0-eth4": True}
    # two downlinks: each feeds the other, so every port is paused
    assert ports_to_pause(agg, {"p0a0-eth1", "p0a0-eth2"}, own) == dict.fromkeys(agg, True)
    # a queue no port feeds pauses nothing
    assert ports_to_pause(agg, {"p0a0-eth1"}, {}) == dict.fromkeys(agg, False)


def test_ports_to_pause_with_every_other_port_as_feeders_is_the_default():
    rng = random.Random(8021)
    fab = k4_fat_tree()
    for switch_ports in switch_interfaces(fab).values():
        everyone = {q: [p for p in switch_ports if p != q] for q in switch_ports}
        for _ in range(10):
            congested = {p for p in switch_ports if rng.random() < 0.4}
            assert ports_to_pause(switch_ports, congested, everyone) == \
                ports_to_pause(switch_ports, congested)


def test_ports_to_pause_with_feeders_never_pauses_more_than_without():
    rng = random.Random(88)
    fab = k4_fat_tree()
    feeders = feeding_ports(fab)
    for switch_ports in switch_interfaces(fab).values():
        for _ in range(10):
            congested = {p for p in switch_ports if rng.random() < 0.4}
            narrow = ports_to_pause(switch_ports, congested, feeders)
            wide = ports_to_pause(switch_ports, congested)
            assert all(wide[p] for p in switch_ports if narrow[p])


def test_shortest_path_modes_are_the_controllers_and_not_the_dragonflys():
    assert set(SHORTEST_PATH_MODES) == set(ROUTING_MODES)
    assert not set(SHORTEST_PATH_MODES) & set(DRAGONFLY_MODES)


@pytest.mark.parametrize("routing", ["ecmp", "single"])
def test_agent_plan_with_shortest_path_routing_carries_the_feeders(routing):
    fab = k4_fat_tree()
    plan = agent_plan(fab, pfc_queue(fan_in=switch_fan_in(fab)), poll_s=0.001, routing=routing)
    assert plan.feeders == feeding_ports(fab)
    for switch, switch_ports in plan.switch_ports.items():
        own = plan.switch_feeders(switch)
        assert list(own) == switch_ports
        assert own == {intf: plan.feeders[intf] for intf in switch_ports}
    assert plan.switch_feeders("p0a0")["p0a0-eth3"] == ["p0a0-eth1", "p0a0-eth2"]


def test_agent_plan_defaults_to_ecmp_feeders():
    fab = small_spine_leaf()
    plan = agent_plan(fab, pfc_queue(fan_in=switch_fan_in(fab)), poll_s=0.001)
    assert plan.feeders == feeding_ports(fab)


@pytest.mark.parametrize("routing", DRAGONFLY_MODES)
def test_agent_plan_with_dragonfly_routing_has_no_feeders(routing):
    fab = topology.build("dragonfly", p=1, a=2, h=1, host_rate_mbit=RATE_MBIT)
    plan = agent_plan(fab, pfc_queue(fan_in=switch_fan_in(fab)), poll_s=0.001, routing=routing)
    assert plan.feeders is None
    for switch in plan.switch_ports:
        assert plan.switch_feeders(switch) is None  # ports_to_pause then pauses every other port


def test_switch_feeders_fills_queues_no_port_feeds():
    fab = small_spine_leaf()
    plan = agent_plan(fab, pfc_queue(fan_in=switch_fan_in(fab)), poll_s=0.001)
    partial = AgentPlan(plan.quanta, plan.storm_threshold_ms, plan.priorities,
                        plan.mtu_bytes, plan.poll_s, plan.switch_ports, plan.interfaces,
                        feeders={"l0-eth3": ["l0-eth1", "l0-eth2"]})
    assert partial.switch_feeders("l0") == {"l0-eth1": [], "l0-eth2": [],
                                           "l0-eth3": ["l0-eth1", "l0-eth2"], "l0-eth4": []}


@pytest.mark.parametrize("routing", ["ecmp", "valiant"])
def test_agent_plan_with_feeders_round_trips_through_json(routing):
    fab = k4_fat_tree()
    plan = agent_plan(fab, pfc_queue(fan_in=switch_fan_in(fab)), poll_s=0.002, routing=routing)
    again = AgentPlan.from_json(json.loads(json.dumps(plan.to_json())))
    assert again == plan
    assert again.feeders == plan.feeders
    assert again.switch_feeders("p0e0") == plan.switch_feeders("p0e0")


def test_a_plan_written_before_feeders_reads_as_none():
    fab = small_spine_leaf()
    data = agent_plan(fab, pfc_queue(fan_in=switch_fan_in(fab)), poll_s=0.001).to_json()
    del data["feeders"]
    assert AgentPlan.from_json(data).feeders is None
