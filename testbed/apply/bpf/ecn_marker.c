// SPDX-License-Identifier: GPL-2.0
/*
 * ECN marking for an emulated switch egress queue, as a tc egress classifier.
 *
 * The port's real queue is an HTB class (the link rate) feeding a byte-limited FIFO. A tc
 * program cannot read that qdisc's backlog, so this one keeps a virtual copy of it: a FIFO
 * drained at the HTB rate, advanced on every packet by the Lindley recursion
 *
 *     backlog = max(0, q - rate * dt)        what the arriving packet finds
 *     q       = backlog + len                unless backlog + len > limit (the FIFO drops it)
 *
 * and marks CE on ECT(0)/ECT(1) IPv4 packets by the port's profile, applied to `backlog`
 * (the instantaneous queue the packet joins, as DCTCP and DCQCN switches mark):
 *   step: mark when backlog > k_bytes                                      (DCTCP)
 *   red:  p = 0 up to kmin, pmax * (backlog - kmin) / (kmax - kmin) up to kmax,
 *         1 above kmax                                                     (DCQCN)
 * testbed/plan/profiles.py holds the same rules in Python (mark_probability,
 * virtual_queue_step, anchored_backlog); testbed/plan/ecn_plan.py lays out the maps.
 * Non-ECT packets are never dropped here: the real FIFO decides drops, this program only
 * marks and counts. The clsact egress hook runs before the root qdisc, so it sees every
 * packet offered to the port, including those the FIFO will drop.
 *
 * Anchoring. A model drained at the nominal rate is only as good as the shaper's timing: an
 * HTB that drains slower (late timer wake-ups) or a class that is paused (PFC) leaves the
 * real queue standing while the virtual one empties, and the error integrates for as long as
 * the queue stays busy. So user space (testbed/apply/ecn_anchor.py) reads the real backlog of
 * every marked port every few milliseconds and writes it into `ecn_anchor`, with the time of
 * the reading, the port's `accepted_bytes` (below) read just before it, and a new `seq`. The
 * first packet that finds a seq it has not applied replaces the virtual backlog by
 *
 *     anchored = max(0, anchor.backlog + (accepted_now - anchor.accepted)
 *                       - rate * (now - anchor.time))          at most the FIFO's limit
 *
 * (bytes the FIFO accepted since the reading are added back, so packets that arrived between
 * the kernel's reading and this packet are not lost), records how far the model was off
 * (ecn_counters.anchor_*), restarts the drain clock at now and goes on as above. Between
 * anchors the model interpolates. `accepted_bytes` counts the bytes the virtual FIFO took in
 * (ecn_qdepth, updated under the port's lock: a plain aligned 64-bit store that user space
 * reads without it). A port without an anchor entry, or whose entry has seq 0, is never
 * anchored and behaves as a free-running model.
 *
 * Maps are pinned by name (tc puts them in /sys/fs/bpf/tc/globals/) and shared by every
 * interface the program is attached to, so each is keyed by the ifindex of the egress port
 * (root network namespace: ifindexes of other namespaces would collide). A port with no
 * config entry is passed through untouched and uncounted.
 *
 * Concurrency: two CPUs may transmit on the same port at once. The virtual queue (q, its
 * timestamp, the seq of the anchor applied last, the accepted bytes) is a read-modify-write,
 * so it is updated under the per-port bpf_spin_lock in its map value; max_queue_bytes and the
 * anchor counters are updated under the same lock. The other counters are plain sums and use
 * atomic adds. The anchor is written by user space in place under its own element's lock
 * (BPF_F_LOCK), and copied out here under that lock, before the port's lock is taken (one
 * lock at a time): a torn anchor is never read. Helpers may not be called under a lock, so
 * the map lookups, the clock and the random number come before either. The telemetry
 * sample is written after the lock with two plain 64-bit stores: a reader may pair a queue
 * depth with the time of a neighbouring packet, never a torn number.
 *
 * No CO-RE: the kernel has no /sys/kernel/btf/vmlinux, so only UAPI headers and plain
 * BTF-defined maps are used (iproute2 6.1 with libbpf loads them).
 */
#include <stddef.h>
#include <linux/bpf.h>
#include <linux/if_ether.h>
#include <linux/ip.h>
#include <linux/pkt_cls.h>
#include <bpf/bpf_endian.h>
#include <bpf/bpf_helpers.h>

#define ECN_MAX_PORTS 4096
#define NSEC_PER_SEC 1000000000ULL
/* An idle period this long empties any queue (limit < 2^32 B, rate >= 1 B/s); capping
 * it keeps secs * rate under 2^64 (rate < 2^32, checked in Python). */
#define MAX_IDLE_S (1ULL << 32)

