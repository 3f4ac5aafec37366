"""tables: one frame written as an aligned text table, Markdown, CSV or JSON rows.

The writers that `analyze`, `diff` (see `documents`) and, later, `query` share: cells are formatted
once here (`cell`: floats to 2 decimals or 3 significant digits, long names cut), and NaN / inf
become empty cells or JSON nulls (`finite`).
"""

from __future__ import annotations

import math

import polars as pl


def finite(df: pl.DataFrame) -> pl.DataFrame:
    """Float NaN / inf as null (JSON has no NaN)."""
    floats = [c for c, t in df.schema.items() if t.is_float()]
    return df.with_columns(pl.when(pl.col(c).is_finite()).then(pl.col(c)).alias(c) for c in floats)


def records(df: pl.DataFrame, drop: tuple[str, ...] = ()) -> list[dict]:
    """The rows as JSON-ready dicts (NaN / inf as None), without the `drop` columns it has."""
    return finite(df.drop([c for c in drop if c in df.columns])).to_dicts()


def dumps(doc: dict) -> str:
    """A JSON document as indented text, with a final newline."""
    import orjson

    return orjson.dumps(doc, option=orjson.OPT_INDENT_2 | orjson.OPT_NON_STR_KEYS).decode() + "\n"


def cell(v, name_limit: int | None) -> str:
    """One value as table / md text (names cut to name_limit characters, with an ellipsis)."""
    if v is None:
        return ""
    if isinstance(v, float):
        if not math.isfinite(v):
            return ""
        a = abs(v)
        return f"{v:.3g}" if a >= 1e6 or (a and a < 0.01) else f"{v:,.2f}"
    if isinstance(v, (list, tuple)):
        return ",".join(cell(x, name_limit) for x in v)
    if isinstance(v, dict):
        return str(v.get("name", v))
    s = str(v)
    return s if not name_limit or len(s) <= name_limit else s[: max(1, name_limit - 1)] + "…"


def render(df: pl.DataFrame, fmt: str, name_limit: int | None = None) -> str:
    """A frame as an aligned text table, Markdown or CSV (names truncated to name_limit in table/md)."""
    if fmt == "csv":
        return _csv(df)
    head = list(df.columns)
    body = [[cell(v, name_limit) for v in row] for row in df.iter_rows()]
    if fmt == "md":
        return _markdown(head, body)
    widths = [max([len(h)] + [len(r[i]) for r in body]) for i, h in enumerate(head)]
    numeric = [df.schema[c].is_numeric() for c in head]
    fmt_row = lambda r: "  ".join(
        c.rjust(w) if n else c.ljust(w) for c, w, n in zip(r, widths, numeric, strict=False)
    ).rstrip()
    return "\n".join([fmt_row(head), fmt_row(["-" * w for w in widths]), *map(fmt_row, body)]) + "\n"


def _csv(df: pl.DataFrame) -> str:
    """Every column but the nested ones (lists, structs), NaN / inf as empty cells."""
    flat_cols = [c for c, t in df.schema.items() if isinstance(t, (pl.List, pl.Struct))]
    return finite(df.drop(flat_cols)).write_csv()


def _markdown(head: list[str], body: list[list[str]]) -> str:
    esc = lambda s: s.replace("|", "\\|")
    lines = ["| " + " | ".join(head) + " |", "|" + "|".join("---" for _ in head) + "|"]
    lines += ["| " + " | ".join(esc(c) for c in r) + " |" for r in body]
    return "\n".join(lines) + "\n"
