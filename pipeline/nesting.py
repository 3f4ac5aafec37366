"""nesting: how intervals on a thread nest (depth, parent) and which of them enclose points in time.

Intervals are (iv_idx, pid, tid, ts_ns, end_ns), one thread being a (pid, tid). The depth of an
instant is the number of intervals open there: the starts before it minus the ends before it, in
this order at one instant: ends of non-empty intervals, then starts (in a given start order),
then points, then ends of zero-length intervals. So an end counts before time t when it is <= t,
or < t for a zero-length interval, i.e. when its `effective end` (end, or end + 1 for a
zero-length interval; times are integer ns) is <= t.

Both counts are binary searches (`search_sorted`) in one thread's sorted starts and sorted
effective ends: a thread's starts, ends and points are never sorted together. That merged sort
(three rows per interval, five sort keys) was the memory peak of linking a large trace; these
sorts hold one narrow row per interval, one thread at a time.

Answers, per thread:
- the depth of every interval (of its start), and its parent: the last start at depth - 1 before
  it in start order (`nesting`);
- for points (point_id, pid, tid, t): the innermost interval around each point, the last start at
  the point's depth before it that has not ended before t, or the outermost (depth 1)
  (`enclosing`).

"The last start at depth d before position s" is one more binary search: starts sorted by the key
depth * (n + 1) + position (n starts on the thread) put each depth's starts together in start
order, and the search for d * (n + 1) + s lands just after the wanted one.
"""
from __future__ import annotations

from dataclasses import dataclass

import polars as pl

THREAD = ["pid", "tid"]


@dataclass(frozen=True)
class StartOrder:
    """How starts at one instant are ordered (first = outer), after their time: by `columns`
    of the intervals, each ascending unless `descending`."""

    columns: tuple[str, ...]
    descending: tuple[bool, ...]


FILE_ORDER = StartOrder(("iv_idx",), (False,))  # identical intervals nest in file order
LONGER_FIRST = StartOrder(("end_ns", "iv_idx"), (True, False))  # then file order


def _columns(frame: pl.LazyFrame | pl.DataFrame, *columns: str) -> pl.DataFrame:
    """The columns of a frame (a DataFrame's are shared, not copied)."""
    return frame.select(columns) if isinstance(frame, pl.DataFrame) else frame.select(columns).collect()


def _by_thread(frame: pl.DataFrame, order: list[str], descending: list[bool],
               by: tuple[str, ...] = THREAD) -> dict[tuple, pl.DataFrame]:
    """The rows of each thread (`by`) sorted by `order`, without the thread columns. Split first,
    then each thread sorted: one sort on all the keys costs several times more."""
    parts = frame.partition_by(list(by), as_dict=True, maintain_order=True)
    return {thread: (part.sort(order, descending=descending) if order else part).drop(by)
            for thread, part in parts.items()}


def _starts(intervals: pl.LazyFrame | pl.DataFrame, start_order: StartOrder,
            by: tuple[str, ...] = THREAD) -> dict[tuple, pl.DataFrame]:
    """Each thread's intervals in start order (iv_idx, ts_ns, end_ns)."""
    iv = _columns(intervals, "iv_idx", *by, "ts_ns", "end_ns")
    return _by_thread(iv, ["ts_ns", *start_order.columns], [False, *start_order.descending], by)


def _with_depth(starts: pl.DataFrame) -> tuple[pl.DataFrame, pl.Series]:
    """One thread's intervals (in start order) with `seq` (0, 1, ...) and the `depth` of their
    start, and the thread's effective ends, sorted (see the module doc)."""
    zero_length = pl.col("end_ns") == pl.col("ts_ns")
    ends = starts.select(pl.when(zero_length).then(pl.col("end_ns") + 1).otherwise(pl.col("end_ns"))).to_series().sort()
    ended = pl.lit(ends).search_sorted(pl.col("ts_ns"), side="right").cast(pl.Int64)
    return starts.with_row_index("seq").with_columns(depth=pl.col("seq").cast(pl.Int64) + 1 - ended), ends


def _depth_keys(starts: pl.DataFrame) -> pl.Series:
    """The keys depth * (n + 1) + seq of one thread's starts (n of them), sorted (see the module doc)."""
    return starts.select(pl.col("depth") * (starts.height + 1) + pl.col("seq").cast(pl.Int64)).to_series().sort()


