"""listing: what a dataset (or a folder of flattened traces) holds, one row per trace: its id, name,
run (as `ranks` and `compare` name runs), rank, devices, size, row counts and the problems its
flatten counted; and the inputs a batch could not read (quarantined, failed), with their reason."""

from __future__ import annotations

from pathlib import Path

import polars as pl

from pipeline.dataset.layout import KEY, MANIFEST
from pipeline.dataset.tables import tables

__all__ = ["trace_list", "not_read"]

COLUMNS = (  # of the trace table, after trace_runs' (trace_id, stem, run, rank, world_size, truncated)
    "trace_name",
    "layout",
    "source_bytes",
    "n_events",
    "n_gpu_ops",
    "n_kernels",
    "problems_json",
)


def trace_list(
    path: str | Path,
    name: str | None = None,
    run: str | None = None,
    rank: int | None = None,
    device: str | None = None,
) -> pl.DataFrame:
    """Every trace of `path`, in run and rank order, filtered: `name` a part of its trace_id, stem or
    source path; `run` a part of its run's name; `rank` its rank; `device` a part (any case) of a
    device's name as the trace gives it or as the device table matched it."""
    from pipeline.compare.runs import trace_runs

    path = Path(path)
    found = tables(path, ["trace", "devices"])
    runs = trace_runs(path)
    have = found["trace"].collect_schema().names()
    extra = found["trace"].select(KEY, *(c for c in COLUMNS if c in have)).collect()
    dev = found.get(
        "devices", pl.LazyFrame(schema={KEY: pl.String, "device": pl.Int64, "name": pl.String, "spec_name": pl.String})
    )
    devices = (
        dev.select(KEY, "device", "name", "spec_name")
        .sort(KEY, "device")
        .group_by(KEY, maintain_order=True)
        .agg(
            devices=pl.concat_str(
                pl.col("name"), pl.lit(" ["), pl.col("spec_name"), pl.lit("]"), ignore_nulls=True
            ).unique(maintain_order=True)
        )
        .collect()
    )
    rows = runs.select(KEY, "stem", "run", "rank", "world_size", "source_path", "truncated")
    rows = rows.join(extra, on=KEY, how="left").join(devices, on=KEY, how="left")
    rows = rows.with_columns(pl.col("devices").fill_null(pl.lit([], pl.List(pl.String))))
    if name:
        rows = rows.filter(
            pl.any_horizontal(pl.col(c).str.contains(name, literal=True) for c in (KEY, "stem", "source_path"))
        )
    if run:
        rows = rows.filter(pl.col("run").str.contains(run, literal=True))
    if rank is not None:
        rows = rows.filter(pl.col("rank") == rank)
    if device:
        wanted = device.lower()
        rows = rows.filter(
            pl.col("devices").list.eval(pl.element().str.to_lowercase().str.contains(wanted, literal=True)).list.any()
        )
    return rows


def not_read(path: str | Path) -> pl.DataFrame:
    """The inputs of a batch dataset that are not in it (status quarantined or failed) or were cut
    off (truncated), with their reason; empty for a folder of flattened traces."""
    m = tables(Path(path), [MANIFEST]).get(MANIFEST)
    if m is None:
        return pl.DataFrame(schema={"path": pl.String, "status": pl.String, "error": pl.String})
    return m.filter(pl.col("status") != "ok").select("path", "status", "error").collect()
