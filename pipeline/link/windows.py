"""windows: read only the events around a time window, in bounded memory.

Linking looks up, for a batch of GPU ops, the CPU slices that were running when their launch
calls started. Two small per-trace indexes, built without holding the events, keep those reads
small and cheap:

- `EventReach`, from the row-group statistics of events.parquet: the earliest start of any
  event that may still run at time `a`. `ts_ns >= earliest(a)` follows from
  `ts_ns + dur_ns >= a`, but unlike it lets the Parquet reader skip row groups by their ts_ns
  statistics (a row group's events end by its last start plus its longest duration).
- `TimeCells`: cuts of the time axis so that each cell holds about `per_cell` slice starts
  (from a histogram of starts over `TimeBins`, aggregated while streaming). Launches are looked up one cell at
  a time, so one read never spans more than about a cell of slices, plus those running across
  it, even when a batch's GPU ops are spread over the whole trace.

Both only make reads cheaper: the reads' own predicates decide which rows are returned.
`RunningSlices` serves those reads window after window, reading only what the window before did
not: windows that move forward through a trace read each row group about once.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import polars as pl
import pyarrow.parquet as pq

HISTOGRAM_BINS = 1 << 12  # time bins of the slice-start histogram that TimeCells cuts are taken from


@dataclass(frozen=True)
class EventReach:
    """Per row group of an events file: its first start and how late its events may end."""

    first_start: tuple[int, ...]
    last_start: tuple[int, ...]
    last_end: tuple[int | None, ...]  # None: unknown (no duration statistics), may run to the end
    bounded: bool  # False when some row group with events has no ts_ns statistics

    @classmethod
    def of(cls, path: Path) -> EventReach:
        meta = pq.ParquetFile(path).metadata
        names = [meta.schema.column(i).name for i in range(meta.num_columns)]
        ts_col, dur_col = names.index("ts_ns"), names.index("dur_ns")
        first, last_start, last, bounded = [], [], [], True
        for r in range(meta.num_row_groups):
            group = meta.row_group(r)
            ts, dur = group.column(ts_col).statistics, group.column(dur_col).statistics
            if ts is None or not ts.has_min_max:
                if ts is None or ts.null_count != group.num_rows:
                    bounded = False  # events with a start, but no statistics to bound it
                continue
            if dur is not None and dur.has_min_max:
                longest = max(dur.max, 0)  # a null duration ends where it starts
            elif dur is not None and dur.null_count == group.num_rows:
                longest = 0
            else:
                longest = None
            first.append(ts.min)
            last_start.append(ts.max)
            last.append(None if longest is None else ts.max + longest)
        return cls(tuple(first), tuple(last_start), tuple(last), bounded)

    def earliest_start(self, a: int) -> int | None:
        """A start that no event ending at or after `a` precedes (None: no such bound)."""
        if not self.bounded:
            return None
        starts = [s for s, e in zip(self.first_start, self.last_end) if e is None or e >= a]
        return min(starts, default=a)

    @property
    def span(self) -> tuple[int, int] | None:
        """(first start, last start) of the file's events, from the statistics."""
        return (min(self.first_start), max(self.last_start)) if self.first_start else None


