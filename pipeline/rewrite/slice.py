"""slice: a window of a trace as a trace of its own, small enough for a viewer, streamed.

A 1-5 GB trace does not open in Perfetto's UI. `slice` writes the part of it in a window, with
the windows `analyze` has (`pipeline.analyses.window`: `--steps A:B`, `--start-us/--end-us` after
the trace's first event, `--annotation NAME`, intersected), as a valid trace:

- every event that overlaps the window (a slice [ts, ts + dur) that meets it, whole; an instant
  or counter inside it); B/E pairs and async b/e pairs by their span;
- the launches of its kernels and the kernels of its launches, wherever they are (every event
  sharing a positive `args.correlation` with an event of the window), so links survive;
- whole flows only: a flow (cat, name, id) whose every endpoint binds to a kept slice (lies
  inside one on its thread); a flow with an endpoint elsewhere is left out entirely;
- every metadata event (`ph` M) and the trace's top-level metadata (secrets redacted, as
  augment does), plus `slicedFrom` (source, window, counts);
- each counter's last value before the window, dated at the window's start (its track shows
  the right value from the first instant).

Slices that partially overlap on a track move to sibling tracks (`lanes`).

Memory: the trace is flattened (`flatten`, no linking: bounded by its batches) into a temporary
directory; the window, the correlations of its events and the flows that bind to kept slices
are polars queries over those tables whose results are the size of the window; then one
streaming pass writes the kept events, in file order. Nothing holds the trace. That pass reads
the trace's pieces as flatten did (`flatten.Chunking`: each piece's event count) and parses only
those that hold a kept event (where the pieces disagree with the counts, it parses them all).
"""

from __future__ import annotations

import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import polars as pl

from pipeline.analyses.window import Intervals, Window
from pipeline.errors import UsageError
from pipeline.flatten import Chunking, flatten
from pipeline.link import nesting
from pipeline.read.chunks import ChunkParseError, Salvaged, text_of
from pipeline.read.durations import SLICE
from pipeline.read.source import TraceSource
from pipeline.rewrite import lanes
from pipeline.rewrite.jsonout import (
    CHUNK_BYTES,
    TraceWriter,
    metadata_after,
    open_trace,
    parse_events,
    read_events,
    us_number,
)

TRACK = lanes.TRACK
FLOW_PHASES = ("s", "t", "f")
PAIRED = (("B", "E", TRACK), ("b", "e", ["pid", "pid_str", "cat", "id", "id_str", "name"]))
FLOW_KEY = ["cat", "name", "id", "id_str"]


@dataclass
class SliceResult:
    out_path: Path
    window: Intervals
    n_events: int  # written, metadata included
    n_in_window: int  # events overlapping the window
    n_linked: int  # events outside it kept for their links (launches of its kernels, kernels of its launches)
    n_flow_events: int  # endpoints of whole flows
    n_moved: int  # slices moved to sibling tracks (lanes)
    truncated: bool
    truncation_reason: str | None
    warnings: list = field(default_factory=list)


@dataclass
class Selection:
    keep: np.ndarray  # sorted event_idx to write
    ts_ns: dict  # event_idx -> the time to write instead (counters carried into the window)
    n_in_window: int
    n_linked: int
    n_flow_events: int


# ------------------------------------------------------------------ what overlaps the window
def _overlaps(intervals: Intervals, start: pl.Expr, end: pl.Expr) -> pl.Expr:
    """Whether [start, end) meets one of the (sorted, disjoint) intervals; a point (end == start)
    when it lies in one."""
    starts = pl.Series([a for a, _ in intervals], dtype=pl.Int64)
    ends = pl.Series([b for _, b in intervals], dtype=pl.Int64)
    at = pl.lit(ends).search_sorted(start, side="right").cast(pl.Int64)  # the first interval ending after start
    first = pl.lit(starts).gather(at.clip(0, len(intervals) - 1))
    meets = pl.when(end > start).then(first < end).otherwise(first <= start)
    return start.is_not_null() & (at < len(intervals)) & meets


