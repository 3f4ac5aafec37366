"""charts: the data of the page's charts, drawn as SVG by `charts.js` (no charting library).

A chart is a JSON object (`spec`) of one of four kinds, made here so that its contents are
tested in Python and its drawing is the script's alone:

    bars      rows of horizontal bars, each split in segments (`series`); values in `unit`;
              `signed`: bars either side of zero (a diff's changes)
    scatter   points (x, y, radius, series, tooltip lines) on linear or log axes, with straight
              `lines` (a roofline's roofs)
    lines     series of (x, y) over time, drawn as steps or lines, zoomable (drag, double-click),
              `marks` named (a peak)
    heatmap   a value per (row, column) (a rank x step grid), null where there is none

Units (`unit`, an axis' `unit`): us (a time in µs), pct, bytes, flops, gbps, count, plain.
Every text in a spec is data (names from the trace among it): the script puts it on the page as
text, never as markup.
"""

from __future__ import annotations

import math

from pipeline.render.tables import shorten

LABEL_CHARS = 48  # a name in a chart is shortened to this many characters (whole in its tooltip)
PALETTE = ("#4c72b0", "#dd8452", "#55a868", "#c44e52", "#8172b3", "#937860", "#da8bc3", "#8c8c8c", "#ccb974")
BUSY, IDLE, TRANSFER = "#4c72b0", "#d9dde3", "#9ab8de"


def colour(i: int) -> str:
    return PALETTE[i % len(PALETTE)]


def series(names: list[str], colours: dict[str, str] | None = None) -> list[dict]:
    """Named segments or series, each its colour (from `colours`, else the palette in order)."""
    return [{"name": n, "color": (colours or {}).get(n, colour(i))} for i, n in enumerate(names)]


def num(v: object) -> float | None:
    """A finite float, else None (JSON null)."""
    if v is None:
        return None
    f = float(v)  # type: ignore[arg-type]
    return f if math.isfinite(f) else None


def bar(
    label: str,
    values: list[float | None],
    text: str | None = None,
    tip: list[str] | None = None,
    full: str | None = None,
    **extra,
) -> dict:
    """One row of a bars chart: `label` shortened (whole in `full`, unless given), a value per segment."""
    row = {"label": shorten(label, LABEL_CHARS), "full": full or label, "values": [num(v) or 0.0 for v in values]}
    if text is not None:
        row["text"] = text
    if tip:
        row["tip"] = tip
    return row | extra


def bars(
    title: str,
    rows: list[dict],
    unit: str,
    segments: list[dict] | None = None,
    note: str | None = None,
    max_value: float | None = None,
    signed: bool = False,
) -> dict:
    """A bars chart (see the module docstring); `segments` name the values of each row (one
    unnamed segment by default)."""
    spec: dict = {"kind": "bars", "title": title, "unit": unit, "rows": rows, "series": segments or series([""])}
    if note:
        spec["note"] = note
    if max_value is not None:
        spec["max"] = max_value
    if signed:
        spec["signed"] = True
    return spec


def axis(label: str, unit: str = "plain", log: bool = False) -> dict:
    return {"label": label, "unit": unit, "log": log}


def scatter(
    title: str,
    x: dict,
    y: dict,
    points: list[dict],
    groups: list[dict],
    lines: list[dict] | None = None,
    note: str | None = None,
) -> dict:
    """Points {x, y, r (px), s (index of its group), tip: [lines]}; lines {name, color, points:
    [[x, y], ...], dash}."""
    spec = {"kind": "scatter", "title": title, "x": x, "y": y, "points": points, "series": groups}
    spec["lines"] = lines or []
    if note:
        spec["note"] = note
    return spec


def lines(
    title: str,
    x: dict,
    y: dict,
    curves: list[dict],
    marks: list[dict] | None = None,
    note: str | None = None,
    step: bool = True,
) -> dict:
    """Curves {name, color, x: [...], y: [...]} (x ascending; a curve without x has the first's);
    marks {x, y, label}."""
    spec = {"kind": "lines", "title": title, "x": x, "y": y, "series": curves, "marks": marks or [], "step": step}
    if note:
        spec["note"] = note
    return spec


def heatmap(
    title: str,
    rows: list[str],
    columns: list[str],
    values: list[list[float | None]],
    unit: str,
    row_label: str,
    column_label: str,
    note: str | None = None,
) -> dict:
    spec = {
        "kind": "heatmap",
        "title": title,
        "rows": rows,
        "cols": columns,
        "values": [[num(v) for v in r] for r in values],
        "unit": unit,
        "rowLabel": row_label,
        "colLabel": column_label,
    }
    if note:
        spec["note"] = note
    return spec
