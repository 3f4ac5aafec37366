"""memory: the allocator's timeline from the profiler's `[memory]` instant events.

Each `[memory]` event (profile_memory=True) records one allocation (`Bytes` > 0) or free (< 0) and
the allocator's totals after it (`Total Allocated`, `Total Reserved`) on a device (`Device Type`
0 is the CPU, reported as device -1; else `Device Id`). Per device: the peak of Total Allocated
and when it was first reached, the innermost CPU op running there (on the event's thread), the
peak of Total Reserved; per op (by name, as key_averages' self memory columns): the bytes its own
events allocated (frees subtracted) and how many it made, on CPU and on devices; per device the
totals over time, downsampled so that every peak survives (`memory_series`, for the timeline
figure; `Extremes` does the downsampling, for `queue_series` too). Events are read window by
window in time; the ops around them are nested per window (`pipeline.link.nesting`).
"""

from __future__ import annotations

from pathlib import Path

import polars as pl

from pipeline.analyses.flat import Flat, as_flat
from pipeline.analyses.series import Extremes
from pipeline.analyses.sweep import PER_WINDOW, fold, read, time_windows, within
from pipeline.analyses.window import trace_origin_ns
from pipeline.kineto import CPU_OP_CAT
from pipeline.link import nesting
from pipeline.link.windows import EventReach
from pipeline.read.durations import SLICE
from pipeline.store import scalar_int

MEMORY = pl.col("name") == "[memory]"
CPU_DEVICE = -1


def _arg(key: str) -> pl.Expr:
    return pl.col("args_json").str.json_path_match(f"$['{key}']").cast(pl.Int64, strict=False)


def memory_events(events: Path, where: pl.Expr) -> pl.DataFrame:
    """The `[memory]` events `where` selects (event_idx, pid, tid, ts_ns): the device each was on
    (-1: the CPU), the bytes it allocated (< 0: freed) and the allocator's totals after it."""
    rows = read(events, MEMORY & where, ["event_idx", "pid", "tid", "ts_ns", "args_json"])
    device = pl.when(_arg("Device Type") == 0).then(pl.lit(CPU_DEVICE, pl.Int64)).otherwise(_arg("Device Id"))
    return rows.select(
        "event_idx",
        "pid",
        "tid",
        "ts_ns",
        device=device,
        bytes=_arg("Bytes"),
        allocated=_arg("Total Allocated"),
        reserved=_arg("Total Reserved"),
    )


def _ops_around(events: Path, reach: EventReach, a: int, b: int) -> pl.DataFrame:
    """CPU ops running at some time in [a, b]: those that start by b and end at or after a."""
    end = pl.col("ts_ns") + pl.col("dur_ns").fill_null(0)
    earliest = reach.earliest_start(a)
    where = SLICE & pl.col("cat").str.contains(CPU_OP_CAT) & pl.col("ts_ns").is_not_null()
    where &= (pl.col("ts_ns") <= b) & (end >= a)
    if earliest is not None:
        where &= pl.col("ts_ns") >= earliest
    return read(events, where, ["event_idx", "pid", "tid", "ts_ns", end.alias("end_ns"), "name"])


def _innermost(points: pl.DataFrame, ops: pl.DataFrame) -> pl.DataFrame:
    """(event_idx, op): the innermost op around each memory event on its thread (null outside ops)."""
    if not points.height:
        return points.select("event_idx", op=pl.lit(None, pl.String))
    found = nesting.enclosing(
        points.select(point_id="event_idx", pid="pid", tid="tid", t="ts_ns"),
        ops.select(iv_idx="event_idx", pid="pid", tid="tid", ts_ns="ts_ns", end_ns="end_ns"),
        nesting.LONGER_FIRST,
    )
    named = found.join(ops.select(iv_idx="event_idx", op="name"), on="iv_idx", how="left")
    return points.select("event_idx").join(named.select(event_idx="point_id", op="op"), on="event_idx", how="left")


