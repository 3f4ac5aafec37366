"""window: the part of a trace the analyses see, applied before any of them.

`--steps 3:5` (the `ProfilerStep#N` annotations with 3 <= N <= 5: from the first one's start to the
last one's end; `3:` and `:5` are open), `--start-us` / `--end-us` (µs after the trace's first event
starts), `--annotation NAME` (the intervals of every user_annotation so named); several of them
intersect. An event is inside when its start is: the analyses see the events (GPU activity, CPU
ops, memory events, ...) that start inside the window, whole.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import polars as pl

from pipeline.errors import UsageError
from pipeline.kineto import ANNOTATION_CATS, STEP_CATS, STEP_NAME
from pipeline.store import scalar_int

Intervals = list[tuple[int, int]]  # [start, end) in ns, sorted, disjoint


@dataclass(frozen=True)
class Window:
    steps: str | None = None  # "a:b", "a:", ":b" or "n"
    start_us: float | None = None
    end_us: float | None = None
    annotation: str | None = None

    @property
    def empty(self) -> bool:
        return self.steps is None and self.start_us is None and self.end_us is None and self.annotation is None

    def intervals(self, events: Path) -> Intervals | None:
        """The window as time intervals of the trace (None: the whole trace)."""
        if self.empty:
            return None
        parts = [p for p in (self._steps(events), self._times(events), self._annotations(events)) if p is not None]
        out = parts[0]
        for p in parts[1:]:
            out = intersect(out, p)
        return out

    def _steps(self, events: Path) -> Intervals | None:
        if self.steps is None:
            return None
        lo, hi = parse_steps(self.steps)
        n = pl.col("name").str.extract(STEP_NAME, 1).cast(pl.Int64)
        every = _annotations(events, pl.col("name").str.contains(STEP_NAME), STEP_CATS).with_columns(n=n)
        lo, hi = -1 if lo is None else lo, 1 << 62 if hi is None else hi
        s = every.filter((pl.col("n") >= lo) & (pl.col("n") <= hi))
        if not s.height:
            raise UsageError(f"--steps {self.steps}: the trace has no such ProfilerStep ({_held(every['n'])})")
        return [(scalar_int(s["ts_ns"].min()), scalar_int(s["end_ns"].max()))]

    def _times(self, events: Path) -> Intervals | None:
        if self.start_us is None and self.end_us is None:
            return None
        first = trace_origin_ns(events)
        a = first + round(self.start_us * 1000) if self.start_us is not None else -(1 << 62)
        b = first + round(self.end_us * 1000) if self.end_us is not None else 1 << 62
        if b <= a:
            raise UsageError("--end-us must come after --start-us")
        return [(a, b)]

    def _annotations(self, events: Path) -> Intervals | None:
        if self.annotation is None:
            return None
        a = _annotations(events, pl.col("name") == self.annotation)
        if not a.height:
            raise UsageError(f"--annotation {self.annotation!r}: the trace has no user_annotation so named")
        return union(list(a.select("ts_ns", "end_ns").iter_rows()))


def _held(steps: pl.Series) -> str:
    """Which ProfilerSteps a trace holds, for a `--steps` that names none of them (a profiler
    schedule's first steps wait and warm up: their numbers are not recorded)."""
    n = steps.drop_nulls().unique().sort()
    if n.is_empty():
        return "it records none: --start-us/--end-us or --annotation pick a window in it"
    first, last = scalar_int(n[0]), scalar_int(n[-1])
    if first == last:
        return f"it holds ProfilerStep#{first} only"
    gaps = "" if len(n) == last - first + 1 else f", {last - first + 1 - len(n)} of them missing"
    return f"it holds ProfilerStep#{first} to #{last}{gaps}"


def parse_steps(text: str) -> tuple[int | None, int | None]:
    m = re.fullmatch(r"\s*(\d*)\s*(:?)\s*(\d*)\s*", text)
    if not m or not (m.group(1) or m.group(3)):
        raise UsageError(f"--steps must be N, A:B, A: or :B (ProfilerStep numbers), not {text!r}")
    lo = int(m.group(1)) if m.group(1) else None
    hi = int(m.group(3)) if m.group(3) else (lo if not m.group(2) else None)
    if lo is not None and hi is not None and hi < lo:
        raise UsageError(f"--steps {text}: the last step comes before the first")
    return lo, hi


def _annotations(events: Path, which: pl.Expr, cats: tuple[str, ...] = ANNOTATION_CATS) -> pl.DataFrame:
    return (
        pl.scan_parquet(events)
        .filter(pl.col("cat").str.to_lowercase().is_in(cats) & which & pl.col("ts_ns").is_not_null())
        .select("name", "ts_ns", end_ns=pl.col("ts_ns") + pl.col("dur_ns").fill_null(0))
        .collect(engine="streaming")
    )


def union(intervals: Intervals) -> Intervals:
    out: Intervals = []
    for a, b in sorted(intervals):
        if out and a <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], b))
        else:
            out.append((a, b))
    return out


def intersect(x: Intervals, y: Intervals) -> Intervals:
    out = [(max(a, c), min(b, d)) for a, b in x for c, d in y if max(a, c) < min(b, d)]
    return union(out)


def inside(intervals: Intervals | None, column: str = "ts_ns") -> pl.Expr:
    """The rows whose `column` lies in one of the intervals (all when None)."""
    if intervals is None:
        return pl.lit(True)
    t = pl.col(column)
    if len(intervals) <= 8:
        expr = pl.lit(False)
        for a, b in intervals:
            expr = expr | ((t >= a) & (t < b))
        return expr & t.is_not_null()
    starts = pl.Series([a for a, _ in intervals], dtype=pl.Int64)
    ends = pl.Series([b for _, b in intervals], dtype=pl.Int64)
    at = pl.lit(starts).search_sorted(t, side="right").cast(pl.Int64) - 1  # the last interval starting at or before t
    return t.is_not_null() & (at >= 0) & (t < pl.lit(ends).gather(at.clip(0)))


def trace_origin_ns(events: Path) -> int:
    """Time zero of a trace (of `--start-us`, `*_at_us`, `t_us`): its first event that is not
    metadata (`ph` M, which some traces date at 0), in ns; 0 for a trace without one."""
    first = pl.scan_parquet(events).filter(pl.col("ph") != "M").select(pl.col("ts_ns").min()).collect().item()
    return scalar_int(first) if first is not None else 0
