"""Switch egress queues beyond a rate and a buffer: ECN marking profiles, PFC thresholds and
pause frames, and the plans that put them on an interface.

Compute, then apply: everything here is plain data and pure functions.

- ``profiles``: what a queue does (buffer, ECN profile, traffic classes from DSCP, PFC
  thresholds), validated on construction, plus the marking and virtual-queue rules the
  eBPF marker implements, in Python;
- ``scaling``: default thresholds from published anchors (DCTCP, DCQCN, 802.1Qbb),
  scaled to the emulated link rate, with a record of how;
- ``pfc``: 802.1Qbb frames and pause-quanta arithmetic;
- ``ecn_plan``: the tc/bpftool argument lists and map contents that attach a marker to a
  port, by the standard RED qdisc where the kernel has it, else by ``bpf/ecn_marker.c``.

Applying the plans (running tc and bpftool, as root) belongs to the fabric layer.
"""
