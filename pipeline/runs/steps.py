"""steps: one row per `ProfilerStep#N` (and device) of one trace: what a run's per-rank step
table is made of, so that whole runs never read their ranks' GPU activity again.

A kernel belongs to the step whose interval holds its start. Per step and device: the time covered
by kernels (their union), by compute kernels (every kernel but communication), by communication
kernels (category `communication`), and the exposed communication: communication time not
overlapped by compute on that device, |comm ∪ compute| - |compute|. A CPU-only trace has one row
per step (device null) with the time covered by its collectives' work (gloo).

Steps are measured per interval, not per name: a trace may hold several steps of one name (two
profiling sessions in one file, or copies of a trace put end to end), and keyed by name every
interval of a name would be joined with every other's measures, rows growing with its square (a
50 MB CPU-only trace of 10,254 copies of one step: 27 s and 9 GB before).
"""

from __future__ import annotations

import numpy as np
import polars as pl

from pipeline import store
from pipeline.runs import source
from pipeline.runs.collectives import in_steps, profiler_steps
from pipeline.runs.source import TraceTables

IS_COMM = pl.col("category") == "communication"


def union_ns(
    frame: pl.LazyFrame | pl.DataFrame, by: list[str], start: str = "ts_ns", end: str = "end_ns"
) -> pl.LazyFrame:
    """(by..., covered_ns): the length of the union of the intervals per group. Sorted by group and
    start, a run of intervals ends where one starts after every end before it in its group; a
    run covers from its first start to its last end. Found over arrays in one pass (the kernel
    time of a trace's steps took 0.29 s of the 1 GB sampled_no_device_props shape's 0.83 s of
    run tables with polars' windowed running maximum). An interval without a start is left out,
    one without an end is taken as lasting no time."""
    f, groups = _sorted_groups(frame, by, start, end)
    out = f.select(by).clear().with_columns(covered_ns=pl.lit(0, pl.Int64))
    if f.is_empty():
        return out.lazy()
    covered = _group_unions(_int64(f[start]), _int64(f[end]), groups)
    return out.vstack(f[groups].select(by).with_columns(covered_ns=pl.Series(covered, dtype=pl.Int64))).lazy()


def kernel_cover_ns(k: pl.DataFrame, by: list[str]) -> pl.DataFrame:
    """(by..., kernel_ns, compute_ns, comm_ns, exposed_comm_ns) of kernels (ts_ns, end_ns, `comm`):
    per group, the union length of all its kernels, of those not communication (`comm` false)
    and of those that are (0 where a group has none; a null `comm` is in neither), sorted once for
    the three (three `union_ns` sorted the kernels three times: ~0.03 s more of the 1 GB
    sampled_no_device_props shape's 0.3 s of steps). Where every kernel is compute (no
    communication kernel), compute's union is the kernels' and is not worked out twice (the
    1 GB v100 trace's 411K kernels: 0.15-0.17 -> 0.07 s)."""
    f, groups = _sorted_groups(k, by, "ts_ns", "end_ns", keep=["comm"])
    ts, ends = _int64(f["ts_ns"]), _int64(f["end_ns"])
    comm, compute = (f["comm"].fill_null(False).to_numpy(), (~f["comm"]).fill_null(False).to_numpy())
    covered = {"kernel_ns": _group_unions(ts, ends, groups)}
    group_of = np.repeat(np.arange(len(groups)), np.diff([*groups, len(ts)]))
    for name, rows in (("compute_ns", compute), ("comm_ns", comm)):
        if rows.all():  # every kernel (or none at all): their union
            covered[name] = covered["kernel_ns"]
            continue
        total = np.zeros(len(groups), dtype=np.int64)
        mine = group_of[rows]
        if len(mine):
            starts = np.flatnonzero(np.r_[True, mine[1:] != mine[:-1]])
            total[mine[starts]] = _group_unions(ts[rows], ends[rows], starts)
        covered[name] = total
    out = f[groups].select(by).with_columns(pl.Series(n, v, dtype=pl.Int64) for n, v in covered.items())
    return out.with_columns(exposed_comm_ns=pl.col("kernel_ns") - pl.col("compute_ns"))


def _int64(s: pl.Series) -> np.ndarray:
    return s.to_numpy().astype(np.int64)


