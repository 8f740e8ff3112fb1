"""``testbed cli``: a Mininet-style prompt on a running fabric (testbed.interactive.attach).

    testbed> p0e0h0 ping -c1 p3e1h1      a command on a host; host names become their IPs
    testbed> pingall                     every host pings every other host
    testbed> iperf p0e0h0 p3e1h1 [S]     one TCP flow for S seconds (default 5), Mbit/s received
    testbed> nodes | links | net         what is there, and how it is cabled (links: up or DOWN)
    testbed> dump-flows p0e0             a switch's flows, as OVS holds them
    testbed> dump-groups p0e0            a switch's groups (ECMP select groups)
    testbed> link down p0e0 p0a0         cut a cable (``link up`` restores it)
    testbed> exit

A host command is an argument list (split as a shell would split it, never run by a shell):
``p0e0h0 sh -c 'ping -c1 p3e1h1 | tail -1'`` asks for a shell explicitly. Commands are read
from the terminal with line editing, or one a line from a pipe (``echo pingall | testbed
cli``), each then echoed after the prompt so the output reads as a transcript. Parsing is a
pure function (``parse_command``); ``FabricShell`` runs what it returns.
"""
from __future__ import annotations

import cmd
import shlex
import subprocess
import sys
from dataclasses import dataclass

from testbed.errors import TestbedError
from testbed.interactive.attach import DEFAULT_IPERF_S, flow_lines, group_lines, net_lines

PROMPT = "testbed> "
HOST, EXIT, HELP, EMPTY = "host", "exit", "help", "empty"
PINGALL, IPERF, NODES, LINKS, NET = "pingall", "iperf", "nodes", "links", "net"
DUMP_FLOWS, DUMP_GROUPS, LINK = "dump-flows", "dump-groups", "link"
MAX_IPERF_S = 3600
USAGE = {
    "HOST CMD [ARG...]": "run a command on a host (host names in it become their IPs)",
    PINGALL: "every host pings every other host once",
    "iperf A B [SECONDS]": f"one iperf3 TCP flow from host A to host B (default "
                           f"{DEFAULT_IPERF_S} s)",
    NODES: "the hosts and switches",
    LINKS: "every cable, and whether it is up",
    NET: "every node with its interfaces and what each is cabled to",
    "dump-flows SWITCH": "the switch's OpenFlow flows, as OVS holds them",
    "dump-groups SWITCH": "the switch's OpenFlow groups (ECMP select groups)",
    "link down|up A B": "cut or restore the cable between nodes A and B",
    "exit": "leave (the fabric stays up: `testbed down` takes it down)",
}


class CommandError(TestbedError):
    """A line the prompt cannot run: unknown command, node or wrong arguments."""


@dataclass(frozen=True)
class Command:
    """A parsed line: what to do (``name``), on what (``args``: node names, a number), and for
    a host command the argument list to run there."""

    name: str
    args: tuple[str, ...] = ()
    argv: tuple[str, ...] = ()


def substitute_hosts(argv: list[str], ips: dict[str, str]) -> list[str]:
    """Every argument that is a host's name replaced by its IP address, as Mininet's CLI does."""
    return [ips.get(arg, arg) for arg in argv]


def parse_command(line: str, ips: dict[str, str], switches: list[str]) -> Command:
    """One prompt line as a Command. ``ips`` maps each host to its address, ``switches`` are
    the switch names; names are checked here, cabling when the command runs."""
    try:
        words = shlex.split(line)
    except ValueError as exc:
        raise CommandError(f"cannot split the line: {exc}") from None
    if not words:
        return Command(EMPTY)
    first, rest = words[0], words[1:]
    nodes = [*ips, *switches]
    if first in ips:
        if not rest:
            raise CommandError(f"what should {first} run? e.g. `{first} ip addr`")
        return Command(HOST, (first,), tuple(substitute_hosts(rest, ips)))
    if first in ("exit", "quit", "EOF"):
        return Command(EXIT)
    if first in ("help", "?"):
        return Command(HELP, tuple(rest[:1]))
    if first in (PINGALL, NODES, LINKS, NET):
        _arity(first, rest, 0, 0)
        return Command(first)
    if first == IPERF:
        _arity(first, rest, 2, 3)
        _known(rest[:2], list(ips), "host")
        seconds = _seconds(rest[2]) if len(rest) > 2 else DEFAULT_IPERF_S
        return Command(IPERF, (rest[0], rest[1], str(seconds)))
    if first in (DUMP_FLOWS, DUMP_GROUPS):
        _arity(first, rest, 1, 1)
        _known(rest, switches, "switch")
        return Command(first, tuple(rest))
    if first == LINK:
        # ``link down A B`` or, as Mininet writes it, ``link A B down``
        _arity(first, rest, 3, 3)
        if rest[0] in ("up", "down"):
            state, a, b = rest
        elif rest[2] in ("up", "down"):
            a, b, state = rest
        else:
            raise CommandError("usage: link down|up A B")
        _known([a, b], nodes, "node")
        return Command(LINK, (a, b, state))
    raise CommandError(f"unknown command or host {first!r}; `help` lists the commands")


def _arity(name: str, args: list[str], least: int, most: int) -> None:
    if not least <= len(args) <= most:
        usage = next((u for u in USAGE if u.split()[0] == name), name)
        raise CommandError(f"usage: {usage}")


