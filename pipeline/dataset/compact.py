"""compact: merge a dataset's small part files into few large ones, never showing a half-done state.

Parts smaller than SMALL_PART_BYTES (all their tables' files together) are packed, oldest commit
first, into bins of up to TARGET_PART_BYTES; a bin of two parts or more (or holding traces of the
one-folder-per-trace layout) becomes one new part per table, its rows sorted by trace_id, each
trace's rows in their order. Traces are merged a range of trace_ids at a time (about RANGE_BYTES
of events in polars, as their parts' Parquet footers size them: `_event_bytes`), so memory does
not grow with the parts; every range reads every part (a part's trace_ids are spread over all of
them), so the fewer the ranges, the fewer times the parts are decoded.

The switch is one rename: the new parts are written first (no manifest names them yet: readers
do not see them), then one manifest file holding every committed row, the merged traces naming
their new parts, is renamed into `traces/` with the newest commit id, so it supersedes every
other manifest file (`layout.manifest`: the newest row of a trace holds). What it superseded is
removed afterwards (`layout.recover`), and by the next writer if a kill comes first. A query
running across the switch may see a file vanish: run it again.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import uuid
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import polars as pl
import pyarrow.parquet as pq

from pipeline import store
from pipeline.dataset.layout import (
    KEY,
    MANIFEST,
    MANIFEST_FILE,
    PART_COLUMN,
    STAGING,
    TABLES,
    cid_of,
    clear_staging,
    commit_id,
    is_legacy,
    live_parts,
    locked,
    manifest,
    manifest_files,
    part_files,
    part_name,
    recover,
    write_manifest,
)
from pipeline.dataset.parts import PART_ROW_GROUP_ROWS, conform_part, dictionary_columns, part_schema
from pipeline.errors import DatasetError

TARGET_PART_BYTES = 256 << 20  # a merged part's files together, about
SMALL_PART_BYTES = 64 << 20  # parts smaller than this are merged
# the traces merged in memory together: about this many bytes of events in polars (`_event_bytes`).
# Counted in events (131K), ranges cut small traces' events (~270 B each) into 35 MB pieces, and
# each piece read every part again: 2,000 small traces, 12 parts, merged in 0.64-0.66 s in four
# ranges, 0.35 s in one.
RANGE_BYTES = 150 << 20
# an event's bytes in polars against its part's footer (its row groups' sizes, encoded but not
# compressed): ~1.35x in parts of distinct traces. Copies of one trace dictionary-encode to far
# less (7 B an event in a compacted dataset of 2,000 copies of hta/mi250_rocm62_minitoy), and
# ranges sized by the footer alone would hold millions of events at once. No event is counted
# below MIN_EVENT_BYTES, what the shared traces' 1.14 M events take each in polars (271 B).
FOOTER_TO_MEMORY = 1.35
MIN_EVENT_BYTES = 271


@dataclass
class CompactResult:
    parts_before: int = 0  # parts the manifest named
    parts_after: int = 0
    merged: int = 0  # parts merged into new ones
    manifests_before: int = 0  # manifest files
    bytes_written: int = 0

    def summary(self) -> str:
        if not self.merged and self.manifests_before <= 1:
            return "nothing to compact"
        return (
            f"{self.parts_before} parts -> {self.parts_after} ({self.merged} merged, "
            f"{self.bytes_written / 1e6:.1f} MB written), {self.manifests_before} manifest files -> 1"
        )


def compact(dataset: str | os.PathLike, target_bytes: int = TARGET_PART_BYTES, small_bytes: int = SMALL_PART_BYTES):
    """Merge the small parts of DATASET (see the module docstring); returns a CompactResult."""
    ds = Path(dataset)
    if not (ds / MANIFEST).is_dir():
        raise DatasetError(f"{ds}: not a batch dataset (no {MANIFEST}/ folder)")
    with locked(ds):
        recover(ds)
        try:
            return compact_locked(ds, target_bytes, small_bytes)
        finally:
            clear_staging(ds)


def _part_bytes(ds: Path, part: str) -> int:
    total = 0
    for t in TABLES:
        with contextlib.suppress(OSError):
            total += (ds / t / part).stat().st_size
    return total


def bins_of(sizes: dict[str, int], target_bytes: int, small_bytes: int) -> list[list[str]]:
    """The parts to merge, packed in order into bins of up to `target_bytes`: parts smaller than
    `small_bytes`; a bin only if it merges two parts or more, or holds a legacy one."""
    bins: list[list[str]] = []
    current: list[str] = []
    total = 0
    for p, size in sizes.items():
        if size >= small_bytes and not is_legacy(p):
            continue
        if current and total + size > target_bytes:
            bins.append(current)
            current, total = [], 0
        current.append(p)
        total += size
    if current:
        bins.append(current)
    return [b for b in bins if len(b) > 1 or any(map(is_legacy, b))]


def compact_locked(
    ds: Path, target_bytes: int = TARGET_PART_BYTES, small_bytes: int = SMALL_PART_BYTES
) -> CompactResult:
    """`compact`, the dataset already locked and recovered by the caller."""
    rows = manifest(ds)
    parts = live_parts(rows)
    legacy_manifests = (ds / MANIFEST).is_dir() and any(p.name.startswith(f"{KEY}=") for p in (ds / MANIFEST).iterdir())
    files = manifest_files(ds)
    res = CompactResult(parts_before=len(parts), parts_after=len(parts), manifests_before=len(files) + legacy_manifests)
    bins = bins_of({p: _part_bytes(ds, p) for p in parts}, target_bytes, small_bytes)
    if not bins and len(files) <= 1 and not legacy_manifests:
        return res
    newest = max((c for c in (cid_of(f.name) for f in files) if c), default=None)
    stage = ds / STAGING / f"compact-{uuid.uuid4().hex[:12]}"
    stage.mkdir(parents=True)
    renamed: dict[str, str] = {}
    try:
        for b in bins:
            newest = commit_id(after=newest)
            res.bytes_written += _merge(ds, rows.filter(pl.col(PART_COLUMN).is_in(b)), b, stage, newest)
            renamed.update(dict.fromkeys(b, part_name(newest)))
            res.merged += len(b)
        res.parts_after = len(set(renamed.get(p, p) for p in parts))
        out = rows.with_columns(pl.col(PART_COLUMN).replace(renamed)).drop(MANIFEST_FILE)
        newest = commit_id(after=newest)
        staged = stage / f"{MANIFEST}.parquet"
        write_manifest(staged, out)
        os.rename(staged, ds / MANIFEST / part_name(newest))  # the switch
    finally:
        shutil.rmtree(stage, ignore_errors=True)
    recover(ds)  # what the new manifest superseded: old manifest files, merged parts
    return res


def _event_bytes(ds: Path, parts: list[str]) -> dict[str, float]:
    """Bytes in polars per event of each part's events: its Parquet footer's row group sizes
    (FOOTER_TO_MEMORY times them), at least MIN_EVENT_BYTES; parts without a file of their own
    (legacy ones) are not named."""
    out = {}
    for p in parts:
        f = ds / "events" / p
        if is_legacy(p) or not f.is_file():
            continue
        meta = pq.ParquetFile(f).metadata
        size = sum(meta.row_group(i).total_byte_size for i in range(meta.num_row_groups))
        out[p] = float(max(FOOTER_TO_MEMORY * size / max(meta.num_rows, 1), MIN_EVENT_BYTES))
    return out


def _ranges(rows: pl.DataFrame, event_bytes: dict[str, float]) -> list[tuple[str, str]]:
    """Consecutive trace_id ranges of the traces, each of about RANGE_BYTES of events (a trace's
    events times its part's bytes per event, `event_bytes`; 1 KB where not known); a trace of more
    than that is a range of its own (merged a row group at a time)."""
    sizes = {part: float(b) for part, b in event_bytes.items()}  # polars types the mapping by its first value
    per_event = pl.col(PART_COLUMN).replace_strict(sizes, default=1024.0, return_dtype=pl.Float64)
    ordered = rows.select(KEY, n=(pl.col("n_events").fill_null(0) + 1) * per_event).sort(KEY)
    out: list[tuple[str, str]] = []
    first: str | None = None
    last, have = "", 0.0
    for tid, n in ordered.iter_rows():
        if n >= RANGE_BYTES:
            if first is not None:
                out.append((first, last))
            out.append((tid, tid))
            first, have = None, 0.0
            continue
        if first is None:
            first = tid
        have += n
        last = tid
        if have >= RANGE_BYTES:
            out.append((first, last))
            first, have = None, 0.0
    if first is not None:
        out.append((first, last))
    return out


def scan_parts(ds: Path, table: str, parts: list[str]) -> pl.LazyFrame:
    """A table's rows in the given parts (legacy ones too), with its part schema."""
    want = dict(store.frame_from_arrow(part_schema(table).empty_table()).schema)
    new, old = part_files(ds, table, parts)
    new = [f for f in new if Path(f).is_file()]
    scans = []
    if new:
        scans.append(pl.scan_parquet(new, schema=want, missing_columns="insert", extra_columns="ignore"))
    if old:
        scans.append(
            pl.scan_parquet(
                old,
                hive_partitioning=True,
                hive_schema={KEY: pl.String},
                schema={k: v for k, v in want.items() if k != KEY},
                missing_columns="insert",
                extra_columns="ignore",
            ).select(list(want))
        )
    if not scans:
        return pl.LazyFrame(schema=want)
    return pl.concat(scans)


def _merge(ds: Path, rows: pl.DataFrame, parts: list[str], stage: Path, cid: str) -> int:
    """Write the rows of `parts` as one new part (`cid`) per table, sorted by trace_id; the new
    files are renamed into the table folders (where no manifest names them yet). Returns bytes."""
    ranges = _ranges(rows.filter(pl.col(PART_COLUMN).is_not_null()), _event_bytes(ds, parts))
    written = 0
    for table in TABLES:
        lf = scan_parts(ds, table, parts)
        path = stage / f"{table}.parquet"
        if len(ranges) == 1 and ranges[0][0] != ranges[0][1]:  # in memory at once: polars reads and sorts fastest
            merged = conform_part(lf.collect().sort(KEY, maintain_order=True).to_arrow(), table)
            # written with the part's own types (polars' writer declares its strings large_string, and
            # a dataset's files would then disagree on them) and a dictionary tried on every column
            # (2,000 small traces: the events 0.14 s and 238 KB; polars' writer 0.10-0.13 s and 132 KB)
            pq.write_table(
                merged, path, row_group_size=PART_ROW_GROUP_ROWS, **dict(store.PARQUET_OPTIONS, use_dictionary=True)
            )
            n = merged.num_rows
            del merged
        else:
            n = _merge_ranges(lf, table, ranges, path)
        want = lf.select(pl.len()).collect().item()
        if n != want:
            raise DatasetError(f"{ds}: compacting {table} gave {n} rows of {want}: nothing changed")
        (ds / table).mkdir(exist_ok=True)
        written += path.stat().st_size
        os.rename(path, ds / table / part_name(cid))
    return written


def _merge_ranges(lf: pl.LazyFrame, table: str, ranges: list[tuple[str, str]], path: Path) -> int:
    """Write the rows of `lf` a trace_id range at a time (each read by its row groups' statistics
    and sorted), in bounded memory. Returns the rows written."""
    writer = pq.ParquetWriter(
        str(path), part_schema(table), use_dictionary=dictionary_columns(table), **store.PARQUET_OPTIONS
    )
    n = 0
    try:
        for lo, hi in ranges:
            in_range = lf.filter(pl.col(KEY).is_between(pl.lit(lo), pl.lit(hi)))
            chunks: Iterable[pl.DataFrame]
            if lo == hi:  # one trace, from one part, in its order: a batch at a time
                chunks = in_range.collect_batches(chunk_size=PART_ROW_GROUP_ROWS, maintain_order=True)
            else:  # made Arrow a row group at a time: the whole range again in Arrow was +0.9x its size
                chunks = in_range.collect().sort(KEY, maintain_order=True).iter_slices(PART_ROW_GROUP_ROWS)
            for chunk in chunks:
                if chunk.height:
                    tbl = conform_part(chunk.to_arrow(), table)
                    writer.write_table(tbl, row_group_size=PART_ROW_GROUP_ROWS)
                    n += tbl.num_rows
    finally:
        writer.close()
    return n