#define ECN_MODE_OFF 0  /* count and sample only */
#define ECN_MODE_STEP 1
#define ECN_MODE_RED 2

#define INET_ECN_MASK 3
#define INET_ECN_NOT_ECT 0
#define INET_ECN_CE 3

#define VLAN_HLEN 4

/* Written by the testbed (testbed/plan/ecn_plan.py CONFIG_LAYOUT), read per packet. */
struct ecn_config {
	__u64 rate_bytes_per_s; /* the HTB class rate, in L2 bytes as HTB counts them */
	__u32 limit_bytes;      /* the FIFO's byte limit */
	__u32 mode;             /* ECN_MODE_* */
	__u32 k_bytes;          /* step threshold */
	__u32 kmin_bytes;       /* red: marking starts above this backlog */
	__u32 kmax_bytes;       /* red: every ECT packet is marked above this backlog */
	__u32 pmax;             /* red: probability at kmax, as pmax / 2^32 */
};

/* The virtual FIFO of one port. */
struct ecn_state {
	struct bpf_spin_lock lock;
	__u32 pad;
	__u64 queue_bytes; /* backlog right after the last packet was enqueued */
	__u64 last_ns;     /* drain clock (CLOCK_MONOTONIC ns): the queue has drained up to
			    * here. The latest packet's bpf_ktime_get_ns() when the queue was
			    * empty; while it is busy, less the time of the byte still draining,
			    * so that fractions of a byte carry from packet to packet. */
	__u64 anchor_seq;  /* seq of the last ecn_anchor applied (0: none yet) */
};

/* A reading of the port's real backlog, written by user space only (in place, under `lock`,
 * with BPF_F_LOCK); testbed/plan/ecn_plan.py ANCHOR_LAYOUT. */
struct ecn_anchor {
	struct bpf_spin_lock lock;
	__u32 pad;
	__u64 backlog_bytes;  /* the port's real backlog (its whole HTB tree) */
	__u64 time_ns;        /* when it was read (CLOCK_MONOTONIC, as bpf_ktime_get_ns) */
	__u64 accepted_bytes; /* ecn_qdepth.accepted_bytes read just before the backlog */
	__u64 seq;            /* new with every reading; 0: no reading */
};

/* Per-port counters since the entry was created (or reset by the testbed). */
struct ecn_counters {
	__u64 packets;            /* every packet offered to the port */
	__u64 bytes;
	__u64 ect_packets;        /* IPv4 ECT(0) or ECT(1) */
	__u64 ce_marks;           /* ECT packets this program set to CE */
	__u64 ce_arrived;         /* IPv4 packets already CE on arrival */
	__u64 not_ect_over;       /* non-ECT packets that found the backlog over the threshold */
	__u64 fifo_drops;         /* packets the virtual FIFO had no room for */
	__u64 max_queue_bytes;    /* peak virtual backlog */
	/* Anchors applied, and the model's error at each (virtual backlog just before it,
	 * less the anchored one): summed, summed absolute, and the largest absolute. */
	__u64 anchors;
	__s64 anchor_error_bytes;
	__u64 anchor_abs_error_bytes;
	__u64 anchor_max_abs_error_bytes;
};

/* Telemetry: the virtual backlog after the latest packet, and when; and every byte the
 * virtual FIFO has accepted (what anchoring adds back after a reading). */
struct ecn_qdepth {
	__u64 queue_bytes;
	__u64 time_ns;
	__u64 accepted_bytes;
};

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, ECN_MAX_PORTS);
	__type(key, __u32);
	__type(value, struct ecn_config);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} ecn_config SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, ECN_MAX_PORTS);
	__type(key, __u32);
	__type(value, struct ecn_state);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} ecn_state SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, ECN_MAX_PORTS);
	__type(key, __u32);
	__type(value, struct ecn_counters);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} ecn_counters SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, ECN_MAX_PORTS);
	__type(key, __u32);
	__type(value, struct ecn_qdepth);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} ecn_qdepth SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, ECN_MAX_PORTS);
	__type(key, __u32);
	__type(value, struct ecn_anchor);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} ecn_anchor SEC(".maps");

/* The map value for `key`, created zeroed on first use. */
static __always_inline void *lookup_or_init(void *map, __u32 *key, const void *zero)
{
	void *value = bpf_map_lookup_elem(map, key);

	if (value)
		return value;
	bpf_map_update_elem(map, key, zero, BPF_NOEXIST); /* a racing CPU may win: fine */
	return bpf_map_lookup_elem(map, key);
}

/* Whole bytes the queue drains at rate_bytes_per_s in elapsed_ns. The fraction is not
 * lost: the drain clock (ecn_state.last_ns) advances only by the time the whole bytes took. */
