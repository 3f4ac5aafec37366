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


def scan(tables: TraceTables, name: str) -> pl.LazyFrame:
    """Table `name` of the trace, lazily."""
    if isinstance(tables, Mapping):
        return tables[name].lazy()
    return pl.scan_parquet(Path(tables) / f"{name}.parquet")


def collect(tables: TraceTables, query: pl.LazyFrame) -> pl.DataFrame:
    """A query of `scan`s: streamed from files (the memory stays that of a batch), at once in memory."""
    return query.collect() if isinstance(tables, Mapping) else query.collect(engine="streaming")


def has(tables: TraceTables, name: str) -> bool:
    return name in tables if isinstance(tables, Mapping) else (Path(tables) / f"{name}.parquet").is_file()


def batches(tables: TraceTables, name: str, rows: int, columns: list[str]) -> Iterator[pl.DataFrame]:
    """The `columns` of table `name`, `rows` rows at a time, never the whole of a file at once."""
    if isinstance(tables, Mapping):
        yield from tables[name].select(columns).iter_slices(rows)
        return
    for batch in store.read_batches(Path(tables) / f"{name}.parquet", rows, columns, use_threads=False):
        yield store.frame_from_arrow(batch)
