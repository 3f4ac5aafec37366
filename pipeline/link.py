"""link: GPU activity -> CPU launch -> CPU op, and their context (step, annotation, module).

All joins are polars lazy queries over the flattened Parquet files; no Python loops over events.

Rules (see README, "Link rules"):
1. launch, by flow: a flow's `s` endpoint binds to the runtime/driver slice that starts at the
   same (pid, tid, ts) and its `f` endpoint to the GPU activity at the same (pid, tid, ts); `s`
   and `f` pair by (cat, id). A flow link whose two sides carry different correlation ids is
   rejected.
2. launch, by correlation: GPU activity still unlinked joins the first runtime/driver slice with
   the same `args.correlation`.
3. cpu_op, by nesting: the innermost `cpu_op` on the launch's thread whose interval contains the
   launch start. Innermost is found without loops: the nesting depth at every point of a thread
   is a running count of interval starts minus ends; the innermost op containing a launch at
   depth d is the last op at depth d that started before it (an as-of join). Identical
   intervals nest in file order (the later event is the inner one).
4. cpu_op, by External id: only for launches no cpu_op contains, and only in layouts where a
   kernel's External id is not simply its correlation id (older traces).
"""
from __future__ import annotations

from pathlib import Path

import polars as pl

from . import schema

LAUNCH_CATS = ("cuda_runtime", "cuda_driver", "runtime", "driver", "hip_runtime", "hip_driver", "mtia_runtime",
               "xpu_runtime", "privateuse1_runtime")
CPU_OP_CATS = ("cpu_op", "operator")
ANNOTATION_CATS = ("user_annotation",)
MODULE_CATS = ("python_function",)


def _cat_regex(*cats: str) -> str:
    """A case-insensitive regex matching exactly one of the categories."""
    return "(?i)^(" + "|".join(cats) + ")$"


LAUNCH_CAT, CPU_OP_CAT, ANNOTATION_CAT = _cat_regex(*LAUNCH_CATS), _cat_regex(*CPU_OP_CATS), _cat_regex(*ANNOTATION_CATS)
LINK_FLOW_CATS = ("ac2g", "async_cpu_to_gpu", "async_gpu")
STEP_NAME = r"^ProfilerStep#(\d+)$"
MODULE_PREFIX = "nn.Module: "

_EVENT_COLS = ["event_idx", "ph", "cat", "name", "pid", "tid", "ts_ns", "dur_ns", "correlation", "external_id"]


LAUNCH, CPU_OP, ANNOTATION, MODULE = 0, 1, 2, 3


def cpu_slices(events: pl.LazyFrame, gpu_correlations: pl.Series | None = None) -> pl.DataFrame:
    """The CPU slices linking needs, read once and kept compact: a `kind` code instead of the
    category and names as categoricals (launch and op names repeat millions of times). With
    `gpu_correlations`, only runtime calls that share a correlation id with some GPU activity
    are kept (most runtime calls launch nothing)."""
    kind = (pl.when(pl.col("cat").str.contains(LAUNCH_CAT)).then(LAUNCH)
            .when(pl.col("cat").str.contains(CPU_OP_CAT)).then(CPU_OP)
            .when(pl.col("cat").str.contains(ANNOTATION_CAT)).then(ANNOTATION)
            .when(pl.col("cat").str.contains(_cat_regex(*MODULE_CATS))
                  & pl.col("name").str.starts_with(MODULE_PREFIX)).then(MODULE))
    return (events.select(_EVENT_COLS)
            .filter((pl.col("ph") == "X") & pl.col("pid").is_not_null() & pl.col("tid").is_not_null()
                    & pl.col("ts_ns").is_not_null())
            .with_columns(kind=kind.cast(pl.Int8))
            .filter(pl.col("kind").is_not_null())
            .filter(pl.lit(True) if gpu_correlations is None else
                    (pl.col("kind") != LAUNCH) | pl.col("correlation").is_in(gpu_correlations.implode()))
            .select("event_idx", "kind", pl.col("name").cast(pl.Categorical), "pid", "tid", "ts_ns",
                    end_ns=pl.col("ts_ns") + pl.col("dur_ns").fill_null(0), dur_ns="dur_ns",
                    correlation="correlation", external_id="external_id")
            .collect())


