"""roofline: per device, each costed kernel a bubble at (arithmetic intensity, achieved TFLOP/s),
area = its share of the device's kernel time, colour = its category; the memory roof and a compute
roof per peak its kernels' math modes reach, each labelled with its value; a kernel above the DRAM
roof (roofline_bound = cache: its bytes came from the cache) ringed in black; the kernels with the most
time named; under the legends, how much of the kernel time is drawn and why the rest is not. A
device with nothing to place says why, in the figure. What a panel shows: `roofline_data`."""

from __future__ import annotations

import math
import textwrap

import polars as pl

from pipeline.analyses.flat import as_flat
from pipeline.cost.roofline import ridge as ridge_point
from pipeline.render.plots.figure import (
    DPI,
    LABEL_CHARS,
    LABEL_SIZE,
    NOTE_BOX,
    bandwidth_text,
    category_colours,
    clusters,
    explain,
    pct_text,
    pyplot,
    span,
    spread,
    tflops_text,
)
from pipeline.render.plots.roofline_data import FIX, WHY, Panel, roofline_panels
from pipeline.render.tables import shorten

TOP_LABELS = 8  # kernels named on a roofline
AREA_PER_PCT = 12.0  # bubble area (pt²) per % of the device's kernel time
MIN_AREA = 6.0  # pt²: the smallest bubble drawn (0.5% of the time)
SIZE_REFS = (1, 10, 50)  # % of the device's kernel time, in the size legend
PANEL_COLUMNS = 2  # roofline panels per row
ROOF = "#b22222"
CACHE_RING = "black"  # the ring of a kernel above the DRAM roof (roofline_bound = cache)
CACHE_LABEL = "ring: from the cache"  # above the DRAM roof


def roofline_figure(flat, kernels: pl.DataFrame):
    """The roofline figure of one trace: a panel per device (`draw_panel`); what is placed in points
    (kernel names, roof labels) is placed once the axes are laid out."""
    plt = pyplot()
    f = as_flat(flat)
    panels = roofline_panels(f, kernels)
    ncols = max(1, min(len(panels), PANEL_COLUMNS))
    nrows = max(1, math.ceil(len(panels) / ncols))
    height = 6.6 if any(p.points.height for p in panels) else 3.6
    fig, axes = plt.subplots(
        nrows, ncols, figsize=(9 * ncols, height * nrows), squeeze=False, layout="constrained", dpi=DPI
    )
    fig.suptitle(f"{f.stem}: roofline of its kernels", fontweight="bold")
    for ax, panel in zip(axes.flat, panels, strict=False):
        draw_panel(ax, panel)
    for ax in axes.flat[len(panels) :]:
        ax.remove()
    if not panels:
        explain(axes.flat[0], f"{f.stem}: no GPU kernels in the analysed window: nothing to place on a roofline.")
    drawn = [(ax, panel) for ax, panel in zip(axes.flat, panels, strict=False) if panel.points.height]
    fig.draw_without_rendering()  # the legends' size known: the coverage note goes under them
    for ax, _ in drawn:
        note_under_legends(ax)
    fig.draw_without_rendering()  # the axes' final place: labels are laid out in points
    for ax, panel in drawn:
        labels = label_points(ax, panel.points)
        place_roof_labels(ax, labels)
    return fig


def draw_panel(ax, p: Panel):
    """One device's roofline, or why it has none."""
    ax.set_title(roofline_title(p), loc="left")
    if not p.points.height:
        explain(ax, why_empty(p))
        return
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("arithmetic intensity (FLOP per byte moved)")
    ax.set_ylabel("achieved TFLOP/s")
    ax.grid(True, which="major", lw=0.4, alpha=0.4)
    set_limits(ax, p)
    draw_points(ax, p.points)
    draw_roofs(ax, p)
    legends(ax, p.points)
    coverage_note(ax, p)


def roofline_title(p: Panel) -> str:
    if not p.points.height:
        return p.label
    roofs = [f"{d} peak {tflops_text(v)}" for d, v in p.roofs]
    roofs += [f"memory {bandwidth_text(p.bw_gbps)}"] if p.bw_gbps else []
    return p.label + (f"\nroofs: {', '.join(roofs)}" if roofs else "\nno roofs: device not in the device-spec table")


