"""coverage: per device, the share of kernel time that has a cost (by where it came from) and, for
the rest, each cause (`pipeline.cost.coverage.CAUSES`) with its share, its kernels, the ops (or,
without an op, the kernels) that take most of its time, and the remedy where one exists."""

from __future__ import annotations

import polars as pl

from pipeline.analyses.flat import as_flat
from pipeline.analyses.rollup import us
from pipeline.cost import coverage as causes

TOP_NAMES = 3  # names per row in `top`
COSTED = "costed:"  # a costed row's cause: costed:formula, costed:user_formula, costed:inductor
NOT_COSTED = "not_costed"  # the trace was flattened with --no-link
UNKNOWN = "unmodelled"  # a kernel without cost and without a reason (tables of another version)
_EXTRA = {NOT_COSTED: ("the trace was flattened with --no-link", "flatten it again")}

SCHEMA: dict[str, pl.DataType] = {
    "device": pl.Int64(),
    "cause": pl.String(),
    "pct": pl.Float64(),
    "kernels": pl.UInt32(),
    "dur_us": pl.Float64(),
    "top": pl.List(pl.String),
    "remedy": pl.String(),
    "why": pl.String(),
}


def _cause(columns: list[str]) -> pl.Expr:
    """Each kernel's row: `costed:<source>`, else its unmodelled_reason (tables written before
    cost_source existed: a kernel with FLOPs came from a formula)."""
    if "unmodelled_reason" not in columns:
        return pl.lit(NOT_COSTED)
    reason = pl.coalesce(pl.col("unmodelled_reason").cast(pl.String), pl.lit(UNKNOWN))
    if "cost_source" in columns:
        source = pl.col("cost_source").cast(pl.String)
    else:
        source = pl.when(pl.col("flops").is_not_null()).then(pl.lit("formula"))
    return pl.when(source.is_not_null()).then(pl.lit(COSTED) + source).otherwise(reason)


def coverage(flat) -> pl.DataFrame:
    """Per device and cause: pct of the device's kernel time, kernels, dur_us, the top names (ops
    that launched them, else kernel names), the remedy and what the cause means (`why`). Costed
    rows first, then by time."""
    f = as_flat(flat)
    if not f.has_gpu:
        return pl.DataFrame(schema=SCHEMA)
    g = pl.scan_parquet(f.gpu_ops_file)  # linked (a copy, when flattened with --no-link)
    columns = pl.scan_parquet(f.path / "gpu_ops.parquet").collect_schema().names()  # costed?
    per_name = (
        g.filter((pl.col("kind") == "kernel") & pl.col("ts_ns").is_not_null() & f.time_filter())
        .select(
            "device",
            dur=pl.col("dur_ns").fill_null(0),
            cause=_cause(columns),
            label=pl.coalesce(pl.col("cpu_op_name").cast(pl.String), pl.col("name").cast(pl.String)),
        )
        .group_by("device", "cause", "label")
        .agg(pl.col("dur").sum(), n=pl.len())
        .collect(engine="streaming")
    )
    if per_name.is_empty():
        return pl.DataFrame(schema=SCHEMA)
    rows = (
        per_name.sort("dur", "label", descending=[True, False])
        .group_by("device", "cause")
        .agg(
            kernels=pl.col("n").sum().cast(pl.UInt32),
            dur=pl.col("dur").sum(),
            top=pl.col("label").head(TOP_NAMES),
        )
    )
    remedy = {c.name: c.remedy for c in causes.CAUSES} | {k: v[1] for k, v in _EXTRA.items()}
    why = (
        {c.name: c.summary for c in causes.CAUSES}
        | {COSTED + s.name: s.summary for s in causes.SOURCES}
        | {k: v[0] for k, v in _EXTRA.items()}
    )
    costed = pl.col("cause").str.starts_with(COSTED)
    return rows.select(
        "device",
        "cause",
        pct=100 * pl.col("dur") / pl.col("dur").sum().over("device").clip(lower_bound=1),
        kernels="kernels",
        dur_us=us("dur"),
        top="top",
        remedy=pl.col("cause").replace_strict(remedy, default=None, return_dtype=pl.String),
        why=pl.col("cause").replace_strict(why, default=None, return_dtype=pl.String),
    ).sort(["device", costed, "dur_us", "cause"], descending=[False, True, True, False])
