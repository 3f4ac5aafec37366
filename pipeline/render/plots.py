"""plots: figures of `analyze` (`--plot DIR`): a roofline per device and time breakdowns.

matplotlib is optional (`pip install tracepipe[plot]`): it is imported only here, lazily, with
the non-interactive Agg backend. Every figure is written as PNG and SVG.

    roofline        per device: kernels as points (arithmetic intensity vs achieved TFLOP/s,
                    area ~ time), the device's memory and compute roofs (peak_bw_gbps, peak_tflops)
    breakdown       time by kernel category per device (stacked bar) and the top ops by time
"""

from __future__ import annotations

from pathlib import Path

import polars as pl

from pipeline.analyses.flat import Flat, as_flat
from pipeline.cost.roofline import ridge as ridge_point
from pipeline.errors import UsageError

IMAGE_FORMATS = ("png", "svg")  # every figure is written in each
TOP_OPS = 15


def pyplot():
    try:
        import matplotlib
    except ImportError:
        raise UsageError("--plot needs matplotlib: pip install 'tracepipe[plot]'") from None
    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    return plt


def save_figure(fig, out_dir: Path, stem: str) -> list[Path]:
    paths = [out_dir / f"{stem}.{ext}" for ext in IMAGE_FORMATS]
    for p in paths:
        fig.savefig(p, dpi=120, bbox_inches="tight")
    return paths


def _peaks(f: Flat) -> pl.DataFrame:
    """(device, peak_tflops, peak_bw_gbps): the device's most used peak and its bandwidth (from the
    GPU sweep's totals, `Flat.activity`)."""
    return f.activity.peaks


def roofline(flat, kernels: pl.DataFrame, out_dir: Path, stem: str) -> list[Path]:
    """One roofline panel per device from kernel_table rows (needs cost columns; else a note)."""
    plt = pyplot()
    f = as_flat(flat)
    devices = kernels["device"].unique().sort().to_list() or [None]
    peaks = {r["device"]: r for r in _peaks(f).iter_rows(named=True)}
    fig, axes = plt.subplots(1, len(devices), figsize=(6.5 * len(devices), 5), squeeze=False, layout="constrained")
    for ax, dev in zip(axes[0], devices, strict=False):
        pts = kernels.filter(
            (pl.col("device") == dev) & (pl.col("arithmetic_intensity") > 0) & (pl.col("achieved_tflops") > 0)
        )
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("arithmetic intensity (FLOP/byte)")
        ax.set_ylabel("achieved TFLOP/s")
        ax.set_title(f"device {dev}")
        if pts.height:
            size = 20 + 400 * pts["dur_us"] / max(pts["dur_us"].max(), 1e-9)
            ax.scatter(pts["arithmetic_intensity"], pts["achieved_tflops"], s=size, alpha=0.5)
            for r in pts.sort("dur_us", descending=True).head(5).iter_rows(named=True):
                ax.annotate(r["name"][:30], (r["arithmetic_intensity"], r["achieved_tflops"]), fontsize=6)
        p = peaks.get(dev) or {}
        if p.get("peak_tflops") and p.get("peak_bw_gbps"):
            ridge = ridge_point(p["peak_tflops"], p["peak_bw_gbps"])
            lo = min([ridge / 100] + pts["arithmetic_intensity"].to_list())
            hi = max([ridge * 100] + pts["arithmetic_intensity"].to_list())
            ax.plot(
                [lo, ridge],
                [lo * p["peak_bw_gbps"] / 1e3, p["peak_tflops"]],
                "r-",
                lw=1,
                label=f"{p['peak_bw_gbps']:,.0f} GB/s",
            )
            ax.plot([ridge, hi], [p["peak_tflops"]] * 2, "r--", lw=1, label=f"{p['peak_tflops']:,.0f} TFLOP/s")
            ax.legend(fontsize=7)
        if not pts.height:
            ax.text(0.5, 0.5, "no kernels with FLOPs and bytes", transform=ax.transAxes, ha="center")
    paths = save_figure(fig, out_dir, f"{stem}_roofline")
    plt.close(fig)
    return paths


def breakdown(categories: pl.DataFrame, ops: pl.DataFrame, out_dir: Path, stem: str) -> list[Path]:
    """Time by category per device (stacked, % of the device's time) and top ops by time."""
    plt = pyplot()
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(13, 5), layout="constrained")
    wide = categories.pivot(on="category", index="device", values="pct").fill_null(0).sort("device")
    left = [0.0] * wide.height
    labels = [str(d) for d in wide["device"]]
    for cat in [c for c in wide.columns if c != "device"]:
        ax1.barh(labels, wide[cat], left=left, label=cat)
        left = [a + b for a, b in zip(left, wide[cat], strict=False)]
    ax1.set_xlabel("% of device time")
    ax1.set_ylabel("device")
    ax1.set_title("time by category")
    ax1.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.15), ncol=4)
    metric = "self_device_us" if ops.height and ops["self_device_us"].sum() > 0 else "self_cpu_us"
    top = ops.sort(metric, descending=True).head(TOP_OPS).reverse()
    ax2.barh([n[:40] for n in top["name"]], top[metric])
    ax2.set_xlabel(f"{metric} (µs)")
    ax2.set_title(f"top ops by {metric}")
    ax2.tick_params(axis="y", labelsize=7)
    paths = save_figure(fig, out_dir, f"{stem}_breakdown")
    plt.close(fig)
    return paths


def write_plots(flat, sections: dict[str, pl.DataFrame], out_dir: str | Path) -> list[Path]:
    """Every figure of one analysed trace into out_dir; returns the files written."""
    f = as_flat(flat)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = breakdown(sections["categories"], sections["ops"], out_dir, f.stem)
    if f.has_gpu:
        paths += roofline(f, sections["kernels"], out_dir, f.stem)
    return paths