static __always_inline __u64 drained_bytes(__u64 rate_bytes_per_s, __u64 elapsed_ns)
{
	__u64 secs = elapsed_ns / NSEC_PER_SEC;

	if (secs > MAX_IDLE_S)
		secs = MAX_IDLE_S;
	return secs * rate_bytes_per_s +
	       (elapsed_ns % NSEC_PER_SEC) * rate_bytes_per_s / NSEC_PER_SEC;
}

/* The virtual backlog at `now` grounded in a reading of the real one (`a_*`, see the header),
 * clamped to the FIFO's `limit` (so q stays under 2^32, which drained_bytes' caller relies
 * on). Bytes accepted since the reading are added back; a reading stamped after `now` (user
 * space wrote it after this packet read the clock) drains nothing. */
static __always_inline __u64 anchored_backlog(__u64 a_backlog, __u64 a_time_ns,
					      __u64 a_accepted, __u64 accepted_now, __u64 now,
					      __u64 rate_bytes_per_s, __u64 limit)
{
	__u64 q = a_backlog, drained;

	if (accepted_now > a_accepted)
		q += accepted_now - a_accepted;
	drained = drained_bytes(rate_bytes_per_s, now > a_time_ns ? now - a_time_ns : 0);
	q = q > drained ? q - drained : 0;
	return q < limit ? q : limit;
}

/* Whether an ECT packet that finds `backlog` bytes queued is marked; `rnd` is uniform. */
static __always_inline int should_mark(const struct ecn_config *cfg, __u64 backlog, __u32 rnd)
{
	__u64 threshold;

	switch (cfg->mode) {
	case ECN_MODE_STEP:
		return backlog > cfg->k_bytes;
	case ECN_MODE_RED:
		if (backlog <= cfg->kmin_bytes)
			return 0;
		if (backlog > cfg->kmax_bytes)
			return 1;
		/* pmax * (backlog - kmin) / (kmax - kmin), scaled by 2^32: both factors are
		 * under 2^32, so the product fits 64 bits. kmax > kmin is checked in Python. */
		threshold = (__u64)cfg->pmax * (backlog - cfg->kmin_bytes) /
			    (cfg->kmax_bytes - cfg->kmin_bytes);
		return (__u64)rnd < threshold;
	default:
		return 0;
	}
}

/* Over the threshold for counting non-ECT packets that a marking switch would have hit. */
static __always_inline int over_threshold(const struct ecn_config *cfg, __u64 backlog)
{
	if (cfg->mode == ECN_MODE_STEP)
		return backlog > cfg->k_bytes;
	if (cfg->mode == ECN_MODE_RED)
		return backlog > cfg->kmin_bytes;
	return 0;
}

/* Offset of the IPv4 header and its first 16-bit word (version/IHL, TOS), or -1 if the
 * frame is not IPv4 (one 802.1Q/802.1ad tag allowed). bpf_skb_load_bytes reads
 * non-linear packets too, so no header is missed for want of a pull. */
static __always_inline int ipv4_offset(struct __sk_buff *skb, __u8 word[2])
{
	int off = offsetof(struct ethhdr, h_proto);
	__be16 proto;

	if (bpf_skb_load_bytes(skb, off, &proto, sizeof(proto)))
		return -1;
	off = sizeof(struct ethhdr);
	if (proto == bpf_htons(ETH_P_8021Q) || proto == bpf_htons(ETH_P_8021AD)) {
		/* the tag control information, then the inner ethertype */
		if (bpf_skb_load_bytes(skb, off + 2, &proto, sizeof(proto)))
			return -1;
		off += VLAN_HLEN;
	}
	if (proto != bpf_htons(ETH_P_IP))
		return -1;
	if (bpf_skb_load_bytes(skb, off, word, 2) || word[0] >> 4 != 4)
		return -1;
	return off;
}

