"""kernels: per device and kernel (or memcpy / memset) name: count, time, share, cost, roofline, top op.

Both tables are made by `name_table` from the GPU sweep's name sums (`Flat.activity.names`); for a
trace without GPU activity those are its CPU ops (device -1).
"""

from __future__ import annotations

import polars as pl

from pipeline.analyses.flat import as_flat
from pipeline.analyses.rollup import cost_columns, most_common, rolled, us, with_roofline


def name_table(names: pl.DataFrame, keys: list[str]) -> pl.DataFrame:
    """Per keys: count, time, share of the device's time, cost, top CPU op, category; by device, then
    time (ties by name)."""
    t = (
        rolled(names, keys)
        .join(most_common(names, keys, "category"), on=keys, how="left", nulls_equal=True, maintain_order="left")
        .join(most_common(names, keys, "cpu_op_name"), on=keys, how="left", nulls_equal=True, maintain_order="left")
        .join(most_common(names, keys, "math_mode"), on=keys, how="left", nulls_equal=True, maintain_order="left")
    )
    dur_us = us("dur_ns")
    out = t.select(
        *keys,
        "category",
        pl.col("n").cast(pl.UInt32).alias("count"),
        dur_us.alias("dur_us"),
        (100 * dur_us / us(pl.col("dur_ns").sum().over("device"))).alias("pct"),
        *cost_columns(),
        (dur_us / pl.col("n")).alias("mean_us"),
        us("min_ns").alias("min_us"),
        us("max_ns").alias("max_us"),
        pl.col("cpu_op_name").alias("cpu_op"),
        "math_mode",
    )
    rest = [k for k in keys if k != "device"]
    return with_roofline(out).sort("device", "dur_us", *rest, descending=[False, True, *[False] * len(rest)])


def kernel_table(flat, kinds: tuple[str, ...] = ("kernel",)) -> pl.DataFrame:
    """Per device, per kernel name: count (every launch), dur_us, mean/min/max, pct of the device's
    kernel time, flops, bytes, achieved TFLOP/s and GB/s, achieved % of peak (of the FLOP peak of
    its math mode; of DRAM bandwidth), arithmetic intensity, roofline bound (cache: above the DRAM
    roof), category, most common launching op and math mode. CPU-only traces: per CPU op."""
    names = as_flat(flat).activity.names
    return name_table(names.filter(pl.col("kind").is_in([*kinds, "cpu_op"])), ["device", "name"])


def transfer_table(flat) -> pl.DataFrame:
    """kernel_table of memcpy / memset activity, and of the tasks by which a device stream waits for
    or records an event (kind `sync`, Ascend), with its kind."""
    names = as_flat(flat).activity.names
    return name_table(names.filter(pl.col("kind").is_in(["memcpy", "memset", "sync"])), ["device", "kind", "name"])
