"""Redraw a finished dctcp run's figures from its folder (summary.json and each setup's
queue.json), without root and without touching the machine:

    python -m testbed.experiments.dctcp.replot RUN_DIR

The figures go to RUN_DIR/plots/, as the run drew them; ``testbed report RUN_DIR`` prints
the run's verdict.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from testbed.errors import EXIT_USAGE, ConfigError, TestbedError
from testbed.experiments.dctcp.experiment import Dctcp
from testbed.harness.report import load_summary
from testbed.harness.run import plot_title
from testbed.harness.scenario import Scenario



def relocated(summary: dict, run_dir: Path) -> dict[str, dict]:
    """The run's results with each setup's folder found under ``run_dir``, wherever the run
    folder has moved since (the run recorded them under its own results path)."""
    base = Path(summary["results_dir"])
    results = {}
    for name, r in summary["results"].items():
        try:
            folder = run_dir / Path(r["dir"]).relative_to(base)
        except ValueError:
            raise ConfigError(str(run_dir), f"setup {name}'s folder {r['dir']} is not inside "
                              f"the run's folder {base}") from None
        results[name] = {**r, "dir": str(folder)}
    return results


def replot(run_dir: str | Path) -> list[Path]:
    """The run's figures drawn again by the experiment's own ``plots`` into RUN_DIR/plots."""
    run_dir = Path(run_dir)
    summary = load_summary(run_dir)
    if summary.get("experiment") != Dctcp.name:
        raise ConfigError(str(run_dir), f"not a {Dctcp.name} run (its experiment is "
                          f"{summary.get('experiment')!r})")
    experiment = Dctcp(Scenario.model_validate(summary["scenario"]),
                       Dctcp.Params.model_validate(summary["params"]), platform=None)
    folder = run_dir / "plots"
    folder.mkdir(exist_ok=True)
    return experiment.plots(relocated(summary, run_dir), folder, plot_title(summary))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m testbed.experiments.dctcp.replot",
                                     description="redraw a finished dctcp run's figures "
                                                 "(no root)")
    parser.add_argument("run_dir", metavar="RUN_DIR")
    args = parser.parse_args(argv)
    try:
        paths = replot(args.run_dir)
    except (TestbedError, OSError) as err:
        print(f"testbed: error: {err}", file=sys.stderr)
        return EXIT_USAGE
    for path in paths:
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
