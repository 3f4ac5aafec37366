"""source: where the run tables (`runs.tables`) read a trace's events, gpu_ops and flows from: the
Parquet files of its flattened directory, or frames already in memory (a batch group's member,
`dataset.group.run_tables`), which are not written to scratch files only to be read back."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Union

import polars as pl
import pyarrow.parquet as pq

from pipeline import store

# a flattened trace's directory, or its tables by name
TraceTables = Union[str, Path, Mapping[str, pl.DataFrame]]


def scan(tables: TraceTables, name: str) -> pl.LazyFrame:
    """Table `name` of the trace, lazily."""
    if isinstance(tables, Mapping):
        return tables[name].lazy()
    return pl.scan_parquet(Path(tables) / f"{name}.parquet")


def collect(tables: TraceTables, query: pl.LazyFrame) -> pl.DataFrame:
    """A query of `scan`s: streamed from files (the memory stays that of a batch), at once in memory."""
    return query.collect() if isinstance(tables, Mapping) else query.collect(engine="streaming")


def collect_by_slices(
    tables: TraceTables, name: str, query: Callable[[pl.LazyFrame], pl.LazyFrame], rows: int
) -> pl.DataFrame:
    """`query` of table `name`, run on `rows` of its rows at a time and the results put together
    (the query must be one of rows alone, as a filter and a select are): the memory of a read of
    long texts stays that of a slice of them. At once for tables in memory."""
    if isinstance(tables, Mapping):
        return query(tables[name].lazy()).collect()
    path = Path(tables) / f"{name}.parquet"
    table = pl.scan_parquet(path)
    total = pq.ParquetFile(path).metadata.num_rows
    parts = [query(table.slice(start, rows)).collect(engine="streaming") for start in range(0, total, rows)]
    return pl.concat(parts) if parts else query(table).collect()


def has(tables: TraceTables, name: str) -> bool:
    return name in tables if isinstance(tables, Mapping) else (Path(tables) / f"{name}.parquet").is_file()


def batches(tables: TraceTables, name: str, rows: int, columns: list[str]) -> Iterator[pl.DataFrame]:
    """The `columns` of table `name`, `rows` rows at a time, never the whole of a file at once."""
    if isinstance(tables, Mapping):
        yield from tables[name].select(columns).iter_slices(rows)
        return
    for batch in store.read_batches(Path(tables) / f"{name}.parquet", rows, columns, use_threads=False):
        yield store.frame_from_arrow(batch)
