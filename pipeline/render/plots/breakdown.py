"""breakdown: where the time goes: time by kernel category (a bar per category on one device, a
stacked bar per device on several) and the CPU ops with the most self device time (self CPU time
in a trace without device time)."""

from __future__ import annotations

import polars as pl

from pipeline.analyses.flat import as_flat
from pipeline.render.plots.figure import (
    DPI,
    LABEL_CHARS,
    category_colours,
    device_labels,
    duration_text,
    explain,
    ink_on,
    pct_text,
    pyplot,
    span,
    time_axis,
)
from pipeline.render.tables import shorten

TOP_OPS = 15  # bars in the top-ops panel


def breakdown_figure(flat, categories: pl.DataFrame, ops: pl.DataFrame):
    """Time by kernel category (left) and the CPU ops with the most self time (right)."""
    plt = pyplot()
    f = as_flat(flat)
    devices = categories["device"].unique().sort().to_list()
    bars = max(categories["category"].n_unique() if len(devices) == 1 else len(devices), top_rows(ops)[1].height)
    fig, (left, right) = plt.subplots(
        1, 2, figsize=(15, 1.8 + 0.32 * max(bars, 4)), layout="constrained", dpi=DPI, width_ratios=[1, 1.15]
    )
    fig.suptitle(f"{f.stem}: where the time goes", fontweight="bold")
    labels = device_labels(f)
    if not categories.height:
        explain(left, "No GPU kernel and no CPU op in the analysed window: no time to break down.")
    elif len(devices) == 1:
        category_bars(left, categories, labels.get(devices[0], f"device {devices[0]}"), on_gpu=f.has_gpu)
    else:
        stacked_categories(left, categories, labels)
    top_ops(right, *top_rows(ops))
    return fig


def category_bars(ax, categories: pl.DataFrame, device: str, on_gpu: bool = True):
    """One device: a bar per category, its share and time written at its end."""
    rows = categories.sort("pct", descending=True)
    bars = ax.barh(rows["category"], rows["pct"], height=0.7, color=list(category_colours(rows["category"]).values()))
    texts = [f"{pct_text(p, 1)}  ({duration_text(t)})" for p, t in rows.select("pct", "dur_us").iter_rows()]
    ax.bar_label(bars, texts, padding=3, fontsize=8)
    bar_slots(ax, rows.height)
    percent_axis(ax, span(rows["pct"])[1])
    ax.set_xlabel("% of the device's time" if on_gpu else "% of the CPU ops' self time")
    ax.set_title(f"time by {'kernel' if on_gpu else 'CPU op'} category\n{device}", loc="left")


def bar_slots(ax, n: int, least: int = 4):
    """The first bar at the top, and room for at least `least` bars (a lone bar stays a bar)."""
    ax.set_ylim(max(n, least) - 0.5, -0.5)


def percent_axis(ax, largest: float):
    """An x axis of % with room for the bars' labels, its ticks at most 100."""
    ax.set_xlim(0, max(largest * 1.35, 10))
    ax.set_xticks([t for t in ax.get_xticks() if 0 <= t <= 100])


def stacked_categories(ax, categories: pl.DataFrame, labels: dict[int, str]):
    """Several devices: a bar each, stacked by category (largest overall first), wide parts named."""
    order = categories.group_by("category").agg(pl.col("dur_us").sum()).sort("dur_us", descending=True)["category"]
    wide = categories.pivot(on="category", index="device", values="pct").fill_null(0).sort("device")
    names = [shorten(labels.get(d, f"device {d}"), 36) for d in wide["device"]]
    colours = category_colours(order)
    left = [0.0] * wide.height
    for cat in order:
        bars = ax.barh(
            names, wide[cat], left=left, height=0.7, color=colours[cat], label=cat, edgecolor="white", linewidth=0.5
        )
        names_on = [f"{cat}\n{v:.0f}%" if v >= 9 else "" for v in wide[cat]]
        ax.bar_label(bars, names_on, label_type="center", fontsize=6.5, color=ink_on(colours[cat]))
        left = [a + b for a, b in zip(left, wide[cat], strict=True)]
    ax.invert_yaxis()
    ax.set_xlim(0, 100)
    ax.set_xlabel("% of each device's time")
    ax.set_title("time by kernel category, per device", loc="left")
    ax.legend(title="category", loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)


def top_rows(ops: pl.DataFrame, n: int = TOP_OPS) -> tuple[str, pl.DataFrame]:
    """(metric, rows): the n CPU ops with the most self device time (self CPU time in a trace
    without device time), those with none left out."""
    on_device = ops.height > 0 and ops["self_device_us"].sum() > 0
    metric = "self_device_us" if on_device else "self_cpu_us"
    return metric, ops.filter(pl.col(metric) > 0).sort(metric, descending=True).head(n) if ops.height else ops


def top_ops(ax, metric: str, top: pl.DataFrame):
    """A bar per op of `top_rows`, its time written at its end."""
    on_device = metric == "self_device_us"
    if not top.height:
        explain(
            ax,
            "No CPU op (cpu_op event) with time in the analysed window: nothing to rank. "
            "Profile with ProfilerActivity.CPU to record them.",
        )
        return
    largest = span(top[metric])[1]
    scale, unit = time_axis(largest)
    bars = ax.barh([shorten(x, LABEL_CHARS) for x in top["name"]], top[metric] / scale, height=0.7, color="#4c72b0")
    ax.bar_label(bars, [duration_text(v) for v in top[metric]], padding=3, fontsize=7.5)
    bar_slots(ax, top.height)
    ax.tick_params(axis="y", labelsize=7.5)
    ax.set_xlim(0, largest / scale * 1.15)
    if on_device:
        ax.set_xlabel(f"self device time ({unit}): the kernels an op launched itself, not its children's")
    else:
        ax.set_xlabel(f"self CPU time ({unit}): time in the op outside its child ops")
    ax.set_title(f"top {top.height} CPU ops by self {'device' if on_device else 'CPU'} time", loc="left")
