"""roofline_data: what a device's roofline shows: its kernels with FLOPs and bytes (the points),
its roofs (the memory bandwidth, a compute peak per math mode its kernels are held to), and the share
of its kernel time that is not drawn, by why (`WHY`, with the fix where there is one: `FIX`)."""

from __future__ import annotations

from dataclasses import dataclass

import polars as pl

from pipeline.analyses.flat import Flat
from pipeline.cost.coverage import CAUSES
from pipeline.cost.peaks import UNKNOWN_MODE
from pipeline.render.plots.figure import device_labels

WHY = {  # why a kernel is not on the roofline: its gpu_ops.unmodelled_reason, or what its cost lacks
    **{c.name: c.summary for c in CAUSES},
    "no_flops": "bytes but no FLOPs (copies, fills, communication)",
    "no_bytes": "FLOPs but no byte count",
    "not_costed": "not costed: the trace was flattened with --no-link",
    "unmodelled": "no cost model",
}
FIX = {**{c.name: c.remedy for c in CAUSES if c.remedy}, "not_costed": "flatten the trace again without --no-link"}
COST_COLUMNS = (
    "kind",
    "device",
    "name",
    "ts_ns",
    "dur_ns",
    "flops",
    "bytes",
    "math_mode",
    "peak_tflops",
    "unmodelled_reason",
)
LATER = ("math_mode",)  # cost columns a trace costed by an earlier version lacks


@dataclass
class Panel:
    """One device's roofline: its kernels with FLOPs and bytes, its roofs, and where the rest went."""

    device: int
    label: str  # "device 0: NVIDIA H100 80GB HBM3"
    points: pl.DataFrame  # kernel_table rows with an intensity and a rate, + share: % of kernel time placed
    bw_gbps: float | None  # the memory roof
    roofs: list[tuple[str, float]]  # (math modes, peak TFLOP/s), the most used first
    reasons: list[tuple[str, float]]  # (reason, % of the device's kernel time), largest first; "drawn" among them


def _costed_kernels(f: Flat) -> pl.LazyFrame | None:
    """The trace's kernels in the analysed window with their cost columns (None: never costed)."""
    g = pl.scan_parquet(f.path / "gpu_ops.parquet")
    have = set(g.collect_schema().names())
    if not set(COST_COLUMNS) - set(LATER) <= have:
        return None
    g = g.with_columns(pl.lit(None, pl.String).alias(c) for c in LATER if c not in have)  # costed before them
    return g.select(COST_COLUMNS).filter((pl.col("kind") == "kernel") & f.time_filter())


def _mode_of_peak(mode: pl.Expr) -> pl.Expr:
    """The math mode whose peak a kernel is held to (`peaks.mode_peak`: bf16 when unknown)."""
    return mode.fill_null(UNKNOWN_MODE)


def compute_roofs(f: Flat) -> pl.DataFrame:
    """(device, peak_tflops, dtypes, dur_ns): one compute roof per peak the device's drawn kernels
    are held to, named by their math modes ("tf32", "bf16/fp16"), the most used first."""
    g = _costed_kernels(f)
    if g is None:
        return pl.DataFrame(schema={"device": pl.Int64, "peak_tflops": pl.Float64, "dtypes": pl.String})
    drawn = (pl.col("flops") > 0) & (pl.col("bytes") > 0) & pl.col("peak_tflops").is_not_null()
    return (
        g.filter(drawn)
        .group_by("device", "peak_tflops", dtype=_mode_of_peak(pl.col("math_mode")))
        .agg(pl.col("dur_ns").sum())
        .sort("dur_ns", descending=True)
        .group_by("device", "peak_tflops", maintain_order=True)
        .agg(pl.col("dtype").str.join("/").alias("dtypes"), pl.col("dur_ns").sum())
        .sort(["device", "dur_ns"], descending=[False, True])
        .collect()
    )


def kernel_time_by_reason(f: Flat) -> pl.DataFrame:
    """(device, name, reason, pct): each device's kernel time by kernel name and why it is (not) on
    the roofline, in % of the device's kernel time: reason "drawn" for launches with FLOPs and
    bytes, else a key of WHY."""
    g = _costed_kernels(f)
    if g is None:
        kernels = pl.scan_parquet(f.path / "gpu_ops.parquet").filter((pl.col("kind") == "kernel") & f.time_filter())
        g = kernels.select("device", "name", "dur_ns", reason=pl.lit("not_costed"))
    else:
        g = g.with_columns(
            reason=pl.when((pl.col("flops") > 0) & (pl.col("bytes") > 0))
            .then(pl.lit("drawn"))
            .when(pl.col("flops") == 0)
            .then(pl.lit("no_flops"))
            .when(pl.col("flops") > 0)
            .then(pl.lit("no_bytes"))
            .otherwise(pl.coalesce("unmodelled_reason", pl.lit("unmodelled")))
        )
    t = g.group_by("device", "name", "reason").agg(pl.col("dur_ns").sum()).collect()
    pct = 100 * pl.col("dur_ns") / pl.col("dur_ns").sum().over("device").clip(lower_bound=1)
    return t.select("device", "name", "reason", pct=pct)


def roofline_panels(f: Flat, kernels: pl.DataFrame) -> list[Panel]:
    """One Panel per device with kernels: its points are the kernel table's rows with an intensity
    and a rate, `share` the % of the device's kernel time their costed launches take (their area)."""
    labels = device_labels(f)
    bw = {d: b for d, _, b in f.activity.peaks.select("device", "peak_tflops", "peak_bw_gbps").iter_rows()}
    roofs, by_name = compute_roofs(f), kernel_time_by_reason(f)
    reasons = by_name.group_by("device", "reason").agg(pl.col("pct").sum()).sort("pct", descending=True)
    placed = by_name.filter(pl.col("reason") == "drawn").select("device", "name", share="pct")
    on_roofline = (pl.col("arithmetic_intensity") > 0) & (pl.col("achieved_tflops") > 0)
    points = kernels.filter(on_roofline).join(placed, on=["device", "name"], how="left")
    points = points.with_columns(pl.col("share").fill_null(0.0))
    return [
        Panel(
            device=dev,
            label=labels.get(dev, f"device {dev}"),
            points=points.filter(pl.col("device") == dev),
            bw_gbps=bw.get(dev),
            roofs=[
                (d, p) for p, d in roofs.filter(pl.col("device") == dev).select("peak_tflops", "dtypes").iter_rows()
            ],
            reasons=list(reasons.filter(pl.col("device") == dev).select("reason", "pct").iter_rows()),
        )
        for dev in kernels["device"].unique().sort().to_list()
    ]