def _known(names: list[str], known: list[str], what: str) -> None:
    for name in names:
        if name not in known:
            plural = "switches" if what == "switch" else f"{what}s"
            raise CommandError(f"no {what} {name!r}; {plural}: {', '.join(known)}")


def _seconds(text: str) -> int:
    try:
        seconds = int(text)
    except ValueError:
        seconds = 0
    if not 1 <= seconds <= MAX_IPERF_S:
        raise CommandError(f"iperf seconds: a whole number from 1 to {MAX_IPERF_S}, "
                           f"got {text!r}")
    return seconds


def help_lines(topic: str = "") -> list[str]:
    entries = [(u, w) for u, w in USAGE.items() if not topic or u.split()[0] == topic]
    if not entries:
        return [f"no command {topic!r}"]
    width = max(len(u) for u, _ in entries)
    return [f"  {u.ljust(width)}  {w}" for u, w in entries]


class FabricShell(cmd.Cmd):
    """The prompt over ``fabric`` (testbed.interactive.attach.Attached, or anything with its
    methods). ``failures`` counts the commands that failed, for an exit status."""

    def __init__(self, fabric, stdin=None, stdout=None):
        super().__init__(stdin=stdin, stdout=stdout)
        self.fabric = fabric
        self.interactive = self.stdin.isatty()
        self.use_rawinput = self.interactive and self.stdin is sys.stdin
        self.prompt = PROMPT if self.interactive else ""
        self.failures = 0

    def loop(self) -> int:
        """Read and run commands until ``exit`` or the end of input; returns ``failures``.
        Ctrl-C stops the command running, not the prompt."""
        while True:
            try:
                self.cmdloop()
                return self.failures
            except KeyboardInterrupt:
                self.say("\ninterrupted")

    def say(self, *lines: str) -> None:
        for line in lines:
            self.stdout.write(line + "\n")
        self.stdout.flush()

    def emptyline(self) -> bool:
        return False  # not cmd.Cmd's default of repeating the last command

    def onecmd(self, line: str) -> bool:
        if not self.interactive and line.strip() and line != "EOF":
            self.say(PROMPT + line)
        try:
            return self.execute(parse_command(line, self.fabric.ips, self.fabric.switch_names))
        except (TestbedError, OSError, subprocess.SubprocessError) as exc:
            self.failures += 1  # the prompt goes on: a command that failed, not the session
            self.say(f"*** {exc}")
            return False
        except KeyboardInterrupt:
            self.failures += 1
            self.say("*** interrupted")
            return False

    def execute(self, command: Command) -> bool:
        """Run one command; True ends the prompt."""
        fabric, name, args = self.fabric, command.name, command.args
        if name == EXIT:
            if self.interactive:
                self.say("")
            return True
        if name == HELP:
            self.say(*help_lines(*args))
        elif name == HOST:
            self.run_on_host(args[0], list(command.argv))
        elif name == PINGALL:
            lines, sent, received = fabric.reachability()
            self.say(*lines)
            if received != sent:
                self.failures += 1
        elif name == IPERF:
            rate_mbit = fabric.iperf(args[0], args[1], int(args[2]))
            self.say(f"*** iperf3 {args[0]} -> {args[1]}: {rate_mbit:.2f} Mbit/s received")
        elif name == NODES:
            self.say("hosts: " + " ".join(fabric.host_names),
                     "switches: " + " ".join(fabric.switch_names))
        elif name == LINKS:
            self.say(*fabric.links())
        elif name == NET:
            self.say(*net_lines(fabric.fabric))
        elif name in (DUMP_FLOWS, DUMP_GROUPS):
            if name == DUMP_FLOWS:
                self.say(*flow_lines(args[0], fabric.dump_flows(args[0])))
            else:
                self.say(*group_lines(args[0], fabric.dump_groups(args[0])))
        elif name == LINK:
            a, b, state = args
            fabric.set_link(a, b, state == "up")
            self.say(f"*** link {a}-{b} {state}")
        return False

    def run_on_host(self, host: str, argv: list[str]) -> None:
        """A command on a host: its output to this prompt's output, its input the terminal
        (nothing when commands come from a pipe, so it cannot eat the next ones)."""
        stdin = None if self.interactive else subprocess.DEVNULL
        if self.stdout is sys.stdout:
            self.stdout.flush()
            done = self.fabric.run(host, argv, stdin=stdin)
        else:
            done = self.fabric.run(host, argv, stdin=stdin, capture_output=True, text=True)
            self.stdout.write(done.stdout + done.stderr)
        if done.returncode != 0:
            self.failures += 1
            self.say(f"*** {host}: {argv[0]} exited with status {done.returncode}")

    def completenames(self, text: str, *ignored) -> list[str]:
        words = [*self.fabric.host_names, PINGALL, IPERF, NODES, LINKS, NET, DUMP_FLOWS,
                 DUMP_GROUPS, LINK, "exit", "help"]
        return [w for w in words if w.startswith(text)]

    def completedefault(self, text: str, *ignored) -> list[str]:
        return [n for n in [*self.fabric.host_names, *self.fabric.switch_names]
                if n.startswith(text)]
