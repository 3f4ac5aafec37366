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

All work is polars queries; the few Python loops run over nesting depth or table rows of the
declarative tables, never over events. Interval algebra used throughout:
- union: sort by start, running max of end, a new run starts where start > previous max end;
- overlap of intervals with a union: the covered length before t is a prefix sum over the union's
  runs, found with an as-of join; overlap([s, e]) = covered(e) - covered(s);
- nesting: a sweep of starts (+1) and ends (-1) per thread gives each start its depth; its
  parent is the last earlier start one level up (an as-of join), as in `pipeline.link`.
"""
from __future__ import annotations

import math
import tempfile
from contextlib import contextmanager
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Iterator

import polars as pl

from . import schema, store
from .errors import BadTrace, DatasetError, UsageError
from .categories import CATEGORIES, OTHER, Category, category_expr, with_category  # noqa: F401 (re-exported)
from .nesting import LONGER_FIRST, nesting as _nest
from .link import ANNOTATION_CAT, CPU_OP_CAT, STEP_NAME, link_gpu_ops

NS_PER_US = 1_000.0
CPU_DEVICE = -1
GPU_KINDS = ("kernel", "memcpy", "memset")
OP_CAT = f"{CPU_OP_CAT[:-2]}|user_annotation)$"  # cpu ops and user annotations (ProfilerStep#N, ...)
FRAME_CAT = f"{CPU_OP_CAT[:-2]}|user_annotation|python_function)$"  # what a stack is made of
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

# torch.compile regions (CPU side) and the gaps between them (likely graph breaks).
COMPILED_REGION = r"^(?:CompiledFunction|CompiledFunctionBackward|Torch-Compiled Region.*|## Call CompiledFxGraph.*)$"


# ------------------------------------------------------------------ loading
class Flat:
    """A flattened trace opened for reports: tables are read (and, for a directory flattened
    with --no-link, linked) once and shared by every report function."""

    def __init__(self, path: str | Path, flatten_result=None):
        self.path = Path(path)
        self.flatten_result = flatten_result  # set when `opened` flattened a trace file for us
        if not store.is_flat_dir(self.path):
            raise DatasetError(f"{self.path}: not a flattened trace (run `tracepipe flatten` first)")

    def scan(self, table: str) -> pl.LazyFrame:
        return store.scan(self.path, table)

    @cached_property
    def stem(self) -> str:
        return self.scan("trace").select("stem").collect().item() or self.path.name

    @cached_property
    def source(self) -> str | None:
        return self.scan("trace").select("source_path").collect().item()

    @cached_property
    def gpu(self) -> pl.DataFrame:
        """gpu_ops with every declared column (null where link/cost did not run), end_ns, category."""
        g = self.scan("gpu_ops")
        if "launch_event_idx" not in g.collect_schema().names():
            g = link_gpu_ops(self.path)[0].lazy()
        have = set(g.collect_schema().names())
        g = g.with_columns(pl.lit(None, POLARS_TYPES[c.type]).alias(c.name)
                           for c in schema.table("gpu_ops").columns if c.name not in have)
        return (g.filter(pl.col("ts_ns").is_not_null())
                # GPU activity without args.device is reported under device -1, not lost
                .with_columns(pl.col("dur_ns").fill_null(0), pl.col("device").fill_null(CPU_DEVICE))
                .with_columns(end_ns=pl.col("ts_ns") + pl.col("dur_ns"))
                .collect()
                .pipe(with_category))

    @cached_property
    def has_gpu(self) -> bool:
        return self.gpu.height > 0

    @cached_property
    def device_names(self) -> pl.DataFrame:
        """(device, name): the trace's name for the device, else the spec matched, else unknown."""
        devs = self.scan("devices").select("device", pl.col("name").alias("dev_name")).collect()
        listed = devs["dev_name"].drop_nulls().unique()
        only = listed[0] if listed.len() == 1 else None  # unlisted ids of a one-model machine
        ids = self.gpu.lazy().group_by("device").agg(pl.col("spec_name").drop_nulls().first()).collect()
        return (ids.join(devs, on="device", how="left")
                .select("device", name=pl.coalesce("dev_name", pl.lit(only, pl.String), "spec_name",
                                                   pl.lit("unknown")))
                .sort("device"))

    @cached_property
    def ops(self) -> pl.DataFrame:
        """CPU ops and user annotations with parent, depth and self time (nesting among themselves)."""
        return _with_self_time(_slices(self.scan("events"), OP_CAT))

    @cached_property
    def frames(self) -> pl.DataFrame:
        """CPU ops, annotations and python_function frames, nested together, with their stack path."""
        f = _with_self_time(_slices(self.scan("events"), FRAME_CAT))
        return f.join(_paths(f), on="event_idx", how="left")

    @cached_property
    def launch_threads(self) -> pl.DataFrame:
        """GPU ops linked to a launch (the columns CPU-side accounting uses) with launch_pid /
        launch_tid: the thread of their launch call."""
        g = (self.gpu.select("event_idx", "device", "kind", "name", "dur_ns", "flops", "cpu_op_event_idx",
                             "launch_event_idx", "launch_ts_ns", "launch_dur_ns")
             .filter(pl.col("launch_event_idx").is_not_null()))
        # a predicate, not a join against every event: the reader decodes only the launches' rows
        ev = (self.scan("events").filter(pl.col("event_idx").is_in(g["launch_event_idx"].implode()))
              .select(pl.col("event_idx").alias("launch_event_idx"), pl.col("pid").alias("launch_pid"),
                      pl.col("tid").alias("launch_tid")))
        return g.lazy().join(ev, on="launch_event_idx", how="inner").collect()

    @cached_property
    def activity(self) -> pl.DataFrame:
        """What the device tables run on: GPU ops, or for a CPU-only trace its CPU ops (device -1,
        stream = thread id, dur_ns = self time, end_ns = end of the op)."""
        if self.has_gpu:
            return self.gpu
        ops = self.ops.filter(~pl.col("name").str.contains(STEP_NAME))
        cpu = ops.select(
            "event_idx", "name", "ts_ns", "end_ns", "pid", "tid", device=pl.lit(CPU_DEVICE, pl.Int64),
            stream=pl.col("tid"), kind=pl.lit("cpu_op"), dur_ns=pl.col("self_ns"),
            cpu_op_event_idx="event_idx", cpu_op_name="name")
        cpu = with_category(cpu, "name", "name", "kind")
        return pl.concat([self.gpu.clear(), cpu], how="diagonal_relaxed")

    @cached_property
    def activity_devices(self) -> pl.DataFrame:
        if self.has_gpu:
            return self.device_names
        return pl.DataFrame({"device": [CPU_DEVICE], "name": ["cpu"]}) if self.ops.height else \
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
    from .flatten import flatten

    with tempfile.TemporaryDirectory(prefix="tracepipe-report-") as tmp:
        r = flatten(path, tmp, **flatten_options)
        yield Flat(r.out_dir, flatten_result=r)


