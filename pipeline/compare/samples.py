"""samples: what every name took in each trace (or in each of its profiler steps), at every level
a comparison looks at, read from a dataset's tables.

Levels and their names:

* `kernel`: every GPU activity by its full name (kernels, memcpy, memset), as `analyze` lists them;
* `op`: the GPU time of the kernels each CPU op launched, by op name normalised across vendors
  (`pipeline.analyses.names.normalize_op`, as `diff` keys ops);
* `category`: the kernel category of the cost stage (gemm, attention, communication, ...);
* `step`: from the `steps` table: `step` (the ProfilerStep's wall time), `compute`,
  `communication`, `exposed_communication`;
* `idle`: why the GPU streams sat idle, `idle` = `host_wait` + `kernel_wait` + `other_idle`, by
  `analyze`'s definition (`pipeline.analyses.idle`), summed over a trace's streams;
* `collective`: each matched collective call (`pipeline.runs.match`), by kind and message size,
  with its latency and bus bandwidth as `tracepipe ranks` measures them.

A GPU activity belongs to the profiler step whose interval holds its launch (its start when it
has no launch); an idle gap to the step of the activity after it. Traces are read a few at a time
(at most CHUNK_ROWS GPU activities: memory is bounded by that, not by the run), names as
categories, and folded into per-trace totals at once.
"""

from __future__ import annotations

from pathlib import Path

import polars as pl

from pipeline.analyses.idle import KERNEL_WAIT_US
from pipeline.analyses.names import normalize_op
from pipeline.dataset.tables import tables

LEVELS = ("kernel", "op", "category", "collective", "step", "idle")
GPU_LEVELS = ("kernel", "op", "category", "idle")
STEP_NAMES = {
    "step_ns": "step",
    "compute_ns": "compute",
    "comm_ns": "communication",
    "exposed_ns": "exposed_communication",
}
IDLE_NAMES = {"idle": "idle", "host": "host_wait", "kernel": "kernel_wait", "other": "other_idle"}
CHUNK_ROWS = 2_000_000
TOTALS = {
    "trace_id": pl.String,
    "step": pl.String,
    "level": pl.String,
    "name": pl.String,
    "time_ns": pl.Float64,
    "count": pl.Int64,
}


def empty_totals() -> pl.DataFrame:
    return pl.DataFrame(schema=TOTALS)


def step_intervals(ds: Path, ids: list[str]) -> pl.DataFrame:
    """(trace_id, step, step_ts_ns, step_end_ns): the profiler steps of the traces."""
    s = tables(ds, ["steps"]).get("steps")
    if s is None:
        return pl.DataFrame(
            schema={"trace_id": pl.String, "step": pl.String, "step_ts_ns": pl.Int64, "step_end_ns": pl.Int64}
        )
    return (
        s.filter(pl.col("trace_id").is_in(ids))
        .group_by("trace_id", "step")
        .agg(pl.col("step_ts_ns").min(), pl.col("step_end_ns").max())
        .collect()
        .sort("trace_id", "step_ts_ns")
    )


def totals(ds: Path, ids: list[str], levels, by_step: bool) -> pl.DataFrame:
    """(trace_id, step, level, name, time_ns, count) of every name of the `levels` (of GPU_LEVELS
    and `step`): per trace (step null), or per trace and step (`by_step`; step null: outside every
    step)."""
    t = tables(ds, ["trace", "gpu_ops", "steps"])
    intervals = step_intervals(ds, ids) if by_step else None
    out = []
    if "step" in levels:
        out.append(_step_level(t, ids, by_step))
    if any(lv in levels for lv in GPU_LEVELS) and "gpu_ops" in t:
        sizes = t["trace"].filter(pl.col("trace_id").is_in(ids)).select("trace_id", "n_gpu_ops").collect()
        for chunk in _chunks(sizes):
            out += _gpu_levels(t["gpu_ops"], chunk, levels, intervals)
    out = [f.select(pl.col(c).cast(dt) for c, dt in TOTALS.items()) for f in out if f.height]
    return pl.concat(out) if out else empty_totals()


