"""Unit tests of capability detection: the pure decisions on fixed machine profiles (no root),
plus one smoke test that reads the real machine."""
from __future__ import annotations

import re

import pytest

from testbed.capabilities import (
    KERNEL_FEATURES,
    MININET_MODULE,
    TOOL_COMMANDS,
    Capability,
    Paths,
    Platform,
    choose_paths,
    detect,
    capability_rows,
    module_name_from_filename,
    parse_congestion_available,
    parse_kernel_config,
    parse_proc_modules,
    path_rows,
    probe_capabilities,
)
from testbed.harness.console import doctor_report

ALL_CAPABILITY_NAMES = [
    "ovs_kernel_module", "sch_red", "sch_netem", "sch_htb", "sch_tbf", "cls_bpf", "act_mirred",
    "bpf_jit", "tcp_dctcp", "tcp_cubic", "rdma_rxe", "ip_route_multipath",
    "ovs_vswitchd", "mininet", "iperf3", "tcpdump", "tshark", "clang", "ethtool", "tc",
    "bpftool", "ovs_userspace_tso",
]

ALL_TOOLS = {command: True for command in TOOL_COMMANDS.values()}

# Excerpt of the CI machine's /proc/config.gz (docs/platforms.md): stripped kernel, no module
# loading.
DEV_VM_CONFIG = """\
#
# Automatically generated file; DO NOT EDIT.
#
CONFIG_LOCALVERSION="-fc"
# CONFIG_MODULES is not set
CONFIG_BPF_JIT=y
CONFIG_IP_ROUTE_MULTIPATH=y
CONFIG_TCP_CONG_CUBIC=y
# CONFIG_TCP_CONG_DCTCP is not set
CONFIG_NET_SCH_HTB=y
# CONFIG_NET_SCH_RED is not set
CONFIG_NET_SCH_TBF=y
# CONFIG_NET_SCH_NETEM is not set
CONFIG_NET_CLS_BPF=y
CONFIG_NET_ACT_MIRRED=y
# CONFIG_OPENVSWITCH is not set
# CONFIG_INFINIBAND is not set
"""

# Excerpt of a stock Ubuntu config: networking features as modules.
UBUNTU_CONFIG = """\
CONFIG_MODULES=y
CONFIG_BPF_JIT=y
CONFIG_IP_ROUTE_MULTIPATH=y
CONFIG_TCP_CONG_CUBIC=y
CONFIG_TCP_CONG_DCTCP=m
CONFIG_NET_SCH_HTB=m
CONFIG_NET_SCH_RED=m
CONFIG_NET_SCH_TBF=m
CONFIG_NET_SCH_NETEM=m
CONFIG_NET_CLS_BPF=m
CONFIG_NET_ACT_MIRRED=m
CONFIG_OPENVSWITCH=m
CONFIG_INFINIBAND=m
CONFIG_RDMA_RXE=m
"""
UBUNTU_MODULE_FILES = {
    "openvswitch", "sch_red", "sch_netem", "sch_htb", "sch_tbf", "cls_bpf", "act_mirred",
    "tcp_dctcp", "rdma_rxe", "ib_core",
}


def dev_vm_caps() -> dict[str, Capability]:
    return probe_capabilities(
        kconfig=parse_kernel_config(DEV_VM_CONFIG),
        loaded_modules=set(),
        module_files=set(),
        congestion_available={"reno", "bbr", "cubic"},
        tools=ALL_TOOLS,
        ovs_version="3.1.0",
        kernel_release="6.18.44-fc-v782",
    )


def ubuntu_caps() -> dict[str, Capability]:
    return probe_capabilities(
        kconfig=parse_kernel_config(UBUNTU_CONFIG),
        loaded_modules={"openvswitch"},
        module_files=UBUNTU_MODULE_FILES,
        congestion_available={"reno", "cubic"},
        tools={"ovs-vswitchd": True, MININET_MODULE: True, "tc": True},
    )


def available(caps: dict[str, Capability]) -> dict[str, bool]:
    return {name: cap.available for name, cap in caps.items()}


# --- parsing ----------------------------------------------------------------------------------


