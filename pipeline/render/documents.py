"""documents: what `analyze` and `diff` print, in every report format (`FORMATS`).

The analysis is one JSON document (each device's object holding its per-device sections), its
sections under their titles as text tables or Markdown, or one section as CSV; every choice comes
from the section registry (`pipeline.analyses.registry`). A diff is a JSON document of side-by-side
rows or a table of them. Options are checked before any work is done (`check_options`).
"""

from __future__ import annotations

import re
import textwrap
from dataclasses import dataclass

import polars as pl

from pipeline.analyses.cpu import check_grouping
from pipeline.analyses.diff import SIDE_COLS, diff_summary
from pipeline.analyses.flat import as_flat
from pipeline.analyses.registry import (
    BY_NAME,
    DEVICES,
    IN_DEVICE,
    REGISTRY,
    SECTIONS,
    TOP_LEVEL,
    on_cpu_only,
    pct_meanings,
)
from pipeline.errors import UsageError, did_you_mean
from pipeline.render.findings import duration
from pipeline.render.tables import check_columns, dumps, records, render

FORMATS = ("table", "csv", "json", "md", "xlsx", "html")  # of analyze and diff
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
        said = did_you_mean(unknown[0], SECTIONS)
        raise UsageError(f"unknown section {unknown[0]!r}{said}; sections: {', '.join(SECTIONS)}")
    check_grouping(group_by)


# ------------------------------------------------------------------ analyze
def analysis_json(sections: dict[str, pl.DataFrame], top: int | None = None) -> dict:
    """The JSON document of `analyze`: {"devices": [{device, name, busy_pct, ..., kernels: [...],
    transfers: [...], streams: [...], categories: [...]}], "ops": [...], "launch": [...], ...}: the
    sections computed, each where the registry puts it."""
    out: dict = {}
    listing = next((s.name for s in REGISTRY if s.json == DEVICES), None)
    if listing in sections:
        nested = [s.name for s in REGISTRY if s.json == IN_DEVICE and s.name in sections]
        devices = []
        for d in records(sections[listing], ("start_ns", "end_ns")):
            for name in nested:
                rows = sections[name].filter(pl.col("device") == d["device"])
                d[name] = records(rows.head(top) if top else rows, ("device", "start_ns", "end_ns"))
            devices.append(d)
        out[listing] = devices
    for s in REGISTRY:
        if s.json == TOP_LEVEL and s.name in sections:
            rows = sections[s.name]
            rows = rows.head(top) if top and s.top_in_json else rows
            out[s.key] = s.json_value(rows) if s.json_value else records(rows)
    return out


@dataclass(frozen=True)
class Layout:
    """How text tables are laid out: names cut to `name_limit`, tables fitted to `width` (None: no
    limit), only `columns` (of those a table has; None: the section's own)."""

    name_limit: int | None = 60
    width: int | None = None
    columns: tuple[str, ...] | None = None
    # the trace holds no device activity: a device-time column zero in every row says nothing there
    without_device: bool = False


def render_sections(
    sections: dict[str, pl.DataFrame],
    fmt: str,
    layout: Layout = Layout(),
    top: int | None = None,
    devices: dict[int, str] | None = None,
) -> str:
    """Every non-empty section under its title (table / md); a per-device section as one table per
    device, under the device's id and name (`devices`, default: from the devices section)."""
    names = device_names(sections) if devices is None else devices
    out = []
    for name, df in sections.items():
        if df.height or (name in BY_NAME and BY_NAME[name].text is not None):  # "nothing to fix" is news too
            out.append(_text_section(name, df, fmt, layout, top, names))
    return "\n".join(out)


def device_names(sections: dict[str, pl.DataFrame]) -> dict[int, str]:
    """device id -> name, from the devices section when it was computed."""
    listing = next((s.name for s in REGISTRY if s.json == DEVICES), None)
    df = sections.get(listing) if listing else None
    if df is None or not {"device", "name"} <= set(df.columns):
        return {}
    return dict(zip(df["device"].to_list(), df["name"].to_list()))


def device_labels(f) -> dict[int, str]:
    """device id -> the name the trace gives it (without sweeping the trace)."""
    devs = f.scan("devices").select("device", "name").drop_nulls().collect()
    return dict(zip(devs["device"].to_list(), devs["name"].to_list()))


