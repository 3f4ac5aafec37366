"""timelines: what changes over the trace's time, per device, from the trace's first event.

    memory  per device (CPU is -1): the allocator's Total Allocated and Total Reserved after each
            `[memory]` event (`memory_series`: downsampled, every peak kept), the peak of
            Total Allocated marked with its value, its time and the CPU op running there
            (`memory`), each peak in the legend
    queue   per device, a step line per stream: activities launched and not yet started
            (`queue_series`, the depths of `queue`), each stream's max and time-weighted mean in
            the legend, the `--queue-full` limit drawn when the depth comes near it

A figure with nothing to show says why, in the figure.
"""

from __future__ import annotations

import polars as pl

from pipeline.analyses.flat import Flat, as_flat
from pipeline.analyses.memory import memory, memory_series
from pipeline.analyses.queue import QUEUE_FULL, queue, queue_series
from pipeline.render.plots.figure import (
    DPI,
    NOTE_BOX,
    OTHER_COLOUR,
    bytes_axis,
    bytes_text,
    device_labels,
    duration_text,
    explain,
    pyplot,
    span,
    time_axis,
)

ALLOCATED = "#1f77b4"
RESERVED = "#ff7f0e"
PEAK = "#b22222"
STREAM_COLOURS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#17becf")
FULL_SHARE = 0.25  # the --queue-full line is drawn once a stream's max reaches this share of it
WIDTH, PANEL_HEIGHT = 12.0, 3.4  # inches


def device_names(f: Flat, devices: list[int]) -> dict[int, str]:
    """device id -> its title ("device 0: NVIDIA H100 80GB HBM3", "CPU (device -1)"): the name
    of its GPU activity's device, else of the trace's device properties."""
    listed = dict(f.scan("devices").select("device", "name").drop_nulls().collect().iter_rows())
    named = device_labels(f) if f.has_gpu else {}
    listed = {d: f"device {d}: {name}" for d, name in listed.items()}
    return {d: "CPU (device -1)" if d < 0 else named.get(d) or listed.get(d, f"device {d}") for d in devices}


def time_ticks(axes: list, unit: str):
    """Time ticks under every panel (their values whole, not as an offset), the unit under the last."""
    for ax in axes:
        ax.tick_params(labelbottom=True)
        ax.ticklabel_format(axis="x", useOffset=False, style="plain")
    axes[-1].set_xlabel(f"time from the trace's first event ({unit})")


def panels(plt, stem: str, title: str, n: int):
    """A figure of n panels one above the other (at least one), sharing their time axis."""
    fig, axes = plt.subplots(
        max(n, 1), 1, figsize=(WIDTH, 1.2 + PANEL_HEIGHT * max(n, 1)), squeeze=False, sharex=True, dpi=DPI
    )
    fig.set_layout_engine("constrained")
    fig.suptitle(f"{stem}: {title}", fontweight="bold")
    return fig, list(axes.flat)


# ------------------------------------------------------------------ memory
def memory_figure(flat, peaks: pl.DataFrame | None = None, max_points: int = 4000):
    """The memory timeline of one trace: a panel per device (`memory_panel`), or why there is none.
    `peaks`: memory()'s table when already computed."""
    plt = pyplot()
    f = as_flat(flat)
    series = memory_series(f, max_points)
    peaks = memory(f) if peaks is None else peaks
    devices = sorted(series["device"].unique().to_list(), key=lambda d: (d < 0, d))  # GPUs first, CPU last
    fig, axes = panels(plt, f.stem, "memory over time", len(devices))
    if not devices:
        why = (
            "No [memory] event in the analysed window: no memory to draw."
            if f.has_memory
            else "No [memory] events in this trace: no memory to draw. Record them with "
            "torch.profiler.profile(..., profile_memory=True)."
        )
        explain(axes[0], why)
        return fig
    names = device_names(f, devices)
    scale, unit = time_axis(span(series["t_us"])[1])
    fit_time(axes[0], series["t_us"] / scale)  # shared by the panels
    for ax, dev in zip(axes, devices, strict=True):
        peak = peaks.filter(pl.col("device") == dev)
        memory_panel(
            ax, series.filter(pl.col("device") == dev), peak.row(0, named=True) if peak.height else None, scale
        )
        ax.set_title(names[dev], loc="left")
    time_ticks(axes, unit)
    return fig


def memory_panel(ax, s: pl.DataFrame, peak: dict | None, per_t: float):
    """One device: Total Reserved and Total Allocated (filled) as steps, their peaks in the legend,
    the allocated peak marked; time in units of `per_t` µs."""
    largest = span(pl.concat([s["allocated_bytes"], s["reserved_bytes"]]).fill_null(0))[1]
    per, unit = bytes_axis(largest)
    lines = (("reserved_bytes", "Total Reserved", RESERVED), ("allocated_bytes", "Total Allocated", ALLOCATED))
    for column, name, colour in lines:
        v = s.select("t_us", column).drop_nulls()
        if not v.height:
            continue
        top = span(v[column])[1]
        if not top:  # the CPU's: no caching allocator, nothing reserved
            ax.plot([], [], color=colour, lw=1.1, label=f"{name}: 0 B throughout (not drawn)")
            continue
        t, y = v["t_us"] / per_t, v[column] / per
        label = f"{name} (peak {bytes_text(top)})"
        ax.step(t, y, where="post", color=colour, lw=1.1, label=label, gid=column)
        if column == "allocated_bytes":
            ax.fill_between(t, y, step="post", color=colour, alpha=0.15, lw=0)
    ax.set_ylim(0, max(largest / per * 1.25, 1.0))
    ax.set_ylabel(f"bytes ({unit})")
    ax.grid(True, lw=0.4, alpha=0.4)
    outside_legend(ax)
    if peak and peak.get("peak_allocated_bytes") is not None:
        mark_peak(ax, peak, per, per_t)


