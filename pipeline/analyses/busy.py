"""busy: busy and idle time per device (or stream) from the GPU sweep's unions of activity."""

from __future__ import annotations

import polars as pl

from pipeline.analyses.flat import as_flat
from pipeline.analyses.rollup import us


def _span_stats(runs: pl.DataFrame, by: list[str]) -> pl.DataFrame:
    """Busy/idle figures of unions (`RunTally.result`)."""
    span = pl.col("end_ns") - pl.col("start_ns")
    return runs.select(
        *by,
        span_us=us(span),
        busy_us=us("busy_ns"),
        busy_pct=pl.when(span > 0).then(100 * pl.col("busy_ns") / span).otherwise(0.0),
        idle_us=us(span) - us("busy_ns"),
        gaps=pl.col("runs") - 1,
        largest_gap_us=us(pl.col("largest_gap_ns").fill_null(0)),
        start_ns="start_ns",
        end_ns="end_ns",
    )


def busy(flat, per_stream: bool = False) -> pl.DataFrame:
    """Per device (or device and stream): the union of all activity intervals (kernels, memcpy,
    memset) over the span from the first start to the last end: busy_us, busy_pct, idle_us,
    idle gaps (count, largest)."""
    f = as_flat(flat)
    by = ["device", "stream"] if per_stream else ["device"]
    stats = _span_stats(f.activity.runs["stream" if per_stream else "device"], by).sort(by)
    if per_stream:
        return stats
    return stats.join(f.activity_devices, on="device", how="left", maintain_order="left").select(
        "device", "name", pl.exclude("device", "name")
    )
