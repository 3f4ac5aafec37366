"""figure: what every figure of `pipeline.render.plots` (and `pipeline.runs.plots`) shares.

matplotlib is optional (`pip install -e '.[plot]'`): it is imported only inside functions, with
the non-interactive Agg backend (`pyplot`). A figure is built in the house style (`STYLE`) and
written as PNG and SVG (its text kept as text), each to a temporary name and renamed (`written`).
Here too: units as text and on axes, colours (one per kernel category), the box that says why a
figure has nothing to show (`explain`), and label stacking (`spread`, `clusters`).
"""

from __future__ import annotations

import textwrap
from collections.abc import Callable
from pathlib import Path

import polars as pl

from pipeline.analyses.flat import Flat
from pipeline.errors import UsageError

IMAGE_FORMATS = ("png", "svg")  # every figure is written in each
DPI = 120
STYLE = {
    "svg.fonttype": "none",  # text stays text in the SVG: searchable, selectable, small
    "svg.hashsalt": "tracepipe",  # the same figure gives the same SVG
    "font.size": 9,
    "axes.titlesize": 10,
    "figure.titlesize": 12,
    "legend.fontsize": 8,
    "legend.title_fontsize": 8,
    "axes.spines.top": False,
    "axes.spines.right": False,
}
LABEL_CHARS = 40  # a name is shortened in the middle to this many characters
LABEL_SIZE = 7  # pt
NOTE_BOX = {"boxstyle": "round,pad=0.4", "fc": "white", "ec": "0.8", "alpha": 0.9}
EXPLAIN_BOX = {"boxstyle": "round,pad=0.8", "fc": "#fff8e1", "ec": "#e0b040"}
OTHER_COLOUR = "#8c8c8c"
CATEGORY_COLOURS = {  # one colour per kernel category, the same in every figure; the most common strongest
    "gemm": "#1f77b4",
    "attention": "#ff7f0e",
    "elementwise": "#2ca02c",
    "reduction": "#d62728",
    "normalization": "#9467bd",
    "communication": "#8c564b",
    "memcpy": "#e377c2",
    "memset": "#f7b6d2",
    "conv": "#17becf",
    "embedding": "#bcbd22",
    "triton_pointwise": "#98df8a",
    "triton_reduction": "#ff9896",
    "triton_persistent_reduction": "#c5b0d5",
    "triton_other": "#aec7e8",
    "inductor_cpp": "#ffbb78",
    "pooling": "#dbdb8d",
    "sort": "#9edae5",
    "other": OTHER_COLOUR,
}


# ------------------------------------------------------------------ matplotlib and files
def pyplot():
    try:
        import matplotlib
    except ImportError:
        raise UsageError("--plot needs matplotlib: pip install matplotlib (or -e '.[plot]' in a clone)") from None
    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    return plt


def save_figure(fig, out_dir: Path, stem: str) -> list[Path]:
    """`fig` as out_dir/stem.png and .svg, each written to a temporary name and renamed."""
    from pipeline.store import atomic_file

    paths = []
    for ext in IMAGE_FORMATS:
        final = Path(out_dir) / f"{stem}.{ext}"
        with atomic_file(final) as tmp:
            metadata = {"Date": None} if ext == "svg" else None  # the same figure, the same file
            fig.savefig(tmp, format=ext, dpi=DPI, bbox_inches="tight", metadata=metadata)
        paths.append(final)
    return paths


def written(build: Callable[[], object], out_dir: Path, stem: str) -> list[Path]:
    """Build a figure in the house style, write it (`save_figure`) and close it."""
    plt = pyplot()
    with plt.rc_context(STYLE):
        fig = build()
        try:
            return save_figure(fig, out_dir, stem)
        finally:
            plt.close(fig)


def explain(ax, text: str, width: int = 72):
    """Say inside the axes why there is nothing to draw (rather than leave them empty)."""
    ax.set_axis_off()
    wrapped = "\n".join(textwrap.fill(p, width) if p else "" for p in text.split("\n"))
    ax.text(
        0.5,
        0.5,
        wrapped,
        ha="center",
        va="center",
        multialignment="left",
        transform=ax.transAxes,
        bbox=EXPLAIN_BOX,
        gid="explain",
    )


