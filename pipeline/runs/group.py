"""group: which traces make a run, and which rank each one is.

A run is the set of traces of one job. By default it is the directory that holds the traces (an
archive member's directory inside its archive); `run_by` overrides it: a regex searched in the
trace's path (its first group, else the whole match, names the run) or `col:NAME`, a column of
the `trace` table (`col:trace_name`, `col:base_time_ns`). A trace's rank is `trace.rank`
(distributedInfo, else its file name); a run's world size is the largest its traces record.
Ranks of a run that no trace holds are missing, reported by number, never an error; traces with
no rank, or a rank held twice, are reported and left out.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import polars as pl

from pipeline.errors import UsageError

TRACE_COLUMNS = ["trace_id", "source_path", "stem", "rank", "rank_from", "world_size", "metadata_json"]


def run_expr(run_by: str | None) -> pl.Expr:
    """The run of each trace row (of the `trace` table), by the rule above."""
    path = pl.col("source_path")
    default = path.str.replace(r"[/\\][^/\\!]*$", "")  # the directory of the trace (in its archive)
    if not run_by:
        return default
    if run_by.startswith("col:"):
        return pl.col(run_by[4:]).cast(pl.String)
    try:
        pattern = re.compile(run_by)
    except re.error as e:
        raise UsageError(f"--run-by: not a regex ({e})") from None
    group = 1 if pattern.groups else 0
    return pl.coalesce(path.str.extract(run_by, group), default)


@dataclass(frozen=True)
class Runs:
    """The traces of each run with their rank (`traces`: run, rank, trace_id, stem, rank_from),
    and per run its world size, missing ranks and the traces left out (`runs`)."""

    traces: pl.DataFrame
    runs: pl.DataFrame


def group_runs(trace: pl.LazyFrame, run_by: str | None = None) -> Runs:
    """Group the traces (rows of the `trace` table) into runs and check their ranks."""
    have = trace.collect_schema().names()
    if run_by and run_by.startswith("col:") and run_by[4:] not in have:
        raise UsageError(
            f"--run-by {run_by}: the trace table has no column {run_by[4:]!r} (columns: {', '.join(have)})"
        )
    t = (
        trace.select(*(c for c in TRACE_COLUMNS if c in have), run=run_expr(run_by).cast(pl.Categorical))
        .collect()
        .sort(pl.col("run").cast(pl.String), "rank", "source_path", nulls_last=True)
    )
    no_rank = t.filter(pl.col("rank").is_null())
    ranked = t.filter(pl.col("rank").is_not_null())
    dup = ranked.filter(pl.col("rank").is_duplicated().over("run") & (pl.int_range(pl.len()).over("run", "rank") > 0))
    kept = ranked.join(dup.select("trace_id"), on="trace_id", how="anti")
    runs = (
        t.group_by("run", maintain_order=True)
        .agg(world_size=pl.col("world_size").max(), traces=pl.len())
        .join(kept.group_by("run").agg(ranks=pl.col("rank").sort()), on="run", how="left")
        .join(no_rank.group_by("run").agg(no_rank=pl.col("stem").sort()), on="run", how="left")
        .join(dup.group_by("run").agg(duplicate=pl.col("stem").sort()), on="run", how="left")
    )
    runs = runs.with_columns(
        ranks=pl.col("ranks").fill_null(pl.lit([], pl.List(pl.Int64))),
        world_size=pl.coalesce("world_size", pl.col("ranks").list.max() + 1),
    )
    missing = [sorted(set(range(w or 0)) - set(r)) for w, r in runs.select("world_size", "ranks").iter_rows()]
    runs = runs.with_columns(missing_ranks=pl.Series(missing, dtype=pl.List(pl.Int64)))
    return Runs(kept.select("run", "rank", "trace_id", "stem", "rank_from", "metadata_json"), runs)


def is_trace_folder(path: Path) -> bool:
    """A folder (or archive) of trace files to batch, rather than tables to read."""
    from pipeline.dataset.tables import flat_dirs
    from pipeline.store import is_flat_dir

    if path.is_file():
        return True
    return (
        path.is_dir()
        and not is_flat_dir(path)
        and not flat_dirs(path)
        and not any((path / t).is_dir() for t in ("traces", "trace"))
    )