def launch_links(launch_slices: pl.LazyFrame, gpu: pl.LazyFrame, flows: pl.LazyFrame) -> pl.LazyFrame:
    """event_idx of each GPU op -> launch_event_idx, launch_link ('flow' | 'correlation')."""
    launches = launch_slices.select(
        pl.col("event_idx").alias("launch_event_idx"), "pid", "tid", "ts_ns",
        pl.col("correlation").alias("launch_corr"))
    fl = (flows.filter(pl.col("cat").is_in(LINK_FLOW_CATS) & pl.col("id").is_not_null())
          .select("cat", "id", "ph", "pid", "tid", "ts_ns"))
    starts = (fl.filter(pl.col("ph") == "s")
              .join(launches, on=["pid", "tid", "ts_ns"], how="inner")
              .group_by("cat", "id").agg(pl.col("launch_event_idx").min(), pl.col("launch_corr").first()))
    g = gpu.select("event_idx", "pid", "tid", "ts_ns", "correlation")
    ends = (fl.filter(pl.col("ph") == "f")
            .join(g, on=["pid", "tid", "ts_ns"], how="inner")
            .select("cat", "id", "event_idx", "correlation"))
    by_flow = (ends.join(starts, on=["cat", "id"], how="inner")
               .filter(pl.col("correlation").is_null() | pl.col("launch_corr").is_null()
                       | (pl.col("correlation") == pl.col("launch_corr")))
               .group_by("event_idx").agg(pl.col("launch_event_idx").min())
               .with_columns(launch_link=pl.lit("flow")))
    first_by_corr = (launches.filter(pl.col("launch_corr").is_not_null())
                     .group_by("launch_corr").agg(pl.col("launch_event_idx").min()))
    by_corr = (g.join(by_flow.select("event_idx"), on="event_idx", how="anti")
               .join(first_by_corr, left_on="correlation", right_on="launch_corr", how="inner")
               .select("event_idx", "launch_event_idx", launch_link=pl.lit("correlation")))
    return pl.concat([by_flow.select("event_idx", "launch_event_idx", "launch_link"), by_corr])


def innermost_enclosing(points: pl.LazyFrame, intervals: pl.LazyFrame, outermost: bool = False) -> pl.LazyFrame:
    """For each point (point_id, pid, tid, t) the innermost (or outermost) interval containing it.

    intervals: (iv_idx, pid, tid, ts_ns, end_ns) properly nested per thread. Returns
    (point_id, iv_idx) for points inside at least one interval.
    """
    iv = intervals.select("iv_idx", "pid", "tid", "ts_ns", "end_ns")
    zero_len = pl.col("ts_ns") == pl.col("end_ns")
    boundary = pl.concat([
        iv.select("pid", "tid", t=pl.col("ts_ns"), order=pl.lit(1), tie=pl.col("iv_idx"),
                  delta=pl.lit(1), iv_idx="iv_idx", point_id=pl.lit(None, pl.Int64)),
        iv.select("pid", "tid", t=pl.col("end_ns"), order=pl.when(zero_len).then(3).otherwise(0),
                  tie=-pl.col("iv_idx"), delta=pl.lit(-1), iv_idx=pl.lit(None, pl.Int64),
                  point_id=pl.lit(None, pl.Int64)),
        points.select("pid", "tid", t=pl.col("t"), order=pl.lit(2), tie=pl.lit(0, pl.Int64),
                      delta=pl.lit(0), iv_idx=pl.lit(None, pl.Int64), point_id="point_id"),
    ], how="vertical_relaxed")
    # every interval adds +1 and -1 on its own thread, so after sorting by thread the running sum
    # over the whole frame equals the per-thread running sum: no window over groups is needed
    swept = (boundary.sort("pid", "tid", "t", "order", "tie")
             .with_columns(depth=pl.col("delta").cum_sum()))
    starts = (swept.filter(pl.col("iv_idx").is_not_null())
              .select("pid", "tid", "depth", "iv_idx", start=pl.col("t")))
    pts = swept.filter(pl.col("point_id").is_not_null() & (pl.col("depth") > 0)).select(
        "pid", "tid", "point_id", "t", depth=pl.lit(1, pl.Int64) if outermost else pl.col("depth").cast(pl.Int64))
    starts = starts.with_columns(pl.col("depth").cast(pl.Int64)).sort("start")
    found = pts.sort("t").join_asof(starts, left_on="t", right_on="start", by=["pid", "tid", "depth"],
                                    strategy="backward", check_sortedness=False)
    return (found.join(iv.select("iv_idx", "end_ns"), on="iv_idx", how="inner")
            .filter(pl.col("end_ns") >= pl.col("t"))
            .select("point_id", "iv_idx"))