def test_parse_kernel_config_values_and_not_set_lines():
    config = parse_kernel_config(DEV_VM_CONFIG)
    assert config["CONFIG_NET_SCH_HTB"] == "y"
    assert config["CONFIG_OPENVSWITCH"] == "n"
    assert config["CONFIG_MODULES"] == "n"
    assert config["CONFIG_LOCALVERSION"] == "-fc"
    assert "CONFIG_RDMA_RXE" not in config
    assert len(config) == 14  # the three plain comment lines are ignored


def test_parse_kernel_config_module_and_numeric_values():
    config = parse_kernel_config("CONFIG_A=m\n\nCONFIG_HZ=250\n# random comment\n")
    assert config == {"CONFIG_A": "m", "CONFIG_HZ": "250"}


def test_parse_proc_modules_takes_first_field():
    text = (
        "openvswitch 200704 0 - Live 0x0000000000000000\n"
        "sch_red 24576 1 - Live 0x0000000000000000\n"
    )
    assert parse_proc_modules(text) == {"openvswitch", "sch_red"}
    assert parse_proc_modules("") == set()


@pytest.mark.parametrize(
    ("filename", "name"),
    [
        ("sch_red.ko", "sch_red"),
        ("openvswitch.ko.zst", "openvswitch"),
        ("rdma_rxe.ko.xz", "rdma_rxe"),
        ("nf-conntrack.ko", "nf_conntrack"),
        ("modules.dep", None),
        ("README", None),
    ],
)
def test_module_name_from_filename(filename, name):
    assert module_name_from_filename(filename) == name


def test_parse_congestion_available():
    assert parse_congestion_available("reno bbr cubic\n") == {"reno", "bbr", "cubic"}


# --- machine profiles -------------------------------------------------------------------------


def test_every_capability_is_probed_in_report_order():
    assert list(dev_vm_caps()) == ALL_CAPABILITY_NAMES
    assert [feature.name for feature in KERNEL_FEATURES] == ALL_CAPABILITY_NAMES[:12]


def test_dev_vm_profile_capabilities():
    caps = available(dev_vm_caps())
    assert caps == {
        "ovs_kernel_module": False, "sch_red": False, "sch_netem": False, "sch_htb": True,
        "sch_tbf": True, "cls_bpf": True, "act_mirred": True, "bpf_jit": True,
        "tcp_dctcp": False, "tcp_cubic": True, "rdma_rxe": False, "ip_route_multipath": True,
        **{name: True for name in ALL_CAPABILITY_NAMES[12:]},
    }


def test_dev_vm_profile_details_say_why():
    caps = dev_vm_caps()
    assert caps["ovs_kernel_module"].detail == "CONFIG_OPENVSWITCH not set"
    assert caps["rdma_rxe"].detail == "CONFIG_RDMA_RXE not in kernel config"
    assert caps["sch_htb"].detail == "CONFIG_NET_SCH_HTB=y (built in)"
    assert caps["tcp_cubic"].detail == "cubic in tcp_available_congestion_control"
    assert caps["mininet"].detail == "import mininet.node works"


def test_dev_vm_profile_paths():
    assert choose_paths(dev_vm_caps()) == Paths(
        ovs_datapath="userspace",
        ecn_marking="ebpf",
        tcp_congestion="cubic+ecn",
        rdma="userspace-roce",
        delay_loss="ebpf-loss",  # loss by the eBPF program; delay needs netem
        pfc="tbf-pause-agent",
        ovs_offload="userspace-tso",
    )
    no_bpf = {**dev_vm_caps(), "cls_bpf": Capability("cls_bpf", False, "CONFIG_NET_CLS_BPF not set")}
    assert choose_paths(no_bpf).delay_loss == "none"


def test_ubuntu_profile_capabilities():
    caps = ubuntu_caps()
    assert all(caps[name].available for name in ALL_CAPABILITY_NAMES[:12])
    assert caps["ovs_kernel_module"].detail == "module openvswitch loaded"
    assert caps["sch_red"].detail == "loadable module sch_red (CONFIG_NET_SCH_RED=m)"
    assert caps["tcp_dctcp"].detail == "loadable module tcp_dctcp (CONFIG_TCP_CONG_DCTCP=m)"
    # tools not reported by the caller count as missing
    assert caps["mininet"].available and not caps["iperf3"].available
    assert caps["iperf3"].detail == "iperf3 not on PATH"