def _sorted_groups(
    frame: pl.LazyFrame | pl.DataFrame, by: list[str], start: str, end: str, keep: list[str] | None = None
) -> tuple[pl.DataFrame, np.ndarray]:
    """`frame`'s rows with a start (`by`, start, end and `keep`), sorted by group and start, an
    end (the start where missing), and the rows where each group begins."""
    f = (
        frame.lazy()
        .select(*by, start, pl.coalesce(end, start).alias(end), *(keep or []))
        .filter(pl.col(start).is_not_null())
        .sort(*by, start)
        .collect()
    )
    if f.is_empty():
        return f, np.zeros(0, dtype=np.int64)
    first = f.select(pl.any_horizontal(pl.col(c).ne_missing(pl.col(c).shift(1)) for c in by)).to_series()
    groups = np.flatnonzero(first.to_numpy())
    groups[0] = 0  # the first row starts a group, whatever its keys
    return f, groups


def _group_unions(ts: np.ndarray, ends: np.ndarray, groups: np.ndarray) -> np.ndarray:
    """The union length of each group's intervals (sorted by group and start; `groups`: the rows
    where each begins), each group's times moved above the group before's, so that one running
    maximum over all rows is each group's own: a group spans [low, high], moved to start where
    the last ended."""
    if not len(ts):
        return np.zeros(0, dtype=np.int64)
    low = np.minimum(np.minimum.reduceat(ts, groups), np.minimum.reduceat(ends, groups))
    high = np.maximum(np.maximum.reduceat(ts, groups), np.maximum.reduceat(ends, groups))
    spans = [int(h) - int(lo) + 1 for lo, h in zip(low.tolist(), high.tolist())]
    if sum(spans) >= 1 << 62:  # no room in 64 bits: group by group
        bounds = zip(groups, [*groups[1:], len(ts)])
        return np.array([_union_lengths(ts[a:b], ends[a:b]) for a, b in bounds], dtype=np.int64)
    shift = np.repeat(np.cumsum([0, *spans[:-1]], dtype=np.int64) - low, np.diff([*groups, len(ts)]))
    return _union_lengths(ts + shift, ends + shift, groups)


def _union_lengths(ts: np.ndarray, ends: np.ndarray, groups: np.ndarray | None = None):
    """The union length of intervals sorted by start, per group (`groups`: the rows where each
    begins; None: one group, its length returned), the groups' times apart (`union_ns`)."""
    starts_group = np.zeros(len(ts), dtype=bool)
    starts_group[0 if groups is None else groups] = True
    before = np.maximum.accumulate(ends)
    new_run = starts_group.copy()
    new_run[1:] |= ts[1:] > before[:-1]
    runs = np.flatnonzero(new_run)
    lengths = np.maximum.reduceat(ends, runs) - ts[runs]
    if groups is None:
        return int(lengths.sum())
    return np.add.reduceat(lengths, np.searchsorted(runs, groups))


INTERVAL = "_interval"  # a step interval's number, in start order: what its measures are keyed by
KERNELS_AT_ONCE = 1 << 16  # kernels whose steps are measured together (about: steps are kept whole)
IS_KERNEL = (pl.col("kind") == "kernel") & pl.col("ts_ns").is_not_null()
IS_TIMED = pl.col("ts_ns").is_not_null()  # collectives: each a piece of communication work


def _kernels(flat_dir: TraceTables, since: int | None = None, until: int | None = None) -> pl.DataFrame:
    """The kernels (device, ts_ns, end_ns, comm) starting in [since, until) (None: open)."""
    return _timed(
        flat_dir,
        "gpu_ops",
        IS_KERNEL,
        since,
        until,
        "device",
        comm=pl.col("category").fill_null("") == "communication",
    )


def _timed(
    flat_dir: TraceTables, table: str, where: pl.Expr, since: int | None, until: int | None, *columns, **named
) -> pl.DataFrame:
    """The rows of `table` that `where` selects starting in [since, until) (None: open): `columns`,
    ts_ns, end_ns and the `named` expressions."""
    return source.collect(
        flat_dir,
        source.scan(flat_dir, table)
        .filter(where & source.starting_in(since, until))
        .select(*columns, "ts_ns", end_ns=pl.col("ts_ns") + pl.col("dur_ns").fill_null(0), **named),
    )


