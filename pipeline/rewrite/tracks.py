"""tracks: what tracepipe knows of a trace over time, as trace events for `augment` to add.

- **Launch queue** (counter, `ph` C, named `launch queue`, one series per stream: Perfetto shows
  the track "launch queue stream 7" in the GPU's process): how many launched activities had not
  started on the stream, after every change (`analyses.queue.depth_windows`, as `analyze`'s
  queue section counts them).
- **Memory** (counters `memory allocated` and `memory reserved`, a series per device: "memory
  allocated GPU 0", in bytes) where the trace holds the profiler's `[memory]` events: the
  allocator's totals after each event, on the process that recorded them.
- **Critical path** (a process of its own, `critical path`, one track of slices): each segment of
  the critical path (`analyses.critical_path.critical_path_items`) as a slice named after its
  item (`waiting` and `launch` for the gaps), its category and the item's event index in args.
  Segments are contiguous: a float64 reader adding ts and dur could see one end a fraction of a
  ns after the next starts, so a duration is cut by the ns or two that keeps it inside.
- **Findings** (instant events on a track of their own) when `analyze` has a findings section:
  taken from the analyses' registry, so nothing here changes when rules are added; each carries
  the finding's record as the section's flat formats give it (id, title, saving range, remedy).

Each is computed window by window of time by the analyses (bounded memory) and written as a list
of events; the counters hold one event per change, the critical path one per segment.
"""

from __future__ import annotations

import math
from collections.abc import Iterator

import polars as pl

from pipeline.analyses.critical_path import critical_path_items
from pipeline.analyses.flat import Flat, as_flat
from pipeline.analyses.memory import MEMORY, memory_events
from pipeline.analyses.queue import depth_windows
from pipeline.analyses.sweep import PER_WINDOW, time_windows, within
from pipeline.render.findings import flat_rows
from pipeline.rewrite.jsonout import us_number

QUEUE = "launch queue"
ALLOCATED, RESERVED = "memory allocated", "memory reserved"
CRITICAL_PATH = "critical path"
FINDINGS = "findings"


def _device_label(device: int) -> str:
    return "CPU" if device < 0 else f"GPU {device}"


def queue_counters(f: Flat) -> Iterator[dict]:
    """A `launch queue` counter event per change of a stream's depth (the last at one instant)."""
    pids = (
        f.scan("gpu_ops")
        .filter(pl.col("device").is_not_null() & pl.col("stream").is_not_null())
        .group_by("device", "stream")
        .agg(pl.col("pid").mode().first(), pl.col("tid").mode().first())
        .collect()
    )
    where = {(d, s): (p, t) for d, s, p, t in pids.iter_rows()}
    for p in depth_windows(f):
        changes = p.filter(~pl.col("carried"))
        last = changes.group_by("device", "stream", "t", maintain_order=True).agg(pl.col("depth").last())
        for device, stream, t, depth in last.iter_rows():
            pid, tid = where.get((device, stream), (device, stream))
            yield {
                "ph": "C",
                "name": QUEUE,
                "cat": "tracepipe",
                "pid": device if pid is None else pid,
                "tid": stream if tid is None else tid,
                "ts": us_number(t),
                "args": {f"stream {stream}": depth},
            }


def memory_counters(f: Flat) -> Iterator[dict]:
    """`memory allocated` / `memory reserved` counter events, one per `[memory]` event."""
    if not f.has_memory:
        return
    events = f.path / "events.parquet"
    for window in time_windows(events, MEMORY, PER_WINDOW):
        m = memory_events(events, within(window))
        for r in m.iter_rows(named=True):
            label = _device_label(r["device"]) if r["device"] is not None else "device ?"
            for name, value in ((ALLOCATED, r["allocated"]), (RESERVED, r["reserved"])):
                if value is not None:
                    yield {
                        "ph": "C",
                        "name": name,
                        "cat": "tracepipe",
                        "pid": r["pid"],
                        "tid": r["tid"],
                        "ts": us_number(r["ts_ns"]),
                        "args": {label: value},
                    }


def free_pid(f: Flat) -> int:
    """A process id no event of the trace uses (for the tracks tracepipe adds): one past the largest
    below 2^31 (Perfetto reads pids as 32-bit: a larger one would wrap onto another)."""
    small = pl.col("pid").filter(pl.col("pid") < (1 << 31) - 1)
    top = f.scan("events").select(small.max()).collect().item()
    return max(int(top or 0), 0) + 1


