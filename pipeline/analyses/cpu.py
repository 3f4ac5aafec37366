"""cpu: the CPU sweep, a trace's CPU ops and annotations nested per thread and folded per op key.

`cpu_sweep` reads the ops (for stacks, python_function frames too) window by window in time
(`sweep.SliceSweep`): each op gets its parent and self time and the GPU time it launched, itself and
anywhere inside it (`Launches`); `CpuTally` folds the final ones per op key (`GROUPINGS`) or per stack
and keeps the ProfilerSteps and compiled regions. A trace without GPU ops gets its device activity's
totals from the ops' self times (device -1).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

import polars as pl

from pipeline.analyses.activity import CPU_DEVICE, NAME_KEYS, Activity, ActivityTally, empty_activity
from pipeline.analyses.names import OVERLOAD_SUFFIX
from pipeline.analyses.sweep import (
    Nest,
    Paths,
    SliceSweep,
    ThreadPrefix,
    beside,
    float_sum,
    fold,
    read,
    read_among,
    time_windows,
    within,
)
from pipeline.cost.categories import CategoryMemo, with_category
from pipeline.errors import UsageError
from pipeline.kineto import COMPILED_REGION, FRAME_CAT, OP_CAT, STEP_CAT, STEP_NAME
from pipeline.read.durations import SLICE

if TYPE_CHECKING:
    from pipeline.analyses.flat import Flat

STACK_TRANSLATE = {" ": "_", ";": "_", "\t": "_", "\n": "_"}  # as torch's export_stacks
# How `op_table` may group ops besides their name.
GROUPINGS = {None: [], "input-shape": ["input_shape"], "stack": ["stack"], "overload": ["overload"]}


def check_grouping(group_by: str | None):
    if group_by not in GROUPINGS:
        raise UsageError(f"--group-by must be one of {', '.join(k for k in GROUPINGS if k)} (got {group_by!r})")


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


OP_SUMS = ["self_ns", "dur_ns", "self_device_ns", "device_ns", "kernels"]
OP_FOLD = [pl.col("calls", *OP_SUMS, "flops_ops").sum(), float_sum("flops").alias("flops")]
ARGS = pl.col("args_json")
GROUP_ARGS = {  # what a grouping reads from an op's args (the rest of its key comes from the op)
    "input-shape": {"input_shape": ARGS.str.json_path_match("$['Input Dims']").fill_null("")},
    "overload": {"listed_overload": ARGS.str.json_path_match("$['Overload Name']")},
    "stack": {"recorded_stack": ARGS.str.json_path_match("$['Call stack']")},
}


def is_slice(cat_regex: str) -> pl.Expr:
    """Complete events of these categories on a thread, with a start."""
    return (
        SLICE
        & pl.col("cat").str.contains(cat_regex)
        & pl.col("pid").is_not_null()
        & pl.col("tid").is_not_null()
        & pl.col("ts_ns").is_not_null()
    )


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
        self.in_window = f.time_filter()  # GPU ops outside the analysis window are not counted

    def enter(self, window):
        """The launches in the window: (pid, tid) of the launch call, its start, the GPU op's duration."""
        launched = pl.col("launch_event_idx").is_not_null() & pl.col("ts_ns").is_not_null()
        g = read(
            self.gpu,
            launched & within(window, "launch_ts_ns") & self.in_window,
            ["launch_event_idx", "launch_ts_ns", pl.col("dur_ns").fill_null(0)],
        )
        threads = read_among(
            self.events, pl.lit(True), "event_idx", g["launch_event_idx"], ["event_idx", "pid", "tid"], wide=True
        )
        points = g.join(threads, left_on="launch_event_idx", right_on="event_idx", how="inner")
        self.prefix.enter(
            points.select("pid", "tid", t="launch_ts_ns", device_ns="dur_ns", kernels=pl.lit(1, pl.Int64))
        )

    def own(self, owned: pl.DataFrame, per_op: bool) -> pl.DataFrame:
        """Ops starting in the window with the launch sums before their start and, if `per_op`,
        their own GPU ops' sums (else none: they are summed per op name from `Flat.activity`)."""
        before = self.prefix.at(owned, "ts_ns", inclusive=False)
        owned = owned.with_columns(before[v].alias(f"before_{v}") for v in self.VALUES)
        if not per_op:
            return _none_own(owned)
        launched = pl.col("launch_event_idx").is_not_null() & pl.col("ts_ns").is_not_null()
        if "cpu_op_link" in pl.scan_parquet(self.gpu).collect_schema().names():  # not a captured op: another trace's
            launched &= (pl.col("cpu_op_link") != "graph_capture").fill_null(True)
        g = read_among(
            self.gpu,
            launched,
            "cpu_op_event_idx",
            owned["event_idx"],
            ["event_idx", "cpu_op_event_idx", pl.col("dur_ns").fill_null(0), "flops"],
        )
        # sorted by op: each op's few values are added in file order, by one thread
        own = (
            g.sort("cpu_op_event_idx", "event_idx")
            .group_by("cpu_op_event_idx", maintain_order=True)
            .agg(
                self_device_ns=pl.col("dur_ns").sum(),
                flops=pl.col("flops").sum(),
                flops_n=pl.col("flops").count().cast(pl.Int64),
                own_n=pl.len().cast(pl.Int64),
            )
        )
        mine = owned.select("event_idx").join(
            own, left_on="event_idx", right_on="cpu_op_event_idx", how="left", maintain_order="left"
        )
        return owned.with_columns(
            mine["self_device_ns"].fill_null(0), mine["flops"], mine["flops_n"].fill_null(0), mine["own_n"].fill_null(0)
        )

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
    own = (
        activity.names.filter(pl.col("cpu_op_name").is_not_null())
        .sort(NAME_KEYS)
        .with_columns(name=pl.col("cpu_op_name").str.replace(OVERLOAD_SUFFIX, "$1"))
        .group_by("name", maintain_order=True)
        .agg(self_device_ns=pl.col("dur_ns").sum(), flops=float_sum("flops"), flops_ops=pl.col("flops_n").sum())
    )
    mine = beside(ops, own, "name")
    return ops.with_columns(mine["self_device_ns"].fill_null(0), mine["flops"], mine["flops_ops"].fill_null(0))