def test_ubuntu_profile_paths():
    assert choose_paths(ubuntu_caps()) == Paths(
        ovs_datapath="kernel",
        ecn_marking="red-qdisc",
        tcp_congestion="dctcp",
        rdma="rxe",
        delay_loss="netem",
        pfc="tbf-pause-agent",
        ovs_offload="kernel",
    )


# --- the availability rule --------------------------------------------------------------------


def probe_one(name, kconfig, loaded=(), files=(), congestion=()) -> Capability:
    return probe_capabilities(kconfig, set(loaded), set(files), set(congestion), {})[name]


def test_module_config_without_module_file_is_unavailable():
    cap = probe_one("ovs_kernel_module", {"CONFIG_OPENVSWITCH": "m"})
    assert not cap.available
    assert cap.detail == "CONFIG_OPENVSWITCH=m but no module file openvswitch (cannot load)"


def test_module_config_with_file_is_available():
    assert probe_one("rdma_rxe", {"CONFIG_RDMA_RXE": "m"}, files={"rdma_rxe"}).available


def test_loaded_module_is_available_whatever_the_config_says():
    assert probe_one("sch_netem", {"CONFIG_NET_SCH_NETEM": "n"}, loaded={"sch_netem"}).available


def test_module_file_is_useless_when_kernel_cannot_load_modules():
    cap = probe_one(
        "sch_red", {"CONFIG_MODULES": "n", "CONFIG_NET_SCH_RED": "n"}, files={"sch_red"}
    )
    assert not cap.available
    assert "CONFIG_MODULES not set" in cap.detail


def test_dctcp_from_congestion_list_or_builtin_config():
    assert probe_one("tcp_dctcp", {}, congestion={"dctcp"}).available
    assert probe_one("tcp_dctcp", {"CONFIG_TCP_CONG_DCTCP": "y"}).available
    assert not probe_one("tcp_dctcp", {"CONFIG_TCP_CONG_DCTCP": "m"}).available


def test_without_kernel_config_decides_from_modules_and_files_only():
    caps = probe_capabilities(
        kconfig=None,
        loaded_modules={"sch_htb"},
        module_files={"openvswitch"},
        congestion_available={"reno", "cubic"},
        tools={},
    )
    assert caps["sch_htb"].available
    assert caps["ovs_kernel_module"].available
    assert caps["ovs_kernel_module"].detail == (
        "no kernel config readable; loadable module openvswitch"
    )
    assert not caps["sch_red"].available
    assert caps["sch_red"].detail.startswith("no kernel config readable")
    assert caps["tcp_cubic"].available and not caps["tcp_dctcp"].available
    # bool options cannot be told without a config
    assert not caps["bpf_jit"].available
    assert caps["bpf_jit"].detail == "no kernel config readable; CONFIG_BPF_JIT unknown"


def test_reno_when_cubic_and_dctcp_are_missing():
    caps = probe_capabilities({"CONFIG_TCP_CONG_CUBIC": "n"}, set(), set(), {"reno"}, {})
    assert choose_paths(caps).tcp_congestion == "reno+ecn"


def test_choose_paths_treats_missing_capabilities_as_absent():
    assert choose_paths({}) == Paths(
        "userspace", "ebpf", "reno+ecn", "userspace-roce", "none", "tbf-pause-agent"
    )


# --- report -----------------------------------------------------------------------------------


def test_doctor_report_aligns_columns():
    caps = dev_vm_caps()
    report = doctor_report(Platform("6.1.0-test", caps, choose_paths(caps)))
    lines = report.splitlines()
    assert lines[0] == "kernel 6.1.0-test"
    cap_lines = [line for line in lines if line.split(" ", 1)[0] in caps]
    assert len(cap_lines) == len(ALL_CAPABILITY_NAMES)
    # the yes/no column and the detail column start at the same offset on every line
    # (the longest name, ip_route_multipath, sets the first column's width)
    name_width = len("ovs_userspace_tso") + 1
    rows = [re.match(r"^(\S+) +(yes|no) +(.*)$", line) for line in cap_lines]
    assert {row.start(2) for row in rows} == {name_width + 2}
    assert {row.start(3) for row in rows} == {name_width + 2 + len("avail  ")}
    assert all(row.group(3) == caps[row.group(1)].detail for row in rows)
    assert "ovs_kernel_module   no     CONFIG_OPENVSWITCH not set" in report
    assert "sch_htb             yes    CONFIG_NET_SCH_HTB=y (built in)" in report
    assert "ovs_datapath    userspace" in report
    assert "tcp_congestion  cubic+ecn" in report


