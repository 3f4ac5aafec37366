"""activity: the GPU sweep, a trace's GPU ops folded window by window into the totals of the device tables.

`gpu_sweep` reads gpu_ops in windows of time (`sweep`); `ActivityTally` folds each window into an
`Activity`: sums per (device, kind, name, category, op), unions of activity per device, per stream and
of collective / compute kernels, value counts of launch durations and delays, device specs and peaks.
A trace without GPU ops gets the same totals from its CPU ops (`cpu.cpu_sweep`).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import polars as pl

from pipeline import schema
from pipeline.analyses import sweep
from pipeline.analyses.sweep import (
    RunTally,
    first_by,
    float_sum,
    fold,
    quantiles_from_counts,
    read,
    time_windows,
    within,
)
from pipeline.cost.categories import CategoryMemo, with_category

if TYPE_CHECKING:
    from pipeline.analyses.flat import Flat

CPU_DEVICE = -1  # the device of a CPU-only trace's activity: its CPU ops
POLARS_TYPES = {"int64": pl.Int64, "float64": pl.Float64, "string": pl.String, "dict": pl.String, "bool": pl.Boolean}


@dataclass(frozen=True)
class Activity:
    """The totals of a trace's device activity (GPU ops; for a CPU-only trace its CPU ops) that the
    device tables are made of. Every table is small: one row per name, key or device."""

    names: pl.DataFrame  # per NAME_KEYS: the sums of `_name_sums`
    runs: dict[str, pl.DataFrame]  # unions (`RunTally.result`) of the RUN_SETS: device, stream, kernel, comm, compute
    launch: pl.DataFrame  # per device: kernels, the launch durations' and delays' percentiles (ns)
    specs: pl.DataFrame  # (device, spec_name): the first matched device spec of its activity
    peaks: pl.DataFrame  # (device, peak_tflops, peak_bw_gbps) of its kernels, for the roofline plot


NAME_KEYS = ["device", "kind", "name", "category", "cpu_op_name", "math_mode"]  # what the name sums are kept per
GPU_COLUMNS = [
    "event_idx",
    "kind",
    "name",
    "device",
    "stream",
    "ts_ns",
    "dur_ns",
    "cpu_op_name",
    "math_mode",
    "flops",
    "bytes",
    "achieved_flops_pct",
    "achieved_bw_pct",
    "peak_tflops",
    "peak_bw_gbps",
    "spec_name",
    "launch_ts_ns",
    "launch_dur_ns",
    "graph_id",
]
KERNEL = pl.col("kind") == "kernel"
WORK = pl.col("kind") != "sync"  # a stream waiting for an event (Ascend's EVENT_WAIT tasks) is not busy
COLLECTIVE = pl.col("category") == "communication"
RUN_SETS: dict[str, tuple[list[str], pl.Expr]] = {  # unions of activity: (key columns, which rows)
    "device": (["device"], WORK),
    "stream": (["device", "stream"], WORK),
    "kernel": (["device"], KERNEL),  # kernels only (busy's kernel_busy_pct; communication)
    # for `communication`, on the devices with collective kernels only
    "comm": (["device"], KERNEL & COLLECTIVE),
    "compute": (["device"], KERNEL & ~COLLECTIVE),
}
COLLECTIVE_SETS = ("comm", "compute")
LAUNCH_QUANTILES = (0.5, 0.9, 0.99)


def gpu_columns(path: Path, columns: list[str], categorical: bool = False) -> list[pl.Expr]:
    """The gpu_ops columns to read: null (of the declared type) where the file has none (not costed);
    with `categorical`, the repeated strings (names: a kernel name can be a kilobyte long) as
    categoricals, a small id per row."""
    have = set(pl.scan_parquet(path).collect_schema().names())
    declared = schema.table("gpu_ops")

    def column(c: str) -> pl.Expr:
        kind = declared.column(c).type
        out = pl.col(c) if c in have else pl.lit(None, POLARS_TYPES[kind])
        return (out.cast(pl.Categorical) if categorical and kind == "dict" else out).alias(c)

    return [column(c) for c in columns]


def activity_rows(g: pl.DataFrame, memo: CategoryMemo) -> pl.DataFrame:
    """GPU ops as the reports count them: in file order, a missing duration 0 and a missing device
    -1 (not lost), with end_ns and category."""
    g = g if g["event_idx"].is_sorted() else g.sort("event_idx")
    g = g.with_columns(pl.col("dur_ns").fill_null(0), pl.col("device").fill_null(CPU_DEVICE))
    return with_category(g.with_columns(end_ns=pl.col("ts_ns") + pl.col("dur_ns")), memo=memo)


def _name_sums(rows: pl.DataFrame) -> pl.DataFrame:
    """One window's sums per NAME_KEYS of activity rows (in file order): count, time, FLOPs and
    bytes with the time of the rows where they are known, duration-weighted achieved %, and the
    first known peaks (with the event_idx they come from)."""
    dur = pl.col("dur_ns")

    def known_time(col: str) -> pl.Expr:
        return dur.filter(pl.col(col).is_not_null()).sum()

    return rows.group_by(NAME_KEYS, maintain_order=True).agg(
        n=pl.len().cast(pl.Int64),
        dur_ns=dur.sum(),
        min_ns=dur.min(),
        max_ns=dur.max(),
        flops=float_sum("flops"),
        flops_n=pl.col("flops").count().cast(pl.Int64),
        flops_dur_ns=known_time("flops"),
        bytes=float_sum("bytes"),
        bytes_n=pl.col("bytes").count().cast(pl.Int64),
        bytes_dur_ns=known_time("bytes"),
        fpct_w=float_sum(pl.col("achieved_flops_pct") * dur),
        fpct_dur_ns=known_time("achieved_flops_pct"),
        bpct_w=float_sum(pl.col("achieved_bw_pct") * dur),
        bpct_dur_ns=known_time("achieved_bw_pct"),
        peak_tflops_at=pl.col("event_idx").filter(pl.col("peak_tflops").is_not_null()).first(),
        peak_tflops=pl.col("peak_tflops").drop_nulls().first(),
        peak_bw_at=pl.col("event_idx").filter(pl.col("peak_bw_gbps").is_not_null()).first(),
        peak_bw_gbps=pl.col("peak_bw_gbps").drop_nulls().first(),
    )


NAME_SUM_FOLD = [  # how name sums combine (two windows, or the rows of a coarser key)
    *(
        pl.col(c).sum()
        for c in ("n", "dur_ns", "flops_n", "flops_dur_ns", "bytes_n", "bytes_dur_ns", "fpct_dur_ns", "bpct_dur_ns")
    ),
    pl.col("min_ns").min(),
    pl.col("max_ns").max(),
    *(float_sum(c).alias(c) for c in ("flops", "bytes", "fpct_w", "bpct_w")),
    pl.col("peak_tflops_at").min(),
    first_by("peak_tflops", "peak_tflops_at"),
    pl.col("peak_bw_at").min(),
    first_by("peak_bw_gbps", "peak_bw_at"),
]


class ActivityTally:
    """Folds windows of activity rows (`activity_rows`, or CPU ops standing for them) into `Activity`."""

    def __init__(self, collective_devices: pl.Series | None = None):
        self.names: pl.DataFrame | None = None
        self.runs = {name: RunTally(by) for name, (by, _) in RUN_SETS.items()}
        self.collective_devices = collective_devices  # the devices with collective kernels
        # value counts of launch durations and delays, and per device: launch totals, first spec, peaks
        self.durations: pl.DataFrame | None = None
        self.delays: pl.DataFrame | None = None
        self.launches: pl.DataFrame | None = None
        self.specs: pl.DataFrame | None = None
        self.peak_counts: pl.DataFrame | None = None
        self.peak_bw: pl.DataFrame | None = None

    def add_names(self, rows: pl.DataFrame):
        self.names = fold(self.names, _name_sums(rows), NAME_KEYS, NAME_SUM_FOLD)

    def add_intervals(self, rows: pl.DataFrame):
        """Rows starting in this window (device, stream, kind, category, ts_ns, end_ns)."""
        with_collectives = (
            pl.lit(False)
            if self.collective_devices is None
            else pl.col("device").is_in(self.collective_devices.implode())
        )
        for name, (by, which) in RUN_SETS.items():
            which = which & with_collectives if name in COLLECTIVE_SETS else which
            self.runs[name].add(rows.filter(which).select(*by, "ts_ns", "end_ns"))

    def add_gpu(self, g: pl.DataFrame):
        """One window of GPU ops (`activity_rows`)."""
        self.add_names(g)
        self.add_intervals(g)
        self._add_launches(g)
        first_spec = (
            g.filter(pl.col("spec_name").is_not_null())
            .group_by("device", maintain_order=True)
            .agg(spec_at=pl.col("event_idx").first(), spec_name=pl.col("spec_name").first())
        )
        self.specs = fold(
            self.specs, first_spec, ["device"], [pl.col("spec_at").min(), first_by("spec_name", "spec_at")]
        )
        self._add_peaks(g.filter(KERNEL))

    def _add_launches(self, g: pl.DataFrame):
        """Value counts of kernels' launch durations and launch-to-start delays (exact percentiles),
        of eager launches: a graph launch starts many kernels (`graphs.graph_launches`)."""
        k = g.filter(KERNEL & pl.col("launch_ts_ns").is_not_null() & pl.col("graph_id").is_null()).select(
            "device", "dur_ns", launch_ns="launch_dur_ns", delay_ns=pl.col("ts_ns") - pl.col("launch_ts_ns")
        )
        count = lambda col: k.group_by("device", col).agg(n=pl.len().cast(pl.Int64))
        self.durations = fold(self.durations, count("launch_ns"), ["device", "launch_ns"], [pl.col("n").sum()])
        self.delays = fold(self.delays, count("delay_ns"), ["device", "delay_ns"], [pl.col("n").sum()])
        shorter = pl.col("dur_ns") < pl.col("launch_ns")
        per_device = k.group_by("device").agg(
            kernels=pl.len().cast(pl.Int64),
            compared=shorter.count().cast(pl.Int64),
            shorter=shorter.sum().cast(pl.Int64),
            launch_max_ns=pl.col("launch_ns").max(),
            delay_max_ns=pl.col("delay_ns").max(),
        )
        self.launches = fold(
            self.launches,
            per_device,
            ["device"],
            [pl.col("kernels", "compared", "shorter").sum(), pl.col("launch_max_ns", "delay_max_ns").max()],
        )

    def _add_peaks(self, k: pl.DataFrame):
        """The kernels' peak FLOP/s (counted: the plot takes the most used) and first bandwidth."""
        counts = k.filter(pl.col("peak_tflops").is_not_null()).group_by("device", "peak_tflops").agg(n=pl.len())
        self.peak_counts = fold(self.peak_counts, counts, ["device", "peak_tflops"], [pl.col("n").sum()])
        bw = k.group_by("device", maintain_order=True).agg(
            bw_at=pl.col("event_idx").filter(pl.col("peak_bw_gbps").is_not_null()).first(),
            peak_bw_gbps=pl.col("peak_bw_gbps").drop_nulls().first(),
        )
        self.peak_bw = fold(self.peak_bw, bw, ["device"], [pl.col("bw_at").min(), first_by("peak_bw_gbps", "bw_at")])

    def result(self) -> Activity:
        names = _as_strings(self.names if self.names is not None else _name_sums(empty_activity()))
        runs = {name: t.result({c: pl.Int64 for c in RUN_SETS[name][0]}) for name, t in self.runs.items()}
        specs = (
            _as_strings(self.specs.select("device", "spec_name"))
            if self.specs is not None
            else pl.DataFrame(schema={"device": pl.Int64, "spec_name": pl.String})
        )
        return Activity(names=names, runs=runs, launch=self._launch_table(), specs=specs, peaks=self._peak_table())

    def _launch_table(self) -> pl.DataFrame:
        """Per device: kernels, compared, shorter, launch_max_ns, delay_max_ns, launch_q<i>, delay_q<i> (ns)."""
        if self.launches is None or self.durations is None or self.delays is None:  # all set together
            return pl.DataFrame(
                schema={
                    "device": pl.Int64,
                    "kernels": pl.Int64,
                    "compared": pl.Int64,
                    "shorter": pl.Int64,
                    "launch_max_ns": pl.Int64,
                    "delay_max_ns": pl.Int64,
                    **{f"{m}_q{i}": pl.Int64 for m in ("launch", "delay") for i in range(len(LAUNCH_QUANTILES))},
                }
            )
        out = self.launches
        for metric, counts in (("launch", self.durations), ("delay", self.delays)):
            q = quantiles_from_counts(counts, ["device"], f"{metric}_ns", LAUNCH_QUANTILES)
            out = out.join(
                q.rename({f"q{i}": f"{metric}_q{i}" for i in range(len(LAUNCH_QUANTILES))}),
                on="device",
                how="left",
                maintain_order="left",
            )
        return out

    def _peak_table(self) -> pl.DataFrame:
        """(device, peak_tflops, peak_bw_gbps): the most used peak (ties: the lower) and the first bandwidth."""
        if self.peak_bw is None or self.peak_counts is None:  # both set together
            return pl.DataFrame(schema={"device": pl.Int64, "peak_tflops": pl.Float64, "peak_bw_gbps": pl.Float64})
        most = (
            self.peak_counts.sort("device", "n", "peak_tflops", descending=[False, True, False])
            .group_by("device", maintain_order=True)
            .agg(pl.col("peak_tflops").first())
        )
        return self.peak_bw.join(most, on="device", how="left").select("device", "peak_tflops", "peak_bw_gbps")