def _slices(events: pl.LazyFrame, cat_regex: str) -> pl.LazyFrame:
    return (events.filter((pl.col("ph") == "X") & pl.col("cat").str.contains(cat_regex)
                          & pl.col("pid").is_not_null() & pl.col("tid").is_not_null()
                          & pl.col("ts_ns").is_not_null())
            .select("event_idx", "cat", "name", "pid", "tid", "ts_ns", dur_ns=pl.col("dur_ns").fill_null(0))
            .with_columns(end_ns=pl.col("ts_ns") + pl.col("dur_ns")))


# ------------------------------------------------------------------ interval algebra
def interval_union(iv: pl.LazyFrame | pl.DataFrame, by: list[str]) -> pl.LazyFrame:
    """Disjoint runs (by..., start_ns, end_ns) covering intervals (by..., ts_ns, end_ns)."""
    prev_end = pl.col("end_ns").cum_max().shift(1).over(by)
    return (iv.lazy().sort(*by, "ts_ns")
            .with_columns(run=(pl.col("ts_ns") > prev_end).fill_null(True).cum_sum().over(by))
            .group_by(*by, "run").agg(start_ns=pl.col("ts_ns").min(), end_ns=pl.col("end_ns").max())
            .drop("run").sort(*by, "start_ns"))


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


