"""rollup: the sweeps' totals made into report rows: µs, sums per key, cost and roofline columns.

Times stay exact integer nanoseconds in the sweeps and become µs here, once (`us`); name sums are
added up per key in a fixed order of the rows (`rolled`), so the tables do not change from run to run.
"""

from __future__ import annotations

import polars as pl

from pipeline.analyses.activity import NAME_KEYS, NAME_SUM_FOLD
from pipeline.cost import roofline

NS_PER_US = 1_000.0


def us(col: str | pl.Expr) -> pl.Expr:
    return (pl.col(col) if isinstance(col, str) else col) / NS_PER_US


def rolled(names: pl.DataFrame, keys: list[str]) -> pl.DataFrame:
    """Name sums (`Activity.names`) added up per keys, in a fixed order of the rows."""
    return names.sort(NAME_KEYS, nulls_last=True).group_by(keys, maintain_order=True).agg(NAME_SUM_FOLD)


def most_common(names: pl.DataFrame, keys: list[str], col: str) -> pl.DataFrame:
    """(keys..., col): the col most rows per keys have (ties: the first by name), null if none has one."""
    counted = names.filter(pl.col(col).is_not_null()).group_by(*keys, col).agg(pl.col("n").sum())
    return (
        counted.sort(*keys, "n", col, descending=[False] * len(keys) + [True, False], nulls_last=True)
        .group_by(keys, maintain_order=True)
        .agg(pl.col(col).first())
    )


def cost_columns() -> list[pl.Expr]:
    """FLOPs, bytes and achieved rates of rolled-up name sums: sums (null when none is known); rates
    over the time of the ops whose cost is known; % of peak duration-weighted (total FLOPs over total time)."""

    def over_known(value: str, time: str) -> pl.Expr:
        return pl.when(pl.col(time) > 0).then(pl.col(value) / pl.col(time))

    return [
        pl.when(pl.col("flops_n") > 0).then("flops").alias("flops"),
        pl.when(pl.col("bytes_n") > 0).then("bytes").alias("bytes"),
        (over_known("flops", "flops_dur_ns") / 1e3).alias("achieved_tflops"),
        over_known("bytes", "bytes_dur_ns").alias("achieved_gbps"),
        over_known("fpct_w", "fpct_dur_ns").alias("achieved_flops_pct"),
        over_known("bpct_w", "bpct_dur_ns").alias("achieved_bw_pct"),
        pl.col("peak_tflops").alias("_peak_tflops"),
        pl.col("peak_bw_gbps").alias("_peak_bw"),
    ]


def with_roofline(df: pl.DataFrame) -> pl.DataFrame:
    """arithmetic_intensity and roofline_bound of aggregated rows (`roofline.bound`: cache when their
    bytes moved faster than DRAM can, on average over their launches)."""
    return (
        df.with_columns(arithmetic_intensity=roofline.intensity(pl.col("flops"), pl.col("bytes")))
        .with_columns(
            roofline_bound=roofline.bound(
                pl.col("arithmetic_intensity"), pl.col("_peak_tflops"), pl.col("_peak_bw"), pl.col("achieved_gbps")
            )
        )
        .drop("_peak_tflops", "_peak_bw")
    )
