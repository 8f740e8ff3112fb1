"""The ``testbed`` command.

    testbed run SCENARIO [--set FIELD=VALUE ...]   any experiment, from a scenario file
    testbed EXPERIMENT [--its-params ...]          the same, from flags (one subcommand per
                                                   experiment in testbed.experiments.registry)
    testbed run SCENARIO --repeat N                N runs, each on a fresh fabric, as one result
    testbed report RUN_DIR [RUN_DIR ...]           a run's verdict, or several side by side
    testbed list                                   bundled scenarios, topologies, experiments
    testbed schema [--write]                       the scenario JSON schema
    testbed topo | doctor | clean | bench          describe, inspect, recover, measure
    testbed calibrate                              the highest rate this machine holds
    testbed chaos [--profile ci] [--seed N]        faults on purpose, each outcome checked

    testbed up [SCENARIO] [--setup NAME] [...]     bring a fabric up and keep it up
    testbed status [--json]                        what is up
    testbed exec HOST -- CMD [ARG...]              a command in a host's namespaces
    testbed cli                                    a Mininet-style prompt on the fabric
    testbed down                                   take it down

Exit status: 0 the run completed, every judged check passed and the emulator kept up; 1 a
check failed or the emulator did not keep up (``--accept-failed`` / ``--accept-untrusted``
accept that); 2 bad input, or a command that cannot start here (not root, Mininet missing):
every problem printed, one per line, naming its field, and nothing made; 3 the run failed; 4
an internal error (a bug: one line naming it, its traceback with ``--debug``); 130
interrupted (everything the run created has been removed). ``testbed report RUN_DIR`` exits
as the run did (0 or 1). ``testbed exec`` exits with its command's status; ``testbed cli``
with 1 when a command failed; ``testbed status`` with 1 when no fabric is up.
"""
from __future__ import annotations

import argparse
import json
import sys
import typing
from pathlib import Path

from testbed.apply.network import check_root
from testbed.apply.rxe_probe import probe_platform
from testbed.apply.state import Ledger, RunLock, clean, process_start_ticks
from testbed.capabilities import DATAPATH_ENV, USERSPACE_DATAPATH, detect
from testbed.capacity.bench import run_bench
from testbed.capacity.calibrate import calibrate
from testbed.chaos.command import add_arguments as add_chaos_arguments, cmd_chaos
from testbed.cli_help import arrange_help, listing
from testbed.errors import (
    EXIT_INTERNAL,
    EXIT_INTERRUPTED,
    EXIT_OK,
    EXIT_RUN_FAILED,
    EXIT_USAGE,
    EXIT_VERDICT,
    ConfigError,
    TestbedError,
    UsageError,
    short,
    shown,
)
from testbed.experiments.pages import claim
from testbed.experiments.registry import experiment_classes, json_schema, load, validate
from testbed.harness import summary_schema
from testbed.harness.console import doctor_report, print_rows, print_summary, table_text
from testbed.harness.provenance import SOURCE_ROOT, version_line
from testbed.harness.repeat import run_repeated
from testbed.harness.report import compare, gate_reasons, load_summary
from testbed.harness.run import check_can_build, machine, new_run_id, run_scenario
from testbed.harness.scenario import SCHEMA_PATH, merge
from testbed.harness.yaml_input import YamlInputError, load_text
from testbed.interactive import session
from testbed.interactive.attach import SessionState, exec_argv
from testbed.interactive.live import choose_setup
from testbed.interactive.session import describe as describe_session, running_session
from testbed.interactive.shell import FabricShell
from testbed.lab.command import add_arguments
from testbed.model.topology import build
from testbed.model.topology.describe import describe, description_rows, draw

DEFAULT_SCENARIO = "fattree-allreduce"
# Flags of ``testbed run`` kept from its first version: flag -> scenario field.
RUN_FLAGS = {"rate_mbit": "link_rate_mbit", "mtu": "mtu_bytes", "routing": "routing",
             "results": "results_dir", "name": "name", "seed": "seed",
             "size_bytes": "params.size_bytes", "iters": "params.iters",
             "warmup": "params.warmup", "channels": "params.channels"}


