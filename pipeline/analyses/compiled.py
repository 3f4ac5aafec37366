"""compiled: torch.compile regions, per name and per ProfilerStep (time in and outside them, likely
graph breaks), from the CPU sweep's steps and regions."""

from __future__ import annotations

import polars as pl

from pipeline.analyses.flat import Flat, as_flat
from pipeline.analyses.intervals import covered_overlap
from pipeline.analyses.rollup import us
from pipeline.analyses.sweep import interval_union


def _steps(f: Flat) -> pl.DataFrame:
    """ProfilerStep#N intervals (step, ts_ns, end_ns); the whole CPU span as step null if none."""
    ops = f.any_cpu()
    first, last, n = ops.span
    if ops.steps.height or not n:
        return ops.steps.sort("ts_ns")
    return pl.DataFrame(
        {"step": [None], "ts_ns": [first], "end_ns": [last]},
        schema={"step": pl.Int64, "ts_ns": pl.Int64, "end_ns": pl.Int64},
    )


def compiled_regions(flat) -> pl.DataFrame:
    """torch.compile regions on the CPU side (CompiledFunction, CompiledFunctionBackward,
    Torch-Compiled Region, ## Call CompiledFxGraph ...): per name, count and total time."""
    r = as_flat(flat).any_cpu().regions
    return (
        r.group_by("name")
        .agg(count=pl.len(), dur_us=us(pl.col("dur_ns").sum()))
        .sort("dur_us", "name", descending=[True, False])
    )


COMPILE_VIEW_SCHEMA = {
    "step": pl.Int64,
    "step_us": pl.Float64,
    "regions": pl.Int64,
    "compiled_us": pl.Float64,
    "outside_us": pl.Float64,
    "compiled_pct": pl.Float64,
    "breaks": pl.Int64,
    "break_us": pl.Float64,
    "largest_break_us": pl.Float64,
}


def compile_view(flat) -> pl.DataFrame:
    """Per ProfilerStep: compiled regions started in it, time covered by compiled regions (their
    union over all threads), time outside them, and the gaps between consecutive compiled runs
    inside the step (likely graph breaks: eager code between compiled graphs). Empty when the
    trace has no compiled regions."""
    f = as_flat(flat)
    regions = f.any_cpu().regions.select("ts_ns", "end_ns", k=pl.lit(0))
    steps = _steps(f).with_columns(k=pl.lit(0))
    if not regions.height or not steps.height:
        return pl.DataFrame(schema=COMPILE_VIEW_SCHEMA)
    runs = interval_union(regions, ["k"])
    covered = covered_overlap(steps.lazy(), runs, ["k"]).collect()
    starts = steps.lazy().select("step", "k", s0="ts_ns", s1="end_ns").sort("s0")
    counts = _in_steps(regions.lazy(), "ts_ns", starts).group_by("s0").agg(regions=pl.len().cast(pl.Int64))
    out = (
        covered.lazy()
        .join(_breaks(runs, starts), left_on="ts_ns", right_on="s0", how="left")
        .join(counts, left_on="ts_ns", right_on="s0", how="left")
        .sort("step", "ts_ns")  # a step number seen twice (traces put together): in time order
        .select(
            "step",
            step_us=us("end_ns") - us("ts_ns"),
            regions=pl.col("regions").fill_null(0),
            compiled_us=us("overlap_ns"),
            outside_us=(us("end_ns") - us("ts_ns")) - us("overlap_ns"),
            compiled_pct=pl.when(pl.col("end_ns") > pl.col("ts_ns")).then(
                100 * pl.col("overlap_ns") / (pl.col("end_ns") - pl.col("ts_ns"))
            ),
            breaks=pl.col("breaks").fill_null(0),
            break_us=us("break_ns").fill_null(0.0),
            largest_break_us=us("largest_ns").fill_null(0.0),
        )
    )
    return out.collect()


def _in_steps(lf: pl.LazyFrame, col: str, starts: pl.LazyFrame) -> pl.LazyFrame:
    """The rows inside a step, with the step (s0, s1) holding their `col`."""
    return (
        lf.sort(col)
        .join_asof(starts, left_on=col, right_on="s0", by="k", strategy="backward", check_sortedness=False)
        .filter(pl.col(col) <= pl.col("s1"))
    )


def _breaks(runs: pl.LazyFrame, starts: pl.LazyFrame) -> pl.LazyFrame:
    """Per step (s0): the gaps between consecutive compiled runs starting in it: count, sum, largest."""
    return (
        _in_steps(runs, "start_ns", starts)
        .sort("start_ns")
        .with_columns(gap_ns=(pl.col("start_ns") - pl.col("end_ns").shift(1)).over("s0"))
        .group_by("s0")
        .agg(
            breaks=pl.col("gap_ns").is_not_null().sum().cast(pl.Int64),
            break_ns=pl.col("gap_ns").sum(),
            largest_ns=pl.col("gap_ns").max(),
        )
    )
