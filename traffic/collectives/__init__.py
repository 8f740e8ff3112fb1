"""Collective communication for emulated hosts: schedules as plain data, one executor, one
transport interface, an alpha-beta cost model and nccl-tests-style programs.

- ``schedule``: the data a collective is made of (who sends which element range to whom at
  each step, and whether the receiver adds or replaces), chunking, a lockstep reference
  simulator and a matching check.
- ``algorithms``: pure schedule builders (ring, recursive halving-doubling, double binary
  tree, hierarchical, pairwise AllToAll, chain and binomial Broadcast).
- ``executor``: runs one rank's part of a schedule over a transport, streaming slices.
- ``transport``: send/recv/sendrecv/barrier over TCP (multi-channel) or in-process sockets.
- ``data``: per-rank inputs from a seed, expected results, #wrong, sizes as nccl-tests counts them.
- ``cost``: alpha-beta predictions per algorithm and the cheapest choice for a size.
- ``program``: what every host program shares (address table, transport, JSON out).
- ``sweep`` and ``allreduce``: the host programs.
"""
