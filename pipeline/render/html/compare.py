"""compare: the pages of `compare` and `trend`, made from their JSON documents (so this module
needs nothing of `pipeline.compare` but the documents' keys, and falls back to the generic page
of a document, `frames.document_html`, for any key it does not know).

    comparison  the runs and the method as facts; tiles counting each verdict; the runs' problems;
                the biggest changes (delta %) as bars either side of zero, coloured by verdict;
                then `<section data-section="rows">`: a table per level (kernels, ops, ...)
    trend       the level and method as facts; a chart per name over the runs in time order (its
                change points marked, the names with change points first); then the JSON
                document's `change_points` and `rows`
"""

from __future__ import annotations

from collections.abc import Mapping

import polars as pl

import pipeline.render.html.charts as ch
from pipeline.render.html.cells import duration
from pipeline.render.html.frames import document_frames, frames_page
from pipeline.render.html.model import Chart, Note, Part, Tile
from pipeline.render.html.page import render_page
from pipeline.render.tables import shorten

BIGGEST = 20  # changes in the comparison's chart
TREND_CHARTS = 12  # names charted over the runs
TITLE_CHARS = 100  # a longer name is shortened in a chart's title (whole on hover)
VERDICT_COLOURS = {"regressed": "#c44e52", "improved": "#55a868", "new": "#dd8452", "gone": "#8172b3"}
VERDICT_TONES = {"regressed": "bad", "improved": "good"}
VERDICT_ORDER = ("regressed", "improved", "new", "gone", "untested", "same")
LEVEL_TITLES = {  # a level's table caption (others: the level's name)
    "kernel": "Kernels",
    "op": "Ops",
    "category": "Kernel categories",
    "collective": "Collectives by kind and size",
    "step": "Steps",
    "idle": "GPU idle time by cause",
}


def _side(head: Mapping) -> str:
    name = head.get("label") or head.get("run") or "?"
    parts = [f"{head[k]} {k}" for k in ("traces", "ranks") if head.get(k) is not None]
    when = f", {head['time']}" if head.get("time") else ""
    return f"{name} ({', '.join(parts)}{when})" if parts else f"{name}{when}"


def comparison_html(doc: Mapping) -> str:
    """The page of `compare --format html` from `comparison_json`'s document."""
    base, new = doc.get("base") or {}, doc.get("new") or {}
    rows = pl.DataFrame(doc.get("rows") or [], infer_schema_length=None)
    facts = [("base", _side(base)), ("new", _side(new))]
    facts += [(k.replace("_", " "), str(v)) for k, v in (doc.get("method") or {}).items()]
    overview: list[Part] = [Note(f"Problem: {p}", "warn") for p in doc.get("problems") or []]
    if rows.height and {"verdict", "level"} <= set(rows.columns):
        counts = dict(rows.group_by("verdict").len().iter_rows())
        order = [v for v in VERDICT_ORDER if v in counts] + sorted(v for v in counts if v not in VERDICT_ORDER)
        for verdict, n in ((v, counts[v]) for v in order):
            overview.append(Tile(verdict, f"{n:,}", "names", VERDICT_TONES.get(verdict, "") if n else ""))
        overview += _changes_chart(rows)
    by_level = (
        {LEVEL_TITLES.get(str(lv), str(lv)): g for (lv,), g in rows.group_by("level", maintain_order=True)}
        if "level" in rows.columns
        else rows
    )
    title = f"{base.get('label') or base.get('run') or 'base'} vs {new.get('label') or new.get('run') or 'new'}"
    help_ = "every name compared, per level: base and new time, the change, the verdict and its test"
    page, empty = frames_page(
        title,
        "comparison",
        [("rows", "Compared: every name, per level", by_level)],
        facts,
        overview,
        helps={"rows": help_},
    )
    return render_page(page, empty)