def parse_params(items: list[str], flag: str = "") -> dict:
    """``k=4 rate=10`` -> {"k": 4, "rate": 10}; values are YAML (testbed.harness.yaml_input:
    ``1e9`` a number, ``yes`` a string, within its bounds). An error names ``flag`` (the
    option the items came from), if given, and the item."""
    params = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ConfigError(f"{flag} {shown(item)}".strip(), "expected key=value")
        try:
            params[key] = load_text(value)
        except YamlInputError as exc:
            raise ConfigError(f"{flag} {shown(key)}".strip(), f"cannot parse value "
                              f"{short(value)}: {exc.problem}") from None
    return params


def run_overrides(args) -> dict:
    """The dotted scenario fields the flags of ``testbed run`` set."""
    overrides = {field: getattr(args, flag) for flag, field in RUN_FLAGS.items()
                 if getattr(args, flag, None) is not None}
    if args.topology or args.param:
        overrides["topology"] = {"name": args.topology or "fattree",
                                 **parse_params(args.param, "--param")}
    overrides.update(parse_params(args.set, "--set"))
    return overrides


def run_origins(args) -> dict[str, str]:
    """Dotted scenario field -> the flag of ``testbed run`` or ``up`` that set it: a problem
    in it names the flag, not a line of the scenario file."""
    origins = {field: "--" + flag.replace("_", "-") for flag, field in RUN_FLAGS.items()
               if getattr(args, flag, None) is not None}
    if args.topology or args.param:
        origins["topology"] = "--topology" if args.topology else "--param"
    if args.topology:
        origins["topology.name"] = "--topology"
    for flag, prefix, items in (("--param", "topology.", args.param), ("--set", "", args.set)):
        for item in items:
            key = item.partition("=")[0]
            origins[prefix + key] = f"{flag} {shown(key)}"
    return origins


def execute(resolved, args) -> int:
    """Run a resolved scenario (``--repeat`` times), print its summary, and turn the outcome
    into an exit status."""
    log = (lambda m: None) if args.quiet else (lambda m: print(f"[testbed] {m}", flush=True))
    if getattr(args, "repeat", None) is not None:
        return execute_repeated(resolved, args, log)
    outcome = run_scenario(resolved, log=log)
    print_summary(outcome.summary)
    return outcome.exit_status(args.accept_failed, args.accept_untrusted)


def execute_repeated(resolved, args, log) -> int:
    """``--repeat N``: N runs, each on a fresh fabric; one summary with every number's
    spread; exit 0 only when every run passed (with the same acceptances)."""
    outcome = run_repeated(resolved, args.repeat, log=log)
    print_summary(outcome.summary)
    return outcome.exit_status(args.accept_failed, args.accept_untrusted)


def cmd_run(args) -> int:
    resolved = load(args.scenario or DEFAULT_SCENARIO, run_overrides(args), run_origins(args))
    return execute(resolved, args)


# Flags every ``testbed EXPERIMENT`` command has besides its params: flag -> scenario field.
EXPERIMENT_FLAGS = {"rate_mbit": "link_rate_mbit", "mtu": "mtu_bytes", "results": "results_dir",
                    "seed": "seed"}


def experiment_request(args) -> tuple[Path | None, dict, dict]:
    """What ``testbed EXPERIMENT`` runs: the experiment's defaults scenario (the same file
    ``testbed run`` and ``make`` run; None when it has none, then its Params' defaults) with
    what the flags set, as (file, dotted field -> value, dotted field -> flag) for ``load``."""
    overrides: dict = {"name": args.name or args.experiment}
    origins = {"name": "--name"} if args.name else {}
    for field in args.param_fields:
        value = getattr(args, field)
        if value is not None:
            overrides[f"params.{field}"] = value
            origins[f"params.{field}"] = "--" + field.replace("_", "-")
    for flag, field in EXPERIMENT_FLAGS.items():
        if getattr(args, flag) is not None:
            overrides[field] = getattr(args, flag)
            origins[field] = "--" + flag.replace("_", "-")
    return experiment_classes()[args.experiment].defaults_path(), overrides, origins


def cmd_experiment(args) -> int:
    """An experiment from flags: its defaults scenario, with what the flags set."""
    path, overrides, origins = experiment_request(args)
    if path is not None:
        return execute(load(path, overrides, origins), args)
    data = merge({"experiment": args.experiment, "params": {}}, overrides)
    return execute(validate(data, f"testbed {args.experiment}", origins=origins), args)