SEC("classifier")
int ecn_marker(struct __sk_buff *skb)
{
	/* zeroed entries for a port's first packet; on the stack, so the object has no
	 * .rodata map for tc to create on every attach */
	struct ecn_state zero_state = {};
	struct ecn_counters zero_counters = {};
	struct ecn_qdepth zero_sample = {};
	__u32 ifindex = skb->ifindex;
	struct ecn_config *cfg;
	struct ecn_state *st;
	struct ecn_counters *ctr;
	struct ecn_qdepth *sample;
	struct ecn_anchor *anchor;
	__u64 now, backlog, queue, elapsed, drained, anchored, abs_error;
	__u64 a_backlog = 0, a_time = 0, a_accepted = 0, a_seq = 0;
	__s64 error;
	__u32 len = skb->len, rnd = 0;
	__u8 word[2], old_tos, new_tos, ecn;
	int dropped = 0, off;

	cfg = bpf_map_lookup_elem(&ecn_config, &ifindex);
	if (!cfg)
		return TC_ACT_OK;
	st = lookup_or_init(&ecn_state, &ifindex, &zero_state);
	ctr = lookup_or_init(&ecn_counters, &ifindex, &zero_counters);
	sample = lookup_or_init(&ecn_qdepth, &ifindex, &zero_sample);
	if (!st || !ctr || !sample)
		return TC_ACT_OK;
	anchor = bpf_map_lookup_elem(&ecn_anchor, &ifindex); /* none: never anchored */
	now = bpf_ktime_get_ns();
	if (cfg->mode == ECN_MODE_RED)
		rnd = bpf_get_prandom_u32();

	if (anchor) {
		/* the reading as one piece: user space writes it under the same lock */
		bpf_spin_lock(&anchor->lock);
		a_backlog = anchor->backlog_bytes;
		a_time = anchor->time_ns;
		a_accepted = anchor->accepted_bytes;
		a_seq = anchor->seq;
		bpf_spin_unlock(&anchor->lock);
	}

	bpf_spin_lock(&st->lock);
	/* Another CPU may have stamped a later time after we read the clock: no drain then. */
	elapsed = now > st->last_ns ? now - st->last_ns : 0;
	drained = drained_bytes(cfg->rate_bytes_per_s, elapsed);
	if (st->queue_bytes > drained) {
		/* drained < queue_bytes < 2^32, so drained * 1e9 fits in 64 bits */
		backlog = st->queue_bytes - drained;
		st->last_ns += drained * NSEC_PER_SEC / cfg->rate_bytes_per_s;
	} else {
		backlog = 0;
		st->last_ns += elapsed;
	}
	if (a_seq && a_seq != st->anchor_seq) {
		/* a new reading of the real queue: it replaces the model's backlog */
		anchored = anchored_backlog(a_backlog, a_time, a_accepted, sample->accepted_bytes,
					    now, cfg->rate_bytes_per_s, cfg->limit_bytes);
		error = (__s64)backlog - (__s64)anchored; /* both under 2^32 */
		abs_error = error < 0 ? -error : error;
		ctr->anchors += 1;
		ctr->anchor_error_bytes += error;
		ctr->anchor_abs_error_bytes += abs_error;
		if (abs_error > ctr->anchor_max_abs_error_bytes)
			ctr->anchor_max_abs_error_bytes = abs_error;
		st->anchor_seq = a_seq;
		st->last_ns = now;
		backlog = anchored;
	}
	queue = backlog;
	if (backlog + len > cfg->limit_bytes) {
		dropped = 1;
	} else {
		queue = backlog + len;
		sample->accepted_bytes += len;
	}
	st->queue_bytes = queue;
	if (queue > ctr->max_queue_bytes)
		ctr->max_queue_bytes = queue;
	bpf_spin_unlock(&st->lock);

	sample->queue_bytes = queue;
	sample->time_ns = now;

	__sync_fetch_and_add(&ctr->packets, 1);
	__sync_fetch_and_add(&ctr->bytes, len);
	if (dropped) {
		/* The FIFO drops it: marking a packet that is never sent would mean nothing. */
		__sync_fetch_and_add(&ctr->fifo_drops, 1);
		return TC_ACT_OK;
	}

	off = ipv4_offset(skb, word);
	if (off < 0)
		return TC_ACT_OK;
	old_tos = word[1];
	ecn = old_tos & INET_ECN_MASK;
	if (ecn == INET_ECN_CE) {
		__sync_fetch_and_add(&ctr->ce_arrived, 1);
		return TC_ACT_OK;
	}
	if (ecn == INET_ECN_NOT_ECT) {
		if (over_threshold(cfg, backlog))
			__sync_fetch_and_add(&ctr->not_ect_over, 1);
		return TC_ACT_OK;
	}
	__sync_fetch_and_add(&ctr->ect_packets, 1);
	if (!should_mark(cfg, backlog, rnd))
		return TC_ACT_OK;

	new_tos = old_tos | INET_ECN_CE;
	if (bpf_skb_store_bytes(skb, off + offsetof(struct iphdr, tos), &new_tos,
				sizeof(new_tos), 0))
		return TC_ACT_OK;
	/* TOS is the low byte of the header's first 16-bit word, as it is of bpf_htons(tos). */
	if (bpf_l3_csum_replace(skb, off + offsetof(struct iphdr, check), bpf_htons(old_tos),
				bpf_htons(new_tos), sizeof(__u16))) {
		/* never leave a header whose checksum no longer matches */
		bpf_skb_store_bytes(skb, off + offsetof(struct iphdr, tos), &old_tos,
				    sizeof(old_tos), 0);
		return TC_ACT_OK;
	}
	__sync_fetch_and_add(&ctr->ce_marks, 1);
	return TC_ACT_OK;
}

char _license[] SEC("license") = "GPL";
