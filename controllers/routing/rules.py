"""The OpenFlow rule vocabulary, as plain data and no OpenFlow library: what a rule matches
(``Match``; ``FlowMatch`` adds the ethertype), what it does (``PushVlan``, ``PopVlan``,
``Output``, ``ToGroup``, ``SetEthDst``, ``ToController``), a select group's ``Bucket`` and a
``FlowRule``. Every routing mode (testbed.controllers.routing: ECMP, anycast, the dragonfly
modes) writes its rules in it; testbed.controllers.routing.forwarding turns them into a
switch's table and message plans, and testbed.controllers.apps.fabric_app into OpenFlow
messages one to one."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Match:
    """OpenFlow match fields; None is a wildcard. ``vlan_vid`` is the VID without the
    OFPVID_PRESENT bit; a rule without it matches tagged and untagged packets alike."""

    in_port: int | None = None
    vlan_vid: int | None = None
    ipv4_dst: str | None = None


@dataclass(frozen=True)
class PushVlan:
    """Push an 802.1Q header (ethertype 0x8100) and set its VID."""

    vlan_vid: int


@dataclass(frozen=True)
class PopVlan:
    """Pop the outer 802.1Q header."""


@dataclass(frozen=True)
class Output:
    port: int


@dataclass(frozen=True)
class ToGroup:
    group_id: int


Action = PushVlan | PopVlan | Output | ToGroup


@dataclass(frozen=True)
class Bucket:
    """One select-group bucket: its weight (relative, > 0) and its actions."""

    weight: int
    actions: tuple[Action, ...]


@dataclass(frozen=True)
class FlowRule:
    priority: int
    match: Match
    actions: tuple[Action, ...]


@dataclass(frozen=True)
class FlowMatch:
    """OpenFlow match fields, None a wildcard: ``Match`` plus the ethertype.
    ``vlan_vid`` is the VID without the OFPVID_PRESENT bit."""

    eth_type: int | None = None
    in_port: int | None = None
    vlan_vid: int | None = None
    ipv4_dst: str | None = None

    def describe(self) -> str:
        fields = (("eth_type", self.eth_type), ("in_port", self.in_port),
                  ("vlan_vid", self.vlan_vid), ("ipv4_dst", self.ipv4_dst))
        return ",".join(f"{name}={value:#06x}" if name == "eth_type" else f"{name}={value}"
                        for name, value in fields if value is not None)


@dataclass(frozen=True)
class SetEthDst:
    """Rewrite the destination MAC: anycast delivers to a replica's own MAC."""

    mac: str


@dataclass(frozen=True)
class ToController:
    """Send the whole packet to the controller (no buffering on the switch)."""


FlowAction = Action | SetEthDst | ToController
FlowKey = tuple[int, FlowMatch]  # (priority, match): what OpenFlow identifies a flow by