def cmd_report(args) -> int:
    """One run's (or repeated run's) summary again, exiting as it did (0 passed, 1 not), or
    several side by side (exit 0); with ``--require-pass``, one line per reason and exit 1
    when any of them failed, was not trusted or stopped."""
    summaries = [load_summary(Path(d)) for d in args.run_dirs]
    if len(summaries) == 1:
        print_summary(summaries[0])
    else:
        print_rows(compare([Path(d) for d in args.run_dirs]))
    if not args.require_pass and len(summaries) > 1:
        return EXIT_OK
    reasons = [reason for summary in summaries for reason in gate_reasons(summary)]
    if args.require_pass:
        for reason in reasons:
            print(f"not passed: {reason}")
    return EXIT_VERDICT if reasons else EXIT_OK


def cmd_list(args) -> int:
    print(listing())
    return EXIT_OK


def cmd_schema(args) -> int:
    schema, path = ((summary_schema.json_schema(), summary_schema.SCHEMA_PATH) if args.summary
                    else (json_schema(), SCHEMA_PATH))
    text = json.dumps(schema, indent=1, sort_keys=True) + "\n"
    if args.write is None:
        sys.stdout.write(text)
        return EXIT_OK
    target = Path(args.write) if args.write else checkout_path(path)
    if target is None:
        raise ConfigError("--write", "this testbed is installed, not a checkout: name a file "
                          "(--write PATH) or redirect the printed schema")
    write_output("--write", target, text)
    print(f"wrote {target}")
    return EXIT_OK


def checkout_path(path: Path) -> Path | None:
    """``path`` (a file of the source tree) when this testbed runs from a checkout, None when
    it is installed."""
    return path if (SOURCE_ROOT / ".git").exists() else None


def output_folder(flag: str, path: Path) -> None:
    """Refuse an output path whose folder does not exist (one line naming ``flag``): the
    testbed creates no folders but its own."""
    folder = path.parent
    if not folder.is_dir():
        raise ConfigError(flag, f"no folder {str(folder)!r} for {str(path)!r}: create it first")


def write_output(flag: str, path: Path, text: str) -> None:
    """``text`` into ``path`` in an existing folder, or one line naming ``flag``."""
    output_folder(flag, path)
    try:
        path.write_text(text)
    except OSError as exc:
        raise ConfigError(flag, f"cannot write {str(path)!r}: {exc.strerror}") from None


def cmd_topo(args) -> int:
    if args.draw is not None and "=" in args.draw:
        raise ConfigError("--draw", f"expected a PNG or SVG path, got {args.draw!r}; put --draw "
                          "after the parameters")
    drawing = Path(args.draw or f"results/topo-{args.name}.png")
    if args.draw:
        output_folder("--draw", drawing)
    fabric = build(args.name, **parse_params(args.param))
    info = describe(fabric)
    print(json.dumps(info, indent=1) if args.json else table_text(description_rows(info)))
    if args.draw is not None:
        if not args.draw:
            drawing.parent.mkdir(exist_ok=True)  # the results folder
        try:
            path = draw(fabric, drawing)
        except OSError as exc:
            raise ConfigError("--draw", f"cannot write {str(drawing)!r}: {exc.strerror}") from None
        print(f"drawing: {path}", file=sys.stderr if args.json else sys.stdout)
    return 0


def cmd_doctor(args) -> int:
    platform, probed, line = detect(), None, ""
    if args.probe:  # softRoCE between namespaces, by trying (testbed.apply.rxe_probe)
        platform, probed, line = probe_platform(platform, machine)
    print(doctor_report(platform))
    if line:
        print(f"\n{line}")
        if probed is not None and probed.outcomes:
            print(table_text(probed.rows(), ("rxe variant", "connected", "detail")))
    return 0


def cmd_clean(args) -> int:
    check_root()
    clean_machine()
    return 0


