"""report: analyses of a flattened trace, each a polars DataFrame (the CLI only formats them).

    kernel_table(flat)      per device, per kernel name: count, time, FLOPs, bytes, achieved %, category
    transfer_table(flat)    the same for memcpy / memset
    busy(flat)              per device (or stream): union of GPU activity over its span, idle gaps
    categories(flat)        time share per device of each kernel category (`CATEGORIES`)
    op_table(flat)          per CPU op like profiler key_averages().table(): calls, self/total CPU,
                            self/total device time, FLOPs; group by input shape, stack or overload
    collapsed_stacks(flat)  flame-graph lines "a;b;c value" like profiler export_stacks
    launch_overhead(flat)   launch-call duration and launch-to-start delay percentiles per device
    compile_view(flat)      per ProfilerStep: time in torch.compile regions, outside, likely breaks
    communication(flat)     NCCL/RCCL kernel time per device and its overlap with compute
    diff(a, b)              two traces side by side, matched by normalised CPU op (`OP_ALIASES`)

`flat` is a flattened-trace directory (see `pipeline.flatten`) or a `Flat` opened once and
shared between calls. Times are reported in µs (`*_us`). A trace without GPU activity is
analysed on its CPU ops instead (device -1, "cpu"): each op's *self* time stands for a kernel.

Memory does not grow with the trace: no report holds the GPU-op or CPU-op table. Two sweeps
(`pipeline.sweep`) read them window by window in time and fold every window into small totals
that all reports share:
- the GPU sweep (`Flat.activity`): counts and sums per (device, kind, name, category, op), from
  which the kernel, transfer and category tables and `diff` are made; the union of activity per
  device, per stream, and of collective, other and all kernels per device (busy time, idle gaps;
  the overlap of collectives with compute is |collectives| + |compute| - |all kernels|); value
  counts of launch durations and delays, whose percentiles are exact;
- the CPU sweep (`Flat.cpu`): CPU ops and user annotations nested per thread (parent, self time),
  with the GPU time they launched themselves and anywhere inside them (prefix sums of the launches
  on their thread), folded per op key (op table) or per stack (collapsed stacks, with
  python_function frames), and the few ProfilerSteps and compiled regions (compile view).
`analyze` makes both sweeps at once (`Flat.sweep_both`). Sums of nanoseconds stay exact integers
until they become µs, and float sums (FLOPs, bytes) are nearly exact and added in a fixed order,
so the output does not change from run to run; ties in a sort (equal times) are broken by name,
as are ties for a kernel's most common category and op.
"""
from __future__ import annotations

import math
import shutil
import tempfile
import weakref
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, replace
from functools import cached_property
from pathlib import Path
from typing import Callable, Iterator

import polars as pl

from pipeline.link import links as link

from pipeline import schema
from pipeline.cost import roofline
from pipeline.cost.devices import one_model

from pipeline import store

from pipeline.analyses import sweep
from pipeline.errors import BadTrace, DatasetError, UsageError
from pipeline.cost.categories import CATEGORIES, OTHER, Category, CategoryMemo, category_expr, with_category  # noqa: F401 (re-exported)
from pipeline.link.nesting import LONGER_FIRST, nesting as _nest
from pipeline.kineto import ACTIVITY_KINDS as GPU_KINDS, ANNOTATION_CAT, COMPILED_REGION, FRAME_CAT, OP_CAT, STEP_NAME
from pipeline.analyses.sweep import (Nest, Paths, RunTally, SliceSweep, ThreadPrefix, beside, first_by, float_sum, fold,
                    interval_union, quantiles_from_counts, read, read_among, time_windows, within)  # noqa: F401

NS_PER_US = 1_000.0
CPU_DEVICE = -1
POLARS_TYPES = {"int64": pl.Int64, "float64": pl.Float64, "string": pl.String, "dict": pl.String, "bool": pl.Boolean}
STACK_TRANSLATE = {" ": "_", ";": "_", "\t": "_", "\n": "_"}  # as torch's export_stacks


# ------------------------------------------------------------------ declarative tables

# Op names that mean the same operation across vendors and libraries, applied in order to the
# name (after an optional overload suffix `.Tensor`, `.out`, ... is dropped) as (regex, key).
OP_ALIASES: tuple[tuple[str, str], ...] = (
    (r"^aten::(?:cudnn|miopen|mkldnn|thnn|_nnpack|slow|_slow)_conv(?:olution|_dilated[23]d|2d|3d)?$", "aten::convolution"),
    (r"^aten::(?:cudnn|miopen)_depthwise_convolution$|^aten::_conv_depthwise2d$", "aten::convolution"),
    (r"^aten::(?:cudnn|miopen|mkldnn)_convolution_transpose$|^aten::slow_conv_transpose[23]d$", "aten::convolution_transpose"),
    (r"^aten::(?:cudnn|miopen|mkldnn)_convolution_backward(?:_input|_weight|_bias)?$", "aten::convolution_backward"),
    (r"^aten::(?:cudnn|miopen|native|_native)_batch_norm(?:_legit)?(?:_no_training)?$", "aten::batch_norm"),
    (r"^aten::(?:cudnn|miopen|native)_batch_norm_backward$", "aten::batch_norm_backward"),
    (r"^aten::_(?:cudnn|miopen)_rnn$", "aten::rnn"),
    (r"^aten::_(?:cudnn|miopen)_rnn_backward$", "aten::rnn_backward"),
    (r"^aten::_(?:scaled_dot_product_)?(?:flash|efficient|cudnn|fused)_attention(?:_for_cpu)?(?:_forward)?$",
     "aten::scaled_dot_product_attention"),
    (r"^aten::_(?:scaled_dot_product_)?(?:flash|efficient|cudnn|fused)_attention(?:_for_cpu)?_backward$",
     "aten::scaled_dot_product_attention_backward"),
    (r"^(?:nccl|rccl):(.+)$", "collective:$1"),
)
OVERLOAD_SUFFIX = r"^(\w[\w.]*::\w+)\.\w+$"

# Kernel names reduced to what survives across builds: template arguments, parameter lists,
# return types, hex hashes and Inductor's numeric suffixes dropped, as (regex, replacement).
KERNEL_NAME_RULES: tuple[tuple[str, str], ...] = (
    (r"\(anonymous namespace\)::", ""),
    (r"^(?:void\s+)?std::enable_if<.*?>::type\s+", ""),  # SFINAE return type (may hold `(8)>(0)`)
    *((r"<[^<>]*>", ""),) * 8,  # template arguments, innermost first (nesting up to 8 deep)
    (r"\(.*$", ""),  # parameter list, and "(Pinned -> Device)" of copies
    (r"^(?:void|\S+::type)\s+", ""),  # return type
    (r"_[0-9a-f]{16,}", ""),  # hashes (and old triton__0d1d2d... signatures)
    (r"^(triton_\w+?)_\d+$", "$1"),  # triton_poi_fused_add_0 -> triton_poi_fused_add
    (r"\s+", " "),
)


# How `op_table` may group ops besides their name.
GROUPINGS = {None: [], "input-shape": ["input_shape"], "stack": ["stack"], "overload": ["overload"]}


# ------------------------------------------------------------------ what the sweeps leave
@dataclass(frozen=True)
class Activity:
    """The totals of a trace's device activity (GPU ops; for a CPU-only trace its CPU ops) that the
    device tables are made of. Every table is small: one row per name, key or device."""

    names: pl.DataFrame  # per NAME_KEYS: the sums of `_name_sums`
    runs: dict[str, pl.DataFrame]  # unions (`RunTally.result`) of the RUN_SETS: device, stream, kernel, comm, compute
    launch: pl.DataFrame  # per device: kernels, the launch durations' and delays' percentiles (ns)
    specs: pl.DataFrame  # (device, spec_name): the first matched device spec of its activity
    peaks: pl.DataFrame  # (device, peak_tflops, peak_bw_gbps) of its kernels, for the roofline plot


@dataclass(frozen=True)
class CpuOps:
    """The totals of a CPU sweep: per op key (`op_table`), per stack (`collapsed_stacks`, when
    python_function frames were swept), the ProfilerSteps and compiled regions, and for a trace
    without GPU activity the activity of its CPU ops."""

    ops: pl.DataFrame  # per op key: calls and the sums of OP_SUMS
    steps: pl.DataFrame  # (step, ts_ns, end_ns) of ProfilerStep#N annotations
    regions: pl.DataFrame  # (name, ts_ns, end_ns, dur_ns) of compiled regions
    span: tuple[int | None, int | None, int]  # first start, last end and number of the ops
    stacks: pl.DataFrame | None  # (path, self_ns, device_ns) of frames
    activity: Activity | None  # CPU-only traces: the device tables' totals, from the ops


