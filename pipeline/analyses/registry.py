"""registry: the sections of `analyze`, in output order, each declared once (as sqlglot's optimizer RULES).

A `Section` is an analysis (its function of a `Flat` and the command line's `Options`) and how the
documents show it: title, table columns, place in the JSON document, how `--top` cuts it, a help
line. `analyze`, `SECTIONS`, the documents (`pipeline.render.documents`), `check_options` and the
`--section` help derive from `REGISTRY`: a new analysis is one module and one entry here.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Literal

import polars as pl

from pipeline.analyses.activity import CPU_DEVICE
from pipeline.analyses.busy import busy
from pipeline.analyses.categories import categories
from pipeline.analyses.communication import communication
from pipeline.analyses.compiled import compile_view, compiled_regions
from pipeline.analyses.coverage import coverage
from pipeline.analyses.cpu import GROUPINGS, check_grouping
from pipeline.analyses.critical_path import critical_path_frame, critical_path_views
from pipeline.analyses.flat import Flat, as_flat
from pipeline.analyses.graphs import graph_view
from pipeline.analyses.idle import KERNEL_WAIT_US, idle
from pipeline.analyses.kernels import kernel_table, transfer_table
from pipeline.analyses.launch import launch_overhead
from pipeline.analyses.memory import memory, memory_by_op, with_memory_columns
from pipeline.analyses.ops import op_table
from pipeline.analyses.queue import QUEUE_FULL, queue
from pipeline.analyses.sequences import SEQ_LEN, sequences
from pipeline.findings.rules import findings_frame, flat_view, trace_findings
from pipeline.render.findings import findings_text
from pipeline.render.tables import records

GROUP_COLUMNS = tuple(c for columns in GROUPINGS.values() for c in columns)  # an op grouping's key columns


@dataclass(frozen=True)
class Options:
    """What the command line changes in the sections' computation."""

    group_by: str | None = None  # ops: also group by input-shape, stack or overload
    sort: str | None = None  # ops: the column to sort by
    kernel_wait_us: float = KERNEL_WAIT_US  # idle: a shorter gap between activities is kernel wait
    queue_full: int = QUEUE_FULL  # queue: the depth at which the launching thread blocks
    seq_len: int = SEQ_LEN  # sequences: kernels per window (chains merge overlapping windows)


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
    sweeps: bool = True  # made from the shared GPU and CPU sweeps (`Flat.sweep_both`), else reads on its own
    cpu_sweep: bool = True  # of those, it reads the CPU sweep (else the GPU sweep's activity alone)
    json_value: Callable[[pl.DataFrame], object] | None = None  # its JSON value (default: a list of rows)
    json_key: str | None = None  # its key in the JSON document (default: its name)
    views: Callable[[pl.DataFrame], dict[str, pl.DataFrame]] | None = None  # its tables (default: itself)
    meanings: Mapping[str, str] = field(default_factory=dict)  # its own columns' meanings (over PCT_MEANINGS)
    # made from other sections' results (`analyze` computes it last, sharing them): f, options, section(name)
    reads: Callable[[Flat, Options, Callable[[str], pl.DataFrame]], pl.DataFrame] | None = None
    text: Callable[[pl.DataFrame, str, int | None], str] | None = None  # its table / md text (default: its tables)
    lead: bool = False  # what to fix: shown first, before everything else, even when empty (it says so)
    # what an empty name says in table, md, csv and xlsx (JSON keeps null): column -> label
    blanks: Mapping[str, str] = field(default_factory=dict)
    # on a trace without device activity (CPU-only, or its device activity lost), where the CPU
    # (device -1) and its ops stand for devices and kernels: its title and its columns' meanings
    # there (default: the same as elsewhere)
    cpu_title: str | None = None
    cpu_meanings: Mapping[str, str] = field(default_factory=dict)

    def tables(self, df: pl.DataFrame) -> dict[str, pl.DataFrame]:
        """What table, md, csv and xlsx show of the section: named tables (default: its rows), an
        empty name saying what it is (`blanks`)."""
        fill = {c: label for c, label in self.blanks.items() if c in df.columns and df.schema[c] == pl.String}
        if fill:
            df = df.with_columns(pl.col(c).fill_null(label).replace("", label) for c, label in fill.items())
        return self.views(df) if self.views else {self.name: df}

    @property
    def key(self) -> str:
        return self.json_key or self.name

    def title_of(self, df: pl.DataFrame) -> str:
        """Its title over these rows: the CPU-only one where every row is the CPU's."""
        return self.cpu_title if self.cpu_title and on_cpu_only(df) else self.title


