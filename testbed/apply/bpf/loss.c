// SPDX-License-Identifier: GPL-2.0
/*
 * Packet loss on an emulated link, as a tc classifier, for kernels without netem.
 *
 * Two programs over the same maps:
 *   "classifier": at a root-namespace switch port's egress (loss on the link that port sends
 *     on), keyed by the port's ifindex;
 *   "host": at a host's own interface's egress, inside the host's namespace (loss on the link
 *     from the host). Not at the switch port's ingress: a userspace switch reads its ports
 *     with packet sockets, which see a packet before tc ingress could drop it. A host's
 *     interface index is not unique (each namespace numbers its own), so this program is
 *     keyed by the host's source MAC address instead: HOST_KEY_FLAG | its low 31 bits (the
 *     testbed's host MACs differ there; root-namespace ifindexes never set the flag).
 * Each entry in `loss_config` says how packets are lost:
 *   LOSS_MODE_RANDOM: each packet independently, with probability p / 2^32;
 *   LOSS_MODE_NTH:    every nth packet (the nth, 2nth, ...), deterministic, for tests;
 * optionally only packets of one DSCP (a traffic class), `dscp` 0..63, or any (LOSS_ANY_DSCP).
 * Lost packets are counted per cut in `loss_counters` (packets seen that matched, packets
 * dropped), so the loss the run got is measured, not assumed.
 *
 * The program sits before the ECN marker (tc prio 1; the marker is prio 2). A lost packet
 * returns TC_ACT_STOLEN: the sender is told it went out, as on a wire that loses it later
 * (TC_ACT_SHOT would hand the sending socket NET_XMIT_DROP, which TCP takes as a local
 * congestion signal and retries at once, and count in the qdisc's drops). Every other
 * packet returns TC_ACT_UNSPEC, so the next filter (the marker) still classifies it. Maps are pinned by name in /sys/fs/bpf/tc/globals, which every
 * namespace of the run shares (one mount namespace).
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
#define HOST_KEY_FLAG 0x80000000u

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

/* Count the packet under `key`, and drop it when its entry says so. */
static __always_inline int apply_loss(struct __sk_buff *skb, __u32 key)
{
	struct loss_counters zero = {};
	struct loss_config *cfg;
	struct loss_counters *ctr;
	__u64 seen;

	cfg = bpf_map_lookup_elem(&loss_config, &key);
	if (!cfg || cfg->mode == LOSS_MODE_OFF)
		return TC_ACT_UNSPEC;
	if (cfg->dscp != LOSS_ANY_DSCP && packet_dscp(skb) != (int)cfg->dscp)
		return TC_ACT_UNSPEC;
	ctr = bpf_map_lookup_elem(&loss_counters, &key);
	if (!ctr) {
		bpf_map_update_elem(&loss_counters, &key, &zero, BPF_NOEXIST);
		ctr = bpf_map_lookup_elem(&loss_counters, &key);
		if (!ctr)
			return TC_ACT_UNSPEC;
	}
	seen = __sync_fetch_and_add(&ctr->matched, 1) + 1;
	if (!lost(cfg, seen, bpf_get_prandom_u32()))
		return TC_ACT_UNSPEC;
	__sync_fetch_and_add(&ctr->dropped, 1);
	return TC_ACT_STOLEN;
}

SEC("classifier")
int link_loss(struct __sk_buff *skb)
{
	return apply_loss(skb, skb->ifindex);
}

SEC("host")
int host_link_loss(struct __sk_buff *skb)
{
	__u8 mac[4];

	/* the low four bytes of the Ethernet source address */
	if (bpf_skb_load_bytes(skb, ETH_ALEN + 2, mac, sizeof(mac)) < 0)
		return TC_ACT_UNSPEC;
	return apply_loss(skb, HOST_KEY_FLAG | (((__u32)mac[0] << 24 | (__u32)mac[1] << 16 |
						 (__u32)mac[2] << 8 | mac[3]) & ~HOST_KEY_FLAG));
}

char _license[] SEC("license") = "GPL";
