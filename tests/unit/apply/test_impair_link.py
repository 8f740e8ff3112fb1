"""What a failure schedule asks of a running fabric's links (FabricNetwork.impair_link): a
scheduled impairment changes netem in place at both ends, or reconfigures the loss program;
tc recorded, nothing applied."""
from __future__ import annotations

from types import SimpleNamespace

import pytest

import testbed.apply.network as network
from testbed.apply.network import FabricNetwork
from testbed.model.topology.fattree import fat_tree
from testbed.plan.loss_plan import Loss
from testbed.plan.port_queue import Impairment


def impairable(monkeypatch, impairments=None, loss=None):
    """A FabricNetwork's state as far as impair_link reads it, with tc recorded."""
    ran = []
    monkeypatch.setattr(network, "run_tool", lambda argv, stdin=None, what="": ran.append(argv))
    net = SimpleNamespace(fabric=fat_tree(4, host_rate_mbit=6.0), impairments=impairments or {},
                          loss=loss, pid=lambda host: 4242)
    net.in_namespace = lambda host, argv: network.FabricNetwork.in_namespace(net, host, argv)
    return net, ran


def test_a_scheduled_impairment_changes_the_netem_in_place_at_both_ends(monkeypatch):
    idle = Impairment(scheduled=True)
    net, ran = impairable(monkeypatch, {"p0e0h0-eth0": idle, "p0e0-eth1": idle})
    FabricNetwork.impair_link(net, "p0e0h0", "p0e0", Impairment(loss_percent=2))
    FabricNetwork.impair_link(net, "p0e0h0", "p0e0", None)
    assert ran[0][:3] == ["nsenter", "--net=/proc/4242/ns/net", "tc"]  # the host's end
    assert ran[0][3:7] == ["qdisc", "change", "dev", "p0e0h0-eth0"] and ran[0][-2:] == ["loss", "2%"]
    assert ran[1][:5] == ["tc", "qdisc", "change", "dev", "p0e0-eth1"]
    assert ran[2][-2:] == ["limit", "1000"] and ran[3][-2:] == ["limit", "1000"]  # back to idle


def test_without_netem_a_scheduled_loss_reconfigures_the_loss_program(monkeypatch):
    class Loss_:
        def __init__(self):
            self.set = []

        def has(self, intfs):
            return set(intfs) <= {"p0a0-eth1", "p0e0-eth3"}

        def set_loss(self, intfs, loss):
            self.set.append((intfs, loss))

    loss = Loss_()
    net, ran = impairable(monkeypatch, loss=loss)
    FabricNetwork.impair_link(net, "p0e0", "p0a0", Impairment(loss_percent=5))
    FabricNetwork.impair_link(net, "p0e0", "p0a0", None)
    assert loss.set == [(["p0e0-eth3", "p0a0-eth1"], Loss(0.05)),
                        (["p0e0-eth3", "p0a0-eth1"], None)] and ran == []
    with pytest.raises(Exception, match="the link p0e1-p0a1 was not prepared for an impairment"):
        FabricNetwork.impair_link(net, "p0e1", "p0a1", None)
