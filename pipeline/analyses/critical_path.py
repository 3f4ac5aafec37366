"""critical_path: the chain of dependent work that ends the trace, and what it spent its time on.

Work items: CPU slices (`ph` X, cat cpu_op/operator or a runtime/driver call, any case; annotations
and python_function frames are not work) on threads (resource (pid, tid)), and GPU activities
(gpu_ops rows) on streams (resource (device, stream)); items start in the analysis window. In a
trace without GPU activity, user annotations but ProfilerStep#N are work too (`cpu`), as they are
its device tables' activity (`activity.CPU_DEVICE`): gloo's collectives are annotations there, and
without them the HTA CPU-only trace's path was its four aten::empty, 15 µs of a 1.26 s window. Each
item has a *binding* predecessor, the dependency released latest:

- GPU item: the previous item on its stream (the latest-ending one that ended at or before its
  start; a zero-length one only before it), released at its end; or its launch call
  (launch_event_idx), released at the call's START (the activity could not start before it was
  launched). The later release binds (ties: the stream). A launch call that starts after its
  activity (clock skew) is no candidate.
- CPU item: the previous item on its thread in start order (at one start: longer first, then file
  order: a nested slice's first is its parent), released at the item's start if it was still
  running then (a parent), else at its end.
- Sync call (name containing "synchronize", any case: cudaDeviceSynchronize, cudaStreamSynchronize,
  hipDeviceSynchronize, MTIA's synchronizeStream...; or a blocking cudaMemcpy / hipMemcpy /
  cuMemcpy*, without "Async"), reached at its end: the end is bound by the latest-ending GPU item
  (any device) that ended after the call's start and at or before its end; the walk goes to that
  item at its end, and [its end, call end] is `sync`. Without one it is a CPU item like the others.

The walk starts at t = the end of an item i: [start(i), t] is i's; then it goes to the binding
predecessor p, released at r <= start(i): the gap [r, start(i)] is `launch` when p is the launch
call of GPU item i (launch delay, queueing), else `waiting`, and the walk goes on at p with t = r
(only [start(p), r] of p is on the path when p was still running at r). It stops at an item
without a predecessor. Categories: cpu (cpu ops), launch (runtime/driver calls and launch gaps),
kernel, memcpy (memcpy and memset), sync (sync calls), waiting. The segments are contiguous:
length = end of the last item - start of the first = the breakdown's sum, in integer ns. Every
step lowers (t, item order), so the walk ends.

Two departures from that rule (the length stays the breakdown's sum):
- The path is the longest of the walks from the last-ending item of each resource (ties: the later
  end), not only from the trace's last item: that may be on a thread that started late, whose
  path misses the main thread's and can be shorter than the GPU work before it (a100_nccl ends
  with a cudaEventQuery on a side thread: 601 ms, against the main thread's 667 ms).
- A gap between two items of one thread is `waiting` only where no item of the thread ran: from
  r up to the end of m, the latest-ending item started before i (an op enclosing p, or i's own
  parent), the gap is m's (its self time: `cpu` for an op). Otherwise an op's time after its last
  child, and a parent's between two children, would be `waiting` (158 ms of a100_nccl's path).

Bounded memory: items are read window by window in start time (`time_windows`); a window's
predecessors are found with polars (shift and running max per thread, join_asof per stream),
carrying per thread its last item and latest end, per stream the items that may still precede a
later one. Only numpy arrays of ~30 bytes per item are kept (start, end, event_idx, category,
predecessors). The walks are numpy, not loops: a step depends only on the state (the item, and for
a sync call whether it is reached at its end), so `_next` is one array over all states; the state
1,024 steps ahead comes from ten squarings of it, the walks' origins from jumps of 1,024 steps,
and the path's states from every 1,024th one stepped 1,024 times side by side (~12 bytes per item
more while walking; the path's segments are made 65,536 states at a time).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import numpy as np
import polars as pl

from pipeline.analyses.flat import Flat
from pipeline.analyses.sweep import read, read_among, time_windows, within
from pipeline.kineto import ANNOTATION_CATS, CPU_OP_CATS, GPU_KINDS, LAUNCH_CATS, OP_CAT, STEP_NAME, cat_regex
from pipeline.read.durations import SLICE

CATEGORIES = ("cpu", "launch", "kernel", "memcpy", "sync", "waiting")
CPU, LAUNCH, KERNEL, MEMCPY, SYNC, WAITING = range(len(CATEGORIES))


def _slices_of(*cats: str) -> pl.Expr:
    """Complete events of these categories (any case) on a thread."""
    return (
        SLICE & pl.col("cat").str.contains(cat_regex(*cats)) & pl.col("pid").is_not_null() & pl.col("tid").is_not_null()
    )


CPU_WORK = _slices_of(*CPU_OP_CATS, *LAUNCH_CATS)
_NAME = pl.col("name").cast(pl.String)
ANNOTATION_WORK = _slices_of(*ANNOTATION_CATS) & ~_NAME.str.contains(STEP_NAME)  # work where no GPU activity is
NAME = pl.col("name").cast(pl.Categorical)
CATEGORY = (
    pl.col("code")
    .replace_strict(list(range(len(CATEGORIES))), CATEGORIES, return_dtype=pl.Enum(CATEGORIES))
    .alias("category")
)
IS_SYNC = _NAME.str.contains("(?i)synchronize") | (
    _NAME.str.contains(r"^(?:cuda|hip|cu)Memcpy") & ~_NAME.str.contains("Async")
)
_END = pl.col("ts_ns") + pl.col("dur_ns").fill_null(0).clip(0)
_COLUMNS = ["event_idx", "r0", "r1", "ts_ns", "end_ns", "code", "gpu", "launch"]


def _own(s: pl.Series) -> np.ndarray:
    """A numpy copy of a column: a view would keep polars' buffer (and its allocator's pages) alive."""
    return np.array(s.to_numpy(), copy=True)


class _Items:
    """Every work item, numbered in start order (at one start: CPU items first, then longer first,
    then file order), as numpy arrays: start, end, eidx (event_idx), code (category), pred (the
    binding predecessor, -1: none; via_launch: it is the launch call), outer (CPU items: the
    latest-ending item started before on the thread), sync_to (sync calls: the GPU item they
    waited for)."""

    ARRAYS = ("start", "end", "eidx", "code", "pred", "outer")

    def __init__(self, f: Flat, per_window: int | None = None):
        events, here = f.path / "events.parquet", f.time_filter()
        is_gpu_cat = pl.col("cat").str.contains(cat_regex(*GPU_KINDS))
        work = CPU_WORK if f.has_gpu else CPU_WORK | ANNOTATION_WORK
        windows = time_windows(events, (work | is_gpu_cat) & here, per_window)
        parts: dict[str, list[np.ndarray]] = {k: [] for k in (*self.ARRAYS, "launched", "launch")}
        thread = pl.DataFrame(schema={k: pl.Int64 for k in ("r0", "r1", "id", "end_ns", "m")})
        stream = pl.DataFrame(schema={k: pl.Int64 for k in ("r0", "r1", "id", "key_end")})
        lasts = pl.DataFrame(schema={"gpu": pl.Boolean, **{k: pl.Int64 for k in ("r0", "r1", "id", "end_ns")}})
        n = 0
        for window in windows:
            w = self._read(f, events, work, here & within(window))
            w = w.sort(["ts_ns", "gpu", "end_ns", "event_idx"], descending=[False, False, True, False])
            w = w.with_columns(id=pl.int_range(n, n + w.height, dtype=pl.Int64))
            n += w.height
            lasts = pl.concat([lasts, w.select(lasts.columns)]).sort("end_ns", "id")
            lasts = lasts.unique(["gpu", "r0", "r1"], keep="last", maintain_order=True)
            cpu, thread = self._on_threads(w.filter(~pl.col("gpu")), thread)
            gpu, stream = self._on_streams(w.filter(pl.col("gpu")), stream, window[1])
            both = pl.concat([cpu, gpu]).sort("id")
            for k, col in (("start", "ts_ns"), ("end", "end_ns"), ("eidx", "event_idx"), ("code", "code")):
                parts[k].append(_own(w[col]))
            parts["pred"].append(_own(both["pred"].fill_null(-1).cast(pl.Int32)))
            parts["outer"].append(_own(both["outer"].fill_null(-1).cast(pl.Int32)))
            launched = w.filter(pl.col("launch").is_not_null())
            parts["launched"].append(_own(launched["id"].cast(pl.Int32)))
            parts["launch"].append(_own(launched["launch"]))
        types = {"code": np.int8, "pred": np.int32, "outer": np.int32, "launched": np.int32}
        a = {k: np.concatenate(parts.pop(k)) if n else np.empty(0, types.get(k, np.int64)) for k in list(parts)}
        self.start, self.end, self.eidx, self.code = a["start"], a["end"], a["eidx"], a["code"]
        self.pred, self.outer = a["pred"], a["outer"]
        self.lasts = lasts["id"].to_list()  # the last-ending item of each resource, in end order
        self.via_launch = np.zeros(n, bool)
        self.sync_to = np.full(n, -1, np.int32)
        self._bind(a["launched"], a["launch"])
        self._walker: tuple[np.ndarray, np.ndarray] | None = None  # `_steps`

    @staticmethod
    def _on_threads(cpu: pl.DataFrame, carry: pl.DataFrame) -> tuple[pl.DataFrame, pl.DataFrame]:
        """(id, pred, outer) of a window's CPU items: pred the previous item on the thread in start
        order, outer the latest-ending one started before it; and what the next window needs of
        them, per thread: the last item (id), the latest end so far (end_ns) and its item (m)."""
        thread = ["r0", "r1"]
        rows = pl.concat([carry, cpu.select(*thread, "id", "end_ns", m="id")])
        rows = rows.with_columns(latest=pl.col("end_ns").cum_max().over(thread))
        latest = pl.when(pl.col("end_ns") == pl.col("latest")).then(pl.col("m")).forward_fill().over(thread)
        rows = rows.with_columns(m=latest)
        found = rows.with_columns(pred=pl.col("id").shift(1).over(thread), outer=pl.col("m").shift(1).over(thread))
        carry = rows.unique(thread, keep="last", maintain_order=True).select(*thread, "id", end_ns="latest", m="m")
        return found.tail(cpu.height).select("id", "pred", "outer"), carry

    @staticmethod
    def _on_streams(gpu: pl.DataFrame, pool: pl.DataFrame, window_end: int | None) -> tuple[pl.DataFrame, pl.DataFrame]:
        """(id, pred, outer = null) of a window's GPU items: pred the latest-ending item on the
        stream that ended at or before its start, found among the window's items and those of
        `pool`; and the pool for the next window: per stream the latest-ending item ended by its
        start, and those ending later. Keys are 2t; a zero-length item ends at 2t + 1, after the
        items starting with it (itself included)."""
        stream = ["r0", "r1"]
        keyed = gpu.select(
            *stream, "id", key_start=2 * pl.col("ts_ns"), key_end=2 * pl.col("end_ns") + (pl.col("dur") == 0)
        )
        pool = pl.concat([pool, keyed.drop("key_start")]).sort("key_end", "id")
        found = keyed.sort("key_start").join_asof(
            pool.select(*stream, "key_end", pred="id"),
            left_on="key_start",
            right_on="key_end",
            by=stream,
            strategy="backward",
            check_sortedness=False,
        )
        if window_end is not None:
            later = pl.col("key_end") > 2 * window_end
            done = pool.filter(~later).unique(stream, keep="last", maintain_order=True)
            pool = pl.concat([done, pool.filter(later)]).sort("key_end", "id")
        return found.select("id", "pred", outer=pl.lit(None, pl.Int64)), pool

    @staticmethod
    def _read(f: Flat, events, work: pl.Expr, where: pl.Expr) -> pl.DataFrame:
        code = pl.when(pl.col("cat").str.contains(OP_CAT)).then(CPU).when(IS_SYNC).then(SYNC).otherwise(LAUNCH)
        cpu = read(
            events,
            work & where,
            ["event_idx", "pid", "tid", "ts_ns", _END.alias("end_ns"), code.cast(pl.Int8).alias("code")],
        ).select("event_idx", r0="pid", r1="tid", ts_ns="ts_ns", end_ns="end_ns", code="code", gpu=pl.lit(False))
        gpu = read(
            f.gpu_ops_file,
            where & (pl.col("kind") != "sync"),  # a stream waiting for an event does no work
            [
                "event_idx",
                pl.col("device").fill_null(-1).alias("r0"),
                pl.col("stream").fill_null(-1).alias("r1"),
                "ts_ns",
                _END.alias("end_ns"),
                pl.when(pl.col("kind") == "kernel").then(KERNEL).otherwise(MEMCPY).cast(pl.Int8).alias("code"),
                pl.lit(True).alias("gpu"),
                pl.col("launch_event_idx").alias("launch"),
            ],
        )
        return (
            pl.concat([cpu, gpu], how="diagonal_relaxed")
            .select(_COLUMNS)
            .with_columns(dur=pl.col("end_ns") - pl.col("ts_ns"))
        )

    def _bind(self, gpu: np.ndarray, launch: np.ndarray) -> None:
        """GPU items `gpu` launched by the calls of event index `launch`: the call binds instead of
        the stream predecessor when it is released later. Sync calls: the GPU item that ended
        last within them."""
        calls = np.flatnonzero((self.code == LAUNCH) | (self.code == SYNC)).astype(np.int32)
        calls = calls[np.argsort(self.eidx[calls], kind="stable")]
        if len(calls) and len(gpu):
            lp = calls[np.searchsorted(self.eidx[calls], launch).clip(0, len(calls) - 1)]
            sp = self.pred[gpu]
            stream_release = np.where(sp >= 0, self.end[sp], np.iinfo(np.int64).min)
            use = (self.eidx[lp] == launch) & (self.start[lp] <= self.start[gpu]) & (self.start[lp] > stream_release)
            self.pred[gpu[use]] = lp[use]
            self.via_launch[gpu[use]] = True
        del calls
        is_gpu = (self.code == KERNEL) | (self.code == MEMCPY)
        syncs = np.flatnonzero(self.code == SYNC)
        gpu_all = np.flatnonzero(is_gpu)
        if len(syncs) and len(gpu_all):
            by_end = gpu_all[np.argsort(self.end[gpu_all], kind="stable")]
            k = np.searchsorted(self.end[by_end], self.end[syncs], side="right") - 1
            g = by_end[k.clip(0)]
            ge, se = self.end[g], self.end[syncs]
            # within the call; ending with it only if it comes earlier in start order, so the walk ends
            ok = (k >= 0) & (ge > self.start[syncs]) & ((ge < se) | (g < syncs))
            self.sync_to[syncs[ok]] = g[ok]

    JUMP = 1 << 10  # the walks' stride: states 1,024 steps ahead are known for every state
    CHUNK = 1 << 16  # states made into segments at a time (their temporaries: ~10 MB)

    def _next(self) -> np.ndarray:
        """The walk as a function on states: state i (< n) is item i reached before its end, or at
        its end when it is no sync call; state n + k is sync call `syncs[k]` reached at its end.
        next[s] is the state a step from s reaches (the module docstring's rule), s itself where
        the walk stops."""
        n, syncs = len(self.start), self._syncs
        kind = np.dtype(np.int32 if n + len(syncs) < 2**31 else np.int64)  # half the memory, faster gathers
        nxt = np.empty(n + len(syncs), kind)
        for k in range(0, n, self.CHUNK):  # a slice at a time: the temporaries stay small
            i = np.arange(k, min(k + self.CHUNK, n), dtype=kind)
            p = self.pred[i].astype(kind)
            stop = p < 0
            pc = np.where(stop, i, p)
            r = np.where(self.via_launch[i], self.start[pc], np.minimum(self.end[pc], self.start[i]))
            nxt[i] = np.where(stop, i, self._state(pc, (self.sync_to[pc] >= 0) & (r == self.end[pc])))
        if len(syncs):
            g = self.sync_to[syncs].astype(kind)  # reached at its end
            nxt[n:] = self._state(g, self.sync_to[g] >= 0)
        return nxt

    @cached_property
    def _syncs(self) -> np.ndarray:
        """The sync calls that wait for a GPU item, in item order (state n + k is the k-th's end)."""
        return np.flatnonzero(self.sync_to >= 0)

    def _state(self, items: np.ndarray, at_sync_end: np.ndarray) -> np.ndarray:
        """The state of each item, reached at its end where `at_sync_end` (a sync call), else before."""
        at = np.searchsorted(self._syncs, items).astype(items.dtype) + len(self.start)
        return np.where(at_sync_end, at, items)

    def _entry(self, i: int) -> int:
        """The state of a walk starting at item i's end."""
        return int(self._state(np.array([i]), self.sync_to[[i]] >= 0)[0])

    def _steps(self) -> tuple[np.ndarray, np.ndarray]:
        """(`_next`, the state JUMP steps ahead of each state: where the walk stops, if sooner), made once."""
        if self._walker is None:
            nxt = ahead = self._next()
            for _ in range(self.JUMP.bit_length() - 1):
                ahead = ahead[ahead]
            self._walker = (nxt, ahead)
        return self._walker

    def origins(self, lasts: list[int]) -> list[int]:
        """Where the path ending with each of these items starts: the start of the item where a
        walk from its end stops (every state has one next state, so walks that meet stop together)."""
        if not lasts:
            return []
        nxt, ahead = self._steps()
        cur = np.array([self._entry(i) for i in lasts], nxt.dtype)
        while True:
            moved = ahead[cur]
            if np.array_equal(moved, cur):
                break
            cur = moved
        return [int(x) for x in self.start[cur]]  # a stopping state is an item's own (< n)

    def _chain(self, x: int) -> np.ndarray:
        """The states a walk from state x goes through, in walk order (the last one stops it)."""
        nxt, ahead = self._steps()
        marks = [x]  # every JUMP-th state
        while (a := int(ahead[marks[-1]])) != marks[-1]:
            marks.append(a)
        cur = np.array(marks, nxt.dtype)
        rows = np.empty((self.JUMP, len(marks)), nxt.dtype)
        for k in range(self.JUMP):
            rows[k] = cur
            cur = nxt[cur]
        states = rows.T.reshape(-1)
        last = int(np.flatnonzero(nxt[states] == states)[0])
        return states[: last + 1]

    def walk(self, i: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, int]:
        """The path ending with item i: its segments' items (-1: a gap), codes and starts in time
        order, and its end. A gap before a CPU item i is m's (outer[i]) as long as m ran."""
        states = self._chain(self._entry(i))
        parts = [self._segments(states[k : k + self.CHUNK]) for k in range(0, len(states), self.CHUNK)]
        items, codes, starts = (np.concatenate([q[j] for q in parts])[::-1].copy() for j in range(3))
        return items, codes, starts, int(self.end[i])

    def _segments(self, states: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The segments the steps from these states make, backwards in time (items, codes, starts):
        per state its own segment, then the gap (waiting, or launch), then the outer item's part."""
        n = len(self.start)
        at_sync = states >= n
        item = states.copy()
        item[at_sync] = self._syncs[states[at_sync] - n]
        g = np.where(at_sync, self.sync_to[item], 0)
        s = np.where(at_sync, self.end[g], self.start[item])
        code = np.where(at_sync, SYNC, self.code[item]).astype(np.int8)
        p = self.pred[item]
        via = self.via_launch[item]
        normal = ~at_sync & (p >= 0)
        pc = np.where(normal, p, 0)
        r = np.where(normal, np.where(via, self.start[pc], np.minimum(self.end[pc], s)), s)
        x = self.outer[item]
        xc = np.where(x >= 0, x, 0)
        gap = normal & (r < s)
        runs = gap & (x >= 0) & (self.end[xc] > r)
        held = np.where(runs, np.minimum(self.end[xc], s), r)
        items = np.stack([item.astype(np.int32), np.full(len(item), -1, np.int32), x.astype(np.int32)], axis=1)
        codes = np.stack([code, np.where(via, LAUNCH, WAITING).astype(np.int8), self.code[xc]], axis=1)
        starts = np.stack([s, held, r], axis=1)
        keep = np.stack([np.ones(len(gap), bool), gap & (held < s), gap & (held > r)], axis=1)
        return items[keep], codes[keep], starts[keep]


@dataclass
class CriticalPath:
    """The critical path, in time order: segment k is [start[k], start[k + 1]) (the last one ends at
    `end`), `eidx` its item's event_idx (-1: a gap), `code` its category (index in CATEGORIES);
    `first`: the first start of any item in the trace."""

    eidx: np.ndarray
    code: np.ndarray
    start: np.ndarray
    end: int
    first: int

    @property
    def ns(self) -> np.ndarray:
        return np.diff(self.start, append=self.end)


def critical_path_arrays(f: Flat, per_window: int | None = None) -> CriticalPath:
    """The critical path as numpy arrays (`CriticalPath`), the longest of the walks from each resource's last item."""
    it = _Items(f, per_window)
    if not len(it.start):
        return CriticalPath(np.empty(0, np.int64), np.empty(0, np.int8), np.empty(0, np.int64), 0, 0)
    lasts, origins = it.lasts, it.origins(it.lasts)
    best = max(range(len(lasts)), key=lambda k: (it.end[lasts[k]] - origins[k], it.end[lasts[k]]))
    items, codes, starts, end = it.walk(lasts[best])
    return CriticalPath(np.where(items >= 0, it.eidx[items.clip(0)], -1), codes, starts, end, int(it.start.min()))


def _names(f: Flat, events: np.ndarray) -> pl.DataFrame:
    """(event_idx, name) of these events (unique, sorted), a slice of them at a time."""
    parts, step = [pl.DataFrame(schema={"event_idx": pl.Int64, "name": pl.Categorical})], 1 << 18
    for k in range(0, len(events), step):
        some = pl.Series(events[k : k + step])
        parts.append(read_among(f.path / "events.parquet", pl.lit(True), "event_idx", some, ["event_idx", NAME]))
    return pl.concat(parts)


def critical_path_items(f: Flat, per_window: int | None = None) -> pl.DataFrame:
    """The critical path, one row per segment in time order: event_idx (null for a gap), name,
    category, start_ns, end_ns. An item the path passes at one instant (a launch call, left at its
    start for its kernel) has start_ns == end_ns; an op whose end and start are on the path at
    different places (see `_Items.walk`) has a row for each."""
    p = critical_path_arrays(f, per_window)
    events = np.unique(p.eidx[p.eidx >= 0])
    names = _names(f, events)["name"]  # in event order, one per event
    name = names.gather(np.searchsorted(events, p.eidx).clip(0, max(len(events) - 1, 0))) if len(events) else names
    seg = pl.DataFrame(
        {"event_idx": p.eidx, "name": name, "code": p.code, "start_ns": p.start, "end_ns": p.start + p.ns}
    )
    seg = seg.with_columns(pl.when(pl.col("event_idx") >= 0).then(pl.col("event_idx", "name")))
    return seg.select("event_idx", "name", CATEGORY, "start_ns", "end_ns")


def critical_path(f: Flat, per_window: int | None = None, top: int = 10) -> dict:
    """The critical path's length and start/end (µs since the trace's first item starts), its
    breakdown by category, the number of items on it and the `top` names with most time on it."""
    p = critical_path_arrays(f, per_window)
    ns = p.ns
    breakdown = {c: int(ns[p.code == k].sum()) / 1000 for k, c in enumerate(CATEGORIES)}
    start, end, first = (int(p.start[0]) if len(p.start) else p.end), p.end, p.first
    on = p.eidx >= 0
    events, where = np.unique(p.eidx[on], return_inverse=True)
    item_ns = np.zeros(len(events), np.int64)
    np.add.at(item_ns, where, ns[on])
    item_code = np.zeros(len(events), np.int8)
    item_code[where] = p.code[on]
    del p, ns, on, where
    items = pl.DataFrame({"event_idx": events, "code": item_code, "ns": item_ns})
    names = (
        items.join(_names(f, events), on="event_idx", how="left")
        .group_by("name", "code")
        .agg(pl.col("ns").sum())
        .select(pl.col("name").cast(pl.String), CATEGORY, "ns")
        .sort(["ns", "name", "category"], descending=[True, False, False])
        .head(top)
    )
    return {
        "length_us": (end - start) / 1000,
        "breakdown_us": breakdown,
        "start_us": (start - first) / 1000,
        "end_us": (end - first) / 1000,
        "items": len(events),
        "top": [{"name": n, "category": c, "us": v / 1000} for n, c, v in names.iter_rows()],
    }


def critical_path_frame(f: Flat) -> pl.DataFrame:
    """`critical_path` as one row (breakdown_us a struct, top a list of structs): `analyze`'s
    critical-path section; `critical_path_views` makes its tables."""
    return pl.DataFrame([critical_path(f)])


def critical_path_views(row: pl.DataFrame) -> dict[str, pl.DataFrame]:
    """The section's tables: time on the path per category (and the total), the names with most."""
    if not row.height:
        return {}
    d = row.row(0, named=True)
    length = d["length_us"] or 0.0
    parts = [(c, us) for c, us in (d["breakdown_us"] or {}).items()] + [("total", length)]
    by_category = pl.DataFrame(
        {"category": [c for c, _ in parts], "us": [us for _, us in parts]},
        schema={"category": pl.String, "us": pl.Float64},
    ).with_columns(pct=pl.col("us") * 100 / length if length else pl.lit(None, pl.Float64))
    top = pl.DataFrame(d["top"] or [], schema={"name": pl.String, "category": pl.String, "us": pl.Float64})
    return {"critical-path": by_category, "critical-path-top": top.with_columns(pct=pl.col("us") * 100 / length)}
