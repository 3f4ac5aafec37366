"""tables: the tables of a batch dataset, of one flattened trace, or of a folder of flattened
traces, as lazy polars scans with a `trace_id` column: what `query`, `ranks` and the reports read."""

from __future__ import annotations

from pathlib import Path

import polars as pl
import pyarrow as pa

from pipeline import schema, store
from pipeline.dataset.layout import KEY, MANIFEST, MANIFEST_SCHEMA, committed_ids
from pipeline.errors import DatasetError


def _polars_schema(arrow: pa.Schema) -> pl.Schema:
    return pl.from_arrow(arrow.empty_table()).schema


def _declared(name: str) -> pl.Schema:
    if name == MANIFEST:
        return _polars_schema(MANIFEST_SCHEMA)
    s = _polars_schema(schema.table(name).arrow_schema(schema.ALL_STAGES))
    return pl.Schema({k: v for k, v in s.items() if k != KEY})


def is_dataset(path: Path) -> bool:
    return any((path / t).is_dir() for t in (*schema.TABLES, MANIFEST))


def _scan_dataset(ds: Path, name: str, keep: set[str]) -> pl.LazyFrame:
    d = ds / name
    want = _declared(name)
    parts = {p.name.split("=", 1)[1] for p in d.glob(f"{KEY}=*")} if d.is_dir() else set()
    if not parts & keep:
        return pl.LazyFrame(schema={**want, KEY: pl.String})
    lf = pl.scan_parquet(
        str(d / f"{KEY}=*" / "*.parquet"),
        hive_partitioning=True,
        hive_schema={KEY: pl.String},
        schema=want,
        missing_columns="insert",
        extra_columns="ignore",
    )
    if parts - keep:  # a batch run was killed mid-commit: its partitions are not part of the dataset yet
        lf = lf.filter(pl.col(KEY).is_in(sorted(keep)))
    return lf


def _scan_flat(d: Path, name: str) -> pl.LazyFrame:
    lf = store.scan(d, name)
    if name == "trace":
        return lf
    tid = pl.read_parquet(d / "trace.parquet", columns=[KEY])[KEY]
    return lf.with_columns(pl.lit(tid[0] if len(tid) else None, pl.String).alias(KEY))


def flat_dirs(path: Path) -> list[Path]:
    """The flattened traces directly inside a folder (`tracepipe flatten a b -o OUT` makes one per trace)."""
    return [d for d in sorted(path.iterdir()) if store.is_flat_dir(d)] if path.is_dir() else []


def _scan_flat_dirs(dirs: list[Path], name: str) -> pl.LazyFrame:
    want = _declared(name)
    scans = [
        _scan_flat(d, name).select(
            pl.col(c).cast(t) if c in _names(d, name) else pl.lit(None, t).alias(c)
            for c, t in {**want, KEY: pl.String}.items()
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
        keep = committed_ids(path)
        return {n: _scan_dataset(path, n, keep) for n in (*schema.TABLES, MANIFEST) if wanted(n)}
    dirs = flat_dirs(path)
    if dirs:
        return {n: _scan_flat_dirs(dirs, n) for n in schema.TABLES if wanted(n)}
    raise DatasetError(f"{path}: not a batch dataset, a flattened trace or a folder of flattened traces")
