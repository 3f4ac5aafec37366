"""analysis: the page of `analyze --format html`: what to fix (the findings), the overview, then
every section the analysis computed, in the registry's order, as the JSON document has it.

Nothing here names a section to show it: each is `<section data-section="KEY">` (its key in the
JSON document), titled and explained by its registry entry (`Section.title`, `.help`), holding a
table per view (`Section.tables`), per device for a section nested in the devices' objects. So an
analysis added to the registry appears on the page with no change here. A few sections also get a
chart (`SECTION_CHARTS`: timelines that zoom, a breakdown) above their tables.
"""

from __future__ import annotations

from collections.abc import Callable

import polars as pl

import pipeline.render.html.charts as ch
from pipeline.analyses.flat import Flat, as_flat
from pipeline.analyses.memory import memory_series
from pipeline.analyses.queue import queue_series
from pipeline.analyses.registry import BY_NAME, DEVICES, IN_DEVICE, on_cpu_only, pct_meanings
from pipeline.render.html.cells import duration, engineering_bytes
from pipeline.render.html.model import Chart, Findings, Note, Page, Part, Section, Table
from pipeline.render.html.overview import overview
from pipeline.render.html.page import anchor, render_page

SMALL_MEMORY = 0.001  # a device whose memory never reaches this share of the largest peak gets no timeline
TIMELINE_POINTS = 6000  # per device or stream: enough to zoom into (every peak kept, see memory_series)
POSITION_COLUMNS = ("start_ns", "end_ns")  # left out of the JSON document's devices and streams, and here


def analysis_html(
    flat, sections: dict[str, pl.DataFrame], devices: dict[int, str], top: int | None = None, facts=()
) -> str:
    """The page of `analyze`: `sections` as analyze computed them (registry order), `devices`
    device id -> name, `top` rows per section (per device) when given (default: every row)."""
    f = as_flat(flat)
    named = {d: n for d, n in devices.items() if n}
    return render_page(*analysis_page(f, sections, named, top, list(facts)))


def analysis_page(
    f: Flat, sections: dict[str, pl.DataFrame], devices: dict[int, str], top: int | None = None, facts=None
) -> tuple[Page, list[tuple[str, str]]]:
    """(the page, the sections with nothing to show)."""
    page = Page(f.stem, "trace analysis", facts=[("source", f.source or str(f.path)), *(facts or [])])
    names = ", ".join(f"{d}: {n}" for d, n in sorted(devices.items()) if d >= 0)
    if names:
        page.facts.append(("devices", names))
    page.overview = overview(f, sections, devices)
    empty = []
    links = {n: anchor(BY_NAME[n].key) for n, df in sections.items() if n in BY_NAME and df.height}
    for name, df in sections.items():
        s = BY_NAME.get(name)
        if s is not None and s.lead:  # what to fix: first, and said even when there is nothing
            sec = Section(s.title, name=s.key, help=s.help, lead=True)
            sec.parts = [Findings(tuple(df.to_dicts()), links)]
            page.sections.append(sec)
            continue
        if not df.height:
            empty.append((s.key if s else name, s.help if s else ""))
            continue
        sec = Section(s.title_of(df) if s else name, name=s.key if s else name, help=s.help if s else "")
        if name in SECTION_CHARTS:
            sec.parts += SECTION_CHARTS[name](f, df, devices)
        sec.parts += section_tables(name, df, devices, top)
        page.sections.append(sec)
    return page, empty


def section_tables(name: str, df: pl.DataFrame, devices: dict[int, str], top: int | None = None) -> list[Part]:
    """The tables of a section: each of its views (`Section.tables`) with the registry's columns
    first, then the others; a per-device section (nested in the devices' objects in JSON) as one
    table per device, under the device's id and name."""
    s = BY_NAME.get(name)
    views = s.tables(df) if s else {name: df}
    parts: list[Part] = []
    for view, rows in views.items():
        if not rows.height:
            continue
        caption = view if len(views) > 1 else None
        per_device = bool(s and (s.json == IN_DEVICE or s.top_per_device) and "device" in rows.columns)
        rows = rows.select(ordered_columns(rows, s.columns if s and not s.views else None))
        if s is not None and s.json in (DEVICES, IN_DEVICE):
            rows = rows.drop([c for c in POSITION_COLUMNS if c in rows.columns])
        meanings = pct_meanings(name, rows.columns, cpu_only=on_cpu_only(rows))
        if not per_device:
            cut = bool(top and s is not None and s.top_in_json)
            parts.append(Table(rows.head(top) if top and cut else rows, caption, meanings=meanings))
            continue
        for (device,), mine in rows.group_by("device", maintain_order=True):
            label = f"device {device}" + (f": {devices[device]}" if device in devices else "")
            mine = mine.drop("device")
            title = f"{caption}: {label}" if caption else label
            parts.append(Table(mine.head(top) if top else mine, title, meanings=meanings))
    return parts


def ordered_columns(df: pl.DataFrame, first: tuple[str, ...] | None) -> list[str]:
    """The registry's columns of a table (those it has), then every other column."""
    lead = [c for c in first or () if c in df.columns]
    return lead + [c for c in df.columns if c not in lead]