def _perfetto_ns(ns: int) -> int:
    """A time as Perfetto reads what we write for it: llround(µs as a float64 x 1000)."""
    v = float(us_number(ns))
    if v == math.trunc(v):
        return int(v) * 1000
    x = v * 1000.0
    whole = math.floor(abs(x))
    whole += 1 if abs(x) - whole >= 0.5 else 0  # C's llround: halves away from zero
    return int(whole if x >= 0 else -whole)


def float_fit(start: int, end: int) -> int:
    """The duration (ns) of a slice [start, end) that no reader sees end past `end`, where the next
    segment starts: a float64 reader adding ts and dur in µs, nor Perfetto (its start read as
    llround(ts x 1000) ns, past FLOAT_EXACT_US a ns off): end - start, or a ns or two less."""
    d = end - start
    limit, p_limit = float(us_number(end)), _perfetto_ns(end)
    p_start = _perfetto_ns(start)
    while d > 0 and (float(us_number(start)) + float(us_number(d)) > limit or p_start + d > p_limit):
        d -= 1
    return d


def critical_path_track(f: Flat, pid: int) -> list[dict]:
    """The critical path as slices on a process of its own (see the module docstring)."""
    items = critical_path_items(f)
    if not items.height:
        return []
    out: list[dict] = [
        {"ph": "M", "name": "process_name", "pid": pid, "tid": 0, "args": {"name": CRITICAL_PATH}},
        {"ph": "M", "name": "process_sort_index", "pid": pid, "tid": 0, "args": {"sort_index": -1}},
        {"ph": "M", "name": "thread_name", "pid": pid, "tid": 0, "args": {"name": "critical path (tracepipe)"}},
    ]
    for idx, name, category, start, end in items.iter_rows():
        dur = float_fit(start, end)
        label = str(name) if name is not None else str(category)
        args = {"category": str(category)}
        if idx is not None:
            args["event_idx"] = idx
        out.append(
            {
                "ph": "X",
                "cat": "critical_path",
                "name": label,
                "pid": pid,
                "tid": 0,
                "ts": us_number(start),
                "dur": us_number(dur),
                "args": args,
            }
        )
    return out


def finding_events(f: Flat, pid: int) -> list[dict]:
    """Each finding of `analyze`'s findings section (when the registry has one) as an instant event
    on a track of its own, at the trace's start (a finding is about the whole window), named by its
    title, its args the finding's record as the section's flat formats (csv, xlsx) give it: rank,
    id, the saving's range (gain_low_us .. gain_high_us, their % of the window, the device time
    it frees), title, remedy, section, evidence and basis (`render.findings.flat_rows`)."""
    from pipeline.analyses import registry

    section = registry.BY_NAME.get(FINDINGS)
    if section is None:
        return []
    rows = section.compute(f, registry.Options())
    if not isinstance(rows, pl.DataFrame) or not rows.height:
        return []
    origin = f.scan("events").filter(pl.col("ph") != "M").select(pl.col("ts_ns").min()).collect().item() or 0
    out: list[dict] = [
        {"ph": "M", "name": "thread_name", "pid": pid, "tid": 1, "args": {"name": "findings (tracepipe)"}},
    ]
    for r in flat_rows(rows.to_dicts()):
        out.append(
            {
                "ph": "i",
                "s": "t",
                "cat": "finding",
                "name": str(r["title"] or r["id"] or "finding"),
                "pid": pid,
                "tid": 1,
                "ts": us_number(int(origin)),
                "args": {k: v for k, v in r.items() if v is not None and v != ""},
            }
        )
    return out


def timeline_events(flat) -> tuple[list[dict], dict[str, int]]:
    """Every event `augment` adds (counters, the critical path, the findings) and how many of each."""
    f = as_flat(flat)
    queue = list(queue_counters(f))
    memory = list(memory_counters(f))
    pid = free_pid(f)
    path = critical_path_track(f, pid)
    findings = finding_events(f, pid)
    counts = {"launch queue": len(queue), "memory": len(memory), "critical path": max(len(path) - 3, 0)}
    counts["findings"] = max(len(findings) - 1, 0)
    return queue + memory + path + findings, counts
