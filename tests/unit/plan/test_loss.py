"""Link loss without netem: where each direction of a link is cut, the program's configuration,
the commands, and the C program itself (compiled for BPF, and run natively against the Python
rule)."""
from __future__ import annotations

import random
import shutil
import struct
import subprocess
from pathlib import Path

import pytest

from testbed.errors import ConfigError
from testbed.model.topology import build
from testbed.plan.bpf_maps import pack_value
from testbed.plan.loss_plan import (
    ANY_DSCP,
    CONFIG_LAYOUT,
    COUNTERS_LAYOUT,
    HOST_KEY_FLAG,
    LOSS_SOURCE,
    MODE_NTH,
    MODE_RANDOM,
    Cut,
    Loss,
    attach_commands,
    compile_command,
    config_commands,
    direction_cut,
    every_link_cuts,
    host_key,
    is_lost,
    link_cuts,
    probability_u32,
)

TRIALS = 20_000


def fabric():
    return build("fattree", k=4)


def test_every_direction_is_lost_at_its_sending_end():
    f = fabric()
    assert direction_cut(f, "p0e0", "p0a0") == Cut("p0e0", "p0a0", "p0e0-eth3")
    assert direction_cut(f, "p0a0", "p0e0") == Cut("p0a0", "p0e0", "p0a0-eth1")
    host = f.nodes["p0e0h0"]
    assert direction_cut(f, "p0e0h0", "p0e0") == Cut("p0e0h0", "p0e0", "p0e0h0-eth0",
                                                      host_key(host.mac))
    assert direction_cut(f, "p0e0", "p0e0h0") == Cut("p0e0", "p0e0h0", "p0e0-eth1")
    assert [c.intf for c in link_cuts(f, "p0e0h0", "p0e0")] == ["p0e0h0-eth0", "p0e0-eth1"]
    cuts = every_link_cuts(f)
    assert len(cuts) == 2 * len(f.links)
    hosts = [c for c in cuts if c.host_key is not None]
    assert len(hosts) == len(f.hosts) and len({c.host_key for c in hosts}) == len(f.hosts)
    assert {c.section for c in cuts} == {"classifier", "host"}
    with pytest.raises(ConfigError):
        direction_cut(f, "p0e0", "p3a0")


def test_a_host_is_keyed_by_its_mac_with_the_flag_no_ifindex_sets():
    assert host_key("02:00:0a:00:00:02") == HOST_KEY_FLAG | 0x0A000002
    assert host_key("02:00:8a:01:02:03") == HOST_KEY_FLAG | 0x0A010203  # the low 31 bits
    assert HOST_KEY_FLAG == 2**31


def test_loss_is_a_fraction_or_every_nth_and_validated():
    assert Loss(0.01).fraction == 0.01 and Loss(every_nth=10).every_nth == 10
    for bad in (dict(), dict(fraction=0.1, every_nth=2), dict(fraction=1.5),
                dict(every_nth=0), dict(fraction=0.1, dscp=64)):
        with pytest.raises(ConfigError):
            Loss(**bad)


def test_config_bytes_by_hand():
    # 1% of 2^32 is 42949672.96 -> 42949673; any DSCP is 0xff
    assert probability_u32(0.01) == 42949673 and probability_u32(1.0) == 2**32 - 1
    assert Loss(0.01).config() == struct.pack("=IIII", MODE_RANDOM, 42949673, 0, 0xFF)
    assert Loss(every_nth=7, dscp=26).config() == struct.pack("=IIII", MODE_NTH, 0, 7, 26)
    assert ANY_DSCP == 0xFF