def test_report_rows_say_what_is_built():
    caps = dev_vm_caps()
    platform = Platform("6.1.0-test", caps, choose_paths(caps))
    assert capability_rows(platform)[0] == ("ovs_kernel_module", "no",
                                            "CONFIG_OPENVSWITCH not set")
    assert [name for name, _, _ in capability_rows(platform)] == ALL_CAPABILITY_NAMES
    assert path_rows(platform) == [
        ("ovs_datapath", "userspace"), ("ecn_marking", "ebpf"),
        ("tcp_congestion", "cubic+ecn"),
        ("rdma", "userspace-roce"), ("delay_loss", "ebpf-loss"), ("pfc", "tbf-pause-agent"),
        ("ovs_offload", "userspace-tso")]


def test_the_rdma_line_says_how_roce_runs_and_why_not_over_rxe():
    from testbed.capabilities import rdma_summary

    caps = dev_vm_caps()
    line = rdma_summary(Platform("6.1.0-test", caps, choose_paths(caps)))
    assert line == ("RDMA here: userspace-roce, by the user-space RoCEv2 engine "
                    "(testbed.traffic.roce) in every host; no rxe: "
                    f"{caps['rdma_rxe'].detail}")
    caps = ubuntu_caps()
    line = rdma_summary(Platform("6.8.0-test", caps, choose_paths(caps)))
    assert line.startswith("RDMA here: rxe, by the kernel's softRoCE") and "no rxe" not in line
    report = doctor_report(Platform("6.8.0-test", caps, choose_paths(caps)))
    assert "rdma            rxe\n" in report and line in report


def test_detect_smoke_on_this_machine():
    platform = detect()
    assert isinstance(platform, Platform)
    assert platform.kernel_release
    assert list(platform.capabilities) == ALL_CAPABILITY_NAMES
    assert platform.paths == choose_paths(platform.capabilities)
    report = doctor_report(platform)
    for name in ALL_CAPABILITY_NAMES:
        assert name in report


# --- the userspace datapath's offloads ------------------------------------------------------


@pytest.mark.parametrize(("ovs", "kernel", "available", "words"), [
    ("3.1.0", "6.18.44-fc-v782", True, "userspace-tso-enable"),
    ("2.13.0", "4.19.0", True, "Open vSwitch 2.13.0"),
    ("2.12.9", "6.1.0", False, "older than 2.13"),
    ("3.1.0", "4.18.20", False, "kernel 4.18.20 is older than 4.19"),
    (None, "6.1.0", False, "version is unknown"),
])
def test_userspace_tso_needs_ovs_2_13_and_kernel_4_19(ovs, kernel, available, words):
    from testbed.capabilities import userspace_tso_capability

    cap = userspace_tso_capability(ovs, kernel)
    assert cap.name == "ovs_userspace_tso" and cap.available is available
    assert words in cap.detail


def test_the_offload_path_follows_the_datapath_and_the_capability(monkeypatch):
    from testbed.capabilities import Capability

    tso = {"ovs_userspace_tso": Capability("ovs_userspace_tso", True, "")}
    kernel = {"ovs_kernel_module": Capability("ovs_kernel_module", True, "")}
    assert choose_paths(tso).ovs_offload == "userspace-tso"
    assert choose_paths({**tso, **kernel}).ovs_offload == "kernel"
    assert choose_paths({}).ovs_offload == "userspace"
    monkeypatch.setenv("TESTBED_USERSPACE_TSO", "0")  # to measure the path without it
    assert choose_paths(tso).ovs_offload == "userspace"


# --- built in or loadable, and the rxe probe ------------------------------------------------