def _whole_flows(flows: pl.LazyFrame, kept: pl.DataFrame) -> pl.DataFrame:
    """event_idx of the endpoints of every flow whose endpoints all lie inside kept slices
    (kept: TRACK, ts_ns, end_ns) on their threads."""
    spans = kept.group_by(TRACK).agg(lo=pl.col("ts_ns").min(), hi=pl.col("end_ns").max())
    lo, hi = spans["lo"].min(), spans["hi"].max()
    near = (
        flows.filter(pl.col("ts_ns").is_between(lo, hi))  # streamed: the join then meets few rows
        .join(spans.lazy(), on=TRACK, nulls_equal=True)
        .filter(pl.col("ts_ns").is_between("lo", "hi"))
        .select("event_idx", *TRACK, *FLOW_KEY, t="ts_ns")
        .collect(engine="streaming")
    )
    if not near.height:
        return pl.DataFrame(schema={"event_idx": pl.Int64})
    # threads as one integer column, so that nesting's (pid, tid) is (thread, 0)
    tracks = pl.concat([kept.select(TRACK), near.select(TRACK)]).unique().with_row_index("thread")
    tracks = tracks.with_columns(pl.col("thread").cast(pl.Int64))
    iv = kept.join(tracks, on=TRACK, nulls_equal=True).select(
        iv_idx=pl.int_range(pl.len(), dtype=pl.Int64),
        pid="thread",
        tid=pl.lit(0, pl.Int64),
        ts_ns="ts_ns",
        end_ns="end_ns",
    )
    pts = near.join(tracks, on=TRACK, nulls_equal=True, maintain_order="left").select(
        pid="thread", tid=pl.lit(0, pl.Int64), t="t"
    )
    outermost = pl.repeat(True, pts.height, eager=True)
    inside = nesting.around_one(pts, iv, nesting.LONGER_FIRST, outermost).is_not_null()
    bound = near.filter(inside).select(FLOW_KEY).unique()
    of_bound = flows.join(bound.lazy(), on=FLOW_KEY, nulls_equal=True).select("event_idx", *FLOW_KEY, "ph")
    ends = of_bound.collect(engine="streaming").join(
        near.filter(inside).select("event_idx", bound=pl.lit(True)), on="event_idx", how="left"
    )
    whole = ends.group_by(FLOW_KEY).agg(
        ok=pl.col("bound").fill_null(False).all() & (pl.col("ph") == "s").any() & (pl.col("ph") == "f").any()
    )
    return ends.join(whole.filter("ok"), on=FLOW_KEY, nulls_equal=True).select("event_idx")


