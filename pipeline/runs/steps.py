"""steps: one row per `ProfilerStep#N` (and device) of one trace: what a run's per-rank step
table is made of, so that whole runs never read their ranks' GPU activity again.

A kernel belongs to the step whose interval holds its start. Per step and device: the time covered
by kernels (their union), by compute kernels (every kernel but communication), by communication
kernels (category `communication`), and the exposed communication: communication time not
overlapped by compute on that device, |comm ∪ compute| - |compute|. A CPU-only trace has one row
per step (device null) with the time covered by its collectives' work (gloo).
"""

from __future__ import annotations

from pathlib import Path

import polars as pl

from pipeline.runs.collectives import profiler_steps, with_steps

IS_COMM = pl.col("category") == "communication"


def union_ns(
    frame: pl.LazyFrame | pl.DataFrame, by: list[str], start: str = "ts_ns", end: str = "end_ns"
) -> pl.LazyFrame:
    """(by..., covered_ns): the length of the union of the intervals per group."""
    lf = frame.lazy().sort(*by, start)
    prev_end = pl.col(end).cum_max().shift(1).over(by)
    runs = lf.with_columns(new=(pl.col(start) > prev_end).fill_null(True)).with_columns(
        run=pl.col("new").cast(pl.Int64).cum_sum().over(by)
    )
    return (
        runs.group_by(*by, "run")
        .agg(pl.col(start).min(), pl.col(end).max())
        .group_by(by)
        .agg(covered_ns=(pl.col(end) - pl.col(start)).sum())
    )


def _kernels(flat_dir: Path) -> pl.DataFrame:
    return (
        pl.scan_parquet(flat_dir / "gpu_ops.parquet")
        .filter((pl.col("kind") == "kernel") & pl.col("ts_ns").is_not_null())
        .select(
            "device",
            "ts_ns",
            end_ns=pl.col("ts_ns") + pl.col("dur_ns").fill_null(0),
            comm=pl.col("category").fill_null("") == "communication",
        )
        .collect(engine="streaming")
    )


SCHEMA = {
    "step": pl.String,
    "step_ts_ns": pl.Int64,
    "step_end_ns": pl.Int64,
    "device": pl.Int64,
    "kernel_ns": pl.Int64,
    "compute_ns": pl.Int64,
    "comm_ns": pl.Int64,
    "exposed_comm_ns": pl.Int64,
}


def steps(flat_dir: Path, collectives: pl.DataFrame) -> pl.DataFrame:
    """The `steps` table of one flattened trace (schemas/steps.toml)."""
    flat_dir = Path(flat_dir)
    intervals = profiler_steps(flat_dir)
    if not intervals.height:
        return pl.DataFrame(schema=SCHEMA)
    kernels = _kernels(flat_dir) if (flat_dir / "gpu_ops.parquet").is_file() else pl.DataFrame()
    if kernels.height:
        k = with_steps(kernels, intervals).filter(pl.col("step").is_not_null())
        by = ["step", "device"]
        cover = {
            "kernel_ns": union_ns(k, by),
            "compute_ns": union_ns(k.filter(~pl.col("comm")), by),
            "comm_ns": union_ns(k.filter(pl.col("comm")), by),
        }
        covered = k.lazy().select(by).unique()
        for name, lf in cover.items():
            covered = covered.join(lf.rename({"covered_ns": name}), on=by, how="left")
        covered = covered.with_columns(pl.col("kernel_ns", "compute_ns", "comm_ns").fill_null(0))
        rows = covered.with_columns(exposed_comm_ns=pl.col("kernel_ns") - pl.col("compute_ns")).collect()
    else:
        work = with_steps(collectives.select("ts_ns", "end_ns"), intervals).filter(pl.col("step").is_not_null())
        comm = union_ns(work.with_columns(device=pl.lit(None, pl.Int64)), ["step"]).collect()
        rows = (
            intervals.select("step")
            .join(comm.rename({"covered_ns": "comm_ns"}), on="step", how="left")
            .with_columns(
                device=pl.lit(None, pl.Int64),
                kernel_ns=pl.lit(None, pl.Int64),
                compute_ns=pl.lit(None, pl.Int64),
                comm_ns=pl.col("comm_ns").fill_null(0),
                exposed_comm_ns=pl.lit(None, pl.Int64),
            )
        )
    out = intervals.join(rows, on="step", how="left")
    return out.select(pl.col(c).cast(t) for c, t in SCHEMA.items()).sort("step_ts_ns", "device", nulls_last=True)
