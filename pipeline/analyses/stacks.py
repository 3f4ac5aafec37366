"""stacks: flame-graph collapsed stacks ("a;b;c value", like torch's export_stacks) from a CPU sweep
with python_function frames."""

from __future__ import annotations

import polars as pl

from pipeline.analyses.flat import as_flat
from pipeline.analyses.rollup import NS_PER_US
from pipeline.errors import UsageError

STACK_METRICS = ("self_cpu_time_total", "self_device_time_total")


def collapsed_stacks(flat, metric: str = "self_cpu_time_total") -> pl.DataFrame:
    """(stack, value): flame-graph collapsed stacks "outer;...;inner" with the summed self time
    (µs, integer, > 0) of the innermost frame, like export_stacks. Frames are cpu ops, user
    annotations and python_function events nested per thread. `str(line)` = stack + " " + value."""
    if metric not in STACK_METRICS:
        raise UsageError(f"metric must be one of {', '.join(STACK_METRICS)}")
    value = "self_ns" if metric == "self_cpu_time_total" else "device_ns"
    stacks = as_flat(flat).any_frames().stacks
    assert stacks is not None, "a sweep with frames makes stacks"
    return (
        stacks.select(stack="path", value=(pl.col(value) / NS_PER_US).floor().cast(pl.Int64))
        .filter(pl.col("value") > 0)
        .sort("stack")
    )


def stack_lines(stacks: pl.DataFrame) -> str:
    """collapsed_stacks as the text export_stacks writes: one "stack value" line each."""
    return "".join(f"{s} {v}\n" for s, v in stacks.iter_rows())