def select(flat_dir: Path, intervals: Intervals) -> Selection:
    """What of a flattened trace a slice of `intervals` writes (see the module docstring)."""
    ev = pl.scan_parquet(Path(flat_dir) / "events.parquet")
    flows = pl.scan_parquet(Path(flat_dir) / "flows.parquet")
    end = pl.col("ts_ns") + pl.col("dur_ns").fill_null(0).clip(0)
    # slices (X, and B timed by their E) and instants; B/E and b/e pairs by their span below
    plain = ~pl.col("ph").is_in([*FLOW_PHASES, "M", "C", *(p for b, e, _ in PAIRED for p in (b, e))]) | SLICE
    cols = ["event_idx", *TRACK, "ph", "ts_ns", "end_ns", "correlation"]
    # the window's hull first, a plain comparison the reader streams (the exact test is no
    # streaming expression: over the whole table it held every row's columns at once)
    hull = (pl.col("ts_ns") <= intervals[-1][1]) & (end >= intervals[0][0])
    window = (
        ev.filter(plain & hull)
        .select(*cols[:-2], end_ns=end, correlation="correlation")
        .collect(engine="streaming")
        .filter(_overlaps(intervals, pl.col("ts_ns"), pl.col("end_ns")))
    )
    corr = window.filter(pl.col("correlation") > 0)["correlation"].unique()
    linked = (
        ev.filter(plain & pl.col("correlation").is_in(corr.implode()))
        .select(*cols[:-2], end_ns=end, correlation="correlation")
        .collect(engine="streaming")
    )
    linked = linked.join(window.select("event_idx"), on="event_idx", how="anti")
    pairs = [lanes.paired(ev, b, e, key) for b, e, key in PAIRED]
    paired = pl.concat(pairs).filter(_overlaps(intervals, pl.col("ts_ns"), pl.col("end_ns")))
    timed = pl.concat([window["event_idx"], linked["event_idx"]])  # the Bs among them: their Es too
    ends = pairs[0].filter(pl.col("b_idx").is_in(timed.implode()))["e_idx"].drop_nulls()
    paired_idx = pl.concat([paired["b_idx"], paired["e_idx"].drop_nulls(), ends]).unique()
    counters = ev.filter((pl.col("ph") == "C") & pl.col("ts_ns").is_not_null())
    in_window = (
        counters.filter(pl.col("ts_ns").is_between(intervals[0][0], intervals[-1][1]))
        .select("event_idx", "ts_ns")
        .collect(engine="streaming")
        .filter(_overlaps(intervals, pl.col("ts_ns"), pl.col("ts_ns")))
        .select("event_idx")
        .lazy()
    )
    first = intervals[0][0]
    carried = (
        counters.filter(pl.col("ts_ns") < first)
        .sort("ts_ns", "event_idx")
        .group_by("pid", "pid_str", "name", "id", "id_str")
        .agg(pl.col("event_idx").last())
        .select("event_idx")
        .collect(engine="streaming")
    )
    meta = ev.filter(pl.col("ph") == "M").select("event_idx").collect(engine="streaming")
    slices = pl.concat([window, linked]).filter(pl.col("ph").is_in(["X", "B"]))  # B: timed (plain)
    flow_idx = _whole_flows(flows, slices.select(*TRACK, "ts_ns", "end_ns"))
    every = pl.concat(
        [
            window["event_idx"],
            linked["event_idx"],
            paired_idx,
            in_window.collect(engine="streaming")["event_idx"],
            carried["event_idx"],
            meta["event_idx"],
            flow_idx["event_idx"],
        ]
    )
    keep = np.unique(every.cast(pl.Int64).to_numpy())
    return Selection(
        keep,
        dict.fromkeys(carried["event_idx"].to_list(), first),
        pl.concat([window["event_idx"], paired_idx]).n_unique() + in_window.collect(engine="streaming").height,
        linked.height,
        flow_idx.height,
    )


# ------------------------------------------------------------------ writing
class _Rechunked(Exception):
    """The pieces of the trace are not those its flatten read: parse every one."""


def _wanted(src, chunking: Chunking, keep: np.ndarray):
    """The trace's events as `read_events` gives them, but for the pieces (as flatten read them:
    `chunking`) that hold no kept event: those are not parsed, their event count stands for them.
    Raises _Rechunked where the pieces and their counts disagree."""
    base, counts = 0, iter(chunking.rows)
    for piece in src.pieces(spans=chunking.spans):
        n = next(counts, None)
        if n is None or isinstance(piece, Salvaged):
            raise _Rechunked
        lo, hi = np.searchsorted(keep, [base, base + n])
        if lo == hi:
            yield n
        else:
            try:
                events = parse_events(text_of(piece))
            except ChunkParseError:
                raise _Rechunked from None
            if len(events) != n:
                raise _Rechunked
            yield events
        base += n
    if next(counts, None) is not None or src.tail.truncated:
        raise _Rechunked