def test_commands_attach_before_the_marker_and_write_the_config_last():
    cut = Cut("p0e0", "p0a0", "p0e0-eth3")
    obj = Path("/cache/loss.o")
    assert attach_commands(cut, obj) == [
        ["tc", "qdisc", "replace", "dev", "p0e0-eth3", "clsact"],
        ["tc", "filter", "replace", "dev", "p0e0-eth3", "egress", "prio", "1", "handle", "1",
         "bpf", "da", "obj", "/cache/loss.o", "sec", "classifier"]]
    host = Cut("p0e0h0", "p0e0", "p0e0h0-eth0", host_key("02:00:0a:00:00:02"))
    assert attach_commands(host, obj)[1][-1] == "host"
    zero, config = config_commands(42, Loss(0.5))
    assert zero[3:5] == ["pinned", "/sys/fs/bpf/tc/globals/loss_counters"]
    assert config[3:5] == ["pinned", "/sys/fs/bpf/tc/globals/loss_config"]
    assert config[5:11] == ["key", "hex", "2a", "00", "00", "00"]  # ifindex 42, native order


def test_the_rule_by_hand():
    nth = Loss(every_nth=3)
    assert [is_lost(nth, seen, 0) for seen in range(1, 8)] == [
        False, False, True, False, False, True, False]
    half = Loss(0.5)
    assert is_lost(half, 1, 2**31 - 1) and not is_lost(half, 1, 2**31)


# --- the C program -------------------------------------------------------------------------


def require(tool: str) -> None:
    if shutil.which(tool) is None:
        pytest.fail(f"{tool} is missing: scripts/install.sh installs it")


def test_the_program_compiles_for_bpf(tmp_path):
    require("clang")
    out = subprocess.run(compile_command(LOSS_SOURCE, tmp_path / "loss.o"),
                         capture_output=True, text=True)
    assert out.returncode == 0 and out.stderr == "", out.stderr


NATIVE = r"""
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <linux/bpf.h>
#define __BPF_HELPERS__
#define SEC(name)
#define __uint(name, val) int (*name)[val]
#define __type(name, val) __typeof__(val) *name
#define __always_inline inline __attribute__((always_inline))
enum { LIBBPF_PIN_NONE, LIBBPF_PIN_BY_NAME };
static void *bpf_map_lookup_elem(void *map, const void *key);
static long bpf_map_update_elem(void *map, const void *key, const void *value, __u64 flags);
static __u32 bpf_get_prandom_u32(void);
static long bpf_skb_load_bytes(const void *skb, __u32 off, void *to, __u32 len);
#include "LOSS_C"
static struct loss_config cfg;
static struct loss_counters ctr;
static int have_ctr;
static unsigned char pkt[64];
static __u32 rnd;
static __u32 last_key;
static void *bpf_map_lookup_elem(void *map, const void *key)
{
	memcpy(&last_key, key, sizeof last_key);
	if (map == &loss_config) return &cfg;
	return have_ctr ? &ctr : NULL;
}
static long bpf_map_update_elem(void *map, const void *key, const void *value, __u64 flags)
{
	(void)map; (void)key; (void)flags;
	memcpy(&ctr, value, sizeof ctr); have_ctr = 1; return 0;
}
static __u32 bpf_get_prandom_u32(void) { return rnd; }
static long bpf_skb_load_bytes(const void *skb, __u32 off, void *to, __u32 len)
{
	(void)skb; memcpy(to, pkt + off, len); return 0;
}
int main(void)
{
	struct __sk_buff skb = {0};
	unsigned mode, prob, nth, dscp, n, pkt_dscp;
	if (scanf("%u %u %u %u %u", &mode, &prob, &nth, &dscp, &n) != 5) return 2;
	cfg.mode = mode; cfg.probability = prob; cfg.every_nth = nth; cfg.dscp = dscp;
	skb.protocol = htons(0x0800);
	for (unsigned i = 0; i < n; i++) {
		if (scanf("%u %u", &pkt_dscp, &rnd) != 2) return 2;
		pkt[14 + 1] = (unsigned char)(pkt_dscp << 2);
		printf("%d\n", link_loss(&skb) == TC_ACT_STOLEN);
	}
	printf("%llu %llu\n", (unsigned long long)ctr.matched, (unsigned long long)ctr.dropped);
	return 0;
}
"""


