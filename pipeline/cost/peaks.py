"""peaks: a device's peak columns, the math modes a kernel can run in, and which peak each is held to.

A kernel's `math_mode` is the precision and unit its arithmetic ran on (`MATH_MODES`): "fp32" is
FP32 on the CUDA cores / vector units (no tensor cores: SIMT), "tf32" FP32 data on TF32 tensor
cores (AMD's XF32), "fp16" / "bf16" / "fp8" / "fp4" / "int8" those tensor-core (matrix-core) paths,
"fp64" FP64 (on FP64 tensor cores where the device has them). The mode comes from the kernel's name
(`pipeline.cost.math_modes`), else from its op's input dtype (`DTYPE_MODE`).

Below both the device-spec table (`devices`) and the roofline (`roofline`): the one place that
says which peak column a mode is held to (`mode_peak`).
"""

from __future__ import annotations

import polars as pl

PEAK_COLS = [
    "peak_fp64_tflops",
    "peak_fp32_tflops",
    "peak_tf32_tflops",
    "peak_bf16_tflops",
    "peak_fp16_tflops",
    "peak_fp8_tflops",
    "peak_fp4_tflops",
    "peak_int8_tops",
    "peak_bw_gbps",
]
MATH_MODES = {  # math_mode -> the peak column (TFLOP/s; TOP/s for int8) it is held to
    "fp64": "peak_fp64_tflops",
    "fp32": "peak_fp32_tflops",
    "tf32": "peak_tf32_tflops",
    "bf16": "peak_bf16_tflops",
    "fp16": "peak_fp16_tflops",
    "fp8": "peak_fp8_tflops",
    "fp4": "peak_fp4_tflops",
    "int8": "peak_int8_tops",
}
# a mode the device has no peak for, held to another: TF32 on a device without TF32 tensor cores
# runs in FP32 (cuBLAS/hipBLASLt fall back to FP32 math)
FALLBACK_PEAK = {"tf32": "fp32"}
UNKNOWN_MODE = "bf16"  # the peak a kernel of unknown mode is held to (the dense 16-bit tensor path)
# the op's input dtype (`formulas.dtypes` short names, and the spellings --dtype accepts) -> the mode
# a kernel whose name says nothing runs in
DTYPE_MODE = {
    "fp64": "fp64",
    "double": "fp64",
    "float64": "fp64",
    "complex128": "fp64",
    "fp32": "fp32",
    "float": "fp32",
    "float32": "fp32",
    "complex64": "fp32",
    "tf32": "tf32",
    "bf16": "bf16",
    "bfloat16": "bf16",
    "fp16": "fp16",
    "half": "fp16",
    "float16": "fp16",
    "complex32": "fp16",
    "fp8": "fp8",
    "e4m3": "fp8",
    "e5m2": "fp8",
    "float8_e4m3fn": "fp8",
    "float8_e5m2": "fp8",
    "fp4x2": "fp4",
    "int8": "int8",
}
# a kernel whose mode came from its op's dtype and whose rate exceeds that mode's peak cannot have
# run in it: FP32 data above the FP32 (SIMT) peak ran on TF32 tensor cores (allow_tf32, cuDNN's default)
FASTER_MODE = {"fp32": "tf32"}


def dtype_mode(dtype: pl.Expr) -> pl.Expr:
    """The math mode of an op dtype (`DTYPE_MODE`; null when it names none)."""
    key = dtype.str.strip_chars().str.to_lowercase()
    return key.replace_strict(DTYPE_MODE, default=None, return_dtype=pl.String)


def mode_peak(mode: pl.Expr) -> pl.Expr:
    """The peak TFLOP/s (TOP/s for int8) of a kernel of math `mode`, from a device's peak columns:
    the mode's column (`MATH_MODES`); TF32 on a device without it the FP32 peak (`FALLBACK_PEAK`);
    a mode the device has no path for (FP8 on an A100) none; an unknown mode the BF16 peak."""
    peak = pl.lit(None, pl.Float64)
    for name, col in MATH_MODES.items():
        value = pl.col(col)
        if name in FALLBACK_PEAK:
            value = pl.coalesce(value, pl.col(MATH_MODES[FALLBACK_PEAK[name]]))
        peak = pl.when(mode == name).then(value).otherwise(peak)
    known = mode.is_in(list(MATH_MODES)).fill_null(False)
    return pl.when(known).then(peak).otherwise(pl.col(MATH_MODES[UNKNOWN_MODE]))


def peak_for_mode(row: dict, mode: str | None) -> float | None:
    """`mode_peak` applied to one device row (a matched spec: a dict with the peak columns)."""
    peaks = pl.DataFrame({c: [row.get(c)] for c in PEAK_COLS}, schema={c: pl.Float64 for c in PEAK_COLS})
    return peaks.select(mode_peak(pl.lit(mode, pl.String))).item()