# ------------------------------------------------------------------ loading
class Flat:
    """A flattened trace opened for reports: what they are computed from is read once and shared
    by every report function (`activity`, `cpu`), a few small tables; nothing holds the trace."""

    def __init__(self, path: str | Path, flatten_result=None):
        self.path = Path(path)
        self.flatten_result = flatten_result  # set when `opened` flattened a trace file for us
        if not store.is_flat_dir(self.path):
            raise DatasetError(f"{self.path}: not a flattened trace (run `tracepipe flatten` first)")
        self._cpu: dict[tuple, CpuOps] = {}

    def scan(self, table: str) -> pl.LazyFrame:
        return store.scan(self.path, table)

    @cached_property
    def stem(self) -> str:
        return self.scan("trace").select("stem").collect().item() or self.path.name

    @cached_property
    def source(self) -> str | None:
        return self.scan("trace").select("source_path").collect().item()

    @cached_property
    def gpu_ops_file(self) -> Path:
        """gpu_ops.parquet with the link columns: the directory's own or, for a directory flattened
        with --no-link, a temporary copy linked batch by batch, removed with this Flat."""
        own = self.path / "gpu_ops.parquet"
        if "launch_event_idx" in pl.scan_parquet(own).collect_schema().names():
            return own
        tmp = Path(tempfile.mkdtemp(prefix="tracepipe-linked-"))
        weakref.finalize(self, shutil.rmtree, tmp, True)
        src = link.LinkSources.of(self.path)
        store.write_extended(own, tmp / "gpu_ops.parquet", "gpu_ops",
                             lambda batch: link.link_batch(src, batch).select("event_idx", *link.LINK_COLUMNS),
                             inputs=link.GPU_LINK_INPUTS, batch_rows=link.BATCH_ROWS)
        return tmp / "gpu_ops.parquet"

    @cached_property
    def gpu(self) -> pl.DataFrame:
        """Every GPU op with every declared column (null where link/cost did not run), end_ns and
        category: the whole table, for notebooks (the reports never hold it)."""
        columns = _gpu_columns(self.gpu_ops_file, schema.table("gpu_ops").names(schema.ALL_STAGES))
        g = read(self.gpu_ops_file, pl.col("ts_ns").is_not_null(), columns)
        return _activity_rows(g, CategoryMemo())

    @cached_property
    def has_gpu(self) -> bool:
        gpu = pl.scan_parquet(self.path / "gpu_ops.parquet").filter(pl.col("ts_ns").is_not_null())
        return gpu.select(pl.len()).collect(engine="streaming").item() > 0

    @cached_property
    def activity(self) -> Activity:
        """The device activity's totals: the GPU sweep's, or for a trace without GPU activity its CPU ops'."""
        return gpu_sweep(self) if self.has_gpu else self.any_cpu().activity

    @cached_property
    def op_calls(self) -> pl.DataFrame:
        """(cpu_op_name, calls): how many ops of each name launched kernels (`diff`): distinct ops,
        counted while streaming the GPU ops."""
        if not self.has_gpu:  # each CPU op is its own "kernel"
            own = pl.col("cpu_op_name").is_not_null() & (pl.col("kind") == "cpu_op")
            return self.activity.names.filter(own).group_by("cpu_op_name").agg(calls=pl.col("n").sum())
        launched = KERNEL & pl.col("cpu_op_name").is_not_null() & pl.col("ts_ns").is_not_null()
        return (pl.scan_parquet(self.gpu_ops_file).filter(launched).group_by("cpu_op_name")
                .agg(calls=pl.col("cpu_op_event_idx").n_unique().cast(pl.Int64)).collect(engine="streaming"))

    def cpu(self, group_by: str | None = None, stack_n: int = 5, frames: bool = False,
            activity: Callable[[], Activity] | None = None) -> CpuOps:
        """The CPU sweep for an op grouping (`frames`: python_function frames swept too, for
        stacks; grouping by stack needs them). Each is swept once. `activity`: how to get the GPU
        sweep's totals when they are needed (default `Flat.activity`)."""
        frames = frames or group_by == "stack"
        key = (group_by, stack_n if group_by == "stack" else None, frames)
        if key not in self._cpu:
            self._cpu[key] = cpu_sweep(self, group_by, stack_n, frames, activity or (lambda: self.activity))
        return self._cpu[key]

    def sweep_both(self, group_by: str | None = None):
        """Make the GPU and the CPU sweep at once, the GPU one in a second thread: most of their
        work runs in polars, outside the GIL, and each alone keeps two cores only half busy."""
        if not self.has_gpu or "activity" in self.__dict__:
            self.cpu(group_by)
            return
        _ = self.gpu_ops_file  # made once, before both threads need it (it may link a copy)
        with ThreadPoolExecutor(1) as other:
            gpu = other.submit(gpu_sweep, self)
            try:
                self.cpu(group_by, activity=gpu.result)
            finally:
                self.__dict__["activity"] = gpu.result()

    def any_cpu(self) -> CpuOps:
        """A CPU sweep for what no grouping changes (steps, regions, CPU-only activity): any made so far."""
        return next(iter(self._cpu.values())) if self._cpu else self.cpu()

    def any_frames(self) -> CpuOps:
        """A CPU sweep with python_function frames (stacks): any made so far."""
        return next((c for (_, _, frames), c in self._cpu.items() if frames), None) or self.cpu(frames=True)

    @cached_property
    def device_names(self) -> pl.DataFrame:
        """(device, name): the trace's name for the device, else the spec matched, else unknown."""
        devs = self.scan("devices").collect()
        model = one_model(devs)  # unlisted ids of a one-model machine are of that model
        only = model["name"] if model else None
        devs = devs.select("device", pl.col("name").alias("dev_name"))
        ids = self.activity.runs["device"].select("device")
        ids = ids.join(self.activity.specs, on="device", how="left")
        return (ids.join(devs, on="device", how="left")
                .select("device", name=pl.coalesce("dev_name", pl.lit(only, pl.String), "spec_name",
                                                   pl.lit("unknown")))
                .sort("device"))

    @cached_property
    def activity_devices(self) -> pl.DataFrame:
        if self.has_gpu:
            return self.device_names
        return pl.DataFrame({"device": [CPU_DEVICE], "name": ["cpu"]}) if self.any_cpu().span[2] else \
            pl.DataFrame(schema={"device": pl.Int64, "name": pl.String})


def as_flat(flat) -> Flat:
    return flat if isinstance(flat, Flat) else Flat(flat)


@contextmanager
def opened(path: str | Path, **flatten_options) -> Iterator[Flat]:
    """A Flat for a flattened directory (or a directory holding exactly one), or for a trace
    file flattened into a temporary directory that is removed afterwards."""
    path = Path(path)
    if path.is_dir():
        subs = [d for d in sorted(path.iterdir()) if store.is_flat_dir(d)]
        yield Flat(path if store.is_flat_dir(path) or len(subs) != 1 else subs[0])
        return
    if not path.is_file():
        raise BadTrace(f"{path}: no such trace file or flattened directory")
    from pipeline.flatten import flatten

    with tempfile.TemporaryDirectory(prefix="tracepipe-report-") as tmp:
        r = flatten(path, tmp, **flatten_options)
        yield Flat(r.out_dir, flatten_result=r)


# ------------------------------------------------------------------ interval algebra
def covered_overlap(iv: pl.LazyFrame, union: pl.LazyFrame, by: list[str], lo="ts_ns", hi="end_ns") -> pl.LazyFrame:
    """iv with `overlap_ns`: how much of each [lo, hi] the union's runs (by..., start_ns, end_ns) cover."""
    length = pl.col("end_ns") - pl.col("start_ns")
    runs = union.sort("start_ns").select(*by, r0="start_ns", r1="end_ns", before=length.cum_sum().over(by) - length)

    def covered_until(lf: pl.LazyFrame, col: str) -> pl.LazyFrame:  # covered length of (-inf, lf[col]]
        inside = (pl.min_horizontal(pl.col(col), pl.col("r1")) - pl.col("r0")).clip(0)
        return (lf.sort(col).join_asof(runs, left_on=col, right_on="r0", by=by, strategy="backward",
                                       check_sortedness=False)
                .with_columns((pl.col("before") + inside).fill_null(0).alias(f"_cov_{col}"))
                .drop("r0", "r1", "before"))

    out = covered_until(covered_until(iv.with_row_index("_row"), lo), hi)
    return (out.with_columns(overlap_ns=pl.col(f"_cov_{hi}") - pl.col(f"_cov_{lo}"))
            .sort("_row").drop("_row", f"_cov_{lo}", f"_cov_{hi}"))


def nesting(iv: pl.LazyFrame | pl.DataFrame) -> pl.LazyFrame:
    """(iv_idx, depth, parent_idx) of intervals (iv_idx, pid, tid, ts_ns, end_ns) nested per thread.

    Order at one instant: ends, then starts (longer first, then file order: identical
    intervals nest in file order), then the ends of zero-length intervals (see `pipeline.nesting`).
    """
    return _nest(iv, LONGER_FIRST).lazy()