def on_cpu_only(df: pl.DataFrame) -> bool:
    """Whether a per-device table's rows are all the CPU's (device -1: a trace without device
    activity, whose CPU ops stand for kernels)."""
    return "device" in df.columns and df.height > 0 and bool((df["device"] == CPU_DEVICE).all())


# what each percentage column is a share of, where it means the same in every section that has it
# (a section's own `meanings` say what its `pct` is); shown with every table (`pct_meanings`)
PCT_MEANINGS = {
    "busy_pct": "% of its span (first start to last end) that some activity ran",
    "kernel_busy_pct": "% of the device's span that some kernel ran",
    "achieved_flops_pct": "% of the FLOP peak of its math mode (math_mode)",
    "achieved_bw_pct": "% of the device's DRAM bandwidth (above 100: from the cache)",
    "self_cpu_pct": "% of all ops' self CPU time",
    "self_device_pct": "% of all ops' self device time",
    "shorter_than_launch_pct": "% of the device's kernels that ran shorter than their launch call",
    "overlap_pct": "% of the device's communication time that compute kernels overlapped",
    "compiled_pct": "% of the step's time inside compiled regions",
    "occupancy_pct": "% of the SM's warp slots the kernel kept busy (Kineto's estimate)",
    # compare and trend: changes, not shares
    "delta_pct": "% change of the new runs' time from the base's (new / base - 1)",
    "ci_low_pct": "% change: the low end of its confidence interval",
    "ci_high_pct": "% change: the high end of its confidence interval",
    "change_pct": "% change at a change point (after / before - 1)",
    "vs_previous_pct": "% change from the run before",
    "min_effect_pct": "% change below which a difference is not reported",
}
KERNEL_TIME = {"pct": "% of the device's kernel time"}
CPU_OP_TIME = {"pct": "% of the CPU ops' self time (no device activity in the trace)"}
NO_PEAK = "left blank (no device activity in the trace: no peak)"
NO_OP_ALLOCATOR = "(no op: allocator)"  # memory events outside every op: the caching allocator's own


def is_pct(column: str) -> bool:
    return column == "pct" or column.endswith("_pct")


def _findings(f: Flat, o: Options, section: Callable[[str], pl.DataFrame]) -> pl.DataFrame:
    return findings_frame(trace_findings(f, section))


