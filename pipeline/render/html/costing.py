"""costing: "what is costed" in an analysis' overview: a tile, a chart per device and a table.

From the cost coverage section when the page has it (the share of kernel time with a cost, by
where the cost came from, and each cause of the rest with its remedy); else from the roofline's
own reckoning (`roofline_data.kernel_time_by_reason`: kernel time with FLOPs and bytes, and why
the rest has none).
"""

from __future__ import annotations

import polars as pl

import pipeline.render.html.charts as ch
from pipeline.render.html.cells import percent
from pipeline.render.html.model import Chart, Group, Part, Table, Tile
from pipeline.render.plots.roofline_data import FIX, WHY

TOP_UNCOSTED = 8  # kernels off the roofline named under the chart
COSTED = "costed:"  # the coverage section's causes of costed kernels: costed:formula, costed:inductor, ...
COSTED_COLOURS = ("#55a868", "#8cc49a", "#2f7d45", "#b5dbbf")
REASON_COLOURS = {  # a colour per cause of no cost (others: the palette)
    "drawn": "#55a868",
    "no_launch": "#c44e52",
    "no_flops": "#9ab8de",
    "no_cpu_op": "#c44e52",
    "no_shapes": "#dd8452",
    "no_formula": "#ccb974",
    "shapes_not_modelled": "#8172b3",
    "no_bytes": "#937860",
    "not_costed": "#8c8c8c",
    "unmodelled": "#8c8c8c",
}

SHORT_WHY = {  # the reasons of WHY, in a few words (others: their name)
    "no_shapes": "no shapes",
    "no_cpu_op": "no CPU op",
    "no_formula": "no formula",
    "shapes_not_modelled": "shapes not modelled",
    "no_flops": "no FLOPs",
    "no_bytes": "no bytes",
    "not_costed": "not costed",
    "unmodelled": "no model",
}


# ------------------------------------------------------------------ from the roofline's reckoning
def roofline_tile(reasons: pl.DataFrame | None) -> list[Tile]:
    """The share of kernel time on the roofline (the mean over devices) and why the rest is not."""
    if reasons is None or not reasons.height:
        return []
    n = reasons["device"].n_unique()
    by = reasons.group_by("reason").agg(pct=pl.col("pct").sum() / n).sort("pct", descending=True)
    shares = dict(by.iter_rows())
    drawn = shares.pop("drawn", 0.0)
    rest = "; ".join(f"{SHORT_WHY.get(r, r)} {percent(p)}" for r, p in shares.items())
    return [
        Tile(
            "kernel time on the roofline",
            percent(drawn),
            f"with FLOPs and bytes. Not: {rest}" if rest else "every kernel has FLOPs and bytes",
            tone(drawn),
        )
    ]


def roofline_chart(reasons: pl.DataFrame, label) -> dict:
    by = reasons.group_by("device", "reason").agg(pl.col("pct").sum())
    order = by.group_by("reason").agg(pl.col("pct").sum()).sort("pct", descending=True)["reason"].to_list()
    if "drawn" in order:
        order.remove("drawn")
        order.insert(0, "drawn")
    names = {r: "on the roofline" if r == "drawn" else WHY.get(r, r) for r in order}
    segs = ch.series(
        [names[r] for r in order], {names[r]: REASON_COLOURS.get(r, ch.colour(i)) for i, r in enumerate(order)}
    )
    rows = []
    for d in by["device"].unique().sort().to_list():
        mine = dict(by.filter(pl.col("device") == d).select("reason", "pct").iter_rows())
        rows.append(
            ch.bar(label(d), [mine.get(r, 0.0) for r in order], f"{percent(mine.get('drawn', 0.0))} on the roofline")
        )
    fixes = [f"{WHY.get(r, r)}: {FIX[r]}." for r in order if r in FIX]
    note = "Kernel time with FLOPs and bytes (on the roofline) and, for the rest, why not." + (
        " To cost more: " + " ".join(fixes) if fixes else ""
    )
    return ch.bars("What is costed: % of kernel time with FLOPs and bytes", rows, "pct", segs, note, max_value=100)


