"""diff: the page of `diff --format html`: A and B named, their totals, the biggest changes as
bars either side of zero (hover one for both sides), then every row side by side (the JSON
document's `rows`)."""

from __future__ import annotations

import polars as pl

import pipeline.render.html.charts as ch
from pipeline.analyses.diff import diff_summary, different_work
from pipeline.render.html.cells import duration, percent
from pipeline.render.html.frames import frames_page
from pipeline.render.html.model import Chart, Part, Tile
from pipeline.render.html.page import render_page

BIGGEST = 20  # changes in the chart
ONE_SIDE = "#9aa5b1"  # a row only in A or only in B: neither faster nor slower
FIRST = ("key", "kind", "a_dur_us", "b_dur_us", "delta_us", "ratio", "a_count", "b_count")


def diff_html(d: pl.DataFrame, label_a: str, label_b: str, facts=(), summary: dict | None = None) -> str:
    """The page of `diff`: `d` as `pipeline.analyses.diff.diff` makes it; `summary` as
    `diff_summary` makes it of every row (default: of `d`)."""
    lead = [c for c in FIRST if c in d.columns]
    rows = d.select(lead + [c for c in d.columns if c not in lead])
    page, empty = frames_page(
        f"{label_a} vs {label_b}",
        "diff",
        [("rows", "Side by side: every CPU op, kernel and copy of A and B", rows)],
        [("a", label_a), ("b", label_b), *facts],
        overview(d, label_a, label_b, summary or diff_summary(d)),
        helps={
            "rows": "matched by normalised CPU op (across vendors), else by kernel or copy name; a_* is A, b_* is B"
        },
    )
    return render_page(page, empty)


def overview(d: pl.DataFrame, label_a: str, label_b: str, summary: dict) -> list[Part]:
    if not d.height:
        return []
    a, b = summary["total_a_us"], summary["total_b_us"]
    change = 100 * (b - a) / a if a else None
    parts: list[Part] = [
        Tile(f"A: {label_a}", duration(a), f"{summary['rows_matched'] + summary['rows_only_a']:,} rows"),
        Tile(f"B: {label_b}", duration(b), f"{summary['rows_matched'] + summary['rows_only_b']:,} rows"),
        Tile(
            "B - A",
            ("+" if b >= a else "-") + duration(abs(b - a)),
            f"{'+' if (change or 0) >= 0 else ''}{percent(change)}" if change is not None else "",
            "bad" if change and change > 5 else "good" if change and change < -5 else "",
        ),
    ]
    matched = summary["matched_pct"]
    parts.append(
        Tile(
            "matched",
            percent(matched) if matched is not None else "nothing",
            f"of the time; {summary['rows_only_a']:,} rows only in A | {summary['rows_only_b']:,} only in B"
            + ("; different workloads?" if different_work(summary) else ""),
            "warn" if different_work(summary) else "",
        )
    )
    big = d.with_columns(delta=pl.col("delta_us").fill_null(0)).sort(pl.col("delta").abs(), descending=True)
    rows = []
    for r in big.head(BIGGEST).to_dicts():
        tip = [
            f"{r['key']} ({r['kind']})",
            f"A: {duration(r['a_dur_us'] or 0)} in {r['a_count'] or 0:,} · B: {duration(r['b_dur_us'] or 0)} in "
            f"{r['b_count'] or 0:,}",
            f"B - A: {duration(r['delta'])}" + (f" · B/A {r['ratio']:.3g}x" if r.get("ratio") is not None else ""),
        ]
        sign = "+" if r["delta"] >= 0 else "-"
        only = " (only in A)" if r["b_count"] is None else " (only in B)" if r["a_count"] is None else ""
        rows.append(
            ch.bar(
                r["key"],
                [r["delta"]],
                f"{sign}{duration(abs(r['delta']))}{only}",
                tip,
                color=ONE_SIDE if only else "#c44e52" if r["delta"] > 0 else "#55a868",
            )
        )
    spec = ch.bars(
        f"The {len(rows)} biggest changes, B - A (red: slower in B, green: faster, grey: on one side only)",
        rows,
        "us",
        signed=True,
        note="Hover a bar for both sides; every row is in the table below.",
    )
    return [*parts, Chart(spec, wide=True)]