def clean_machine() -> None:
    """Remove what an interrupted run, or the holder of a fabric kept up, left behind."""
    with RunLock("clean"):  # held: no run, and no holder of a fabric, is alive
        ledger = Ledger.load()
        if ledger is None:
            print("nothing to clean: no interrupted run on record")
        else:
            removed = clean(ledger)
            print(f"removed what run {ledger.run_id} left: {removed}")
        stale = SessionState.load()
        if stale is not None:
            SessionState.discard()
            print(f"removed the record of fabric {stale.run_id}, whose holder is gone")


# --- a fabric kept up: testbed up, status, exec, cli, down -----------------------------------


def cmd_up(args) -> int:
    """Bring a scenario's fabric up in a holder process and return once it is ready."""
    source = args.scenario or DEFAULT_SCENARIO
    overrides = run_overrides(args)
    resolved = load(source, overrides, run_origins(args))
    setup = choose_setup(resolved, args.setup)
    check_can_build()
    with RunLock("up"):
        pass  # refused here, before anything is made, when the machine is busy
    run_id = new_run_id(resolved.scenario.name)
    workdir = (Path(resolved.scenario.results_dir) / run_id).resolve()
    workdir.mkdir(parents=True)
    log_path = workdir / session.HOLDER_LOG
    print(f"[testbed] bringing up {resolved.scenario.name}: {setup.fabric.label()}, "
          f"{len(setup.fabric.hosts)} hosts, {len(setup.fabric.switches)} switches "
          f"(run {run_id})", flush=True)
    proc, read_fd = session.start_holder(
        {"source": source, "overrides": overrides, "setup": setup.name, "run_id": run_id,
         "workdir": str(workdir)}, log_path)
    follow = session.LogFollower(log_path, lambda line: print(line, flush=True))
    try:
        report = session.read_report(read_fd, session.READY_TIMEOUT_S, follow)
    except BaseException:  # Ctrl-C or no answer in time: the holder takes it all down
        proc.terminate()
        proc.wait(session.DOWN_TIMEOUT_S)
        follow()
        raise
    follow()
    if report is None or "error" in report:
        proc.wait(session.DOWN_TIMEOUT_S)  # it has taken down what it made
        error = report["error"] if report else f"the holder exited ({proc.returncode})"
        raise TestbedError(f"the fabric did not come up: {error} (log: {log_path})")
    state = session.running_session()
    print("\n".join(session.usage_lines(state, state.fabric())))
    return 0


def cmd_status(args) -> int:
    import datetime
    from dataclasses import asdict

    try:
        state = running_session()
    except TestbedError as exc:  # nothing up, or its holder gone
        print(exc)
        return EXIT_VERDICT
    if args.json:
        print(json.dumps({**asdict(state), "live_hosts": state.live_hosts()}, indent=1))
        return EXIT_OK
    now = datetime.datetime.now(datetime.timezone.utc)
    print("\n".join(describe_session(state, state.fabric(), len(state.live_hosts()), now)))
    return EXIT_OK


def cmd_exec(args) -> int:
    """Become the command, run in the host's namespaces: its output, input and exit status
    are the command's own."""
    import os

    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        raise ConfigError("exec", f"what should {args.host} run? `testbed exec {args.host} -- "
                          "CMD [ARG...]`")
    check_root()
    state = running_session()
    if args.host not in state.hosts:
        raise ConfigError(args.host, f"no such host; hosts: {', '.join(state.hosts)}")
    pid = state.hosts[args.host]
    if process_start_ticks(pid) != state.host_start_ticks.get(args.host):
        raise TestbedError(f"{args.host}'s shell (pid {pid}) is gone")
    argv = exec_argv(pid, command)
    sys.stdout.flush()
    os.execvp(argv[0], argv)
    return EXIT_RUN_FAILED  # not reached: execvp returns only by raising


def cmd_cli(args) -> int:
    check_root()
    failures = FabricShell(running_session().attach()).loop()
    return EXIT_OK if failures == 0 else EXIT_VERDICT


