"""store: where tables live on disk. Parquet settings, atomic directories, lazy scans."""
from __future__ import annotations

import os
import shutil
import tempfile
import uuid
from contextlib import contextmanager
from pathlib import Path

import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq

from . import schema
from .errors import DatasetError

PARQUET_OPTIONS = dict(compression="zstd", compression_level=1, use_dictionary=True, write_statistics=True)
ROW_GROUP_ROWS = 1 << 20
TRACE_SUFFIXES = (".json.gz", ".json.zst", ".json", ".gz", ".zst")


def trace_stem(path: str | os.PathLike) -> str:
    """The file name without .json / .json.gz / .json.zst."""
    b = os.path.basename(str(path))
    for s in TRACE_SUFFIXES:
        if b.endswith(s) and len(b) > len(s):
            return b[: -len(s)]
    return b


class TableWriter:
    """Append record batches of one table to a Parquet file, conforming to its schema."""

    def __init__(self, path: Path, name: str, stages=("flatten",)):
        self.name, self.stages, self.rows = name, stages, 0
        self._schema = schema.table(name).arrow_schema(stages)
        self._writer = pq.ParquetWriter(str(path), self._schema, **PARQUET_OPTIONS)

    def write(self, tbl: pa.Table):
        if tbl.num_rows:
            self._writer.write_table(schema.conform(tbl, self.name, self.stages), row_group_size=ROW_GROUP_ROWS)
            self.rows += tbl.num_rows

    def close(self):
        self._writer.close()


def write_table(tbl: pa.Table, path: Path, name: str, stages=schema.ALL_STAGES):
    pq.write_table(schema.conform(tbl, name, stages), str(path), row_group_size=ROW_GROUP_ROWS, **PARQUET_OPTIONS)


@contextmanager
def atomic_dir(final: Path):
    """Yield a temporary directory beside `final`; on success it replaces `final` by rename.

    On any failure the temporary directory is removed: no half-written output is left.
    """
    final = Path(final)
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.tmp-", dir=final.parent))
    try:
        yield tmp
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    old = None
    if final.exists():
        old = final.parent / f".{final.name}.old-{uuid.uuid4().hex[:8]}"
        os.rename(final, old)
    os.rename(tmp, final)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


@contextmanager
def atomic_file(final: Path):
    """Yield a temporary path beside `final`; it is renamed over `final` on success."""
    final = Path(final)
    final.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{final.name}.tmp-", dir=final.parent)
    os.close(fd)
    try:
        yield Path(tmp)
    except BaseException:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise
    os.replace(tmp, final)


def is_flat_dir(path: str | os.PathLike) -> bool:
    return (Path(path) / "events.parquet").is_file() and (Path(path) / "trace.parquet").is_file()


def scan(flat_dir: str | os.PathLike, name: str) -> pl.LazyFrame:
    """A table of a flattened trace as a polars LazyFrame."""
    if name not in schema.TABLES:
        raise DatasetError(f"no table {name!r}; tables are {', '.join(schema.TABLES)}")
    p = Path(flat_dir) / f"{name}.parquet"
    if not p.is_file():
        raise DatasetError(f"{flat_dir}: not a flattened trace (no {name}.parquet)")
    return pl.scan_parquet(p)
