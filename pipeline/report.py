"""report: the reports of one flattened trace as polars DataFrames, and their documents.

The public face of `pipeline.analyses` (one module per analysis, `registry` for `analyze`'s
sections) and `pipeline.render` (tables, documents): see `__all__`. The other names below were
importable from the single report module this replaced and still are, from where they now live.
"""

from pipeline.analyses.activity import CPU_DEVICE, Activity
from pipeline.analyses.busy import busy
from pipeline.analyses.categories import categories
from pipeline.analyses.communication import communication
from pipeline.analyses.compiled import compile_view, compiled_regions
from pipeline.analyses.cpu import GROUPINGS, CpuOps
from pipeline.analyses.diff import SIDE_COLS, diff, diff_side
from pipeline.analyses.flat import Flat, as_flat, opened
from pipeline.analyses.kernels import kernel_table, transfer_table
from pipeline.analyses.launch import launch_overhead
from pipeline.analyses.names import KERNEL_NAME_RULES, OP_ALIASES, normalize_kernel, normalize_op
from pipeline.analyses.ops import op_table
from pipeline.analyses.registry import SECTIONS, analyze
from pipeline.analyses.rollup import NS_PER_US
from pipeline.analyses.stacks import STACK_METRICS, collapsed_stacks, stack_lines
from pipeline.cost.categories import CATEGORIES, OTHER, Category, CategoryMemo, category_expr, with_category
from pipeline.render.documents import (
    DEFAULT_TEXT_TOP,
    DIFF_TEXT_COLUMNS,
    FORMATS,
    TEXT_COLUMNS,
    TITLES,
    analysis_json,
    check_options,
    diff_json,
    diff_text,
    format_analysis,
    format_diff,
    render_sections,
)
from pipeline.render.tables import finite, render

# isort: split
# ------------------------------------------------------------------ not the API: kept importable
from pipeline.analyses.activity import (  # noqa: F401
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
from pipeline.analyses.cpu import (  # noqa: F401
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
from pipeline.analyses.intervals import covered_overlap, nesting  # noqa: F401
from pipeline.analyses.names import OVERLOAD_SUFFIX  # noqa: F401
from pipeline.analyses.rollup import cost_columns  # noqa: F401
from pipeline.analyses.sweep import (  # noqa: F401
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
from pipeline.cost.devices import one_model  # noqa: F401
from pipeline.errors import BadTrace, DatasetError, UsageError  # noqa: F401
from pipeline.kineto import ACTIVITY_KINDS as GPU_KINDS  # noqa: F401
from pipeline.kineto import ANNOTATION_CAT, COMPILED_REGION, FRAME_CAT, OP_CAT, STEP_NAME  # noqa: F401
from pipeline.link.nesting import LONGER_FIRST  # noqa: F401

__all__ = [
    # the reports
    "kernel_table",
    "transfer_table",
    "busy",
    "categories",
    "op_table",
    "collapsed_stacks",
    "stack_lines",
    "launch_overhead",
    "compile_view",
    "compiled_regions",
    "communication",
    "diff",
    "diff_side",
    "analyze",
    # a trace opened once for several reports
    "Flat",
    "opened",
    "as_flat",
    "Activity",
    "CpuOps",
    # names and categories
    "normalize_op",
    "normalize_kernel",
    "OP_ALIASES",
    "KERNEL_NAME_RULES",
    "CATEGORIES",
    "OTHER",
    "Category",
    "CategoryMemo",
    "category_expr",
    "with_category",
    # options and documents
    "SECTIONS",
    "GROUPINGS",
    "STACK_METRICS",
    "FORMATS",
    "check_options",
    "format_analysis",
    "format_diff",
    "analysis_json",
    "diff_json",
    "render",
    "render_sections",
    "diff_text",
    "finite",
    "TEXT_COLUMNS",
    "TITLES",
    "DEFAULT_TEXT_TOP",
    "DIFF_TEXT_COLUMNS",
    "SIDE_COLS",
    "CPU_DEVICE",
    "NS_PER_US",
]
