"""intervals: interval algebra beside the sweep's unions: how much of intervals a union covers, nesting."""

from __future__ import annotations

import polars as pl

from pipeline.link import nesting as link_nesting


def covered_overlap(iv: pl.LazyFrame, union: pl.LazyFrame, by: list[str], lo="ts_ns", hi="end_ns") -> pl.LazyFrame:
    """iv with `overlap_ns`: how much of each [lo, hi] the union's runs (by..., start_ns, end_ns) cover."""
    length = pl.col("end_ns") - pl.col("start_ns")
    runs = union.sort("start_ns").select(*by, r0="start_ns", r1="end_ns", before=length.cum_sum().over(by) - length)

    def covered_until(lf: pl.LazyFrame, col: str) -> pl.LazyFrame:  # covered length of (-inf, lf[col]]
        inside = (pl.min_horizontal(pl.col(col), pl.col("r1")) - pl.col("r0")).clip(0)
        return (
            lf.sort(col)
            .join_asof(runs, left_on=col, right_on="r0", by=by, strategy="backward", check_sortedness=False)
            .with_columns((pl.col("before") + inside).fill_null(0).alias(f"_cov_{col}"))
            .drop("r0", "r1", "before")
        )

    out = covered_until(covered_until(iv.with_row_index("_row"), lo), hi)
    return (
        out.with_columns(overlap_ns=pl.col(f"_cov_{hi}") - pl.col(f"_cov_{lo}"))
        .sort("_row")
        .drop("_row", f"_cov_{lo}", f"_cov_{hi}")
    )


def nesting(iv: pl.LazyFrame | pl.DataFrame) -> pl.LazyFrame:
    """(iv_idx, depth, parent_idx) of intervals (iv_idx, pid, tid, ts_ns, end_ns) nested per thread.

    Order at one instant: ends, then starts (longer first, then file order: identical
    intervals nest in file order), then the ends of zero-length intervals (see `pipeline.link.nesting`).
    """
    return link_nesting.nesting(iv, link_nesting.LONGER_FIRST).lazy()
