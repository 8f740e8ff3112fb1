"""Checks the harness makes on every fabric before an experiment measures on it, beyond
reachability: OVS holds the select groups the controller computed, and every host reaches
the anycast service (where a setup has one)."""
from __future__ import annotations

from testbed.controllers.routing.anycast import anycast_routes, replica_for_hosts
from testbed.controllers.routing.fabric_state import AnycastService, FabricState
from testbed.errors import TestbedError
from testbed.system.ovs_tables import parse_groups


def check_groups(net, setup) -> dict:
    """Compare the select groups OVS holds with the ones the controller was to install."""
    anycast = AnycastService.from_dict(setup.anycast) if setup.anycast is not None else None
    tables = FabricState(net.fabric, setup.routing, anycast).tables
    expected = sum(len(t.groups) for t in tables.values())
    found = sum(1 for name in tables for g in parse_groups(net.switchd.dump_groups(name))
                if g.type == "select")
    if found != expected:
        raise TestbedError(f"OVS holds {found} select groups, the controller should have "
                           f"installed {expected}")
    return {"select_groups": found}


def anycast_address_argv(service_ip: str) -> list[str]:
    """What a replica runs to hold the service address: on lo, so it answers for the address
    but never claims it on the fabric, where the controller answers ARP for it."""
    return ["ip", "addr", "add", f"{service_ip}/32", "dev", "lo"]


def anycast_reachable(net, setup, log=print) -> dict:
    """Give every replica the service address, then prove every host reaches the service;
    returns which replica each host's requests should reach (routing.anycast)."""
    service = AnycastService.from_dict(setup.anycast)
    for name in service.replicas:
        out = net.cmd(name, *anycast_address_argv(service.service_ip))
        if out.strip():
            raise TestbedError(f"{name} cannot take the anycast address: {out.strip()[-200:]}")
    hosts = [h.name for h in net.fabric.hosts]
    answered = [name for name in hosts if service.service_ip in net.cmd(
        name, "fping", "-a", "-q", "-r", "3", "-t", "1000", service.service_ip).split()]
    log(f"anycast {service.service_ip}: replicas {', '.join(service.replicas)}; "
        f"{len(answered)}/{len(hosts)} hosts reach it")
    if len(answered) != len(hosts):
        missing = sorted(set(hosts) - set(answered))
        raise TestbedError(f"{len(missing)} hosts do not reach anycast {service.service_ip}, "
                           f"first {missing[0]}; see {net.workdir}/controller.log")
    routes = anycast_routes(net.fabric, service.service_ip, service.replicas, mode=setup.routing)
    return {**service.to_dict(), "hosts_reaching": len(answered),
            "replica_for_host": replica_for_hosts(net.fabric, routes, service.replicas)}
