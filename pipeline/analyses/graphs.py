"""graphs: the CUDA/HIP graphs a trace replayed, one row per graph, and the ops its replays ran.

A graph is a `graph_id` of gpu_ops (`pipeline.link.graphs`): a captured graph when the replays were
paired with their capture trace, else `graph id <n>` when Kineto recorded the graph's id on its
kernels (`pipeline.link.graph_ids`), else `uncaptured#<hash>` (the same kernels, the same id). Per graph
and device: how often it was replayed, kernels and GPU time per replay, the graph launch call's
duration against the launch calls its capture made (`replaced_launch_us`: the eager launches one
graph launch stands for), the ops its kernels were captured by (by GPU time), and where it was
launched from: the innermost python frame around its first launch that is not graph-replay
plumbing (`kineto.GRAPH_REPLAY_FRAMES`), and its module. `replayed_ops` gives the op table its
rows for ops that ran inside replays (they have no CPU call in the replay trace).

Everything is a streaming query over gpu_ops (per replay, then per graph: as many rows as
replays), and one read of the python frames around one launch per graph.
"""

from __future__ import annotations

import re

import polars as pl

from pipeline.analyses.activity import gpu_columns
from pipeline.analyses.cpu import GROUPINGS
from pipeline.analyses.flat import Flat, as_flat
from pipeline.analyses.rollup import us
from pipeline.analyses.sweep import read
from pipeline.kineto import GRAPH_LAUNCH, GRAPH_REPLAY_FRAMES, MODULE_CATS, cat_regex
from pipeline.link.graph_ids import UNCAPTURED_PREFIXES
from pipeline.read.durations import SLICE

_COLUMNS = [
    "graph_id",
    "device",
    "launch_event_idx",
    "launch_name",
    "launch_ts_ns",
    "launch_dur_ns",
    "ts_ns",
    "dur_ns",
    "cpu_op_name",
    "cpu_op_link",
    "cpu_op_event_idx",
    "cpu_op_args_json",
    "capture_trace_id",
    "capture_launch_dur_ns",
    "module",
    "kind",
    "flops",
]
EMPTY = pl.Schema(
    {
        "device": pl.Int64(),
        "graph": pl.String(),  # `#k` of its capture trace, or `uncaptured#<hash>`
        "replays": pl.UInt32(),
        "kernels_per_replay": pl.Float64(),
        "gpu_us_per_replay": pl.Float64(),
        "gpu_us": pl.Float64(),
        "pct": pl.Float64(),
        "launch_us": pl.Float64(),
        "replaced_launch_us": pl.Float64(),
        "launch_to_start_us": pl.Float64(),
        "ops": pl.List(pl.String()),
        "launched_from": pl.String(),
        "module": pl.String(),
        "capture": pl.String(),  # the capture trace (its stem): graph_id is capture + graph
    }
)
FRAME_BATCH = 64  # launches whose python frames are read together
# what one replay (its graph launch's kernels) is folded into: kernels, first start, its launch, and
# the eager launches it replaces (the capture's, when the capture recorded them)
_REPLAY = (
    pl.len().alias("kernels"),
    pl.col("ts_ns").min().alias("first_ns"),
    pl.col("launch_ts_ns").first(),
    pl.col("launch_dur_ns").first(),
    pl.when(pl.col("capture_launch_dur_ns").is_not_null().any())
    .then(pl.col("capture_launch_dur_ns").sum())
    .alias("replaced_ns"),
)


def _replayed(f: Flat) -> pl.LazyFrame:
    """The GPU activity graph launches ran, in the analysis window (graph_id, else a launch call
    named like a graph launch: a trace linked before graph ids existed)."""
    path = f.gpu_ops_file
    g = pl.scan_parquet(path).select(gpu_columns(path, _COLUMNS))
    by_launch = pl.col("launch_name").cast(pl.String).str.contains(GRAPH_LAUNCH)
    replayed = pl.col("graph_id").is_not_null() | by_launch.fill_null(False)
    return g.filter(replayed & pl.col("ts_ns").is_not_null() & f.time_filter()).with_columns(
        graph_id=pl.coalesce(pl.col("graph_id").cast(pl.String), pl.lit("uncaptured"))
    )


