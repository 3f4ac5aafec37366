"""table: a frame as an HTML table with every row: sortable and filterable on the page
(`tables.js`), each cell's whole value in `data-value` (`cells`), long names shortened with the
whole name on hover. Built as text, escaped cell by cell: no name reaches the page unescaped.
"""

from __future__ import annotations

from collections.abc import Mapping

import polars as pl

from pipeline.analyses.registry import PCT_MEANINGS
from pipeline.render.html.cells import NAME_CHARS, Cell, cell, kind
from pipeline.render.html.escape import text as esc

FILTER_ROWS = 10  # a longer table gets a filter box


def is_numeric(df: pl.DataFrame, column: str) -> bool:
    return df.schema[column].is_numeric() or df.schema[column] == pl.Boolean


def html_table(
    df: pl.DataFrame,
    caption: str | None = None,
    name_chars: int = NAME_CHARS,
    compact: bool = False,
    meanings: Mapping[str, str] | None = None,
) -> str:
    """`df` as a `<div class="tbl">` holding a filter box, a row count and the table (every row and
    column). `compact`: a small table of the overview (no filter box, no scroll box). `meanings`:
    what columns are (a percentage: of what), on their headers' hover (default: `PCT_MEANINGS`)."""
    meanings = {**PCT_MEANINGS, **(meanings or {})}
    head = list(df.columns)
    numeric = [is_numeric(df, c) for c in head]
    styles = [kind(c) for c in head]
    th = "".join(
        f'<th data-value="{esc(c)}" class="{"num" if n else "txt"}" tabindex="0" '
        f'title="{esc(_header_help(c, s, meanings))}">'
        f"{esc(c)}</th>"
        for c, n, s in zip(head, numeric, styles, strict=True)
    )
    columns = [df.get_column(c).to_list() for c in head]
    body: list[str] = []
    for i in range(df.height):
        tds = "".join(_td(cell(columns[j][i], head[j], styles[j], name_chars), numeric[j]) for j in range(len(head)))
        body.append(f"<tr>{tds}</tr>")
    rows = f"{df.height:,} row{'s' if df.height != 1 else ''}"
    box = (
        '<input type="search" class="filter" placeholder="filter rows" aria-label="filter rows">'
        if df.height > FILTER_ROWS
        else ""
    )
    tools = (
        "" if compact else f'<div class="tools">{box}<span class="count" data-rows="{df.height}">{rows}</span></div>'
    )

    cap = f"<h4>{esc(caption)}</h4>" if caption else ""
    return (
        f'<div class="tbl{" compact" if compact else ""}">{cap}{tools}<div class="scroll"><table>'
        f"<thead><tr>{th}</tr></thead><tbody>{''.join(body)}</tbody></table></div></div>"
    )


def _td(c: Cell, numeric: bool) -> str:
    """A cell: right-aligned numbers by default (the most cells: no class), `t` for text."""
    cls = [] if numeric else ["t p"] if c.prose else ["t"]
    if c.cut:
        cls.append("cut")
    style = ""
    if c.share is not None:
        cls.append("bar")
        style = f' style="--p:{c.share:.1f}%"'
    if c.lines:
        inner = "<br>".join(esc(x) for x in c.lines)
    else:
        inner = esc(c.text)
    attr = f' class="{" ".join(cls)}"' if cls else ""
    return f'<td{attr} data-value="{esc(c.value)}"{style}>{inner}</td>'


def _header_help(column: str, style: str, meanings: Mapping[str, str]) -> str:
    """What a header says on hover: the column's name, what it is (a percentage: of what), and how
    its values are shown."""
    if column in meanings:
        return f"{column}: {meanings[column]}; click to sort"
    how = {
        "time": "a time, shown in the unit that suits each value",
        "pct": "a percentage",
        "bytes": "bytes (k, M, G: powers of 1000)",
        "flops": "floating-point operations (k, M, G, T: powers of 1000)",
        "gbps": "GB/s",
        "tflops": "TFLOP/s",
    }.get(style)
    return f"{column}: {how}; click to sort" if how else f"{column}: click to sort"
