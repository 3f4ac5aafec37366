"""idle: why a GPU stream sat idle, gap by gap (Holistic Trace Analysis' definition).

Per device and stream, over its GPU activities (kernels, memcpy, memset; not the tasks by which a
stream waits for an event, kind `sync`) in start order: each gap between an activity's end and the
next one's start is **host wait** when the next activity's launch call started after that end (the
CPU was late), else **kernel wait** when the gap is shorter than `kernel_wait_us` (default 30 µs:
back-to-back kernels), else **other**. Consecutive kernels that overlap by a few µs (the clock's
jitter) give a small negative gap, summed as it is, as Holistic Trace Analysis does. A stream whose
activities run at once (an overlap longer than CONCURRENT_US: HCCL's tasks on Ascend) counts their
union instead: each gap runs from the stream's reach (the latest end of the activities before), an
activity that starts before it follows no gap, and idle is never negative. Nothing is counted
before the first activity or after the last. An activity whose launch is not in the trace is never
host wait.

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
# activities of one stream that overlap by more than this run at once (HCCL's tasks on Ascend: up to
# 73 ms); less is the clock's jitter between consecutive kernels (NVIDIA: 1-13 µs), which HTA sums
CONCURRENT_US = 50.0
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


def _sums(gap: str, host: str, counted: pl.Expr, kernel_wait_ns: float, prefix: str) -> list[pl.Expr]:
    """A stream's idle and its causes from its gaps (`gap`, `host` columns) that `counted` keeps."""
    g = pl.col(gap)
    short = ~pl.col(host) & (g < kernel_wait_ns)
    return [
        g.filter(counted).sum().alias(f"{prefix}idle_ns"),
        g.filter(counted & pl.col(host)).sum().alias(f"{prefix}host_wait_ns"),
        g.filter(counted & short).sum().alias(f"{prefix}kernel_wait_ns"),
        g.filter(counted & ~pl.col(host) & ~short).sum().alias(f"{prefix}other_ns"),
        pl.col("comm").filter(counted).sum().alias(f"{prefix}comm_wait_ns"),
        counted.sum().cast(pl.Int64).alias(f"{prefix}gaps"),
    ]


def _gaps(rows: pl.DataFrame, kernel_wait_ns: float, union: pl.DataFrame | None) -> pl.DataFrame:
    """A window's gaps (rows with their stream's reach: `StreamCarry(reach=True)`), summed per stream
    both ways (`idle`): from the previous activity's end, negative ones included (HTA's), and from
    the stream's reach (its union); and the stream's longest overlap so far."""
    prev_end, prev_reach = pl.col("end_ns").shift(1).over(STREAM), pl.col("reach_ns").shift(1).over(STREAM)
    launched_after = lambda t: pl.col("launch_ts_ns").is_not_null() & (pl.col("launch_ts_ns") > t)
    g = rows.with_columns(
        gap=pl.col("ts_ns") - prev_end,
        host=launched_after(prev_end),
        u_gap=pl.col("ts_ns") - prev_reach,
        u_host=launched_after(prev_reach),
        prev_reach=prev_reach,
    ).filter(~pl.col("carried"))  # every stream a row
    if union is None:
        g = g.with_columns(comm=pl.lit(0, pl.Int64))
    else:  # the communication during a gap of the stream's union, in either reading
        a, b = g["prev_reach"].fill_null(g["ts_ns"]), g["ts_ns"]
        comm = _comm_before(b, g["device"], union) - _comm_before(a, g["device"], union)
        g = g.with_columns(comm=pl.when(pl.col("u_gap") > 0).then(comm).otherwise(0))
    return g.group_by(STREAM).agg(
        *_sums("gap", "host", pl.col("gap").is_not_null(), kernel_wait_ns, ""),
        *_sums("u_gap", "u_host", pl.col("u_gap") >= 0, kernel_wait_ns, "u_"),
        overlap_ns=(-pl.col("u_gap")).max(),
    )


def idle(flat, kernel_wait_us: float = KERNEL_WAIT_US) -> pl.DataFrame:
    """(device, stream, idle_us, host_wait_us, kernel_wait_us, other_us, comm_wait_us, gaps): the idle
    time between the stream's activities and its breakdown (see the module docstring); host + kernel
    + other = idle; comm_wait: the part of it while the device ran communication."""
    f: Flat = as_flat(flat)
    carry, total = StreamCarry(1, reach=True), None
    union = comm_union(f) if f.has_gpu else None
    both = [*SUMS, *(f"u_{c}" for c in SUMS)]
    for rows in activity_windows(f, ["launch_ts_ns"], WORK):  # a stream's event waits are idle time
        gaps = _gaps(carry.prepend(rows), kernel_wait_us * 1e3, union)
        total = fold(total, gaps, STREAM, [pl.col(both).sum(), pl.col("overlap_ns").max()])
    if total is not None:  # a stream whose activities run at once counts their union
        concurrent = pl.col("overlap_ns").fill_null(0) > CONCURRENT_US * 1e3
        total = total.with_columns(
            pl.when(concurrent).then(pl.col(f"u_{c}")).otherwise(pl.col(c)).alias(c) for c in SUMS
        )
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
