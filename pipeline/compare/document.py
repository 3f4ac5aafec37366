"""document: a comparison as the document every format is made from: a head (the runs, the
method, the verdicts counted, the runs' problems) and one section per level, each a frame of rows.

JSON (`comparison_json`): {"base": {run, dataset, ranks, traces, units, time}, "new": {...},
"method": {...}, "summary": {level: {verdict: n}}, "problems": [str], "rows": [{"level", "name",
"base_us", "new_us", "delta_pct", "verdict", "q", "p", "ci_low_pct", "ci_high_pct", ...}]} with
full names. Text and Markdown: the head, then each level's rows under its title, changes first
(`top` rows each); CSV: every row in one table; xlsx: an `about` sheet and a sheet per level.
"""

from __future__ import annotations

import polars as pl

from pipeline.compare.report import COLUMNS, LEVELS, Comparison
from pipeline.compare.runs import Run, iso_time
from pipeline.render.tables import check_columns, dumps, records, render

TITLES = {
    "kernel": "Kernels",
    "op": "Ops (GPU time of the kernels they launched)",
    "category": "Kernel categories",
    "collective": "Collectives by kind and size (latency)",
    "step": "Profiler steps",
    "idle": "GPU idle time by cause",
}
# what a table shows, by importance (a narrow terminal leaves out the last): COLUMNS but the level
# (a table per level) and the test's details (in csv, json and xlsx)
DETAILS = ("level", "base_n", "new_n", "units", "test", "p", "prior_df", "between_runs_var", "kind", "bytes")
TEXT_COLUMNS = [c for c in COLUMNS if c not in (*DETAILS, "base_names", "new_names")]
TOP = 20


def run_head(run: Run, units: int, unit: str) -> dict:
    ranks = run.traces["rank"].drop_nulls().n_unique()
    return {
        "run": run.name,
        "label": run.label,
        "dataset": str(run.dataset),
        "traces": run.traces.height,
        "ranks": ranks,
        "units": units,
        "unit": unit,
        "time": iso_time(run.time_ns),
    }


def method(c: Comparison) -> dict:
    return {
        "test": "two-sample t-test on the logarithm of each unit's time (on the time itself where a unit is 0), "
        "variances moderated across the names of a level (empirical Bayes, as limma)",
        "units": c.units,
        "fdr": c.fdr,
        "min_effect_pct": c.min_effect_pct,
        "multiple_testing": "Benjamini-Hochberg over every name tested",
    }


def summary(c: Comparison) -> dict:
    levels = [lv for lv in LEVELS if lv in set(c.rows["level"].to_list())]
    return {lv: {k: v for k, v in c.counts(lv).items() if v} for lv in levels}


def comparison_json(c: Comparison) -> dict:
    """The JSON document (see the module docstring)."""
    return {
        "base": run_head(c.base, c.base_units, c.units),
        "new": run_head(c.new, c.new_units, c.units),
        "method": method(c),
        "summary": summary(c),
        "problems": c.problems,
        "rows": records(c.rows),
    }


def sections(c: Comparison) -> dict[str, pl.DataFrame]:
    """Each level's rows (every column), by level, in LEVELS order."""
    return {lv: c.rows.filter(pl.col("level") == lv) for lv in LEVELS if (c.rows["level"] == lv).any()}


def head_items(c: Comparison) -> list[tuple[str, str]]:
    """What the text and Markdown heads say, as (key, text): the runs, the method, the verdicts."""
    unit = {"ranks": "rank", "steps": "profiler step"}[c.units]

    def side(run: Run, n: int) -> str:
        when = f", {iso_time(run.time_ns)}" if run.time_ns else ""
        return f"{run.label} ({run.traces.height} traces, {n} {unit}s{when})"

    counts = c.counts()
    said = ", ".join(f"{n} {v}" for v, n in counts.items() if n and v != "same")
    return [
        ("base", side(c.base, c.base_units)),
        ("new", side(c.new, c.new_units)),
        ("runs", f"{c.base.name} -> {c.new.name}"),
        (
            "test",
            f"moderated t on log time per {unit}, {c.base_units} vs {c.new_units}; false discovery rate {c.fdr:g}, "
            f"minimum change {c.min_effect_pct:g}%",
        ),
        ("found", f"{said or 'no change'} ({c.rows.height} names compared)"),
        *(("problem", p) for p in c.problems),
    ]


def head_text(items: list[tuple[str, str]], md: bool, width: int | None) -> str:
    """The head as `key: text` lines (Markdown: a list), wrapped to `width` at a terminal."""
    import textwrap

    if md:
        return "\n".join(f"- {k}: {v}" for k, v in items) + "\n"
    lines = [f"{k + ':':<8} {v}" for k, v in items]
    if width:
        lines = [textwrap.fill(line, width, subsequent_indent=" " * 9) for line in lines]
    return "\n".join(lines) + "\n"


