"""The ``testbed`` command: run, topo, doctor, clean, bench, and the experiments (hedera,
dragonfly-routing, incast, dctcp).

Errors the user can act on print as one line (``testbed: error: ...``) with exit status 2;
Ctrl-C exits 130 after the run has torn everything down.
"""
from __future__ import annotations

import argparse
import json
import sys

from testbed.errors import ConfigError, TestbedError
from testbed.plan.scaling import DEFAULT_PFC_REACTION_TIME_S

SCENARIO_FLAGS = {  # flag -> RunConfig field
    "rate_mbit": "link_rate_mbit", "size_bytes": "size_bytes", "iters": "iters",
    "warmup": "warmup", "channels": "channels", "routing": "routing", "mtu": "mtu_bytes",
    "results": "results_dir", "name": "name",
}


def parse_params(items: list[str]) -> dict:
    """``k=4 rate=10`` -> {"k": 4, "rate": 10}; values are YAML scalars."""
    import yaml

    params = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ConfigError(item, "expected key=value")
        try:
            params[key] = yaml.safe_load(value)
        except yaml.YAMLError:
            raise ConfigError(key, f"cannot parse value {value!r}") from None
    return params


def cmd_run(args) -> int:
    from testbed.experiments.allreduce.report import format_summary
    from testbed.experiments.allreduce.run import run_experiment
    from testbed.harness.scenario import config_from_dict, read_scenario

    data = read_scenario(args.scenario) if args.scenario else {}
    for flag, field in SCENARIO_FLAGS.items():
        if getattr(args, flag) is not None:
            data[field] = getattr(args, flag)
    if args.topology or args.param:
        topo = data.get("topology") or {"name": "fattree"}
        topo = {"name": topo} if isinstance(topo, str) else dict(topo)
        if args.topology and args.topology != topo.get("name"):
            topo = {"name": args.topology}
        topo.update(parse_params(args.param))
        data["topology"] = topo
    config = config_from_dict(data, args.scenario or "flags")
    summary = run_experiment(config, log=lambda m: print(f"[testbed] {m}", flush=True))
    print("\nSummary")
    print(format_summary(summary))
    return 0 if summary["workload"]["verified"] else 1


def cmd_topo(args) -> int:
    from testbed.model.topology import build
    from testbed.model.topology.describe import describe, format_description

    if args.draw is not None and "=" in args.draw:
        raise ConfigError("--draw", f"expected a PNG path, got {args.draw!r}; put --draw after "
                          "the parameters")
    fabric = build(args.name, **parse_params(args.param))
    info = describe(fabric)
    print(json.dumps(info, indent=1) if args.json else format_description(info))
    if args.draw is not None:
        from testbed.model.topology.describe import draw

        path = draw(fabric, args.draw or f"results/topo-{args.name}.png")
        print(f"drawing: {path}", file=sys.stderr if args.json else sys.stdout)
    return 0


def cmd_doctor(args) -> int:
    from testbed.capabilities import detect, format_report

    print(format_report(detect()))
    return 0


def cmd_clean(args) -> int:
    from testbed.apply.network import check_root
    from testbed.apply.state import Ledger, RunLock, clean

    check_root()
    with RunLock("clean"):
        ledger = Ledger.load()
        if ledger is None:
            print("nothing to clean: no interrupted run on record")
            return 0
        removed = clean(ledger)
        print(f"removed what run {ledger.run_id} left: {removed}")
    return 0


def cmd_bench(args) -> int:
    from testbed.capacity.bench import run_bench

    run_bench(args.output, tuple(args.k or (4, 8)), log=lambda m: print(f"[bench] {m}", flush=True))
    return 0


def given_fields(args, flags: dict[str, str]) -> dict:
    """The config fields whose flags were given ({flag: field}); the rest keep the config's
    defaults."""
    return {field: getattr(args, flag) for flag, field in flags.items()
            if getattr(args, flag) is not None}


INCAST_FLAGS = {  # flag -> testbed.experiments.incast.run.IncastConfig field; unset flags keep its default
    "response_bytes": "response_bytes", "rounds": "rounds", "warmup": "warmup_rounds",
    "gap_s": "gap_s", "rate_mbit": "rate_mbit", "mtu": "mtu_bytes",
    "buffer_bytes": "buffer_bytes", "dscp": "dscp", "pfc_reaction_time_s": "pfc_reaction_time_s",
    "round_timeout_s": "round_timeout_s", "receiver": "receiver", "results": "results_dir",
}


