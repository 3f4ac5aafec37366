"""lanes: slices Perfetto cannot nest, moved to sibling tracks, so that every track of a trace we
write nests.

Perfetto draws the `X` slices of one thread (pid, tid) as a stack: it takes them in time order
(at one start the longer first, then file order), pops the open slices that ended at or before a
new one's start, and a slice that starts inside the innermost open one but ends after it cannot
nest. Such a slice was dropped (Perfetto 2025) or is spilled onto an overflow track and counted as
an import error (2026; perfetto#4280); chrome://tracing misdraws it. Real traces hold them: PDL
kernels on one stream (b200_eager: 42), HIP kernels (mi300x_vllm_graph_capture: 100), CPU ops whose
rounded durations outlast their parent.

`plan` finds them and moves each offending slice to a sibling track of its thread: the same pid,
and as tid the string "<the thread's name> · overlapping slices", which Perfetto (and Chrome)
take as a thread of its own named by it, so that no event is added (a numeric tid would need an
`M` thread_name event, and `combine`'s contract is every event of its inputs, no more); a slice
that still cannot nest there goes one lane further, "... (2)". The test is Perfetto's: a slice's
parent is the innermost slice open at its start (`link.nesting`, starts ordered longer first
then in file order), and it offends when it ends after its parent. Moving the offenders of one
round can reveal others (a slice nested in a moved one), so rounds repeat, over the tracks that
moved anything, until none offends.

Timestamps are read by viewers as float64 µs: ts + dur in floats can end a slice a fraction of a
ns past its parent's end (Chrome, a Python reader), and a trace whose times are beyond
FLOAT_EXACT_US (µs since the epoch with decimals, torch_npu's) is seen by Perfetto on a grid of
~0.25 µs (a whole float x 1000, else `llround(ts * 1000)` ns), where exactly nested slices can
overlap. The test runs on each of these readings as well as on the exact times; a slice
offending in any of them moves.

Flow endpoints (`s`, `t`, `f`) bind to the slice open on their thread at their time: an endpoint at
the start of a moved slice, on its thread, moves with it. A `B` timed by its `E` is a slice like an
`X`: when it moves, the `E` that ends it (`paired`) moves too.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import polars as pl

from pipeline.link import nesting
from pipeline.read.durations import BEGIN, END, SLICE
from pipeline.read.values import FLOAT_EXACT_US

TRACK = ["pid", "pid_str", "tid", "tid_str"]
LANE_NAME = "{name} · overlapping slices"
MAX_ROUNDS = 256  # lanes a track may need; beyond, the slices left are counted, not moved


@dataclass
class Lanes:
    """Where slices move: `tid` event_idx -> the tid to write (slices and their flow endpoints: a
    string, the sibling track's name), `moved` how many slices moved, `left` how many still could
    not nest after MAX_ROUNDS (0 in every trace seen)."""

    tid: dict[int, object] = field(default_factory=dict)
    moved: int = 0
    left: int = 0

    def apply(self, events: list, first_idx: int) -> None:
        """Move the events of one batch (traceEvents[first_idx:...]) in place."""
        if not self.tid:
            return
        for i, e in enumerate(events, first_idx):
            t = self.tid.get(i)
            if t is not None and type(e) is dict:
                e["tid"] = t


def slices_of(events: pl.LazyFrame) -> pl.LazyFrame:
    """The slices Perfetto draws on thread tracks (X, and B timed by their E), from an events
    table: (event_idx, *TRACK, ts_ns, end_ns, ph)."""
    return events.filter(
        SLICE & pl.col("ts_ns").is_not_null() & pl.col("dur_ns").is_not_null() & (pl.col("dur_ns") >= 0)
    ).select("event_idx", *TRACK, "ts_ns", end_ns=pl.col("ts_ns") + pl.col("dur_ns"), ph="ph")


def paired(ev: pl.LazyFrame, begin: str, end: str, key: list[str]) -> pl.DataFrame:
    """(b_idx, e_idx, ts_ns, end_ns) of begin/end events matched as a stack per `key`, in time
    order (ends first at one instant, as Perfetto takes them); a begin never ended lasts forever
    (e_idx null), an end without a begin is left out."""
    rows = (
        ev.filter(pl.col("ph").is_in([begin, end]) & pl.col("ts_ns").is_not_null())
        .select("event_idx", *key, "ts_ns", d=pl.when(pl.col("ph") == begin).then(1).otherwise(-1))
        .collect(engine="streaming")
    )
    if not rows.height:
        return pl.DataFrame(schema={"b_idx": pl.Int64, "e_idx": pl.Int64, "ts_ns": pl.Int64, "end_ns": pl.Int64})
    g = pl.struct(key).rank("dense")
    rows = rows.with_columns(g=g).sort("g", "ts_ns", "d", "event_idx")
    rows = rows.with_columns(depth=pl.col("d").cum_sum().over("g"))
    rows = rows.with_columns(level=pl.when(pl.col("d") == 1).then("depth").otherwise(pl.col("depth") + 1))
    rows = rows.with_columns(k=pl.int_range(pl.len()).over("g", "level", "d"))
    b = rows.filter(pl.col("d") == 1).select("g", "level", "k", b_idx="event_idx", ts_ns="ts_ns")
    e = rows.filter(pl.col("d") == -1).select("g", "level", "k", e_idx="event_idx", e_ts="ts_ns")
    p = b.join(e, on=["g", "level", "k"], how="left")
    p = p.with_columns(pl.when(pl.col("e_ts") >= pl.col("ts_ns")).then(pl.col("e_idx", "e_ts")))
    return p.select("b_idx", "e_idx", "ts_ns", end_ns=pl.col("e_ts").fill_null(1 << 62))


View = tuple[pl.Series, pl.Series, "tuple[np.ndarray, np.ndarray] | None"]


def _views(x: pl.DataFrame) -> list[View]:
    """(start, end, test) of each way a viewer reads the slices' times: exactly, in ns (as Perfetto
    does below FLOAT_EXACT_US); as float64 µs, ts + dur (Chrome, Python: an end may round past the
    next slice's start), as the ordered bits of the floats with the tolerance tested on the floats;
    and, for times beyond FLOAT_EXACT_US, as Perfetto reads them (`llround(ts * 1000)` ns + dur)."""
    ts = x["ts_ns"].to_numpy()
    dur = (x["end_ns"] - x["ts_ns"]).to_numpy()
    us = (ts // 1000).astype(np.float64) + (ts % 1000) / 1000  # whole µs exactly, the lossy ones below
    lossy = (np.abs(ts) >= int(FLOAT_EXACT_US * 1000)) & (ts % 1000 != 0)
    for i in np.flatnonzero(lossy):
        us[i] = int(ts[i]) / 1000  # Python's int division rounds correctly: the float a parser reads
    end_us = us + dur / 1000
    views: list[View] = [(x["ts_ns"], x["end_ns"], None)]
    if (us > 0).all():  # positive doubles order as their bits
        views.append((pl.Series(us.view(np.int64)), pl.Series(end_us.view(np.int64)), (us, end_us)))
    if lossy.any():
        whole = np.trunc(us)
        start = np.where(us == whole, whole.astype(np.int64) * 1000, np.rint(us * 1000.0).astype(np.int64))
        views.append((pl.Series(start), pl.Series(start + dur), None))
    return views


READER_TOLERANCE_US = 1e-3  # a float reader's end may pass its parent's by float error, not by 1 ns


def _offenders(g: pl.Series, lane: pl.Series, start: pl.Series, end: pl.Series, floats, idx: pl.Series) -> pl.Series:
    """The rows (positions) whose slice ends after its parent on its (track g, lane); `floats`:
    (start, end) µs to test with, when start/end are their bits."""
    iv = pl.DataFrame({"iv_idx": idx, "pid": g, "tid": lane, "ts_ns": start, "end_ns": end})
    if floats is not None:
        iv = iv.with_columns(s_us=pl.Series(floats[0]), e_us=pl.Series(floats[1]))
    else:
        iv = iv.with_columns(s_us=pl.col("ts_ns"), e_us=pl.col("end_ns"))
    nest = nesting.nesting(iv.select("iv_idx", "pid", "tid", "ts_ns", "end_ns"), nesting.LONGER_FIRST)
    if not nest.height:
        return pl.Series([], dtype=pl.Int64)
    pos = iv.with_row_index("row").select("iv_idx", "row", "s_us", "e_us")
    parent = pos.select(parent_idx="iv_idx", p_end="e_us")
    j = nest.join(pos, on="iv_idx").join(parent, on="parent_idx", how="inner")
    tol = READER_TOLERANCE_US if floats is not None else 0
    bad = j.filter((pl.col("s_us") < pl.col("p_end")) & (pl.col("e_us") > pl.col("p_end") + tol))
    return bad["row"].cast(pl.Int64)


def lanes_of(x: pl.DataFrame) -> pl.DataFrame:
    """(event_idx, g, lane) of every slice that moves (lane >= 1); g numbers its thread (TRACK).
    `x`: slices_of(...) collected."""
    x = x.with_columns(g=pl.struct(TRACK).rank("dense").cast(pl.Int64))
    views = _views(x)
    idx, g = x["event_idx"], x["g"]
    lane = np.zeros(x.height, np.int64)
    active = np.ones(x.height, bool)  # the slices of threads still being settled
    for _ in range(MAX_ROUNDS):
        rows = np.flatnonzero(active)
        sub = pl.Series(rows)
        bad: set[int] = set()
        for start, end, floats in views:
            part = None if floats is None else (floats[0][rows], floats[1][rows])
            found = _offenders(
                g.gather(sub), pl.Series(lane[rows]), start.gather(sub), end.gather(sub), part, idx.gather(sub)
            )
            bad.update(rows[found.to_numpy()].tolist())
        if not bad:
            break
        moved = np.fromiter(bad, np.int64)
        lane[moved] += 1
        active = np.isin(g.to_numpy(), np.unique(g.to_numpy()[moved]))
    out = x.select("event_idx", "g", *TRACK, "ts_ns").with_columns(lane=pl.Series(lane))
    return out.filter(pl.col("lane") > 0)


def _thread_names(meta: pl.DataFrame) -> dict[tuple, str]:
    """(pid, pid_str, tid, tid_str) -> the thread's name, from its M thread_name events."""
    rows = meta.filter(pl.col("name") == "thread_name").select(
        *TRACK, n=pl.col("args_json").str.json_path_match("$.name")
    )
    return {tuple(r[:4]): r[4] for r in rows.iter_rows() if r[4]}


def plan(events: pl.LazyFrame, flows: pl.LazyFrame | None = None, only: pl.Series | None = None) -> Lanes:
    """Where the slices of an events table move (`Lanes`); `flows` (the flows table) gives the
    endpoints that move with them; `only`: the event_idx of the events written (a slice of the
    trace), the others left out."""
    found = slices_of(events)
    if only is not None:
        found = found.filter(pl.col("event_idx").is_in(only.implode()))
    x = found.collect(engine="streaming")
    moved = lanes_of(x.drop("ph"))
    if not moved.height:
        return Lanes()
    tracks = moved.select(*TRACK).unique()
    meta = (
        events.filter((pl.col("ph") == "M") & (pl.col("name") == "thread_name"))
        .select(*TRACK, "name", "args_json")
        .collect(engine="streaming")
    )
    names = _thread_names(meta)
    new_tid: dict[tuple, str] = {}  # (*TRACK, lane) -> tid
    used: set[tuple] = set()  # (pid, pid_str, label)
    out = Lanes(moved=moved.height)
    for key in tracks.sort(TRACK, nulls_last=True).iter_rows():
        pid, pid_str, tid, tid_str = key
        base = (names.get(key) or tid_str or f"thread {tid}").strip()
        for k in sorted(moved.filter(pl.all_horizontal(_eq(c, v) for c, v in zip(TRACK, key)))["lane"].unique()):
            label = LANE_NAME.format(name=base) + (f" ({k})" if k > 1 else "")
            if (pid, pid_str, label) in used:  # two threads of one process with one name
                label += f" [tid {tid if tid is not None else tid_str}]"
            used.add((pid, pid_str, label))
            new_tid[(*key, k)] = label
    for r in moved.iter_rows(named=True):
        out.tid[r["event_idx"]] = new_tid[(*(r[c] for c in TRACK), r["lane"])]
    begins = x.filter(pl.col("ph") == BEGIN).join(moved.select("event_idx"), on="event_idx")["event_idx"]
    if begins.len():  # a B moves with the E that ends it
        pairs = paired(events, BEGIN, END, TRACK).filter(pl.col("b_idx").is_in(begins.implode()))
        for b, e in pairs.drop_nulls("e_idx").select("b_idx", "e_idx").iter_rows():
            out.tid[e] = out.tid[b]
    if flows is not None:
        starts = moved.select(*TRACK, "ts_ns", "lane").unique(subset=[*TRACK, "ts_ns"])
        ends = (
            flows.filter(pl.col("ts_ns").is_not_null())
            .select("event_idx", *TRACK, "ts_ns")
            .join(starts.lazy(), on=[*TRACK, "ts_ns"], nulls_equal=True)
        )
        if only is not None:
            ends = ends.filter(pl.col("event_idx").is_in(only.implode()))
        for r in ends.collect(engine="streaming").iter_rows(named=True):
            out.tid[r["event_idx"]] = new_tid[(*(r[c] for c in TRACK), r["lane"])]
    return out


def _eq(column: str, value) -> pl.Expr:
    return pl.col(column).is_null() if value is None else pl.col(column) == value
