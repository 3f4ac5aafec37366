"""launch: per device, launch-call durations and launch-to-start delays (exact percentiles of the
GPU sweep's value counts) and how many kernels ran shorter than their launch call."""

from __future__ import annotations

import polars as pl

from pipeline.analyses.activity import LAUNCH_QUANTILES
from pipeline.analyses.flat import as_flat
from pipeline.analyses.rollup import us


def launch_overhead(flat) -> pl.DataFrame:
    """Per device, over kernels linked to their launch call: the launch call's duration, the delay
    from the launch call's start to the kernel's start (p50/p90/p99/max), and the share of
    kernels that ran shorter than their launch call took."""
    launch = as_flat(flat).activity.launch
    percentiles = [
        us(f"{metric}_q{i}").alias(f"{prefix}_p{round(q * 100)}_us")
        for metric, prefix in (("launch", "launch"), ("delay", "launch_to_start"))
        for i, q in enumerate(LAUNCH_QUANTILES)
    ]
    shorter = pl.when(pl.col("compared") > 0).then(100 * (pl.col("shorter") / pl.col("compared")))
    return launch.select(
        "device",
        *percentiles[:3],
        us("launch_max_ns").alias("launch_max_us"),
        *percentiles[3:],
        us("delay_max_ns").alias("launch_to_start_max_us"),
        pl.col("kernels").cast(pl.UInt32),
        shorter.alias("shorter_than_launch_pct"),
    ).sort("device")
