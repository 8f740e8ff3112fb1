"""softRoCE (the kernel's rdma_rxe) inside an emulated host, driven by perftest: the real verbs
path where the kernel has it, as an alternative host program to ``host`` with the same
roles and a JSON line of the same shape.

    python -m testbed.traffic.roce.rxe serve --bind 10.0.0.2 --duration-s 10
    python -m testbed.traffic.roce.rxe send  --bind 10.0.0.1 --peer 10.0.0.2 --duration-s 10

Each side first gives its fabric interface an rxe device, inside its own namespace::

    rdma link add rxe_<if> type rxe netdev <if>

then runs perftest's ``ib_write_bw`` on it (RDMA WRITE, RC, connected through rdma_cm with
``-R`` so no GID index has to be chosen), and prints one JSON line: messages, bytes, the
goodput and the monotonic window, from perftest's report. The device goes away with the
interface (rxe follows NETDEV_UNREGISTER), so a host's namespace leaves nothing behind.

Network namespaces: the RDMA subsystem's netns mode is left as the kernel has it (``shared``
by default: every namespace sees every RDMA device; the device named after the interface
is this host's). ``exclusive`` mode (``rdma system set netns exclusive``) would bind each
device to the namespace it was made in, but can be switched only while no other namespace
exists, i.e. before the fabric is built, and is a machine-wide setting to restore; shared
mode needs neither. What rxe needs in either mode is its UDP socket (port 4791) in the
interface's own namespace: older rxe opened it in the initial namespace only, so inside a
host it could send but never receive. ``rxe_problem`` names that when perftest cannot
connect; the integration tests run it on the Vagrant box's kernel.

perftest moves bytes but does not check them: ``data_verified`` is None (not judged) on
this path, never True.
"""
from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import time

RXE_PREFIX = "rxe_"
PERFTEST = "ib_write_bw"
PERFTEST_PORT = 18515
SETUP_TIMEOUT_S = 30.0
GRACE_S = 60.0
# perftest's result row: #bytes #iterations BW peak BW average MsgRate (with --report_gbits)
RESULT_ROW = re.compile(r"^\s*(\d+)\s+(\d+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)\s*$")


def device_name(intf: str) -> str:
    """``rxe_l0h0-eth0`` for interface ``l0h0-eth0``."""
    return f"{RXE_PREFIX}{intf}"


def link_add_argv(intf: str) -> list[str]:
    return ["rdma", "link", "add", device_name(intf), "type", "rxe", "netdev", intf]


def link_show_argv() -> list[str]:
    return ["rdma", "-j", "link", "show"]


def devices_on(link_show_json: str, intf: str) -> list[str]:
    """The RDMA devices ``rdma -j link show`` lists on netdev ``intf``."""
    return sorted({entry["ifname"] for entry in json.loads(link_show_json or "[]")
                   if entry.get("netdev") == intf})


def perftest_argv(device: str, duration_s: float, size_bytes: int, mtu_bytes: int,
                  port: int, peer: str | None = None) -> list[str]:
    """``ib_write_bw`` as a server (``peer`` None) or a client of ``peer``: RC, RDMA WRITE of
    ``size_bytes`` for ``duration_s``, rdma_cm connection, Gbit/s reported."""
    argv = [PERFTEST, "-d", device, "-R", "-F", "--report_gbits", "-p", str(port),
            "-s", str(size_bytes), "-m", str(mtu_bytes), "-D", f"{max(1, round(duration_s))}"]
    return argv + ([peer] if peer else [])


def parse_perftest(text: str) -> dict | None:
    """perftest's result row: bytes per message, iterations, peak and average Gbit/s and
    message rate (Mpps); None when there is none (the run failed)."""
    for line in text.splitlines():
        match = RESULT_ROW.match(line)
        if match:
            size, iterations, peak, average, rate = match.groups()
            return {"message_bytes": int(size), "iterations": int(iterations),
                    "peak_gbit": float(peak), "average_gbit": float(average),
                    "msg_rate_mpps": float(rate)}
    return None


def rxe_problem(text: str) -> str:
    """What a failed perftest run says about the rxe path."""
    if "Unable to find the Infiniband/RoCE device" in text or "No IB devices" in text:
        return "no rxe device: rdma link add failed or the module is missing"
    if "rdma_cm" in text or "Couldn't" in text or "Failed" in text:
        return ("perftest could not connect over rxe (this kernel's rxe may not receive "
                "inside a network namespace): " + text.strip()[-200:])
    return text.strip()[-300:] or "perftest printed nothing"


def ensure_device(intf: str) -> str:
    """This namespace's interface ``intf`` with an rxe device on it (made if missing)."""
    shown = subprocess.run(link_show_argv(), capture_output=True, text=True,
                           timeout=SETUP_TIMEOUT_S)
    existing = devices_on(shown.stdout, intf) if shown.returncode == 0 else []
    if existing:
        return existing[0]
    made = subprocess.run(link_add_argv(intf), capture_output=True, text=True,
                          timeout=SETUP_TIMEOUT_S)
    if made.returncode != 0:
        raise RuntimeError(f"rdma link add on {intf} failed: {made.stderr.strip()[-300:]}")
    return device_name(intf)


def interface_of(ip: str) -> str:
    """The interface of this namespace that holds ``ip``."""
    out = subprocess.run(["ip", "-j", "-4", "addr", "show"], capture_output=True, text=True,
                         check=True, timeout=SETUP_TIMEOUT_S).stdout
    for link in json.loads(out):
        if any(a.get("local") == ip for a in link.get("addr_info", [])):
            return link["ifname"]
    raise RuntimeError(f"no interface holds {ip}")


def run(args: argparse.Namespace) -> dict:
    device = ensure_device(interface_of(args.bind))
    argv = perftest_argv(device, args.duration_s, args.size, args.mtu, args.side_port,
                         args.peer if args.role == "send" else None)
    start = time.monotonic()
    out = subprocess.run(argv, capture_output=True, text=True,
                         timeout=args.duration_s + GRACE_S)
    end = time.monotonic()
    report = parse_perftest(out.stdout)
    result = {"role": args.role, "transport": "rxe", "device": device, "argv": argv,
              "errors": [] if report else [rxe_problem(out.stdout + out.stderr)],
              "data_verified": None, "window_monotonic_s": [start, end]}
    if report is not None:
        messages = report["iterations"]
        result.update(messages=messages, message_bytes=report["message_bytes"],
                      bytes_delivered=messages * report["message_bytes"],
                      goodput_mbit=report["average_gbit"] * 1e3, perftest=report)
    return result


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m testbed.traffic.roce.rxe",
                                     description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="role", required=True)
    for role in ("serve", "send"):
        p = sub.add_parser(role)
        p.add_argument("--bind", required=True, help="this host's IPv4 address")
        p.add_argument("--side-port", type=int, default=PERFTEST_PORT)
        p.add_argument("--duration-s", type=float, default=10.0)
        p.add_argument("--size", type=int, default=65536, help="message bytes")
        p.add_argument("--mtu", type=int, default=1024, choices=(256, 512, 1024, 2048, 4096))
        if role == "send":
            p.add_argument("--peer", required=True, help="the server's IPv4 address")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        result = run(args)
    except (OSError, RuntimeError, subprocess.SubprocessError) as exc:
        result = {"role": args.role, "transport": "rxe", "errors": [str(exc)],
                  "data_verified": None}
    json.dump(result, sys.stdout)
    sys.stdout.write("\n")
    return 0 if not result["errors"] else 1


if __name__ == "__main__":
    sys.exit(main())
