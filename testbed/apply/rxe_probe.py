"""Does softRoCE connect two network namespaces on this kernel? Found by trying, not guessed.

The testbed's rxe path (testbed.traffic.roce.rxe) gives each emulated host's interface an rxe
device inside the host's namespace and runs perftest between two hosts. Whether that works
depends on the kernel, not on what it has: an rxe whose UDP tunnel socket, or an rdma_cm
whose address resolution, lives in the initial network namespace only can send from a host
but never connect it (perftest's client then gets RDMA_CM_EVENT_UNREACHABLE, "Unexpected CM
event ... 7"). ``probe`` builds what the path needs and nothing more: two namespaces (Mininet
hosts) joined by one veth pair, no switch, an rxe device on each end; then it tries an RC
connection in several ways, each a client in one namespace and a server in the other:

    perftest-rdma-cm   ib_write_bw -R         connected through rdma_cm, as the testbed's rxe
                                              path connects (its outcome is the capability)
    perftest-gid       ib_write_bw -x GID     the RoCE v2 GID index given, QP attributes
                                              exchanged over TCP: no rdma_cm
    rc-pingpong-gid    ibv_rc_pingpong -g GID plain verbs (ibverbs-utils), no perftest
    rping              rping -s / rping -c    rdma_cm alone (rdmacm-utils), no perftest

The capability ``rxe_netns`` is the first variant's outcome; the others say what would work
instead (the RDMA netns mode, ``rdma system show``, is reported beside them). Where it fails,
``testbed.capabilities.with_probe`` sends RoCE to the user-space engine.

Pure: the command lines, the GID choice, and the verdict on each variant's output. Thin:
``probe`` (root; everything it makes is recorded in the caller's run ledger before it exists
and removed at the end; an rxe device goes with its interface) and ``probe_platform``, which
``testbed doctor`` calls.
"""
from __future__ import annotations

import ipaddress
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from testbed.apply.modules import RXE_MODULE, load_modules
from testbed.capabilities import RXE_NETNS, Capability, Platform, with_probe
from testbed.errors import TestbedError
from testbed.traffic.roce.rxe import device_name, link_add_argv, parse_perftest, perftest_argv

HOSTS = ("rxp0", "rxp1")  # client, server
ADDRESSES = ("10.254.0.1", "10.254.0.2")  # inside the probe's two namespaces only
PREFIX_LEN = 24
PORT = 18600  # the TCP or rdma_cm port each variant listens on (one variant at a time)
DURATION_S = 2.0  # perftest's timed run
MESSAGE_BYTES = 65536
RXE_MTU_BYTES = 1024
PINGPONG_ITERS = 100
RPING_COUNT = 10
SERVER_START_S = 2.0  # perftest's and rping's clients do not retry: the server listens first
CLIENT_TIMEOUT_S = 60.0  # per variant; software-emulated machines are slow to connect
SERVER_EXIT_S = 10.0
GID_WAIT_S = 10.0  # the kernel fills the GID table from the interfaces' addresses, later
GID_POLL_S = 0.2
ROCE_V2 = "RoCE v2"
SYS_INFINIBAND = Path("/sys/class/infiniband")
REQUIRED_TOOLS = ("rdma", "ib_write_bw")  # the testbed's variant; the others are optional
VARIANT_TOOLS = {"perftest-rdma-cm": "ib_write_bw", "perftest-gid": "ib_write_bw",
                 "rc-pingpong-gid": "ibv_rc_pingpong", "rping": "rping"}


# --- pure ---------------------------------------------------------------------------------------


def ipv4_mapped_gid(ip: str) -> str:
    """The GID a RoCE v2 device derives from IPv4 ``ip``, as sysfs writes it:
    ``10.254.0.1`` -> ``0000:0000:0000:0000:0000:ffff:0afe:0001``."""
    packed = ipaddress.IPv6Address(f"::ffff:{ip}").packed
    return ":".join(packed[i:i + 2].hex() for i in range(0, 16, 2))


def roce_v2_gid_index(table: dict[int, tuple[str, str]], ip: str) -> int | None:
    """The index of ``ip``'s RoCE v2 GID in a GID table (index -> (gid, type)); None if the
    kernel has not made one."""
    wanted = ipv4_mapped_gid(ip)
    for index in sorted(table):
        gid, kind = table[index]
        if gid == wanted and kind == ROCE_V2:
            return index
    return None


@dataclass(frozen=True)
class Variant:
    """One way of connecting: its name, and the server's and the client's command lines."""

    name: str
    server: list[str]
    client: list[str]


def without_rdma_cm(argv: list[str], gid_index: int) -> list[str]:
    """perftest's command line with the GID index given instead of rdma_cm (``-R``)."""
    i = argv.index("-R")
    return [*argv[:i], "-x", str(gid_index), *argv[i + 1:]]