def cmd_down(args) -> int:
    import time

    check_root()
    state = session.SessionState.load()
    if state is None:
        print("no fabric is up")
        return EXIT_OK
    if not state.holder_alive():
        print(f"the holder of run {state.run_id} (pid {state.holder_pid}) is gone: removing "
              "what it left")
        clean_machine()
        return EXIT_OK
    print(f"[testbed] taking down run {state.run_id} (holder pid {state.holder_pid})",
          flush=True)
    t0 = time.monotonic()
    session.signal_holder(state)
    if not session.wait_gone(state):
        raise TestbedError(f"the holder (pid {state.holder_pid}) is still taking the fabric "
                           f"down after {session.DOWN_TIMEOUT_S:.0f} s; see "
                           f"{state.workdir}/{session.HOLDER_LOG}")
    if Ledger.load() is not None:  # the holder died before its clean-up finished
        raise TestbedError(f"the holder of run {state.run_id} exited leaving part of the "
                           "fabric: run `testbed clean`")
    print(f"[testbed] fabric down in {time.monotonic() - t0:.1f} s; its files: {state.workdir}")
    return EXIT_OK


def cmd_bench(args) -> int:
    if args.userspace_datapath:  # before anything detects this machine's paths
        import os

        os.environ[DATAPATH_ENV] = USERSPACE_DATAPATH
    run_bench(args.output, tuple(args.k or (4, 8)), log=lambda m: print(f"[bench] {m}", flush=True),
              ceilings=not args.no_ceilings, lines_only=args.lines_only)
    return 0


def cmd_calibrate(args) -> int:
    check_root()
    calibrate(log=lambda m: print(f"[calibrate] {m}", flush=True), start_mbit=args.start_mbit,
              max_mbit=args.max_mbit, results_dir=args.results)
    return EXIT_OK


class OneLineErrors(argparse.ArgumentParser):
    """Usage errors as one line (``testbed: error: ...``, exit 2) like the testbed's own."""

    def error(self, message):
        self.exit(EXIT_USAGE, f"testbed: error: {message} (see `{self.prog} --help`)\n")


def add_repeat_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--repeat", type=int, metavar="N",
                        help="run N times, each on a fresh fabric; one summary gives every "
                             "number's median, min, max and N, and passes only when every run "
                             "passed")


def add_outcome_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--accept-failed", action="store_true",
                        help="exit 0 even when a check failed")
    parser.add_argument("--accept-untrusted", action="store_true",
                        help="exit 0 even when the emulator did not keep up")
    parser.add_argument("--quiet", action="store_true", help="print only the summary")


BOOLEAN_WORDS = {"true": True, "yes": True, "1": True, "false": False, "no": False, "0": False}


def strict_bool(text: str) -> bool:
    """A boolean flag's value: true or false (also yes/no, 1/0, in any case); anything else,
    a typo such as ``ture`` included, is refused rather than taken as false."""
    value = BOOLEAN_WORDS.get(text.strip().lower())
    if value is None:
        raise argparse.ArgumentTypeError(f"expected true or false, got {text!r}")
    return value


def comma_list(text: str) -> list:
    """``1,3,7`` -> [1, 3, 7]: each item a YAML scalar."""
    try:
        return [parse_params([f"v={item}"])["v"] for item in text.split(",") if item]
    except ConfigError as exc:  # argparse names the flag
        raise argparse.ArgumentTypeError(exc.problem) from None


class Flatten(argparse.Action):
    """``--senders 2 8``, ``--senders 2,8`` and ``--senders 2 --senders 8`` all give [2, 8]."""

    def __call__(self, parser, namespace, values, option_string=None):
        earlier = getattr(namespace, self.dest, None) or []
        setattr(namespace, self.dest, [*earlier, *(item for group in values for item in group)])


def field_flag(parser: argparse.ArgumentParser, name: str, info, aliases=(),
               defaults: dict | None = None) -> None:
    """One ``--flag`` for a pydantic field: lists as comma-separated values, booleans as
    true/false, the rest as their type; help from the field's description and default (the
    value in ``defaults`` where it has one, else the field's own)."""
    annotation = info.annotation
    origin = typing.get_origin(annotation)
    args = [a for a in typing.get_args(annotation) if a is not type(None)]
    base = args[0] if origin in (typing.Union, getattr(__import__("types"), "UnionType", None)) \
        and args else annotation
    default = (defaults or {}).get(name, info.get_default(call_default_factory=True))
    help_text = (info.description or "") + f" (default {default!r})"
    flags = ["--" + name.replace("_", "-"), *aliases]
    if typing.get_origin(base) in (list, tuple):
        parser.add_argument(*flags, dest=name, type=comma_list, nargs="+", action=Flatten,
                            metavar="A,B,...", help=help_text)
    elif base is bool:
        parser.add_argument(*flags, dest=name, type=strict_bool, metavar="true|false",
                            help=help_text)
    elif typing.get_origin(base) is typing.Literal:  # e.g. Literal[1024, 2048, 4096]
        choices = typing.get_args(base)
        parser.add_argument(*flags, dest=name, type=type(choices[0]), choices=choices,
                            help=help_text)
    else:
        parser.add_argument(*flags, dest=name, type=base if base in (int, float) else str,
                            help=help_text)