def graph_view(flat) -> pl.DataFrame:
    """One row per (device, graph): see the module docstring. Most GPU time first."""
    f = as_flat(flat)
    g = _replayed(f)
    per_replay = (
        g.group_by("device", "graph_id", "launch_event_idx")
        .agg(*_REPLAY, gpu_ns=pl.col("dur_ns").fill_null(0).sum())
        .collect(engine="streaming")
    )
    if per_replay.is_empty():
        return pl.DataFrame(schema=EMPTY)
    graphs = per_replay.group_by("device", "graph_id").agg(
        replays=pl.len().cast(pl.UInt32),
        kernels_per_replay=pl.col("kernels").mean(),
        gpu_us_per_replay=us(pl.col("gpu_ns").mean()),
        gpu_us=us(pl.col("gpu_ns").sum()),
        launch_us=us(pl.col("launch_dur_ns").mean()),
        replaced_launch_us=us(pl.col("replaced_ns").mean()),
        launch_to_start_us=us((pl.col("first_ns") - pl.col("launch_ts_ns")).mean()),
        first_launch=pl.col("launch_event_idx").sort_by("first_ns").first(),
    )
    ops = (
        g.filter(pl.col("cpu_op_name").is_not_null())
        .group_by("device", "graph_id", "cpu_op_name")
        .agg(dur=pl.col("dur_ns").fill_null(0).sum())
        .collect(engine="streaming")
        .sort("dur", "cpu_op_name", descending=[True, False])
        .group_by("device", "graph_id", maintain_order=True)
        .agg(ops=pl.col("cpu_op_name").cast(pl.String))
    )
    module = (
        g.filter(pl.col("module").is_not_null())
        .group_by("device", "graph_id", "module")
        .agg(n=pl.len())
        .collect(engine="streaming")
        .sort("n", "module", descending=[True, False])
        .group_by("device", "graph_id", maintain_order=True)
        .agg(module=pl.col("module").first().cast(pl.String))
    )
    device_ns = (
        pl.scan_parquet(f.gpu_ops_file)
        .filter(pl.col("ts_ns").is_not_null() & f.time_filter())
        .group_by("device")
        .agg(device_ns=pl.col("dur_ns").fill_null(0).sum())
        .collect(engine="streaming")
    )
    keys = ["device", "graph_id"]
    out = (
        graphs.join(ops, on=keys, how="left")
        .join(module, on=keys, how="left")
        .join(device_ns, on="device", how="left")
        .join(_launched_from(f, graphs["first_launch"]), on="first_launch", how="left")
    )
    captured = ~pl.any_horizontal(pl.col("graph_id").str.starts_with(p) for p in UNCAPTURED_PREFIXES)
    return (
        out.select(
            "device",
            graph=pl.when(captured)
            .then(pl.lit("#") + pl.col("graph_id").str.extract(r"#(\d+)$", 1))
            .otherwise("graph_id"),
            replays="replays",
            kernels_per_replay="kernels_per_replay",
            gpu_us_per_replay="gpu_us_per_replay",
            gpu_us="gpu_us",
            pct=100 * pl.col("gpu_us") / us("device_ns"),
            launch_us="launch_us",
            replaced_launch_us="replaced_launch_us",
            launch_to_start_us="launch_to_start_us",
            ops=pl.col("ops").fill_null([]),
            launched_from="launched_from",
            module="module",
            capture=pl.when(captured).then(pl.col("graph_id").str.replace(r"#\d+$", "")),
        )
        .cast(EMPTY)
        .sort("device", "gpu_us", "capture", "graph", descending=[False, True, False, False])
    )


