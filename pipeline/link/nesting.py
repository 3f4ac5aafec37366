"""nesting: how intervals on a thread nest (depth, parent) and which of them enclose points in time.

Intervals are (iv_idx, pid, tid, ts_ns, end_ns), one thread being a (pid, tid); times are not
null. The depth of an instant is the number of intervals open there: the starts before it minus
the ends before it, in this order at one instant: ends of non-empty intervals, then starts (in a
given start order), then points, then ends of zero-length intervals. So an end counts before
time t when it is <= t, or < t for a zero-length interval, i.e. when its `effective end` (end,
or end + 1 for a zero-length interval; times are integer ns) is <= t.

Both counts are binary searches (`search_sorted`) in a thread's sorted starts and sorted
effective ends: starts, ends and points are never sorted together (that merged sort, three rows
per interval and five sort keys, was the memory peak of linking a large trace).

Answers, per thread:
- the depth of every interval (of its start), and its parent: the last start at depth - 1 before
  it in start order (`nesting`);
- for points (point_id, pid, tid, t): the innermost interval around each point, the last start at
  the point's depth before it that has not ended before t, or the outermost (depth 1)
  (`enclosing`, `around`).

"The last start at depth d before position s" is one more binary search: starts sorted by the key
(depth, position) put each depth's starts together in start order, and the search for (d, s)
lands just after the wanted one.

All threads are answered at once, without a loop over threads: the intervals are sorted once by
(thread, start order), and every per-thread search becomes one search over all threads by keys
that put the thread first: thread number * width + value, in int64 (`_Keys`). A thread's starts
are then the rows from its first one on (`first`), and counts within it are positions minus
`first`.

Where the optional compiled module is built (`native/nesting.cpp`), `rows_around` (linking's
question, its threads named by three columns), `around_one` (`enclosing`'s and the slicer's) and
`nesting` (the reports') are answered by one sweep per thread instead: starts in start order,
ends sorted, points walked in time order with the last start at each depth kept. Same rule, same
answers (`tests/test_nesting.py` checks them against a direct sweep); TRACEPIPE_NATIVE=0 turns
it off.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import polars as pl

from pipeline import native
from pipeline.store import scalar_int

THREAD = ["pid", "tid"]
_INT64_ROOM = 1 << 62  # composite keys stay below this (int64, with room for one more step)


@dataclass(frozen=True)
class StartOrder:
    """How starts at one instant are ordered (first = outer), after their time: by `columns`
    of the intervals, each ascending unless `descending`."""

    columns: tuple[str, ...]
    descending: tuple[bool, ...]


FILE_ORDER = StartOrder(("iv_idx",), (False,))  # identical intervals nest in file order
LONGER_FIRST = StartOrder(("end_ns", "iv_idx"), (True, False))  # then file order
_NATIVE_ORDERS = {FILE_ORDER: 0, LONGER_FIRST: 1}  # the start orders `native/nesting.cpp` knows

try:
    from tracepipe_native import around as _native_around
except ImportError:  # not built, or a build before it had `around`: polars answers
    _native_around = None
try:
    from tracepipe_native import around_keyed as _native_around_keyed
except ImportError:  # a build before it had `around_keyed` (0.5.0): `around_one` answers `rows_around`
    _native_around_keyed = None
try:
    from tracepipe_native import nest as _native_nest
except ImportError:  # a build before it had `nest` (0.3.0): polars answers `nesting`
    _native_nest = None


def _columns(frame: pl.LazyFrame | pl.DataFrame, *columns: str) -> pl.DataFrame:
    """The columns of a frame (a DataFrame's are shared, not copied)."""
    return frame.select(columns) if isinstance(frame, pl.DataFrame) else frame.select(columns).collect()


@dataclass(frozen=True)
class _Keys:
    """Order- and equality-preserving int64 keys for values of one kind (times, depths) on many
    threads: thread * width + offset, the offset being the value minus the smallest known one
    (clipped just outside the known range), or, when threads x range would not fit in `room`,
    its place among the distinct known values: 2i + 1 for the i-th one, 2i for values between
    the (i-1)-th and the i-th (the same comparisons and equalities with known values, in a
    range of twice their count)."""

    low: int
    width: int
    known: pl.Series | None  # sorted distinct values, when offsets are places among them

    @classmethod
    def over(cls, known: pl.Series, threads: int, room: int = _INT64_ROOM) -> _Keys:
        low, high = (scalar_int(known.min()), scalar_int(known.max())) if known.len() else (0, 0)
        if (high - low + 3) * max(threads, 1) < room:
            return cls(low - 1, high - low + 3, None)
        distinct = known.unique().sort()
        return cls(0, 2 * distinct.len() + 1, distinct)

    def of(self, value: pl.Series, thread: pl.Series | None = None) -> pl.Series:
        """The key of each value (on each thread)."""
        if self.known is None:
            offset = (value.cast(pl.Int64) - self.low).clip(0, self.width - 1)
        else:
            offset = self.known.search_sorted(value, side="left").cast(pl.Int64) + self.known.search_sorted(
                value, side="right"
            ).cast(pl.Int64)
        return offset if thread is None else thread.cast(pl.Int64) * self.width + offset


@dataclass(frozen=True)
class _Threads:
    """All threads' intervals in start order, one row each (its position is its row number), with
    `g` (the thread's number), `first` (the position of the thread's first start), `depth`; and
    the sorted keys that the searches of `around` and `nesting` run in."""

    starts: pl.DataFrame  # iv_idx, g, first, ts_ns, end_ns, depth
    threads: pl.DataFrame  # *by, g, first
    times: _Keys
    start_keys: pl.Series  # (thread, start), in row order (sorted)
    end_keys: pl.Series  # (thread, effective end), sorted
    depths: _Keys  # of (thread, depth)
    levels: _Keys  # of the (thread, depth) keys of the starts
    depth_keys: pl.Series  # level * (n + 1) + position, sorted

    @classmethod
    def of(
        cls, intervals: pl.LazyFrame | pl.DataFrame, start_order: StartOrder, by: tuple[str, ...] = tuple(THREAD)
    ) -> _Threads:
        iv = (
            _columns(intervals, "iv_idx", *by, "ts_ns", "end_ns")
            .filter(pl.col("ts_ns").is_not_null() & pl.col("end_ns").is_not_null())
            .with_columns(
                g=pl.struct(*by).rank("dense").cast(pl.Int64) - 1,
                effective_end=pl.when(pl.col("end_ns") == pl.col("ts_ns"))
                .then(pl.col("end_ns") + 1)
                .otherwise(pl.col("end_ns")),
            )
        )
        n_threads = scalar_int(iv["g"].max()) + 1 if iv.height else 0
        times = _Keys.over(pl.concat([iv["ts_ns"], iv["effective_end"]]), n_threads)
        # (thread, start) as one key: sorting by it and the start order costs a third of sorting
        # by the thread's columns, the start and the start order
        iv = iv.with_columns(start_key=times.of(iv["ts_ns"], iv["g"])).sort(
            ["start_key", *start_order.columns], descending=[False, *start_order.descending]
        )
        iv = iv.with_row_index("pos").with_columns(
            pl.col("pos").cast(pl.Int64), first=iv["g"].search_sorted(iv["g"], side="left").cast(pl.Int64)
        )
        threads = iv.filter(pl.col("pos") == pl.col("first")).select(*by, "g", "first")
        start_keys = iv["start_key"]
        end_keys = times.of(iv["effective_end"], iv["g"]).sort()
        ended = end_keys.search_sorted(start_keys, side="right").cast(pl.Int64) - iv["first"]
        iv = iv.with_columns(depth=pl.col("pos") - pl.col("first") + 1 - ended)
        positions = iv.height + 1
        depths = _Keys.over(iv["depth"], threads.height)
        at_depth = depths.of(iv["depth"], iv["g"])
        levels = _Keys.over(at_depth, 1, room=_INT64_ROOM // positions)
        depth_keys = (levels.of(at_depth) * positions + iv["pos"]).sort()
        return cls(
            iv.drop("pos", "start_key", "effective_end"),
            threads,
            times,
            start_keys,
            end_keys,
            depths,
            levels,
            depth_keys,
        )

    def last_start_at(self, g: pl.Series, depth: pl.Series, before: pl.Series) -> pl.Series:
        """For each (thread g, depth d, position s): the position of the last start of thread g at
        depth d before position s, else null."""
        positions = self.starts.height + 1
        level = self.levels.of(self.depths.of(depth, g))
        pos = self.depth_keys.search_sorted(level * positions + before, side="left").cast(pl.Int64) - 1
        key = self.depth_keys.gather(pos.clip(0))
        return pl.select(pl.when((pos >= 0) & (key // positions == level)).then(key % positions)).to_series()


def nesting(intervals: pl.LazyFrame | pl.DataFrame, start_order: StartOrder) -> pl.DataFrame:
    """(iv_idx, depth, parent_idx) of intervals (iv_idx, pid, tid, ts_ns, end_ns), in start order
    (per thread: by start, then the start order)."""
    if _native_nest is not None and start_order in _NATIVE_ORDERS and native.allowed():
        return _nesting_native(intervals, start_order)
    t = _Threads.of(intervals, start_order)
    s = t.starts.with_row_index("pos")
    pos = s["pos"].cast(pl.Int64)
    parent = t.last_start_at(s["g"], s["depth"] - 1, pos)
    return s.select("iv_idx", pl.col("depth").cast(pl.Int64), parent_idx=s["iv_idx"].gather(parent))


def _nesting_native(intervals: pl.LazyFrame | pl.DataFrame, start_order: StartOrder) -> pl.DataFrame:
    """`nesting` by one sweep per thread in the compiled module (the reports' depth and parent of
    CPU ops: on a 200 MB trace ~0.2 s of polars' sorts and searches)."""
    assert _native_nest is not None
    iv = _numbered(intervals, THREAD)
    n = iv.height
    rows, depth, parent = (np.empty(n, np.int64) for _ in range(3))
    _native_nest(
        *(iv[c].cast(pl.Int64).to_numpy() for c in ("g", "ts_ns", "end_ns", "iv_idx")),
        _NATIVE_ORDERS[start_order],
        rows,
        depth,
        parent,
    )
    idx = iv["iv_idx"]
    return pl.DataFrame({"iv_idx": idx.gather(rows), "depth": depth, "parent_idx": idx.gather(_valid(parent))})


def _numbered(intervals: pl.LazyFrame | pl.DataFrame, by: tuple[str, ...] | list[str]) -> pl.DataFrame:
    """Intervals (iv_idx, *by, ts_ns, end_ns) with both times, and `g`, their thread's number."""
    return (
        _columns(intervals, "iv_idx", *by, "ts_ns", "end_ns")
        .filter(pl.col("ts_ns").is_not_null() & pl.col("end_ns").is_not_null())
        .with_columns(g=pl.struct(*by).rank("dense").cast(pl.Int64) - 1)
    )


def _valid(rows: np.ndarray) -> pl.Series:
    """Rows of a native answer, null where it wrote -1 (none)."""
    r = pl.Series(rows)
    return pl.select(pl.when(r >= 0).then(r)).to_series()


def enclosing(
    points: pl.LazyFrame | pl.DataFrame,
    intervals: pl.LazyFrame | pl.DataFrame,
    start_order: StartOrder,
    outermost: bool = False,
) -> pl.DataFrame:
    """(point_id, iv_idx): for each point (point_id, pid, tid, t) the innermost (or outermost)
    interval (iv_idx, pid, tid, ts_ns, end_ns) that contains it; points inside none are left out."""
    points = _columns(points, "point_id", *THREAD, "t")
    found = around_one(points, intervals, start_order, pl.repeat(outermost, points.height, eager=True))
    return points.select("point_id").with_columns(iv_idx=found).filter(pl.col("iv_idx").is_not_null())


def around(
    points: pl.LazyFrame | pl.DataFrame,
    intervals: pl.LazyFrame | pl.DataFrame,
    start_order: StartOrder,
    by: tuple[str, ...] = tuple(THREAD),
) -> pl.DataFrame:
    """(point_id, *by, innermost, outermost): for each point (point_id, *by, t) the innermost and the
    outermost interval (iv_idx, *by, ts_ns, end_ns) that contain it, null where none does; points
    inside none are left out. `by` names a thread: it may add columns to (pid, tid) to nest
    several kinds of intervals apart in one call."""
    points = _columns(points, "point_id", *by, "t")
    found = points.select("point_id", *by).hstack(around_each(points, intervals, start_order, by))
    return found.filter(pl.col("innermost").is_not_null() | pl.col("outermost").is_not_null())


def around_each(
    points: pl.LazyFrame | pl.DataFrame,
    intervals: pl.LazyFrame | pl.DataFrame,
    start_order: StartOrder,
    by: tuple[str, ...] = tuple(THREAD),
) -> pl.DataFrame:
    """(innermost, outermost) of each point (*by, t), in the points' order: the innermost and the
    outermost interval (iv_idx, *by, ts_ns, end_ns) that contain it, null where none does."""
    located = _Located.of(points, intervals, start_order, by)
    if located is None:
        none = _nulls(points)
        return pl.DataFrame({"innermost": none, "outermost": none})
    return pl.DataFrame(
        {"innermost": located.open_at(located.depth), "outermost": located.open_at(located.depth.clip(upper_bound=1))}
    )


def around_one(
    points: pl.LazyFrame | pl.DataFrame,
    intervals: pl.LazyFrame | pl.DataFrame,
    start_order: StartOrder,
    outermost: pl.Series,
    by: tuple[str, ...] = tuple(THREAD),
) -> pl.Series:
    """iv_idx of the outermost interval that contains each point where `outermost` (booleans, one
    per point) is true, of the innermost elsewhere; null where none does: `around_each`'s answer
    that each point wants, found once (half the searches of both)."""
    if start_order in _NATIVE_ORDERS and native_nesting():
        return _around_one_native(points, intervals, start_order, outermost, tuple(by))
    located = _Located.of(points, intervals, start_order, by)  # polars: every start order
    if located is None:
        return _nulls(points).alias("iv_idx")
    depth = pl.select(pl.when(outermost).then(located.depth.clip(upper_bound=1)).otherwise(located.depth)).to_series()
    return located.open_at(depth).alias("iv_idx")


def rows_around(
    points: pl.DataFrame,
    intervals: pl.DataFrame,
    start_order: StartOrder,
    outermost: pl.Series,
    by: tuple[str, str, str],
) -> pl.Series:
    """`around_one`'s answer as the row of `intervals` (iv_idx unique, `by` three columns) that
    holds it, null where none does: the caller takes the interval's other columns by position.

    In the compiled module (`around_keyed`) the three columns name the threads as they are,
    numbered in a small hash table: on linking's cells (32K launches among 64K slices, `by` =
    (pid, tid, nest)) numbering them and joining the points to them took half of `around_one`'s
    15 ms in polars. Where it is not built, or a column holds a null, `around_one` answers and its
    iv_idx are looked up."""
    keyed = [*by, "ts_ns", "end_ns", "iv_idx"]
    if (
        _native_around_keyed is None
        or start_order not in _NATIVE_ORDERS
        or not native.allowed()
        or intervals.select(pl.any_horizontal(pl.col(keyed).is_null().any())).item()
    ):
        around = around_one(points, intervals, start_order, outermost, by).to_frame("iv_idx")
        rows = intervals.select("iv_idx").with_row_index("row")
        return around.join(rows, on="iv_idx", how="left", maintain_order="left")["row"].cast(pl.Int64)
    known = points.select(pl.all_horizontal(pl.col(*by, "t").is_not_null())).to_series()

    def ints(frame: pl.DataFrame, c: str) -> np.ndarray:
        return frame[c].cast(pl.Int64).fill_null(0).to_numpy()

    found = np.empty(points.height, np.int64)
    _native_around_keyed(
        *(ints(intervals, c) for c in keyed),
        *(ints(points, c) for c in by),
        known.to_numpy().astype(np.uint8),
        ints(points, "t"),
        outermost.fill_null(False).to_numpy().astype(np.uint8),
        _NATIVE_ORDERS[start_order],
        found,
    )
    return _valid(found)


def native_nesting() -> bool:
    """Whether `around_one` sweeps in the compiled module (`native/nesting.cpp`): installed, of
    a build that has it, and not turned off (TRACEPIPE_NATIVE=0)."""
    return _native_around is not None and native.allowed()


def _around_one_native(
    points: pl.LazyFrame | pl.DataFrame,
    intervals: pl.LazyFrame | pl.DataFrame,
    start_order: StartOrder,
    outermost: pl.Series,
    by: tuple[str, ...],
) -> pl.Series:
    """`around_one` by one sweep per thread in the compiled module: the same rule, without the
    sorts of composite keys and the binary searches (on a 1 GB trace's link pass, ~0.6 CPU-s of
    polars)."""
    assert _native_around is not None
    iv = _numbered(intervals, by)
    threads = iv.select(*by, "g").unique("g")
    p = (
        _columns(points, *by, "t")
        .join(threads, on=list(by), how="left", nulls_equal=True, maintain_order="left")
        .select(g=pl.when(pl.col("t").is_not_null()).then("g").fill_null(-1), t=pl.col("t").fill_null(0))
    )
    found = np.empty(p.height, np.int64)
    _native_around(
        *(iv[c].cast(pl.Int64).to_numpy() for c in ("g", "ts_ns", "end_ns", "iv_idx")),
        p["g"].to_numpy(),
        p["t"].cast(pl.Int64).to_numpy(),
        outermost.fill_null(False).to_numpy().astype(np.uint8),
        _NATIVE_ORDERS[start_order],
        found,
    )
    return iv["iv_idx"].gather(_valid(found)).alias("iv_idx")


def _nulls(points: pl.LazyFrame | pl.DataFrame) -> pl.Series:
    n = points.select(pl.len()).collect().item() if isinstance(points, pl.LazyFrame) else points.height
    return pl.repeat(None, n, dtype=pl.Int64, eager=True)


@dataclass(frozen=True)
class _Located:
    """Points (*by, t) on the threads of some intervals: each one's thread `g`, the position after
    the last start at or before it (`started`) and its depth (0 outside every interval, and for
    points on a thread without intervals)."""

    threads: _Threads
    points: pl.DataFrame  # g, t, started
    depth: pl.Series

    @classmethod
    def of(
        cls, points: pl.LazyFrame | pl.DataFrame, intervals: pl.LazyFrame | pl.DataFrame, start_order: StartOrder, by
    ) -> _Located | None:
        by = tuple(by)
        points = _columns(points, *by, "t")
        t = _Threads.of(intervals, start_order, by)
        if t.starts.is_empty():
            return None
        p = points.join(t.threads, on=list(by), how="left", nulls_equal=True, maintain_order="left")
        known = p["g"].is_not_null() & p["t"].is_not_null()  # on a thread with intervals
        p = p.select(pl.col("g", "t").fill_null(0))
        key = t.times.of(p["t"], p["g"])
        started = t.start_keys.search_sorted(key, side="right").cast(pl.Int64)  # a position: first + count
        depth = started - t.end_keys.search_sorted(key, side="right").cast(pl.Int64)
        return cls(t, p.with_columns(started=started), pl.select(pl.when(known).then(depth).otherwise(0)).to_series())

    def open_at(self, depth: pl.Series) -> pl.Series:
        """iv_idx of the last interval at `depth` (> 0) that started before each point (on its
        thread, at a position before `started`), if it has not ended before the point's t; else
        null."""
        t, points = self.threads, self.points
        pos = t.last_start_at(points["g"], depth, points["started"])
        return points.select(
            pl.when((depth > 0) & (t.starts["end_ns"].gather(pos) >= pl.col("t"))).then(t.starts["iv_idx"].gather(pos))
        ).to_series()
