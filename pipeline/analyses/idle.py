"""idle: why a GPU stream sat idle, gap by gap (Holistic Trace Analysis' definition).

Per device and stream, over its GPU activities (kernels, memcpy, memset; not the tasks by which a
stream waits for an event, kind `sync`) in start order: each gap between the stream's reach (the
latest end of the activities before) and the next activity's start is **host wait** when the next
activity's launch call started after that reach (the CPU was late), else **kernel wait** when the
gap is shorter than `kernel_wait_us` (default 30 µs: back-to-back kernels), else **other**. An
activity that starts before the reach (tasks that overlap on one stream, as HCCL's do on Ascend)
follows no gap: the stream's activities count as their union, so idle is never negative (Holistic
Trace Analysis sums such overlaps as negative gaps). Nothing is counted before the first activity
or after the last. An activity whose launch is not in the trace is never host wait.

Across the three causes, **comm_wait** is the part of the (positive) gaps during which a
communication kernel (category `communication`: NCCL, RCCL, DeepEP, ...) ran on the device: the
stream most likely sat waiting on a collective another stream ran. It overlaps the causes rather
than splitting them further (host + kernel + other stays HTA's idle). It reads the device's
communication kernels as a union of busy intervals: memory grows with those intervals, not with
the trace.
"""

from __future__ import annotations

import polars as pl

from pipeline.analyses.activity import COLLECTIVE, KERNEL, WORK, gpu_columns
from pipeline.analyses.flat import Flat, as_flat
from pipeline.analyses.gpu_order import STREAM, StreamCarry, activity_windows
from pipeline.analyses.sweep import fold
from pipeline.cost.categories import CATEGORIES, CategoryMemo, with_category

KERNEL_WAIT_US = 30.0
_COMM = next(c for c in CATEGORIES if c.name == "communication")
SUMS = ["idle_ns", "host_wait_ns", "kernel_wait_ns", "other_ns", "comm_wait_ns", "gaps"]


def comm_union(f: Flat) -> pl.DataFrame | None:
    """(device, start_ns, end_ns, before_ns): the union of each device's communication kernels,
    interval by interval in time, with the busy time of the intervals before it; None without any.
    A kernel's category follows its name and, failing that, its op's (`cost.categories`): only the
    kernels either could make communication are read, and categorised as the reports do."""
    have = set(pl.scan_parquet(f.gpu_ops_file).collect_schema().names())
    could = pl.col("name").str.contains(_COMM.kernel or "")
    if "cpu_op_name" in have:
        could = could | pl.col("cpu_op_name").str.contains(_COMM.op or "")
    memo, columns = CategoryMemo(), gpu_columns(f.gpu_ops_file, ["name", "cpu_op_name", "kind"])
    windows = [
        with_category(w, memo=memo).filter(COLLECTIVE).select("device", "ts_ns", "end_ns")
        for w in activity_windows(f, columns, KERNEL & could)
    ]
    k = pl.concat(windows) if windows else None
    if k is None or k.is_empty():
        return None
    k = k.sort("device", "ts_ns").with_columns(reach=pl.col("end_ns").cum_max().over("device"))
    new = (pl.col("ts_ns") > pl.col("reach").shift(1).over("device")).fill_null(True)
    k = k.with_columns(run=new.cum_sum())
    length = pl.col("end_ns") - pl.col("start_ns")
    u = k.group_by("device", "run").agg(start_ns=pl.col("ts_ns").min(), end_ns=pl.col("end_ns").max())
    u = u.sort("device", "start_ns").with_columns(before_ns=length.cum_sum().over("device") - length)
    return u.drop("run")


def _comm_before(points: pl.Series, devices: pl.Series, union: pl.DataFrame) -> pl.Series:
    """The device's communication busy time before each point (the union's integral up to it)."""
    p = pl.DataFrame({"i": range(len(points)), "device": devices, "t": points}).sort("t")
    j = p.join_asof(union, left_on="t", right_on="start_ns", by="device", strategy="backward", check_sortedness=False)
    inside = pl.min_horizontal(pl.col("t"), pl.col("end_ns")) - pl.col("start_ns")
    return j.sort("i").select((pl.col("before_ns") + inside).fill_null(0)).to_series()


def _gaps(rows: pl.DataFrame, kernel_wait_ns: float, union: pl.DataFrame | None) -> pl.DataFrame:
    """The gaps of rows whose end_ns is their stream's reach (`StreamCarry(reach=True)`)."""
    prev_end = pl.col("end_ns").shift(1).over(STREAM)
    gap = pl.col("ts_ns") - prev_end
    host = pl.col("launch_ts_ns").is_not_null() & (pl.col("launch_ts_ns") > prev_end)
    g = rows.with_columns(gap=gap, host=host, prev_end=prev_end).filter(~pl.col("carried"))  # every stream a row
    if union is None:
        g = g.with_columns(comm=pl.lit(0, pl.Int64))
    else:
        a, b = g["prev_end"].fill_null(g["ts_ns"]), g["ts_ns"]
        comm = _comm_before(b, g["device"], union) - _comm_before(a, g["device"], union)
        g = g.with_columns(comm=pl.when(pl.col("gap") > 0).then(comm).otherwise(0))
    counted = pl.col("gap") >= 0  # null: a stream's first activity; negative: it overlaps the reach
    return g.group_by(STREAM).agg(
        idle_ns=pl.col("gap").filter(counted).sum(),
        host_wait_ns=pl.col("gap").filter(counted & pl.col("host")).sum(),
        kernel_wait_ns=pl.col("gap").filter(counted & ~pl.col("host") & (pl.col("gap") < kernel_wait_ns)).sum(),
        other_ns=pl.col("gap").filter(counted & ~pl.col("host") & (pl.col("gap") >= kernel_wait_ns)).sum(),
        comm_wait_ns=pl.col("comm").filter(counted).sum(),
        gaps=counted.sum().cast(pl.Int64),
    )


def idle(flat, kernel_wait_us: float = KERNEL_WAIT_US) -> pl.DataFrame:
    """(device, stream, idle_us, host_wait_us, kernel_wait_us, other_us, comm_wait_us, gaps): the idle
    time between the stream's activities and its breakdown (see the module docstring); host + kernel
    + other = idle; comm_wait: the part of it while the device ran communication."""
    f: Flat = as_flat(flat)
    carry, total = StreamCarry(1, reach=True), None
    union = comm_union(f) if f.has_gpu else None
    for rows in activity_windows(f, ["launch_ts_ns"], WORK):  # a stream's event waits are idle time
        gaps = _gaps(carry.prepend(rows), kernel_wait_us * 1e3, union)
        total = fold(total, gaps, STREAM, [pl.col(SUMS).sum()])
    if total is None:
        return pl.DataFrame(
            schema={
                "device": pl.Int64,
                "stream": pl.Int64,
                **{c.replace("_ns", "_us"): pl.Float64 for c in SUMS[:-1]},
                "gaps": pl.Int64,
            }
        )
    return total.sort(STREAM).select(
        *STREAM, *((pl.col(c) / 1e3).alias(c.replace("_ns", "_us")) for c in SUMS[:-1]), "gaps"
    )