# ------------------------------------------------------------------ charts of sections
def memory_chart(f: Flat, peaks: pl.DataFrame, devices: dict[int, str]) -> list[Part]:
    """Per device (CPU is -1), Total Allocated and Total Reserved over time; the peak marked."""
    series = memory_series(f, TIMELINE_POINTS)
    out: list[Part] = []
    most = series.group_by("device").agg(
        pl.max_horizontal(pl.col("allocated_bytes", "reserved_bytes").max()).alias("m")
    )
    most_of = dict(most.iter_rows())
    largest = max(most_of.values(), default=0) or 0
    small = [d for d, m in sorted(most_of.items()) if (m or 0) < largest * SMALL_MEMORY]
    for d in sorted(series["device"].unique().to_list(), key=lambda d: (d < 0, d)):
        mine = series.filter(pl.col("device") == d)
        if d in small or not most_of.get(d):
            continue
        curves = [
            {
                "name": "allocated",
                "color": "#4c72b0",
                "x": mine["t_us"].to_list(),
                "y": mine["allocated_bytes"].to_list(),
            },
            {
                "name": "reserved",
                "color": "#dd8452",
                "y": mine["reserved_bytes"].to_list(),  # at the x of the first curve
            },
        ]
        marks = []
        peak = peaks.filter(pl.col("device") == d)
        if peak.height and peak["peak_allocated_bytes"][0]:
            p = peak.row(0, named=True)
            op = f" in {p['peak_op']}" if p.get("peak_op") else ""
            marks.append({"x": p["peak_at_us"], "y": p["peak_allocated_bytes"], "label": f"peak{op}"})
        who = "CPU (device -1)" if d < 0 else f"device {d}" + (f": {devices[d]}" if d in devices else "")
        spec = ch.lines(
            f"Memory over time: {who}",
            ch.axis("time from the trace's first event", "us"),
            ch.axis("bytes", "bytes"),
            curves,
            marks,
            "Drag across the chart to zoom into a time range; double-click to zoom out.",
        )
        out.append(Chart(spec))
    if small:
        said = ", ".join(
            f"{'CPU' if d < 0 else f'device {d}'} (peak {engineering_bytes(most_of[d] or 0)})" for d in small
        )
        out.append(Note(f"Not drawn, under {SMALL_MEMORY:.1%} of the largest peak: {said}; see the table."))
    return out


def queue_chart(f: Flat, _q: pl.DataFrame, devices: dict[int, str]) -> list[Part]:
    """Per device, the launch queue's depth over time, a curve per stream."""
    series = queue_series(f, TIMELINE_POINTS)
    out: list[Part] = []
    for d in series["device"].unique().sort().to_list():
        mine = series.filter(pl.col("device") == d)
        curves = [
            {"name": f"stream {s}", "color": ch.colour(i), "x": g["t_us"].to_list(), "y": g["depth"].to_list()}
            for i, ((s,), g) in enumerate(mine.group_by("stream", maintain_order=True))
        ]
        who = f"device {d}" + (f": {devices[d]}" if d in devices else "")
        spec = ch.lines(
            f"Launch queue depth: {who}",
            ch.axis("time from the trace's first event", "us"),
            ch.axis("activities launched, not started", "count"),
            curves,
            note="A deep queue: the CPU runs ahead of the device (good); near 0: the device waits for launches. "
            "Drag to zoom; double-click to zoom out.",
        )
        out.append(Chart(spec))
    return out


def critical_path_chart(_f: Flat, row: pl.DataFrame, _d: dict[int, str]) -> list[Part]:
    d = row.row(0, named=True)
    parts = {k: v or 0.0 for k, v in (d.get("breakdown_us") or {}).items()}
    length = d.get("length_us") or 0.0
    if not length:
        return []
    rows = [
        ch.bar(k, [v], f"{duration(v)} · {100 * v / length:.1f}%")
        for k, v in sorted(parts.items(), key=lambda kv: -kv[1])
    ]
    title = f"Critical path: {duration(length)}, by what it spent its time on"
    return [Chart(ch.bars(title, rows, "us"))]


def communication_chart(_f: Flat, df: pl.DataFrame, devices: dict[int, str]) -> list[Part]:
    segs = ch.series(
        ["overlapped with compute", "exposed"], {"overlapped with compute": "#55a868", "exposed": "#c44e52"}
    )
    rows = [
        ch.bar(f"device {r['device']}", [r["overlapped_us"] or 0.0, r["exposed_us"] or 0.0])
        for r in df.to_dicts()
        if r.get("comm_busy_us")
    ]
    return [Chart(ch.bars("Communication: overlapped and exposed time", rows, "us", segs))] if rows else []


SECTION_CHARTS: dict[str, Callable[[Flat, pl.DataFrame, dict[int, str]], list[Part]]] = {
    "memory": memory_chart,
    "queue": queue_chart,
    "critical-path": critical_path_chart,
    "communication": communication_chart,
}