def _as_strings(frame: pl.DataFrame) -> pl.DataFrame:
    """Categorical columns as strings (the totals' few rows, for sorting by name and output)."""
    return frame.with_columns(pl.col(pl.Categorical).cast(pl.String))


def empty_activity() -> pl.DataFrame:
    types = {c.name: POLARS_TYPES[c.type] for c in schema.table("gpu_ops").columns if c.name in GPU_COLUMNS}
    return pl.DataFrame(schema={**types, "category": pl.String, "end_ns": pl.Int64})


def gpu_sweep(f: Flat) -> Activity:
    """The totals of a trace's GPU ops, read window by window in time (only the columns they use).
    Their few distinct (device, kind, name, op) are categorised first (a streaming read): the
    windows then only look categories up, and only devices with collectives get their unions."""
    path = f.gpu_ops_file
    columns = gpu_columns(path, GPU_COLUMNS, categorical=True)
    memo = CategoryMemo()
    named = (c for c in columns if c.meta.output_name() in ("kind", "name", "cpu_op_name"))
    keys = (
        pl.scan_parquet(path)
        .select(*named, pl.col("device").fill_null(CPU_DEVICE))
        .unique()
        .collect(engine="streaming")
    )
    keys = with_category(keys, memo=memo)
    tally = ActivityTally(keys.filter(KERNEL & COLLECTIVE)["device"].unique())
    for window in time_windows(path, pl.lit(True), max(1, sweep.PER_WINDOW // 2)):  # beside the CPU sweep's
        tally.add_gpu(activity_rows(read(path, within(window) & f.time_filter(), columns), memo))
    return tally.result()