def range_sum(points: pl.LazyFrame, ranges: pl.LazyFrame, by: list[str], values: list[str]) -> pl.LazyFrame:
    """ranges (by..., ts_ns, end_ns, ...) with, for each value column, the sum over points
    (by..., t, values...) whose t lies in [ts_ns, end_ns] (prefix sums and two as-of joins)."""
    pre = points.sort("t").with_columns(pl.col(v).fill_null(0).cum_sum().over(by).alias(v) for v in values)
    at_end = pre.select(*by, "t", *(pl.col(v).alias(f"_hi_{v}") for v in values))
    before = pre.select(*by, "t", *(pl.col(v).alias(f"_lo_{v}") for v in values))
    out = (ranges.sort("end_ns").join_asof(at_end, left_on="end_ns", right_on="t", by=by, strategy="backward",
                                              check_sortedness=False)
           .drop("t").sort("ts_ns")
           .join_asof(before, left_on="ts_ns", right_on="t", by=by, strategy="backward", allow_exact_matches=False,
                      check_sortedness=False)
           .drop("t"))
    return out.with_columns((pl.col(f"_hi_{v}").fill_null(0) - pl.col(f"_lo_{v}").fill_null(0)).alias(v)
                            for v in values).drop(*(f"_{s}_{v}" for s in ("hi", "lo") for v in values))


def nesting(iv: pl.LazyFrame | pl.DataFrame) -> pl.LazyFrame:
    """(iv_idx, depth, parent_idx) of intervals (iv_idx, pid, tid, ts_ns, end_ns) nested per thread.

    Order at one instant: ends, then starts (longer first, then file order: identical
    intervals nest in file order), then the ends of zero-length intervals (see `pipeline.nesting`).
    """
    return _nest(iv, LONGER_FIRST).lazy()


def _beside(frame: pl.DataFrame, other: pl.DataFrame, left_on: str, right_on: str | None = None) -> pl.DataFrame:
    """frame with the other columns of `other` (at most one row per key) added by a left join in
    which only the key column takes part: the frame's own columns are not copied."""
    added = frame.select(left_on).join(other, left_on=left_on, right_on=right_on or left_on, how="left",
                                       maintain_order="left")
    return frame.with_columns(added.drop(left_on))


def _with_self_time(slices: pl.LazyFrame) -> pl.DataFrame:
    """slices with depth, parent_idx and self_ns = dur_ns minus the durations of direct children."""
    s = slices.collect()
    s = s if s["event_idx"].is_sorted() else s.sort("event_idx")  # a scan in file order is sorted
    nest = nesting(s.select(pl.col("event_idx").alias("iv_idx"), "pid", "tid", "ts_ns", "end_ns")).collect()
    s = _beside(s, nest, "event_idx", "iv_idx")
    children = s.lazy().group_by("parent_idx").agg(child_ns=pl.col("dur_ns").sum()).collect()
    s = _beside(s, children, "event_idx", "parent_idx")
    return s.with_columns(self_ns=pl.col("dur_ns") - pl.col("child_ns").fill_null(0)).drop("child_ns")


def _paths(frames: pl.DataFrame) -> pl.DataFrame:
    """(event_idx, path): the names from the outermost enclosing frame down to this one, joined
    by ';' (names cleaned like export_stacks). One join per nesting level."""
    named = frames.select("event_idx", "parent_idx", "depth",
                          clean=pl.col("name").fill_null("?").str.replace_many(STACK_TRANSLATE))
    level = named.filter(pl.col("parent_idx").is_null()).select("event_idx", path="clean")
    out, rest = [level], named.filter(pl.col("parent_idx").is_not_null())
    while rest.height and level.height:
        nxt = rest.join(level.rename({"event_idx": "parent_idx", "path": "ppath"}), on="parent_idx", how="inner")
        level = nxt.select("event_idx", path=pl.col("ppath") + ";" + pl.col("clean"))
        rest = rest.join(level, on="event_idx", how="anti")
        out.append(level)
    orphans = rest.select("event_idx", path="clean")  # parent lost to improper nesting
    return pl.concat([*out, orphans])


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
def _us(col: str) -> pl.Expr:
    return pl.col(col) / NS_PER_US