def _with_args(f: Flat, owned: pl.DataFrame, group_by: str | None) -> pl.DataFrame:
    """Owned ops with the columns their grouping reads from args: only their rows' args are decoded."""
    if group_by not in GROUP_ARGS:
        return owned
    values = read_among(
        f.path / "events.parquet",
        pl.lit(True),
        "event_idx",
        owned.filter(IS_OP)["event_idx"],
        ["event_idx", *(v.alias(k) for k, v in GROUP_ARGS[group_by].items())],
        wide=True,
    )
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

    def __init__(self, group_by: str | None, stack_n: int, frames: bool, activity: ActivityTally | None, paths: Paths):
        self.group_by, self.stack_n, self.frames, self.activity = group_by, stack_n, frames, activity
        self.paths = paths
        self.keys = ["name", *GROUPINGS[group_by]]
        self.ops: pl.DataFrame | None = None
        self.stacks: pl.DataFrame | None = None
        self.steps: list[pl.DataFrame] = []
        self.regions: list[pl.DataFrame] = []
        self.span: tuple[int | None, int | None, int] = (None, None, 0)
        self.memo = CategoryMemo()

    def add_owned(self, ops: pl.DataFrame):
        """Ops (and annotations) starting in the window."""
        self.steps.append(
            ops.filter(pl.col("cat").str.contains(STEP_CAT) & IS_STEP).select(
                step=pl.col("name").str.extract(STEP_NAME, 1).cast(pl.Int64), ts_ns="ts_ns", end_ns="end_ns"
            )
        )
        self.regions.append(
            ops.filter(pl.col("name").str.contains(COMPILED_REGION)).select("name", "ts_ns", "end_ns", "dur_ns")
        )
        first, last, n = self.span
        if ops.height:
            start, end = ops["ts_ns"].min(), ops["end_ns"].max()
            assert isinstance(start, int | None) and isinstance(end, int | None)  # int64 ns, null if all are
            first = min(v for v in (first, start) if v is not None)
            last = max(v for v in (last, end) if v is not None)
        self.span = (first, last, n + ops.height)
        if self.activity is not None:
            self.activity.add_intervals(_cpu_activity(ops.filter(~IS_STEP), self.memo))

    def add_final(self, final: pl.DataFrame):
        """Slices whose children have all been seen (device_ns, kernels set)."""
        ops = (final.filter(IS_OP) if self.frames else final).with_columns(
            self_ns=pl.col("dur_ns") - pl.col("child_op_ns")
        )
        if self.group_by == "stack":
            ops = ops.with_columns(beside(ops, self._nested_stacks(ops["path_id"]), "path_id")["nested_stack"])
        keyed = _op_keys(ops, self.group_by, self.stack_n)
        part = keyed.group_by(self.keys, maintain_order=True).agg(  # positional sums first, as Python passes them
            *(pl.col(c).sum() for c in OP_SUMS),
            calls=pl.len().cast(pl.Int64),
            flops=float_sum("flops"),
            flops_ops=(pl.col("flops_n") > 0).sum().cast(pl.Int64),
        )
        if self.group_by is None:  # names lose their overload suffix: on the few rows of the part
            part = part.with_columns(name=pl.col("name").str.replace(OVERLOAD_SUFFIX, "$1"))
        self.ops = fold(self.ops, part, self.keys, OP_FOLD)
        if self.frames:
            stacks = final.group_by("path_id", maintain_order=True).agg(
                self_ns=(pl.col("dur_ns") - pl.col("child_frame_ns")).sum(), device_ns=pl.col("self_device_ns").sum()
            )
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
            "path_id", nested_stack=nested.list.join(" <- ")
        )

    def result(self) -> CpuOps:
        steps = (
            pl.concat(self.steps)
            if self.steps
            else pl.DataFrame(schema={"step": pl.Int64, "ts_ns": pl.Int64, "end_ns": pl.Int64})
        )
        regions = (
            pl.concat(self.regions)
            if self.regions
            else pl.DataFrame(schema={"name": pl.String, "ts_ns": pl.Int64, "end_ns": pl.Int64, "dur_ns": pl.Int64})
        )
        stacks = (
            None
            if self.stacks is None
            else self.stacks.select(
                path=self.paths.strings(self.stacks["path_id"]), self_ns="self_ns", device_ns="device_ns"
            )
        )
        assert self.ops is not None, "a sweep has at least one window"
        return CpuOps(
            ops=self.ops,
            steps=steps,
            regions=regions,
            span=self.span,
            stacks=stacks,
            activity=None if self.activity is None else self.activity.result(),
        )