def _last_start_at(starts: pl.DataFrame, depth: pl.Series, before: pl.Series, keys: pl.Series | None = None
                   ) -> pl.Series:
    """For each (depth d, position s): the seq of the last start at depth d with seq < s, else null
    (`keys`: the starts' `_depth_keys`, when they are at hand)."""
    span = starts.height + 1
    keys = _depth_keys(starts) if keys is None else keys
    wanted = depth.cast(pl.Int64) * span + before.cast(pl.Int64)
    pos = keys.search_sorted(wanted, side="left").cast(pl.Int64) - 1  # the last key below `wanted`
    key = keys.gather(pos.clip(0))
    return pl.select(pl.when((pos >= 0) & (key // span == depth.cast(pl.Int64))).then(key % span)).to_series()


def nesting(intervals: pl.LazyFrame | pl.DataFrame, start_order: StartOrder) -> pl.DataFrame:
    """(iv_idx, depth, parent_idx) of intervals (iv_idx, pid, tid, ts_ns, end_ns)."""
    out = [pl.DataFrame(schema={"iv_idx": pl.Int64, "depth": pl.Int64, "parent_idx": pl.Int64})]
    for starts in _starts(intervals, start_order).values():
        starts, _ = _with_depth(starts)
        parent = _last_start_at(starts, starts["depth"] - 1, starts["seq"])
        out.append(starts.select("iv_idx", "depth", parent_idx=starts["iv_idx"].gather(parent)))
    return pl.concat(out)


def enclosing(points: pl.LazyFrame | pl.DataFrame, intervals: pl.LazyFrame | pl.DataFrame,
              start_order: StartOrder, outermost: bool = False) -> pl.DataFrame:
    """(point_id, iv_idx): for each point (point_id, pid, tid, t) the innermost (or outermost)
    interval (iv_idx, pid, tid, ts_ns, end_ns) that contains it; points inside none are left out."""
    found = around(points, intervals, start_order)
    which = "outermost" if outermost else "innermost"
    return found.filter(pl.col(which).is_not_null()).select("point_id", iv_idx=which)


def around(points: pl.LazyFrame | pl.DataFrame, intervals: pl.LazyFrame | pl.DataFrame,
           start_order: StartOrder, by: tuple[str, ...] = THREAD) -> pl.DataFrame:
    """(point_id, *by, innermost, outermost): for each point (point_id, *by, t) the innermost and the
    outermost interval (iv_idx, *by, ts_ns, end_ns) that contain it, null where none does; points
    inside none are left out. `by` names a thread: it may add columns to (pid, tid) to nest
    several kinds of intervals apart in one call."""
    points = _columns(points, "point_id", *by, "t")
    starts_of = _starts(intervals, start_order, by)
    out = [pl.DataFrame(schema={"point_id": pl.Int64, **{c: points.schema[c] for c in by},
                                "innermost": pl.Int64, "outermost": pl.Int64})]
    for thread, p in _by_thread(points, [], [], by).items():
        if thread not in starts_of:
            continue
        starts, ends = _with_depth(starts_of[thread])
        started = starts["ts_ns"].search_sorted(p["t"], side="right").cast(pl.Int64)
        depth = started - ends.search_sorted(p["t"], side="right").cast(pl.Int64)
        p = p.with_columns(started=started, depth=depth).filter(pl.col("depth") > 0)
        keys = _depth_keys(starts)
        innermost = _open_at(starts, p, p["depth"], keys)
        outermost = _open_at(starts, p, pl.repeat(1, p.height, dtype=pl.Int64, eager=True), keys)
        found = p.select("point_id", *(pl.lit(v, points.schema[c]).alias(c) for c, v in zip(by, thread)),
                         innermost=innermost, outermost=outermost)
        out.append(found.filter(pl.col("innermost").is_not_null() | pl.col("outermost").is_not_null()))
    return pl.concat(out)


def _open_at(starts: pl.DataFrame, points: pl.DataFrame, depth: pl.Series, keys: pl.Series) -> pl.Series:
    """iv_idx of the last interval at `depth` that started before each point (`started` starts
    before it), if it has not ended before the point's t; else null."""
    seq = _last_start_at(starts, depth, points["started"], keys)
    return points.select(pl.when(starts["end_ns"].gather(seq) >= pl.col("t")).then(starts["iv_idx"].gather(seq))
                         ).to_series()