def _weighted(col: str, weight: str = "dur_ns") -> pl.Expr:
    """Mean of col weighted by weight over rows where col is known (null if none)."""
    total = pl.col(weight).filter(pl.col(col).is_not_null()).sum()
    return pl.when(total > 0).then((pl.col(col).fill_null(0) * pl.col(weight)).sum() / total)


def _sum_known(col: str) -> pl.Expr:
    return pl.when(pl.col(col).is_not_null().any()).then(pl.col(col).sum())


def cost_aggs() -> list[pl.Expr]:
    """FLOPs, bytes and achieved rates of a group of GPU ops (sums; rates over the time of the
    ops whose cost is known; % of peak duration-weighted, i.e. total FLOPs over total time)."""
    t_flops = pl.col("dur_ns").filter(pl.col("flops").is_not_null()).sum()
    t_bytes = pl.col("dur_ns").filter(pl.col("bytes").is_not_null()).sum()
    return [
        _sum_known("flops").alias("flops"),
        _sum_known("bytes").alias("bytes"),
        pl.when(t_flops > 0).then(pl.col("flops").sum() / t_flops / 1e3).alias("achieved_tflops"),
        pl.when(t_bytes > 0).then(pl.col("bytes").sum() / t_bytes).alias("achieved_gbps"),
        _weighted("achieved_flops_pct").alias("achieved_flops_pct"),
        _weighted("achieved_bw_pct").alias("achieved_bw_pct"),
        pl.col("peak_tflops").drop_nulls().first().alias("_peak_tflops"),
        pl.col("peak_bw_gbps").drop_nulls().first().alias("_peak_bw"),
    ]


def _roofline(df: pl.DataFrame) -> pl.DataFrame:
    """arithmetic_intensity and roofline_bound of aggregated rows (ridge = peak FLOP/s / bandwidth)."""
    ai = pl.when(pl.col("bytes") > 0).then(pl.col("flops") / pl.col("bytes"))
    return (df.with_columns(arithmetic_intensity=ai)
            .with_columns(roofline_bound=pl.when(pl.col("arithmetic_intensity").is_null()
                                                 | pl.col("_peak_tflops").is_null() | pl.col("_peak_bw").is_null())
                          .then(None)
                          .when(pl.col("arithmetic_intensity") * pl.col("_peak_bw") / 1e3 >= pl.col("_peak_tflops"))
                          .then(pl.lit("compute")).otherwise(pl.lit("memory")))
            .drop("_peak_tflops", "_peak_bw"))


def _name_table(rows: pl.DataFrame, keys: list[str]) -> pl.DataFrame:
    """Per keys: count, time, share of the device's time, cost, top CPU op, category."""
    out = (rows.group_by(*keys).agg(
        category=pl.col("category").mode().first(),
        count=pl.len(),
        dur_us=_us("dur_ns").sum(),
        mean_us=_us("dur_ns").mean(),
        min_us=_us("dur_ns").min(),
        max_us=_us("dur_ns").max(),
        *cost_aggs(),
        cpu_op=pl.col("cpu_op_name").drop_nulls().mode().first(),
    ))
    return (_roofline(out)
            .with_columns(pct=100 * pl.col("dur_us") / pl.col("dur_us").sum().over("device"))
            .select(*keys, "category", "count", "dur_us", "pct", pl.exclude(*keys, "category", "count", "dur_us", "pct"))
            .sort("device", "dur_us", descending=[False, True]))


def _name_rows(f: Flat) -> pl.DataFrame:
    """The activity columns `_name_table` reads. Reports select the columns they use before
    filtering or grouping (eagerly: the in-memory engine's float results are the reference ones):
    a filter or group-by of the whole GPU-op table would copy every column."""
    return f.activity.select("device", "kind", "name", "category", "dur_ns", "flops", "bytes", "achieved_flops_pct",
                             "achieved_bw_pct", "peak_tflops", "peak_bw_gbps", "cpu_op_name")