def fit_time(ax, t: pl.Series):
    """The (shared) time axis from the first point to the last, a little wider (a mark at the edge
    stays whole)."""
    lo, hi = span(t)
    pad = 0.01 * (hi - lo) if hi > lo else max(abs(lo) * 0.05, 1.0)
    ax.set_xlim(lo - pad, hi + pad)


def mark_peak(ax, peak: dict, per: float, per_t: float):
    """A dot on the allocated peak and, on the side of it with more room, its value, time and op."""
    x, y = peak["peak_at_us"] / per_t, peak["peak_allocated_bytes"] / per
    ax.plot([x], [y], "o", ms=6, mfc="white", mec=PEAK, mew=1.6, zorder=5)
    lo, hi = ax.get_xlim()
    right = (x - lo) < 0.5 * (hi - lo)
    op = f"in {peak['peak_op']}" if peak.get("peak_op") else "outside every CPU op"
    ax.annotate(
        f"peak {bytes_text(peak['peak_allocated_bytes'])} at {duration_text(peak['peak_at_us'])}\n{op}",
        xy=(x, y),
        xytext=(18 if right else -18, 10),
        textcoords="offset points",
        ha="left" if right else "right",
        va="bottom",
        fontsize=8,
        color=PEAK,
        bbox=NOTE_BOX,
        arrowprops={"arrowstyle": "-", "color": PEAK, "lw": 0.8},
        zorder=6,
        gid="memory-peak",
    )


# ------------------------------------------------------------------ launch queue
def queue_figure(flat, stats: pl.DataFrame | None = None, queue_full: int = QUEUE_FULL, max_points: int = 4000):
    """The launch queue of one trace: a panel per device (`queue_panel`), or why there is none.
    `stats`: queue()'s table when already computed (its max and mean are in the legends)."""
    plt = pyplot()
    f = as_flat(flat)
    series = queue_series(f, max_points) if f.has_gpu else pl.DataFrame(schema={"device": pl.Int64})
    stats = queue(f, queue_full) if stats is None and f.has_gpu else stats
    devices = series["device"].unique().sort().to_list()
    fig, axes = panels(plt, f.stem, "launch queue depth per stream", len(devices))
    if not devices:
        why = (
            "No GPU activity whose launch call is in the analysed window: nothing was queued."
            if f.has_gpu
            else f"No launch queue: {f.lost_activity}."
            if f.lost_activity
            else "No GPU activity in this trace (CPU only): no launch queue. Profile with "
            "ProfilerActivity.CUDA to record kernels and their launches."
        )
        explain(axes[0], why)
        return fig
    assert stats is not None
    names = device_names(f, devices)
    scale, unit = time_axis(span(series["t_us"])[1])
    fit_time(axes[0], series["t_us"] / scale)  # shared by the panels
    for ax, dev in zip(axes, devices, strict=True):
        queue_panel(
            ax, series.filter(pl.col("device") == dev), stats.filter(pl.col("device") == dev), queue_full, scale
        )
        ax.set_title(names[dev], loc="left")
    time_ticks(axes, unit)
    return fig


def queue_panel(ax, s: pl.DataFrame, stats: pl.DataFrame, full: int, per_t: float):
    """One device: a step line per stream (the deepest first, at most len(STREAM_COLOURS) named,
    the rest grey), the --queue-full limit when some stream comes near it (else the legend says
    why it is not drawn); time in units of `per_t` µs."""
    order = stats.sort("max", "stream", descending=[True, False])
    named = order.head(len(STREAM_COLOURS))
    for i, r in enumerate(named.iter_rows(named=True)):
        v = s.filter(pl.col("stream") == r["stream"])
        label = f"stream {r['stream']}: max {r['max']}, mean {r['mean']:.3g}"
        ax.step(v["t_us"] / per_t, v["depth"], where="post", color=STREAM_COLOURS[i], lw=1.0, label=label, zorder=3 + i)
    rest = order.slice(named.height)
    for stream in rest["stream"]:
        v = s.filter(pl.col("stream") == stream)
        ax.step(v["t_us"] / per_t, v["depth"], where="post", color=OTHER_COLOUR, lw=0.6, zorder=2)
    if rest.height:
        ax.plot([], [], color=OTHER_COLOUR, lw=0.6, label=f"{rest.height} more streams: max {span(rest['max'])[1]:.0f}")
    deepest = int(span(order["max"])[1])
    title = "per stream: max and time-weighted mean depth"
    if deepest >= FULL_SHARE * full:
        ax.axhline(full, color=PEAK, lw=1.0, ls="--", label=f"--queue-full {full}: the launching thread blocks")
    else:
        title += f"\n--queue-full {full} not drawn: far above the deepest ({deepest})"
    ax.set_ylim(0, max(deepest, full if deepest >= FULL_SHARE * full else 0, 1) * 1.2)
    ax.yaxis.get_major_locator().set_params(integer=True)  # a depth is a count
    ax.set_ylabel("activities launched, not started")
    ax.grid(True, lw=0.4, alpha=0.4)
    outside_legend(ax, title)


def outside_legend(ax, title: str | None = None):
    """The panel's legend right of it, where it hides no data."""
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), title=title, frameon=False, alignment="left")
