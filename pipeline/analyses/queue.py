"""queue: how many launched activities waited to start on each GPU stream.

Per device and stream, each GPU activity with a launch call in the trace adds 1 to the stream's
queue when the call starts and takes 1 off when the activity starts (a graph launch that starts 50
kernels adds 50; at equal times the activity counts first). Reported: the largest depth (`max`),
the time-weighted mean depth over the stream's span (first to last change; the integral of the
depth is the summed waits, start - launch), and the time spent at or above `queue_full` (default
1024, the CUDA launch queue's limit, where the launching CPU thread blocks). `queue_series` gives
the depth over time (for the timeline figure) from the same points and depths (`depth_windows`).
"""

from __future__ import annotations

from collections.abc import Iterator

import polars as pl

from pipeline.analyses.flat import Flat, as_flat
from pipeline.analyses.gpu_order import STREAM
from pipeline.analyses.series import Extremes
from pipeline.analyses.sweep import PER_WINDOW, fold, read, time_windows, within
from pipeline.analyses.window import trace_origin_ns

QUEUE_FULL = 1024
LAUNCHED = (
    pl.col("device").is_not_null()
    & pl.col("stream").is_not_null()
    & pl.col("ts_ns").is_not_null()
    & pl.col("launch_ts_ns").is_not_null()
)


def _points(f: Flat, window) -> pl.DataFrame:
    """(device, stream, t, d) of the window: +1 at launches, -1 at starts, activity first at ties."""
    path, which = f.gpu_ops_file, LAUNCHED & f.time_filter()
    starts = read(path, which & within(window), [*STREAM, pl.col("ts_ns").alias("t"), pl.lit(-1, pl.Int64).alias("d")])
    launches = read(
        path,
        which & within(window, "launch_ts_ns"),
        [*STREAM, pl.col("launch_ts_ns").alias("t"), pl.lit(1, pl.Int64).alias("d")],
    )
    return pl.concat([starts, launches]).sort(*STREAM, "t", "d")


def _with_depth(points: pl.DataFrame, carry: pl.DataFrame | None) -> pl.DataFrame:
    """The window's points (device, stream, t, d) in order, each with `depth` (the stream's queue
    after it) and `next_t` (the stream's next point in the window), after a row per stream carried
    from earlier windows (t: its last change, d: its depth then; `carried` true: not a change)."""
    points = points.with_columns(carried=pl.lit(False))
    if carry is not None:
        carried = carry.select(*STREAM, "t", d=pl.col("depth"), carried=pl.lit(True))
        points = pl.concat([carried, points]).sort(*STREAM, "t", "d")  # carried rows are earlier: first
    return points.with_columns(depth=pl.col("d").cum_sum().over(STREAM), next_t=pl.col("t").shift(-1).over(STREAM))


def depth_windows(f: Flat) -> Iterator[pl.DataFrame]:
    """Every stream's queue depth, window by window of the launched activities' start time
    (`_with_depth`: the depth each stream had at the end of the windows before is carried in)."""
    path, which = f.gpu_ops_file, LAUNCHED & f.time_filter()
    carry = None
    for window in time_windows(path, which, PER_WINDOW):
        p = _with_depth(_points(f, window), carry)
        carry = p.group_by(STREAM).agg(pl.col("t").last(), pl.col("depth").last())
        yield p


class QueueTally:
    """Folds windows of depths (`depth_windows`): per stream the max, the time at full, the first change."""

    def __init__(self, full: int):
        self.full = full
        self.totals: pl.DataFrame | None = None

    def add(self, p: pl.DataFrame):
        held = (pl.col("next_t") - pl.col("t")).fill_null(0)
        part = p.group_by(STREAM).agg(
            max=pl.col("depth").filter(~pl.col("carried")).max(),
            full_ns=held.filter(pl.col("depth") >= self.full).sum(),
            first_ns=pl.col("t").min(),
        )
        self.totals = fold(
            self.totals, part, STREAM, [pl.col("max").max(), pl.col("full_ns").sum(), pl.col("first_ns").min()]
        )


def queue(flat, queue_full: int = QUEUE_FULL) -> pl.DataFrame:
    """(device, stream, max, mean, blocked_us, span_us, launched): the launch queue of each stream."""
    f: Flat = as_flat(flat)
    path, which = f.gpu_ops_file, LAUNCHED & f.time_filter()
    waits = (
        pl.scan_parquet(path)
        .filter(which)
        .group_by(STREAM)
        .agg(
            wait_ns=(pl.col("ts_ns") - pl.col("launch_ts_ns")).sum(),
            launched=pl.len().cast(pl.Int64),
            last_ns=pl.max_horizontal("ts_ns", "launch_ts_ns").max(),
        )
        .collect(engine="streaming")
    )
    tally = QueueTally(queue_full)
    for p in depth_windows(f):
        tally.add(p)
    if tally.totals is None:
        return pl.DataFrame(
            schema={
                **dict.fromkeys(STREAM, pl.Int64),
                "max": pl.Int64,
                "mean": pl.Float64,
                "blocked_us": pl.Float64,
                "span_us": pl.Float64,
                "launched": pl.Int64,
            }
        )
    span = pl.col("last_ns") - pl.col("first_ns")
    return (
        tally.totals.join(waits, on=STREAM)
        .select(
            *STREAM,
            "max",
            mean=pl.when(span > 0).then(pl.col("wait_ns") / span).otherwise(0.0),
            blocked_us=pl.col("full_ns") / 1e3,
            span_us=span / 1e3,
            launched="launched",
        )
        .sort(STREAM)
    )


def queue_series(flat, max_points: int = 4000) -> pl.DataFrame:
    """(device, stream, t_us, depth): each stream's queue depth after each of its points (a launch
    call's start, an activity's start; `depth_windows`, as queue()), t_us from the trace's first
    event, in time order; at most `max_points` rows per stream (`Extremes`: past that, per bucket
    of time the points of its smallest and largest depth), so that its max equals queue()'s."""
    f: Flat = as_flat(flat)
    schema = pl.Schema({"device": pl.Int64, "stream": pl.Int64, "t_us": pl.Float64, "depth": pl.Int64})
    points = pl.scan_parquet(f.gpu_ops_file).filter(LAUNCHED & f.time_filter())
    times = (
        pl.min_horizontal("ts_ns", "launch_ts_ns").min().alias("lo"),
        pl.max_horizontal("ts_ns", "launch_ts_ns").max(),
    )
    lo, hi = points.select(*times).collect(engine="streaming").row(0)
    if lo is None:
        return pl.DataFrame(schema=schema)
    tally = Extremes(STREAM, ["t", "seq"], ["depth"], (lo, hi), max_points)
    seen = 0
    for p in depth_windows(f):
        changes = p.filter(~pl.col("carried"))
        tally.add(changes.with_columns(seq=pl.int_range(pl.len(), dtype=pl.Int64) + seen))
        seen += changes.height
    out = tally.result()
    if not out.height:
        return pl.DataFrame(schema=schema)
    return out.select(
        *STREAM, t_us=(pl.col("t") - trace_origin_ns(f.path / "events.parquet")) / 1e3, depth="depth"
    ).cast(schema)
