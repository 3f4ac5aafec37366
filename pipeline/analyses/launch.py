"""launch: per device, launch-call durations and launch-to-start delays (exact percentiles of the
GPU sweep's value counts) and how many kernels ran shorter than their launch call."""

from __future__ import annotations

import polars as pl

from pipeline.analyses.activity import LAUNCH_QUANTILES
from pipeline.analyses.flat import as_flat
from pipeline.analyses.graphs import graph_launches
from pipeline.analyses.rollup import us


def launch_overhead(flat) -> pl.DataFrame:
    """Per device, over kernels linked to an eager launch call: the launch call's duration, the
    delay from the launch call's start to the kernel's start (p50/p90/p99/max), and the share of
    kernels that ran shorter than their launch call took; then its CUDA/HIP graph launches
    (`graphs.graph_launches`): how many, the kernels they started, the median graph launch call
    against the launch calls its capture made (the eager launches it replaces), and the median
    delay to its first kernel."""
    f = as_flat(flat)
    launch = f.activity.launch
    percentiles = [
        us(f"{metric}_q{i}").alias(f"{prefix}_p{round(q * 100)}_us")
        for metric, prefix in (("launch", "launch"), ("delay", "launch_to_start"))
        for i, q in enumerate(LAUNCH_QUANTILES)
    ]
    shorter = pl.when(pl.col("compared") > 0).then(100 * (pl.col("shorter") / pl.col("compared")))
    eager = launch.select(
        "device",
        *percentiles[:3],
        us("launch_max_ns").alias("launch_max_us"),
        *percentiles[3:],
        us("delay_max_ns").alias("launch_to_start_max_us"),
        pl.col("kernels").cast(pl.UInt32),
        shorter.alias("shorter_than_launch_pct"),
    )
    graphs = graph_launches(f)
    if graphs.is_empty():
        return eager.sort("device")
    return eager.join(graphs, on="device", how="full", coalesce=True).sort("device")