def _chunks(sizes: pl.DataFrame) -> list[list[str]]:
    """The traces in groups of at most CHUNK_ROWS GPU activities (a larger trace alone)."""
    chunks: list[list[str]] = [[]]
    rows = 0
    for tid, n in sizes.sort("trace_id").iter_rows():
        n = n or 0
        if chunks[-1] and rows + n > CHUNK_ROWS:
            chunks.append([])
            rows = 0
        chunks[-1].append(tid)
        rows += n
    return [c for c in chunks if c]


def _gpu_rows(gpu_ops: pl.LazyFrame, ids: list[str]) -> pl.DataFrame:
    cat = lambda c: pl.col(c).cast(pl.Categorical)
    return (
        gpu_ops.filter(pl.col("trace_id").is_in(ids))
        .select(
            cat("trace_id"),
            cat("kind"),
            cat("name"),
            cat("cpu_op_name"),
            pl.coalesce(pl.col("category"), pl.col("kind")).cast(pl.Categorical).alias("category"),
            "device",
            "stream",
            "ts_ns",
            pl.col("dur_ns").fill_null(0),
            "launch_ts_ns",
        )
        .collect(engine="streaming")
    )


def with_steps(rows: pl.DataFrame, intervals: pl.DataFrame | None, at: str) -> pl.DataFrame:
    """Rows with `step`: the profiler step of their trace whose interval holds column `at`."""
    if intervals is None:
        return rows.with_columns(step=pl.lit(None, pl.String))
    iv = intervals.with_columns(pl.col("trace_id").cast(pl.Categorical)).rename({"step": "_step"})
    j = (
        rows.with_columns(_t=pl.col(at))
        .sort("trace_id", "_t")
        .join_asof(iv, left_on="_t", right_on="step_ts_ns", by="trace_id", strategy="backward", check_sortedness=False)
    )
    inside = pl.col("_t").is_not_null() & (pl.col("_t") <= pl.col("step_end_ns"))
    return j.with_columns(step=pl.when(inside).then(pl.col("_step"))).drop("_t", "_step", "step_ts_ns", "step_end_ns")


def _gpu_levels(gpu_ops: pl.LazyFrame, ids: list[str], levels, intervals: pl.DataFrame | None) -> list[pl.DataFrame]:
    rows = _gpu_rows(gpu_ops, ids)
    if not rows.height:
        return []
    launch = rows.with_columns(_at=pl.coalesce("launch_ts_ns", "ts_ns"))
    stepped = (
        with_steps(launch, intervals, "_at")
        if intervals is not None
        else launch.with_columns(step=pl.lit(None, pl.String))
    )
    keys = ["trace_id", "step"]
    sums = [pl.col("dur_ns").sum().cast(pl.Float64).alias("time_ns"), pl.len().cast(pl.Int64).alias("count")]
    out = []
    if "kernel" in levels:
        out.append(stepped.group_by(*keys, "name").agg(sums).with_columns(level=pl.lit("kernel")))
    if "op" in levels:
        ops = stepped.filter((pl.col("kind") == "kernel") & pl.col("cpu_op_name").is_not_null())
        per = ops.group_by(*keys, "cpu_op_name").agg(sums)
        per = per.with_columns(name=normalize_op(pl.col("cpu_op_name").cast(pl.String)))
        out.append(per.group_by(*keys, "name").agg(pl.col("time_ns", "count").sum()).with_columns(level=pl.lit("op")))
    if "category" in levels:
        cats = stepped.group_by(*keys, name="category").agg(sums)
        out.append(cats.with_columns(level=pl.lit("category")))
    if "idle" in levels:
        out.append(_idle(rows, intervals))
    return [f.with_columns(pl.col("trace_id", "name").cast(pl.String)) for f in out]