def add_experiment_commands(sub) -> None:
    """``testbed NAME`` for every registered experiment, its flags from its Params, their
    defaults from its defaults scenario (Experiment.defaults)."""
    for name, cls in sorted(experiment_classes().items()):
        path = cls.defaults_path()
        source = (f" Without flags it runs the bundled scenario {path.stem} (`testbed run "
                  f"{path.stem}`); each flag changes one of its fields." if path else "")
        parser = sub.add_parser(name, help=cls.title,
                                description=f"{cls.title}: {claim(name)}.{source}")
        fields = cls.Params.model_fields
        aliases: dict[str, list[str]] = {}
        for alias, field in cls.cli_aliases.items():  # flags kept from earlier versions
            aliases.setdefault(field, []).append(alias)
        defaults = cls.defaults()  # its defaults scenario: what it runs without flags
        for field, info in fields.items():
            field_flag(parser, field, info, aliases.get(field, ()), defaults.get("params"))
        rate = defaults.get("link_rate_mbit")
        parser.add_argument("--rate-mbit", type=float, help="link rate in Mbit/s (default " + (
            f"{rate:g})" if rate else f"this machine's calibrated rate, else "
            f"{cls.default_rate_mbit:g})"))
        parser.add_argument("--mtu", type=int, help=f"MTU in bytes (default "
                            f"{defaults.get('mtu_bytes') or cls.default_mtu_bytes})")
        parser.add_argument("--results", help="results folder (default results)")
        parser.add_argument("--name", help="run name (part of the run id)")
        parser.add_argument("--seed", type=int, help="random seed (default 1)")
        add_repeat_flag(parser)
        add_outcome_flags(parser)
        parser.set_defaults(func=cmd_experiment, experiment=name, param_fields=list(fields))


def add_fabric_flags(parser: argparse.ArgumentParser) -> None:
    """The scenario flags ``testbed run`` and ``testbed up`` share."""
    parser.add_argument("scenario", nargs="?", help=f"scenario YAML or bundled name (default "
                        f"{DEFAULT_SCENARIO}; `testbed list` shows the bundled ones)")
    parser.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE",
                        help="set any scenario field, e.g. --set params.size_bytes=4194304 "
                             "(repeatable)")
    parser.add_argument("--topology", help="topology family, e.g. fattree (`testbed list` "
                        "shows them)")
    parser.add_argument("--param", action="append", default=[], metavar="KEY=VALUE",
                        help="topology parameter, e.g. --param k=4 (repeatable)")
    parser.add_argument("--rate-mbit", type=float, help="link rate in Mbit/s")
    parser.add_argument("--mtu", type=int, help="MTU in bytes")
    parser.add_argument("--routing", help="ecmp or single; minimal, valiant or ugal on a "
                        "dragonfly")


def add_session_commands(sub) -> None:
    """``testbed up``, ``status``, ``exec``, ``cli`` and ``down``: a fabric kept up."""
    up = sub.add_parser("up", help="bring a scenario's fabric up and keep it up (then exec, "
                        "cli, status, down)")
    add_fabric_flags(up)
    up.add_argument("--setup", help="which of the scenario's fabrics, when it has several")
    up.add_argument("--results", help="results folder (default results/)")
    up.add_argument("--name", help="run name (part of the run id)")
    up.set_defaults(func=cmd_up)

    status = sub.add_parser("status", help="the fabric `testbed up` keeps, if any")
    status.add_argument("--json", action="store_true", help="print the state as JSON")
    status.set_defaults(func=cmd_status)

    run_in = sub.add_parser("exec", help="run a command in a host of the fabric: testbed exec "
                            "HOST -- CMD [ARG...]")
    run_in.add_argument("host", help="host name, e.g. p0e0h0")
    run_in.add_argument("command", nargs=argparse.REMAINDER, help="the command and its "
                        "arguments, after --")
    run_in.set_defaults(func=cmd_exec)

    sub.add_parser("cli", help="a Mininet-style prompt on the fabric (commands also from a "
                   "pipe)").set_defaults(func=cmd_cli)
    sub.add_parser("down", help="take the fabric `testbed up` keeps down"
                   ).set_defaults(func=cmd_down)


