// SPDX-License-Identifier: GPL-2.0
/*
 * Packet loss on an emulated link, as a tc classifier, for kernels without netem.
 *
 * Attached to a root-namespace switch port, at its egress (loss on the link that port sends
 * on) or its ingress (loss on the link from a host, whose own end lives in the host's
 * namespace). Each port's entry in `loss_config` says how packets are lost:
 *   LOSS_MODE_RANDOM: each packet independently, with probability p / 2^32;
 *   LOSS_MODE_NTH:    every nth packet (the nth, 2nth, ...), deterministic, for tests;
 * optionally only packets of one DSCP (a traffic class), `dscp` 0..63, or any (LOSS_ANY_DSCP).
 * Lost packets are counted per port in `loss_counters` (packets seen that matched, packets
 * dropped), so the loss the run got is measured, not assumed.
 *
 * On egress the program sits before the ECN marker (tc prio 1; the marker is prio 2): a lost
 * packet returns TC_ACT_SHOT, every other packet TC_ACT_UNSPEC so that the next filter (the
 * marker) still classifies it. Maps are pinned by name in /sys/fs/bpf/tc/globals and keyed by
 * the root-namespace ifindex, as the marker's are.
 */
#include <stddef.h>
#include <linux/bpf.h>
#include <linux/if_ether.h>
#include <linux/ip.h>
#include <linux/pkt_cls.h>
#include <bpf/bpf_endian.h>
#include <bpf/bpf_helpers.h>

#define LOSS_MAX_PORTS 4096
#define LOSS_MODE_OFF 0
#define LOSS_MODE_RANDOM 1
#define LOSS_MODE_NTH 2
#define LOSS_ANY_DSCP 0xff

/* Written by the testbed (testbed/plan/loss_plan.py CONFIG_LAYOUT). */
struct loss_config {
	__u32 mode;         /* LOSS_MODE_* */
	__u32 probability;  /* random: p * 2^32, saturated at 2^32 - 1 */
	__u32 every_nth;    /* nth: drop packet n, 2n, ... (n >= 1) */
	__u32 dscp;         /* 0..63, or LOSS_ANY_DSCP */
};

struct loss_counters {
	__u64 matched;  /* packets this entry applied to */
	__u64 dropped;
};

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, LOSS_MAX_PORTS);
	__type(key, __u32);
	__type(value, struct loss_config);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} loss_config SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, LOSS_MAX_PORTS);
	__type(key, __u32);
	__type(value, struct loss_counters);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} loss_counters SEC(".maps");

/* The DSCP of an IPv4 packet, or -1 for anything else. */
static __always_inline int packet_dscp(struct __sk_buff *skb)
{
	__u8 tos;

	if (skb->protocol != bpf_htons(ETH_P_IP))
		return -1;
	if (bpf_skb_load_bytes(skb, ETH_HLEN + offsetof(struct iphdr, tos), &tos, 1) < 0)
		return -1;
	return tos >> 2;
}

/* Whether packet number `seen` (1-based, of the matching ones) is lost. */
static __always_inline int lost(const struct loss_config *cfg, __u64 seen, __u32 random)
{
	if (cfg->mode == LOSS_MODE_RANDOM)
		return random < cfg->probability;
	if (cfg->mode == LOSS_MODE_NTH)
		return cfg->every_nth && seen % cfg->every_nth == 0;
	return 0;
}

SEC("classifier")
int link_loss(struct __sk_buff *skb)
{
	struct loss_counters zero = {};
	__u32 ifindex = skb->ifindex;
	struct loss_config *cfg;
	struct loss_counters *ctr;
	__u64 seen;

	cfg = bpf_map_lookup_elem(&loss_config, &ifindex);
	if (!cfg || cfg->mode == LOSS_MODE_OFF)
		return TC_ACT_UNSPEC;
	if (cfg->dscp != LOSS_ANY_DSCP && packet_dscp(skb) != (int)cfg->dscp)
		return TC_ACT_UNSPEC;
	ctr = bpf_map_lookup_elem(&loss_counters, &ifindex);
	if (!ctr) {
		bpf_map_update_elem(&loss_counters, &ifindex, &zero, BPF_NOEXIST);
		ctr = bpf_map_lookup_elem(&loss_counters, &ifindex);
		if (!ctr)
			return TC_ACT_UNSPEC;
	}
	seen = __sync_fetch_and_add(&ctr->matched, 1) + 1;
	if (!lost(cfg, seen, bpf_get_prandom_u32()))
		return TC_ACT_UNSPEC;
	__sync_fetch_and_add(&ctr->dropped, 1);
	return TC_ACT_SHOT;
}

char _license[] SEC("license") = "GPL";