def _idle(rows: pl.DataFrame, intervals: pl.DataFrame | None) -> pl.DataFrame:
    """Idle time per trace (and step of the activity after each gap): `analyze`'s idle section,
    summed over streams, in long form."""
    stream = ["trace_id", "device", "stream"]
    s = rows.select(*stream, "ts_ns", "launch_ts_ns", end_ns=pl.col("ts_ns") + pl.col("dur_ns")).sort(*stream, "ts_ns")
    prev_end = pl.col("end_ns").shift(1).over(stream)
    g = s.with_columns(
        gap=pl.col("ts_ns") - prev_end, host=pl.col("launch_ts_ns").is_not_null() & (pl.col("launch_ts_ns") > prev_end)
    )
    g = g.filter(pl.col("gap").is_not_null())
    g = (
        with_steps(g.with_columns(_at=pl.coalesce("launch_ts_ns", "ts_ns")), intervals, "_at")
        if intervals is not None
        else g.with_columns(step=pl.lit(None, pl.String))
    )
    short = pl.col("gap") < KERNEL_WAIT_US * 1e3
    kinds = {
        "idle": pl.col("gap").is_not_null(),
        "host": pl.col("host"),
        "kernel": ~pl.col("host") & short,
        "other": ~pl.col("host") & ~short,
    }
    wide = g.group_by("trace_id", "step").agg(
        *(pl.col("gap").filter(k).sum().cast(pl.Float64).alias(f"t_{n}") for n, k in kinds.items()),
        *(k.sum().cast(pl.Int64).alias(f"n_{n}") for n, k in kinds.items()),
    )
    return pl.concat(
        [wide.select("trace_id", "step", name=pl.lit(IDLE_NAMES[n]), time_ns=f"t_{n}", count=f"n_{n}") for n in kinds]
    ).with_columns(level=pl.lit("idle"))


def _step_level(t: dict[str, pl.LazyFrame], ids: list[str], by_step: bool) -> pl.DataFrame:
    """The `step` level: each profiler step's wall time, compute, communication and exposed
    communication (the latter summed over the trace's devices)."""
    if "steps" not in t:
        return empty_totals()
    per = (
        t["steps"]
        .filter(pl.col("trace_id").is_in(ids))
        .group_by("trace_id", "step")
        .agg(
            step_ns=(pl.col("step_end_ns") - pl.col("step_ts_ns")).first(),
            compute_ns=pl.col("compute_ns").sum(),
            comm_ns=pl.col("comm_ns").sum(),
            exposed_ns=pl.col("exposed_comm_ns").sum(),
            gpu=pl.col("compute_ns").is_not_null().any(),
        )
        .collect()
    )
    per = per.with_columns(pl.when(pl.col("gpu")).then(pl.col(c)).alias(c) for c in ("compute_ns", "exposed_ns"))
    if not by_step:
        per = per.with_columns(step=pl.lit(None, pl.String))
    frames = [
        per.filter(pl.col(col).is_not_null())
        .group_by("trace_id", "step")
        .agg(time_ns=pl.col(col).sum().cast(pl.Float64), count=pl.len().cast(pl.Int64))
        .with_columns(name=pl.lit(name), level=pl.lit("step"))
        for col, name in STEP_NAMES.items()
    ]
    return pl.concat(frames)


def step_counts(ds: Path, ids: list[str]) -> pl.DataFrame:
    """(trace_id, steps): the profiler steps of each trace (0 when it has none)."""
    iv = step_intervals(ds, ids).group_by("trace_id").agg(steps=pl.len().cast(pl.Int64))
    return (
        pl.DataFrame({"trace_id": ids}).join(iv, on="trace_id", how="left").with_columns(pl.col("steps").fill_null(0))
    )


def collective_calls(run) -> pl.DataFrame:
    """(kind, bytes, latency_ns, busbw_gbps) of every collective of a run (`runs.Run`), matched
    across its ranks as `tracepipe ranks` matches them (desynchronised ones left out); latency:
    the shortest duration over the ranks (the transfer, not the wait)."""
    from pipeline.compare.measured import measured

    rows = measured(run).collectives
    return pl.DataFrame(
        {
            "kind": [r["kind"] for r in rows],
            "bytes": [r["bytes"] for r in rows],
            "latency_ns": [r["latency_ns"] for r in rows],
            "busbw_gbps": [r["busbw_gbps"] for r in rows],
        },
        schema={"kind": pl.String, "bytes": pl.Int64, "latency_ns": pl.Float64, "busbw_gbps": pl.Float64},
    )


def collective_name(kind: str, size: int | None) -> str:
    """A collective row's name: its kind and exact message size (`allreduce 8,388,608 B`)."""
    return kind if size is None else f"{kind} {size:,} B"
