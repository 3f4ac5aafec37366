"""plots: the figures of `tracepipe ranks --plot DIR`, per run (PNG and SVG, as `pipeline.render.plots`):

    <run>_waits   rank x step heat map of the time each rank waited in the step's collectives
    <run>_busbw   bus bandwidth (nccl-tests' busbw) each collective reached, by message size

Each title names the run and its world size; a run with nothing to show says why in the figure.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from pathlib import Path

import polars as pl

from pipeline.render.plots import DPI, bytes_text, duration_text, explain, pyplot, span, time_axis, written

MAX_TICKS = 24  # rank / step ticks before they are thinned
MAX_ROWS = 16  # ranks the heat map grows taller for
MAX_CELL_TEXT = 160  # cells in a heat map that still get their value written
KIND_MARKERS = "osD^vP*X"


def _slug(run: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", Path(str(run)).name or "run")[:60]


@dataclass
class RunInfo:
    """What every title says about a run."""

    name: str  # the run's last path component ("gloo4")
    world_size: int | None
    ranks: list[int]
    missing: list[int]

    @property
    def heading(self) -> str:
        world = f"world size {self.world_size}" if self.world_size else "world size unknown"
        missing = f", missing {_ranks_text(self.missing)}" if self.missing else ""
        return f"{world}: {len(self.ranks)} ranks traced{missing}"


def _ranks_text(ranks: list[int], most: int = 8) -> str:
    shown = ", ".join(str(r) for r in ranks[:most])
    return f"rank{'s' if len(ranks) > 1 else ''} {shown}" + (
        f" (+{len(ranks) - most} more)" if len(ranks) > most else ""
    )


def run_info(rep, run: str) -> RunInfo:
    row = rep.runs.filter(pl.col("run").cast(pl.String) == run).row(0, named=True)
    return RunInfo(
        name=_slug(run),
        world_size=row.get("world_size"),
        ranks=sorted(row.get("ranks") or []),
        missing=sorted(row.get("missing_ranks") or []),
    )


# ------------------------------------------------------------------ waits
def wait_heatmap_figure(rep, run: str):
    """Rows ranks, columns steps, colour the time waited in the step's collectives (for later ranks)."""
    plt = pyplot()
    info = run_info(rep, run)
    s = rep.steps.filter(pl.col("run").cast(pl.String) == run)
    ranks = sorted(s["rank"].unique().to_list())
    fig, ax = plt.subplots(figsize=(9, 2.4 + 0.3 * min(max(len(ranks), 4), MAX_ROWS)), layout="constrained", dpi=DPI)
    fig.suptitle(f"{info.name}: time each rank waited in collectives, per step", fontweight="bold")
    ax.set_title(f"{info.heading}{straggler_text(rep, run)}", loc="left")
    if not s.height:
        explain(
            ax,
            f"No ProfilerStep annotations in the traces of {info.name}: there are no steps to place waits in. "
            "Profile with a schedule and call prof.step() once per step so that steps are recorded.",
        )
        return fig
    steps = s.sort("step_ts_ns").get_column("step").cast(pl.String).unique(maintain_order=True).to_list()
    grid = (
        s.with_columns(pl.col("step").cast(pl.String))
        .pivot("step", index="rank", values="wait_ns", aggregate_function="sum")
        .sort("rank")
        .select(steps)
        .fill_null(0.0)
        .to_numpy()
        / 1e3
    )
    scale, unit = time_axis(float(grid.max()))
    top = max(float(grid.max()) / scale, 1.0)  # nobody waited: every cell the colour of 0, not of the middle
    im = ax.imshow(grid / scale, aspect="auto", cmap="magma_r", interpolation="nearest", vmin=0, vmax=top)
    if grid.size <= MAX_CELL_TEXT:
        cell_values(ax, grid, im)
    grid_ticks(ax, [x.replace("ProfilerStep#", "#") for x in steps], [str(r) for r in ranks])
    ax.set_xlabel("profiler step (ProfilerStep#N)")
    ax.set_ylabel("rank")
    fig.colorbar(im, ax=ax, label=f"time waited in the step's collectives ({unit})")
    return fig


def straggler_text(rep, run: str) -> str:
    """ "; rank 2 made the others wait most (125 ms in all)", or that nobody made anyone wait."""
    s = rep.stragglers.filter((pl.col("run").cast(pl.String) == run) & (pl.col("wait_caused_ns") > 0))
    if not s.height:
        return "; no rank made another wait"
    top = s.sort("wait_caused_ns", descending=True).row(0, named=True)
    return f"; rank {top['rank']} made the others wait most ({duration_text(top['wait_caused_ns'] / 1e3)} in all)"


def cell_values(ax, grid_us, im):
    """Each cell's value written in it, dark on light cells and light on dark ones."""
    for (row, col), us in _cells(grid_us):
        shade = im.norm(im.get_array()[row, col])
        ax.text(
            col,
            row,
            duration_text(us) if us else "0",
            ha="center",
            va="center",
            fontsize=7,
            color="white" if shade > 0.55 else "black",
        )