def cmd_incast(args) -> int:
    from testbed.experiments.incast.run import IncastConfig, parse_int_list, run_incast

    given = given_fields(args, INCAST_FLAGS)
    if args.sweep is not None:
        given["fanins"] = parse_int_list("--sweep", args.sweep)
    elif args.fanin is not None:
        given["fanins"] = (args.fanin,)
    if args.mode:
        given["modes"] = tuple(args.mode)
    result = run_incast(IncastConfig(**given), log=lambda m: print(f"[incast] {m}", flush=True))
    return 1 if any(m.error for m in result.measurements) else 0


def cmd_hedera(args) -> int:
    from testbed.experiments.hedera.run import HederaConfig, run_hedera

    config = HederaConfig(rate_mbit=args.rate_mbit, seconds=args.seconds, omit_s=args.omit,
                          seed=args.seed, results_dir=args.results,
                          patterns=tuple(args.pattern) if args.pattern else HederaConfig.patterns)
    run_hedera(config, log=lambda m: print(f"[hedera] {m}", flush=True))
    return 0


DCTCP_FLAGS = {  # flag -> testbed.experiments.dctcp.run.DctcpConfig field; unset flags keep its default
    "rate_mbit": "rate_mbit", "senders": "senders", "seconds": "seconds", "omit": "omit_s",
    "k_bytes": "k_bytes", "buffer_bytes": "buffer_bytes", "rtt_s": "rtt_s", "mtu": "mtu_bytes",
    "droptail_cc": "droptail_cc", "ecn_cc": "ecn_cc", "results": "results_dir",
}


def dctcp_config(args):
    """The DctcpConfig the flags ask for (not yet validated)."""
    from testbed.experiments.dctcp.run import DctcpConfig

    given = given_fields(args, DCTCP_FLAGS)
    if "senders" in given:
        given["senders"] = tuple(given["senders"])
    return DctcpConfig(**given)


def cmd_dctcp(args) -> int:
    from testbed.experiments.dctcp import run as dctcp_bench

    if args.replot is not None:
        for path in dctcp_bench.replot(args.replot):
            print(path)
        return 0
    dctcp_bench.run_dctcp(dctcp_config(args), log=lambda m: print(f"[dctcp] {m}", flush=True))
    return 0


PFC_DEMO_FLAGS = {  # flag -> testbed.experiments.pfc.run.PfcDemoConfig field
    "rate_mbit": "rate_mbit", "mtu": "mtu_bytes", "buffer_bytes": "buffer_bytes",
    "alone_s": "alone_s", "seconds": "contention_s", "omit": "omit_s", "receiver": "receiver",
    "victim_src": "victim_src", "victim_dst": "victim_dst",
    "pfc_reaction_time_s": "pfc_reaction_time_s", "results": "results_dir",
}


def cmd_pfc_demo(args) -> int:
    from testbed.experiments.pfc.run import PfcDemoConfig, run_pfc_demo

    given = given_fields(args, PFC_DEMO_FLAGS)
    if args.condition:
        given["conditions"] = tuple(args.condition)
    run_pfc_demo(PfcDemoConfig(**given), log=lambda m: print(f"[pfc-demo] {m}", flush=True))
    return 0


def cmd_dragonfly_routing(args) -> int:
    from testbed.experiments.dragonfly.run import run_dragonfly_compare
    from testbed.experiments.hedera.run import HederaConfig

    config = HederaConfig(rate_mbit=args.rate_mbit, seconds=args.seconds, omit_s=args.omit,
                          seed=args.seed, results_dir=args.results, spread=False)
    run_dragonfly_compare(config, log=lambda m: print(f"[dragonfly] {m}", flush=True))
    return 0


class OneLineErrors(argparse.ArgumentParser):
    """Usage errors as one line (``testbed: error: ...``, exit 2) like the testbed's own."""

    def error(self, message):
        self.exit(2, f"testbed: error: {message} (see `{self.prog} --help`)\n")


def add_flow_experiment_args(parser: argparse.ArgumentParser) -> None:
    """The options of the long-flow experiments (testbed.experiments.hedera.run.HederaConfig)."""
    parser.add_argument("--rate-mbit", type=float, default=10.0, help="link rate (10)")
    parser.add_argument("--seconds", type=int, default=10, help="measured seconds per pattern")
    parser.add_argument("--omit", type=int, default=2, help="TCP start-up seconds left out")
    parser.add_argument("--seed", type=int, default=1, help="seed of the random pattern")
    parser.add_argument("--results", default="results", help="results folder")


