"""``testbed doctor`` on a stock kernel: every feature a standard path needs is there, built in
or as a loadable module (and the detail says which), the modules load, and doctor takes the
kernel's path for each: the OVS kernel datapath, RED, DCTCP and netem, and for RoCE softRoCE
or, where its probe finds that rxe does not connect two network namespaces, the user-space
engine. Runs only in the stock-kernel guest (make vm-test)."""
from __future__ import annotations

import os
import re
import subprocess
import sys

from testbed.apply.modules import load_modules
from testbed.capabilities import (
    PROC_MODULES,
    detect,
    parse_proc_modules,
    read_builtin_modules,
)

# Capability -> the module that provides it on a stock kernel.
MODULES = {"ovs_kernel_module": "openvswitch", "sch_red": "sch_red", "sch_netem": "sch_netem",
           "tcp_dctcp": "tcp_dctcp", "rdma_rxe": "rdma_rxe"}
# The path each feature takes on a stock kernel (rdma: decided by the rxe probe, below).
STOCK_PATHS = {"ovs_datapath": "kernel", "ecn_marking": "red-qdisc", "tcp_congestion": "dctcp",
               "delay_loss": "netem", "ovs_offload": "kernel"}
# How an available kernel feature was decided: loaded, loadable, or built in.
DECIDED = re.compile(r"^(module \S+ loaded|loadable module \S+ \(CONFIG_\S+=m\)"
                     r"|CONFIG_\S+=y \(built in\)|.* in modules\.builtin \(built in\)"
                     r"|\S+ in tcp_available_congestion_control)$")
DOCTOR_TIMEOUT_S = 600  # the rxe probe connects four ways, each up to a minute under emulation
PROBE_LINE = re.compile(r"^rxe probe \((?P<mode>.*)\): (?P<verdict>rxe connects two namespaces|"
                        r"rxe does not connect two namespaces: RoCE takes the user-space "
                        r"engine)$", re.MULTILINE)


def test_every_feature_a_stock_path_needs_is_built_in_or_loadable():
    platform = detect()
    for name in MODULES:
        cap = platform.capabilities[name]
        assert cap.available, cap
        assert DECIDED.match(cap.detail), cap
    assert {k: getattr(platform.paths, k) for k in STOCK_PATHS} == STOCK_PATHS, platform.paths


def test_the_modules_load():
    load_modules(MODULES.values(), log=print)
    with open(PROC_MODULES) as fh:
        present = parse_proc_modules(fh.read()) | read_builtin_modules(os.uname().release)
    assert set(MODULES.values()) <= present, sorted(set(MODULES.values()) - present)
    dctcp = detect().capabilities["tcp_dctcp"]
    assert dctcp.detail in ("dctcp in tcp_available_congestion_control",
                            "module tcp_dctcp loaded"), dctcp


def test_doctor_reports_the_kernels_paths_and_the_rxe_probes_decision():
    out = subprocess.run([sys.executable, "-m", "testbed", "doctor"], capture_output=True,
                         text=True, timeout=DOCTOR_TIMEOUT_S)
    print(out.stdout, out.stderr)
    assert out.returncode == 0, out.stderr
    for feature, path in STOCK_PATHS.items():
        assert re.search(rf"^{feature} +{path}$", out.stdout, re.MULTILINE), feature
    probed = PROBE_LINE.search(out.stdout)
    assert probed, "the rxe probe did not run"
    connects = probed["verdict"] == "rxe connects two namespaces"
    assert re.search(rf"^rdma +{'rxe' if connects else 'userspace-roce'}$", out.stdout,
                     re.MULTILINE)
    # every way of connecting was tried or says why not, the testbed's own first
    variants = re.findall(r"^(perftest-rdma-cm|perftest-gid|rc-pingpong-gid|rping) +(yes|no) ",
                          out.stdout, re.MULTILINE)
    assert [name for name, _ in variants] == ["perftest-rdma-cm", "perftest-gid",
                                              "rc-pingpong-gid", "rping"], out.stdout
    assert (variants[0][1] == "yes") is connects
