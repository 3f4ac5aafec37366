"""problems: what is wrong with a run that a comparison must say (ranks missing, truncated
traces, files of its folder that are not traces), one line each.

This is the one place `compare` and `trend` ask for a run's problems. `tracepipe ranks` is to
report the same problems of a run (issue 28); when it exposes them, this module defers to it.
"""

from __future__ import annotations

import polars as pl

from pipeline.compare.runs import Run
from pipeline.dataset.tables import tables
from pipeline.runs.group import run_expr

SHOWN = 8  # ranks named in one line


def run_problems(run: Run, run_by: str | None = None) -> list[str]:
    """One line per problem of the run: ranks its world size names but no trace holds, truncated
    traces (their complete events were kept), inputs of its folder quarantined by `batch`."""
    t = run.traces
    out = []
    world = t["world_size"].max() if "world_size" in t.columns else None
    ranks = set(t["rank"].drop_nulls().to_list())
    if isinstance(world, int) and world > 0:
        missing = sorted(set(range(world)) - ranks)
        if missing:
            shown = ", ".join(map(str, missing[:SHOWN])) + (
                f" and {len(missing) - SHOWN} more" if len(missing) > SHOWN else ""
            )
            out.append(f"run {run.label}: {len(missing)} of {world} ranks have no trace (rank {shown})")
    if "truncated" in t.columns:
        for stem in t.filter(pl.col("truncated").fill_null(False))["stem"].to_list():
            out.append(f"run {run.label}: {stem} is truncated (its complete events are compared)")
    manifest = tables(run.dataset, ["traces"]).get("traces")
    if manifest is not None:
        bad = (
            manifest.filter(pl.col("status") == "quarantined")
            .select("path", "error", run=run_expr(run_by).cast(pl.String))
            .filter(pl.col("run") == run.name)
            .collect()
        )
        for path, error in bad.select("path", "error").iter_rows():
            out.append(f"run {run.label}: {path} was not read: {error}")
    return out