class MemoryTally:
    """Folds windows of memory events: per device the peaks (first reached), per op the allocations."""

    def __init__(self):
        self.peaks = self.reserved = self.by_op = None

    def add(self, m: pl.DataFrame):
        m = m.sort("ts_ns", "event_idx")
        peak = (
            m.filter(pl.col("allocated").is_not_null())
            .group_by("device")
            .agg(
                pl.col("allocated").max().alias("peak"),
                pl.col("ts_ns").filter(pl.col("allocated") == pl.col("allocated").max()).first().alias("at"),
                pl.col("event_idx")
                .filter(pl.col("allocated") == pl.col("allocated").max())
                .first()
                .alias("peak_event"),
            )
        )
        self.peaks = (
            peak
            if self.peaks is None
            else (
                pl.concat([self.peaks, peak])
                .sort("device", "peak", "at", descending=[False, True, False])
                .group_by("device", maintain_order=True)
                .first()
            )
        )
        res = (
            m.filter(pl.col("reserved").is_not_null())
            .group_by("device")
            .agg(
                reserved=pl.col("reserved").max(),
                reserved_at=pl.col("ts_ns").filter(pl.col("reserved") == pl.col("reserved").max()).first(),
            )
        )
        self.reserved = (
            res
            if self.reserved is None
            else (
                pl.concat([self.reserved, res])
                .sort("device", "reserved", "reserved_at", descending=[False, True, False])
                .group_by("device", maintain_order=True)
                .first()
            )
        )
        ops = (
            m.group_by("op", pl.col("device") == CPU_DEVICE)
            .agg(
                net=pl.col("bytes").sum(),
                allocated=pl.col("bytes").filter(pl.col("bytes") > 0).sum(),
                allocations=(pl.col("bytes") > 0).sum().cast(pl.Int64),
            )
            .rename({"device": "cpu"})
        )
        self.by_op = fold(self.by_op, ops, ["op", "cpu"], [pl.col("net", "allocated", "allocations").sum()])


def _tally(f: Flat) -> tuple[MemoryTally, EventReach]:
    events = f.path / "events.parquet"
    where = f.time_filter()
    reach = EventReach.of(events)
    tally = MemoryTally()
    for window in time_windows(events, MEMORY & where, PER_WINDOW):
        m = memory_events(events, within(window) & where)
        if not m.height:
            continue
        ops = _ops_around(events, reach, scalar_int(m["ts_ns"].min()), scalar_int(m["ts_ns"].max()))
        tally.add(m.join(_innermost(m, ops), on="event_idx", how="left"))
    return tally, reach


def memory(flat) -> pl.DataFrame:
    """Per device: peak_allocated_bytes, peak_at_us (µs since the trace's first event), peak_op (the
    innermost CPU op running at the peak), peak_reserved_bytes, peak_reserved_at_us."""
    f: Flat = as_flat(flat)
    tally, _ = _tally(f)
    schema = {
        "device": pl.Int64,
        "peak_allocated_bytes": pl.Int64,
        "peak_at_us": pl.Float64,
        "peak_op": pl.String,
        "peak_reserved_bytes": pl.Int64,
        "peak_reserved_at_us": pl.Float64,
    }
    if tally.peaks is None:
        return pl.DataFrame(schema=schema)
    first = trace_origin_ns(f.path / "events.parquet")
    ops = _peak_ops(f, tally.peaks)
    out = (
        tally.peaks.join(tally.reserved, on="device", how="left")
        .join(ops, on="peak_event", how="left")
        .select(
            "device",
            peak_allocated_bytes="peak",
            peak_at_us=(pl.col("at") - first) / 1e3,
            peak_op="op",
            peak_reserved_bytes="reserved",
            peak_reserved_at_us=(pl.col("reserved_at") - first) / 1e3,
        )
    )
    return out.sort("device").cast(schema)


def _peak_ops(f: Flat, peaks: pl.DataFrame) -> pl.DataFrame:
    """(peak_event, op): the innermost op around each peak's memory event."""
    events = f.path / "events.parquet"
    points = read(
        events, pl.col("event_idx").is_in(peaks["peak_event"].implode()), ["event_idx", "pid", "tid", "ts_ns"]
    )
    if not points.height:
        return pl.DataFrame(schema={"peak_event": pl.Int64, "op": pl.String})
    t = scalar_int(points["ts_ns"].min()), scalar_int(points["ts_ns"].max())
    ops = _ops_around(events, EventReach.of(events), *t)
    return _innermost(points, ops).rename({"event_idx": "peak_event"})


