"""Dragonfly (Kim, Dally, Scott, Abts, ISCA 2008): groups of routers, fully connected inside a
group by local links, and groups joined to each other by global links.

p hosts per router, a routers per group, h global links per router, g groups (g <= a*h + 1):
  router radix k = p + (a - 1) + h; hosts N = a*p*g; routers a*g; local links g*a*(a-1)/2;
  global links g*(g-1)/2 (exactly one between every pair of groups).
  Balanced: a = 2p = 2h; the default p=2, a=4, h=2 gives g = 9 groups, 36 routers, 72 hosts.
Minimal routing (the paper's) is local-global-local: at most 3 router hops, one global link.
Shortest paths in the graph are not always minimal routes: a router holding global links to
two groups offers a 2-hop global-global path that beats the 3-hop minimal route, so
shortest-path ECMP sometimes crosses two global links (Valiant/UGAL need their own routing).

        group 0                 group 1            router g{G}r{R}: ports 1..p hosts,
    g0r0 ---- g0r1          g1r0 ---- g1r1           p+1..p+a-1 local (to the other routers
     |  \\  /  |              |  \\  /  |              in ascending order), p+a+j global
     |   \\/   |              |   \\/   |              channel j (j = 0..h-1)
     |   /\\   |              |   /\\   |            host g{G}r{R}h{i}: 10.G.R.(i+2)
    g0r3 ---- g0r2          g1r3 ---- g1r2
      \\___ one global link per pair of groups ___/

Global-link arrangement ("consecutive"): router r of group G owns global channels
c = r*h + j (j = 0..h-1). Channel c of group G leads to group (G + c + 1) mod g when
c < g - 1; channels c >= g - 1 stay unused (only when g < a*h + 1, and they are the highest
ports of the last routers, so ports stay contiguous). Its peer end is channel
c' = g - 2 - c of that group, which leads back, since (G + c + 1) + c' + 1 = G + g.
Worked example, a=4, h=2, g=9 (8 channels per group, all used):
  g0 channel 0 (g0r0, j=0, port p+a)   <-> g1 channel 7 (g1r3, j=1, port p+a+1)
  g0 channel 1 (g0r0, j=1)             <-> g2 channel 6 (g2r3, j=0)
  g0 channel 7 (g0r3, j=1)             <-> g8 channel 0 (g8r0, j=0)
  g3 channel 2 (g3r1, j=0)             <-> g6 channel 5 (g6r2, j=1)
so group 0 reaches groups 1..8 through channels 0..7, and every pair once.

DPIDs are 0x00RR_GGGG_RRRR (role code, group, router).
"""
from __future__ import annotations

from testbed.errors import ConfigError
from testbed.model.topology.base import (
    HOST,
    ROUTER,
    Fabric,
    Node,
    host_address,
    switch_dpid,
)
from testbed.model.topology.checks import (
    MAX_COUNT,
    check_count,
    check_mtu,
    check_rate,
    is_int,
)

ARRANGEMENT = "consecutive"


def router_name(group: int, router: int) -> str:
    return f"g{group}r{router}"


def global_peer(group: int, channel: int, groups: int) -> tuple[int, int]:
    """(group, channel) at the far end of global channel ``channel`` of ``group``."""
    if not 0 <= channel < groups - 1:
        raise ValueError(f"channel {channel} is unused with {groups} groups")
    return (group + channel + 1) % groups, groups - 2 - channel


def dragonfly(p: int = 2, a: int = 4, h: int = 2, g: int | None = None,
              host_rate_mbit: float = 100.0, global_rate_mbit: float | None = None,
              local_rate_mbit: float | None = None, mtu_bytes: int = 9000) -> Fabric:
    """Build the description of a dragonfly; g defaults to a*h + 1 and link rates to the host
    rate."""
    check_count("p", p)
    check_count("a", a)
    check_count("h", h)
    most = a * h + 1
    if g is None:
        g = most
    if not is_int(g) or g < 2:
        raise ConfigError("g", f"must be an integer >= 2, got {g!r}")
    if g > most:
        raise ConfigError("g", f"at most a*h+1 = {most} groups (one global link per pair), got {g}")
    if g > MAX_COUNT:
        raise ConfigError("g", f"{g} groups; names and addresses support at most {MAX_COUNT}")
    check_rate("host_rate_mbit", host_rate_mbit)
    local_rate_mbit = host_rate_mbit if local_rate_mbit is None else local_rate_mbit
    check_rate("local_rate_mbit", local_rate_mbit)
    global_rate_mbit = host_rate_mbit if global_rate_mbit is None else global_rate_mbit
    check_rate("global_rate_mbit", global_rate_mbit)
    check_mtu(mtu_bytes)
    fabric = Fabric(kind="dragonfly", mtu_bytes=mtu_bytes, params={
        "p": p, "a": a, "h": h, "g": g, "host_rate_mbit": host_rate_mbit,
        "local_rate_mbit": local_rate_mbit, "global_rate_mbit": global_rate_mbit,
        "radix_k": p + a + h - 1, "hosts_N": a * p * g, "arrangement": ARRANGEMENT})

    for group in range(g):
        for r in range(a):
            router = fabric.add_node(Node(router_name(group, r), ROUTER, (group, r),
                                          dpid=switch_dpid(ROUTER, group, r)))
            for i in range(p):
                ip, mac = host_address(group, r, i + 2)
                host = fabric.add_node(Node(f"{router.name}h{i}", HOST, (group, r, i),
                                            ip=ip, mac=mac))
                fabric.add_link(host.name, 0, router.name, i + 1, host_rate_mbit)
    for group in range(g):
        for r1 in range(a):
            for r2 in range(r1 + 1, a):
                # port p+1+x reaches the x-th other router in ascending order
                fabric.add_link(router_name(group, r1), p + r2, router_name(group, r2),
                                p + 1 + r1, local_rate_mbit)
    for group in range(g):
        for channel in range(min(a * h, g - 1)):
            peer, peer_channel = global_peer(group, channel, g)
            if group < peer:  # each link once, from its lower-numbered group
                fabric.add_link(router_name(group, channel // h), p + a + channel % h,
                                router_name(peer, peer_channel // h),
                                p + a + peer_channel % h, global_rate_mbit)
    return fabric
