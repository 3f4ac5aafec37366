"""layout: where a dataset keeps its tables, and how traces enter it atomically.

    DATASET/<table>/part-<commit>.parquet   events gpu_ops flows devices trace collectives steps:
                                            the rows of whole traces, sorted by trace_id (a column)
    DATASET/traces/part-<commit>.parquet    the manifest: one row per input (its trace_id, the
                                            part holding its rows, status, counts, ...)
    DATASET/_staging/                       work in progress (removed on the next start)
    DATASET/.lock                           held by the one process writing the dataset

`trace_id` is `t` + the first 16 hex digits of the BLAKE2b hash of the file's bytes: the same
content is the same trace wherever it lies (the letter keeps DuckDB and polars from reading it as a
number). It is a column of every file, so every Parquet reader sees it.

A commit is the traces of one task of a batch (or of a compaction): its part files are renamed
into the table folders, then its manifest file into `traces/`: that rename is the commit. A trace
is in the dataset exactly when a manifest row names it, and its rows are in the part that row
names. Readers (`tables`) read the manifest first and scan only the parts it names, so files of
a commit that never finished are never read. Commit ids grow with time; when two manifest rows
name one trace (a compaction killed between its commit and its clean-up) the newer one holds.
On start a writer removes `_staging/`, manifest files whose every row is superseded and part
files no manifest row names: a run killed at any moment (kill -9) leaves neither duplicates nor
orphans behind. Compaction (`compact`) merges small parts the same way: new parts, then one
manifest file naming them, then the old files go.

Datasets written before the part layout (`<table>/trace_id=<id>/part-0.parquet`, one folder per
trace, trace_id only in the path) are read as they are, and compacted into parts by the next
`batch` or `compact`.
"""

from __future__ import annotations

import fcntl
import os
import secrets
import shutil
import time
from contextlib import contextmanager, suppress
from pathlib import Path

import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq

from pipeline import schema
from pipeline.errors import DatasetError

TABLES = schema.TABLES
MANIFEST = schema.MANIFEST
KEY = "trace_id"
PART_COLUMN = "part"  # the manifest's column naming the part file that holds a trace's rows
STAGING = "_staging"
PREFIX, SUFFIX = "part-", ".parquet"
LEGACY_PART = "part-0.parquet"  # of the one-folder-per-trace layout: <table>/trace_id=<id>/part-0.parquet
PART = LEGACY_PART  # (the name earlier versions exported)

MANIFEST_SCHEMA = schema.table(MANIFEST).arrow_schema()  # declared in schemas/traces.toml


