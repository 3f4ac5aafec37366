"""workbook: reports as an Excel workbook (`--format xlsx`), one sheet per section: the file
performance teams pass around. Every row of a section is written (the JSON document's rows, not a
table's top 20), every column; lists are joined with ';', nested records left out (they are in the
JSON document), NaN / inf as empty cells. The first sheet, `about`, says what the workbook holds.
"""

from __future__ import annotations

from pathlib import Path

import polars as pl

from pipeline.errors import UsageError
from pipeline.render.tables import finite

EXCEL_ROWS = 1_048_576  # rows in a sheet, the header included
SHEET_NAME = 31  # characters in a sheet's name


def flat_columns(df: pl.DataFrame) -> pl.DataFrame:
    """Lists of scalars joined by ';', other nested columns left out, NaN / inf as null."""
    lists = [c for c, t in df.schema.items() if isinstance(t, pl.List) and not t.inner.is_nested()]
    df = df.with_columns(pl.col(c).cast(pl.List(pl.String)).list.join(";") for c in lists)
    nested = [c for c, t in df.schema.items() if t.is_nested()]
    return finite(df.drop(nested))


def write_workbook(path: str | Path, sheets: dict[str, pl.DataFrame], about: dict[str, object]) -> None:
    """Write `sheets` (name -> rows, in order) after an `about` sheet of key / value rows to the
    .xlsx file `path` (the caller makes it atomic)."""
    import xlsxwriter

    too_big = [n for n, df in sheets.items() if df.height >= EXCEL_ROWS]
    if too_big:
        n = too_big[0]
        raise UsageError(f"section {n} has {sheets[n].height:,} rows, more than an Excel sheet holds: use csv or json")
    info = pl.DataFrame({"key": list(about), "value": [str(v) for v in about.values()]})
    with xlsxwriter.Workbook(str(path)) as wb:
        info.write_excel(workbook=wb, worksheet="about", autofit=True)
        for name, df in sheets.items():
            df = flat_columns(df)
            if not df.width:
                df = pl.DataFrame({"rows": []})
            df.write_excel(workbook=wb, worksheet=name[:SHEET_NAME], autofit=True, float_precision=3)
