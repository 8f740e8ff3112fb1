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
    EGRESS,
    INGRESS,
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
    is_lost,
    link_cuts,
    probability_u32,
)

TRIALS = 20_000


def fabric():
    return build("fattree", k=4)


def test_a_switch_sends_its_loss_at_its_egress_a_host_at_the_switch_ingress():
    f = fabric()
    assert direction_cut(f, "p0e0", "p0a0") == Cut("p0e0", "p0a0", "p0e0-eth3", EGRESS)
    assert direction_cut(f, "p0a0", "p0e0") == Cut("p0a0", "p0e0", "p0a0-eth1", EGRESS)
    assert direction_cut(f, "p0e0h0", "p0e0") == Cut("p0e0h0", "p0e0", "p0e0-eth1", INGRESS)
    assert direction_cut(f, "p0e0", "p0e0h0") == Cut("p0e0", "p0e0h0", "p0e0-eth1", EGRESS)
    assert [c.intf for c in link_cuts(f, "p0e0h0", "p0e0")] == ["p0e0-eth1", "p0e0-eth1"]
    cuts = every_link_cuts(f)
    assert len(cuts) == 2 * len(f.links)
    switches = {s.name for s in f.switches}
    assert all(c.intf.split("-")[0] in switches for c in cuts)  # all in the root namespace
    with pytest.raises(ConfigError):
        direction_cut(f, "p0e0", "p3a0")


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
    cut = Cut("p0e0", "p0a0", "p0e0-eth3", EGRESS)
    obj = Path("/cache/loss.o")
    assert attach_commands(cut, obj) == [
        ["tc", "qdisc", "replace", "dev", "p0e0-eth3", "clsact"],
        ["tc", "filter", "replace", "dev", "p0e0-eth3", "egress", "prio", "1", "handle", "1",
         "bpf", "da", "obj", "/cache/loss.o", "sec", "classifier"]]
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
static void *bpf_map_lookup_elem(void *map, const void *key)
{
	(void)key;
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
		printf("%d\n", link_loss(&skb) == TC_ACT_SHOT);
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