def _changes_chart(rows: pl.DataFrame) -> list[Part]:
    if "delta_pct" not in rows.columns:
        return []
    changed = rows.filter(pl.col("delta_pct").is_not_null() & (pl.col("verdict") != "same"))
    pick = changed if changed.height else rows.filter(pl.col("delta_pct").is_not_null())
    top = pick.sort(pl.col("delta_pct").abs(), descending=True).head(BIGGEST)
    bars = []
    for r in top.to_dicts():
        tip = [f"{r['name']} ({r['level']})", f"verdict: {r['verdict']}"]
        if r.get("base_us") is not None or r.get("new_us") is not None:
            tip.append(f"base {duration(r.get('base_us') or 0)}, new {duration(r.get('new_us') or 0)}")
        if r.get("q") is not None:
            tip.append(f"q = {r['q']:.3g}")
        if r.get("ci_low_pct") is not None and r.get("ci_high_pct") is not None:
            tip.append(f"95% interval of the change: {r['ci_low_pct']:+.1f}% to {r['ci_high_pct']:+.1f}%")
        colour = VERDICT_COLOURS.get(r["verdict"], "#9aa5b1")
        level = str(r["level"])
        label = f"{level}: {shorten(str(r['name']), ch.LABEL_CHARS - len(level) - 2)}"
        text = f"{r['delta_pct']:+.1f}% {r['verdict']}"
        bars.append(ch.bar(label, [r["delta_pct"]], text, tip, full=f"{level}: {r['name']}", color=colour))
    what = "changes" if changed.height else "differences (none beyond the noise)"
    spec = ch.bars(
        f"The {len(bars)} largest {what}, new vs base (%)",
        bars,
        "pct",
        signed=True,
        note="Red: regressed, green: improved, grey: within the noise. Hover a bar for both runs and the test.",
    )
    return [Chart(spec, wide=True)] if bars else []


def trend_html(doc: Mapping) -> str:
    """The page of `trend --format html` from `trend_json`'s document."""
    sections, facts = document_frames(doc)
    rows = next((df for k, _, df in sections if k == "rows"), pl.DataFrame())
    cps = next((df for k, _, df in sections if k == "change_points"), pl.DataFrame())
    overview: list[Part] = [Note(f"Problem: {p}", "warn") for p in doc.get("problems") or []]
    if rows.height and {"name", "value_us"} <= set(rows.columns):
        names = rows["name"].unique(maintain_order=True).to_list()
        changed = cps["name"].unique(maintain_order=True).to_list() if cps.height else []
        overview += [
            Tile("names followed", f"{len(names):,}", f"level {doc.get('level', '?')}"),
            Tile("runs", f"{rows['label' if 'label' in rows.columns else 'run'].n_unique():,}", "in time order"),
            Tile(
                "change points", f"{cps.height:,}", ", ".join(map(str, changed[:3])), "warn" if cps.height else "good"
            ),
        ]
        for name in (changed + [n for n in names if n not in changed])[:TREND_CHARTS]:
            overview.append(Chart(_trend_chart(rows.filter(pl.col("name") == name), cps, name)))
    titles = {"rows": "Every name's value per run", "change_points": "Change points: where a name's level moved"}
    named = [(k, titles.get(k, t), df) for k, t, df in sections]
    page, empty = frames_page(f"trend: {doc.get('level', '')}", "trend", named, facts, overview)
    return render_page(page, empty)


def _trend_chart(series: pl.DataFrame, cps: pl.DataFrame, name: str) -> dict:
    label = "label" if "label" in series.columns else "run"
    labels = [str(x) for x in series[label].to_list()]
    xs = list(range(series.height))
    marks = []
    if cps.height and "name" in cps.columns:
        for c in cps.filter(pl.col("name") == name).to_dicts():
            at = labels.index(str(c.get(label))) if str(c.get(label)) in labels else None
            if at is not None:
                marks.append({"x": at, "y": series["value_us"][at], "label": f"{c.get('delta_pct', 0):+.1f}%"})
    x = ch.axis("run", "plain") | {"labels": labels}
    curve = {"name": name, "color": ch.colour(0), "x": xs, "y": series["value_us"].to_list()}
    spec = ch.lines(shorten(name, TITLE_CHARS), x, ch.axis("time", "us"), [curve], marks, step=False)
    return spec | ({"full": name} if len(name) > TITLE_CHARS else {})
