"""registry: the sections of `analyze`, in output order, each declared once (as sqlglot's optimizer RULES).

A `Section` is an analysis (its function of a `Flat` and the command line's `Options`) and how the
documents show it: title, table columns, place in the JSON document, how `--top` cuts it, a help
line. `analyze`, `SECTIONS`, the documents (`pipeline.render.documents`), `check_options` and the
`--section` help derive from `REGISTRY`: a new analysis is one module and one entry here.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

import polars as pl

from pipeline.analyses.busy import busy
from pipeline.analyses.categories import categories
from pipeline.analyses.communication import communication
from pipeline.analyses.compiled import compile_view, compiled_regions
from pipeline.analyses.cpu import check_grouping
from pipeline.analyses.flat import Flat, as_flat
from pipeline.analyses.kernels import kernel_table, transfer_table
from pipeline.analyses.launch import launch_overhead
from pipeline.analyses.ops import op_table


@dataclass(frozen=True)
class Options:
    """What the command line changes in the sections' computation."""

    group_by: str | None = None  # ops: also group by input-shape, stack or overload
    sort: str | None = None  # ops: the column to sort by


Placement = Literal["devices", "device", "top"]
DEVICES: Placement = "devices"  # the JSON document's list of devices itself (one section: its rows are the devices)
IN_DEVICE: Placement = "device"  # a list inside each device's object (rows of other devices left out)
TOP_LEVEL: Placement = "top"  # a list at the top of the JSON document


@dataclass(frozen=True)
class Section:
    name: str
    compute: Callable[[Flat, Options], pl.DataFrame]
    title: str  # above its table (table / md)
    help: str  # one line, for `--section`
    json: Placement = TOP_LEVEL
    columns: tuple[str, ...] | None = None  # what table / md show (None: all); JSON and CSV keep every column
    top_per_device: bool = False  # table / md: --top rows per device, not of the whole section
    top_in_json: bool = False  # a TOP_LEVEL list that --top cuts in JSON too (IN_DEVICE lists are, per device)


REGISTRY: tuple[Section, ...] = (
    Section(
        "devices",
        lambda f, o: busy(f),
        "Devices: busy time (union of kernels, memcpy, memset over the span)",
        "busy and idle time per device",
        json=DEVICES,
        columns=("device", "name", "busy_pct", "span_us", "busy_us", "idle_us", "gaps", "largest_gap_us"),
    ),
    Section(
        "kernels",
        lambda f, o: kernel_table(f),
        "Kernels per device",
        "time, FLOPs and roofline per kernel name",
        json=IN_DEVICE,
        top_per_device=True,
        columns=(
            "device",
            "name",
            "category",
            "count",
            "dur_us",
            "pct",
            "mean_us",
            "flops",
            "achieved_tflops",
            "achieved_gbps",
            "achieved_flops_pct",
            "achieved_bw_pct",
            "roofline_bound",
        ),
    ),
    Section(
        "transfers",
        lambda f, o: transfer_table(f),
        "Memcpy / memset",
        "the same for memcpy and memset",
        json=IN_DEVICE,
        top_per_device=True,
        columns=("device", "kind", "name", "count", "dur_us", "pct", "mean_us", "bytes", "achieved_gbps"),
    ),
    Section(
        "streams",
        lambda f, o: busy(f, per_stream=True),
        "Streams",
        "busy and idle time per stream",
        json=IN_DEVICE,
        top_per_device=True,
        columns=("device", "stream", "busy_pct", "span_us", "busy_us", "gaps", "largest_gap_us"),
    ),
    Section(
        "categories",
        lambda f, o: categories(f),
        "Time by category",
        "time per kernel category",
        json=IN_DEVICE,
        top_per_device=True,
        columns=("device", "category", "count", "dur_us", "pct"),
    ),
    Section(
        "ops",
        lambda f, o: op_table(f, group_by=o.group_by, sort=o.sort),
        "CPU ops (key_averages)",
        "CPU ops like key_averages()",
        top_in_json=True,
    ),
    Section("launch", lambda f, o: launch_overhead(f), "Launch overhead", "launch durations and delays per device"),
    Section(
        "compile", lambda f, o: compile_view(f), "torch.compile regions per step", "compiled time and breaks per step"
    ),
    Section("regions", lambda f, o: compiled_regions(f), "Compiled regions", "compiled regions by name"),
    Section(
        "communication",
        lambda f, o: communication(f),
        "Communication vs compute overlap",
        "collectives and their overlap with compute",
    ),
)
SECTIONS = tuple(s.name for s in REGISTRY)
BY_NAME = {s.name: s for s in REGISTRY}


def analyze(flat, group_by: str | None = None, sort: str | None = None) -> dict[str, pl.DataFrame]:
    """Every report of one trace, by section name (see `SECTIONS`)."""
    f = as_flat(flat)
    check_grouping(group_by)
    f.sweep_both(group_by)  # the CPU sweep also serves the compile view, and a CPU-only trace's device tables
    options = Options(group_by=group_by, sort=sort)
    return {s.name: s.compute(f, options) for s in REGISTRY}


def section_help() -> str:
    """Every section with its help line, for the command line."""
    return ", ".join(f"{s.name} ({s.help})" for s in REGISTRY)