def _cpu_activity(ops: pl.DataFrame, memo: CategoryMemo) -> pl.DataFrame:
    """CPU ops as the activity of a trace without GPU ops: device -1, stream = thread, each op's
    self time as its duration (when known), category from its name."""
    rows = ops.select(
        "event_idx",
        "name",
        "ts_ns",
        "end_ns",
        device=pl.lit(CPU_DEVICE, pl.Int64),
        stream=pl.col("tid"),
        kind=pl.lit("cpu_op"),
        cpu_op_name="name",
        dur_ns=pl.col("self_ns") if "self_ns" in ops.columns else pl.col("dur_ns"),
    )
    missing = {c: t for c, t in empty_activity().schema.items() if c not in rows.columns and c != "category"}
    rows = rows.with_columns(pl.lit(None, t).alias(c) for c, t in missing.items())
    return with_category(rows, "name", "name", "kind", memo=memo)


def cpu_sweep(f: Flat, group_by: str | None, stack_n: int, frames: bool, activity: Callable[[], Activity]) -> CpuOps:
    """The totals of a trace's CPU ops and annotations (with python_function frames if `frames`),
    read window by window in time: parents and self times among ops (and among frames), the GPU
    time they launched, their keys for an op grouping."""
    events = f.path / "events.parquet"
    where = is_slice(FRAME_CAT if frames else OP_CAT) & f.time_filter()
    nests = (Nest("op", IS_OP if frames else None), *((Nest("frame"),) if frames else ()))
    launches = Launches(f) if f.has_gpu else None

    def extend(owned: pl.DataFrame, window) -> pl.DataFrame:
        if launches is None:
            return _with_args(f, _no_launches(owned), group_by)
        launches.enter(window)
        return _with_args(f, launches.own(owned, per_op=frames or group_by is not None), group_by)

    label = pl.col("name").fill_null("?").str.replace_many(STACK_TRANSLATE)
    slices = SliceSweep(
        events,
        where,
        nests,
        time_windows(events, where),
        extend,
        at_end=launches.inside if launches else None,
        path=("frame", label) if frames else None,
    )
    tally = CpuTally(group_by, stack_n, frames, None if f.has_gpu else ActivityTally(), slices.paths)
    for _, owned, final in slices.windows():
        tally.add_owned(owned.filter(IS_OP) if frames else owned)
        zero = pl.lit(0, pl.Int64)
        tally.add_final(final if launches else final.with_columns(device_ns=zero, kernels=zero))
    totals = tally.result()
    if launches is None or frames or group_by is not None:
        return totals
    return replace(totals, ops=_with_own_by_name(totals.ops, activity()))
