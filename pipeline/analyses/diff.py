"""diff: two traces side by side, rows matched by normalised CPU op (`names`), else by kernel or copy name."""

from __future__ import annotations

import polars as pl

from pipeline.analyses.flat import as_flat
from pipeline.analyses.names import normalize_kernel, normalize_op
from pipeline.analyses.rollup import NS_PER_US, cost_columns, rolled, us, with_roofline


def diff_side(flat) -> pl.DataFrame:
    """One trace's rows for `diff`, keyed by normalised CPU op (kernels launched by an op),
    normalised kernel name (kernels without an op), or copy/memset name; all devices together."""
    f = as_flat(flat)
    by_op = pl.col("cpu_op_name").is_not_null() & pl.col("kind").is_in(["kernel", "cpu_op"])
    names = f.activity.names.with_columns(
        key=pl.when(by_op).then(normalize_op(pl.col("cpu_op_name"))).otherwise(normalize_kernel(pl.col("name"))),
        key_kind=pl.when(by_op).then(pl.lit("op")).otherwise(pl.col("kind")),
    )
    keys = ["key", "key_kind"]
    calls = (
        f.op_calls.with_columns(key=normalize_op(pl.col("cpu_op_name")), key_kind=pl.lit("op"))
        .group_by(keys)
        .agg(pl.col("calls").sum())
    )
    top = (
        names.group_by(*keys, "name")
        .agg(n=pl.col("n").sum(), d=pl.col("dur_ns").sum())
        .sort("d", "name", descending=[True, False])
        .group_by(keys, maintain_order=True)
        .agg(
            top_kernels=pl.struct(name="name", count=pl.col("n").cast(pl.UInt32), dur_us=pl.col("d") / NS_PER_US).head(
                3
            )
        )
    )
    spread = names.group_by(keys).agg(
        kernel_names=pl.col("name").n_unique().cast(pl.Int64), devices=pl.col("device").unique().sort()
    )
    rows = (
        rolled(names, keys)
        .join(spread, on=keys, how="left", maintain_order="left")
        .join(calls, on=keys, how="left", maintain_order="left")
    )
    out = rows.select(
        *keys,
        *cost_columns(),
        count=pl.col("n").cast(pl.UInt32),
        calls=pl.col("calls").fill_null(0),
        dur_us=us("dur_ns"),
        kernel_names="kernel_names",
        devices="devices",
    )
    return with_roofline(out).join(top, on=keys, how="left", maintain_order="left")


SIDE_COLS = (
    "count",
    "calls",
    "dur_us",
    "flops",
    "bytes",
    "achieved_tflops",
    "achieved_gbps",
    "achieved_flops_pct",
    "achieved_bw_pct",
    "arithmetic_intensity",
    "roofline_bound",
    "kernel_names",
    "devices",
    "top_kernels",
)


def diff(a, b) -> pl.DataFrame:
    """Two traces side by side: one row per key (see `diff_side`), a_* and b_* columns (null when
    a side has no such row), delta_us = b - a, ratio = b / a; sorted by the larger time."""
    sa, sb = (diff_side(x).rename({c: f"{p}_{c}" for c in SIDE_COLS}) for x, p in ((a, "a"), (b, "b")))
    j = sa.join(sb, on=["key", "key_kind"], how="full", coalesce=True)
    return (
        j.rename({"key_kind": "kind"})
        .with_columns(
            delta_us=pl.col("b_dur_us").fill_null(0) - pl.col("a_dur_us").fill_null(0),
            ratio=pl.when(pl.col("a_dur_us") > 0).then(pl.col("b_dur_us") / pl.col("a_dur_us")),
        )
        .sort(
            pl.max_horizontal(pl.col("a_dur_us").fill_null(0), pl.col("b_dur_us").fill_null(0)),
            "key",
            "kind",
            descending=[True, False, False],
        )
    )


MATCHED_WARN_PCT = 50.0  # under this share of the time matched, A and B ran different work


def diff_summary(d: pl.DataFrame) -> dict:
    """What a diff compared: each side's total time (GPU time; CPU time for CPU-only traces), the
    share of it in rows both sides have (`matched_pct`: of A's and B's time together; per side too),
    and how many rows are on both sides or only on one. Under MATCHED_WARN_PCT matched, A and B
    most likely ran different workloads and their rows say little about each other."""
    both = pl.col("a_count").is_not_null() & pl.col("b_count").is_not_null()
    total = lambda side, cond=pl.lit(True): pl.col(f"{side}_dur_us").filter(cond).fill_null(0).sum()
    t = d.select(
        a=total("a"), b=total("b"), ma=total("a", both), mb=total("b", both), rows=pl.len(), matched=both.sum()
    ).row(0, named=True)
    pct = lambda part, whole: round(100 * part / whole, 1) if whole else None
    return {
        "total_a_us": round(t["a"], 3),
        "total_b_us": round(t["b"], 3),
        "delta_us": round(t["b"] - t["a"], 3),
        "matched_pct": pct(t["ma"] + t["mb"], t["a"] + t["b"]),
        "matched_a_pct": pct(t["ma"], t["a"]),
        "matched_b_pct": pct(t["mb"], t["b"]),
        "rows_matched": int(t["matched"] or 0),
        "rows_only_a": int(d["b_count"].is_null().sum()),
        "rows_only_b": int(d["a_count"].is_null().sum()),
    }


def different_work(summary: dict) -> str | None:
    """One line when under MATCHED_WARN_PCT of the time matched (different workloads?), else None."""
    pct = summary["matched_pct"]
    if pct is None or pct >= MATCHED_WARN_PCT:
        return None
    return (
        f"only {pct:g}% of the time matched between A and B ({summary['rows_matched']} rows on both sides, "
        f"{summary['rows_only_a']} only in A, {summary['rows_only_b']} only in B): different workloads? "
        "their rows compare little"
    )
