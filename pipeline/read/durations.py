"""durations: the Chrome Trace Event Format's duration events, `B` (begin) and `E` (end), made one
duration on the `B` row (its `dur_ns`), as the format says they pair: per thread (pid, tid), an `E`
closes the latest `B` still open on its thread (they nest like calls; file order, which the format
requires to be time order on a thread). The `E` row stays as it is (its args too).

A chunk pairs its own events (`pair_chunk`, in whichever process decoded it) and hands on what it
could not close: the `E`s that close a `B` of an earlier chunk, and the `B`s still open at its end
(`OpenEnds`). `Durations` carries the threads' open `B`s from chunk to chunk in file order, pairs
those across chunks (`late`: durations for `B` rows written already, `patch` puts them in the
events file) and counts what stays unmatched by reason (`UNMATCHED`).
"""

from __future__ import annotations

import os
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

BEGIN, END = "B", "E"


def __getattr__(name: str):
    """SLICE, a polars expression: rows of an events table that are slices, complete events (`X`)
    and `B`s their `E` gave a duration; every reader of slices (link, analyses, findings, rewrite)
    takes both alike. Made on first use: the reading workers import this module, and polars is
    not theirs to import (`read.head_start` forks them before it is)."""
    if name != "SLICE":
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import polars as pl

    globals()["SLICE"] = slice_rows = (pl.col("ph") == "X") | ((pl.col("ph") == BEGIN) & pl.col("dur_ns").is_not_null())
    return slice_rows


_PHASES = pa.array([BEGIN, END], pa.string())
_THREAD = ("pid", "pid_str", "tid", "tid_str")
# why a B or an E was left without its duration (problems_json: `unmatched:<reason>`)
END_WITHOUT_BEGIN = "E_without_open_B_on_its_thread"
BEGIN_WITHOUT_END = "B_never_ended"
END_BEFORE_BEGIN = "E_before_its_B_in_time"
NO_TIME = "B_or_E_without_ts"
UNMATCHED = (END_WITHOUT_BEGIN, BEGIN_WITHOUT_END, END_BEFORE_BEGIN, NO_TIME)


@dataclass
class OpenEnds:
    """What a chunk could not pair: its `E`s that close a `B` of an earlier chunk and its `B`s still
    open at its end, each (thread, event_idx in the chunk, ts_ns), in file order."""

    ends: list = field(default_factory=list)
    begins: list = field(default_factory=list)
    unmatched: Counter = field(default_factory=Counter)  # pairs the chunk found but could not time


def pair_chunk(events: pa.Table) -> tuple[pa.Table, OpenEnds | None]:
    """The chunk's events with each `B` that an `E` of the chunk closes given its duration; and what
    is left open (None when the chunk holds no B or E: nothing to carry)."""
    ph = events.column("ph")
    rows = pc.indices_nonzero(pc.fill_null(pc.is_in(ph, _PHASES), False))
    if not len(rows):
        return events, None
    be = events.take(rows).select(["ph", *_THREAD, "ts_ns"]).to_pydict()
    threads = zip(*(be[k] for k in _THREAD))
    open_: dict = {}
    left = OpenEnds()
    found_rows, found_durs = [], []
    for row, p, thread, ts in zip(rows.to_pylist(), be["ph"], threads, be["ts_ns"]):
        if p == BEGIN:
            open_.setdefault(thread, []).append((row, ts))
            continue
        stack = open_.get(thread)
        if not stack:
            left.ends.append((thread, row, ts))
            continue
        b_row, b_ts = stack.pop()
        dur = timed(b_ts, ts, left.unmatched)
        if dur is not None:
            found_rows.append(b_row)
            found_durs.append(dur)
    left.begins = sorted(((t, r, ts) for t, stack in open_.items() for r, ts in stack), key=lambda x: x[1])
    return with_durations(events, found_rows, found_durs), left


def timed(begin_ns: int | None, end_ns: int | None, unmatched: Counter) -> int | None:
    """A pair's duration; None (counted) when a side has no time or the E comes before its B."""
    if begin_ns is None or end_ns is None:
        unmatched[NO_TIME] += 1
        return None
    if end_ns < begin_ns:
        unmatched[END_BEFORE_BEGIN] += 1
        return None
    return end_ns - begin_ns


def with_durations(events: pa.Table, rows: list, durs: list, offset: int = 0) -> pa.Table:
    """The events with `dur_ns` set at the given rows (event_idx - offset)."""
    if not rows:
        return events
    i = events.schema.get_field_index("dur_ns")
    old = events.column(i)
    values = old.to_numpy(zero_copy_only=False)
    values = np.where(pc.is_null(old).to_numpy(zero_copy_only=False), 0, values).astype(np.int64)
    mask = pc.is_valid(old).to_numpy(zero_copy_only=False).copy()
    at = np.asarray(rows, dtype=np.int64) - offset
    values[at] = np.asarray(durs, dtype=np.int64)
    mask[at] = True
    return events.set_column(i, "dur_ns", pa.array(values, pa.int64(), mask=~mask))


class Durations:
    """B/E pairing across the chunks of one trace, fed in file order (`feed`), then `finish`ed."""

    def __init__(self) -> None:
        self.open: dict = {}  # thread -> its open Bs (event_idx, ts_ns), innermost last
        self.late: dict[int, int] = {}  # event_idx of a B written already -> its duration
        self.unmatched: Counter = Counter()

    def feed(self, left: OpenEnds | None, offset: int):
        """A chunk's `OpenEnds` (its event_idx start at `offset` in the trace)."""
        if left is None:
            return
        self.unmatched.update(left.unmatched)
        for thread, _row, ts in left.ends:
            stack = self.open.get(thread)
            if not stack:
                self.unmatched[END_WITHOUT_BEGIN] += 1
                continue
            b_idx, b_ts = stack.pop()
            dur = timed(b_ts, ts, self.unmatched)
            if dur is not None:
                self.late[b_idx] = dur
        for thread, row, ts in left.begins:
            self.open.setdefault(thread, []).append((row + offset, ts))

    def finish(self) -> Counter:
        """The unmatched counts by reason, the Bs still open included."""
        self.unmatched[BEGIN_WITHOUT_END] += sum(map(len, self.open.values()))
        self.open = {}
        return +self.unmatched

    def patch(self, path: Path, writer_of):
        """Put the `late` durations into the events file at `path` (rewritten row group by row
        group through `writer_of(tmp_path)`, a TableWriter); nothing to do when there are none."""
        if not self.late:
            return
        idx = np.fromiter(self.late, dtype=np.int64, count=len(self.late))
        durs = np.fromiter(self.late.values(), dtype=np.int64, count=len(self.late))
        order = np.argsort(idx)
        idx, durs = idx[order], durs[order]
        tmp = path.with_name(path.name + ".durations")
        src = pq.ParquetFile(path)
        out = writer_of(tmp)
        try:
            for g in range(src.num_row_groups):
                part = src.read_row_group(g)
                first = part.column("event_idx")[0].as_py() if part.num_rows else 0
                lo, hi = np.searchsorted(idx, [first, first + part.num_rows])
                if hi > lo:  # event_idx runs 0, 1, 2, ... in file order: row = event_idx - first
                    part = with_durations(part, idx[lo:hi].tolist(), durs[lo:hi].tolist(), first)
                out.write(part)
            out.close()
        except BaseException:
            out.abandon()
            raise
        os.replace(tmp, path)