def kernel_table(flat, kinds: tuple[str, ...] = ("kernel",)) -> pl.DataFrame:
    """Per device, per kernel name: count (every launch), dur_us, mean/min/max, pct of the device's
    kernel time, flops, bytes, achieved TFLOP/s and GB/s, achieved % of peak, arithmetic
    intensity, roofline bound, category, most common launching op. CPU-only traces: per CPU op."""
    f = as_flat(flat)
    rows = _name_rows(f).filter(pl.col("kind").is_in(list(kinds) + ["cpu_op"]))
    return _name_table(rows, ["device", "name"])


def transfer_table(flat) -> pl.DataFrame:
    """kernel_table of memcpy / memset activity (with its kind)."""
    f = as_flat(flat)
    rows = _name_rows(f).filter(pl.col("kind").is_in(["memcpy", "memset"]))
    return _name_table(rows, ["device", "kind", "name"])


def _span_stats(runs: pl.LazyFrame, by: list[str]) -> pl.LazyFrame:
    gap = pl.col("start_ns") - pl.col("end_ns").shift(1)
    return (runs.sort(*by, "start_ns")
            .group_by(*by, maintain_order=True).agg(
                start_ns=pl.col("start_ns").min(), end_ns=pl.col("end_ns").max(),
                busy_ns=(pl.col("end_ns") - pl.col("start_ns")).sum(),
                gaps=(pl.len() - 1).cast(pl.Int64), largest_gap_ns=gap.max().fill_null(0))
            .with_columns(span_ns=pl.col("end_ns") - pl.col("start_ns"))
            .select(*by, span_us=_us("span_ns"), busy_us=_us("busy_ns"),
                    busy_pct=pl.when(pl.col("span_ns") > 0).then(100 * pl.col("busy_ns") / pl.col("span_ns"))
                    .otherwise(0.0),
                    idle_us=_us("span_ns") - _us("busy_ns"), gaps="gaps", largest_gap_us=_us("largest_gap_ns"),
                    start_ns="start_ns", end_ns="end_ns"))


def busy(flat, per_stream: bool = False) -> pl.DataFrame:
    """Per device (or device and stream): the union of all activity intervals (kernels, memcpy,
    memset) over the span from the first start to the last end: busy_us, busy_pct, idle_us,
    idle gaps (count, largest)."""
    f = as_flat(flat)
    by = ["device", "stream"] if per_stream else ["device"]
    act = f.activity.lazy().filter(pl.col("device").is_not_null()).select(*by, "ts_ns", "end_ns")
    stats = _span_stats(interval_union(act, by), by).collect()
    if per_stream:
        return stats.sort(by)
    return stats.join(f.activity_devices, on="device", how="left").select("device", "name", pl.exclude("device", "name"))


def categories(flat) -> pl.DataFrame:
    """Per device and category: ops, dur_us and pct of the device's summed activity time."""
    f = as_flat(flat)
    return (f.activity.select("device", "category", "dur_ns")
            .group_by("device", "category").agg(count=pl.len(), dur_us=_us("dur_ns").sum())
            .with_columns(pct=100 * pl.col("dur_us") / pl.col("dur_us").sum().over("device"))
            .sort("device", "dur_us", descending=[False, True]))


# ------------------------------------------------------------------ CPU ops
GROUPINGS = {None: [], "input-shape": ["input_shape"], "stack": ["stack"], "overload": ["overload"]}


def _op_args(f: Flat, ops: pl.DataFrame, **from_args: pl.Expr) -> pl.DataFrame:
    """ops with columns computed from their events' args_json (`ARGS`), evaluated while the events
    are read: only these ops' rows are decoded, and their args are never all in memory."""
    values = (f.scan("events").filter(pl.col("event_idx").is_in(ops["event_idx"].implode()))
              .select("event_idx", **from_args).collect(engine="streaming"))
    return ops.join(values, on="event_idx", how="left", maintain_order="left")


ARGS = pl.col("args_json")


