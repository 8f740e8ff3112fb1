"""Rows of OVS's database from ``ovs-vsctl --format=json`` output (testbed.system.ovs_tables),
and the machine's bridges read that way (testbed.apply.ovs), with ovs-vsctl faked."""
from __future__ import annotations

import json
import subprocess

import pytest

from testbed.apply import ovs
from testbed.system.ovs_tables import ovsdb_value, parse_vsctl_json


def test_ovsdb_values_become_plain_data():
    assert ovsdb_value("s1") == "s1" and ovsdb_value(42) == 42
    assert ovsdb_value(["uuid", "0b6e"]) == "0b6e"
    assert ovsdb_value(["set", []]) == []
    assert ovsdb_value(["set", [["uuid", "a"], ["uuid", "b"]]]) == ["a", "b"]
    assert ovsdb_value(["map", [["rx_packets", 10], ["tx_packets", 12]]]) == {
        "rx_packets": 10, "tx_packets": 12}


def test_vsctl_json_rows_by_column():
    text = json.dumps({
        "headings": ["name", "ofport", "statistics", "ports"],
        "data": [["p0e0-eth1", 1, ["map", [["rx_packets", 10], ["tx_dropped", 0]]],
                  ["set", []]],
                 ["p0e0", 65534, ["map", []], ["uuid", "7f3c"]]],
    })
    assert parse_vsctl_json(text) == [
        {"name": "p0e0-eth1", "ofport": 1, "statistics": {"rx_packets": 10, "tx_dropped": 0},
         "ports": []},
        {"name": "p0e0", "ofport": 65534, "statistics": {}, "ports": "7f3c"}]
    assert parse_vsctl_json("") == []
    assert [row["name"] for row in parse_vsctl_json(
        '{"data":[["s1"],["s2"]],"headings":["name"]}')] == ["s1", "s2"]


@pytest.mark.parametrize("text", ['{"headings": []}', "not json"])
def test_vsctl_output_that_is_not_a_table_is_an_error(text):
    with pytest.raises((KeyError, ValueError)):
        parse_vsctl_json(text)


def test_the_machines_bridges_are_read_as_json(monkeypatch):
    asked = []

    def vsctl(*args, timeout_s=10):
        asked.append(args)
        return subprocess.CompletedProcess(args, 0, '{"data":[["p0e0"],["c0"]],'
                                                    '"headings":["name"]}', "")

    monkeypatch.setattr(ovs, "_vsctl", vsctl)
    assert ovs.list_bridges() == ["p0e0", "c0"]
    assert asked == [("--format=json", "--columns=name", "list", "Bridge")]
    monkeypatch.setattr(ovs, "_vsctl", lambda *args, timeout_s=10: subprocess.CompletedProcess(
        args, 1, "", "database connection failed"))
    assert ovs.list_bridges() == []
