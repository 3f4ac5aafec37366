"""layout: layout conversion kernels (NCHW <-> NHWC) that channels_last would make unnecessary.

Premise: kernels whose names say they convert a tensor's layout (cuDNN's nchwToNhwcKernel /
nhwcToNchwKernel, ...; [layout] kernels) take at least [layout] min_kernels of the device's
kernel time. cuDNN's tensor-core convolutions work in NHWC: a model in NCHW pays a conversion
before and after each of them. Saving: [low, high] of the conversions' device time (some stay:
the model's input, layers without an NHWC kernel); wall time as far as device time is on the
critical path.
"""

from __future__ import annotations

import polars as pl

from pipeline.findings.facts import Facts
from pipeline.findings.finding import Finding, counted, ms, pct, scaled

ID = "layout"


def layout(t: Facts) -> Finding | None:
    if not t.has_device:
        return None
    lim = t.limits(ID)
    k = t.kernels.filter((pl.col("device") >= 0) & pl.col("name").str.contains(lim["kernels"]))
    conv_us = float(k["dur_us"].sum() or 0.0)
    if not t.kernel_us or conv_us < lim["min_kernels"] * t.kernel_us:
        return None
    gpu = scaled(conv_us, lim["low"], lim["high"])
    wall, gpu_r = t.bounded(t.on_device(gpu), gpu)
    if not t.worth(wall, gpu_r):
        return None
    k = k.sort("dur_us", descending=True)
    n = int(k["count"].sum())
    evidence = tuple(t.kernel_evidence(k, 5))
    share = pct(conv_us, t.kernel_us)
    return Finding(
        ID,
        f"Layout conversions (NCHW <-> NHWC) take {ms(conv_us)}, {share:.0f}% of kernel time, "
        f"in {counted(n, 'kernel')}",
        wall,
        gpu_r,
        t.worded(ID, "remedy"),
        "kernels",
        evidence,
        f"{lim['low']:.0%}-{lim['high']:.0%} of the conversions' device time; wall time x "
        f"{t.on_path_share:.2f}, the share of device time on the critical path",
    )
