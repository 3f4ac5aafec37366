"""busy: busy and idle time per device (or stream) from the GPU sweep's unions of activity."""

from __future__ import annotations

import polars as pl

from pipeline.analyses.activity import CPU_DEVICE
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
    idle gaps (count, largest); per device also kernel_busy_pct, the union of its kernels alone
    over the same span (transfers left out)."""
    f = as_flat(flat)
    by = ["device", "stream"] if per_stream else ["device"]
    stats = _span_stats(f.activity.runs["stream" if per_stream else "device"], by).sort(by)
    if per_stream:
        return stats
    kernels = f.activity.runs["kernel"].select("device", kernel_busy_ns="busy_ns")
    span = pl.col("end_ns") - pl.col("start_ns")
    return (
        stats.join(f.activity_devices, on="device", how="left", maintain_order="left")
        .join(kernels, on="device", how="left", maintain_order="left")
        .with_columns(
            kernel_busy_pct=pl.when((span > 0) & (pl.col("device") != CPU_DEVICE)).then(
                100 * pl.col("kernel_busy_ns").fill_null(0) / span
            )
        )
        .select(
            "device",
            "name",
            "busy_pct",
            "kernel_busy_pct",
            pl.exclude("device", "name", "busy_pct", "kernel_busy_pct", "kernel_busy_ns"),
        )
    )