@contextmanager
def locked(ds: Path, wait: bool = False):
    """Hold the dataset's write lock; `wait`: until the writer holding it is done (else fail)."""
    fd = os.open(ds / ".lock", os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
        except BlockingIOError:
            raise DatasetError(f"{ds}: another `tracepipe batch` or `compact` is writing this dataset") from None
        yield
    finally:
        os.close(fd)


HELD = ".held"  # in a staging folder a writer uses without the dataset's lock: flocked while in use


@contextmanager
def held_stage(ds: Path, prefix: str = "append"):
    """A staging folder of its own for a writer that flattens without holding the dataset's lock
    (a trace added as it is born, while other ranks add theirs): made under the lock, then held
    by a lock of its own, which `clear_staging` respects; removed afterwards."""
    with locked(ds, wait=True):
        stage = ds / STAGING / f"{prefix}-{secrets.token_hex(6)}"
        stage.mkdir(parents=True)
        fd = os.open(stage / HELD, os.O_RDWR | os.O_CREAT, 0o644)
        fcntl.flock(fd, fcntl.LOCK_EX)
    try:
        yield stage
    finally:
        shutil.rmtree(stage, ignore_errors=True)
        os.close(fd)


def clear_staging(ds: Path):
    """Remove staging leftovers (of runs that were killed), but the folders writers hold
    (`held_stage`); called under the dataset's lock, as every folder is made under it."""
    root = ds / STAGING
    if not root.is_dir():
        return
    for d in root.iterdir():
        lock = d / HELD
        if d.is_dir() and lock.is_file():
            try:
                fd = os.open(lock, os.O_RDWR)
            except FileNotFoundError:
                continue  # its writer just finished and removed it
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                continue  # in use
            finally:
                os.close(fd)
        shutil.rmtree(d, ignore_errors=True) if d.is_dir() else d.unlink(missing_ok=True)
    with suppress(OSError):  # empty now, unless a writer holds a folder in it
        root.rmdir()


# ------------------------------------------------------------------ commits and parts
def commit_id(after: str | None = None) -> str:
    """A new commit id: nanoseconds since the epoch (20 digits, so names sort by time) and a random
    tail; later than `after` (the newest commit a compaction supersedes) whatever the clock says."""
    now = time.time_ns()
    if after is not None:
        now = max(now, int(after.split("-", 1)[0]) + 1)
    return f"{now:020d}-{secrets.token_hex(4)}"


def part_name(cid: str) -> str:
    return f"{PREFIX}{cid}{SUFFIX}"


def cid_of(name: str) -> str | None:
    """The commit id of a part or manifest file name, None for any other name."""
    if name.startswith(PREFIX) and name.endswith(SUFFIX) and name[len(PREFIX) : len(PREFIX) + 20].isdigit():
        return name[len(PREFIX) : -len(SUFFIX)]
    return None


def is_legacy(part: str) -> bool:
    """A part of the one-folder-per-trace layout (`trace_id=<id>/part-0.parquet`)."""
    return part.startswith(f"{KEY}=")


def legacy_part(trace_id: str) -> str:
    return f"{KEY}={trace_id}/{LEGACY_PART}"


def manifest_files(ds: Path) -> list[Path]:
    """The manifest files of the part layout, oldest commit first."""
    d = ds / MANIFEST
    if not d.is_dir():
        return []
    return sorted((p for p in d.iterdir() if cid_of(p.name) and p.is_file()), key=lambda p: p.name)


def _legacy_manifest_files(ds: Path) -> list[Path]:
    d = ds / MANIFEST
    if not d.is_dir():
        return []
    return sorted(p / LEGACY_PART for p in d.iterdir() if p.name.startswith(f"{KEY}=") and (p / LEGACY_PART).is_file())


MANIFEST_FILE = "_manifest_file"  # in `manifest()`: the manifest file a row was read from


def manifest(ds: Path) -> pl.DataFrame:
    """The committed manifest rows: one per trace_id (the newest commit's where a trace is named
    twice), with `part` (the file, relative to a table's folder, holding the trace's rows; null
    when it has none) and MANIFEST_FILE. Raises DatasetError if a manifest file cannot be read
    (never half-written: renamed into place whole)."""
    want = {**_polars_manifest_schema()}
    frames = []
    legacy = _legacy_manifest_files(ds)
    try:
        if legacy:
            lf = pl.scan_parquet(
                [str(p) for p in legacy],
                hive_partitioning=True,
                hive_schema={KEY: pl.String},
                schema={k: v for k, v in want.items() if k not in (KEY, PART_COLUMN)},
                missing_columns="insert",
                extra_columns="ignore",
                include_file_paths=MANIFEST_FILE,
            )
            frames.append(
                lf.with_columns(
                    pl.when(pl.col("status") != "quarantined")
                    .then(pl.format("{}={}/{}", pl.lit(KEY), pl.col(KEY), pl.lit(LEGACY_PART)))
                    .alias(PART_COLUMN)
                ).collect()
            )
        files = manifest_files(ds)
        if files:
            frames.append(
                pl.scan_parquet(
                    [str(p) for p in files],
                    schema=want,
                    missing_columns="insert",
                    extra_columns="ignore",
                    include_file_paths=MANIFEST_FILE,
                ).collect()
            )
    except (pl.exceptions.PolarsError, OSError) as e:
        raise DatasetError(f"{ds}: cannot read its manifest ({str(e).splitlines()[0] if str(e) else e})") from None
    if not frames:
        return pl.DataFrame(schema={**want, MANIFEST_FILE: pl.String})
    rows = pl.concat([f.select(*want, MANIFEST_FILE) for f in frames], how="vertical_relaxed")
    return rows.unique(KEY, keep="last", maintain_order=True)  # files oldest first: the newest row holds


def _polars_manifest_schema() -> dict:
    from pipeline import store

    return dict(store.frame_from_arrow(MANIFEST_SCHEMA.empty_table()).schema)


def committed_ids(ds: Path) -> set[str]:
    """The traces in the dataset (those a manifest row names, whatever their status)."""
    return set(manifest(ds)[KEY].to_list())


def read_manifest(ds: Path) -> dict[str, dict]:
    """trace_id -> {path, status, error, part} of every committed manifest row."""
    m = manifest(ds)
    return {r[KEY]: r for r in m.select(KEY, "path", "status", "error", PART_COLUMN).iter_rows(named=True)}


def live_parts(rows: pl.DataFrame) -> list[str]:
    """The parts the manifest rows name, in commit order (legacy ones first)."""
    return rows[PART_COLUMN].drop_nulls().unique(maintain_order=True).to_list()


def part_files(ds: Path, table: str, parts: list[str]) -> tuple[list[str], list[str]]:
    """The files of a table's parts that exist: (part-layout files, legacy files)."""
    new, old = [], []
    for p in parts:
        f = ds / table / p
        if is_legacy(p):
            if f.is_file():
                old.append(str(f))
        else:
            new.append(str(f))
    return new, old


def recover(ds: Path) -> set[str]:
    """Remove what an interrupted run or compaction left: staging, manifest files whose rows are
    all superseded, part files and legacy folders no manifest row names. Returns the committed ids."""
    clear_staging(ds)
    rows = manifest(ds)  # raises rather than let a manifest it cannot read delete anything
    live_files = set(rows[MANIFEST_FILE].to_list())
    parts = set(live_parts(rows))
    for f in manifest_files(ds):
        if str(f) not in live_files:
            os.unlink(f)
    for f in _legacy_manifest_files(ds):
        if str(f) not in live_files:
            shutil.rmtree(f.parent)
    for name in (*TABLES, MANIFEST):
        d = ds / name
        if not d.is_dir():
            continue
        for p in d.iterdir():
            if name != MANIFEST and cid_of(p.name) and p.name not in parts:
                os.unlink(p)  # a part of a commit that never finished, or superseded by a compaction
            elif p.name.startswith(f".{PREFIX}"):
                os.unlink(p)  # a temporary file
            elif p.name.startswith(f"{KEY}=") and name != MANIFEST and f"{p.name}/{LEGACY_PART}" not in parts:
                shutil.rmtree(p) if p.is_dir() else p.unlink()
    return set(rows[KEY].to_list())


def write_manifest(path: Path, rows: list[dict] | pl.DataFrame):
    """Write manifest rows (dicts, or a frame with the manifest's columns) to a Parquet file."""
    if isinstance(rows, pl.DataFrame):
        tbl = rows.select(MANIFEST_SCHEMA.names).to_arrow().cast(MANIFEST_SCHEMA)
    else:
        tbl = pa.Table.from_pylist(rows, schema=MANIFEST_SCHEMA)
    pq.write_table(tbl, str(path), compression="zstd", compression_level=1)


def commit(ds: Path, stage: Path, cid: str, rows: list[dict]):
    """Commit a staged task: its part files (STAGE/<table>.parquet, if it wrote any) renamed to
    DATASET/<table>/part-<cid>.parquet, then its manifest rows written and renamed into
    DATASET/traces/: the commit. On an error the caller undoes it (`uncommit`)."""
    name = part_name(cid)
    for table in TABLES:
        f = stage / f"{table}.parquet"
        if f.is_file():
            (ds / table).mkdir(exist_ok=True)
            os.rename(f, ds / table / name)
    stage.mkdir(parents=True, exist_ok=True)
    staged = stage / f"{MANIFEST}.parquet"
    write_manifest(staged, rows)
    (ds / MANIFEST).mkdir(exist_ok=True)
    os.rename(staged, ds / MANIFEST / name)


def uncommit(ds: Path, cid: str):
    """Take back the part files of a commit whose manifest did not make it."""
    name = part_name(cid)
    if (ds / MANIFEST / name).is_file():
        return  # committed after all
    for table in TABLES:
        with suppress(FileNotFoundError):
            os.unlink(ds / table / name)
