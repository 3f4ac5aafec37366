"""captures: the CUDA/HIP graphs a capture trace holds, as the launches that were captured into them.

Serving engines (vLLM, SGLang) and torch.compile's cudagraph trees capture their graphs with a
stream capture: between a thread's `cudaStreamBeginCapture` / `hipStreamBeginCapture` and its
`...EndCapture`, the kernel launches (and memcpy / memset calls) it makes are recorded into a graph
instead of running. A profiler trace of that phase (a *capture trace*) holds those calls inside the
CPU ops that issued them, with their shapes; HIP's launches also carry the kernel's name, grid and
block in their args (`kernel`, `grid`, `block`), CUDA's carry neither.

`captured_graphs` reads a flattened capture trace in bounded memory (the capture markers, then the
calls inside the capture windows and the ops around them) into one row per captured call (a graph
*node*): the graph (k-th capture window of the trace, in start order), the node's place in it
(capture order), its kind (kernel / memcpy / memset), kernel name, grid and block when the call
records them, the launch call, and the innermost CPU op around it (nesting, as link rule 3) with its
args. Nothing the size of the trace is held: the few calls that name a capture are read first, then
only the rows inside capture windows.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import polars as pl

from pipeline.kineto import CAPTURE_BEGIN, CAPTURE_END, CAPTURED_CALLS
from pipeline.link import links as link

NODE_SCHEMA = {
    "capture": pl.String,  # the capture trace's label (its stem)
    "capture_trace_id": pl.String,
    "graph": pl.Int64,  # k-th capture window of the trace
    "node": pl.Int64,  # place in the graph, in capture order
    "kind": pl.String,  # kernel, memcpy or memset
    "name": pl.String,  # the kernel's name (args.kernel), when the launch records it
    **{f"{d}_{a}": pl.Int64 for d in ("grid", "block") for a in "xyz"},
    "launch_event_idx": pl.Int64,
    "launch_name": pl.String,
    "launch_dur_ns": pl.Int64,
    "pid": pl.Int64,
    "tid": pl.Int64,
    "cpu_op_event_idx": pl.Int64,
    "cpu_op_name": pl.String,
    "cpu_op_args_json": pl.String,
}
_THREAD = ["pid", "tid"]


@dataclass
class CapturedGraphs:
    """The nodes (NODE_SCHEMA) of the graphs one capture trace captured, and what was odd about it."""

    label: str
    trace_id: str
    nodes: pl.DataFrame
    problems: Counter = field(default_factory=Counter)

    @property
    def n_graphs(self) -> int:
        return self.nodes["graph"].n_unique() if self.nodes.height else 0


def call_names(events: Path, link_src: link.LinkSources) -> pl.Series:
    """The distinct names of the runtime/driver calls of a flattened trace (a streaming read)."""
    return (
        pl.scan_parquet(events)
        .filter(link_src.is_slice(link.LAUNCH))
        .select(pl.col("name").cast(pl.String))
        .unique()
        .collect(engine="streaming")["name"]
        .drop_nulls()
    )


def named(names: pl.Series, pattern: str) -> list[str]:
    return [n for n in names if re.match(pattern, n)]


def captured_graphs(flat_dir: Path, trace_id: str, label: str) -> CapturedGraphs:
    """The graphs captured in a flattened trace (see the module docstring)."""
    flat_dir = Path(flat_dir)
    events = flat_dir / "events.parquet"
    src = link.LinkSources.of(flat_dir)
    names = call_names(events, src)
    problems: Counter = Counter()
    empty = CapturedGraphs(label, trace_id, pl.DataFrame(schema=NODE_SCHEMA), problems)
    begin, end = named(names, CAPTURE_BEGIN), named(names, CAPTURE_END)
    if not begin:
        problems["graphs:capture_trace_without_capture"] += 1
        return empty
    columns = ["event_idx", pl.col("name").cast(pl.String), "pid", "tid", "ts_ns", "dur_ns"]
    markers = link.read_where(events, src.is_slice(link.LAUNCH) & pl.col("name").is_in(begin + end), columns)
    windows = _windows(markers, set(begin), problems)
    if windows.is_empty():
        return empty
    kinds = {n: kind for n in names for kind, pattern in CAPTURED_CALLS if re.match(pattern, n)}
    calls = _calls_inside(events, src, windows, kinds)
    if calls.is_empty():
        problems["graphs:captured_graph_without_launches"] += windows.height
        return empty
    nodes = _with_args(events, calls)
    context = link.context_at(src, nodes.select(point_id="launch_event_idx", pid="pid", tid="tid", t="ts_ns"))
    nodes = nodes.join(
        context.select(launch_event_idx="event_idx", cpu_op_event_idx="cpu_op_event_idx", cpu_op_name="cpu_op_name"),
        on="launch_event_idx",
        how="left",
    )
    ops = link.read_where(
        events,
        link.among("event_idx", nodes["cpu_op_event_idx"]),
        [pl.col("event_idx").alias("cpu_op_event_idx"), pl.col("args_json").alias("cpu_op_args_json")],
    )
    nodes = nodes.join(ops, on="cpu_op_event_idx", how="left").sort("graph", "node")
    empty_windows = windows.height - nodes["graph"].n_unique()
    if empty_windows:
        problems["graphs:captured_graph_without_launches"] += empty_windows
    out = nodes.with_columns(capture=pl.lit(label), capture_trace_id=pl.lit(trace_id))
    return CapturedGraphs(label, trace_id, out.select([pl.col(c).cast(t) for c, t in NODE_SCHEMA.items()]), problems)


def _windows(markers: pl.DataFrame, begin: set[str], problems: Counter) -> pl.DataFrame:
    """(pid, tid, w_start, w_end, graph) of the capture windows: each Begin with the next End on its
    thread; a Begin followed by another Begin (or by nothing) is counted, not used."""
    m = markers.sort(*_THREAD, "ts_ns", "event_idx").with_columns(is_begin=pl.col("name").is_in(list(begin)))
    nxt = lambda c: pl.col(c).shift(-1).over(_THREAD)
    m = m.with_columns(next_begin=nxt("is_begin"), next_ts=nxt("ts_ns"), next_dur=nxt("dur_ns"))
    starts = m.filter("is_begin")
    closed = starts.filter(pl.col("next_begin").eq(False))
    if closed.height < starts.height:
        problems["graphs:capture_begin_without_end"] += starts.height - closed.height
    return (
        closed.select(
            *_THREAD, w_start="ts_ns", w_end=pl.col("next_ts") + pl.col("next_dur").fill_null(0), begin_idx="event_idx"
        )
        .sort("w_start", "begin_idx")
        .with_columns(graph=pl.int_range(pl.len(), dtype=pl.Int64))
        .drop("begin_idx")
    )


def _calls_inside(events: Path, src: link.LinkSources, windows: pl.DataFrame, kinds: dict[str, str]) -> pl.DataFrame:
    """The captured calls (of the names in `kinds`) on a window's thread inside it, numbered in
    capture order within their graph: launch_event_idx, launch_name, launch_dur_ns, pid, tid,
    ts_ns, kind, graph, node."""
    if not kinds:
        return pl.DataFrame()
    first, last = windows["w_start"].min(), windows["w_end"].max()
    threads = windows.select(_THREAD).unique()
    calls = link.read_where(
        events,
        src.is_slice(link.LAUNCH)
        & pl.col("name").is_in(list(kinds))
        & pl.col("ts_ns").is_between(first, last)
        & pl.col("pid").is_in(threads["pid"].implode())
        & pl.col("tid").is_in(threads["tid"].implode()),
        ["event_idx", pl.col("name").cast(pl.String), "pid", "tid", "ts_ns", "dur_ns"],
    ).sort("ts_ns", "event_idx")
    inside = calls.join_asof(
        windows.sort("w_start"),
        left_on="ts_ns",
        right_on="w_start",
        by=_THREAD,
        strategy="backward",
        check_sortedness=False,
    ).filter(pl.col("ts_ns") <= pl.col("w_end"))
    return inside.select(
        launch_event_idx="event_idx",
        launch_name="name",
        launch_dur_ns="dur_ns",
        pid="pid",
        tid="tid",
        ts_ns="ts_ns",
        kind=pl.col("name").replace_strict(kinds, return_dtype=pl.String),
        graph="graph",
        node=pl.int_range(pl.len(), dtype=pl.Int64).over("graph"),
    )


_INTS = r"-?\d+"


def _with_args(events: Path, calls: pl.DataFrame) -> pl.DataFrame:
    """The calls with the kernel name, grid and block their args record (HIP's launches do)."""
    args = link.read_where(
        events,
        link.among("event_idx", calls["launch_event_idx"]),
        [pl.col("event_idx").alias("launch_event_idx"), "args_json"],
    )
    a = pl.col("args_json")
    dims = {d: a.str.json_path_match(f"$.{d}").str.extract_all(_INTS) for d in ("grid", "block")}
    args = args.select(
        "launch_event_idx",
        name=a.str.json_path_match("$.kernel"),
        **{
            f"{d}_{axis}": dims[d].list.get(i, null_on_oob=True).cast(pl.Int64, strict=False)
            for d in ("grid", "block")
            for i, axis in enumerate("xyz")
        },
    )
    out = calls.join(args, on="launch_event_idx", how="left")
    kernel = pl.col("kind") == "kernel"
    return out.with_columns(pl.when(kernel).then(pl.col(c)) for c in args.columns if c != "launch_event_idx")
