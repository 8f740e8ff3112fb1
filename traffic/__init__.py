"""Workloads that run inside emulated hosts (one process per rank or endpoint), and their pure
schedules. Installed as testbed.traffic (setup.py), so a host runs them as ``python -m
testbed.traffic....``.

What they import: the standard library, numpy and this package, nothing else of the testbed,
so a host's interpreter loads little. Three heavy packages only where named, each optional for
the rest: scapy in roce/wire.py (RoCEv2's headers; the RoCE transport that imports it is
itself imported only by a RoCE rank), torch in training/torch_ddp.py (the torch extra) and
matplotlib in training/gantt.py (drawing a schedule). tests/unit/test_layers.py enforces this,
with import-linter's contract in setup.cfg."""