def _launched_from(f: Flat, launches: pl.Series) -> pl.DataFrame:
    """(first_launch, launched_from): the innermost python frame around each launch call that is
    not graph-replay plumbing (null: the trace has no python frames there)."""
    events = f.path / "events.parquet"
    at = read(events, pl.col("event_idx").is_in(launches.drop_nulls().implode()), ["event_idx", "pid", "tid", "ts_ns"])
    plumbing = [re.compile(p) for p in GRAPH_REPLAY_FRAMES]
    found: list[tuple[int, str | None]] = []
    is_frame = SLICE & pl.col("cat").str.contains(cat_regex(*MODULE_CATS))
    for start in range(0, at.height, FRAME_BATCH):
        points = at.slice(start, FRAME_BATCH)
        around = pl.any_horizontal(
            (pl.col("pid") == p)
            & (pl.col("tid") == t)
            & (pl.col("ts_ns") <= ts)
            & (pl.col("ts_ns") + pl.col("dur_ns").fill_null(0) >= ts)
            for p, t, ts in points.select("pid", "tid", "ts_ns").iter_rows()
        )
        frames = read(events, is_frame & around, ["pid", "tid", "ts_ns", "dur_ns", pl.col("name").cast(pl.String)])
        for idx, p, t, ts in points.iter_rows():
            inside = frames.filter(
                (pl.col("pid") == p)
                & (pl.col("tid") == t)
                & (pl.col("ts_ns") <= ts)
                & (pl.col("ts_ns") + pl.col("dur_ns").fill_null(0) >= ts)
            ).sort("ts_ns", "dur_ns", descending=[True, False])
            name = next((n for n in inside["name"] if n and not any(r.search(n) for r in plumbing)), None)
            found.append((idx, name))
    return pl.DataFrame(found, schema={"first_launch": pl.Int64, "launched_from": pl.String}, orient="row")


def replayed_ops(flat, group_by: str | None = None) -> pl.DataFrame:
    """Per op key (`cpu.GROUPINGS`) of the ops graph replays ran (captured ops, `cpu_op_link` =
    graph_capture): calls (each op once per replay), their kernels' time, count and FLOPs
    (`flops_n`: kernels with FLOPs). Shapes and overloads come from `cpu_op_args_json`; a captured
    op's stack is not in the replay trace (its key is empty)."""
    f = as_flat(flat)
    keys = ["name", *GROUPINGS[group_by]]
    args = pl.col("cpu_op_args_json")
    name = pl.col("cpu_op_name").cast(pl.String)
    key = {
        "input-shape": {"input_shape": args.str.json_path_match("$['Input Dims']")},
        "overload": {
            "overload": pl.coalesce(
                args.str.json_path_match("$['Overload Name']"), name.str.extract(r"^\w[\w.]*::\w+\.(\w+)$", 1)
            )
        },
        "stack": {"stack": pl.lit(None, pl.String)},
    }.get(group_by or "", {})
    is_kernel = pl.col("kind") == "kernel"
    return (
        _replayed(f)
        .filter(pl.col("cpu_op_link") == "graph_capture")
        .with_columns(name=name, **{k: v.fill_null("") for k, v in key.items()})
        .group_by(keys)
        .agg(
            calls=pl.struct("launch_event_idx", "capture_trace_id", "cpu_op_event_idx").n_unique().cast(pl.Int64),
            device_ns=pl.col("dur_ns").fill_null(0).sum(),
            kernels=is_kernel.sum().cast(pl.Int64),
            flops=pl.col("flops").sum(),
            flops_n=pl.col("flops").is_not_null().sum().cast(pl.Int64),
        )
        .collect(engine="streaming")
    )


def graph_launches(flat) -> pl.DataFrame:
    """Per device with graph replays: graph_launches, graph_kernels (the activity they started),
    graph_launch_p50_us (the graph launch call), replaced_launch_p50_us (per launch, the launch
    calls its graph's capture made: the eager launches it stands for; paired replays only) and
    graph_launch_to_start_p50_us (launch call to its first activity)."""
    per_replay = (
        _replayed(as_flat(flat)).group_by("device", "launch_event_idx").agg(*_REPLAY).collect(engine="streaming")
    )
    return (
        per_replay.group_by("device")
        .agg(
            graph_launches=pl.len().cast(pl.UInt32),
            graph_kernels=pl.col("kernels").sum().cast(pl.UInt32),
            graph_launch_p50_us=us(pl.col("launch_dur_ns").median()),
            replaced_launch_p50_us=us(pl.col("replaced_ns").median()),
            graph_launch_to_start_p50_us=us((pl.col("first_ns") - pl.col("launch_ts_ns")).median()),
        )
        .sort("device")
    )
