"""ops: the CPU op table, like torch.profiler's key_averages().table(), from the CPU sweep's op totals."""

from __future__ import annotations

import polars as pl

from pipeline.analyses.cpu import GROUPINGS, check_grouping
from pipeline.analyses.flat import as_flat
from pipeline.analyses.rollup import us
from pipeline.errors import UsageError


def op_table(flat, group_by: str | None = None, sort: str | None = None, stack_n: int = 5) -> pl.DataFrame:
    """Like torch.profiler's key_averages().table(): per op name (and input shape, stack or
    overload): calls, self/total CPU time, self/total device time (its GPU ops; total includes
    those of the ops it calls), kernels launched, FLOPs of its own kernels.

    sort: any output column (descending); default self_device_us with GPU activity, else self_cpu_us.
    """
    check_grouping(group_by)
    f = as_flat(flat)
    keys = ["name", *GROUPINGS[group_by]]
    share = lambda col: 100 * us(col) / us(pl.col(col).sum())
    out = f.cpu(group_by, stack_n).ops.select(
        *keys,
        calls=pl.col("calls").cast(pl.UInt32),
        self_cpu_us=us("self_ns"),
        cpu_total_us=us("dur_ns"),
        cpu_avg_us=us("dur_ns") / pl.col("calls"),
        self_device_us=us("self_device_ns"),
        device_total_us=us("device_ns"),
        kernels="kernels",
        flops=pl.when(pl.col("flops_ops") > 0).then("flops"),
        self_cpu_pct=share("self_ns"),
        self_device_pct=share("self_device_ns"),
    )
    sort = sort or ("self_device_us" if f.has_gpu else "self_cpu_us")
    if sort not in out.columns:
        raise UsageError(f"cannot sort by {sort!r}; columns: {', '.join(out.columns)}")
    return out.sort(sort, *keys, descending=[True] + [False] * len(keys), nulls_last=True)