def _text_section(
    name: str, df: pl.DataFrame, fmt: str, layout: Layout, top: int | None, devices: dict[int, str]
) -> str:
    """One section under its title: each of its tables (`Section.tables`) with its registered
    columns (or the layout's) and top rows; a section not registered: every column, its name as
    title."""
    s = BY_NAME.get(name)
    title = s.title_of(df) if s else name
    head = f"## {title}\n\n" if fmt == "md" else f"{title}\n"
    if s is not None and s.text is not None:
        return head + s.text(df.head(top) if top else df, fmt, layout.width)
    views = s.tables(df) if s else {name: df}
    tables = ("\n" if fmt == "md" else "").join(
        _table(view, rows, s, fmt, layout, top, devices, len(views) > 1) for view, rows in views.items() if rows.height
    )
    columns = dict.fromkeys(c for rows in views.values() for c in rows.columns)
    meanings = pct_meanings(name, columns, cpu_only=on_cpu_only(df))
    return head + tables + _pct_legend(meanings, tables, fmt, layout.width)


def _pct_legend(meanings: dict[str, str], tables: str, fmt: str, width: int | None) -> str:
    """Under a section's tables, what each percentage column they show is a share of."""
    visible = "\n".join(ln for ln in tables.splitlines() if not re.match(r"\(\d+ more: ", ln))  # not the hidden
    shown = [f"{c}: {m}" for c, m in meanings.items() if re.search(rf"(?<![\w]){re.escape(c)}(?![\w])", visible)]
    if not shown:
        return ""
    text = "; ".join(shown)
    if fmt == "md":
        return f"\n*{text}*\n"
    return textwrap.fill(text, width or 100, break_on_hyphens=False) + "\n"


def _table(view: str, df: pl.DataFrame, s, fmt: str, layout: Layout, top, devices: dict[int, str], named: bool) -> str:
    """One table of a section (under its name, when the section has several); a per-device
    section as one table per device, under the device's id and name."""
    per_device = bool(s and s.top_per_device and "device" in df.columns)
    shown = shown_columns(df, s.columns if s and not s.views else None, layout.columns, layout.without_device)
    df = df.select(["device", *(c for c in shown if c != "device")] if per_device else shown)
    table = lambda d: render(d, fmt, layout.name_limit, layout.width)
    label = (f"### {view}\n\n" if fmt == "md" else f"{view}:\n") if named else ""
    if not per_device:  # a section's main view (critical-path's breakdown) is shown whole, the others cut
        whole = bool(s and s.views and view == s.name)
        return label + table(df.head(top) if top and not whole else df)
    parts = []
    for (device,), rows in df.group_by("device", maintain_order=True):
        sub = f"device {device}" + (f": {devices[device]}" if device in devices else "")
        sub = f"### {sub}\n\n" if fmt == "md" else f"{sub}\n"
        parts.append(sub + table((rows.head(top) if top else rows).drop("device")))
    return label + ("\n" if fmt == "md" else "").join(parts)


def shown_columns(
    df: pl.DataFrame, default: tuple[str, ...] | list[str] | None, chosen, without_device: bool = False
) -> list[str]:
    """The columns a table shows: the `chosen` ones it has, in their order, else its `default` ones
    (None: all) but a text column that repeats an earlier one in every row (a CPU-only trace's
    ops stand for its kernels: their cpu_op is their name, 27 of 80 columns said twice) and, on a
    trace `without_device` activity, a device-time column zero or blank in every row (the ops
    table's self_device_us and self_device_pct, as torch's key_averages leaves them out there)."""
    picked = [c for c in chosen or () if c in df.columns]
    if picked:
        return picked
    out: list[str] = []
    for c in (c for c in (default or df.columns) if c in df.columns):
        if without_device and _device_nothing(df, c):
            continue
        if not any(_repeats(df, c, earlier) for earlier in out):
            out.append(c)
    return out


def _device_nothing(df: pl.DataFrame, c: str) -> bool:
    """Column `c` is a number of the device (not its id) that is zero or blank in every row."""
    a = df[c]
    if c == "device" or "device" not in c:
        return False
    a = a.fill_nan(None) if a.dtype.is_float() else a  # a share of no time at all
    if a.null_count() == len(a):
        return True
    return a.dtype.is_numeric() and bool(a.fill_null(0).eq(0).all())


def _repeats(df: pl.DataFrame, c: str, earlier: str) -> bool:
    """Column `c` is text holding, in every row, what `earlier` holds (and something)."""
    a, b = df[c], df[earlier]
    if a.dtype != pl.String or b.dtype != pl.String or a.null_count() == len(a):
        return False
    return bool(a.eq_missing(b).all())