def run_native(tmp_path, loss: Loss, packets: list[tuple[int, int]]) -> tuple[list[bool], tuple]:
    require("clang")
    src = tmp_path / "harness.c"
    src.write_text("#include <arpa/inet.h>\n" + NATIVE.replace("LOSS_C", str(LOSS_SOURCE)))
    binary = tmp_path / "harness"
    out = subprocess.run(["clang", "-O1", "-w", "-I/usr/include/x86_64-linux-gnu", "-o",
                          str(binary), str(src)], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    mode, prob, nth, dscp = struct.unpack("=IIII", loss.config())
    lines = [f"{mode} {prob} {nth} {dscp} {len(packets)}",
             *(f"{d} {r}" for d, r in packets)]
    run = subprocess.run([str(binary)], input="\n".join(lines) + "\n", capture_output=True,
                         text=True, check=True)
    *drops, totals = run.stdout.split("\n")[:-1]
    return [d == "1" for d in drops], tuple(int(x) for x in totals.split())


def test_the_c_program_follows_the_python_rule(tmp_path):
    rng = random.Random(1)
    packets = [(rng.choice([0, 26, 48]), rng.getrandbits(32)) for _ in range(TRIALS)]
    for loss in (Loss(0.01), Loss(0.3), Loss(every_nth=5), Loss(every_nth=4, dscp=26),
                 Loss(0.5, dscp=48)):
        drops, (matched, dropped) = run_native(tmp_path, loss, packets)
        seen, expected = 0, []
        for dscp, rnd in packets:
            if loss.dscp is not None and dscp != loss.dscp:
                expected.append(False)
                continue
            seen += 1
            expected.append(is_lost(loss, seen, rnd))
        assert drops == expected, loss
        assert (matched, dropped) == (seen, sum(expected))
        if loss.every_nth is None and loss.dscp is None:
            # the random draws are uniform: the share lost is near p (binomial, 5 sigma)
            sigma = (loss.fraction * (1 - loss.fraction) / TRIALS) ** 0.5
            assert abs(dropped / TRIALS - loss.fraction) < 5 * sigma


def test_the_maps_layouts_match_the_c_structs(tmp_path):
    require("clang")
    checks = []
    for name, layout in (("loss_config", CONFIG_LAYOUT), ("loss_counters", COUNTERS_LAYOUT)):
        size = len(pack_value(layout, {}))
        checks.append(f'_Static_assert(sizeof(struct {name}) == {size}, "{name}");')
    wrapper = tmp_path / "layout.c"
    wrapper.write_text(f'#include "{LOSS_SOURCE}"\n' + "\n".join(checks) + "\n")
    out = subprocess.run(compile_command(wrapper, tmp_path / "layout.o"), capture_output=True,
                         text=True)
    assert out.returncode == 0, out.stderr


HOST_MAIN = r"""
int main(void)
{
	struct __sk_buff skb = {0};
	unsigned b[6];
	cfg.mode = 2; cfg.every_nth = 1; cfg.dscp = 0xff;  /* lose every packet */
	if (scanf("%x:%x:%x:%x:%x:%x", b, b + 1, b + 2, b + 3, b + 4, b + 5) != 6) return 2;
	for (int i = 0; i < 6; i++) pkt[6 + i] = (unsigned char)b[i];  /* Ethernet source */
	skb.protocol = htons(0x0800);
	int verdict = host_link_loss(&skb);
	printf("%u %d\n", last_key, verdict == TC_ACT_STOLEN);
	return 0;
}
"""


def test_the_host_program_keys_by_the_source_mac_as_host_key_does(tmp_path):
    require("clang")
    src = tmp_path / "host.c"
    prelude = NATIVE[:NATIVE.index("int main(void)")].replace("LOSS_C", str(LOSS_SOURCE))
    src.write_text("#include <arpa/inet.h>\n" + prelude + HOST_MAIN)
    binary = tmp_path / "host"
    out = subprocess.run(["clang", "-O1", "-w", "-I/usr/include/x86_64-linux-gnu", "-o",
                          str(binary), str(src)], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    for mac in ("02:00:0a:00:00:02", "02:00:8a:01:02:03", "02:00:0a:03:01:ff"):
        run = subprocess.run([str(binary)], input=mac + "\n", capture_output=True, text=True,
                             check=True)
        key, stolen = run.stdout.split()
        assert int(key) == host_key(mac) and stolen == "1", mac
