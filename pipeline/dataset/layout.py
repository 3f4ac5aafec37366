"""layout: where a dataset keeps its tables, and how a trace enters it atomically.

    DATASET/<table>/trace_id=<id>/part-0.parquet   table: events gpu_ops flows devices trace
    DATASET/traces/trace_id=<id>/part-0.parquet    one manifest row per input content
    DATASET/_staging/                              work in progress (removed on the next start)

`trace_id` is `t` + the first 16 hex digits of the BLAKE2b hash of the file's bytes: the same
content is the same trace wherever it lies, and the letter keeps DuckDB and polars from reading
the partition value as a number. It lives only in the directory name: read with hive partitioning.

Commit: a trace's partitions are renamed into place, its manifest row last; a trace is in the
dataset only when its manifest row is. On start a run removes `_staging/` and any partition
without a manifest row, so a run killed at any moment (kill -9) leaves neither duplicates nor
orphans.
"""

from __future__ import annotations

import fcntl
import os
import shutil
from contextlib import contextmanager
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from pipeline import schema
from pipeline.dataset.inputs import Item
from pipeline.errors import DatasetError
from pipeline.version import __version__

TABLES = schema.TABLES


MANIFEST = schema.MANIFEST


PART = "part-0.parquet"


KEY = "trace_id"


STAGING = "_staging"


MANIFEST_SCHEMA = schema.table(MANIFEST).arrow_schema()  # declared in schemas/traces.toml


@contextmanager
def locked(ds: Path):
    fd = os.open(ds / ".lock", os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise DatasetError(f"{ds}: another `tracepipe batch` is writing this dataset") from None
        yield
    finally:
        os.close(fd)


def committed_ids(ds: Path) -> set[str]:
    """Ids whose manifest row exists: exactly the traces that are in the dataset."""
    d = ds / MANIFEST
    if not d.is_dir():
        return set()
    return {p.name.split("=", 1)[1] for p in d.iterdir() if p.name.startswith(f"{KEY}=") and (p / PART).is_file()}


def recover(ds: Path) -> set[str]:
    """Remove what an interrupted run left: staging, and partitions without a manifest row."""
    shutil.rmtree(ds / STAGING, ignore_errors=True)
    keep = committed_ids(ds)
    for name in (*TABLES, MANIFEST):
        d = ds / name
        if d.is_dir():
            for p in d.iterdir():
                if p.name.startswith(f"{KEY}=") and p.name.split("=", 1)[1] not in keep:
                    shutil.rmtree(p) if p.is_dir() else p.unlink()
    return keep


def read_manifest(ds: Path) -> dict[str, dict]:
    """trace_id -> {path, status, error} of every committed manifest row."""
    if not committed_ids(ds):
        return {}
    import pyarrow.dataset as pads

    t = pads.dataset(ds / MANIFEST, format="parquet", partitioning="hive").to_table(
        columns=[KEY, "path", "status", "error"]
    )
    return {r[KEY]: r for r in t.to_pylist()}


def commit(ds: Path, stage: Path, item: Item, facts: dict):
    """Move a staged trace's partitions into the dataset, then its manifest row (last)."""
    part = f"{KEY}={item.trace_id}"
    if facts["status"] != "quarantined":
        for name in TABLES:
            dst = ds / name / part
            dst.parent.mkdir(parents=True, exist_ok=True)
            if dst.exists():  # an orphan of a run killed mid-commit (no manifest row): replace it
                shutil.rmtree(dst)
            os.rename(stage / name / part, dst)
    row = {
        "path": item.source,
        "size": item.size,
        "content_hash": item.content_hash,
        "tracepipe_version": __version__,
        **facts,
    }
    mdir = stage / MANIFEST / part
    mdir.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist([row], schema=MANIFEST_SCHEMA), mdir / PART)
    (ds / MANIFEST).mkdir(exist_ok=True)
    os.rename(mdir, ds / MANIFEST / part)
    shutil.rmtree(stage, ignore_errors=True)


def uncommit(ds: Path, trace_id: str):
    """Take back what a failed commit moved into the dataset (partitions without a manifest row)."""
    part = f"{KEY}={trace_id}"
    if (ds / MANIFEST / part / PART).is_file():
        return  # committed after all
    for name in TABLES:
        shutil.rmtree(ds / name / part, ignore_errors=True)