def format_analysis(
    flat,
    sections: dict[str, pl.DataFrame],
    fmt: str = "table",
    name_limit: int | None = 60,
    top: int | None = None,
    only: list[str] | None = None,
    width: int | None = None,
    columns: list[str] | None = None,
) -> str:
    """`analyze` output. json: the whole document (every kernel unless top is given); csv: one
    section (`only`, default kernels), every column (or `columns`); table/md: the chosen sections
    (default all), top rows each (default 20), names cut to name_limit, tables fitted to `width`;
    html: a self-contained page of the chosen sections, every row unless top is given."""
    check_options(fmt, only)
    f = as_flat(flat)
    if fmt == "html":
        from pipeline.render.html import analysis_html

        chosen = {k: v for k, v in sections.items() if not only or k in only}
        return analysis_html(f, chosen, device_names(sections) or device_labels(f), top, _origin_facts(f))
    if fmt == "json":
        return dumps({"trace": {"stem": f.stem, **f.origin, "source": f.source}, **analysis_json(sections, top)})
    if fmt == "csv":
        name = (only or [DEFAULT_CSV_SECTION])[0]
        df = next(iter(analysis_sheets({name: sections[name]}, top).values()))
        check_columns(columns, [df])
        return render(df, "csv", columns=columns)
    chosen = {k: v for k, v in sections.items() if not only or k in only}
    check_columns(columns, list(analysis_sheets(chosen).values()))
    head = f"# {f.stem}\n\n" if fmt == "md" else f"{f.stem}\n\n"
    layout = Layout(name_limit or None, width, tuple(columns) if columns else None, not f.has_gpu)
    top = DEFAULT_TEXT_TOP if top is None else top or None
    return head + render_sections(chosen, fmt, layout, top, device_names(sections) or device_labels(f))


def _origin_facts(f) -> list[tuple[str, str]]:
    """Where a trace was read from (a dataset and its trace_id, a flattened directory), as facts."""
    return [(k.replace("_", " "), str(v)) for k, v in f.origin.items() if v is not None]


def analysis_sheets(sections: dict[str, pl.DataFrame], top: int | None = None) -> dict[str, pl.DataFrame]:
    """The sections as the rows the JSON document holds (nested sections: of the listed devices,
    `top` per device), by section name: the sheets of `--format xlsx`, the files of csv -o DIR."""
    listing = next((s.name for s in REGISTRY if s.json == DEVICES), None)
    devices = sections[listing]["device"] if listing in sections else None
    out: dict[str, pl.DataFrame] = {}
    for name, df in sections.items():
        s = BY_NAME.get(name)
        if s is not None and s.json == IN_DEVICE and devices is not None:
            df = df.filter(pl.col("device").is_in(devices.implode()))
            df = df.group_by("device", maintain_order=True).head(top) if top else df
        elif top and (s is None or s.top_in_json):
            df = df.head(top)
        out |= s.tables(df) if s else {name: df}
    return out


def write_analysis_workbook(flat, sections: dict[str, pl.DataFrame], path, top: int | None = None) -> None:
    """`analyze --format xlsx`: an `about` sheet, then one sheet per section (see `analysis_sheets`)."""
    from pipeline.render.workbook import write_workbook
    from pipeline.version import __version__

    f = as_flat(flat)
    about: dict[str, object] = {"trace": f.stem, "source": f.source, "tracepipe": __version__}
    about |= {f"section {n}": BY_NAME[n].title if n in BY_NAME else n for n in sections}
    write_workbook(path, analysis_sheets(sections, top), about)


# ------------------------------------------------------------------ diff
SHORT_LABEL = 8  # a diff label longer than this is `a` / `b` in the table's headers
DIFF_TEXT_COLUMNS = [  # by importance: a narrow terminal leaves out the last ones
    "key",
    "kind",
    "a_dur_us",
    "b_dur_us",
    "delta_us",
    "ratio",
    "a_count",
    "b_count",
    "a_achieved_flops_pct",
    "b_achieved_flops_pct",
    "a_top",
    "b_top",
]


def diff_json(d: pl.DataFrame, label_a: str = "a", label_b: str = "b", summary: dict | None = None) -> dict:
    """{"labels": {...}, "summary": {total_a_us, total_b_us, matched_pct, ...} (`diff_summary`, of
    every row), "rows": [{"key", "kind", "a": {count, dur_us, ...} | null, "b": ..., "delta_us",
    "ratio"}]}."""
    rows = []
    for r in records(d):
        row = {"key": r["key"], "kind": r["kind"]}
        for side in ("a", "b"):
            present = r[f"{side}_count"] is not None
            row[side] = {c: r[f"{side}_{c}"] for c in SIDE_COLS} if present else None
        row["delta_us"], row["ratio"] = r["delta_us"], r["ratio"]
        rows.append(row)
    return {"labels": {"a": label_a, "b": label_b}, "summary": summary or diff_summary(d), "rows": rows}


