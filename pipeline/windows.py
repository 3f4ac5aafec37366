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
"""
from __future__ import annotations

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
    def of(cls, path: Path) -> "EventReach":
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
    def over(cls, span: tuple[int, int] | None) -> "TimeBins":
        t0, t1 = span or (0, 0)
        return cls(t0, max(1, (t1 - t0) // HISTOGRAM_BINS + 1))

    def of(self, t: pl.Expr) -> pl.Expr:
        return (t - self.t0) // self.width


@dataclass(frozen=True)
class TimeCells:
    """Cuts of the time axis: cell k is [cuts[k-1], cuts[k]) (the first and last are open)."""

    cuts: pl.Series

    @classmethod
    def of(cls, histogram: pl.DataFrame, bins: TimeBins, per_cell: int) -> "TimeCells":
        """Cells of about `per_cell` counts each (more where one bin holds more) from a histogram
        (bin, n) over `bins`."""
        histogram = histogram.sort("bin")
        before = histogram["n"].cum_sum() - histogram["n"]  # counted before each bin
        cell = before // max(1, per_cell)
        first_of_cell = histogram.filter(cell.diff().fill_null(0) > 0)["bin"]
        return cls((first_of_cell * bins.width + bins.t0).cast(pl.Int64).alias("cuts"))

    def cell(self, t: pl.Series) -> pl.Series:
        """The cell of each time."""
        return self.cuts.search_sorted(t, side="right")