REGISTRY: tuple[Section, ...] = (
    Section(
        "findings",
        lambda f, o: _findings(f, o, _computer(f, o, {})),
        "What to fix (largest saving first; savings overlap, do not add them)",
        "what to fix: each finding's evidence, saving (a range of µs) and remedy, largest first",
        json_value=records,
        views=lambda df: {"findings": flat_view(df)},
        reads=_findings,
        text=findings_text,
        lead=True,
        meanings={
            "gain_low_pct": "% of the window's span (first start to last end): the low end of the saving",
            "gain_high_pct": "% of the window's span (first start to last end): the high end of the saving",
        },
    ),
    Section(
        "devices",
        lambda f, o: busy(f),
        "Devices: busy time (union of kernels, memcpy, memset over the span)",
        "busy and idle time per device",
        cpu_sweep=False,
        json=DEVICES,
        cpu_title="CPU busy time: union of its ops (no device activity in the trace)",
        cpu_meanings={"kernel_busy_pct": "left blank (no kernels in the trace)"},
        columns=(
            "device",
            "name",
            "busy_pct",
            "kernel_busy_pct",
            "span_us",
            "busy_us",
            "idle_us",
            "gaps",
            "largest_gap_us",
        ),
    ),
    Section(
        "kernels",
        lambda f, o: kernel_table(f),
        "Kernels per device",
        "time, FLOPs and roofline per kernel name",
        cpu_sweep=False,
        meanings=KERNEL_TIME,
        cpu_title="CPU ops by name: self time (no device activity in the trace)",
        cpu_meanings={**CPU_OP_TIME, "achieved_flops_pct": NO_PEAK, "achieved_bw_pct": NO_PEAK},
        json=IN_DEVICE,
        top_per_device=True,
        columns=(  # by importance: a narrow terminal leaves out the last ones
            "device",
            "name",
            "cpu_op",
            "count",
            "dur_us",
            "pct",
            "mean_us",
            "achieved_flops_pct",
            "achieved_bw_pct",
            "roofline_bound",
            "math_mode",
            "category",
            "flops",
            "achieved_tflops",
            "achieved_gbps",
        ),
    ),
    Section(
        "transfers",
        lambda f, o: transfer_table(f),
        "Memcpy / memset",
        "the same for memcpy and memset (and a stream's event waits: kind sync)",
        cpu_sweep=False,
        meanings={"pct": "% of the device's memcpy, memset and event-wait time"},
        json=IN_DEVICE,
        top_per_device=True,
        columns=("device", "kind", "name", "count", "dur_us", "pct", "mean_us", "bytes", "achieved_gbps"),
    ),
    Section(
        "streams",
        lambda f, o: busy(f, per_stream=True),
        "Streams",
        "busy and idle time per stream",
        cpu_sweep=False,
        cpu_title="Threads: busy and idle per thread (stream = thread id; no device activity)",
        json=IN_DEVICE,
        top_per_device=True,
        columns=("device", "stream", "busy_pct", "span_us", "busy_us", "gaps", "largest_gap_us"),
    ),
    Section(
        "categories",
        lambda f, o: categories(f),
        "Time by category",
        "time per kernel category",
        cpu_sweep=False,
        meanings={"pct": "% of the device's time in kernels, memcpy and memset"},
        cpu_title="Time by category: CPU ops' self time (no device activity in the trace)",
        cpu_meanings=CPU_OP_TIME,
        json=IN_DEVICE,
        top_per_device=True,
        columns=("device", "category", "count", "dur_us", "pct"),
    ),
    Section(
        "coverage",
        lambda f, o: coverage(f),
        "Cost coverage: kernel time costed, by source, and why the rest is not",
        "share of kernel time costed, and each cause of the rest with its remedy",
        meanings=KERNEL_TIME,
        json=IN_DEVICE,
        top_per_device=True,
        sweeps=False,
        columns=("device", "cause", "pct", "top", "remedy", "kernels"),
    ),
    Section(
        "ops",
        lambda f, o: with_memory_columns(op_table(f, group_by=o.group_by, sort=o.sort), f),
        "CPU ops (key_averages)",
        "CPU ops like key_averages()",
        top_in_json=True,
        columns=(  # by importance; a grouping's column (input_shape, stack, overload) follows the name
            "name",
            *GROUP_COLUMNS,
            "calls",
            "self_device_us",
            "self_device_pct",
            "self_cpu_us",
            "self_cpu_pct",
            "cpu_total_us",
            "device_total_us",
            "cpu_avg_us",
            "kernels",
            "flops",
            "self_cpu_memory_bytes",
            "self_device_memory_bytes",
        ),
    ),
    Section("launch", lambda f, o: launch_overhead(f), "Launch overhead", "launch durations and delays per device"),
    Section(
        "graphs",
        lambda f, o: graph_view(f),
        "CUDA/HIP graphs: replays, kernels and GPU time per replay, the ops they ran",
        "per graph: replays, kernels and GPU time per replay, launch vs the launches it replaces, its ops",
        meanings={"pct": "% of the device's time in kernels, memcpy and memset"},
        sweeps=False,
        columns=(  # by importance
            "device",
            "graph",
            "replays",
            "kernels_per_replay",
            "gpu_us_per_replay",
            "pct",
            "ops",
            "launch_us",
            "replaced_launch_us",
            "launched_from",
            "gpu_us",
            "launch_to_start_us",
            "module",
            "capture",
        ),
    ),
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
    Section(
        "idle",
        lambda f, o: idle(f, o.kernel_wait_us),
        "Idle time per stream: host wait (CPU late), kernel wait, other; comm wait",
        "why each stream was idle, gap by gap (HTA's breakdown), and how much of it during communication",
        sweeps=False,
    ),
    Section(
        "queue",
        lambda f, o: queue(f, o.queue_full),
        "Launch queue per stream",
        "launched activities waiting to start: max, mean, time blocked",
        sweeps=False,
    ),
    Section(
        "memory",
        lambda f, o: memory(f),
        "Memory: peak allocated and reserved per device, the op running at the peak",
        "the allocator's peaks from [memory] events",
        sweeps=False,
        blanks={"peak_op": NO_OP_ALLOCATOR},
    ),
    Section(
        "allocations",
        lambda f, o: memory_by_op(f),
        "Memory allocated per op (self)",
        "the ops whose own [memory] events allocate most",
        top_in_json=True,
        sweeps=False,
        blanks={"op": NO_OP_ALLOCATOR},
    ),
    Section(
        "sequences",
        lambda f, o: sequences(f, o.seq_len),
        "Repeated kernel chains (fusion candidates)",
        "the longest chains of consecutive kernels that repeat, merged from overlapping runs of N",
        meanings=KERNEL_TIME,
        top_per_device=True,
        top_in_json=True,
        sweeps=False,
        columns=("device", "count", "dur_us", "pct", "mean_gap_us", "kernels", "launched_by"),
        blanks={"launched_by": "(no op)"},
    ),
    Section(
        "critical-path",
        lambda f, o: critical_path_frame(f),
        "Critical path: the chain of work that bounded the trace's end",
        "its length and what it spent its time on (cpu, launch, kernel, memcpy, sync, waiting)",
        meanings={"pct": "% of the critical path's length"},
        sweeps=False,
        json_key="critical_path",
        json_value=lambda df: records(df)[0] if df.height else None,
        views=critical_path_views,
    ),
)
SECTIONS = tuple(s.name for s in REGISTRY)
BY_NAME = {s.name: s for s in REGISTRY}


