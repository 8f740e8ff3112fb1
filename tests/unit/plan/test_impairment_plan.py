"""Impairments by path: netem where the kernel has it, else the eBPF loss program for loss
(both directions of each lossy link cut where testbed.plan.loss_plan says) and a refusal for
delay; the plan's record, and the fabric layer and harness wiring."""
from __future__ import annotations

import pytest
from tests.unit.stand_ins import StandInFabric

from testbed.capabilities import Capability, Platform, choose_paths
from testbed.errors import ConfigError
from testbed.harness.plans import (
    IMPAIRMENT_EBPF_LOSS,
    IMPAIRMENT_NETEM,
    LOSS_PROGRAM_NEEDS,
    impairment_path,
    impairment_plan,
    impairment_problems,
)
from testbed.harness.scenario import ImpairmentSpec
from testbed.model.topology import build
from testbed.plan.bpf_maps import unpack_value, update_command
from testbed.plan.loss_plan import (
    CONFIG_LAYOUT,
    MODE_OFF,
    Cut,
    Loss,
    config_commands,
    host_key,
    loss_config_command,
    off_config,
)
from testbed.plan.port_queue import Impairment, impairment_change_argv, port_plan


def platform(netem: bool, loss_tools: bool = True) -> Platform:
    caps = {"sch_netem": Capability("sch_netem", netem, "CONFIG_NET_SCH_NETEM not set"
                                    if not netem else "module sch_netem loaded")}
    for name in LOSS_PROGRAM_NEEDS:
        caps[name] = Capability(name, loss_tools, f"{name} {'found' if loss_tools else 'missing'}")
    return Platform("test", caps, choose_paths(caps))


def fabric():
    return build("spineleaf", leaves=1, spines=1, hosts_per_leaf=2, host_rate_mbit=10.0,
                 mtu_bytes=1500)


def spec(**kwargs) -> ImpairmentSpec:
    return ImpairmentSpec.model_validate(kwargs)


def test_the_path_is_netem_where_the_kernel_has_it_else_the_loss_program():
    assert impairment_path(platform(True)) == IMPAIRMENT_NETEM
    assert impairment_path(platform(False)) == IMPAIRMENT_EBPF_LOSS


def test_only_delay_needs_netem():
    specs = [spec(link="all", loss_percent=1.0), spec(link=["l0", "l0h0"], delay_ms=2.0)]
    assert impairment_problems(specs, platform(True)) == []
    (problem,) = impairment_problems(specs, platform(False))
    assert problem.path == ("impairments", 1) and "delay needs the netem qdisc" in problem.message
    (missing,) = impairment_problems(specs[:1], platform(False, loss_tools=False))
    assert missing.path == ("impairments", 0) and "clang missing" in missing.message


def test_without_netem_each_direction_of_a_lossy_link_is_cut_once():
    f = fabric()
    plan = impairment_plan([spec(link=["l0h1", "l0"], loss_percent=1.0)], f, platform(False))
    assert plan.path == IMPAIRMENT_EBPF_LOSS and plan.netem == {}
    cuts = {(cut.src, cut.dst): (cut, loss) for cut, loss in plan.losses}
    # l0's port 2 leads to l0h1: l0 -> l0h1 is lost at that port's egress, l0h1 -> l0 at the
    # host's own interface's egress, in its namespace, keyed by its MAC
    assert cuts[("l0", "l0h1")] == (Cut("l0", "l0h1", "l0-eth2"), Loss(0.01))
    assert cuts[("l0h1", "l0")] == (Cut("l0h1", "l0", "l0h1-eth0",
                                         host_key(f.nodes["l0h1"].mac)), Loss(0.01))
    assert len(plan.losses) == 2


def test_a_later_entry_wins_per_direction_and_all_links_cover_every_direction():
    f = fabric()
    plan = impairment_plan([spec(link="all", loss_percent=1.0),
                            spec(link=["l0", "s0"], loss_percent=10.0)], f, platform(False))
    assert len(plan.losses) == 2 * len(f.links)
    fractions = {(cut.src, cut.dst): loss.fraction for cut, loss in plan.losses}
    assert fractions[("l0", "s0")] == fractions[("s0", "l0")] == 0.1
    assert fractions[("l0", "l0h0")] == 0.01
    record = plan.record()
    assert record["path"] == IMPAIRMENT_EBPF_LOSS and len(record["cuts"]) == 2 * len(f.links)
    assert {"src": "l0", "dst": "s0", "intf": "l0-eth3", "host_key": None,
            "loss_percent": 10.0} in record["cuts"]
    assert record["links"][1] == {"link": ["l0", "s0"], "delay_ms": 0.0, "jitter_ms": 0.0,
                                  "loss_percent": 10.0}