@dataclass(frozen=True)
class TimeBins:
    """HISTOGRAM_BINS equal bins of time over a span (more outside it)."""

    t0: int
    width: int

    @classmethod
    def over(cls, span: tuple[int, int] | None) -> TimeBins:
        t0, t1 = span or (0, 0)
        return cls(t0, max(1, (t1 - t0) // HISTOGRAM_BINS + 1))

    def of(self, t: pl.Expr) -> pl.Expr:
        return (t - self.t0) // self.width


@dataclass(frozen=True)
class TimeCells:
    """Cuts of the time axis: cell k is [cuts[k-1], cuts[k]) (the first and last are open)."""

    cuts: pl.Series

    @classmethod
    def of(cls, histogram: pl.DataFrame, bins: TimeBins, per_cell: int, whole_tail: bool = False) -> TimeCells:
        """Cells of about `per_cell` counts each (more where one bin holds more) from a histogram
        (bin, n) over `bins`. `whole_tail`: a last cell of less than half `per_cell` joins the one
        before (cells of up to 1.5x `per_cell`), for work whose every cell has a fixed cost."""
        histogram = histogram.sort("bin")
        before = histogram["n"].cum_sum() - histogram["n"]  # counted before each bin
        per_cell = max(1, per_cell)
        cell = before // per_cell
        if whole_tail:
            total = int(histogram["n"].sum())
            cell = cell.clip(upper_bound=max(0, (total + per_cell // 2) // per_cell - 1))
        first_of_cell = histogram.filter(cell.diff().fill_null(0) > 0)["bin"]
        return cls((first_of_cell * bins.width + bins.t0).cast(pl.Int64).alias("cuts"))

    def cell(self, t: pl.Series) -> pl.Series:
        """The cell of each time."""
        return self.cuts.search_sorted(t, side="right")


THREAD = ["pid", "tid"]
_START = pl.col("ts_ns")
_END = pl.col("ts_ns") + pl.col("dur_ns").fill_null(0)  # in the events file; `end_ns` in the rows read


class RunningSlices:
    """The slices of an events file running at some time of a window [a, b] on some threads, i.e.
    those with ts_ns <= b and end >= a (end = ts_ns + dur_ns, a null duration 0), window after
    window.

    `read(where, threads)` reads the rows of the slices on `threads` (pid, tid) that `where`
    selects (a predicate on ts_ns and dur_ns), with their pid, tid, ts_ns and end_ns. A fresh read
    of [a, b] starts at `EventReach.earliest_start(a)`: the row groups before the window that
    some long slice may span are decoded too, for the few slices still running. So the rows of
    the last read are kept: a window that starts no earlier than the one before, on threads read
    already, takes those still running from them and reads only the slices that started after
    the last read's end, from the row groups after it (Kineto writes events roughly in time
    order). Which rows a window gets does not depend on the windows before it; the rows kept are
    about a window's worth."""

    def __init__(self, read: Callable[[pl.Expr, pl.DataFrame], pl.DataFrame], reach: EventReach):
        self._read, self._reach = read, reach
        self._threads: pl.DataFrame | None = None  # the threads of the rows held
        self._since = self._until = 0  # the rows held: on those threads, end >= _since, ts_ns <= _until
        self._rows: pl.DataFrame | None = None

    def between(self, threads: pl.DataFrame, a: int, b: int) -> pl.DataFrame:
        """The slices on `threads` (pid, tid) with ts_ns <= b and end >= a."""
        threads = threads.select(THREAD)
        if self._rows is None or a < self._since or not self._holds(threads):
            self._fresh(threads, a, b)
        else:
            self._advance(a, b)
        assert self._rows is not None  # set by _fresh
        return self._rows.filter(pl.col("ts_ns") <= b).join(threads, on=THREAD, how="semi")

    def _holds(self, threads: pl.DataFrame) -> bool:
        assert self._threads is not None  # asked only while rows are held
        return threads.join(self._threads, on=THREAD, how="anti", nulls_equal=True).is_empty()

    def _fresh(self, threads: pl.DataFrame, a: int, b: int):
        """Read the window for these threads and those held (which later windows may ask for)."""
        if self._threads is not None:
            threads = pl.concat([self._threads, threads]).unique(maintain_order=True)
        earliest = self._reach.earliest_start(a)
        where = (b >= _START) & (a <= _END) & (pl.lit(True) if earliest is None else earliest <= _START)
        self._threads, self._since, self._until = threads, a, b
        self._rows = self._read(where, threads)

    def _advance(self, a: int, b: int):
        """Drop the rows ended before a; read those started after the last read, up to b."""
        assert self._rows is not None and self._threads is not None  # called only while rows are held
        rows = self._rows.filter(pl.col("end_ns") >= a)
        if b > self._until:
            rows = pl.concat([rows, self._read((self._until < _START) & (b >= _START) & (a <= _END), self._threads)])
            self._until = b
        self._rows, self._since = rows, a
