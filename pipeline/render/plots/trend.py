"""trend: a metric over runs in time order (`tracepipe trend --plot DIR`): one line per name, each
change point marked where it starts with the change it made.

    trend_<level>   value per rank and step of each name, runs left to right in time order
"""

from __future__ import annotations

import polars as pl

from pipeline.render.plots.figure import DPI, LABEL_CHARS, duration_text, explain, pyplot, time_axis

MAX_TICKS = 30  # run labels before they are thinned


def trend_figure(rows: pl.DataFrame, changes: dict, level: str):
    """rows: (order, label, name, value_us) of each name and run; changes: name -> change points
    (index, delta_pct)."""
    from pipeline.render.tables import shorten

    plt = pyplot()
    fig, ax = plt.subplots(figsize=(9, 4.8), dpi=DPI)
    if not rows.height:
        explain(ax, f"No {level} names to follow: the dataset's runs have none.")
        return fig
    largest = float(rows["value_us"].cast(pl.Float64).fill_null(0.0).max() or 0.0)  # type: ignore[arg-type]
    unit_us, unit = time_axis(largest)
    runs = rows.select("order", "label").unique("order").sort("order")
    for i, ((name,), series) in enumerate(rows.sort("order").group_by("name", maintain_order=True)):
        x, y = series["order"].to_list(), [v / unit_us for v in series["value_us"].to_list()]
        (line,) = ax.plot(x, y, marker="o", markersize=3, linewidth=1.2, label=shorten(str(name), LABEL_CHARS))
        for cp in changes.get(name, []):
            ax.axvline(cp.index - 0.5, color=line.get_color(), linestyle="--", linewidth=0.8, alpha=0.7)
            ax.annotate(
                f"{cp.delta_pct:+.0f}%",
                (cp.index, y[cp.index]),
                textcoords="offset points",
                xytext=(4, 6 if i % 2 == 0 else -12),
                fontsize=7,
                color=line.get_color(),
            )
    step = max(1, runs.height // MAX_TICKS + (runs.height % MAX_TICKS > 0))
    shown = runs.filter(pl.col("order") % step == 0)
    ax.set_xticks(
        shown["order"].to_list(), [shorten(str(s), 20) for s in shown["label"].to_list()], rotation=45, ha="right"
    )
    ax.set_ylabel(f"time per rank and step ({unit})")
    ax.set_xlabel("run (in time order)")
    found = sum(len(v) for v in changes.values())
    most = duration_text(largest)
    marks = f"{found} change point{'s' if found != 1 else ''} (dashed)"
    ax.set_title(f"{level} time over {runs.height} runs: {marks}, largest {most}")
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)
    ax.set_ylim(bottom=0)
    return fig