def analyze(
    flat,
    group_by: str | None = None,
    sort: str | None = None,
    only: list[str] | None = None,
    options: Options | None = None,
) -> dict[str, pl.DataFrame]:
    """The reports of one trace by section name (`only` these, default every one of `SECTIONS`)."""
    f = as_flat(flat)
    check_grouping(group_by)
    chosen = [s for s in REGISTRY if not only or s.name in only or (s.json == DEVICES and _nested(only))]
    if any(s.sweeps and s.cpu_sweep for s in chosen):
        f.sweep_both(group_by)  # the CPU sweep also serves the compile view, and a CPU-only trace's device tables
    # else the sections read `f.activity`: the GPU sweep alone (on a CPU-only trace, its CPU sweep)
    options = options or Options()
    options = Options(**{**options.__dict__, "group_by": group_by, "sort": sort})
    done: dict[str, pl.DataFrame] = {}
    section = _computer(f, options, done)
    for s in chosen:
        if s.reads is None:
            section(s.name)
    for s in chosen:
        if s.reads is not None:
            done[s.name] = s.reads(f, options, section)
    return {s.name: done[s.name] for s in chosen}


def _computer(f: Flat, options: Options, done: dict[str, pl.DataFrame]) -> Callable[[str], pl.DataFrame]:
    """section(name): a section's frame, computed once (kept in `done`)."""

    def section(name: str) -> pl.DataFrame:
        if name not in done:
            done[name] = BY_NAME[name].compute(f, options)
        return done[name]

    return section


def _nested(only: list[str]) -> bool:
    """Whether a section nested in the devices' objects is asked for (the device list comes too)."""
    return any(BY_NAME[n].json == IN_DEVICE for n in only if n in BY_NAME)


def pct_meanings(section: str | None, columns: Iterable[str], cpu_only: bool = False) -> dict[str, str]:
    """What each percentage column among `columns` of a section's table is a share of (`cpu_only`:
    where the table's rows are a CPU-only trace's)."""
    s = BY_NAME.get(section) if section else None
    own = {} if s is None else {**s.meanings, **s.cpu_meanings} if cpu_only else s.meanings
    return {c: own.get(c) or PCT_MEANINGS.get(c, "a percentage") for c in columns if is_pct(c)}


def section_help() -> str:
    """Every section with its help line, for the command line."""
    return ", ".join(f"{s.name} ({s.help})" for s in REGISTRY)