def off_roofline_kernels(reasons: pl.DataFrame, several: bool) -> list[Table]:
    """The kernels with the most time off the roofline, and why each is off it."""
    off = reasons.filter(pl.col("reason") != "drawn").sort("pct", descending=True).head(TOP_UNCOSTED)
    if not off.height:
        return []
    off = off.with_columns(why=pl.col("reason").replace_strict(SHORT_WHY, default=pl.col("reason")))
    cols = ["name", *(["device"] if several else []), "pct", "why"]
    return [
        Table(
            off.select(cols),
            "Kernels with the most time off the roofline (pct: of kernel time)",
            compact=True,
            meanings={"pct": "% of the device's kernel time"},
        )
    ]


def tone(pct: float) -> str:
    return "good" if pct >= 90 else "warn" if pct >= 60 else "bad"


def short_why(cause: str) -> str:
    return SHORT_WHY.get(cause, cause.replace("_", " "))


# ------------------------------------------------------------------ from the coverage section
def coverage_tile(cov: pl.DataFrame) -> Tile:
    """The share of kernel time costed (the mean over devices), its sources, and the causes of the rest."""
    n = cov["device"].n_unique()
    by = cov.group_by("cause").agg(pct=pl.col("pct").sum() / n).sort("pct", descending=True)
    costed = [(c, p) for c, p in by.iter_rows() if c.startswith(COSTED)]
    rest = [(c, p) for c, p in by.iter_rows() if not c.startswith(COSTED)]
    share = sum(p for _, p in costed)
    sources = ", ".join(c.removeprefix(COSTED).replace("_", " ") for c, _ in costed)
    note = (f"by {sources}. " if sources else "") + (
        "Not: " + "; ".join(f"{short_why(c)} {percent(p)}" for c, p in rest) if rest else "every kernel"
    )
    return Tile("kernel time costed", percent(share), note, tone(share))


def coverage_parts(cov: pl.DataFrame, label, several: bool) -> list[Part]:
    """A bar per device split by cause (costed sources first, in greens), the remedies, and the
    causes of the uncosted time with their top names."""
    total = cov.group_by("cause").agg(pl.col("pct").sum()).sort("pct", descending=True)["cause"].to_list()
    order = [c for c in total if c.startswith(COSTED)] + [c for c in total if not c.startswith(COSTED)]
    names = {
        c: ("costed: " + c.removeprefix(COSTED).replace("_", " ")) if c.startswith(COSTED) else short_why(c)
        for c in order
    }
    greens = iter(COSTED_COLOURS * len(order))
    colours = {
        names[c]: next(greens) if c.startswith(COSTED) else REASON_COLOURS.get(c, ch.colour(i + 3))
        for i, c in enumerate(order)
    }
    segs = ch.series([names[c] for c in order], colours)
    rows = []
    for d in cov["device"].unique().sort().to_list():
        mine = dict(cov.filter(pl.col("device") == d).select("cause", "pct").iter_rows())
        costed = sum(p for c, p in mine.items() if c.startswith(COSTED))
        rows.append(ch.bar(label(d), [mine.get(c, 0.0) for c in order], f"{percent(costed)} costed"))
    remedies = cov.filter(pl.col("remedy").is_not_null()).unique("cause", maintain_order=True)
    fixes = [f"{short_why(c)}: {r}." for c, r in remedies.select("cause", "remedy").iter_rows()]
    note = "Kernel time with a cost, by where it came from, and the rest by why it has none." + (
        " Remedies: " + " ".join(fixes) if fixes else ""
    )
    chart = Chart(ch.bars("What is costed: % of kernel time", rows, "pct", segs, note, max_value=100))
    off = cov.filter(~pl.col("cause").str.starts_with(COSTED)).sort("pct", descending=True)
    cols = [c for c in ("cause", *(["device"] if several else []), "pct", "remedy", "top") if c in off.columns]
    table = (
        [
            Table(
                off.select(cols),
                "What has no cost, and the names taking most of it",
                compact=True,
                meanings={"pct": "% of the device's kernel time"},
            )
        ]
        if off.height
        else []
    )
    return [Group((chart, *table))]


def costing_parts(
    reasons: pl.DataFrame | None, coverage: pl.DataFrame | None, label, several: bool
) -> tuple[list[Tile], list[Part]]:
    """(tiles, charts) of what is costed: from the coverage section when there is one, else from
    the roofline's reasons (None: the trace has no kernels)."""
    if coverage is not None and coverage.height:
        return [coverage_tile(coverage)], coverage_parts(coverage, label, several)
    if reasons is None or not reasons.height:
        return [], []
    return roofline_tile(reasons), [
        Group((Chart(roofline_chart(reasons, label)), *off_roofline_kernels(reasons, several)))
    ]
