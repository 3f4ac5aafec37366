"""categories: each kernel category's share of a device's activity time (`pipeline.cost.categories`)."""

from __future__ import annotations

import polars as pl

from pipeline.analyses.flat import as_flat
from pipeline.analyses.rollup import rolled, us


def categories(flat) -> pl.DataFrame:
    """Per device and category: ops, dur_us and pct of the device's summed activity time."""
    t = rolled(as_flat(flat).activity.names, ["device", "category"])
    return t.select(
        "device",
        "category",
        count=pl.col("n").cast(pl.UInt32),
        dur_us=us("dur_ns"),
        pct=100 * us("dur_ns") / us(pl.col("dur_ns").sum().over("device")),
    ).sort("device", "dur_us", "category", descending=[False, True, False])
