"""source: where the run tables (`runs.tables`) read a trace's events, gpu_ops and flows from: the
Parquet files of its flattened directory, or frames already in memory (a batch group's member,
`dataset.group.run_tables`), which are not written to scratch files only to be read back."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Union

import polars as pl

from pipeline import store

# a flattened trace's directory, or its tables by name
TraceTables = Union[str, Path, Mapping[str, pl.DataFrame]]


def starting_in(since: int | None, until: int | None) -> pl.Expr:
    """Rows whose start (ts_ns) lies in [since, until); None leaves that end open. What the run
    tables read a run of steps or a time cell at a time by (row groups outside it are skipped)."""
    ts = pl.col("ts_ns")
    if since is not None and until is not None:
        return (ts >= since) & (ts < until)
    if since is not None:
        return ts >= since
    return ts < until if until is not None else pl.lit(True)


def scan(tables: TraceTables, name: str) -> pl.LazyFrame:
    """Table `name` of the trace, lazily."""
    if isinstance(tables, Mapping):
        return tables[name].lazy()
    return pl.scan_parquet(Path(tables) / f"{name}.parquet")


def collect(tables: TraceTables, query: pl.LazyFrame) -> pl.DataFrame:
    """A query of `scan`s: streamed from files (the memory stays that of a batch), at once in memory."""
    return query.collect() if isinstance(tables, Mapping) else query.collect(engine="streaming")


def row_ids(tables: TraceTables, name: str, where: pl.Expr) -> pl.Series:
    """The `event_idx` of the rows of table `name` where `where` holds, in order: a read of the
    columns of `where` alone."""
    return collect(tables, scan(tables, name).filter(where).select("event_idx"))["event_idx"]


def collect_rows(tables: TraceTables, name: str, ids: pl.Series, columns: list, rows: int) -> pl.DataFrame:
    """`columns` of the rows of table `name` whose `event_idx` are `ids` (sorted), `rows` of them
    at a time, in order (a row group whose range holds none of them is not read). The memory of a
    read of long texts stays that of `rows` rows and the row groups around them; fewer rows are
    one query. At once for tables in memory."""
    table = scan(tables, name)
    if isinstance(tables, Mapping):
        return table.filter(pl.col("event_idx").is_in(ids.implode())).select(columns).collect()
    if ids.is_empty():  # the columns' types, no row read
        return table.filter(pl.lit(False)).select(columns).collect()
    parts = []
    for start in range(0, ids.len(), rows):
        part = ids.slice(start, rows)
        chosen = pl.col("event_idx").is_between(part.min(), part.max()) & pl.col("event_idx").is_in(part.implode())
        parts.append(table.filter(chosen).select(columns).collect(engine="streaming"))
    return pl.concat(parts)


def has(tables: TraceTables, name: str) -> bool:
    return name in tables if isinstance(tables, Mapping) else (Path(tables) / f"{name}.parquet").is_file()


def batches(tables: TraceTables, name: str, rows: int, columns: list[str]) -> Iterator[pl.DataFrame]:
    """The `columns` of table `name`, `rows` rows at a time, never the whole of a file at once."""
    if isinstance(tables, Mapping):
        yield from tables[name].select(columns).iter_slices(rows)
        return
    for batch in store.read_batches(Path(tables) / f"{name}.parquet", rows, columns, use_threads=False):
        yield store.frame_from_arrow(batch)
