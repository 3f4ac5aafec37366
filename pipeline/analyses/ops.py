"""ops: the CPU op table, like torch.profiler's key_averages().table(), from the CPU sweep's op totals."""

from __future__ import annotations

import polars as pl

from pipeline.analyses.cpu import GROUPINGS, check_grouping
from pipeline.analyses.flat import as_flat
from pipeline.analyses.graphs import replayed_ops
from pipeline.analyses.rollup import us
from pipeline.errors import UsageError, did_you_mean


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
    ops = _with_replayed(f.cpu(group_by, stack_n).ops, replayed_ops(f, group_by), keys, own_counted=group_by is None)
    out = ops.select(
        *keys,
        calls=pl.col("calls").cast(pl.UInt32),
        self_cpu_us=us("self_ns"),
        cpu_total_us=us("dur_ns"),
        cpu_avg_us=us("dur_ns") / pl.when(pl.col("cpu_calls") > 0).then("cpu_calls"),
        self_device_us=us("self_device_ns"),
        device_total_us=us("device_ns"),
        kernels="kernels",
        flops=pl.when(pl.col("flops_ops") > 0).then("flops"),
        self_cpu_pct=share("self_ns"),
        self_device_pct=share("self_device_ns"),
    )
    sort = sort or ("self_device_us" if f.has_gpu else "self_cpu_us")
    if sort not in out.columns:
        said = did_you_mean(sort, out.columns)
        raise UsageError(f"cannot sort by {sort!r}{said}; columns: {', '.join(out.columns)}")
    return out.sort(sort, *keys, descending=[True] + [False] * len(keys), nulls_last=True)


def _with_replayed(ops: pl.DataFrame, replayed: pl.DataFrame, keys: list[str], own_counted: bool) -> pl.DataFrame:
    """The CPU sweep's op totals with the ops graph replays ran (`graphs.replayed_ops`: no CPU call
    in this trace) added by key: their calls, kernels and device time (self and total); a key no CPU
    op has becomes a row with no CPU time (`cpu_calls`: the calls made on the CPU). `own_counted`:
    the ops' own GPU time and FLOPs were summed per op name over every kernel, replayed ones
    included (no grouping)."""
    if replayed.is_empty():
        return ops.with_columns(cpu_calls=pl.col("calls"))
    both = ops.join(replayed, on=keys, how="full", coalesce=True, suffix="_r")
    zero = lambda c: pl.col(c).fill_null(0)
    own = (
        (
            pl.col("self_device_ns").fill_null(pl.col("device_ns_r")),
            pl.col("flops").fill_null(pl.col("flops_r")),
            pl.col("flops_ops").fill_null(pl.col("flops_n")),
        )
        if own_counted
        else (
            zero("self_device_ns") + zero("device_ns_r"),
            pl.when(pl.col("flops").is_null() & pl.col("flops_r").is_null())
            .then(None)
            .otherwise(zero("flops") + zero("flops_r")),
            zero("flops_ops") + zero("flops_n"),
        )
    )
    return both.with_columns(
        cpu_calls=zero("calls"),
        calls=zero("calls") + zero("calls_r"),
        self_ns=zero("self_ns"),
        dur_ns=zero("dur_ns"),
        device_ns=zero("device_ns") + zero("device_ns_r"),
        kernels=zero("kernels") + zero("kernels_r"),
        self_device_ns=own[0],
        flops=own[1],
        flops_ops=own[2],
    ).select(*ops.columns, "cpu_calls")