def _kept(batches, sel: Selection, moves: lanes.Lanes):
    """Each batch's kept events, in file order, moved and re-dated as the selection says (a batch
    given as its event count: none kept)."""
    keep, base = sel.keep, 0
    for events in batches:
        if isinstance(events, int):
            base += events
            continue
        n = len(events)
        lo, hi = np.searchsorted(keep, [base, base + n])
        out = []
        for i in keep[lo:hi].tolist():
            e = events[i - base]
            if type(e) is dict:
                if i in sel.ts_ns:
                    e["ts"] = us_number(sel.ts_ns[i])
                t = moves.tid.get(i)
                if t is not None:
                    e["tid"] = t
            out.append(e)
        base += n
        yield out


def _source(path: str, chunking: Chunking) -> TraceSource:
    return open_trace(path) if chunking.chunk_bytes == CHUNK_BYTES else TraceSource(path, chunking.chunk_bytes)


def _write(src, batches, out_path, sel: Selection, moves: lanes.Lanes, sliced: dict, keep_secrets: bool) -> int:
    """Write the kept events of `batches` (of `src`) to out_path: how many events it holds."""
    with TraceWriter(out_path, dict(src.header.metadata), keep_secrets=keep_secrets) as out:
        for events in _kept(batches, sel, moves):
            out.write(events)
        out.tail = {**metadata_after(src), "slicedFrom": sliced}
    return out.n_events


def slice_trace(
    trace_path,
    out_path,
    window: Window | None = None,
    flat_dir=None,
    keep_secrets: bool = False,
    *,
    steps: str | None = None,
    start_us: float | None = None,
    end_us: float | None = None,
    annotation: str | None = None,
    **flatten_kwargs,
) -> SliceResult:
    """Write the events of `trace_path` in a window (with what keeps their links) to `out_path`
    (.json or .json.gz); see the module docstring. The window: `window`, or `steps` ("3:5"),
    `start_us`/`end_us` (after the trace's first event), `annotation`, as `analyze` has them.
    `flat_dir`: the trace already flattened (else it is, into a temporary directory;
    `flatten_kwargs`: workers, progress, ...)."""
    if window is None:
        window = Window(steps=steps, start_us=start_us, end_us=end_us, annotation=annotation)
    if window.empty:
        raise UsageError("slice needs a window: --steps, --start-us/--end-us or --annotation")
    path = str(trace_path)
    with open_trace(path) as src, tempfile.TemporaryDirectory(prefix="tracepipe-slice-") as tmp:
        warnings: list = []
        chunking = None
        if flat_dir is None:
            r = flatten(path, tmp, link=False, **flatten_kwargs)
            flat_dir, warnings, chunking = r.out_dir, r.warnings, r.chunking
        flat_dir = Path(flat_dir)
        intervals = window.intervals(flat_dir / "events.parquet") or []
        if not intervals:
            raise UsageError(f"{path}: the window holds no time of the trace")
        sel = select(flat_dir, intervals)
        moves = lanes.plan(
            pl.scan_parquet(flat_dir / "events.parquet"),
            pl.scan_parquet(flat_dir / "flows.parquet"),
            only=pl.Series(sel.keep),
        )
        sliced = {
            "source": Path(path).name,
            "window_us": [[us_number(a), us_number(b)] for a, b in intervals],
            "events_in_window": sel.n_in_window,
            "events_kept_for_links": sel.n_linked,
            "flow_events": sel.n_flow_events,
            "slices_moved_to_sibling_tracks": moves.moved,
        }
        if chunking is not None:  # parse only the pieces that hold kept events
            try:
                with _source(path, chunking) as again:
                    n_events = _write(
                        again, _wanted(again, chunking, sel.keep), out_path, sel, moves, sliced, keep_secrets
                    )
                    src.tail = again.tail
            except _Rechunked:
                chunking = None
        if chunking is None:
            n_events = _write(src, read_events(src), out_path, sel, moves, sliced, keep_secrets)
    return SliceResult(
        Path(out_path),
        intervals,
        n_events,
        sel.n_in_window,
        sel.n_linked,
        sel.n_flow_events,
        moves.moved,
        src.tail.truncated,
        src.tail.reason,
        warnings,
    )
