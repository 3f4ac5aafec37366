"""communication: collective kernels per device and how much of their busy time compute overlaps,
from the GPU sweep's unions (|collectives| + |compute| - |all kernels|)."""

from __future__ import annotations

import polars as pl

from pipeline.analyses.activity import COLLECTIVE, KERNEL
from pipeline.analyses.flat import as_flat
from pipeline.analyses.rollup import us


def communication(flat) -> pl.DataFrame:
    """Per device with collective kernels (category communication): their count, summed time,
    busy time (union), the part of it overlapped by compute kernels (any other kernel on the
    device) and the exposed rest. Overlap = |collectives| + |compute| - |all kernels| (unions)."""
    a = as_flat(flat).activity
    sums = (
        a.names.filter(KERNEL & COLLECTIVE)
        .group_by("device")
        .agg(comm_kernels=pl.col("n").sum().cast(pl.UInt32), comm_ns=pl.col("dur_ns").sum())
    )
    for name in ("comm", "compute", "kernel"):
        sums = sums.join(
            a.runs[name].select("device", pl.col("busy_ns").alias(f"{name}_busy_ns")),
            on="device",
            how="left",
            maintain_order="left",
        )
    overlap = pl.col("comm_busy_ns") + pl.col("compute_busy_ns").fill_null(0) - pl.col("kernel_busy_ns")
    return (
        sums.with_columns(overlap_ns=overlap)
        .select(
            "device",
            "comm_kernels",
            comm_us=us("comm_ns"),
            comm_busy_us=us("comm_busy_ns"),
            overlapped_us=us("overlap_ns"),
            overlap_pct=pl.when(pl.col("comm_busy_ns") > 0).then(100 * pl.col("overlap_ns") / pl.col("comm_busy_ns")),
            exposed_us=us("comm_busy_ns") - us("overlap_ns"),
        )
        .sort("device")
    )