def variants(devices: tuple[str, str], gid_indexes: tuple[int | None, int | None],
             server_ip: str, port: int = PORT) -> list[Variant | str]:
    """Every variant to try, in order; a variant that needs a GID index the table lacks is
    the reason it cannot run, instead. ``devices`` and ``gid_indexes`` are the client's and
    the server's."""
    client_dev, server_dev = devices

    def perftest(device: str, peer: str | None = None) -> list[str]:
        return perftest_argv(device, DURATION_S, MESSAGE_BYTES, RXE_MTU_BYTES, port, peer)

    tried: list[Variant | str] = [Variant("perftest-rdma-cm", perftest(server_dev),
                                          perftest(client_dev, server_ip))]
    if None in gid_indexes:
        lacking = [HOSTS[i] for i, index in enumerate(gid_indexes) if index is None]
        reason = f"no RoCE v2 GID for the address of {', '.join(lacking)}"
        tried += [f"perftest-gid: {reason}", f"rc-pingpong-gid: {reason}"]
    else:
        client_gid, server_gid = gid_indexes
        tried.append(Variant("perftest-gid", without_rdma_cm(perftest(server_dev), server_gid),
                             without_rdma_cm(perftest(client_dev, server_ip), client_gid)))
        pingpong = ["ibv_rc_pingpong", "-p", str(port), "-n", str(PINGPONG_ITERS)]
        tried.append(Variant("rc-pingpong-gid",
                             [*pingpong, "-d", server_dev, "-g", str(server_gid)],
                             [*pingpong, "-d", client_dev, "-g", str(client_gid), server_ip]))
    rping = ["rping", "-v", "-C", str(RPING_COUNT), "-a", server_ip, "-p", str(port)]
    tried.append(Variant("rping", [rping[0], "-s", *rping[1:]], [rping[0], "-c", *rping[1:]]))
    return tried


@dataclass(frozen=True)
class Outcome:
    """How one variant went: connected or not, and in a line why."""

    name: str
    connected: bool
    detail: str
    client: list[str] = field(default_factory=list)


def judge(variant: Variant, returncode: int | None, client_output: str,
          server_output: str) -> Outcome:
    """A variant connected when its client exited 0 (and, for perftest, reported a result
    row); otherwise the tail of what the client (or the server) said."""
    if returncode is None:
        return Outcome(variant.name, False, f"client hung past {CLIENT_TIMEOUT_S:g} s; "
                       + tail(client_output or server_output), variant.client)
    report = parse_perftest(client_output) if variant.name.startswith("perftest") else None
    if returncode == 0 and (report is not None or not variant.name.startswith("perftest")):
        detail = (f"connected, RDMA WRITE at {report['average_gbit'] * 1e3:.1f} Mbit/s"
                  if report else "connected")
        return Outcome(variant.name, True, detail, variant.client)
    return Outcome(variant.name, False, f"exit {returncode}: "
                   + tail(client_output or server_output), variant.client)


def tail(text: str, chars: int = 200) -> str:
    """The last lines of a program's output, as one line."""
    return " / ".join(line.strip() for line in text.strip().splitlines()[-4:])[-chars:] \
        or "no output"


@dataclass
class RxeProbe:
    """What the probe found: the RDMA netns mode, each host's GID index, every variant."""

    netns_mode: str
    gid_indexes: tuple[int | None, int | None]
    outcomes: list[Outcome]
    error: str | None = None  # the probe itself could not run (set-up failed)

    def capability(self) -> Capability:
        """``rxe_netns``: the testbed's variant (the first) connected."""
        if self.error is not None:
            return Capability(RXE_NETNS, False, f"probe failed: {self.error}")
        first = self.outcomes[0]
        return Capability(RXE_NETNS, first.connected,
                          f"{first.name} between two namespaces: {first.detail}")

    def rows(self) -> list[tuple[str, str, str]]:
        """(variant, connected yes/no, detail), for doctor's table."""
        return [(o.name, "yes" if o.connected else "no", o.detail) for o in self.outcomes]


# --- thin layer ---------------------------------------------------------------------------------


def read_gid_table(device: str, port: int = 1,
                   root: Path = SYS_INFINIBAND) -> dict[int, tuple[str, str]]:
    """Index -> (gid, type) of every non-zero GID of ``device``'s ``port``, from sysfs."""
    base = root / device / "ports" / str(port)
    table = {}
    for path in sorted((base / "gids").glob("*"), key=lambda p: int(p.name)):
        try:
            gid = path.read_text().strip()
            kind = (base / "gid_attrs" / "types" / path.name).read_text().strip()
        except OSError:  # the kernel answers EINVAL for an empty entry's attributes
            continue
        if gid.strip("0:"):
            table[int(path.name)] = (gid, kind)
    return table


def _text(output) -> str:
    return output.decode(errors="replace") if isinstance(output, bytes) else (output or "")