def why_empty(p: Panel) -> str:
    """The text of a device with no kernel to place: what its kernel time lacks, and the fix."""
    missing = [(r, pct) for r, pct in p.reasons if r != "drawn"]
    head = f"Nothing to place: no kernel on {p.label.split(':')[0]} has a FLOP and byte model"
    if not missing:
        return head + "."
    lines = [f"{head}: {WHY.get(missing[0][0], missing[0][0])}.", "", "Its kernel time, by why it has none:"]
    lines += [f"{pct_text(pct, 1):>6}  {WHY.get(r, r)}" for r, pct in missing]
    fix = FIX.get(missing[0][0])
    return "\n".join(lines + ([f"\nTo fix: {fix}."] if fix else []))


def set_limits(ax, p: Panel):
    """Axes wide enough for every kernel and the ridges, with room above the highest roof for labels."""
    ridges = [ridge_point(v, p.bw_gbps) for _, v in p.roofs] if p.bw_gbps else []
    peaks = [v for _, v in p.roofs]
    (ai_lo, ai_hi), (tf_lo, tf_hi) = span(p.points["arithmetic_intensity"]), span(p.points["achieved_tflops"])
    ax.set_xlim(min([ai_lo, *ridges]) / 4, max([ai_hi, *ridges]) * 6)  # lists: a device without roofs has none
    ax.set_ylim(min([tf_lo, *peaks]) / 4, max([tf_hi, *peaks]) * 8)


def area(pct) -> float:
    """Bubble area (pt²) of a kernel whose costed launches take `pct` % of the device's kernel time."""
    return max(MIN_AREA, AREA_PER_PCT * pct)


def draw_points(ax, points: pl.DataFrame):
    """A bubble per kernel, largest first (small ones stay visible on top)."""
    rows = points.sort("share", descending=True)
    categories = rows["category"].fill_null("other")
    colours = category_colours(categories)
    cache = [b == "cache" for b in rows["roofline_bound"]]
    ax.scatter(
        rows["arithmetic_intensity"],
        rows["achieved_tflops"],
        s=[area(v) for v in rows["share"]],
        c=[colours[c] for c in categories],
        alpha=0.65,
        edgecolors=[CACHE_RING if c else "0.25" for c in cache],
        linewidths=[1.8 if c else 0.5 for c in cache],
        zorder=3,
    )


def draw_roofs(ax, p: Panel):
    """The memory roof up to the highest ridge and a compute roof per peak (the most used solid),
    each with its value; the most used roof's ridge marked. Without peaks or bandwidth, a note."""
    if not p.bw_gbps or not p.roofs:
        missing = "a bandwidth" if p.roofs else "peaks"
        note = f"no roofs: the device-spec table has no {missing} for this device (use --device or --device-specs)"
        ax.text(0.02, 0.97, note, transform=ax.transAxes, va="top", fontsize=7.5, color=ROOF, bbox=NOTE_BOX)
        return
    x_lo = ax.get_xlim()[0]
    top = max(v for _, v in p.roofs)
    ridge = ridge_point(top, p.bw_gbps)
    ax.plot([x_lo, ridge], [x_lo * p.bw_gbps / 1e3, top], color=ROOF, lw=1.3, zorder=2)
    memory_label(ax, p.bw_gbps, ridge)
    for i, (dtypes, peak) in enumerate(p.roofs):
        compute_roof(ax, dtypes, peak, ridge_point(peak, p.bw_gbps), main=i == 0)
    ridge_mark(ax, p.roofs[0][0], ridge_point(p.roofs[0][1], p.bw_gbps))


def compute_roof(ax, dtypes: str, peak: float, ridge: float, main: bool):
    """A compute roof from its ridge to the right edge, its value right of the axes (placed apart
    from the others' by `place_roof_labels`)."""
    ax.plot([ridge, ax.get_xlim()[1]], [peak, peak], color=ROOF, lw=1.3 if main else 0.9, ls="-" if main else "--")
    ax.annotate(
        f"{dtypes} peak\n{tflops_text(peak)}",
        xy=(1.0, peak),
        xycoords=("axes fraction", "data"),
        xytext=(4, 0),
        textcoords="offset points",
        va="center",
        color=ROOF,
        fontsize=7.5,
        annotation_clip=False,
        gid="compute-roof",
    )