def add_lab_commands(sub) -> None:
    """``testbed lab list | run N | check N | index``: the teaching labs (testbed.lab)."""
    add_arguments(sub.add_parser("lab", help="the teaching labs: list, run N, check N, index "
                                 "(labs/)"))


def add_chaos_command(sub) -> None:
    """``testbed chaos``: faults on purpose, counted (testbed.chaos)."""
    chaos = sub.add_parser("chaos", help="inject faults into runs (kills, flaps, full disks, "
                           "SIGKILLs in every phase) and check each ends as the fault table "
                           "says")
    add_chaos_arguments(chaos)
    chaos.set_defaults(func=cmd_chaos)


def build_parser() -> argparse.ArgumentParser:
    ap = OneLineErrors(prog="testbed", description="AI data-center fabric testbed",
                       epilog="exit status: 0 passed, 1 a check failed or the emulator did not "
                              "keep up, 2 bad input (nothing made), 3 the run failed, 4 an "
                              "internal error, 130 interrupted")
    ap.add_argument("--version", action="version", version=version_line())
    ap.add_argument("--debug", action="store_true",
                    help="show the traceback of an internal error (exit status 4)")
    sub = ap.add_subparsers(dest="command", required=True, parser_class=OneLineErrors)

    run = sub.add_parser("run", help="run a scenario (a YAML file, or a bundled scenario's name)")
    add_fabric_flags(run)
    run.add_argument("--size-bytes", type=int, help="AllReduce size in bytes (allreduce)")
    run.add_argument("--iters", type=int, help="timed iterations (allreduce)")
    run.add_argument("--warmup", type=int, help="warm-up iterations (allreduce)")
    run.add_argument("--channels", type=int, help="parallel ring channels (allreduce)")
    run.add_argument("--seed", type=int, help="random seed")
    run.add_argument("--results", help="results folder (default results/)")
    run.add_argument("--name", help="run name (part of the run id)")
    add_repeat_flag(run)
    add_outcome_flags(run)
    run.set_defaults(func=cmd_run)

    add_experiment_commands(sub)

    add_tool_commands(sub)

    topo = sub.add_parser("topo", help="describe a topology without building it")
    topo.add_argument("name", help="topology family, e.g. fattree (`testbed list` shows the "
                      "families and their parameters)")
    topo.add_argument("param", nargs="*", help="parameters, e.g. k=4")
    topo.add_argument("--json", action="store_true", help="print JSON")
    topo.add_argument("--draw", nargs="?", const="", metavar="PATH",
                      help="also draw it (PNG or SVG by the suffix; default "
                           "results/topo-<name>.png)")
    topo.set_defaults(func=cmd_topo)

    doctor = sub.add_parser("doctor", help="what this machine can do and which path each "
                            "feature takes")
    doctor.add_argument("--no-probe", dest="probe", action="store_false",
                        help="skip the rxe probe (as root where the kernel has rdma_rxe, "
                        "doctor tries softRoCE between two namespaces of its own)")
    doctor.set_defaults(func=cmd_doctor)
    sub.add_parser("clean", help="remove what an interrupted run left behind"
                   ).set_defaults(func=cmd_clean)
    add_chaos_command(sub)
    add_session_commands(sub)
    add_lab_commands(sub)
    bench = sub.add_parser("bench", help="measure forwarding capacity and fabric bring-up")
    bench.add_argument("--output", default="results/bench.json", help="JSON output path")
    bench.add_argument("--k", type=int, action="append", choices=[4, 6, 8],
                       help="fat-tree sizes to bring up, take down and find the ring's "
                            "ceiling on (default: 4 and 8)")
    bench.add_argument("--no-ceilings", action="store_true",
                       help="skip the ring ceiling searches (the longest part)")
    bench.add_argument("--lines-only", action="store_true",
                       help="measure the forwarding lines only (no fabrics, failover, RoCE)")
    bench.add_argument("--userspace-datapath", action="store_true",
                       help="the userspace datapath everywhere, even where the kernel has the "
                            "openvswitch module (by default fabrics take the kernel datapath "
                            "there, and the two-switch line is measured on both)")
    bench.set_defaults(func=cmd_bench)

    cal = sub.add_parser("calibrate", help="find the highest link rate this machine emulates "
                         "faithfully (the k=4 ring trusted at >= 90%% busbw) and keep it as "
                         "the default")
    cal.add_argument("--start-mbit", type=float, default=25.0, help="first rate tried (25)")
    cal.add_argument("--max-mbit", type=float, default=1600.0, help="highest rate tried (1600)")
    cal.add_argument("--results", default="results", help="where the trials' runs go")
    cal.set_defaults(func=cmd_calibrate)
    arrange_help(ap, sub)
    return ap