def _enclosing_named(points, slices, name_col: str, outermost: bool):
    iv = slices.select(pl.col("event_idx").alias("iv_idx"), "pid", "tid", "ts_ns", "end_ns")
    return (innermost_enclosing(points, iv, outermost)
            .join(slices.select(pl.col("event_idx").alias("iv_idx"), pl.col("name").cast(pl.String).alias(name_col)),
                  on="iv_idx", how="left")
            .select("point_id", name_col))


def link_gpu_ops(flat_dir: Path) -> tuple[pl.DataFrame, dict]:
    """gpu_ops of a flattened trace with link columns added, and link counts by reason."""
    flat_dir = Path(flat_dir)
    corr = pl.scan_parquet(flat_dir / "gpu_ops.parquet").select("correlation").collect()["correlation"]
    # runtime calls are filtered by correlation only when every GPU op has one (else flows must decide)
    keep = corr.unique() if corr.null_count() == 0 else None
    events = cpu_slices(pl.scan_parquet(flat_dir / "events.parquet"), keep).lazy()
    of_kind = lambda k: events.filter(pl.col("kind") == k)  # noqa: E731
    # only the flattened columns: linking an already linked directory again gives the same result
    gpu = pl.scan_parquet(flat_dir / "gpu_ops.parquet").select(schema.table("gpu_ops").names(("flatten",)))
    flows = pl.scan_parquet(flat_dir / "flows.parquet")
    launch = launch_links(of_kind(LAUNCH), gpu, flows)
    launches = of_kind(LAUNCH).select(pl.col("event_idx").alias("launch_event_idx"),
                             pl.col("name").cast(pl.String).alias("launch_name"), pl.col("pid").alias("launch_pid"),
                             pl.col("tid").alias("launch_tid"), pl.col("ts_ns").alias("launch_ts_ns"),
                             pl.col("dur_ns").alias("launch_dur_ns"),
                             pl.col("external_id").alias("launch_external_id"))
    linked = (gpu.join(launch, on="event_idx", how="left")
              .join(launches, on="launch_event_idx", how="left")).collect()

    points = (linked.lazy().filter(pl.col("launch_event_idx").is_not_null())
              .select(point_id=pl.col("event_idx"), pid=pl.col("launch_pid"), tid=pl.col("launch_tid"),
                      t=pl.col("launch_ts_ns")))
    ops = of_kind(CPU_OP)
    op_iv = ops.select(pl.col("event_idx").alias("iv_idx"), "pid", "tid", "ts_ns", "end_ns")
    by_nesting = innermost_enclosing(points, op_iv).select(
        pl.col("point_id").alias("event_idx"), pl.col("iv_idx").alias("cpu_op_event_idx"),
        cpu_op_link=pl.lit("nesting"))
    annotations = of_kind(ANNOTATION).with_columns(pl.col("name").cast(pl.String))
    steps = annotations.filter(pl.col("name").str.contains(STEP_NAME))
    user = annotations.filter(~pl.col("name").str.contains(STEP_NAME))
    modules = of_kind(MODULE)
    step = _enclosing_named(points, steps, "step_name", outermost=False)
    ann = _enclosing_named(points, user, "annotation", outermost=True)
    mod = _enclosing_named(points, modules, "module", outermost=True)

    out = (linked.lazy()
           .join(by_nesting, on="event_idx", how="left")
           .join(step, left_on="event_idx", right_on="point_id", how="left")
           .join(ann, left_on="event_idx", right_on="point_id", how="left")
           .join(mod, left_on="event_idx", right_on="point_id", how="left"))
    out = _external_id_fallback(out, ops, gpu)
    op_names = ops.select(pl.col("event_idx").alias("cpu_op_event_idx"), pl.col("name").cast(pl.String).alias("cpu_op_name"))
    out = (out.join(op_names, on="cpu_op_event_idx", how="left")
           .with_columns(step=pl.col("step_name").str.extract(STEP_NAME, 1).cast(pl.Int64),
                         module=pl.col("module").str.strip_prefix(MODULE_PREFIX))
           .drop("step_name", "launch_pid", "launch_tid", "launch_external_id")
           .sort("event_idx")
           .collect())
    return out, link_counts(out)


