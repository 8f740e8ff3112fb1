"""The sweep's figure: busbw against size with the link rate drawn, and time against size,
each measurement beside the cost model's prediction."""
from __future__ import annotations

from pathlib import Path

from testbed.harness.plots import distinct_colours, legend_outside, pyplot, save

GBYTE_TO_MBIT = 8e3


def plot_sweeps(sweeps: dict[str, dict], rate_mbit: float, title: str, path: Path) -> Path:
    """Two panels over size (log scale): busbw in Mbit/s (measured: solid with markers;
    predicted: dashed) with the link rate, and time per iteration against the prediction."""
    plt = pyplot()
    fig, (bw, tm) = plt.subplots(2, 1, figsize=(10, 8), sharex=True)
    for (name, s), colour in zip(sweeps.items(), distinct_colours(len(sweeps))):
        sizes = [r["size_bytes"] for r in s["rows"]]
        bw.plot(sizes, [r["busbw_mbit_s"] for r in s["rows"]], "o-", color=colour, ms=3,
                label=f"{name} measured")
        bw.plot(sizes, [r["predicted_busbw_gbyte_s"] * GBYTE_TO_MBIT for r in s["rows"]], "--",
                color=colour, label=f"{name} predicted")
        tm.plot(sizes, [r["time_us"] / 1e6 for r in s["rows"]], "o-", color=colour, ms=3,
                label=f"{name} measured")
        tm.plot(sizes, [r["predicted_us"] / 1e6 for r in s["rows"]], "--", color=colour,
                label=f"{name} predicted")
    bw.axhline(rate_mbit, color="black", lw=1, ls=":", label="link rate")
    bw.set_xscale("log", base=2)
    bw.set_ylabel("busbw (Mbit/s)")
    bw.set_ylim(bottom=0)
    bw.set_title(f"{title}\nnccl-tests busbw by size: measured (solid) and the alpha-beta "
                 "prediction from the fabric (dashed)", fontsize=9)
    legend_outside(bw, fontsize=7)
    tm.set_xscale("log", base=2)
    tm.set_yscale("log")
    tm.set_xlabel("size (bytes)")
    tm.set_ylabel("time per iteration (s)")
    legend_outside(tm, fontsize=7)
    return save(fig, path)
