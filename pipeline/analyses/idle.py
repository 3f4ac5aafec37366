"""idle: why a GPU stream sat idle, gap by gap (Holistic Trace Analysis' definition).

Per device and stream, over its GPU activities (kernels, memcpy, memset) in start order: each gap
between an activity's end and the next one's start (negative when they overlap: summed as it is)
is **host wait** when the next activity's launch call started after the previous activity ended
(the CPU was late), else **kernel wait** when the gap is shorter than `kernel_wait_us` (default 30
µs: back-to-back kernels), else **other**. Nothing is counted before the first activity or after
the last. An activity whose launch is not in the trace is never host wait.
"""

from __future__ import annotations

import polars as pl

from pipeline.analyses.flat import Flat, as_flat
from pipeline.analyses.gpu_order import STREAM, StreamCarry, activity_windows
from pipeline.analyses.sweep import fold

KERNEL_WAIT_US = 30.0
SUMS = ["idle_ns", "host_wait_ns", "kernel_wait_ns", "other_ns", "gaps"]


def _gaps(rows: pl.DataFrame, kernel_wait_ns: float) -> pl.DataFrame:
    prev_end = pl.col("end_ns").shift(1).over(STREAM)
    gap = pl.col("ts_ns") - prev_end
    host = pl.col("launch_ts_ns").is_not_null() & (pl.col("launch_ts_ns") > prev_end)
    g = rows.with_columns(gap=gap, host=host).filter(~pl.col("carried"))  # every stream gets a row
    counted = pl.col("gap").is_not_null()
    return g.group_by(STREAM).agg(
        idle_ns=pl.col("gap").filter(counted).sum(),
        host_wait_ns=pl.col("gap").filter(counted & pl.col("host")).sum(),
        kernel_wait_ns=pl.col("gap").filter(counted & ~pl.col("host") & (pl.col("gap") < kernel_wait_ns)).sum(),
        other_ns=pl.col("gap").filter(counted & ~pl.col("host") & (pl.col("gap") >= kernel_wait_ns)).sum(),
        gaps=counted.sum().cast(pl.Int64),
    )


def idle(flat, kernel_wait_us: float = KERNEL_WAIT_US) -> pl.DataFrame:
    """(device, stream, idle_us, host_wait_us, kernel_wait_us, other_us, gaps): the idle time between
    the stream's activities and its breakdown (see the module docstring); host + kernel + other = idle."""
    f: Flat = as_flat(flat)
    carry, total = StreamCarry(1), None
    for rows in activity_windows(f, ["launch_ts_ns"]):
        total = fold(total, _gaps(carry.prepend(rows), kernel_wait_us * 1e3), STREAM, [pl.col(SUMS).sum()])
    if total is None:
        return pl.DataFrame(
            schema={
                "device": pl.Int64,
                "stream": pl.Int64,
                **{c.replace("_ns", "_us"): pl.Float64 for c in SUMS[:-1]},
                "gaps": pl.Int64,
            }
        )
    return total.sort(STREAM).select(
        *STREAM, *((pl.col(c) / 1e3).alias(c.replace("_ns", "_us")) for c in SUMS[:-1]), "gaps"
    )