# ------------------------------------------------------------------ the GPU sweep
NAME_KEYS = ["device", "kind", "name", "category", "cpu_op_name"]  # what the name sums are kept per
GPU_COLUMNS = ["event_idx", "kind", "name", "device", "stream", "ts_ns", "dur_ns", "cpu_op_name", "flops", "bytes",
               "achieved_flops_pct", "achieved_bw_pct", "peak_tflops", "peak_bw_gbps", "spec_name", "launch_ts_ns",
               "launch_dur_ns"]
KERNEL = pl.col("kind") == "kernel"
COLLECTIVE = pl.col("category") == "communication"
RUN_SETS: dict[str, tuple[list[str], pl.Expr]] = {  # unions of activity: (key columns, which rows)
    "device": (["device"], pl.lit(True)),
    "stream": (["device", "stream"], pl.lit(True)),
    # for `communication`, on the devices with collective kernels only
    "kernel": (["device"], KERNEL),
    "comm": (["device"], KERNEL & COLLECTIVE),
    "compute": (["device"], KERNEL & ~COLLECTIVE),
}
COLLECTIVE_SETS = ("kernel", "comm", "compute")
LAUNCH_QUANTILES = (0.5, 0.9, 0.99)


def _gpu_columns(path: Path, columns: list[str], categorical: bool = False) -> list[pl.Expr]:
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


def _activity_rows(g: pl.DataFrame, memo: CategoryMemo) -> pl.DataFrame:
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
        n=pl.len().cast(pl.Int64), dur_ns=dur.sum(), min_ns=dur.min(), max_ns=dur.max(),
        flops=float_sum("flops"), flops_n=pl.col("flops").count().cast(pl.Int64), flops_dur_ns=known_time("flops"),
        bytes=float_sum("bytes"), bytes_n=pl.col("bytes").count().cast(pl.Int64), bytes_dur_ns=known_time("bytes"),
        fpct_w=float_sum(pl.col("achieved_flops_pct") * dur), fpct_dur_ns=known_time("achieved_flops_pct"),
        bpct_w=float_sum(pl.col("achieved_bw_pct") * dur), bpct_dur_ns=known_time("achieved_bw_pct"),
        peak_tflops_at=pl.col("event_idx").filter(pl.col("peak_tflops").is_not_null()).first(),
        peak_tflops=pl.col("peak_tflops").drop_nulls().first(),
        peak_bw_at=pl.col("event_idx").filter(pl.col("peak_bw_gbps").is_not_null()).first(),
        peak_bw_gbps=pl.col("peak_bw_gbps").drop_nulls().first())


NAME_SUM_FOLD = [  # how name sums combine (two windows, or the rows of a coarser key)
    *(pl.col(c).sum() for c in ("n", "dur_ns", "flops_n", "flops_dur_ns", "bytes_n", "bytes_dur_ns", "fpct_dur_ns",
                                "bpct_dur_ns")),
    pl.col("min_ns").min(), pl.col("max_ns").max(),
    *(float_sum(c).alias(c) for c in ("flops", "bytes", "fpct_w", "bpct_w")),
    pl.col("peak_tflops_at").min(), first_by("peak_tflops", "peak_tflops_at"),
    pl.col("peak_bw_at").min(), first_by("peak_bw_gbps", "peak_bw_at"),
]


class ActivityTally:
    """Folds windows of activity rows (`_activity_rows`, or CPU ops standing for them) into `Activity`."""

    def __init__(self, collective_devices: pl.Series | None = None):
        self.names: pl.DataFrame | None = None
        self.runs = {name: RunTally(by) for name, (by, _) in RUN_SETS.items()}
        self.collective_devices = collective_devices  # the devices with collective kernels
        self.durations = self.delays = self.launches = self.specs = self.peak_counts = self.peak_bw = None

    def add_names(self, rows: pl.DataFrame):
        self.names = fold(self.names, _name_sums(rows), NAME_KEYS, NAME_SUM_FOLD)

    def add_intervals(self, rows: pl.DataFrame):
        """Rows starting in this window (device, stream, kind, category, ts_ns, end_ns)."""
        with_collectives = (pl.lit(False) if self.collective_devices is None
                            else pl.col("device").is_in(self.collective_devices.implode()))
        for name, (by, which) in RUN_SETS.items():
            which = which & with_collectives if name in COLLECTIVE_SETS else which
            self.runs[name].add(rows.filter(which).select(*by, "ts_ns", "end_ns"))

    def add_gpu(self, g: pl.DataFrame):
        """One window of GPU ops (`_activity_rows`)."""
        self.add_names(g)
        self.add_intervals(g)
        self._add_launches(g)
        first_spec = (g.filter(pl.col("spec_name").is_not_null()).group_by("device", maintain_order=True)
                      .agg(spec_at=pl.col("event_idx").first(), spec_name=pl.col("spec_name").first()))
        self.specs = fold(self.specs, first_spec, ["device"],
                          [pl.col("spec_at").min(), first_by("spec_name", "spec_at")])
        self._add_peaks(g.filter(KERNEL))

    def _add_launches(self, g: pl.DataFrame):
        """Value counts of kernels' launch durations and launch-to-start delays (exact percentiles)."""
        k = g.filter(KERNEL & pl.col("launch_ts_ns").is_not_null()).select(
            "device", "dur_ns", launch_ns="launch_dur_ns", delay_ns=pl.col("ts_ns") - pl.col("launch_ts_ns"))
        count = lambda col: k.group_by("device", col).agg(n=pl.len().cast(pl.Int64))  # noqa: E731
        self.durations = fold(self.durations, count("launch_ns"), ["device", "launch_ns"], [pl.col("n").sum()])
        self.delays = fold(self.delays, count("delay_ns"), ["device", "delay_ns"], [pl.col("n").sum()])
        shorter = pl.col("dur_ns") < pl.col("launch_ns")
        per_device = k.group_by("device").agg(
            kernels=pl.len().cast(pl.Int64), compared=shorter.count().cast(pl.Int64),
            shorter=shorter.sum().cast(pl.Int64), launch_max_ns=pl.col("launch_ns").max(),
            delay_max_ns=pl.col("delay_ns").max())
        self.launches = fold(self.launches, per_device, ["device"], [pl.col("kernels", "compared", "shorter").sum(),
                                                                    pl.col("launch_max_ns", "delay_max_ns").max()])

    def _add_peaks(self, k: pl.DataFrame):
        """The kernels' peak FLOP/s (counted: the plot takes the most used) and first bandwidth."""
        counts = k.filter(pl.col("peak_tflops").is_not_null()).group_by("device", "peak_tflops").agg(n=pl.len())
        self.peak_counts = fold(self.peak_counts, counts, ["device", "peak_tflops"], [pl.col("n").sum()])
        bw = (k.group_by("device", maintain_order=True)
              .agg(bw_at=pl.col("event_idx").filter(pl.col("peak_bw_gbps").is_not_null()).first(),
                   peak_bw_gbps=pl.col("peak_bw_gbps").drop_nulls().first()))
        self.peak_bw = fold(self.peak_bw, bw, ["device"], [pl.col("bw_at").min(), first_by("peak_bw_gbps", "bw_at")])

    def result(self) -> Activity:
        names = _as_strings(self.names if self.names is not None else _name_sums(_empty_activity()))
        runs = {name: t.result({c: pl.Int64 for c in RUN_SETS[name][0]}) for name, t in self.runs.items()}
        specs = (_as_strings(self.specs.select("device", "spec_name")) if self.specs is not None
                 else pl.DataFrame(schema={"device": pl.Int64, "spec_name": pl.String}))
        return Activity(names=names, runs=runs, launch=self._launch_table(), specs=specs, peaks=self._peak_table())

    def _launch_table(self) -> pl.DataFrame:
        """Per device: kernels, compared, shorter, launch_max_ns, delay_max_ns, launch_q<i>, delay_q<i> (ns)."""
        if self.launches is None:
            return pl.DataFrame(schema={"device": pl.Int64, "kernels": pl.Int64, "compared": pl.Int64,
                                        "shorter": pl.Int64, "launch_max_ns": pl.Int64, "delay_max_ns": pl.Int64,
                                        **{f"{m}_q{i}": pl.Int64 for m in ("launch", "delay")
                                           for i in range(len(LAUNCH_QUANTILES))}})
        out = self.launches
        for metric, counts in (("launch", self.durations), ("delay", self.delays)):
            q = quantiles_from_counts(counts, ["device"], f"{metric}_ns", LAUNCH_QUANTILES)
            out = out.join(q.rename({f"q{i}": f"{metric}_q{i}" for i in range(len(LAUNCH_QUANTILES))}), on="device",
                           how="left", maintain_order="left")
        return out

    def _peak_table(self) -> pl.DataFrame:
        """(device, peak_tflops, peak_bw_gbps): the most used peak (ties: the lower) and the first bandwidth."""
        if self.peak_bw is None:
            return pl.DataFrame(schema={"device": pl.Int64, "peak_tflops": pl.Float64, "peak_bw_gbps": pl.Float64})
        most = (self.peak_counts.sort("device", "n", "peak_tflops", descending=[False, True, False])
                .group_by("device", maintain_order=True).agg(pl.col("peak_tflops").first()))
        return self.peak_bw.join(most, on="device", how="left").select("device", "peak_tflops", "peak_bw_gbps")