def test_module_lists_name_the_modules_modprobe_knows():
    from testbed.capabilities import parse_module_list

    dep = ("kernel/net/sched/sch_red.ko.xz:\n"
           "kernel/net/openvswitch/openvswitch.ko.xz: kernel/net/ipv4/udp_tunnel.ko.xz\n"
           "kernel/drivers/infiniband/sw/rxe/rdma_rxe.ko.xz: kernel/drivers/infiniband/core/ib_uverbs.ko.xz\n"
           "\n")
    assert parse_module_list(dep) == {"sch_red", "openvswitch", "rdma_rxe"}
    assert parse_module_list("kernel/net/ipv4/tcp_cubic.ko\n") == {"tcp_cubic"}


def test_a_feature_is_built_in_or_loadable_and_the_detail_says_which():
    builtin = probe_capabilities(None, set(), set(), set(), {},
                                 builtin_modules={"sch_red"})["sch_red"]
    assert builtin.available and builtin.detail.endswith("sch_red in modules.builtin (built in)")
    loadable = probe_one("sch_netem", {"CONFIG_NET_SCH_NETEM": "m"}, files={"sch_netem"})
    assert loadable.available
    assert loadable.detail == "loadable module sch_netem (CONFIG_NET_SCH_NETEM=m)"
    built = probe_one("sch_netem", {"CONFIG_NET_SCH_NETEM": "y"})
    assert built.available and built.detail == "CONFIG_NET_SCH_NETEM=y (built in)"


def test_a_failed_rxe_probe_sends_roce_to_the_user_space_engine():
    from testbed.capabilities import RXE_NETNS, rdma_summary, with_probe

    caps = ubuntu_caps()
    platform = Platform("6.1.0-test", caps, choose_paths(caps))
    assert platform.paths.rdma == "rxe"
    failed = with_probe(platform, Capability(RXE_NETNS, False, "perftest: UNREACHABLE"))
    assert failed.paths.rdma == "userspace-roce"
    assert failed.paths.ovs_datapath == "kernel"  # the other paths stay as they were
    assert failed.capabilities[RXE_NETNS].detail == "perftest: UNREACHABLE"
    assert rdma_summary(failed).endswith(
        "rxe does not connect two network namespaces here: perftest: UNREACHABLE")
    connected = with_probe(platform, Capability(RXE_NETNS, True, "connected"))
    assert connected.paths.rdma == "rxe"
    # the probe cannot give rxe to a kernel without it
    dev = Platform("6.18.0-test", dev_vm_caps(), choose_paths(dev_vm_caps()))
    assert with_probe(dev, Capability(RXE_NETNS, True, "")).paths.rdma == "userspace-roce"


# --- what an ordinary user's doctor finds --------------------------------------------------------


def test_an_ordinary_users_path_still_finds_the_sbin_tools(monkeypatch, tmp_path):
    """A user's PATH lacks the sbin folders where tc, ethtool, bpftool and ovs-vswitchd live:
    doctor looks there too."""
    import testbed.capabilities as capabilities

    sbin = tmp_path / "sbin"
    sbin.mkdir()
    for command in TOOL_COMMANDS.values():
        tool = sbin / command
        tool.write_text("#!/bin/sh\nexit 0\n")
        tool.chmod(0o755)
    monkeypatch.setenv("PATH", str(tmp_path / "bin"))
    monkeypatch.setattr(capabilities, "SYSTEM_BIN_DIRS", (str(sbin),))
    caps = detect().capabilities
    for name, command in TOOL_COMMANDS.items():
        if command != MININET_MODULE:
            assert caps[name].available, caps[name]
    assert capabilities.find_tool("tc") == str(sbin / "tc")


def test_mininet_counts_only_when_it_imports(monkeypatch):
    """Mininet is a Python package: ``mn`` on PATH proves nothing about this Python."""
    import sys

    assert detect().capabilities["mininet"].available  # the venv sees Debian's Mininet
    for name in [m for m in sys.modules if m == "mininet" or m.startswith("mininet.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "mininet", None)  # as in a venv without it
    cap = detect().capabilities["mininet"]
    assert not cap.available and cap.detail == "import mininet.node fails"