def _step_ranges(
    flat_dir: TraceTables, intervals: pl.DataFrame, table: str, where: pl.Expr
) -> list[tuple[int, int | None]] | None:
    """Time ranges [since, until) (until None: open) of runs of consecutive steps (`intervals`,
    in start order) whose kernels (the rows of `table` that `where` selects: kernels, or the
    collectives of a trace without any) start in them, about KERNELS_AT_ONCE kernels a run; None
    when the trace has none. A kernel belongs to the last step started at or before its start
    (`with_steps`), which for a kernel starting in a run's range is one of the run's steps: runs
    end only where the next step starts later. Kernels are counted per step first (their starts
    only, batch by batch), so the kernels of a whole trace are never held at once, steps of the
    same name included (each is measured as an interval of its own)."""
    starts = intervals["step_ts_ns"]
    per_step = np.zeros(starts.len() + 1, dtype=np.int64)  # [0]: kernels before the first step
    for batch in source.batches(flat_dir, table, store.BUFFER_ROWS, list(where.meta.root_names())):
        ts = batch.filter(where)["ts_ns"]
        per_step += np.bincount(starts.search_sorted(ts, side="right").to_numpy(), minlength=per_step.size)
    if not per_step.sum():
        return None
    first = starts[0]
    ranges, held = [], 0
    for k in range(starts.len() - 1):
        held += int(per_step[k + 1])
        if held >= KERNELS_AT_ONCE and starts[k + 1] > starts[k]:
            ranges.append((first, starts[k + 1]))
            first, held = starts[k + 1], 0
    return [*ranges, (first, None)]


SCHEMA = {
    "step": pl.String,
    "step_ts_ns": pl.Int64,
    "step_end_ns": pl.Int64,
    "device": pl.Int64,
    "kernel_ns": pl.Int64,
    "compute_ns": pl.Int64,
    "comm_ns": pl.Int64,
    "exposed_comm_ns": pl.Int64,
}


def steps(flat_dir: TraceTables, collectives: pl.DataFrame | None = None) -> pl.DataFrame:
    """The `steps` table of one flattened trace (schemas/steps.toml). `collectives`: the trace's
    (ts_ns, end_ns at least), for a trace without kernels; None: read from its collectives table,
    a run of steps at a time, as kernels are."""
    intervals = profiler_steps(flat_dir).with_row_index(INTERVAL)
    if not intervals.height:
        return pl.DataFrame(schema=SCHEMA)
    ranges = _step_ranges(flat_dir, intervals, "gpu_ops", IS_KERNEL) if source.has(flat_dir, "gpu_ops") else None
    if ranges is not None:  # a run of steps at a time: their kernels, never all of the trace's
        rows = pl.concat(
            [
                kernel_cover_ns(in_steps(_kernels(flat_dir, since, until), intervals), [INTERVAL, "device"])
                for since, until in ranges
            ]
        )
    else:
        comm = _comm_cover(flat_dir, intervals, collectives)
        rows = (
            intervals.select(INTERVAL)
            .join(comm.rename({"covered_ns": "comm_ns"}), on=INTERVAL, how="left")
            .with_columns(
                device=pl.lit(None, pl.Int64),
                kernel_ns=pl.lit(None, pl.Int64),
                compute_ns=pl.lit(None, pl.Int64),
                comm_ns=pl.col("comm_ns").fill_null(0),
                exposed_comm_ns=pl.lit(None, pl.Int64),
            )
        )
    out = intervals.join(rows, on=INTERVAL, how="left")
    return out.select(pl.col(c).cast(t) for c, t in SCHEMA.items()).sort("step_ts_ns", "device", nulls_last=True)


def _comm_cover(flat_dir: TraceTables, intervals: pl.DataFrame, collectives: pl.DataFrame | None) -> pl.DataFrame:
    """(INTERVAL, covered_ns) of a trace without kernels: per step, the time its collectives' work
    covers (their union). Read from the trace's collectives table a run of steps at a time when
    `collectives` is None: holding every collective's times took a 1 GB CPU-only trace of 2.35 M
    gloo collectives (`hta/cpu_only` scaled) from 280 to 430-510 MB, growing with the trace."""

    def cover(work: pl.DataFrame) -> pl.DataFrame:
        return union_ns(in_steps(work, intervals), [INTERVAL]).collect()

    if collectives is not None:
        return cover(collectives.select("ts_ns", "end_ns"))
    ranges = _step_ranges(flat_dir, intervals, "collectives", IS_TIMED) if source.has(flat_dir, "collectives") else None
    parts = [cover(_timed(flat_dir, "collectives", IS_TIMED, since, until)) for since, until in ranges or []]
    return pl.concat(parts) if parts else pl.DataFrame(schema={INTERVAL: pl.UInt32, "covered_ns": pl.Int64})