# ------------------------------------------------------------------ units
def duration_text(us: float) -> str:
    """A duration in µs as text in the unit that suits it: 950 µs, 27.7 ms, 1.23 s."""
    if us >= 1e6:
        return f"{us / 1e6:.3g} s"
    if us >= 1e3:
        return f"{us / 1e3:.3g} ms"
    return f"{us:.3g} µs"


def time_axis(largest_us: float) -> tuple[float, str]:
    """(µs per unit, unit) for an axis whose largest value is `largest_us`."""
    if largest_us >= 1e6:
        return 1e6, "s"
    if largest_us >= 1e3:
        return 1e3, "ms"
    return 1.0, "µs"


def tflops_text(tflops: float) -> str:
    return f"{tflops:.4g} TFLOP/s"


def bandwidth_text(gbps: float) -> str:
    return f"{gbps / 1e3:.4g} TB/s" if gbps >= 1e3 else f"{gbps:.4g} GB/s"


def bytes_text(n: float) -> str:
    """A size in binary units: 16 B, 10.3 KiB, 2 MiB."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.3g} {unit}" if unit != "B" else f"{n:.0f} B"
        n /= 1024
    raise AssertionError("unreachable")


def bytes_axis(largest: float) -> tuple[float, str]:
    """(bytes per unit, unit) for an axis whose largest value is `largest` bytes (binary units)."""
    for power, unit in ((4, "TiB"), (3, "GiB"), (2, "MiB"), (1, "KiB")):
        if largest >= 1024**power:
            return float(1024**power), unit
    return 1.0, "B"


def span(values: pl.Series) -> tuple[float, float]:
    """(smallest, largest) of a non-empty numeric column, as floats."""
    v = values.cast(pl.Float64).drop_nulls().to_list()
    return min(v), max(v)


def category_colours(names) -> dict[str, str]:
    return {n: CATEGORY_COLOURS.get(n, OTHER_COLOUR) for n in names}


def ink_on(colour: str) -> str:
    """Black or white: whichever reads better on `colour` (by its luminance)."""
    from matplotlib.colors import to_rgb

    r, g, b = to_rgb(colour)
    return "black" if 0.299 * r + 0.587 * g + 0.114 * b > 0.55 else "white"


def device_labels(f: Flat) -> dict[int, str]:
    """device id -> "device 0: NVIDIA A100-SXM4-80GB" (a CPU-only trace's -1: "CPU ops (...)")."""
    lost = f.lost_activity
    cpu = "CPU ops (the trace lost its device activity)" if lost else "CPU ops (no GPU activity in this trace)"
    return {
        d: (cpu if d < 0 and not f.has_gpu else f"device {d}: {name}")
        for d, name in f.activity_devices.select("device", "name").iter_rows()
    }


def pct_text(pct: float, digits: int = 0) -> str:
    """A share as text, a small non-zero one as "<1%" rather than "0%"."""
    least = 10.0**-digits
    return f"<{least:g}%" if 0 < pct < least / 2 else f"{pct:.{digits}f}%"


# ------------------------------------------------------------------ label stacking
def spread(ys: list[float], gap: float, lo: float, hi: float) -> list[float]:
    """Label heights (in ys' order) at least `gap` apart, each as near its own y as a greedy pass
    up and then down allows, within [lo, hi] where they fit."""
    order = sorted(range(len(ys)), key=lambda i: ys[i])
    out = list(ys)
    floor = lo - gap
    for i in order:
        out[i] = floor = max(ys[i], floor + gap)
    ceiling = hi + gap
    for i in reversed(order):
        out[i] = ceiling = min(out[i], ceiling - gap)
    return out


def clusters(xs: list[float], reach: float) -> list[int]:
    """A cluster id per x (in xs' order): xs within `reach` of a neighbour share a cluster."""
    order = sorted(range(len(xs)), key=lambda i: xs[i])
    ids = [0] * len(xs)
    for prev, i in zip(order, order[1:], strict=False):
        ids[i] = ids[prev] + (xs[i] - xs[prev] > reach)
    return ids