def memory_by_op(flat) -> pl.DataFrame:
    """Per op name: the bytes its own memory events allocated (and net of frees) and how many, on
    the CPU and on devices (like key_averages' self_cpu_memory_usage / self_device_memory_usage);
    most allocating first. Events outside every op are under op null."""
    tally, _ = _tally(as_flat(flat))
    if tally.by_op is None:
        return pl.DataFrame(
            schema={
                "op": pl.String,
                "self_cpu_allocated_bytes": pl.Int64,
                "self_device_allocated_bytes": pl.Int64,
                "self_cpu_net_bytes": pl.Int64,
                "self_device_net_bytes": pl.Int64,
                "allocations": pl.Int64,
            }
        )
    t = tally.by_op
    side = lambda col, cpu: pl.col(col).filter(pl.col("cpu") == cpu).sum()
    return (
        t.group_by("op")
        .agg(
            self_cpu_allocated_bytes=side("allocated", True),
            self_device_allocated_bytes=side("allocated", False),
            self_cpu_net_bytes=side("net", True),
            self_device_net_bytes=side("net", False),
            allocations=pl.col("allocations").sum(),
        )
        .sort(
            pl.col("self_device_allocated_bytes") + pl.col("self_cpu_allocated_bytes"),
            "op",
            descending=[True, False],
            nulls_last=True,
        )
    )


def with_memory_columns(ops: pl.DataFrame, flat) -> pl.DataFrame:
    """The op table with each op name's self memory columns (when the trace has memory events)."""
    f: Flat = as_flat(flat)
    if not f.has_memory or "name" not in ops.columns:
        return ops
    from pipeline.analyses.names import OVERLOAD_SUFFIX

    by_name = (
        memory_by_op(f)
        .filter(pl.col("op").is_not_null())
        .with_columns(name=pl.col("op").str.replace(OVERLOAD_SUFFIX, "$1"))
        .group_by("name")
        .agg(
            self_cpu_memory_bytes=pl.col("self_cpu_net_bytes").sum(),
            self_device_memory_bytes=pl.col("self_device_net_bytes").sum(),
        )
    )
    return ops.join(by_name, on="name", how="left", maintain_order="left")


# ------------------------------------------------------------------ over time
def memory_series(flat, max_points: int = 4000) -> pl.DataFrame:
    """(device, t_us, allocated_bytes, reserved_bytes): per device (CPU is -1) the allocator's
    Total Allocated and Total Reserved after each `[memory]` event, t_us from the trace's first
    event, in time order; at most `max_points` rows per device (`Extremes`: past that, per bucket
    of time the events of its smallest and largest totals), so that the series' max equals
    memory()'s peaks, at the same time."""
    f: Flat = as_flat(flat)
    schema = pl.Schema(
        {"device": pl.Int64, "t_us": pl.Float64, "allocated_bytes": pl.Int64, "reserved_bytes": pl.Int64}
    )
    events, where = f.path / "events.parquet", f.time_filter()
    t = pl.scan_parquet(events).filter(MEMORY & where).select(lo=pl.col("ts_ns").min(), hi=pl.col("ts_ns").max())
    lo, hi = t.collect(engine="streaming").row(0)
    if lo is None:
        return pl.DataFrame(schema=schema)
    tally = Extremes(["device"], ["ts_ns", "event_idx"], ["allocated", "reserved"], (lo, hi), max_points)
    for window in time_windows(events, MEMORY & where, PER_WINDOW):
        m = memory_events(events, within(window) & where)
        tally.add(m.filter(pl.col("allocated").is_not_null() | pl.col("reserved").is_not_null()))
    out = tally.result()
    if not out.height:
        return pl.DataFrame(schema=schema)
    first = trace_origin_ns(f.path / "events.parquet")
    return out.select(
        "device", t_us=(pl.col("ts_ns") - first) / 1e3, allocated_bytes="allocated", reserved_bytes="reserved"
    ).cast(schema)
