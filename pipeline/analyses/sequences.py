"""sequences: the runs of N consecutive kernels that repeat most (fusion candidates).

Per stream, its kernels in start order (memcpy and memset skipped); every run of `seq_len` (N,
default 3) consecutive kernels is an occurrence, overlapping ones counted (A B C D holds A B C and
B C D); occurrences are counted over all streams of a device. Per sequence: count, the summed
time of its kernels over all occurrences, the mean gap between its consecutive kernels, and the
CPU op that launched its first kernel most often. Most frequent first.

A device whose streams all hold fewer than N kernels (but one holds two or more) shows the runs of
its longest stream's length instead: its rows' `kernels` lists say which length that is.
"""

from __future__ import annotations

import polars as pl

from pipeline.analyses.flat import Flat, as_flat
from pipeline.analyses.gpu_order import STREAM, StreamCarry, activity_windows
from pipeline.analyses.sweep import fold

SEQ_LEN = 3


def _names(n: int) -> list[str]:
    return [f"k{i}" for i in range(n)]


def _occurrences(rows: pl.DataFrame, n: int) -> pl.DataFrame:
    """Per (device, kernel names...) of the window's occurrences (those ending on a new kernel):
    count, summed kernel time and inner gaps, and counts of the first kernel's op."""
    shifted = [pl.col("name").shift(n - 1 - i).over(STREAM).alias(f"k{i}") for i in range(n)]
    dur = sum((pl.col("dur_ns").shift(i).over(STREAM) for i in range(n)), pl.lit(0))
    gaps = pl.col("ts_ns") - pl.col("end_ns").shift(1).over(STREAM)  # gap before each kernel
    gap_sum = sum((gaps.shift(i).over(STREAM) for i in range(n - 1)), pl.lit(0))
    op = pl.col("cpu_op_name").shift(n - 1).over(STREAM)
    occ = rows.with_columns(*shifted, dur=dur, gap=gap_sum, op=op).filter(
        ~pl.col("carried") & pl.all_horizontal(pl.col(_names(n)).is_not_null())
    )
    keys = ["device", *_names(n)]
    return occ.group_by(*keys, "op").agg(
        count=pl.len().cast(pl.Int64), dur_ns=pl.col("dur").sum(), gap_ns=pl.col("gap").sum()
    )


EMPTY = pl.Schema(
    {
        "device": pl.Int64(),
        "kernels": pl.List(pl.String()),
        "count": pl.Int64(),
        "dur_us": pl.Float64(),
        "mean_gap_us": pl.Float64(),
        "launched_by": pl.String(),
    }
)


def sequences(flat, seq_len: int = SEQ_LEN) -> pl.DataFrame:
    """(device, kernels, count, dur_us, mean_gap_us, launched_by): every sequence of `seq_len`
    kernels with its occurrences, most frequent first (ties: more time, then names); devices too
    short for `seq_len` with their longest runs (see the module docstring)."""
    f: Flat = as_flat(flat)
    n = max(2, seq_len)
    first, lengths = _of_length(f, n)
    found = [first]
    longest = lengths.group_by("device").agg(pl.col("kernels").max())  # each device's longest stream
    short = longest.filter(~pl.col("device").is_in(first["device"].implode()) & pl.col("kernels").is_between(2, n - 1))
    for (m,), devices in short.group_by("kernels"):
        found.append(_of_length(f, int(m), devices["device"].to_list())[0])
    return pl.concat(found).sort("device", "count", "dur_us", "kernels", descending=[False, True, True, False])


def _of_length(f: Flat, n: int, devices: list | None = None) -> tuple[pl.DataFrame, pl.DataFrame]:
    """The sequences of `n` kernels (of `devices` only, when given), and (device, stream, kernels):
    how many kernels each stream holds, counted in the same pass."""
    carry, total, lengths = StreamCarry(n - 1), None, None
    keys = ["device", *_names(n), "op"]
    names = pl.col("name").cast(pl.Categorical)  # long kernel names: a small id per row
    where = pl.col("kind") == "kernel"
    if devices is not None:
        where = where & pl.col("device").is_in(devices)
    for rows in activity_windows(f, [names, "dur_ns", "cpu_op_name"], where):
        lengths = fold(lengths, rows.group_by(STREAM).agg(kernels=pl.len()), STREAM, [pl.col("kernels").sum()])
        total = fold(total, _occurrences(carry.prepend(rows), n), keys, [pl.col("count", "dur_ns", "gap_ns").sum()])
    if lengths is None:
        lengths = pl.DataFrame(schema={"device": pl.Int64, "stream": pl.Int64, "kernels": pl.UInt32})
    return _summed(total, n), lengths


def _summed(total: pl.DataFrame | None, n: int) -> pl.DataFrame:
    """Per sequence of `n` kernels: its occurrences, time, mean gap and most frequent first op."""
    if total is None:
        return pl.DataFrame(schema=EMPTY)
    by_seq = ["device", *_names(n)]
    top_op = (
        total.filter(pl.col("op").is_not_null())
        .sort("count", "op", descending=[True, False])
        .group_by(by_seq, maintain_order=True)
        .agg(launched_by=pl.col("op").first())
    )
    seqs = total.group_by(by_seq).agg(pl.col("count", "dur_ns", "gap_ns").sum()).join(top_op, on=by_seq, how="left")
    return (
        seqs.with_columns(pl.col(_names(n)).cast(pl.String))
        .select(
            "device",
            kernels=pl.concat_list(_names(n)),
            count="count",
            dur_us=pl.col("dur_ns") / 1e3,
            mean_gap_us=pl.col("gap_ns") / (pl.col("count") * (n - 1)) / 1e3,
            launched_by=pl.col("launched_by").cast(pl.String),
        )
        .cast(EMPTY)
    )
