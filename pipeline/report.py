"""report: the reports of one trace as polars DataFrames, and their documents.

Every report takes a trace file, a flattened trace, or a `Flat` from `opened` (open a trace once
for several reports: each sweep of it is made once and shared):

>>> from pipeline import report
>>> from pipeline.synthetic import write_demo
>>> write_demo("example.json.gz", 0.3)
>>> with report.opened("example.json.gz") as t:
...     kernels = report.kernel_table(t)             # per device and kernel name: time, FLOPs, roofline
...     busy = report.busy(t)                        # per device: busy and idle time
...     path = report.critical_path(t)               # what bounded the trace's end
>>> kernels.columns[:5]
['device', 'name', 'category', 'count', 'dur_us']
>>> round(sum(path["breakdown_us"].values()), 3) == round(path["length_us"], 3)
True

`analyze` computes every section of `tracepipe analyze`, `format_analysis` writes them as the
command does. This module is the public face of `pipeline.analyses` (one module per analysis,
`registry` for the sections) and `pipeline.render` (tables, documents): see `__all__`. Other
names below were importable from the single report module this replaced and still are.
"""

# ruff: noqa: F401  (names outside __all__ stay importable from here, as before the split)
from pipeline.analyses.activity import CPU_DEVICE, Activity
from pipeline.analyses.busy import busy
from pipeline.analyses.categories import categories
from pipeline.analyses.communication import communication
from pipeline.analyses.compiled import compile_view, compiled_regions
from pipeline.analyses.coverage import coverage
from pipeline.analyses.cpu import GROUPINGS, CpuOps
from pipeline.analyses.critical_path import critical_path, critical_path_items
from pipeline.analyses.diff import SIDE_COLS, diff, diff_side
from pipeline.analyses.flat import Flat, as_flat, opened
from pipeline.analyses.graphs import graph_launches, graph_view, replayed_ops
from pipeline.analyses.idle import idle
from pipeline.analyses.kernels import kernel_table, transfer_table
from pipeline.analyses.launch import launch_overhead
from pipeline.analyses.memory import memory, memory_by_op, memory_series
from pipeline.analyses.names import KERNEL_NAME_RULES, OP_ALIASES, normalize_kernel, normalize_op
from pipeline.analyses.ops import op_table
from pipeline.analyses.queue import queue, queue_series
from pipeline.analyses.registry import SECTIONS, Options, analyze
from pipeline.analyses.rollup import NS_PER_US
from pipeline.analyses.sequences import sequences
from pipeline.analyses.stacks import STACK_METRICS, collapsed_stacks, stack_lines
from pipeline.analyses.window import Window
from pipeline.cost.categories import CATEGORIES, OTHER, Category, CategoryMemo, category_expr, with_category
from pipeline.render.documents import (
    DEFAULT_TEXT_TOP,
    DIFF_TEXT_COLUMNS,
    FORMATS,
    TEXT_COLUMNS,
    TITLES,
    analysis_json,
    analysis_sheets,
    check_options,
    diff_json,
    diff_text,
    format_analysis,
    format_diff,
    render_sections,
    write_analysis_workbook,
    write_diff_workbook,
)
from pipeline.render.tables import finite, render

# isort: split
# ------------------------------------------------------------------ not the API: kept importable
from pipeline.analyses.activity import (
    COLLECTIVE,
    COLLECTIVE_SETS,
    GPU_COLUMNS,
    KERNEL,
    LAUNCH_QUANTILES,
    NAME_KEYS,
    NAME_SUM_FOLD,
    POLARS_TYPES,
    RUN_SETS,
    ActivityTally,
    gpu_sweep,
)
from pipeline.analyses.cpu import (
    ARGS,
    GROUP_ARGS,
    IS_OP,
    IS_STEP,
    OP_FOLD,
    OP_SUMS,
    STACK_TRANSLATE,
    CpuTally,
    Launches,
    cpu_sweep,
)
from pipeline.analyses.intervals import covered_overlap, nesting
from pipeline.analyses.names import OVERLOAD_SUFFIX
from pipeline.analyses.rollup import cost_columns
from pipeline.analyses.sweep import (
    Nest,
    Paths,
    RunTally,
    SliceSweep,
    ThreadPrefix,
    beside,
    first_by,
    float_sum,
    fold,
    interval_union,
    quantiles_from_counts,
    read,
    read_among,
    time_windows,
    within,
)
from pipeline.cost.devices import one_model
from pipeline.errors import BadTrace, DatasetError, UsageError
from pipeline.kineto import ACTIVITY_KINDS as GPU_KINDS
from pipeline.kineto import ANNOTATION_CAT, COMPILED_REGION, FRAME_CAT, OP_CAT, STEP_NAME
from pipeline.link.nesting import LONGER_FIRST

__all__ = [
    # open a trace once for several reports
    "opened",
    "Flat",
    "Window",
    # the reports, each a polars DataFrame
    "kernel_table",
    "transfer_table",
    "busy",
    "categories",
    "op_table",
    "launch_overhead",
    "graph_view",
    "compile_view",
    "compiled_regions",
    "communication",
    "coverage",
    "idle",
    "queue",
    "sequences",
    "memory",
    "memory_by_op",
    "memory_series",
    "queue_series",
    "critical_path",
    "critical_path_items",
    "collapsed_stacks",
    "stack_lines",
    "diff",
    # every section of `tracepipe analyze`, and its documents
    "analyze",
    "Options",
    "SECTIONS",
    "format_analysis",
    "analysis_json",
    "analysis_sheets",
    "write_analysis_workbook",
    "format_diff",
    "diff_json",
    "write_diff_workbook",
    "render",
    # names as reports group them
    "normalize_op",
    "normalize_kernel",
    "CATEGORIES",
]