def _as_strings(frame: pl.DataFrame) -> pl.DataFrame:
    """Categorical columns as strings (the totals' few rows, for sorting by name and output)."""
    return frame.with_columns(pl.col(pl.Categorical).cast(pl.String))


def _empty_activity() -> pl.DataFrame:
    types = {c.name: POLARS_TYPES[c.type] for c in schema.table("gpu_ops").columns if c.name in GPU_COLUMNS}
    return pl.DataFrame(schema={**types, "category": pl.String, "end_ns": pl.Int64})


def gpu_sweep(f: Flat) -> Activity:
    """The totals of a trace's GPU ops, read window by window in time (only the columns they use).
    Their few distinct (device, kind, name, op) are categorised first (a streaming read): the
    windows then only look categories up, and only devices with collectives get their unions."""
    path = f.gpu_ops_file
    columns = _gpu_columns(path, GPU_COLUMNS, categorical=True)
    memo = CategoryMemo()
    keys = (pl.scan_parquet(path).select(*(c for c in columns if c.meta.output_name() in ("kind", "name", "cpu_op_name")),
                                         pl.col("device").fill_null(CPU_DEVICE))
            .unique().collect(engine="streaming"))
    keys = with_category(keys, memo=memo)
    tally = ActivityTally(keys.filter(KERNEL & COLLECTIVE)["device"].unique())
    for window in time_windows(path, pl.lit(True), max(1, sweep.PER_WINDOW // 2)):  # beside the CPU sweep's
        tally.add_gpu(_activity_rows(read(path, within(window), columns), memo))
    return tally.result()


# ------------------------------------------------------------------ the CPU sweep
OP_SUMS = ["self_ns", "dur_ns", "self_device_ns", "device_ns", "kernels"]
OP_FOLD = [pl.col("calls", *OP_SUMS, "flops_ops").sum(), float_sum("flops").alias("flops")]
ARGS = pl.col("args_json")
GROUP_ARGS = {  # what a grouping reads from an op's args (the rest of its key comes from the op)
    "input-shape": {"input_shape": ARGS.str.json_path_match("$['Input Dims']").fill_null("")},
    "overload": {"listed_overload": ARGS.str.json_path_match("$['Overload Name']")},
    "stack": {"recorded_stack": ARGS.str.json_path_match("$['Call stack']")},
}


def _is_slice(cat_regex: str) -> pl.Expr:
    """Complete events of these categories on a thread, with a start."""
    return ((pl.col("ph") == "X") & pl.col("cat").str.contains(cat_regex) & pl.col("pid").is_not_null()
            & pl.col("tid").is_not_null() & pl.col("ts_ns").is_not_null())


IS_OP = pl.col("cat").str.contains(OP_CAT)
IS_STEP = pl.col("name").str.contains(STEP_NAME)


class Launches:
    """The GPU ops CPU ops launched, window by window in time: an op's own (its linked GPU ops:
    self device time, FLOPs) and those launched anywhere inside it on its thread (device time,
    kernels: the launches' running sums per thread where it ends minus where it starts)."""

    VALUES = ["device_ns", "kernels"]

    def __init__(self, f: Flat):
        self.gpu, self.events = f.gpu_ops_file, f.path / "events.parquet"
        self.prefix = ThreadPrefix(["pid", "tid"], self.VALUES)

    def enter(self, window):
        """The launches in the window: (pid, tid) of the launch call, its start, the GPU op's duration."""
        launched = pl.col("launch_event_idx").is_not_null() & pl.col("ts_ns").is_not_null()
        g = read(self.gpu, launched & within(window, "launch_ts_ns"),
                 ["launch_event_idx", "launch_ts_ns", pl.col("dur_ns").fill_null(0)])
        threads = read_among(self.events, pl.lit(True), "event_idx", g["launch_event_idx"],
                             ["event_idx", "pid", "tid"], wide=True)
        points = g.join(threads, left_on="launch_event_idx", right_on="event_idx", how="inner")
        self.prefix.enter(points.select("pid", "tid", t="launch_ts_ns", device_ns="dur_ns",
                                        kernels=pl.lit(1, pl.Int64)))

    def own(self, owned: pl.DataFrame, per_op: bool) -> pl.DataFrame:
        """Ops starting in the window with the launch sums before their start and, if `per_op`,
        their own GPU ops' sums (else none: they are summed per op name from `Flat.activity`)."""
        before = self.prefix.at(owned, "ts_ns", inclusive=False)
        owned = owned.with_columns(before[v].alias(f"before_{v}") for v in self.VALUES)
        if not per_op:
            return _none_own(owned)
        launched = pl.col("launch_event_idx").is_not_null() & pl.col("ts_ns").is_not_null()
        g = read_among(self.gpu, launched, "cpu_op_event_idx", owned["event_idx"],
                       ["event_idx", "cpu_op_event_idx", pl.col("dur_ns").fill_null(0), "flops"])
        # sorted by op: each op's few values are added in file order, by one thread
        own = g.sort("cpu_op_event_idx", "event_idx").group_by("cpu_op_event_idx", maintain_order=True).agg(
            self_device_ns=pl.col("dur_ns").sum(), flops=pl.col("flops").sum(),
            flops_n=pl.col("flops").count().cast(pl.Int64), own_n=pl.len().cast(pl.Int64))
        mine = owned.select("event_idx").join(own, left_on="event_idx", right_on="cpu_op_event_idx", how="left",
                                              maintain_order="left")
        return owned.with_columns(mine["self_device_ns"].fill_null(0), mine["flops"], mine["flops_n"].fill_null(0),
                                  mine["own_n"].fill_null(0))

    def inside(self, ending: pl.DataFrame) -> pl.DataFrame:
        """(event_idx, device_ns, kernels) of ops ending in the window: the launches inside them."""
        upto = self.prefix.at(ending, "end_ns", inclusive=True)
        return ending.select("event_idx", *((upto[v] - ending[f"before_{v}"]).alias(v) for v in self.VALUES))


def _none_own(ops: pl.DataFrame) -> pl.DataFrame:
    """Ops with no own GPU op counted."""
    zero = pl.lit(0, pl.Int64)
    return ops.with_columns(self_device_ns=zero, flops=pl.lit(None, pl.Float64), flops_n=zero, own_n=zero)


def _no_launches(ops: pl.DataFrame) -> pl.DataFrame:
    """Ops of a trace without GPU activity: nothing launched."""
    zero = pl.lit(0, pl.Int64)
    return _none_own(ops).with_columns(before_device_ns=zero, before_kernels=zero)


def _with_own_by_name(ops: pl.DataFrame, activity: Activity) -> pl.DataFrame:
    """Op totals per name (no grouping) with their own GPU ops' time and FLOPs: those of the GPU ops
    whose op has that name (`Activity.names` are kept per op name too)."""
    own = (activity.names.filter(pl.col("cpu_op_name").is_not_null()).sort(NAME_KEYS)
           .with_columns(name=pl.col("cpu_op_name").str.replace(OVERLOAD_SUFFIX, "$1"))
           .group_by("name", maintain_order=True)
           .agg(self_device_ns=pl.col("dur_ns").sum(), flops=float_sum("flops"), flops_ops=pl.col("flops_n").sum()))
    mine = beside(ops, own, "name")
    return ops.with_columns(mine["self_device_ns"].fill_null(0), mine["flops"], mine["flops_ops"].fill_null(0))


def _with_args(f: Flat, owned: pl.DataFrame, group_by: str | None) -> pl.DataFrame:
    """Owned ops with the columns their grouping reads from args: only their rows' args are decoded."""
    if group_by not in GROUP_ARGS:
        return owned
    values = read_among(f.path / "events.parquet", pl.lit(True), "event_idx", owned.filter(IS_OP)["event_idx"],
                        ["event_idx", *(v.alias(k) for k, v in GROUP_ARGS[group_by].items())], wide=True)
    return owned.join(values, on="event_idx", how="left", maintain_order="left")


def _op_keys(ops: pl.DataFrame, group_by: str | None, stack_n: int) -> pl.DataFrame:
    """Ops with their key columns (`GROUPINGS`; without a grouping, see `CpuTally.add_final`)."""
    if group_by == "input-shape":
        return ops
    if group_by == "overload":
        suffix = pl.col("name").str.extract(r"^\w[\w.]*::\w+\.(\w+)$", 1)
        return ops.with_columns(overload=pl.coalesce("listed_overload", suffix, pl.lit("")))
    if group_by == "stack":
        recorded = pl.col("recorded_stack").str.split(";").list.head(stack_n).list.join(" <- ")
        return ops.with_columns(stack=pl.coalesce(recorded, "nested_stack").fill_null(""))
    return ops


class CpuTally:
    """Folds the windows of a CPU sweep into `CpuOps`."""

    def __init__(self, group_by: str | None, stack_n: int, frames: bool, activity: ActivityTally | None,
                 paths: Paths):
        self.group_by, self.stack_n, self.frames, self.activity = group_by, stack_n, frames, activity
        self.paths = paths
        self.keys = ["name", *GROUPINGS[group_by]]
        self.ops = self.stacks = None
        self.steps, self.regions, self.span = [], [], (None, None, 0)
        self.memo = CategoryMemo()

    def add_owned(self, ops: pl.DataFrame):
        """Ops (and annotations) starting in the window."""
        self.steps.append(ops.filter(pl.col("cat").str.contains(ANNOTATION_CAT) & IS_STEP).select(
            step=pl.col("name").str.extract(STEP_NAME, 1).cast(pl.Int64), ts_ns="ts_ns", end_ns="end_ns"))
        self.regions.append(ops.filter(pl.col("name").str.contains(COMPILED_REGION)).select("name", "ts_ns", "end_ns",
                                                                                           "dur_ns"))
        first, last, n = self.span
        if ops.height:
            first = min(v for v in (first, ops["ts_ns"].min()) if v is not None)
            last = max(v for v in (last, ops["end_ns"].max()) if v is not None)
        self.span = (first, last, n + ops.height)
        if self.activity is not None:
            self.activity.add_intervals(_cpu_activity(ops.filter(~IS_STEP), self.memo))

    def add_final(self, final: pl.DataFrame):
        """Slices whose children have all been seen (device_ns, kernels set)."""
        ops = (final.filter(IS_OP) if self.frames else final).with_columns(
            self_ns=pl.col("dur_ns") - pl.col("child_op_ns"))
        if self.group_by == "stack":
            ops = ops.with_columns(beside(ops, self._nested_stacks(ops["path_id"]), "path_id")["nested_stack"])
        keyed = _op_keys(ops, self.group_by, self.stack_n)
        part = keyed.group_by(self.keys, maintain_order=True).agg(
            calls=pl.len().cast(pl.Int64), *(pl.col(c).sum() for c in OP_SUMS), flops=float_sum("flops"),
            flops_ops=(pl.col("flops_n") > 0).sum().cast(pl.Int64))
        if self.group_by is None:  # names lose their overload suffix: on the few rows of the part
            part = part.with_columns(name=pl.col("name").str.replace(OVERLOAD_SUFFIX, "$1"))
        self.ops = fold(self.ops, part, self.keys, OP_FOLD)
        if self.frames:
            stacks = final.group_by("path_id", maintain_order=True).agg(
                self_ns=(pl.col("dur_ns") - pl.col("child_frame_ns")).sum(), device_ns=pl.col("self_device_ns").sum())
            self.stacks = fold(self.stacks, stacks, ["path_id"], [pl.col("self_ns", "device_ns").sum()])
        if self.activity is not None:
            self.activity.add_names(_cpu_activity(ops.filter(~IS_STEP), self.memo))

    def _nested_stacks(self, path_ids: pl.Series) -> pl.DataFrame:
        """(path_id, nested_stack): the enclosing frames of each distinct path, innermost first, at
        most stack_n, joined by " <- " (computed once per distinct path, not per op)."""
        ids = path_ids.unique()
        nested = pl.col("path").str.split(";")
        nested = nested.list.slice(0, nested.list.len() - 1).list.reverse().list.head(self.stack_n)
        return pl.DataFrame({"path_id": ids, "path": self.paths.strings(ids)}).select(
            "path_id", nested_stack=nested.list.join(" <- "))

    def result(self) -> CpuOps:
        steps = pl.concat(self.steps) if self.steps else pl.DataFrame(
            schema={"step": pl.Int64, "ts_ns": pl.Int64, "end_ns": pl.Int64})
        regions = pl.concat(self.regions) if self.regions else pl.DataFrame(
            schema={"name": pl.String, "ts_ns": pl.Int64, "end_ns": pl.Int64, "dur_ns": pl.Int64})
        stacks = None if self.stacks is None else self.stacks.select(
            path=self.paths.strings(self.stacks["path_id"]), self_ns="self_ns", device_ns="device_ns")
        return CpuOps(ops=self.ops, steps=steps, regions=regions, span=self.span, stacks=stacks,
                      activity=None if self.activity is None else self.activity.result())


def _cpu_activity(ops: pl.DataFrame, memo: CategoryMemo) -> pl.DataFrame:
    """CPU ops as the activity of a trace without GPU ops: device -1, stream = thread, each op's
    self time as its duration (when known), category from its name."""
    rows = ops.select("event_idx", "name", "ts_ns", "end_ns", device=pl.lit(CPU_DEVICE, pl.Int64),
                      stream=pl.col("tid"), kind=pl.lit("cpu_op"), cpu_op_name="name",
                      dur_ns=pl.col("self_ns") if "self_ns" in ops.columns else pl.col("dur_ns"))
    missing = {c: t for c, t in _empty_activity().schema.items() if c not in rows.columns and c != "category"}
    rows = rows.with_columns(pl.lit(None, t).alias(c) for c, t in missing.items())
    return with_category(rows, "name", "name", "kind", memo=memo)


def cpu_sweep(f: Flat, group_by: str | None, stack_n: int, frames: bool,
              activity: Callable[[], Activity]) -> CpuOps:
    """The totals of a trace's CPU ops and annotations (with python_function frames if `frames`),
    read window by window in time: parents and self times among ops (and among frames), the GPU
    time they launched, their keys for an op grouping."""
    events = f.path / "events.parquet"
    where = _is_slice(FRAME_CAT if frames else OP_CAT)
    nests = (Nest("op", IS_OP if frames else None), *((Nest("frame"),) if frames else ()))
    launches = Launches(f) if f.has_gpu else None

    def extend(owned: pl.DataFrame, window) -> pl.DataFrame:
        if launches is None:
            return _with_args(f, _no_launches(owned), group_by)
        launches.enter(window)
        return _with_args(f, launches.own(owned, per_op=frames or group_by is not None), group_by)

    label = pl.col("name").fill_null("?").str.replace_many(STACK_TRANSLATE)
    slices = SliceSweep(events, where, nests, time_windows(events, where), extend,
                        at_end=launches.inside if launches else None, path=("frame", label) if frames else None)
    tally = CpuTally(group_by, stack_n, frames, None if f.has_gpu else ActivityTally(), slices.paths)
    for _, owned, final in slices.windows():
        tally.add_owned(owned.filter(IS_OP) if frames else owned)
        zero = pl.lit(0, pl.Int64)
        tally.add_final(final if launches else final.with_columns(device_ns=zero, kernels=zero))
    totals = tally.result()
    if launches is None or frames or group_by is not None:
        return totals
    return replace(totals, ops=_with_own_by_name(totals.ops, activity()))


# ------------------------------------------------------------------ categories and names
def normalize_op(name: pl.Expr) -> pl.Expr:
    """An op name as a cross-vendor key: overload suffix dropped, `OP_ALIASES` applied."""
    out = name.str.replace(OVERLOAD_SUFFIX, "$1")
    for pattern, key in OP_ALIASES:
        out = out.str.replace(pattern, key)
    return out


def normalize_kernel(name: pl.Expr) -> pl.Expr:
    """A kernel name without template arguments, parameters, return type and hashes."""
    out = name
    for pattern, repl in KERNEL_NAME_RULES:
        out = out.str.replace_all(pattern, repl)
    return pl.when(out.str.strip_chars() == "").then(name).otherwise(out.str.strip_chars())


# ------------------------------------------------------------------ aggregates
def _us(col: str | pl.Expr) -> pl.Expr:
    return (pl.col(col) if isinstance(col, str) else col) / NS_PER_US


def _rolled(names: pl.DataFrame, keys: list[str]) -> pl.DataFrame:
    """Name sums (`_name_sums`) added up per keys, in a fixed order of the rows."""
    return names.sort(NAME_KEYS, nulls_last=True).group_by(keys, maintain_order=True).agg(NAME_SUM_FOLD)


def _most_common(names: pl.DataFrame, keys: list[str], col: str) -> pl.DataFrame:
    """(keys..., col): the col most rows per keys have (ties: the first by name), null if none has one."""
    counted = names.filter(pl.col(col).is_not_null()).group_by(*keys, col).agg(pl.col("n").sum())
    return (counted.sort(*keys, "n", col, descending=[False] * len(keys) + [True, False], nulls_last=True)
            .group_by(keys, maintain_order=True).agg(pl.col(col).first()))


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


def _roofline(df: pl.DataFrame) -> pl.DataFrame:
    """arithmetic_intensity and roofline_bound of aggregated rows (`roofline.bound`)."""
    return (df.with_columns(arithmetic_intensity=roofline.intensity(pl.col("flops"), pl.col("bytes")))
            .with_columns(roofline_bound=roofline.bound(pl.col("arithmetic_intensity"), pl.col("_peak_tflops"),
                                                        pl.col("_peak_bw")))
            .drop("_peak_tflops", "_peak_bw"))


def _name_table(names: pl.DataFrame, keys: list[str]) -> pl.DataFrame:
    """Per keys: count, time, share of the device's time, cost, top CPU op, category; by device, then
    time (ties by name)."""
    t = (_rolled(names, keys)
         .join(_most_common(names, keys, "category"), on=keys, how="left", nulls_equal=True, maintain_order="left")
         .join(_most_common(names, keys, "cpu_op_name"), on=keys, how="left", nulls_equal=True,
               maintain_order="left"))
    dur_us = _us("dur_ns")
    out = t.select(
        *keys, "category", pl.col("n").cast(pl.UInt32).alias("count"), dur_us.alias("dur_us"),
        (100 * dur_us / _us(pl.col("dur_ns").sum().over("device"))).alias("pct"), *cost_columns(),
        (dur_us / pl.col("n")).alias("mean_us"), _us("min_ns").alias("min_us"), _us("max_ns").alias("max_us"),
        pl.col("cpu_op_name").alias("cpu_op"))
    rest = [k for k in keys if k != "device"]
    return _roofline(out).sort("device", "dur_us", *rest, descending=[False, True, *[False] * len(rest)])


def kernel_table(flat, kinds: tuple[str, ...] = ("kernel",)) -> pl.DataFrame:
    """Per device, per kernel name: count (every launch), dur_us, mean/min/max, pct of the device's
    kernel time, flops, bytes, achieved TFLOP/s and GB/s, achieved % of peak, arithmetic
    intensity, roofline bound, category, most common launching op. CPU-only traces: per CPU op."""
    names = as_flat(flat).activity.names
    return _name_table(names.filter(pl.col("kind").is_in([*kinds, "cpu_op"])), ["device", "name"])


def transfer_table(flat) -> pl.DataFrame:
    """kernel_table of memcpy / memset activity (with its kind)."""
    names = as_flat(flat).activity.names
    return _name_table(names.filter(pl.col("kind").is_in(["memcpy", "memset"])), ["device", "kind", "name"])


def _span_stats(runs: pl.DataFrame, by: list[str]) -> pl.DataFrame:
    """Busy/idle figures of unions (`RunTally.result`)."""
    span = pl.col("end_ns") - pl.col("start_ns")
    return runs.select(
        *by, span_us=_us(span), busy_us=_us("busy_ns"),
        busy_pct=pl.when(span > 0).then(100 * pl.col("busy_ns") / span).otherwise(0.0),
        idle_us=_us(span) - _us("busy_ns"), gaps=pl.col("runs") - 1,
        largest_gap_us=_us(pl.col("largest_gap_ns").fill_null(0)), start_ns="start_ns", end_ns="end_ns")


def busy(flat, per_stream: bool = False) -> pl.DataFrame:
    """Per device (or device and stream): the union of all activity intervals (kernels, memcpy,
    memset) over the span from the first start to the last end: busy_us, busy_pct, idle_us,
    idle gaps (count, largest)."""
    f = as_flat(flat)
    by = ["device", "stream"] if per_stream else ["device"]
    stats = _span_stats(f.activity.runs["stream" if per_stream else "device"], by).sort(by)
    if per_stream:
        return stats
    return (stats.join(f.activity_devices, on="device", how="left", maintain_order="left")
            .select("device", "name", pl.exclude("device", "name")))


def categories(flat) -> pl.DataFrame:
    """Per device and category: ops, dur_us and pct of the device's summed activity time."""
    t = _rolled(as_flat(flat).activity.names, ["device", "category"])
    return (t.select("device", "category", count=pl.col("n").cast(pl.UInt32), dur_us=_us("dur_ns"),
                     pct=100 * _us("dur_ns") / _us(pl.col("dur_ns").sum().over("device")))
            .sort("device", "dur_us", "category", descending=[False, True, False]))


# ------------------------------------------------------------------ CPU ops
def op_table(flat, group_by: str | None = None, sort: str | None = None, stack_n: int = 5) -> pl.DataFrame:
    """Like torch.profiler's key_averages().table(): per op name (and input shape, stack or
    overload): calls, self/total CPU time, self/total device time (its GPU ops; total includes
    those of the ops it calls), kernels launched, FLOPs of its own kernels.

    sort: any output column (descending); default self_device_us with GPU activity, else self_cpu_us.
    """
    check_options("table", group_by=group_by)
    f = as_flat(flat)
    keys = ["name", *GROUPINGS[group_by]]
    share = lambda col: 100 * _us(col) / _us(pl.col(col).sum())  # noqa: E731
    out = f.cpu(group_by, stack_n).ops.select(
        *keys, calls=pl.col("calls").cast(pl.UInt32), self_cpu_us=_us("self_ns"), cpu_total_us=_us("dur_ns"),
        cpu_avg_us=_us("dur_ns") / pl.col("calls"), self_device_us=_us("self_device_ns"),
        device_total_us=_us("device_ns"),
        kernels="kernels", flops=pl.when(pl.col("flops_ops") > 0).then("flops"),
        self_cpu_pct=share("self_ns"), self_device_pct=share("self_device_ns"))
    sort = sort or ("self_device_us" if f.has_gpu else "self_cpu_us")
    if sort not in out.columns:
        raise UsageError(f"cannot sort by {sort!r}; columns: {', '.join(out.columns)}")
    return out.sort(sort, *keys, descending=[True] + [False] * len(keys), nulls_last=True)


STACK_METRICS = ("self_cpu_time_total", "self_device_time_total")


def collapsed_stacks(flat, metric: str = "self_cpu_time_total") -> pl.DataFrame:
    """(stack, value): flame-graph collapsed stacks "outer;...;inner" with the summed self time
    (µs, integer, > 0) of the innermost frame, like export_stacks. Frames are cpu ops, user
    annotations and python_function events nested per thread. `str(line)` = stack + " " + value."""
    if metric not in STACK_METRICS:
        raise UsageError(f"metric must be one of {', '.join(STACK_METRICS)}")
    value = "self_ns" if metric == "self_cpu_time_total" else "device_ns"
    return (as_flat(flat).any_frames().stacks
            .select(stack="path", value=(pl.col(value) / NS_PER_US).floor().cast(pl.Int64))
            .filter(pl.col("value") > 0).sort("stack"))


def stack_lines(stacks: pl.DataFrame) -> str:
    return "".join(f"{s} {v}\n" for s, v in stacks.iter_rows())


# ------------------------------------------------------------------ launches, compile, comms
def launch_overhead(flat) -> pl.DataFrame:
    """Per device, over kernels linked to their launch call: the launch call's duration, the delay
    from the launch call's start to the kernel's start (p50/p90/p99/max), and the share of
    kernels that ran shorter than their launch call took."""
    launch = as_flat(flat).activity.launch
    percentiles = [_us(f"{metric}_q{i}").alias(f"{prefix}_p{round(q * 100)}_us")
                   for metric, prefix in (("launch", "launch"), ("delay", "launch_to_start"))
                   for i, q in enumerate(LAUNCH_QUANTILES)]
    shorter = pl.when(pl.col("compared") > 0).then(100 * (pl.col("shorter") / pl.col("compared")))
    return launch.select(
        "device", *percentiles[:3], _us("launch_max_ns").alias("launch_max_us"), *percentiles[3:],
        _us("delay_max_ns").alias("launch_to_start_max_us"), pl.col("kernels").cast(pl.UInt32),
        shorter.alias("shorter_than_launch_pct")).sort("device")


def _steps(f: Flat) -> pl.DataFrame:
    """ProfilerStep#N intervals (step, ts_ns, end_ns); the whole CPU span as step null if none."""
    ops = f.any_cpu()
    first, last, n = ops.span
    if ops.steps.height or not n:
        return ops.steps.sort("ts_ns")
    return pl.DataFrame({"step": [None], "ts_ns": [first], "end_ns": [last]},
                        schema={"step": pl.Int64, "ts_ns": pl.Int64, "end_ns": pl.Int64})


def compiled_regions(flat) -> pl.DataFrame:
    """torch.compile regions on the CPU side (CompiledFunction, CompiledFunctionBackward,
    Torch-Compiled Region, ## Call CompiledFxGraph ...): per name, count and total time."""
    r = as_flat(flat).any_cpu().regions
    return (r.group_by("name").agg(count=pl.len(), dur_us=_us(pl.col("dur_ns").sum()))
            .sort("dur_us", "name", descending=[True, False]))


def compile_view(flat) -> pl.DataFrame:
    """Per ProfilerStep: compiled regions started in it, time covered by compiled regions (their
    union over all threads), time outside them, and the gaps between consecutive compiled runs
    inside the step (likely graph breaks: eager code between compiled graphs). Empty when the
    trace has no compiled regions."""
    f = as_flat(flat)
    regions = f.any_cpu().regions.select("ts_ns", "end_ns", k=pl.lit(0))
    steps = _steps(f).with_columns(k=pl.lit(0))
    if not regions.height or not steps.height:
        return pl.DataFrame(schema={"step": pl.Int64, "step_us": pl.Float64, "regions": pl.Int64,
                                    "compiled_us": pl.Float64, "outside_us": pl.Float64, "compiled_pct": pl.Float64,
                                    "breaks": pl.Int64, "break_us": pl.Float64, "largest_break_us": pl.Float64})
    runs = interval_union(regions, ["k"])
    covered = covered_overlap(steps.lazy(), runs, ["k"]).collect()
    # runs inside each step, by the step containing the run's start
    step_of = lambda lf, col: (lf.sort(col).join_asof(steps.lazy().select("step", "k", s0="ts_ns", s1="end_ns").sort("s0"),
                                                      left_on=col, right_on="s0", by="k", strategy="backward",
                                                      check_sortedness=False)
                               .filter(pl.col(col) <= pl.col("s1")))
    gaps = (step_of(runs, "start_ns").sort("start_ns")
            .with_columns(gap_ns=(pl.col("start_ns") - pl.col("end_ns").shift(1)).over("s0"))
            .group_by("s0").agg(breaks=pl.col("gap_ns").is_not_null().sum().cast(pl.Int64),
                                break_ns=pl.col("gap_ns").sum(), largest_ns=pl.col("gap_ns").max()))
    counts = step_of(regions.lazy(), "ts_ns").group_by("s0").agg(regions=pl.len().cast(pl.Int64))
    out = (covered.lazy().join(gaps, left_on="ts_ns", right_on="s0", how="left")
           .join(counts, left_on="ts_ns", right_on="s0", how="left")
           .sort("step", "ts_ns")  # a step number seen twice (traces put together): in time order
           .select("step", step_us=_us("end_ns") - _us("ts_ns"), regions=pl.col("regions").fill_null(0),
                   compiled_us=_us("overlap_ns"), outside_us=(_us("end_ns") - _us("ts_ns")) - _us("overlap_ns"),
                   compiled_pct=pl.when(pl.col("end_ns") > pl.col("ts_ns"))
                   .then(100 * pl.col("overlap_ns") / (pl.col("end_ns") - pl.col("ts_ns"))),
                   breaks=pl.col("breaks").fill_null(0), break_us=_us("break_ns").fill_null(0.0),
                   largest_break_us=_us("largest_ns").fill_null(0.0)))
    return out.collect()


def communication(flat) -> pl.DataFrame:
    """Per device with collective kernels (category communication): their count, summed time,
    busy time (union), the part of it overlapped by compute kernels (any other kernel on the
    device) and the exposed rest. Overlap = |collectives| + |compute| - |all kernels| (unions)."""
    a = as_flat(flat).activity
    sums = (a.names.filter(KERNEL & COLLECTIVE).group_by("device")
            .agg(comm_kernels=pl.col("n").sum().cast(pl.UInt32), comm_ns=pl.col("dur_ns").sum()))
    for name in ("comm", "compute", "kernel"):
        sums = sums.join(a.runs[name].select("device", pl.col("busy_ns").alias(f"{name}_busy_ns")), on="device",
                         how="left", maintain_order="left")
    overlap = pl.col("comm_busy_ns") + pl.col("compute_busy_ns").fill_null(0) - pl.col("kernel_busy_ns")
    return (sums.with_columns(overlap_ns=overlap)
            .select("device", "comm_kernels", comm_us=_us("comm_ns"), comm_busy_us=_us("comm_busy_ns"),
                    overlapped_us=_us("overlap_ns"),
                    overlap_pct=pl.when(pl.col("comm_busy_ns") > 0)
                    .then(100 * pl.col("overlap_ns") / pl.col("comm_busy_ns")),
                    exposed_us=_us("comm_busy_ns") - _us("overlap_ns"))
            .sort("device"))


# ------------------------------------------------------------------ analyze (all sections)
SECTIONS = ("devices", "kernels", "transfers", "streams", "categories", "ops", "launch", "compile",
            "regions", "communication")


def analyze(flat, group_by: str | None = None, sort: str | None = None) -> dict[str, pl.DataFrame]:
    """Every report of one trace, by section name (see `SECTIONS`)."""
    f = as_flat(flat)
    check_options("table", group_by=group_by)
    f.sweep_both(group_by)  # the CPU sweep also serves the compile view, and a CPU-only trace's device tables
    return {
        "devices": busy(f),
        "kernels": kernel_table(f),
        "transfers": transfer_table(f),
        "streams": busy(f, per_stream=True),
        "categories": categories(f),
        "ops": op_table(f, group_by=group_by, sort=sort),
        "launch": launch_overhead(f),
        "compile": compile_view(f),
        "regions": compiled_regions(f),
        "communication": communication(f),
    }


def finite(df: pl.DataFrame) -> pl.DataFrame:
    """Float NaN / inf as null (JSON has no NaN)."""
    floats = [c for c, t in df.schema.items() if t.is_float()]
    return df.with_columns(pl.when(pl.col(c).is_finite()).then(pl.col(c)).alias(c) for c in floats)


def _records(df: pl.DataFrame, drop: tuple[str, ...] = ()) -> list[dict]:
    return finite(df.drop([c for c in drop if c in df.columns])).to_dicts()


def analysis_json(sections: dict[str, pl.DataFrame], top: int | None = None) -> dict:
    """The JSON document of `analyze`: {"devices": [{device, name, busy_pct, ..., kernels: [...],
    transfers: [...], streams: [...], categories: [...]}], "ops": [...], "launch": [...], ...}."""
    per_device = {"kernels": "kernels", "transfers": "transfers", "streams": "streams", "categories": "categories"}
    devices = []
    for d in _records(sections["devices"], ("start_ns", "end_ns")):
        for key, sec in per_device.items():
            rows = sections[sec].filter(pl.col("device") == d["device"])
            d[key] = _records(rows.head(top) if top else rows, ("device", "start_ns", "end_ns"))
        devices.append(d)
    out = {"devices": devices}
    for sec in SECTIONS:
        if sec not in per_device and sec != "devices":
            rows = sections[sec]
            out[sec] = _records(rows.head(top) if top and sec == "ops" else rows)
    return out


# ------------------------------------------------------------------ diff
def diff_side(flat) -> pl.DataFrame:
    """One trace's rows for `diff`, keyed by normalised CPU op (kernels launched by an op),
    normalised kernel name (kernels without an op), or copy/memset name; all devices together."""
    f = as_flat(flat)
    by_op = pl.col("cpu_op_name").is_not_null() & pl.col("kind").is_in(["kernel", "cpu_op"])
    names = f.activity.names.with_columns(
        key=pl.when(by_op).then(normalize_op(pl.col("cpu_op_name"))).otherwise(normalize_kernel(pl.col("name"))),
        key_kind=pl.when(by_op).then(pl.lit("op")).otherwise(pl.col("kind")))
    keys = ["key", "key_kind"]
    calls = (f.op_calls.with_columns(key=normalize_op(pl.col("cpu_op_name")), key_kind=pl.lit("op"))
             .group_by(keys).agg(pl.col("calls").sum()))
    top = (names.group_by(*keys, "name").agg(n=pl.col("n").sum(), d=pl.col("dur_ns").sum())
           .sort("d", "name", descending=[True, False])
           .group_by(keys, maintain_order=True)
           .agg(top_kernels=pl.struct(name="name", count=pl.col("n").cast(pl.UInt32), dur_us=pl.col("d") / NS_PER_US)
                .head(3)))
    spread = names.group_by(keys).agg(kernel_names=pl.col("name").n_unique().cast(pl.Int64),
                                      devices=pl.col("device").unique().sort())
    rows = (_rolled(names, keys).join(spread, on=keys, how="left", maintain_order="left")
            .join(calls, on=keys, how="left", maintain_order="left"))
    out = rows.select(*keys, *cost_columns(), count=pl.col("n").cast(pl.UInt32), calls=pl.col("calls").fill_null(0),
                      dur_us=_us("dur_ns"), kernel_names="kernel_names", devices="devices")
    return _roofline(out).join(top, on=keys, how="left", maintain_order="left")


SIDE_COLS = ("count", "calls", "dur_us", "flops", "bytes", "achieved_tflops", "achieved_gbps",
             "achieved_flops_pct", "achieved_bw_pct", "arithmetic_intensity", "roofline_bound",
             "kernel_names", "devices", "top_kernels")


def diff(a, b) -> pl.DataFrame:
    """Two traces side by side: one row per key (see `diff_side`), a_* and b_* columns (null when
    a side has no such row), delta_us = b - a, ratio = b / a; sorted by the larger time."""
    sa, sb = (diff_side(x).rename({c: f"{p}_{c}" for c in SIDE_COLS}) for x, p in ((a, "a"), (b, "b")))
    j = sa.join(sb, on=["key", "key_kind"], how="full", coalesce=True)
    return (j.rename({"key_kind": "kind"})
            .with_columns(delta_us=pl.col("b_dur_us").fill_null(0) - pl.col("a_dur_us").fill_null(0),
                          ratio=pl.when(pl.col("a_dur_us") > 0).then(pl.col("b_dur_us") / pl.col("a_dur_us")))
            .sort(pl.max_horizontal(pl.col("a_dur_us").fill_null(0), pl.col("b_dur_us").fill_null(0)), "key", "kind",
                  descending=[True, False, False]))


def diff_json(d: pl.DataFrame, label_a: str = "a", label_b: str = "b") -> dict:
    """{"labels": {...}, "rows": [{"key", "kind", "a": {count, dur_us, ...} | null, "b": ... , "delta_us", "ratio"}]}."""
    rows = []
    for r in _records(d):
        row = {"key": r["key"], "kind": r["kind"]}
        for side in ("a", "b"):
            present = r[f"{side}_count"] is not None
            row[side] = {c: r[f"{side}_{c}"] for c in SIDE_COLS} if present else None
        row["delta_us"], row["ratio"] = r["delta_us"], r["ratio"]
        rows.append(row)
    return {"labels": {"a": label_a, "b": label_b}, "rows": rows}


# ------------------------------------------------------------------ text output
def _cell(v, name_limit: int | None) -> str:
    if v is None:
        return ""
    if isinstance(v, float):
        if not math.isfinite(v):
            return ""
        a = abs(v)
        return f"{v:.3g}" if a >= 1e6 or (a and a < 0.01) else f"{v:,.2f}"
    if isinstance(v, (list, tuple)):
        return ",".join(_cell(x, name_limit) for x in v)
    if isinstance(v, dict):
        return str(v.get("name", v))
    s = str(v)
    return s if not name_limit or len(s) <= name_limit else s[: max(1, name_limit - 1)] + "…"


def render(df: pl.DataFrame, fmt: str, name_limit: int | None = None) -> str:
    """A frame as an aligned text table, Markdown or CSV (names truncated to name_limit in table/md)."""
    if fmt == "csv":
        flat_cols = [c for c, t in df.schema.items() if isinstance(t, (pl.List, pl.Struct))]
        return finite(df.drop(flat_cols)).write_csv()
    head = list(df.columns)
    body = [[_cell(v, name_limit) for v in row] for row in df.iter_rows()]
    if fmt == "md":
        esc = lambda s: s.replace("|", "\\|")
        lines = ["| " + " | ".join(head) + " |", "|" + "|".join("---" for _ in head) + "|"]
        lines += ["| " + " | ".join(esc(c) for c in r) + " |" for r in body]
        return "\n".join(lines) + "\n"
    widths = [max([len(h)] + [len(r[i]) for r in body]) for i, h in enumerate(head)]
    numeric = [df.schema[c].is_numeric() for c in head]
    fmt_row = lambda r: "  ".join(c.rjust(w) if n else c.ljust(w) for c, w, n in zip(r, widths, numeric)).rstrip()
    return "\n".join([fmt_row(head), fmt_row(["-" * w for w in widths]), *map(fmt_row, body)]) + "\n"


TEXT_COLUMNS = {  # what the table/md output shows of each section (JSON and CSV keep every column)
    "devices": ["device", "name", "busy_pct", "span_us", "busy_us", "idle_us", "gaps", "largest_gap_us"],
    "kernels": ["device", "name", "category", "count", "dur_us", "pct", "mean_us", "flops", "achieved_tflops",
                "achieved_gbps", "achieved_flops_pct", "achieved_bw_pct", "roofline_bound"],
    "transfers": ["device", "kind", "name", "count", "dur_us", "pct", "mean_us", "bytes", "achieved_gbps"],
    "streams": ["device", "stream", "busy_pct", "span_us", "busy_us", "gaps", "largest_gap_us"],
    "categories": ["device", "category", "count", "dur_us", "pct"],
    "ops": None, "launch": None, "compile": None, "regions": None, "communication": None,
}
TITLES = {"devices": "Devices: busy time (union of kernels, memcpy, memset over the span)",
          "kernels": "Kernels per device", "transfers": "Memcpy / memset", "streams": "Streams",
          "categories": "Time by category", "ops": "CPU ops (key_averages)", "launch": "Launch overhead",
          "compile": "torch.compile regions per step", "regions": "Compiled regions",
          "communication": "Communication vs compute overlap"}


def render_sections(sections: dict[str, pl.DataFrame], fmt: str, name_limit: int | None = None,
                    top: int | None = None) -> str:
    """Every non-empty section under its title (table / md)."""
    out = []
    for sec, df in sections.items():
        if not df.height:
            continue
        cols = [c for c in (TEXT_COLUMNS.get(sec) or df.columns) if c in df.columns]
        df = df.select(cols)
        if top and sec in ("kernels", "transfers", "categories", "streams"):
            df = df.group_by("device", maintain_order=True).head(top)
        elif top:
            df = df.head(top)
        title = TITLES.get(sec, sec)
        out.append((f"## {title}\n\n" if fmt == "md" else f"{title}\n") + render(df, fmt, name_limit))
    return "\n".join(out)


DIFF_TEXT_COLUMNS = ["key", "kind", "a_count", "a_dur_us", "b_count", "b_dur_us", "delta_us", "ratio",
                     "a_achieved_flops_pct", "b_achieved_flops_pct", "a_top", "b_top"]


def diff_text(d: pl.DataFrame, fmt: str, label_a: str, label_b: str, name_limit: int | None = None,
              top: int | None = None) -> str:
    top_name = lambda s: pl.col(f"{s}_top_kernels").list.first().struct.field("name")
    t = d.with_columns(a_top=top_name("a"), b_top=top_name("b")).select(DIFF_TEXT_COLUMNS)
    t = t.rename({c: c.replace("a_", f"{label_a}:", 1) if c.startswith("a_") else
                  c.replace("b_", f"{label_b}:", 1) for c in t.columns if c.startswith(("a_", "b_"))})
    return render(t.head(top) if top else t, fmt, name_limit)


# ------------------------------------------------------------------ documents (what the CLI prints)
FORMATS = ("table", "csv", "json", "md")
DEFAULT_TEXT_TOP = 20


def check_options(fmt: str, only: list[str] | None = None, group_by: str | None = None):
    """Raise UsageError for a bad format, section or grouping (before any work is done)."""
    if fmt not in FORMATS:
        raise UsageError(f"--format must be one of {', '.join(FORMATS)} (got {fmt!r})")
    unknown = [s for s in only or [] if s not in SECTIONS]
    if unknown:
        raise UsageError(f"unknown section {unknown[0]!r}; sections: {', '.join(SECTIONS)}")
    if fmt == "csv" and only and len(only) != 1:
        raise UsageError("--format csv writes one section: give one --section")
    if group_by not in GROUPINGS:
        raise UsageError(f"--group-by must be one of {', '.join(k for k in GROUPINGS if k)} (got {group_by!r})")


def _dumps(doc: dict) -> str:
    import orjson

    return orjson.dumps(doc, option=orjson.OPT_INDENT_2 | orjson.OPT_NON_STR_KEYS).decode() + "\n"


def format_analysis(flat, sections: dict[str, pl.DataFrame], fmt: str = "table", name_limit: int | None = 60,
                    top: int | None = None, only: list[str] | None = None) -> str:
    """`analyze` output. json: the whole document (every kernel unless top is given); csv: one
    section (`only`, default kernels), every column; table/md: the chosen sections (default all),
    top rows each (default 20), names cut to name_limit."""
    check_options(fmt, only)
    f = as_flat(flat)
    if fmt == "json":
        where = {"source": f.source} if f.flatten_result else {"flat_dir": str(f.path), "source": f.source}
        return _dumps({"trace": {"stem": f.stem, **where}, **analysis_json(sections, top)})
    if fmt == "csv":
        df = sections[(only or ["kernels"])[0]]
        return render(df.head(top) if top else df, "csv")
    chosen = {k: v for k, v in sections.items() if not only or k in only}
    head = f"# {f.stem}\n\n" if fmt == "md" else f"{f.stem}\n\n"
    return head + render_sections(chosen, fmt, name_limit or None, DEFAULT_TEXT_TOP if top is None else top or None)


def format_diff(d: pl.DataFrame, fmt: str = "table", label_a: str = "a", label_b: str = "b",
                name_limit: int | None = 60, top: int | None = None) -> str:
    """`diff` output: json {"labels", "rows": [...]}, or a table / md / csv of the rows."""
    check_options(fmt)
    if fmt == "json":
        return _dumps(diff_json(d.head(top) if top else d, label_a, label_b))
    if fmt == "csv":
        return render(d.head(top) if top else d, "csv")
    return diff_text(d, fmt, label_a, label_b, name_limit or None, top)