def _cells(grid):
    for row in range(grid.shape[0]):
        for col in range(grid.shape[1]):
            yield (row, col), float(grid[row, col])


def grid_ticks(ax, columns: list[str], rows: list[str]):
    """Tick labels for the heat map's steps and ranks, every k-th when there are many."""
    for axis, names, set_ticks in ((ax.xaxis, columns, ax.set_xticks), (ax.yaxis, rows, ax.set_yticks)):
        every = 2 ** math.ceil(math.log2(max(1.0, len(names) / MAX_TICKS)))  # 1, 2, 4, 8, ...
        positions = list(range(0, len(names), every))
        set_ticks(positions, [names[i] for i in positions], fontsize=8)
        axis.set_tick_params(length=2)
    if len(columns) > 16:
        ax.tick_params(axis="x", rotation=90)


# ------------------------------------------------------------------ bus bandwidth
def busbw_figure(rep, run: str):
    """One point per collective: message size against bus bandwidth, a colour and marker per kind,
    the median of each (kind, size) marked."""
    plt = pyplot()
    info = run_info(rep, run)
    c = rep.collectives.filter(
        (pl.col("run").cast(pl.String) == run) & (pl.col("busbw_gbps") > 0) & (pl.col("bytes") > 0)
    )
    fig, ax = plt.subplots(figsize=(9, 5), layout="constrained", dpi=DPI)
    fig.suptitle(f"{info.name}: bus bandwidth of its collectives by message size", fontweight="bold")
    ax.set_title(f"{info.heading}; busbw as nccl-tests computes it", loc="left")
    if not c.height:
        explain(
            ax,
            f"No collective in {info.name} has both a message size and a duration: no bandwidth to show "
            "(barriers carry no data; older traces lack the collectives' sizes).",
        )
        return fig
    for i, (kind, part) in enumerate(c.sort("kind").group_by("kind", maintain_order=True)):
        kind_points(ax, str(kind[0]), part, KIND_MARKERS[i % len(KIND_MARKERS)], f"C{i}")
    size_axis(ax, c["bytes"])
    rate_axis(ax, c["busbw_gbps"])
    ax.set_xlabel("message size per rank (nccl-tests' size)")
    ax.set_ylabel("bus bandwidth")
    ax.grid(True, which="major", lw=0.4, alpha=0.4)
    ax.legend(title="collective (calls)\ndots: one per call; bar: median per size", loc="best", fontsize=8)
    return fig


def kind_points(ax, kind: str, part: pl.DataFrame, marker: str, colour: str):
    ax.scatter(
        part["bytes"], part["busbw_gbps"], s=14, alpha=0.5, marker=marker, color=colour, label=f"{kind} ({part.height})"
    )
    medians = part.group_by("bytes").agg(pl.col("busbw_gbps").median())
    ax.scatter(medians["bytes"], medians["busbw_gbps"], s=260, marker="_", color=colour, linewidths=2)


def size_axis(ax, sizes: pl.Series):
    """A log2 axis of message sizes in binary units (16 B, 4 KiB, 2 MiB), a decade of room around them."""
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    lo, hi = span(sizes)
    ax.set_xscale("log", base=2)
    ax.set_xlim(lo / 2, hi * 2)
    ax.xaxis.set_major_locator(LogLocator(base=2, numticks=12))
    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: bytes_text(v)))
    ax.xaxis.set_minor_formatter(NullFormatter())


def rate_axis(ax, gbps: pl.Series):
    """A bandwidth axis in readable units (KB/s to TB/s): log when the values span 30x or more."""
    from matplotlib.ticker import FuncFormatter, NullFormatter

    lo, hi = span(gbps)
    if hi / lo >= 30:
        ax.set_yscale("log")
        ax.set_ylim(lo / 2, hi * 2)
        ax.yaxis.set_minor_formatter(NullFormatter())
    else:
        ax.set_ylim(0, hi * 1.2)
    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: rate_text(v)))


def rate_text(gbps: float) -> str:
    """A rate given in GB/s as text in the unit that suits it: 300 GB/s, 1.9 MB/s, 4 KB/s."""
    if gbps <= 0:
        return "0"
    for unit, scale in (("TB/s", 1e3), ("GB/s", 1.0), ("MB/s", 1e-3), ("KB/s", 1e-6)):
        if gbps >= scale:
            return f"{gbps / scale:.3g} {unit}"
    return f"{gbps * 1e9:.3g} B/s"


# ------------------------------------------------------------------ every run
def wait_heatmap(rep, run: str, out_dir: Path) -> list[Path]:
    return written(lambda: wait_heatmap_figure(rep, run), out_dir, f"{_slug(run)}_waits")


def busbw_by_size(rep, run: str, out_dir: Path) -> list[Path]:
    return written(lambda: busbw_figure(rep, run), out_dir, f"{_slug(run)}_busbw")


def write_run_plots(rep, out_dir: str | Path) -> list[Path]:
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths: list[Path] = []
    for run in rep.runs["run"].cast(pl.String).to_list():
        paths += wait_heatmap(rep, run, out) + busbw_by_size(rep, run, out)
    return paths