def _op_keys(f: Flat, ops: pl.DataFrame, group_by: str | None, stack_n: int) -> pl.DataFrame:
    check_options("table", group_by=group_by)
    if group_by == "input-shape":
        return _op_args(f, ops, input_shape=ARGS.str.json_path_match("$['Input Dims']").fill_null(""))
    if group_by == "overload":
        suffix = pl.col("name").str.extract(r"^\w[\w.]*::\w+\.(\w+)$", 1)
        return (_op_args(f, ops, listed=ARGS.str.json_path_match("$['Overload Name']"))
                .with_columns(overload=pl.coalesce("listed", suffix, pl.lit(""))).drop("listed"))
    if group_by == "stack":
        recorded = ARGS.str.json_path_match("$['Call stack']").str.split(";").list.head(stack_n)
        parents = f.frames.select("event_idx", nested=pl.col("path").str.split(";"))
        nested = (pl.col("nested").list.slice(0, pl.col("nested").list.len() - 1)
                  .list.reverse().list.head(stack_n))  # innermost enclosing frames first
        return (_op_args(f, ops, recorded=recorded).join(parents, on="event_idx", how="left")
                .with_columns(stack=pl.coalesce("recorded", nested).list.join(" <- ").fill_null(""))
                .drop("nested", "recorded"))
    return ops.with_columns(name=pl.col("name").str.replace(OVERLOAD_SUFFIX, "$1"))


def _device_time(f: Flat, ops: pl.DataFrame) -> pl.DataFrame:
    """ops with self_device_ns / self flops (GPU ops they launched directly) and device_ns /
    kernels (GPU ops launched anywhere inside them on their thread)."""
    g = f.launch_threads
    own = g.group_by("cpu_op_event_idx").agg(self_device_ns=pl.col("dur_ns").sum(), flops=_sum_known("flops"))
    points = g.lazy().select(pid="launch_pid", tid="launch_tid", t=pl.col("launch_ts_ns"), device_ns=pl.col("dur_ns"),
                             kernels=pl.lit(1, pl.Int64))
    incl = range_sum(points, ops.lazy().select("event_idx", "pid", "tid", "ts_ns", "end_ns"),
                     ["pid", "tid"], ["device_ns", "kernels"]).select("event_idx", "device_ns", "kernels")
    return (_beside(_beside(ops, own, "event_idx", "cpu_op_event_idx"), incl.collect(), "event_idx")
            .with_columns(pl.col("self_device_ns", "device_ns", "kernels").fill_null(0)))


def op_table(flat, group_by: str | None = None, sort: str | None = None, stack_n: int = 5) -> pl.DataFrame:
    """Like torch.profiler's key_averages().table(): per op name (and input shape, stack or
    overload): calls, self/total CPU time, self/total device time (its GPU ops; total includes
    those of the ops it calls), kernels launched, FLOPs of its own kernels.

    sort: any output column (descending); default self_device_us with GPU activity, else self_cpu_us.
    """
    f = as_flat(flat)
    keys = ["name", *GROUPINGS.get(group_by, [])]
    ops = _device_time(f, _op_keys(f, f.ops, group_by, stack_n))
    ops = ops.select(*keys, "self_ns", "dur_ns", "self_device_ns", "device_ns", "kernels", "flops")
    out = (ops.group_by(keys).agg(
        calls=pl.len(),
        self_cpu_us=_us("self_ns").sum(),
        cpu_total_us=_us("dur_ns").sum(),
        cpu_avg_us=_us("dur_ns").mean(),
        self_device_us=_us("self_device_ns").sum(),
        device_total_us=_us("device_ns").sum(),
        kernels=pl.col("kernels").sum(),
        flops=_sum_known("flops"),
    ).with_columns(self_cpu_pct=100 * pl.col("self_cpu_us") / pl.col("self_cpu_us").sum(),
                   self_device_pct=100 * pl.col("self_device_us") / pl.col("self_device_us").sum()))
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
    f = as_flat(flat)
    fr = f.frames
    if metric == "self_device_time_total":
        dev = f.gpu.select("cpu_op_event_idx", "dur_ns").group_by("cpu_op_event_idx").agg(v=pl.col("dur_ns").sum())
        fr = fr.join(dev, left_on="event_idx", right_on="cpu_op_event_idx", how="inner")
    else:
        fr = fr.with_columns(v=pl.col("self_ns"))
    return (fr.group_by(pl.col("path").alias("stack")).agg(value=(pl.col("v").sum() / NS_PER_US).floor().cast(pl.Int64))
            .filter(pl.col("value") > 0).sort("stack"))