def _try(hosts, ledger, variant: Variant) -> Outcome:
    """One variant: its server in the second namespace, then its client in the first."""
    client_host, server_host = hosts
    server = server_host.popen(variant.server, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    ledger.add_process(server.pid)
    try:
        time.sleep(SERVER_START_S)
        client = client_host.popen(variant.client, stdout=subprocess.PIPE,
                                   stderr=subprocess.STDOUT)
        ledger.add_process(client.pid)
        try:
            client_out = _text(client.communicate(timeout=CLIENT_TIMEOUT_S)[0])
            returncode = client.returncode
        except subprocess.TimeoutExpired:
            client.kill()
            client_out, returncode = _text(client.communicate()[0]), None
        try:
            server_out = _text(server.communicate(timeout=SERVER_EXIT_S)[0])
        except subprocess.TimeoutExpired:
            server.kill()
            server_out = _text(server.communicate()[0])
    finally:
        if server.poll() is None:
            server.kill()
            server.wait()
    return judge(variant, returncode, client_out, server_out)


def _wait_gid(device: str, ip: str) -> int | None:
    deadline = time.monotonic() + GID_WAIT_S
    while True:
        index = roce_v2_gid_index(read_gid_table(device), ip)
        if index is not None or time.monotonic() > deadline:
            return index
        time.sleep(GID_POLL_S)


def netns_mode() -> str:
    """``rdma system show``'s line (e.g. ``netns shared copy-on-fork on``), or why not."""
    out = subprocess.run(["rdma", "system", "show"], capture_output=True, text=True)
    return (out.stdout or out.stderr).strip() or f"rdma system show: exit {out.returncode}"


def probe(ledger, log=print, which: Callable[[str], str | None] | None = None) -> RxeProbe:
    """Build two namespaces joined by a veth pair, an rxe device on each end, and try every
    variant whose tool is installed; everything is removed before it returns."""
    import shutil

    from mininet.net import Mininet

    which = which or shutil.which
    load_modules([RXE_MODULE], log)
    mode = netns_mode()
    intfs = [f"{name}-eth0" for name in HOSTS]
    ledger.add_names(interfaces=intfs)
    net = Mininet(controller=None, build=False)
    hosts = [net.addHost(name, ip=f"{ip}/{PREFIX_LEN}") for name, ip in zip(HOSTS, ADDRESSES)]
    net.addLink(*hosts)
    gid_indexes: tuple[int | None, int | None] = (None, None)
    try:
        net.build()
        for host in hosts:
            ledger.add_process(host.pid)
            ledger.add_netns(host.pid)
        devices = []
        for host, intf in zip(hosts, intfs):
            out = host.cmd(*link_add_argv(intf), "&&", "echo", "rc=0")
            if "rc=0" not in out:
                return RxeProbe(mode, gid_indexes, [], error=f"rdma link add on {intf}: "
                                + tail(out))
            devices.append(device_name(intf))
        gid_indexes = tuple(_wait_gid(dev, ip) for dev, ip in zip(devices, ADDRESSES))
        log(f"rxe probe: devices {', '.join(devices)}, RoCE v2 GID indexes {gid_indexes}, "
            f"{mode}; GID tables: "
            + "; ".join(f"{dev} {read_gid_table(dev)}" for dev in devices))
        outcomes = []
        for variant in variants(tuple(devices), gid_indexes, ADDRESSES[1]):
            if isinstance(variant, str):
                name, reason = variant.split(": ", 1)
                outcomes.append(Outcome(name, False, f"not tried: {reason}"))
                continue
            tool = VARIANT_TOOLS[variant.name]
            if which(tool) is None:
                outcomes.append(Outcome(variant.name, False, f"not tried: {tool} is not "
                                        "installed", variant.client))
                continue
            outcomes.append(_try(hosts, ledger, variant))
            log(f"rxe probe: {outcomes[-1].name}: "
                f"{'connected' if outcomes[-1].connected else 'failed'}")
        return RxeProbe(mode, gid_indexes, outcomes)
    finally:
        net.stop()


def probe_platform(platform: Platform, machine, log=print, is_root: bool | None = None,
                   which: Callable[[str], str | None] | None = None
                   ) -> tuple[Platform, RxeProbe | None, str]:
    """``platform`` with the rxe probe's capability where it can run (root, a kernel with
    rdma_rxe, iproute2's rdma and perftest), its probe, and a line saying what was done.
    ``machine`` is the run lock and ledger's context manager (testbed.harness.run.machine):
    the probe is a run of its own, refused while another holds the machine."""
    import os
    import shutil

    which = which or shutil.which
    rxe = platform.capabilities.get("rdma_rxe")
    if rxe is None or not rxe.available:
        return platform, None, "rxe probe: not run (no rdma_rxe here)"
    if not (os.geteuid() == 0 if is_root is None else is_root):
        return platform, None, "rxe probe: not run (needs root: sudo testbed doctor)"
    missing = [tool for tool in REQUIRED_TOOLS if which(tool) is None]
    if missing:
        return platform, None, (f"rxe probe: not run ({', '.join(missing)} missing; "
                                "scripts/install.sh installs them)")
    try:
        with machine("rxe-probe", log=lambda m: None) as ledger:
            found = probe(ledger, log=lambda m: None, which=which)
    except TestbedError as err:
        return platform, None, f"rxe probe: not run ({err})"
    probed = found.capability()
    verdict = ("rxe connects two namespaces" if probed.available else
               "rxe does not connect two namespaces: RoCE takes the user-space engine")
    return with_probe(platform, probed), found, f"rxe probe ({found.netns_mode}): {verdict}"