def build_parser() -> argparse.ArgumentParser:
    ap = OneLineErrors(prog="testbed", description="AI data-center fabric testbed")
    sub = ap.add_subparsers(dest="command", required=True, parser_class=OneLineErrors)

    run = sub.add_parser("run", help="run an experiment (a scenario file, flags, or both)")
    run.add_argument("scenario", nargs="?", help="scenario YAML (see scenarios/)")
    run.add_argument("--topology", help="topology family, e.g. fattree")
    run.add_argument("--param", action="append", default=[], metavar="KEY=VALUE",
                     help="topology parameter, e.g. --param k=4 (repeatable)")
    run.add_argument("--rate-mbit", type=float, help="link rate in Mbit/s")
    run.add_argument("--size-bytes", type=int, help="AllReduce size in bytes")
    run.add_argument("--iters", type=int, help="timed iterations")
    run.add_argument("--warmup", type=int, help="warm-up iterations")
    run.add_argument("--channels", type=int, help="parallel ring channels (connections)")
    run.add_argument("--routing", help="ecmp or single; minimal, valiant or ugal on a dragonfly")
    run.add_argument("--mtu", type=int, help="MTU in bytes")
    run.add_argument("--results", help="results folder (default results/)")
    run.add_argument("--name", help="run name (part of the run id)")
    run.set_defaults(func=cmd_run)

    topo = sub.add_parser("topo", help="describe a topology without building it")
    topo.add_argument("name", help="topology family, e.g. fattree")
    topo.add_argument("param", nargs="*", help="parameters, e.g. k=4")
    topo.add_argument("--json", action="store_true", help="print JSON")
    topo.add_argument("--draw", nargs="?", const="", metavar="PATH",
                      help="also draw it as a PNG (default path results/topo-<name>.png)")
    topo.set_defaults(func=cmd_topo)

    sub.add_parser("doctor", help="what this machine can do and which path each feature takes"
                   ).set_defaults(func=cmd_doctor)
    sub.add_parser("clean", help="remove what an interrupted run left behind"
                   ).set_defaults(func=cmd_clean)
    bench = sub.add_parser("bench", help="measure forwarding capacity and fabric bring-up")
    bench.add_argument("--output", default="results/bench.json", help="JSON output path")
    bench.add_argument("--k", type=int, action="append", choices=[4, 6, 8],
                       help="fat-tree sizes to bring up and down (default: 4 and 8)")
    bench.set_defaults(func=cmd_bench)

    incast = sub.add_parser("incast", help="N synchronised senders answering one receiver on "
                            "the k=4 fat-tree: drop-tail vs ECN vs PFC (drops, TCP timeouts, "
                            "query completion times)")
    fanin = incast.add_mutually_exclusive_group()
    fanin.add_argument("--fanin", type=int, help="senders per query, 1..15 (default 15)")
    fanin.add_argument("--sweep", metavar="N,N,...", help="fan-ins to measure in turn, "
                       "e.g. 1,3,7,15")
    incast.add_argument("--mode", action="append", choices=("droptail", "ecn", "pfc"),
                        help="queue mode (repeatable; default all three)")
    incast.add_argument("--response-bytes", type=int, help="bytes each sender answers per "
                        "query (default 65536)")
    incast.add_argument("--rounds", type=int, help="queries per fan-in (default 20)")
    incast.add_argument("--warmup", type=int, help="queries before the recorded ones "
                        "(default 1)")
    incast.add_argument("--gap-s", type=float, help="pause between queries (default 0.2)")
    incast.add_argument("--rate-mbit", type=float, help="link rate in Mbit/s (default 10)")
    incast.add_argument("--mtu", type=int, help="MTU in bytes (default 1500)")
    incast.add_argument("--buffer-bytes", type=int, help="every port's buffer in bytes "
                        "(default: 50 ms at the link rate)")
    incast.add_argument("--dscp", type=int, help="DSCP of the incast traffic (default 26, the "
                        "lossless class)")
    incast.add_argument("--pfc-reaction-time-s", type=float, help="pause reaction time sizing "
                        "the PFC headroom (default: the emulated pause path's, "
                        f"{DEFAULT_PFC_REACTION_TIME_S:g})")
    incast.add_argument("--round-timeout-s", type=float, help="a query's time limit "
                        "(default 60)")
    incast.add_argument("--receiver", help="the receiving host (default p0e0h0)")
    incast.add_argument("--results", help="results folder (default results)")
    incast.set_defaults(func=cmd_incast)

    hedera = sub.add_parser("hedera", help="ECMP vs single-path vs a non-blocking switch on the "
                            "k=4 fat-tree (Hedera's patterns), and ECMP's uplink spread")
    add_flow_experiment_args(hedera)
    hedera.add_argument("--pattern", action="append", metavar="NAME",
                        help="strideN or random (repeatable; default stride1/2/4/8 and random)")
    hedera.set_defaults(func=cmd_hedera)

    dfly = sub.add_parser("dragonfly-routing", help="minimal vs Valiant vs UGAL vs ECMP on a "
                          "dragonfly: the adversarial group shift and uniform traffic")
    add_flow_experiment_args(dfly)
    dfly.set_defaults(func=cmd_dragonfly_routing)

    dctcp = sub.add_parser("dctcp", help="DCTCP micro-benchmark: N senders into one switch "
                           "port, drop-tail vs ECN marking at K, queue sampled every 10 ms")
    add_dctcp_args(dctcp)
    dctcp.set_defaults(func=cmd_dctcp)

    demo = sub.add_parser("pfc-demo", help="PFC's costs on the k=4 fat-tree: head-of-line "
                          "blocking of a victim flow, congestion spreading, and ECN cutting "
                          "the pause time (lossy vs pfc vs pfc+ecn)")
    add_pfc_demo_args(demo)
    demo.set_defaults(func=cmd_pfc_demo)
    return ap


