"""precision: math in a slower precision than the device's tensor cores allow.

Premise: GEMM and convolution kernels that ran in plain FP32 (gpu_ops.math_mode "fp32": SIMT, no
tensor cores) take at least [precision] min_kernels of the device's kernel time, on a device whose
tensor-core peak (TF32 on Ampere and later, else FP16 / BF16) is at least [precision] min_speedup
x its FP32 peak (the device-spec table). Saving: the FP32 math's device time x (1 - 1/speedup),
the speedup between [precision] speedup_low and the peaks' ratio (capped at speedup_cap); wall
time as far as device time is on the critical path (on a host-bound trace, little).
"""

from __future__ import annotations

import polars as pl

from pipeline.findings.facts import Facts
from pipeline.findings.finding import Evidence, Finding, ms, pct

ID = "precision"
MATH = ("gemm", "conv")


def precision(t: Facts) -> Finding | None:
    if not t.has_device or not t.kernel_us:
        return None
    lim = t.limits(ID)
    spec = t.spec
    if spec is None or not spec.get("peak_fp32_tflops"):
        return None
    fp32 = float(spec["peak_fp32_tflops"])
    tf32 = spec.get("peak_tf32_tflops") or 0.0
    half = max(spec.get("peak_fp16_tflops") or 0.0, spec.get("peak_bf16_tflops") or 0.0)
    use_tf32 = t.vendor in lim["tf32_vendors"] and tf32 >= lim["min_speedup"] * fp32
    target, mode = (tf32, "tf32") if use_tf32 else (half, "half")
    ratio = target / fp32
    if ratio < lim["min_speedup"]:
        return None
    k = t.kernels.filter((pl.col("device") >= 0) & pl.col("category").is_in(MATH))
    modes = t.math_modes
    if modes is not None:
        fp32_names = modes.filter(pl.col("math_mode") == "fp32")["name"]
        k = k.filter(pl.col("name").is_in(fp32_names.implode()))
    else:
        k = k.filter(pl.col("name").str.contains(lim["fp32_kernels"]))
    slow = float(k["dur_us"].sum() or 0.0)
    if slow < lim["min_kernels"] * t.kernel_us:
        return None
    lo_s, hi_s = min(lim["speedup_low"], ratio), min(ratio, lim["speedup_cap"])
    gpu = (slow * (1 - 1 / lo_s), slow * (1 - 1 / hi_s))
    wall, gpu_r = t.bounded(t.on_device(gpu), gpu)
    if not t.worth(wall, gpu_r):
        return None
    k = k.sort("dur_us", descending=True)
    evidence = t.kernel_evidence(k, 5, lambda r: f"{r['category']} in FP32")
    arch = spec.get("arch") or ""
    cores = t.worded(ID, "cores")
    evidence.append(
        Evidence(
            "device",
            f"{spec['spec_name']} ({arch})" if arch else str(spec["spec_name"]),
            note=f"FP32 {fp32:g} TFLOP/s, {'TF32' if mode == 'tf32' else 'FP16/BF16'} {cores} {target:g} "
            f"TFLOP/s ({ratio:.1f}x; device-spec table)",
        )
    )
    remedy = t.worded(ID, "remedy_tf32" if mode == "tf32" else "remedy_half")
    source = "gpu_ops.math_mode" if modes is not None else "their names (sgemm, scudnn, winograd<float>)"
    return Finding(
        ID,
        f"{ms(slow)} ({pct(slow, t.kernel_us):.0f}% of kernel time) of GEMMs/convolutions run in FP32 on "
        f"{spec['spec_name']}, whose {cores} are {ratio:.0f}x faster",
        wall,
        gpu_r,
        remedy,
        "kernels",
        tuple(evidence),
        f"FP32 math's device time x (1 - 1/speedup), speedup {lo_s:.1f}-{hi_s:.1f}x (FP32 known from {source}); "
        f"wall time x {t.on_path_share:.2f}, the share of device time on the critical path",
    )