def _external_id_fallback(out: pl.LazyFrame, ops: pl.LazyFrame, gpu: pl.LazyFrame) -> pl.LazyFrame:
    """cpu_op by External id for launches no op contains, where External id is trustworthy."""
    trust = (gpu.filter(pl.col("external_id").is_not_null() & pl.col("correlation").is_not_null())
             .select((pl.col("external_id") != pl.col("correlation")).mean().fill_null(False).alias("t"))
             .collect().item())
    if not trust or trust < 0.5:
        return out
    by_ext = ops.filter(pl.col("external_id").is_not_null()).group_by("external_id").agg(
        pl.col("event_idx").max().alias("ext_op_idx"))
    return (out.join(by_ext, left_on="launch_external_id", right_on="external_id", how="left")
            .with_columns(
                cpu_op_link=pl.when(pl.col("cpu_op_event_idx").is_null() & pl.col("ext_op_idx").is_not_null())
                .then(pl.lit("external_id")).otherwise(pl.col("cpu_op_link")),
                cpu_op_event_idx=pl.coalesce("cpu_op_event_idx", "ext_op_idx"))
            .drop("ext_op_idx"))


def link_counts(g: pl.DataFrame) -> dict:
    """How many GPU ops were linked, and why the others were not."""
    c = g.select(
        total=pl.len(),
        by_flow=(pl.col("launch_link") == "flow").sum(),
        by_corr=(pl.col("launch_link") == "correlation").sum(),
        no_launch_with_corr=(pl.col("launch_event_idx").is_null() & pl.col("correlation").is_not_null()).sum(),
        no_corr=(pl.col("launch_event_idx").is_null() & pl.col("correlation").is_null()).sum(),
        op_nesting=(pl.col("cpu_op_link") == "nesting").sum(),
        op_external=(pl.col("cpu_op_link") == "external_id").sum(),
        launch_outside_op=(pl.col("launch_event_idx").is_not_null() & pl.col("cpu_op_event_idx").is_null()).sum(),
    ).row(0, named=True)
    return {
        "link:launch_by_flow": c["by_flow"],
        "link:launch_by_correlation": c["by_corr"],
        "unlinked:no_launch_event_for_correlation (launched before profiling started?)": c["no_launch_with_corr"],
        "unlinked:no_correlation_id": c["no_corr"],
        "link:cpu_op_by_nesting": c["op_nesting"],
        "link:cpu_op_by_external_id": c["op_external"],
        "unlinked:launch_not_inside_a_cpu_op": c["launch_outside_op"],
    }
