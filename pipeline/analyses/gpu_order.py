"""gpu_order: a trace's GPU activity stream by stream in start order, window by window in time,
each window's rows carrying what the windows before left on their stream: the shared reading of
the analyses that look at consecutive activities (idle time, launch queue, kernel sequences)."""

from __future__ import annotations

from collections.abc import Iterator

import polars as pl

from pipeline.analyses.flat import Flat
from pipeline.analyses.sweep import PER_WINDOW, read, time_windows, within

STREAM = ["device", "stream"]
ORDER = [*STREAM, "ts_ns", "end_ns", "event_idx"]  # start order on a stream; ties: shorter, then file order


def activity_windows(f: Flat, columns: list, where: pl.Expr = pl.lit(True)) -> Iterator[pl.DataFrame]:
    """The GPU activity `where` selects (on a device and stream, in the analysis window), window by
    window in start time, each window sorted by stream, start and end (`ORDER`); `end_ns` added."""
    path = f.gpu_ops_file
    on_stream = pl.col("device").is_not_null() & pl.col("stream").is_not_null() & pl.col("ts_ns").is_not_null()
    which = on_stream & where & f.time_filter()
    end = (pl.col("ts_ns") + pl.col("dur_ns").fill_null(0)).alias("end_ns")
    for window in time_windows(path, which, PER_WINDOW):
        rows = read(path, which & within(window), ["event_idx", *STREAM, "ts_ns", end, *columns])
        if rows.height:
            yield rows.sort(ORDER)


class StreamCarry:
    """The last `n` rows of each stream seen so far, put before the next window's rows of the stream
    (marked `carried`), so that consecutive activities are consecutive across windows too. With
    `reach`, each row gets `reach_ns`, its stream's reach: the latest end of it and every activity
    before it on the stream (across windows too), where the stream is busy until."""

    def __init__(self, n: int = 1, reach: bool = False):
        self.n = n
        self.reach = reach
        self.last: pl.DataFrame | None = None

    def prepend(self, rows: pl.DataFrame) -> pl.DataFrame:
        rows = rows.with_columns(carried=pl.lit(False))
        # the carried rows started in earlier windows: before every row of this one
        out = rows if self.last is None else pl.concat([self.last, rows], how="diagonal_relaxed").sort(ORDER)
        if self.reach:  # a carried row holds its reach already
            reach = pl.coalesce("reach_ns", "end_ns") if "reach_ns" in out.columns else pl.col("end_ns")
            out = out.with_columns(reach_ns=reach.cum_max().over(STREAM))
        self.last = out.group_by(STREAM, maintain_order=True).tail(self.n).with_columns(carried=pl.lit(True))
        return out
