"""roofline: the one rule for what bounds a kernel, and which peak its dtype can reach.

A kernel of arithmetic intensity AI (FLOP per byte) on a device of peak P (TFLOP/s) and bandwidth
B (GB/s) can reach min(P, AI x B / 1000) TFLOP/s: it is compute-bound when AI x B / 1000 >= P
(at or past the ridge point P x 1000 / B), else memory-bound. The peak P depends on the kernel's
dtype (`dtype_peak`). Used by costing (per kernel), the reports (per aggregated row) and the
roofline plot (the ridge it draws).
"""

from __future__ import annotations

import polars as pl

from pipeline.cost.devices import DTYPE_PEAK


def ridge(peak_tflops: float, peak_bw_gbps: float) -> float:
    """The arithmetic intensity (FLOP/byte) where the memory roof meets the compute roof."""
    return peak_tflops * 1e3 / peak_bw_gbps


def bound(intensity: pl.Expr, peak_tflops: pl.Expr, peak_bw_gbps: pl.Expr) -> pl.Expr:
    """ "compute" or "memory" (null when the intensity or a peak is unknown)."""
    unknown = intensity.is_null() | peak_tflops.is_null() | peak_bw_gbps.is_null()
    return (
        pl.when(unknown)
        .then(None)
        .when(intensity * peak_bw_gbps / 1e3 >= peak_tflops)
        .then(pl.lit("compute"))
        .otherwise(pl.lit("memory"))
    )


def intensity(flops: pl.Expr, bytes_: pl.Expr) -> pl.Expr:
    """FLOP per byte, null without bytes."""
    return pl.when(bytes_ > 0).then(flops / bytes_)


def dtype_peak(dtype: pl.Expr) -> pl.Expr:
    """The peak TFLOP/s (TOP/s for int8) a kernel of `dtype` can reach, from a device's peak
    columns: an unknown or missing dtype gets the BF16 peak; TF32 on a device without TF32 the FP32
    peak (the GEMM runs in FP32); a known dtype the device has no path for (FP8 on an A100) none."""
    key = dtype.str.strip_chars().str.to_lowercase()
    known = pl.lit(None, pl.Float64)
    for name, col in DTYPE_PEAK.items():
        peak = pl.coalesce(pl.col(col), pl.col("peak_fp32_tflops")) if col == "peak_tf32_tflops" else pl.col(col)
        known = pl.when(key == name).then(peak).otherwise(known)
    is_known = key.is_in(list(DTYPE_PEAK))
    return pl.when(is_known.fill_null(False)).then(known).otherwise(pl.col("peak_bf16_tflops"))
