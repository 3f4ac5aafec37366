"""plots: the figures of `analyze --plot DIR`, each PNG and SVG (matplotlib, the `plot` extra):

    <stem>_breakdown    time by kernel category (per device) and the CPU ops with the most self time
    <stem>_roofline     a roofline per device (traces with GPU activity)
    <stem>_memory       memory over time per device, its peak marked (traces with [memory] events)
    <stem>_queue        launch queue depth per device and stream over time (traces with GPU activity)

One module per kind of figure (`breakdown`, `roofline` with `roofline_data`, `timelines`); what
they share (matplotlib setup, atomic writing, units, colours, label stacking) is `figure`, also
used by `pipeline.runs.plots`.
"""

from __future__ import annotations

from pathlib import Path

import polars as pl

from pipeline.analyses.flat import as_flat
from pipeline.analyses.queue import QUEUE_FULL
from pipeline.render.plots.breakdown import breakdown_figure
from pipeline.render.plots.figure import (
    DPI,
    LABEL_CHARS,
    STYLE,
    bandwidth_text,
    bytes_text,
    duration_text,
    explain,
    pct_text,
    pyplot,
    span,
    spread,
    time_axis,
    written,
)
from pipeline.render.plots.roofline import TOP_LABELS, roofline_figure
from pipeline.render.plots.timelines import memory_figure, queue_figure

__all__ = [
    "DPI",
    "LABEL_CHARS",
    "STYLE",
    "TOP_LABELS",
    "bandwidth_text",
    "breakdown_figure",
    "bytes_text",
    "duration_text",
    "explain",
    "memory_figure",
    "pct_text",
    "pyplot",
    "queue_figure",
    "roofline_figure",
    "span",
    "spread",
    "time_axis",
    "write_plots",
    "written",
]


def write_plots(
    flat, sections: dict[str, pl.DataFrame], out_dir: str | Path, queue_full: int = QUEUE_FULL
) -> list[Path]:
    """Every figure of one analysed trace into out_dir; returns the files written. `sections`:
    analyze's tables (categories, ops, kernels needed; memory and queue used when there)."""
    f = as_flat(flat)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = written(lambda: breakdown_figure(f, sections["categories"], sections["ops"]), out, f"{f.stem}_breakdown")
    if f.has_gpu:
        paths += written(lambda: roofline_figure(f, sections["kernels"]), out, f"{f.stem}_roofline")
        paths += written(lambda: queue_figure(f, sections.get("queue"), queue_full), out, f"{f.stem}_queue")
    if f.has_memory:
        paths += written(lambda: memory_figure(f, sections.get("memory")), out, f"{f.stem}_memory")
    return paths