def summary_lines(s: dict, label_a: str, label_b: str) -> list[str]:
    """A diff's totals and how much of them matched, as the lines above its table."""
    change = f", {100 * s['delta_us'] / s['total_a_us']:+.1f}%" if s["total_a_us"] else ""
    matched = "nothing" if s["matched_pct"] is None else f"{s['matched_pct']:g}% of the time"
    return [
        f"total: {label_a} {duration(s['total_a_us'])}, {label_b} {duration(s['total_b_us'])} "
        f"({label_b} - {label_a} {'+' if s['delta_us'] >= 0 else '-'}{duration(abs(s['delta_us']))}{change})",
        f"matched: {matched} ({label_a} {s['matched_a_pct']}%, {label_b} {s['matched_b_pct']}%); "
        f"{s['rows_matched']} rows on both sides, {s['rows_only_a']} only in {label_a}, "
        f"{s['rows_only_b']} only in {label_b} (a row on one side only is neither faster nor slower)",
    ]


def diff_text(
    d: pl.DataFrame,
    fmt: str,
    label_a: str,
    label_b: str,
    name_limit: int | None = None,
    top: int | None = None,
    width: int | None = None,
) -> str:
    """The diff's main columns as a table / md, a_* and b_* named after the labels; labels longer
    than SHORT_LABEL become `a` and `b` in the headers, named in a line above the table."""
    top_name = lambda s: pl.col(f"{s}_top_kernels").list.first().struct.field("name")
    t = d.with_columns(a_top=top_name("a"), b_top=top_name("b")).select(DIFF_TEXT_COLUMNS)
    legend = ""
    if max(len(label_a), len(label_b)) > SHORT_LABEL:
        legend = f"a: {label_a}\nb: {label_b}\n" + ("\n" if fmt == "md" else "")
        label_a, label_b = "a", "b"
    summary = [f"- {line}" if fmt == "md" else line for line in summary_lines(diff_summary(d), label_a, label_b)]
    if width and fmt != "md":  # each line within the width, its continuation indented
        summary = [textwrap.fill(line, width, subsequent_indent="  ", break_on_hyphens=False) for line in summary]
    legend += "\n".join(summary) + "\n\n"
    t = t.rename(
        {
            c: c.replace("a_", f"{label_a}:", 1) if c.startswith("a_") else c.replace("b_", f"{label_b}:", 1)
            for c in t.columns
            if c.startswith(("a_", "b_"))
        }
    )
    return legend + render(t.head(top) if top else t, fmt, name_limit, width)


def format_diff(
    d: pl.DataFrame,
    fmt: str = "table",
    label_a: str = "a",
    label_b: str = "b",
    name_limit: int | None = 60,
    top: int | None = None,
    width: int | None = None,
) -> str:
    """`diff` output: json {"labels", "rows": [...]}, a table / md / csv of the rows, or an html page."""
    check_options(fmt)
    if fmt == "html":
        from pipeline.render.html import diff_html

        return diff_html(d.head(top) if top else d, label_a, label_b, summary=diff_summary(d))
    if fmt == "json":
        return dumps(diff_json(d.head(top) if top else d, label_a, label_b, diff_summary(d)))
    if fmt == "csv":
        return render(d.head(top) if top else d, "csv")
    return diff_text(d, fmt, label_a, label_b, name_limit or None, top, width)


def write_diff_workbook(d: pl.DataFrame, path, label_a: str = "a", label_b: str = "b", top: int | None = None) -> None:
    """`diff --format xlsx`: an `about` sheet naming A and B, then the side-by-side rows (every
    column; each side's top kernels as text)."""
    from pipeline.render.workbook import write_workbook
    from pipeline.version import __version__

    summary = diff_summary(d)
    rows = d.head(top) if top else d
    tops = {c: pl.col(c).list.eval(pl.element().struct.field("name")) for c in ("a_top_kernels", "b_top_kernels")}
    rows = rows.with_columns(v.alias(c) for c, v in tops.items() if c in rows.columns)
    write_workbook(path, {"diff": rows}, {"a": label_a, "b": label_b, **summary, "tracepipe": __version__})
