"""The testbed's Python API: bring a fabric up from a scenario or a topology, use its hosts
as Mininet hosts, run commands, workloads and whole experiments on it, read its metrics, take
it down. ::

    import testbed.api

    with testbed.api.up("fattree-allreduce") as fab:          # or up(topology="spineleaf")
        h1, h2 = fab.get("p0e0h0", "p3e1h1")                   # mininet.node.Host objects
        print(h1.cmd("ping -c1", h2.IP()))
        outcome = fab.run("allreduce", params={"size_bytes": 262144, "iters": 1})
        fab.link_down("p0e0", "p0a0")
        print(fab.metrics()["link_rate_mbit"])

This module is the API's public face: what it names is what users import. The live fabric is
testbed.interactive.live (``up``, ``LiveFabric``); docs/api.md has the whole API.
"""
from __future__ import annotations

from testbed.interactive.live import LiveFabric, up

__all__ = ["LiveFabric", "up"]
