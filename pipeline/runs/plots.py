"""plots: figures of `tracepipe ranks --plot DIR`, per run: a rank x step heat map of the time
each rank waited in collectives, and the bus bandwidth collectives reached by message size."""

from __future__ import annotations

import re
from pathlib import Path

import polars as pl

from pipeline.render.plots import pyplot, save_figure


def _slug(run: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", Path(str(run)).name or "run")[:60]


def wait_heatmap(rep, run: str, out_dir: Path) -> list[Path]:
    """Rows ranks, columns steps, colour the µs waited in the step's collectives."""
    plt = pyplot()
    s = rep.steps.filter(pl.col("run") == run)
    fig, ax = plt.subplots(figsize=(8, 4.5), layout="constrained")
    if not s.height:
        ax.text(0.5, 0.5, "no ProfilerStep annotations: nothing to place waits in", ha="center", transform=ax.transAxes)
        ax.set_axis_off()
    else:
        steps = s.sort("step_ts_ns").get_column("step").cast(pl.String).unique(maintain_order=True).to_list()
        ranks = sorted(s["rank"].unique().to_list())
        grid = (
            s.with_columns(pl.col("step").cast(pl.String))
            .pivot("step", index="rank", values="wait_ns", aggregate_function="sum")
            .sort("rank")
            .select(steps)
            .fill_null(0.0)
            .to_numpy()
            / 1e3
        )
        im = ax.imshow(grid, aspect="auto", cmap="magma_r", interpolation="nearest")
        ax.set_xticks(
            range(len(steps)),
            [x.replace("ProfilerStep#", "#") for x in steps],
            fontsize=7,
            rotation=90 if len(steps) > 12 else 0,
        )
        ax.set_yticks(range(len(ranks)), [str(r) for r in ranks], fontsize=7)
        ax.set_xlabel("profiler step")
        ax.set_ylabel("rank")
        fig.colorbar(im, ax=ax, label="time waited in collectives (µs)")
    ax.set_title(f"{_slug(run)}: who waited, when")
    paths = save_figure(fig, out_dir, f"{_slug(run)}_waits")
    plt.close(fig)
    return paths


def busbw_by_size(rep, run: str, out_dir: Path) -> list[Path]:
    """One point per collective: message size against bus bandwidth, a colour per kind."""
    plt = pyplot()
    c = rep.collectives.filter((pl.col("run") == run) & (pl.col("busbw_gbps") > 0) & (pl.col("bytes") > 0))
    fig, ax = plt.subplots(figsize=(7, 4.5), layout="constrained")
    if not c.height:
        ax.text(0.5, 0.5, "no collective with a message size and a duration", ha="center", transform=ax.transAxes)
        ax.set_axis_off()
    else:
        for kind, part in c.group_by("kind", maintain_order=True):
            ax.scatter(part["bytes"], part["busbw_gbps"], s=10, alpha=0.6, label=str(kind[0]))
        from matplotlib.ticker import EngFormatter

        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.xaxis.set_major_formatter(EngFormatter(unit="B"))
        ax.set_xlabel("message size (nccl-tests' size)")
        ax.set_ylabel("bus bandwidth (GB/s)")
        ax.legend(title="collective", fontsize=7)
    ax.set_title(f"{_slug(run)}: bus bandwidth by message size")
    paths = save_figure(fig, out_dir, f"{_slug(run)}_busbw")
    plt.close(fig)
    return paths


def write_run_plots(rep, out_dir: str | Path) -> list[Path]:
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths: list[Path] = []
    for run in rep.runs["run"].cast(pl.String).to_list():
        paths += wait_heatmap(rep, run, out) + busbw_by_size(rep, run, out)
    return paths
