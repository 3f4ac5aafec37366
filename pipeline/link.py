"""link: GPU activity -> CPU launch -> CPU op, and their context (step, annotation, module).

All joins are polars queries over the flattened Parquet files; no Python loops over events (the
nesting of rule 3 loops over threads). Memory: the events are read with the streaming engine,
only the CPU slices linking needs kept (`cpu_slices`), and GPU ops are linked on their few
columns linking reads (`gpu_links`); the wide table is joined afterwards (`with_links`).

Rules (see README, "Link rules"):
1. launch, by flow: a flow's `s` endpoint binds to the runtime/driver slice that starts at the
   same (pid, tid, ts) and its `f` endpoint to the GPU activity at the same (pid, tid, ts); `s`
   and `f` pair by (cat, id). A flow link whose two sides carry different correlation ids is
   rejected.
2. launch, by correlation: GPU activity still unlinked joins the first runtime/driver slice with
   the same `args.correlation`.
3. cpu_op, by nesting: the innermost `cpu_op` on the launch's thread whose interval contains the
   launch start. Innermost is found without loops over events: the nesting depth at every point
   of a thread is the count of interval starts minus ends before it (binary searches in the
   thread's sorted starts and ends); the innermost op containing a launch at depth d is the last
   op at depth d that started before it (`pipeline.nesting`). Identical intervals nest in file
   order (the later event is the inner one).
4. cpu_op, by External id: only for launches no cpu_op contains, and only in layouts where a
   kernel's External id is not simply its correlation id (older traces).
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import polars as pl

from . import nesting, schema

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
# GPU op columns linking reads, and the columns it adds (in this order)
GPU_LINK_INPUTS = ["event_idx", "pid", "tid", "ts_ns", "correlation", "external_id"]
LINK_COLUMNS = ["launch_event_idx", "launch_link", "launch_name", "launch_ts_ns", "launch_dur_ns",
                "cpu_op_event_idx", "cpu_op_link", "annotation", "module", "cpu_op_name", "step"]
_SLICE_COLS = {  # what each kind of CPU slice keeps
    LAUNCH: ["event_idx", "name", "pid", "tid", "ts_ns", "dur_ns", "correlation", "external_id"],
    CPU_OP: ["event_idx", "name", "pid", "tid", "ts_ns", "end_ns", "external_id"],
    ANNOTATION: ["event_idx", "name", "pid", "tid", "ts_ns", "end_ns"],
    MODULE: ["event_idx", "name", "pid", "tid", "ts_ns", "end_ns"],
}


@dataclass(frozen=True)
class CpuSlices:
    """The CPU slices linking needs, one frame per kind, each with only the columns it is used for
    (`_SLICE_COLS`); names are categoricals (launch and op names repeat millions of times)."""

    launches: pl.DataFrame
    ops: pl.DataFrame
    annotations: pl.DataFrame
    modules: pl.DataFrame


def cpu_slices(events: pl.LazyFrame, gpu_correlations: pl.Series | None = None) -> CpuSlices:
    """The CPU slices of `events`, read with the streaming engine: rows are filtered batch by batch,
    so the event columns (names, categories) are never all in memory at once. With
    `gpu_correlations`, only runtime calls that share a correlation id with some GPU activity
    are kept (most runtime calls launch nothing)."""
    kind = (pl.when(pl.col("cat").str.contains(LAUNCH_CAT)).then(LAUNCH)
            .when(pl.col("cat").str.contains(CPU_OP_CAT)).then(CPU_OP)
            .when(pl.col("cat").str.contains(ANNOTATION_CAT)).then(ANNOTATION)
            .when(pl.col("cat").str.contains(_cat_regex(*MODULE_CATS))
                  & pl.col("name").str.starts_with(MODULE_PREFIX)).then(MODULE))
    query = (events.select(_EVENT_COLS)
             .filter((pl.col("ph") == "X") & pl.col("pid").is_not_null() & pl.col("tid").is_not_null()
                     & pl.col("ts_ns").is_not_null())
             .with_columns(kind=kind.cast(pl.Int8))
             .filter(pl.col("kind").is_not_null())
             .filter(pl.lit(True) if gpu_correlations is None else
                     (pl.col("kind") != LAUNCH) | pl.col("correlation").is_in(gpu_correlations.implode()))
             .select("event_idx", "kind", pl.col("name").cast(pl.Categorical), "pid", "tid", "ts_ns", "dur_ns",
                     end_ns=pl.col("ts_ns") + pl.col("dur_ns").fill_null(0), correlation="correlation",
                     external_id="external_id"))
    # each batch is split by kind as it arrives, so all kinds together are never held (nor copied);
    # every kind starts with an empty frame: it has its columns even when no slice has that kind
    parts = {k: [query.clear().select(cols).collect()] for k, cols in _SLICE_COLS.items()}
    for batch in query.collect_batches(engine="streaming"):
        for k, cols in _SLICE_COLS.items():
            parts[k].append(batch.filter(pl.col("kind") == k).select(cols))
    of_kind = {k: pl.concat(frames, rechunk=False) for k, frames in parts.items()}
    return CpuSlices(of_kind[LAUNCH], of_kind[CPU_OP], of_kind[ANNOTATION], of_kind[MODULE])


def launch_links(launch_slices: pl.LazyFrame, gpu: pl.LazyFrame, flows: pl.LazyFrame) -> pl.LazyFrame:
    """event_idx of each GPU op -> launch_event_idx, launch_link ('flow' | 'correlation')."""
    launches = launch_slices.select(
        pl.col("event_idx").alias("launch_event_idx"), "pid", "tid", "ts_ns",
        pl.col("correlation").alias("launch_corr"))
    # one scan per endpoint: a filtered frame shared by both would be held whole (all the flows)
    fl = lambda ph: (flows.filter((pl.col("ph") == ph) & pl.col("cat").is_in(LINK_FLOW_CATS)  # noqa: E731
                                  & pl.col("id").is_not_null())
                     .select("cat", "id", "pid", "tid", "ts_ns"))
    starts = (fl("s")
              .join(launches, on=["pid", "tid", "ts_ns"], how="inner")
              .group_by("cat", "id").agg(pl.col("launch_event_idx").min(), pl.col("launch_corr").first()))
    g = gpu.select("event_idx", "pid", "tid", "ts_ns", "correlation")
    ends = (fl("f")
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


def innermost_enclosing(points: pl.LazyFrame | pl.DataFrame, intervals: pl.LazyFrame | pl.DataFrame,
                        outermost: bool = False) -> pl.LazyFrame:
    """For each point (point_id, pid, tid, t) the innermost (or outermost) interval containing it.

    intervals: (iv_idx, pid, tid, ts_ns, end_ns) properly nested per thread. Returns
    (point_id, iv_idx) for points inside at least one interval. Identical intervals nest in file
    order: starts at one instant are taken by ascending index (see `pipeline.nesting`).
    """
    return nesting.enclosing(points, intervals, nesting.FILE_ORDER, outermost).lazy()


def _enclosing_named(points: pl.DataFrame, slices: pl.DataFrame, name_col: str, outermost: bool) -> pl.LazyFrame:
    iv = slices.select(pl.col("event_idx").alias("iv_idx"), "pid", "tid", "ts_ns", "end_ns")
    return (innermost_enclosing(points, iv, outermost)
            .join(slices.lazy().select(pl.col("event_idx").alias("iv_idx"), pl.col("name").alias(name_col)),
                  on="iv_idx", how="left")
            .select("point_id", name_col))


def gpu_links(flat_dir: Path) -> pl.DataFrame:
    """(event_idx, correlation, *LINK_COLUMNS) of every GPU op of a flattened trace, in the order of
    its gpu_ops.parquet. Only the GPU ops' `GPU_LINK_INPUTS` are read: the wide table is joined
    afterwards (`with_links`)."""
    flat_dir = Path(flat_dir)
    gpu = pl.scan_parquet(flat_dir / "gpu_ops.parquet").select(GPU_LINK_INPUTS).collect()
    corr = gpu["correlation"]
    # runtime calls are filtered by correlation only when every GPU op has one (else flows must decide)
    keep = corr.unique() if corr.null_count() == 0 else None
    slices = cpu_slices(pl.scan_parquet(flat_dir / "events.parquet"), keep)
    flows = pl.scan_parquet(flat_dir / "flows.parquet")
    launch = launch_links(slices.launches.lazy(), gpu.lazy(), flows)
    launches = slices.launches.lazy().select(
        launch_event_idx="event_idx", launch_name="name", launch_pid="pid", launch_tid="tid",
        launch_ts_ns="ts_ns", launch_dur_ns="dur_ns", launch_external_id="external_id")
    linked = (gpu.lazy().select("event_idx", "correlation")
              .join(launch, on="event_idx", how="left", maintain_order="left")
              .join(launches, on="launch_event_idx", how="left", maintain_order="left")).collect()

    points = (linked.filter(pl.col("launch_event_idx").is_not_null())
              .select(point_id=pl.col("event_idx"), pid=pl.col("launch_pid"), tid=pl.col("launch_tid"),
                      t=pl.col("launch_ts_ns")))
    ops = slices.ops
    op_iv = ops.select(pl.col("event_idx").alias("iv_idx"), "pid", "tid", "ts_ns", "end_ns")
    by_nesting = innermost_enclosing(points, op_iv).select(
        pl.col("point_id").alias("event_idx"), pl.col("iv_idx").alias("cpu_op_event_idx"),
        cpu_op_link=pl.lit("nesting"))
    annotations = slices.annotations.with_columns(pl.col("name").cast(pl.String))
    steps = annotations.filter(pl.col("name").str.contains(STEP_NAME))
    user = annotations.filter(~pl.col("name").str.contains(STEP_NAME))
    step = _enclosing_named(points, steps, "step_name", outermost=False)
    ann = _enclosing_named(points, user, "annotation", outermost=True)
    mod = _enclosing_named(points, slices.modules, "module", outermost=True)

    def left_join(lf, other, **on):
        return lf.join(other, how="left", maintain_order="left", **on)

    out = left_join(linked.lazy(), by_nesting, on="event_idx")
    for named in (step, ann, mod):
        out = left_join(out, named, left_on="event_idx", right_on="point_id")
    out = _external_id_fallback(out.collect(), ops, gpu)
    op_names = ops.select(pl.col("event_idx").alias("cpu_op_event_idx"), pl.col("name").alias("cpu_op_name"))
    return (left_join(out.lazy(), op_names.lazy(), on="cpu_op_event_idx")
            .with_columns(pl.col("launch_name", "annotation", "cpu_op_name").cast(pl.String),
                          step=pl.col("step_name").str.extract(STEP_NAME, 1).cast(pl.Int64),
                          module=pl.col("module").cast(pl.String).str.strip_prefix(MODULE_PREFIX))
            .select("event_idx", "correlation", *LINK_COLUMNS)
            .collect())


def with_links(flat_dir: Path, links: pl.DataFrame) -> pl.LazyFrame:
    """The flattened gpu_ops of `flat_dir` with the link columns of `links` (`gpu_links`), sorted by
    event_idx. Flatten writes GPU ops in file order, so the scan is sorted already and the query
    streams; it sorts (holding the whole table) only if it is not."""
    gpu = pl.scan_parquet(Path(flat_dir) / "gpu_ops.parquet").select(schema.table("gpu_ops").names(("flatten",)))
    out = gpu.join(links.drop("correlation").lazy(), on="event_idx", how="left", maintain_order="left")
    return out if links["event_idx"].is_sorted() else out.sort("event_idx")


def link_gpu_ops(flat_dir: Path) -> tuple[pl.DataFrame, dict]:
    """gpu_ops of a flattened trace with link columns added, and link counts by reason."""
    # only the flattened columns are read: linking an already linked directory again gives the same result
    out = with_links(flat_dir, gpu_links(flat_dir)).collect()
    return out, link_counts(out)


def _external_id_fallback(out: pl.DataFrame, ops: pl.DataFrame, gpu: pl.DataFrame) -> pl.DataFrame:
    """cpu_op by External id for launches no op contains, where External id is trustworthy."""
    trust = (gpu.filter(pl.col("external_id").is_not_null() & pl.col("correlation").is_not_null())
             .select((pl.col("external_id") != pl.col("correlation")).mean().fill_null(False).alias("t")).item())
    if not trust or trust < 0.5:
        return out
    wanted = out.filter(pl.col("cpu_op_event_idx").is_null())["launch_external_id"].drop_nulls().implode()
    by_ext = ops.filter(pl.col("external_id").is_in(wanted)).group_by("external_id").agg(
        pl.col("event_idx").max().alias("ext_op_idx"))
    return (out.join(by_ext, left_on="launch_external_id", right_on="external_id", how="left", maintain_order="left")
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