def add_tool_commands(sub) -> None:
    """``testbed report``, ``list`` and ``schema``: read runs and describe the testbed."""
    report = sub.add_parser("report", help="print a run's verdict, or compare runs and "
                            "repeated runs side by side",
                            description="Print a run's verdict (exiting 0 when it passed, 1 when "
                            "not), or compare runs and repeated runs side by side (exiting 0 "
                            "unless --require-pass).")
    report.add_argument("run_dirs", nargs="+", metavar="RUN_DIR",
                        help="a run's folder (results/RUN_ID) or its summary.json, or a "
                             "repeated run's folder")
    report.add_argument("--require-pass", action="store_true",
                        help="exit 1 when any run failed a check, was not trusted or stopped "
                             "(a gate for scripts and CI)")
    report.set_defaults(func=cmd_report)

    sub.add_parser("list", help="the bundled scenarios, the topology families with their "
                   "parameters, and the experiments, one line each").set_defaults(func=cmd_list)

    schema = sub.add_parser("schema", help="print the scenario JSON schema (for editors), or "
                            "summary.json's")
    schema.add_argument("--summary", action="store_true",
                        help="summary.json's schema instead of the scenario's")
    schema.add_argument("--write", nargs="?", const="", metavar="PATH",
                        help="write it to PATH (in a checkout, by default, to "
                             "testbed/scenarios/schema.json; with --summary, to "
                             "docs/summary.schema.json)")
    schema.set_defaults(func=cmd_schema)


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except UsageError as exc:  # bad input, or not root or no Mininet: nothing was made
        print_error(str(exc))
        return EXIT_USAGE
    except TestbedError as exc:
        print_error(str(exc))
        return EXIT_RUN_FAILED
    except KeyboardInterrupt:
        print("testbed: interrupted; everything the run created has been removed", file=sys.stderr)
        return EXIT_INTERRUPTED
    except BrokenPipeError:
        # a reader such as `head` closed the pipe: stop quietly, as other tools do
        import os
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_OK
    except Exception as exc:  # a bug: named, with an exit status of its own
        return internal_error(exc, args.debug)


def print_error(message: str) -> None:
    """A user's error: each line of ``message`` as one ``testbed: error:`` line (split at
    newlines only: the user's text in it is quoted already)."""
    for line in message.rstrip("\n").split("\n"):
        print(f"testbed: error: {line.strip()}", file=sys.stderr)


def internal_error(exc: Exception, debug: bool) -> int:
    """A bug in the testbed: EXIT_INTERNAL and one line naming the exception, or with
    ``--debug`` its whole traceback first; never mistaken for bad input or a failed run."""
    import traceback

    if debug:
        traceback.print_exception(exc, file=sys.stderr)
    text = " ".join(str(exc).split())
    print_error(f"internal error: {type(exc).__name__}{': ' + text if text else ''} (a bug in "
                f"the testbed; {'' if debug else 'rerun with --debug for its traceback and '}"
                "please report it)")
    return EXIT_INTERNAL


if __name__ == "__main__":
    sys.exit(main())
