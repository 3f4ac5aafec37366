"""documents: what `analyze` and `diff` print, in every report format (`FORMATS`).

The analysis is one JSON document (each device's object holding its per-device sections), its
sections under their titles as text tables or Markdown, or one section as CSV; every choice comes
from the section registry (`pipeline.analyses.registry`). A diff is a JSON document of side-by-side
rows or a table of them. Options are checked before any work is done (`check_options`).
"""

from __future__ import annotations

import polars as pl

from pipeline.analyses.cpu import check_grouping
from pipeline.analyses.diff import SIDE_COLS
from pipeline.analyses.flat import as_flat
from pipeline.analyses.registry import BY_NAME, DEVICES, IN_DEVICE, REGISTRY, SECTIONS, TOP_LEVEL
from pipeline.errors import UsageError
from pipeline.render.tables import dumps, records, render

FORMATS = ("table", "csv", "json", "md")  # of analyze and diff
DEFAULT_TEXT_TOP = 20  # rows per section (per device) in table / md
DEFAULT_CSV_SECTION = "kernels"
# What table / md show of each section (None: every column) and its title: views of the registry.
TEXT_COLUMNS = {s.name: list(s.columns) if s.columns else None for s in REGISTRY}
TITLES = {s.name: s.title for s in REGISTRY}


def check_options(fmt: str, only: list[str] | None = None, group_by: str | None = None):
    """Raise UsageError for a bad format, section or grouping (before any work is done)."""
    if fmt not in FORMATS:
        raise UsageError(f"--format must be one of {', '.join(FORMATS)} (got {fmt!r})")
    unknown = [s for s in only or [] if s not in SECTIONS]
    if unknown:
        raise UsageError(f"unknown section {unknown[0]!r}; sections: {', '.join(SECTIONS)}")
    if fmt == "csv" and only and len(only) != 1:
        raise UsageError("--format csv writes one section: give one --section")
    check_grouping(group_by)


# ------------------------------------------------------------------ analyze
def analysis_json(sections: dict[str, pl.DataFrame], top: int | None = None) -> dict:
    """The JSON document of `analyze`: {"devices": [{device, name, busy_pct, ..., kernels: [...],
    transfers: [...], streams: [...], categories: [...]}], "ops": [...], "launch": [...], ...}."""
    (listing,) = (s.name for s in REGISTRY if s.json == DEVICES)
    nested = [s.name for s in REGISTRY if s.json == IN_DEVICE]
    devices = []
    for d in records(sections[listing], ("start_ns", "end_ns")):
        for name in nested:
            rows = sections[name].filter(pl.col("device") == d["device"])
            d[name] = records(rows.head(top) if top else rows, ("device", "start_ns", "end_ns"))
        devices.append(d)
    out: dict = {listing: devices}
    for s in REGISTRY:
        if s.json == TOP_LEVEL:
            rows = sections[s.name]
            out[s.name] = records(rows.head(top) if top and s.top_in_json else rows)
    return out


def render_sections(
    sections: dict[str, pl.DataFrame], fmt: str, name_limit: int | None = None, top: int | None = None
) -> str:
    """Every non-empty section under its title (table / md)."""
    out = []
    for name, df in sections.items():
        if df.height:
            out.append(_text_section(name, df, fmt, name_limit, top))
    return "\n".join(out)


def _text_section(name: str, df: pl.DataFrame, fmt: str, name_limit: int | None, top: int | None) -> str:
    """One section's table under its title: its registered columns and top rows (a section not
    registered: every column, the top rows, its name as title)."""
    s = BY_NAME.get(name)
    df = df.select([c for c in ((s.columns if s else None) or df.columns) if c in df.columns])
    if top and s and s.top_per_device:
        df = df.group_by("device", maintain_order=True).head(top)
    elif top:
        df = df.head(top)
    title = s.title if s else name
    return (f"## {title}\n\n" if fmt == "md" else f"{title}\n") + render(df, fmt, name_limit)


def format_analysis(
    flat,
    sections: dict[str, pl.DataFrame],
    fmt: str = "table",
    name_limit: int | None = 60,
    top: int | None = None,
    only: list[str] | None = None,
) -> str:
    """`analyze` output. json: the whole document (every kernel unless top is given); csv: one
    section (`only`, default kernels), every column; table/md: the chosen sections (default all),
    top rows each (default 20), names cut to name_limit."""
    check_options(fmt, only)
    f = as_flat(flat)
    if fmt == "json":
        where = {"source": f.source} if f.flatten_result else {"flat_dir": str(f.path), "source": f.source}
        return dumps({"trace": {"stem": f.stem, **where}, **analysis_json(sections, top)})
    if fmt == "csv":
        df = sections[(only or [DEFAULT_CSV_SECTION])[0]]
        return render(df.head(top) if top else df, "csv")
    chosen = {k: v for k, v in sections.items() if not only or k in only}
    head = f"# {f.stem}\n\n" if fmt == "md" else f"{f.stem}\n\n"
    return head + render_sections(chosen, fmt, name_limit or None, DEFAULT_TEXT_TOP if top is None else top or None)


# ------------------------------------------------------------------ diff
DIFF_TEXT_COLUMNS = [
    "key",
    "kind",
    "a_count",
    "a_dur_us",
    "b_count",
    "b_dur_us",
    "delta_us",
    "ratio",
    "a_achieved_flops_pct",
    "b_achieved_flops_pct",
    "a_top",
    "b_top",
]


def diff_json(d: pl.DataFrame, label_a: str = "a", label_b: str = "b") -> dict:
    """{"labels": {...}, "rows": [{"key", "kind", "a": {count, dur_us, ...} | null, "b": ...,
    "delta_us", "ratio"}]}."""
    rows = []
    for r in records(d):
        row = {"key": r["key"], "kind": r["kind"]}
        for side in ("a", "b"):
            present = r[f"{side}_count"] is not None
            row[side] = {c: r[f"{side}_{c}"] for c in SIDE_COLS} if present else None
        row["delta_us"], row["ratio"] = r["delta_us"], r["ratio"]
        rows.append(row)
    return {"labels": {"a": label_a, "b": label_b}, "rows": rows}


def diff_text(
    d: pl.DataFrame, fmt: str, label_a: str, label_b: str, name_limit: int | None = None, top: int | None = None
) -> str:
    """The diff's main columns as a table / md, a_* and b_* named after the labels."""
    top_name = lambda s: pl.col(f"{s}_top_kernels").list.first().struct.field("name")
    t = d.with_columns(a_top=top_name("a"), b_top=top_name("b")).select(DIFF_TEXT_COLUMNS)
    t = t.rename(
        {
            c: c.replace("a_", f"{label_a}:", 1) if c.startswith("a_") else c.replace("b_", f"{label_b}:", 1)
            for c in t.columns
            if c.startswith(("a_", "b_"))
        }
    )
    return render(t.head(top) if top else t, fmt, name_limit)


def format_diff(
    d: pl.DataFrame,
    fmt: str = "table",
    label_a: str = "a",
    label_b: str = "b",
    name_limit: int | None = 60,
    top: int | None = None,
) -> str:
    """`diff` output: json {"labels", "rows": [...]}, or a table / md / csv of the rows."""
    check_options(fmt)
    if fmt == "json":
        return dumps(diff_json(d.head(top) if top else d, label_a, label_b))
    if fmt == "csv":
        return render(d.head(top) if top else d, "csv")
    return diff_text(d, fmt, label_a, label_b, name_limit or None, top)
