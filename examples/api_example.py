"""The testbed's Python API in one script (docs/api.md): the k=4 fat-tree of the bundled
scenario ``fattree-allreduce`` brought up, its hosts used as Mininet hosts, a short ring
AllReduce measured on it, a link cut while traffic finds its way around it, the fabric's
metrics read, and everything taken down at the end, whatever happens in between.

    sudo .venv/bin/python examples/api_example.py [--results DIR]

It prints what it sees, and exits 0 only when every step did what it should:
tests/integration/test_interactive.py runs it.
"""
from __future__ import annotations

import argparse
import sys

import testbed.api

SMALL_ALLREDUCE = {"size_bytes": 262144, "iters": 1, "warmup": 0}  # a few seconds at 6 Mbit/s
IPERF_S = 3
MIN_IPERF_FRACTION = 0.5  # of the link rate: one TCP flow on an idle fabric gets far more
CUT = ("p0e0", "p0a0")    # an edge switch's first uplink: its second one carries on


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--results", default="results", help="results folder")
    args = parser.parse_args(argv)
    problems: list[str] = []

    def expect(ok: bool, what: str) -> None:
        print(f"  {'ok' if ok else 'FAILED'}: {what}")
        if not ok:
            problems.append(what)

    with testbed.api.up("fattree-allreduce", results_dir=args.results,
                        log=lambda m: print(f"[testbed] {m}")) as fab:
        # Mininet's idioms, on the fabric's own hosts
        h1, h2 = fab.get("p0e0h0", "p3e1h1")
        print(f"{h1.name}: IP {h1.IP()}, MAC {h1.MAC()}, default interface "
              f"{h1.defaultIntf()}, interfaces {h1.intfNames()}")
        expect(h1.IP() == fab.description.nodes[h1.name].ip, "IP() is the host's address")
        reply = h1.cmd("ping -c1 -W2", h2.IP())
        expect(" 1 received" in reply, f"{h1.name} pings {h2.name} ({h2.IP()})")
        expect(fab.pingAll() == 0, "Mininet's pingAll: every host reaches every other")

        # an experiment's measurement on this fabric
        outcome = fab.run("allreduce", params=SMALL_ALLREDUCE)
        for row in outcome.summary.get("rows", []):
            print(f"  {row['what']}: {row['text']}")
        verified = next((c for c in outcome.verdict.checks
                         if c.name == "data verified on every rank"), None)
        expect(outcome.status == "complete" and verified is not None and bool(verified.passed),
               f"ring AllReduce complete with verified data ({outcome.workdir})")

        # a cut cable: traffic goes around it, and the metrics show it
        fab.link_down(*CUT)
        rerouted = fab.exec(h1, ["ping", "-c5", "-i0.5", "-W2", h2.IP()], timeout_s=30)
        expect(rerouted.returncode == 0, f"{h1.name} still reaches {h2.name} with "
                                         f"{'-'.join(CUT)} cut")
        metrics = fab.metrics(interval_s=1.0)
        busiest = max(metrics["link_utilisation"].items(), key=lambda kv: kv[1])
        print(f"  links down: {metrics['links_down']}; queue drops so far: "
              f"{metrics['queue_drops']}; busiest link {busiest[0]} at {busiest[1]:.0%}; "
              f"CPU {metrics['cpu_busy_fraction']:.0%} busy")
        expect(metrics["links_down"] == ["-".join(CUT)], "the metrics name the cut link")
        fab.link_up(*CUT)

        # a workload of your own: one iperf3 flow
        rate_mbit = fab.iperf(h1, h2, seconds=IPERF_S)
        link_rate = fab.resolved.experiment.rate_mbit
        print(f"  iperf3 {h1.name} -> {h2.name}: {rate_mbit:.2f} Mbit/s "
              f"(links at {link_rate:g} Mbit/s)")
        expect(rate_mbit >= MIN_IPERF_FRACTION * link_rate,
               f"iperf3 reaches at least {MIN_IPERF_FRACTION:.0%} of the link rate")
        groups = fab.dump_groups("p0e0")
        expect(any(g.type == "select" for g in groups), "p0e0 holds ECMP select groups")
    print("the fabric is down" + (f"; {len(problems)} steps FAILED" if problems else ""))
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