def ridge_mark(ax, dtypes: str, ridge: float):
    """A dotted line at the ridge, named at the top: left of it memory-bound, right compute-bound."""
    ax.axvline(ridge, color=ROOF, lw=0.6, ls=":", zorder=1)
    ax.annotate(
        f"memory-bound ← ridge {ridge:.3g} FLOP/B ({dtypes}) → compute-bound",
        xy=(ridge, 1.0),
        xycoords=("data", "axes fraction"),
        xytext=(0, -3),
        textcoords="offset points",
        ha="center",
        va="top",
        fontsize=6.5,
        color=ROOF,
        bbox={"boxstyle": "square,pad=0.2", "fc": "white", "ec": "none"},
    ).set_in_layout(False)


def memory_label(ax, bw_gbps: float, ridge: float):
    """The memory roof's value, written along it (placed and turned by `place_roof_labels`)."""
    ax.annotate(
        f"memory {bandwidth_text(bw_gbps)}",
        xy=(ridge, ridge * bw_gbps / 1e3),
        xytext=(-4, 4),
        textcoords="offset points",
        ha="center",
        va="bottom",
        color=ROOF,
        fontsize=7.5,
        rotation_mode="anchor",
        gid="memory-roof",
    ).set_in_layout(False)


def place_roof_labels(ax, avoid: list):
    """Once laid out: the compute roofs' labels (right of the axes) moved apart where their roofs
    are close; the memory roof's label turned along its line, where it overlaps none of `avoid`."""
    to_pt = 72 / ax.figure.dpi
    compute = [t for t in ax.texts if t.get_gid() == "compute-roof"]
    ys = [ax.transData.transform((1.0, t.xy[1]))[1] * to_pt for t in compute]
    for t, y, new in zip(compute, ys, spread(ys, 2.6 * 7.5, -math.inf, math.inf), strict=True):
        t.xyann = (4, new - y)
    for t in ax.texts:
        if t.get_gid() == "memory-roof":
            along_memory_roof(ax, t, avoid)


def along_memory_roof(ax, label, avoid: list):
    """Put `label` on the memory roof (slope 1 in log-log), turned along it, at the first of a few
    places along it (in log, from the left edge to the ridge) where it overlaps none of `avoid`."""
    from matplotlib.text import Text

    renderer = ax.figure.canvas.get_renderer()
    (x0, y0), (x1, y1) = ax.transData.transform([(1.0, 1.0), (10.0, 10.0)])
    label.set_rotation(math.degrees(math.atan2(y1 - y0, x1 - x0)))
    for a in avoid:
        a.update_positions(renderer)  # where a label is now, not where it was last drawn
    taken = [Text.get_window_extent(a, renderer) for a in avoid]  # their text, not their leader lines
    left, ridge, slope = math.log(ax.get_xlim()[0]), math.log(label.xy[0]), label.xy[1] / label.xy[0]
    for frac in (0.6, 0.45, 0.75, 0.3, 0.85, 0.15, 0.9, 0.6):  # the last: where nothing was free
        x = math.exp(left + frac * (ridge - left))
        label.xy = (x, x * slope)
        if not any(label.get_window_extent(renderer).overlaps(b) for b in taken):
            return


def legends(ax, points: pl.DataFrame):
    """Under the axes: colour (kernel category, with its share of the time drawn) and size (bubble
    area = share of the device's kernel time, three reference sizes)."""
    from matplotlib.lines import Line2D
    from matplotlib.transforms import ScaledTranslation

    below = ax.transAxes + ScaledTranslation(0, -36 / 72, ax.figure.dpi_scale_trans)  # under the x label
    by_time = (
        points.group_by(pl.col("category").fill_null("other")).agg(pl.col("share").sum()).sort("share", descending=True)
    )
    colours = category_colours(by_time["category"])
    dots = [
        Line2D(
            [], [], ls="", marker="o", ms=7, mfc=colours[c], mec="0.25", mew=0.5, alpha=0.8, label=f"{c} {pct_text(p)}"
        )
        for c, p in by_time.iter_rows()
    ]
    if (points["roofline_bound"] == "cache").any():
        dots.append(Line2D([], [], ls="", marker="o", ms=7, mfc="white", mec=CACHE_RING, mew=1.8, label=CACHE_LABEL))
    colour = ax.legend(
        handles=dots,
        title="colour: kernel category (share of the kernel time drawn)",
        loc="upper left",
        bbox_to_anchor=(0.0, 0.0),
        bbox_transform=below,
        ncol=min(3, len(dots)),
        frameon=False,
        alignment="left",
    )
    colour.set_gid("legend")
    ax.add_artist(colour)
    sizes = [
        Line2D([], [], ls="", marker="o", ms=math.sqrt(area(v)), mfc="0.8", mec="0.25", mew=0.5, label=f"{v}%")
        for v in SIZE_REFS
    ]
    size = ax.legend(
        handles=sizes,
        title="area: share of the device's kernel time",
        loc="upper right",
        bbox_to_anchor=(1.0, 0.0),
        bbox_transform=below,
        ncol=len(sizes),
        frameon=False,
        columnspacing=0.8,
        handlelength=3.2,
        handleheight=4.5,
        handletextpad=0.2,
    )
    size.set_gid("legend")


