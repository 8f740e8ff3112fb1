"""Switch egress queues beyond a rate and a buffer: ECN marking profiles, PFC thresholds and
pause frames, and the plans that put them on an interface.

Compute, then apply: everything here but ``apply`` is plain data and pure functions.

- ``profiles``: what a queue does (buffer, ECN profile, traffic classes from DSCP, PFC
  thresholds), validated on construction, plus the marking and virtual-queue rules the
  eBPF marker implements, in Python;
- ``scaling``: default thresholds from published anchors (DCTCP, DCQCN, 802.1Qbb),
  scaled to the emulated link rate, with a record of how;
- ``pfc``: 802.1Qbb frames and pause-quanta arithmetic;
- ``ecn_plan``: the tc/bpftool argument lists and map contents that attach a marker to a
  port, by the standard RED qdisc where the kernel has it, else by ``bpf/ecn_marker.c``;
- ``settings``: a run's ``ecn``, ``tcp_ecn`` and ``tcp_cc`` fields, checked and resolved
  against the machine's capabilities (the queue, its scaling record, the hosts' sysctls);
- ``monitor``: per-port counters and sampled queue depths, as the run's ``ecn`` summary.

The one module that is not pure, ``apply``, runs the plans as root on a running fabric
(``testbed.fabric.FabricNetwork`` calls it), reads the counters back and removes the pins.
"""
