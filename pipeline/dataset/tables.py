"""tables: the tables of a batch dataset, of one flattened trace, or of a folder of flattened
traces, as lazy polars scans with a `trace_id` column: what `query`, `ranks` and the reports read."""

from __future__ import annotations

from pathlib import Path

import polars as pl
import pyarrow as pa

from pipeline import schema, store
from pipeline.dataset.layout import KEY, MANIFEST, MANIFEST_FILE, MANIFEST_SCHEMA, live_parts, manifest, part_files
from pipeline.errors import DatasetError

__all__ = ["scan", "tables", "is_dataset", "flat_dirs"]


def _polars_schema(arrow: pa.Schema) -> pl.Schema:
    return store.frame_from_arrow(arrow.empty_table()).schema


def _declared(name: str) -> pl.Schema:
    if name == MANIFEST:
        return _polars_schema(MANIFEST_SCHEMA)
    s = _polars_schema(schema.table(name).arrow_schema(schema.ALL_STAGES))
    return pl.Schema({k: v for k, v in s.items() if k != KEY})


def is_dataset(path: Path) -> bool:
    return any((path / t).is_dir() for t in (*schema.TABLES, MANIFEST))


def _scan_dataset(ds: Path, name: str, rows: pl.DataFrame) -> pl.LazyFrame:
    """A table of a dataset: the part files its manifest rows name (`layout`), and nothing else (a
    part of a commit that never finished is not read), trace_id a column of each."""
    want = _declared(name)
    columns: dict[str, pl.DataType | type[pl.DataType]] = {**want, KEY: pl.String}
    if name == MANIFEST:
        return rows.drop(MANIFEST_FILE).lazy()
    new, old = dataset_files(ds, name, rows)
    scans = []
    if new:
        scans.append(pl.scan_parquet(new, schema=columns, missing_columns="insert", extra_columns="ignore"))
    if old:  # the one-folder-per-trace layout: trace_id in the path only
        scans.append(
            pl.scan_parquet(
                old,
                hive_partitioning=True,
                hive_schema={KEY: pl.String},
                schema=want,
                missing_columns="insert",
                extra_columns="ignore",
            ).select(list(columns))
        )
    if not scans:
        return pl.LazyFrame(schema=columns)
    return scans[0] if len(scans) == 1 else pl.concat(scans)


def dataset_files(ds: Path, name: str, rows: pl.DataFrame) -> tuple[list[str], list[str]]:
    """The Parquet files of a dataset's table that its manifest `rows` name, and nothing else:
    (part-layout files, each with a trace_id column; legacy files, trace_id in their path)."""
    new, old = part_files(ds, name, live_parts(rows))
    return [f for f in new if Path(f).is_file()], old


def flat_trace_id(d: Path) -> str | None:
    """The trace_id of a flattened trace directory (from its trace table)."""
    tid = pl.read_parquet(d / "trace.parquet", columns=[KEY])[KEY]
    return tid[0] if len(tid) else None


def _scan_flat(d: Path, name: str) -> pl.LazyFrame:
    lf = store.scan(d, name)
    if name == "trace":
        return lf
    return lf.with_columns(pl.lit(flat_trace_id(d), pl.String).alias(KEY))


def flat_dirs(path: Path) -> list[Path]:
    """The flattened traces directly inside a folder (`tracepipe flatten a b -o OUT` makes one per trace)."""
    return [d for d in sorted(path.iterdir()) if store.is_flat_dir(d)] if path.is_dir() else []


def _scan_flat_dirs(dirs: list[Path], name: str) -> pl.LazyFrame:
    want = _declared(name)
    columns: dict[str, pl.DataType | type[pl.DataType]] = {**want, KEY: pl.String}
    scans = [
        _scan_flat(d, name).select(
            pl.col(c).cast(t) if c in _names(d, name) else pl.lit(None, t).alias(c) for c, t in columns.items()
        )
        for d in dirs
        if (d / f"{name}.parquet").is_file()
    ]
    return pl.concat(scans) if scans else pl.LazyFrame(schema={**want, KEY: pl.String})


def _names(d: Path, name: str) -> set[str]:
    return {*pl.scan_parquet(d / f"{name}.parquet").collect_schema().names(), KEY}


def tables(path: str | Path, names=None) -> dict[str, pl.LazyFrame]:
    """Lazy scans of the tables, by name, of a batch dataset, of one flattened trace, or of a
    folder of flattened traces; every table has a `trace_id` column to join on."""
    path = Path(path)
    wanted = lambda n: names is None or n in names
    if store.is_flat_dir(path):
        avail = [n for n in schema.TABLES if (path / f"{n}.parquet").is_file()]
        return {n: _scan_flat(path, n) for n in avail if wanted(n)}
    if path.is_dir() and is_dataset(path):
        rows = manifest(path)
        return {n: _scan_dataset(path, n, rows) for n in (*schema.TABLES, MANIFEST) if wanted(n)}
    dirs = flat_dirs(path)
    if dirs:
        return {n: _scan_flat_dirs(dirs, n) for n in schema.TABLES if wanted(n)}
    raise DatasetError(f"{path}: not a batch dataset, a flattened trace or a folder of flattened traces")


def scan(path: str | Path, table: str, trace: str | None = None) -> pl.LazyFrame:
    """One table as a polars LazyFrame: of a flattened trace (as written), or of a batch dataset or
    a folder of flattened traces (every trace's rows, with their `trace_id`; `trace`: only those of
    the trace it names, by trace_id, stem or part of its path).

    >>> import pipeline, polars as pl
    >>> ops = pipeline.scan("dataset/", "gpu_ops")  # doctest: +SKIP
    >>> ops.group_by("trace_id").agg(pl.col("dur_ns").sum()).collect()  # doctest: +SKIP
    """
    path = Path(path)
    if store.is_flat_dir(path) and trace is None:
        return store.scan(path, table)
    if table not in (*schema.TABLES, MANIFEST):
        raise DatasetError(f"no table {table!r}; tables are {', '.join((*schema.TABLES, MANIFEST))}")
    found = tables(path, [table])
    if table not in found:
        raise DatasetError(f"{path}: has no {table} table")
    if trace is None:
        return found[table]
    from pipeline.dataset.pick import choose

    return found[table].filter(pl.col(KEY) == choose(path, trace))