def stack_lines(stacks: pl.DataFrame) -> str:
    return "".join(f"{s} {v}\n" for s, v in stacks.iter_rows())


# ------------------------------------------------------------------ launches, compile, comms
def _percentiles(col: str, prefix: str) -> list[pl.Expr]:
    x = pl.col(col) / NS_PER_US
    return [x.quantile(0.5).alias(f"{prefix}_p50_us"), x.quantile(0.9).alias(f"{prefix}_p90_us"),
            x.quantile(0.99).alias(f"{prefix}_p99_us"), x.max().alias(f"{prefix}_max_us")]


def launch_overhead(flat) -> pl.DataFrame:
    """Per device, over kernels linked to their launch call: the launch call's duration, the delay
    from the launch call's start to the kernel's start (p50/p90/p99/max), and the share of
    kernels that ran shorter than their launch call took."""
    f = as_flat(flat)
    k = (f.gpu.select("device", "kind", "ts_ns", "dur_ns", "launch_ts_ns", "launch_dur_ns")
         .filter((pl.col("kind") == "kernel") & pl.col("launch_ts_ns").is_not_null()))
    return (k.with_columns(delay_ns=pl.col("ts_ns") - pl.col("launch_ts_ns"))
            .group_by("device").agg(
                kernels=pl.len(),
                *_percentiles("launch_dur_ns", "launch"),
                *_percentiles("delay_ns", "launch_to_start"),
                shorter_than_launch_pct=100 * (pl.col("dur_ns") < pl.col("launch_dur_ns")).mean())
            .sort("device"))


def _steps(f: Flat) -> pl.DataFrame:
    """ProfilerStep#N intervals (step, ts_ns, end_ns); the whole CPU span as step null if none."""
    steps = (f.ops.filter(pl.col("cat").str.contains(ANNOTATION_CAT) & pl.col("name").str.contains(STEP_NAME))
             .select(step=pl.col("name").str.extract(STEP_NAME, 1).cast(pl.Int64), ts_ns="ts_ns", end_ns="end_ns"))
    if steps.height or not f.ops.height:
        return steps.sort("ts_ns")
    return f.ops.select(step=pl.lit(None, pl.Int64), ts_ns=pl.col("ts_ns").min(), end_ns=pl.col("end_ns").max())


def compiled_regions(flat) -> pl.DataFrame:
    """torch.compile regions on the CPU side (CompiledFunction, CompiledFunctionBackward,
    Torch-Compiled Region, ## Call CompiledFxGraph ...): per name, count and total time."""
    f = as_flat(flat)
    r = f.ops.filter(pl.col("name").str.contains(COMPILED_REGION))
    return (r.group_by("name").agg(count=pl.len(), dur_us=_us("dur_ns").sum())
            .sort("dur_us", descending=True))


def compile_view(flat) -> pl.DataFrame:
    """Per ProfilerStep: compiled regions started in it, time covered by compiled regions (their
    union over all threads), time outside them, and the gaps between consecutive compiled runs
    inside the step (likely graph breaks: eager code between compiled graphs). Empty when the
    trace has no compiled regions."""
    f = as_flat(flat)
    regions = f.ops.filter(pl.col("name").str.contains(COMPILED_REGION)).select("ts_ns", "end_ns", k=pl.lit(0))
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
           .select("step", step_us=_us("end_ns") - _us("ts_ns"), regions=pl.col("regions").fill_null(0),
                   compiled_us=_us("overlap_ns"), outside_us=(_us("end_ns") - _us("ts_ns")) - _us("overlap_ns"),
                   compiled_pct=pl.when(pl.col("end_ns") > pl.col("ts_ns"))
                   .then(100 * pl.col("overlap_ns") / (pl.col("end_ns") - pl.col("ts_ns"))),
                   breaks=pl.col("breaks").fill_null(0), break_us=_us("break_ns").fill_null(0.0),
                   largest_break_us=_us("largest_ns").fill_null(0.0)))
    return out.sort("step").collect()


