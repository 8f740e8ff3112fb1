"""A line of switches with one host at each end: the smallest fabric, used to measure how
fast this machine forwards (``testbed bench``).

    h0 --- s0 --- s1 --- ... --- s{n-1} --- h1
"""
from __future__ import annotations

from testbed.errors import ConfigError
from testbed.model.topology.base import HOST, Fabric, Node, host_address

LINE_SWITCH = "line"


def line(switches: int = 2, host_rate_mbit: float | None = None, mtu_bytes: int = 9000) -> Fabric:
    """``host_rate_mbit=None`` leaves every link unshaped (as fast as the machine forwards)."""
    if not isinstance(switches, int) or isinstance(switches, bool) or switches < 1:
        raise ConfigError("switches", f"must be a positive integer, got {switches!r}")
    if host_rate_mbit is not None and not host_rate_mbit > 0:  # also rejects NaN
        raise ConfigError("host_rate_mbit", f"must be positive, got {host_rate_mbit}")
    fabric = Fabric(kind="line", mtu_bytes=mtu_bytes,
                    params={"switches": switches, "host_rate_mbit": host_rate_mbit})
    for i in range(switches):
        fabric.add_node(Node(f"s{i}", LINE_SWITCH, (i,), dpid=i + 1))
    for end, (sw, port) in enumerate([("s0", 1), (f"s{switches - 1}", 2)]):
        ip, mac = host_address(0, 0, end + 2)
        fabric.add_node(Node(f"h{end}", HOST, (end,), ip=ip, mac=mac))
        fabric.add_link(f"h{end}", 0, sw, port, host_rate_mbit)
    for i in range(switches - 1):
        fabric.add_link(f"s{i}", 2, f"s{i + 1}", 1, host_rate_mbit)
    return fabric
