"""The Gantt chart of a pipeline run: one row per stage, one bar per forward (light) or
backward (dark) operation, labelled with its micro-batch; idle gaps are the bubble."""
from __future__ import annotations

FORWARD_COLOUR, BACKWARD_COLOUR = "#9ecae1", "#3182bd"
ROW_HEIGHT = 0.8


def plot_gantt(records, path, title: str = "") -> None:
    """Draw ``records`` (OpRecord: stage, kind, micro_batch, start_s, end_s) to a PNG at
    ``path``; times are shown from the first start."""
    if not records:
        raise ValueError("no operations to draw")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    t0 = min(r.start_s for r in records)
    stages = max(r.stage for r in records) + 1
    fig, ax = plt.subplots(figsize=(10, 0.6 * stages + 1.5))
    for r in records:
        colour = FORWARD_COLOUR if r.kind == "F" else BACKWARD_COLOUR
        ax.broken_barh([(r.start_s - t0, r.end_s - r.start_s)], (r.stage - ROW_HEIGHT / 2, ROW_HEIGHT),
                       facecolors=colour, edgecolors="black", linewidth=0.5)
        ax.text(r.start_s - t0 + (r.end_s - r.start_s) / 2, r.stage, str(r.micro_batch),
                ha="center", va="center", fontsize=7,
                color="black" if r.kind == "F" else "white")
    ax.set_yticks(range(stages))
    ax.set_yticklabels([f"stage {s}" for s in range(stages)])
    ax.invert_yaxis()
    ax.set_xlabel("time (s)")
    ax.set_title(title)
    ax.legend(handles=[plt.Rectangle((0, 0), 1, 1, color=FORWARD_COLOUR, label="forward"),
                       plt.Rectangle((0, 0), 1, 1, color=BACKWARD_COLOUR, label="backward")],
              loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0, fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100, bbox_inches="tight")
    plt.close(fig)
