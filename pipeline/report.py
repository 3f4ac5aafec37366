"""report: the reports of one flattened trace as polars DataFrames (a facade over `pipeline.analyses`)."""
from pipeline.analyses.report import *  # noqa: F401,F403
from pipeline.analyses.report import (  # noqa: F401
    Flat, analyze, as_flat, busy, categories, collapsed_stacks, communication, compile_view, compiled_regions, diff,
    kernel_table, launch_overhead, op_table, opened, transfer_table)