def add_pfc_demo_args(parser: argparse.ArgumentParser) -> None:
    """The options of ``testbed pfc-demo`` (testbed.experiments.pfc.run.PfcDemoConfig)."""
    parser.add_argument("--condition", action="append", choices=("lossy", "pfc", "pfc+ecn"),
                        help="run to make (repeatable; default all three)")
    parser.add_argument("--rate-mbit", type=float, help="link rate in Mbit/s (default 20)")
    parser.add_argument("--mtu", type=int, help="MTU in bytes (default 1500)")
    parser.add_argument("--buffer-bytes", type=int, help="every port's buffer per class in "
                        "bytes (default 600000)")
    parser.add_argument("--seconds", type=int, help="seconds the victim runs beside the incast "
                        "(default 10)")
    parser.add_argument("--alone-s", type=int, help="seconds the victim runs alone first "
                        "(default 5)")
    parser.add_argument("--omit", type=int, help="TCP start-up seconds left out (default 1)")
    parser.add_argument("--receiver", help="the incast's receiver (default p0e0h0)")
    parser.add_argument("--victim-src", help="the victim flow's sender (default p1e0h1)")
    parser.add_argument("--victim-dst", help="the victim flow's receiver (default p0e0h1, "
                        "beside the receiver)")
    parser.add_argument("--pfc-reaction-time-s", type=float, help="pause reaction time sizing "
                        f"the PFC headroom (default {DEFAULT_PFC_REACTION_TIME_S:g})")
    parser.add_argument("--results", help="results folder (default results)")


def add_dctcp_args(parser: argparse.ArgumentParser) -> None:
    """The options of ``testbed dctcp`` (testbed.experiments.dctcp.run.DctcpConfig); an option left
    out keeps the config's default, named in its help."""
    parser.add_argument("--rate-mbit", type=float, help="link rate in Mbit/s (default 20)")
    parser.add_argument("--senders", type=int, nargs="+", metavar="N",
                        help="sender counts to run, e.g. --senders 2 8 (default 2 8)")
    parser.add_argument("--seconds", type=int, help="measured seconds per configuration "
                        "(default 30)")
    parser.add_argument("--omit", type=int, help="TCP start-up seconds left out (default 5)")
    parser.add_argument("--k-bytes", type=int, help="marking threshold K in bytes (default: "
                        "DCTCP's anchors scaled to the link rate)")
    parser.add_argument("--buffer-bytes", type=int, help="the port's buffer in bytes "
                        "(default: 50 ms at the link rate)")
    parser.add_argument("--rtt-s", type=float, help="path RTT in seconds; a scaled K then "
                        "also satisfies K > C*RTT/7")
    parser.add_argument("--mtu", type=int, help="MTU in bytes (default 1500)")
    parser.add_argument("--droptail-cc", help="drop-tail hosts' TCP: cubic or reno "
                        "(default cubic)")
    parser.add_argument("--ecn-cc", help="ECN hosts' TCP: auto, dctcp, cubic or reno "
                        "(default auto: dctcp where the kernel has it, else cubic)")
    parser.add_argument("--results", help="results folder (default results)")
    parser.add_argument("--replot", metavar="RUN_DIR", help="only redraw the figures of a "
                        "finished run from its files (no root)")


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except TestbedError as exc:
        print(f"testbed: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("testbed: interrupted; everything the run created has been removed", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