def communication(flat) -> pl.DataFrame:
    """Per device with collective kernels (category communication): their count, summed time,
    busy time (union), the part of it overlapped by compute kernels (any other kernel on the
    device, interval intersection) and the exposed rest."""
    f = as_flat(flat)
    k = f.gpu.lazy().filter(pl.col("kind") == "kernel")
    is_comm = pl.col("category") == "communication"
    comm_runs = interval_union(k.filter(is_comm).select("device", "ts_ns", "end_ns"), ["device"])
    compute_runs = interval_union(k.filter(~is_comm).select("device", "ts_ns", "end_ns"), ["device"])
    overlap = (covered_overlap(comm_runs.rename({"start_ns": "ts_ns"}), compute_runs, ["device"])
               .group_by("device").agg(comm_busy_ns=(pl.col("end_ns") - pl.col("ts_ns")).sum(),
                                       overlap_ns=pl.col("overlap_ns").sum()))
    sums = k.filter(is_comm).group_by("device").agg(comm_kernels=pl.len(), comm_ns=pl.col("dur_ns").sum())
    return (sums.join(overlap, on="device", how="left")
            .select("device", "comm_kernels", comm_us=_us("comm_ns"), comm_busy_us=_us("comm_busy_ns"),
                    overlapped_us=_us("overlap_ns"),
                    overlap_pct=pl.when(pl.col("comm_busy_ns") > 0).then(100 * pl.col("overlap_ns") / pl.col("comm_busy_ns")),
                    exposed_us=_us("comm_busy_ns") - _us("overlap_ns"))
            .sort("device").collect())


# ------------------------------------------------------------------ analyze (all sections)
SECTIONS = ("devices", "kernels", "transfers", "streams", "categories", "ops", "launch", "compile",
            "regions", "communication")


def analyze(flat, group_by: str | None = None, sort: str | None = None) -> dict[str, pl.DataFrame]:
    """Every report of one trace, by section name (see `SECTIONS`)."""
    f = as_flat(flat)
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
    act = f.activity
    by_op = pl.col("cpu_op_name").is_not_null() & (pl.col("kind").is_in(["kernel", "cpu_op"]))
    keyed = (act.lazy().with_columns(
        key=pl.when(by_op).then(normalize_op(pl.col("cpu_op_name"))).otherwise(normalize_kernel(pl.col("name"))),
        key_kind=pl.when(by_op).then(pl.lit("op")).otherwise(pl.col("kind")))
        .select("key", "key_kind", "name", "kind", "cpu_op_name", "cpu_op_event_idx", "device", "dur_ns", "flops",
                "bytes", "achieved_flops_pct", "achieved_bw_pct", "peak_tflops", "peak_bw_gbps")
        .collect())  # the columns used only: grouping the whole table would copy every column
    top = (keyed.group_by("key", "key_kind", "name").agg(n=pl.len(), d=pl.col("dur_ns").sum())
           .sort("d", descending=True)
           .group_by("key", "key_kind", maintain_order=True)
           .agg(top_kernels=pl.struct(name="name", count="n", dur_us=pl.col("d") / NS_PER_US).head(3)))
    rows = keyed.group_by("key", "key_kind").agg(
        count=pl.len(),
        calls=pl.col("cpu_op_event_idx").filter(by_op).n_unique().cast(pl.Int64),
        dur_us=_us("dur_ns").sum(),
        *cost_aggs(),
        kernel_names=pl.col("name").n_unique().cast(pl.Int64),
        devices=pl.col("device").unique().sort(),
    )
    return _roofline(rows).join(top, on=["key", "key_kind"], how="left")


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
            .sort(pl.max_horizontal(pl.col("a_dur_us").fill_null(0), pl.col("b_dur_us").fill_null(0)), "key",
                  descending=[True, False]))


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
