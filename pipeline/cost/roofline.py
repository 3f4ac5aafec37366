"""roofline: the one rule for what bounds a kernel.

A kernel of arithmetic intensity AI (FLOP per byte) on a device of peak P (TFLOP/s) and bandwidth
B (GB/s) can reach min(P, AI x B / 1000) TFLOP/s: it is compute-bound when AI x B / 1000 >= P
(at or past the ridge point P x 1000 / B), else memory-bound; and a kernel whose bytes moved
faster than B (achieved GB/s above the DRAM roof) took them from the cache, not DRAM: `cache`.
The peak P is that of the kernel's math mode (`peaks.mode_peak`). Used by costing (per kernel),
the reports (per aggregated row) and the roofline plot (the ridge it draws).
"""

from __future__ import annotations

import polars as pl


def ridge(peak_tflops: float, peak_bw_gbps: float) -> float:
    """The arithmetic intensity (FLOP/byte) where the memory roof meets the compute roof."""
    return peak_tflops * 1e3 / peak_bw_gbps


BOUNDS = {  # roofline_bound: what bounds a kernel
    "compute": "its arithmetic intensity is at or past the ridge point: the FLOP peak of its math mode bounds it",
    "memory": "below the ridge point: DRAM bandwidth bounds it",
    "cache": "it moved its bytes faster than DRAM can (achieved GB/s above the DRAM roof): they came from the cache",
}


def bound(
    intensity: pl.Expr, peak_tflops: pl.Expr, peak_bw_gbps: pl.Expr, achieved_gbps: pl.Expr | None = None
) -> pl.Expr:
    """ "compute" or "memory" (null when the intensity or a peak is unknown); "cache" whatever the
    intensity when `achieved_gbps` exceeds the bandwidth (`BOUNDS`)."""
    unknown = intensity.is_null() | peak_tflops.is_null() | peak_bw_gbps.is_null()
    above_dram = pl.lit(False) if achieved_gbps is None else (achieved_gbps > peak_bw_gbps).fill_null(False)
    return (
        pl.when(above_dram)
        .then(pl.lit("cache"))
        .when(unknown)
        .then(None)
        .when(intensity * peak_bw_gbps / 1e3 >= peak_tflops)
        .then(pl.lit("compute"))
        .otherwise(pl.lit("memory"))
    )


def intensity(flops: pl.Expr, bytes_: pl.Expr) -> pl.Expr:
    """FLOP per byte, null without bytes."""
    return pl.when(bytes_ > 0).then(flops / bytes_)
