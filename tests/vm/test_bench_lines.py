"""``testbed bench`` on a stock kernel puts the two-switch line on the OVS kernel datapath
beside the same line on the userspace datapath, in the same run, as a ratio (absolute figures
mean little under software emulation; the ratio is what this machine says about the two
datapaths), and leaves nothing. Runs only in the stock-kernel guest (make vm-test)."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

# The lead chooses this after measuring in the guest: the kernel datapath forwards in the
# kernel, the userspace one in ovs-vswitchd, so the kernel's should carry more.
KERNEL_OVER_USERSPACE_MIN = 1.0
BENCH_TIMEOUT_S = 1200
RATIO_TOLERANCE = 1e-9
CLEAN = {"veths": [], "taps": [], "bridges": [], "processes": [], "netns": []}


def test_bench_reports_the_kernel_datapath_line_beside_the_userspace_one(tmp_path, leftovers):
    output = tmp_path / "bench.json"
    out = subprocess.run([sys.executable, "-m", "testbed", "bench", "--lines-only", "--output",
                          str(output)], capture_output=True, text=True, timeout=BENCH_TIMEOUT_S)
    print(out.stdout[-4000:], out.stderr[-2000:], sep="\n")
    assert out.returncode == 0, out.stderr
    result = json.loads(output.read_text())
    assert result["paths"]["ovs_datapath"] == "kernel"
    assert set(result["lines_mbit"]) == {"mtu1500", "mtu9000"}
    for mtu, line in result["lines_mbit"].items():
        kernel, user = line["ovs_2_switches_kernel"], line["ovs_2_switches"]
        assert kernel > 0 and user > 0, (mtu, line)
        assert line["kernel_vs_userspace"] == pytest.approx(kernel / user, rel=RATIO_TOLERANCE)
        assert line["kernel_vs_userspace"] >= KERNEL_OVER_USERSPACE_MIN, (mtu, line)
        assert f"... on the kernel datapath, {mtu}" in out.stdout
    assert leftovers() == CLEAN