def coverage_note(ax, p: Panel):
    """Under the legends (`note_under_legends`): how much of the device's kernel time the bubbles
    are, and why the rest is not drawn."""
    drawn = sum(pct for r, pct in p.reasons if r == "drawn")
    rest = [f"{pct_text(pct)} {WHY.get(r, r)}" for r, pct in p.reasons if r != "drawn" and pct >= 0.5]
    text = f"Drawn: {len(p.points)} kernels (by name), {pct_text(drawn)} of the device's kernel time."
    if rest:
        text += " Not drawn: " + "; ".join(rest) + "."
    ax.text(
        0.0,
        0.0,
        textwrap.fill(text, 150),
        transform=ax.transAxes,
        va="top",
        fontsize=7,
        color="0.25",
        gid="coverage-note",
    )


def note_under_legends(ax):
    """Once the legends are laid out: the coverage note moved just under the lower of them."""
    from matplotlib.transforms import ScaledTranslation

    to_pt = 72 / ax.figure.dpi
    legends = [a for a in ax.get_children() if a.get_gid() == "legend"]
    bottom = min(leg.get_window_extent().y0 for leg in legends)
    below = (bottom - ax.get_window_extent().y0) * to_pt - 4
    for t in ax.texts:
        if t.get_gid() == "coverage-note":
            t.set_transform(ax.transAxes + ScaledTranslation(0, below / 72, ax.figure.dpi_scale_trans))


def label_points(ax, points: pl.DataFrame, n: int = TOP_LABELS) -> list:
    """Name the n kernels with the most time. Bubbles close in x share a column of labels, on the
    side of the axes with more room; labels are stacked so that none overlaps another (`spread`,
    in points), a leader line from each to its bubble."""
    top = points.sort("share", "dur_us", descending=True).head(n)
    to_pt = 72 / ax.figure.dpi
    box = ax.get_window_extent()
    xy = ax.transData.transform(top.select("arithmetic_intensity", "achieved_tflops").to_numpy()) * to_pt
    radii = [math.sqrt(area(v) / math.pi) for v in top["share"]]
    ids = clusters([x for x, _ in xy], 0.25 * box.width * to_pt)
    columns = {
        c: label_column([(x, r) for (x, _), r, i in zip(xy, radii, ids, strict=True) if i == c], box, to_pt)
        for c in set(ids)
    }
    gap = LABEL_SIZE * 1.5
    ys = spread([y for _, y in xy], gap, box.y0 * to_pt + gap, box.y1 * to_pt - 2.5 * gap)
    out = []
    for row, (x, y), r, c, new_y in zip(top.iter_rows(named=True), xy, radii, ids, ys, strict=True):
        at, ha = columns[c]
        ann = ax.annotate(
            f"{shorten(row['name'], LABEL_CHARS)}  {pct_text(row['share'])}",
            xy=(row["arithmetic_intensity"], row["achieved_tflops"]),
            xytext=(at - x, new_y - y),
            textcoords="offset points",
            ha=ha,
            va="center",
            fontsize=LABEL_SIZE,
            bbox={"boxstyle": "square,pad=0.15", "fc": "white", "ec": "none", "alpha": 0.75},
            arrowprops={"arrowstyle": "-", "lw": 0.6, "color": "0.35", "shrinkA": 0, "shrinkB": r},
            zorder=6,
            gid="kernel-label",
        )
        ann.set_in_layout(False)
        out.append(ann)
    return out


def label_column(bubbles: list[tuple[float, float]], box, to_pt: float) -> tuple[float, str]:
    """(x in points, alignment) of the labels of a cluster of (x, radius) bubbles: left of them
    when the cluster lies in the right half of the axes, else right of them."""
    centre = sum(x for x, _ in bubbles) / len(bubbles)
    if centre > (box.x0 + 0.5 * box.width) * to_pt:
        return min(x - r for x, r in bubbles) - 10, "right"
    return max(x + r for x, r in bubbles) + 10, "left"