def format_comparison(
    c: Comparison, fmt: str, width: int | None = None, top: int | None = TOP, columns: list[str] | None = None
) -> str:
    """`tracepipe compare` output in a text format: json, csv (every row), table or md (the head,
    then each level's `top` rows, changes first; `columns`: only these), or html (a page of every
    row, `pipeline.render.html.comparison_html`)."""
    check_columns(columns, [c.rows])
    if fmt == "json":
        return dumps(comparison_json(c))
    if fmt == "html":
        from pipeline.render.html import comparison_html

        return comparison_html(comparison_json(c))
    if fmt == "csv":
        return render(c.rows, "csv", columns=columns)
    md = fmt == "md"
    out = [head_text(head_items(c), md, width)]
    for level, rows in sections(c).items():
        counts = c.counts(level)
        said = ", ".join(f"{n} {v}" for v, n in counts.items() if n)
        title = f"{TITLES[level]}: {said}"
        shown = rows.select(c for c in TEXT_COLUMNS if c in rows.columns and not rows[c].is_null().all())
        more = shown.height - top if top and shown.height > top else 0
        text = render(
            shown.head(top or shown.height) if more else shown, fmt, name_limit=None, width=width, columns=columns
        )
        if more:
            text += f"({more:,} more: --top 0 shows all; csv, json and xlsx hold every row)\n"
        out.append((f"## {title}\n\n" if md else f"{_fit(title, width)}\n") + text)
    return "\n".join(out)


def _fit(title: str, width: int | None) -> str:
    """A title within the width (a long name shortened in the middle, as the tables shorten names)."""
    from pipeline.render.tables import shorten

    return shorten(title, width) if width and len(title) > width else title


def write_comparison_workbook(c: Comparison, path) -> None:
    """`compare --format xlsx`: an `about` sheet (the runs, the method, the problems), then a sheet
    per level with every row."""
    from pipeline.render.workbook import write_workbook
    from pipeline.version import __version__

    about: dict[str, object] = {}
    for i, (k, v) in enumerate(head_items(c)):
        about[k if k not in about else f"{k} {i}"] = v
    about["tracepipe"] = __version__
    write_workbook(path, {lv: rows.select(COLUMNS) for lv, rows in sections(c).items()}, about)


# ------------------------------------------------------------------ trend
TREND_COLUMNS = ["run", "time", "value_us", "vs_previous_pct", "change_pct", "count"]


def trend_frames(t) -> dict[str, pl.DataFrame]:
    """A trend's change points, then each name's series (run, time, value, changes), by title."""
    from pipeline.compare.trend import trend_json

    doc = trend_json(t)
    out = {}
    cps = pl.DataFrame(doc["change_points"]) if doc["change_points"] else None
    if cps is not None:
        out["Change points"] = cps.select("name", "label", "delta_pct", "before_us", "after_us", "p").rename(
            {"label": "run"}
        )
    rows = t.rows.with_columns(
        time=pl.col("time_ns").map_elements(iso_time, return_dtype=pl.String), run=pl.col("label")
    )
    for (name,), series in rows.group_by("name", maintain_order=True):
        out[str(name)] = series.sort("order").select(TREND_COLUMNS)
    return out


def format_trend(t, fmt: str, width: int | None = None, columns: list[str] | None = None) -> str:
    """`tracepipe trend` output: json, csv (every row), table / md: the head, the change points,
    then each name's series under its full name; or html (a page with a chart per name)."""
    from pipeline.compare.trend import trend_json

    if fmt == "json":
        return dumps(trend_json(t))
    if fmt == "html":
        from pipeline.render.html import trend_html

        return trend_html(trend_json(t))
    if fmt == "csv":
        return render(pl.DataFrame(trend_json(t)["rows"]), "csv", columns=columns)
    md = fmt == "md"
    runs = t.rows["run"].n_unique()
    found = sum(len(v) for v in t.changes.values())
    head = [
        ("level", f"{t.level}: time per rank and profiler step, {runs} run{'' if runs == 1 else 's'} in time order"),
        (
            "method",
            f"change points by binary segmentation (two-sample t on logs, at least 2 runs each side), false "
            f"discovery rate {t.fdr:g}, minimum change {t.min_effect_pct:g}%: {found} found",
        ),
        *(("problem", p) for p in t.problems),
    ]
    out = [head_text(head, md, width)]
    for title, df in trend_frames(t).items():
        text = render(df, fmt, width=width, columns=columns)
        out.append((f"## {title}\n\n" if md else f"{_fit(title, width)}\n") + text)
    return "\n".join(out)


def write_trend_workbook(t, path) -> None:
    """`trend --format xlsx`: an `about` sheet, the change points and every row."""
    from pipeline.compare.trend import trend_json
    from pipeline.render.workbook import write_workbook
    from pipeline.version import __version__

    doc = trend_json(t)
    sheets = {"rows": pl.DataFrame(doc["rows"])}
    if doc["change_points"]:
        sheets["change_points"] = pl.DataFrame(doc["change_points"])
    write_workbook(
        path, sheets, {"level": t.level, "fdr": t.fdr, "min_effect_pct": t.min_effect_pct, "tracepipe": __version__}
    )