def test_with_netem_both_ends_get_the_impairment_and_no_program_runs():
    f = fabric()
    plan = impairment_plan([spec(link=["l0h1", "l0"], delay_ms=2.0, loss_percent=1.0)], f,
                           platform(True))
    assert plan.path == IMPAIRMENT_NETEM and plan.losses == []
    assert plan.netem == {"l0h1-eth0": Impairment(2.0, 0.0, 1.0),
                          "l0-eth2": Impairment(2.0, 0.0, 1.0)}


def test_no_impairments_no_path_and_delay_without_netem_raises():
    assert impairment_plan([], fabric(), platform(False)).path is None
    with pytest.raises(ConfigError):
        impairment_plan([spec(link="all", delay_ms=1.0)], fabric(), platform(False))


def test_the_harness_records_the_path_and_what_the_program_dropped():
    from testbed.harness.run import impairment_record

    net = StandInFabric(fabric())
    net.loss_counters = lambda: {"matched": 100, "dropped": 1, "interfaces": {}}
    plan = impairment_plan([spec(link=["l0h1", "l0"], loss_percent=1.0)], fabric(),
                           platform(False))
    record = impairment_record(plan, net)
    assert record["path"] == IMPAIRMENT_EBPF_LOSS and record["loss_counters"]["dropped"] == 1
    assert len(record["cuts"]) == 2
    netem = impairment_plan([spec(link=["l0h1", "l0"], loss_percent=1.0)], fabric(),
                            platform(True))
    assert "loss_counters" not in impairment_record(netem, net)


# --- links a failure schedule impairs ---------------------------------------------------------


def test_a_scheduled_impairment_gets_a_netem_that_does_nothing_until_the_fault():
    f = fabric()
    plan = impairment_plan([], f, platform(True), scheduled=[("l0h1", "l0")])
    idle = Impairment(scheduled=True)
    assert plan.path == IMPAIRMENT_NETEM and plan.netem == {"l0h1-eth0": idle, "l0-eth2": idle}
    assert plan.record()["scheduled"] == [["l0h1", "l0"]]
    # the port's queue hangs under a netem at its root, as for any impaired port...
    assert port_plan("l0-eth2", 10.0, 1500, impairment=idle).tc[0] == (
        "qdisc replace dev l0-eth2 root handle 1: netem limit 1000")
    # ...and the fault changes that netem in place, then puts it back
    assert impairment_change_argv("l0-eth2", 10.0, Impairment(delay_ms=5, loss_percent=2)) == [
        "tc", "qdisc", "change", "dev", "l0-eth2", "root", "handle", "1:", "netem", "limit",
        "1000", "delay", "5ms", "loss", "2%"]
    assert impairment_change_argv("l0-eth2", 10.0, idle)[-3:] == ["netem", "limit", "1000"]


def test_the_scenarios_own_impairment_stays_what_a_healed_fault_returns_to():
    f = fabric()
    own = spec(link=["l0h1", "l0"], loss_percent=1.0)
    netem = impairment_plan([own], f, platform(True), scheduled=[("l0h1", "l0"), ("l0", "s0")])
    assert netem.netem["l0-eth2"] == Impairment(loss_percent=1.0)
    assert netem.netem["l0-eth3"] == Impairment(scheduled=True)
    ebpf = impairment_plan([own], f, platform(False), scheduled=[("l0h1", "l0"), ("l0", "s0")])
    losses = {(cut.src, cut.dst): loss for cut, loss in ebpf.losses}
    assert losses[("l0", "l0h1")] == Loss(0.01) and losses[("s0", "l0")] is None
    assert len(losses) == 4
    assert {c["loss_percent"] for c in ebpf.record()["cuts"]} == {0.0, 1.0}


def test_a_cut_that_loses_nothing_yet_is_configured_off():
    assert unpack_value(CONFIG_LAYOUT, off_config())["mode"] == MODE_OFF
    assert loss_config_command(7, None) == update_command("loss_config", 7, off_config())
    assert config_commands(7, None)[1] == loss_config_command(7, None)
    assert loss_config_command(7, Loss(0.5)) == update_command("loss_config", 7,
                                                               Loss(0.5).config())
