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

PARQUET_OPTIONS = dict(compression="zstd", compression_level=1, write_statistics=True)
ROW_GROUP_ROWS = 1 << 20
BUFFER_ROWS = 1 << 16  # rows gathered before a write: fewer, larger row groups encode faster
TRACE_SUFFIXES = (".json.gz", ".json.zst", ".json", ".gz", ".zst")


def trace_stem(path: str | os.PathLike) -> str:
    """The file name without .json / .json.gz / .json.zst."""
    b = os.path.basename(str(path))
    for s in TRACE_SUFFIXES:
        if b.endswith(s) and len(b) > len(s):
            return b[: -len(s)]
    return b


def _dictionary_columns(name: str, stages) -> list[str]:
    """Dictionary-encode only the columns declared `dict` (repeated strings); ids and JSON text
    have too many distinct values for a dictionary to pay for its encoding time."""
    return [c.name for c in schema.table(name).columns if c.stage in stages and c.type == "dict"]


class TableWriter:
    """Append tables of one kind to a Parquet file, conforming to its schema, in large row groups."""

    def __init__(self, path: Path, name: str, stages=("flatten",)):
        self.name, self.stages, self.rows = name, stages, 0
        self._schema = schema.table(name).arrow_schema(stages)
        self._writer = pq.ParquetWriter(str(path), self._schema, use_dictionary=_dictionary_columns(name, stages),
                                        **PARQUET_OPTIONS)
        self._pending: list[pa.Table] = []
        self._pending_rows = 0

    def write(self, tbl: pa.Table):
        if tbl.num_rows:
            self._pending.append(schema.conform(tbl, self.name, self.stages))
            self._pending_rows += tbl.num_rows
            self.rows += tbl.num_rows
            if self._pending_rows >= BUFFER_ROWS:
                self._flush()

    def _flush(self):
        if self._pending:
            self._writer.write_table(pa.concat_tables(self._pending), row_group_size=ROW_GROUP_ROWS)
            self._pending, self._pending_rows = [], 0

    def close(self):
        self._flush()
        self._writer.close()


def write_table(tbl: pa.Table, path: Path, name: str, stages=schema.ALL_STAGES):
    pq.write_table(schema.conform(tbl, name, stages), str(path), row_group_size=ROW_GROUP_ROWS,
                   use_dictionary=_dictionary_columns(name, stages), **PARQUET_OPTIONS)


def write_extended(source: Path, extra: pl.DataFrame, path: Path, name: str, key: str = "event_idx"):
    """Write table `name` (all stages) to `path`: the flatten columns of the Parquet file `source`
    with the columns of `extra` beside them, read and written batch by batch, so the wide table is
    never whole in memory. `extra` has one row per row of `source`, in the same order (checked on
    `key`); the columns of `source` that `extra` also has are taken from `extra`."""
    columns = [c for c in schema.table(name).names(("flatten",)) if c not in extra.columns or c == key]
    writer = TableWriter(path, name, schema.ALL_STAGES)
    offset = 0
    for batch in pq.ParquetFile(source).iter_batches(batch_size=BUFFER_ROWS, columns=columns):
        beside = extra.slice(offset, batch.num_rows)
        if not beside[key].to_arrow().equals(batch.column(key)):
            raise ValueError(f"{source}: rows {offset}.. do not line up with the {key} of the columns to add")
        tbl = pa.Table.from_batches([batch])
        for col in beside.drop(key):
            tbl = tbl.append_column(col.name, col.to_arrow())
        writer.write(tbl)
        offset += batch.num_rows
    if offset != extra.height:
        raise ValueError(f"{source}: {offset} rows, but {extra.height} rows of columns to add")
    writer.close()


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
