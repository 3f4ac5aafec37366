"""facts: a member's manifest facts, flattened alone by `flatten` (`flatten_alone`) or in a group
(`facts`, with the spans of the group's members: `spans`)."""

from __future__ import annotations

from pathlib import Path

import polars as pl
import pyarrow.compute as pc
import pyarrow.parquet as pq

from pipeline import store
from pipeline.dataset.group.decode import Tables
from pipeline.dataset.members import Member, quarantine_message, utc_now
from pipeline.errors import OutputError, TracepipeError


def file_span(events: Path) -> tuple[int | None, int | None]:
    """Earliest ts and latest ts + dur of a trace's events file, streaming row groups."""
    lo = hi = None
    for b in pq.ParquetFile(events).iter_batches(columns=["ts_ns", "dur_ns"], batch_size=1 << 18):
        ts = b.column(0)
        end = pc.add(ts, pc.fill_null(b.column(1), 0))
        mn, mx = pc.min(ts).as_py(), pc.max(end).as_py()
        lo = mn if lo is None or (mn is not None and mn < lo) else lo
        hi = mx if hi is None or (mx is not None and mx > hi) else hi
    return lo, hi


def spans(t: Tables) -> dict[int, tuple]:
    """`file_span` of each member's events."""
    ev = t.tables["events"]
    frame = pl.DataFrame(
        {
            "m": t.owner["events"],
            "ts": store.series_from_arrow(ev.column("ts_ns")),
            "dur": store.series_from_arrow(ev.column("dur_ns")),
        }
    )
    per = frame.group_by("m").agg(lo=pl.col("ts").min(), hi=(pl.col("ts") + pl.col("dur").fill_null(0)).max())
    return {k: (lo, hi) for k, lo, hi in per.iter_rows()}


def facts(m: Member, row: dict, truncated: bool, reason: str | None, span) -> dict:
    """A member's manifest facts: status, row counts (of its trace `row`), span, times, warnings."""
    return {
        "status": "truncated" if truncated else "ok",
        "error": reason if truncated else None,
        "n_events": row["n_events"],
        "n_gpu_ops": row["n_gpu_ops"],
        "n_flows": row["n_flows"],
        "n_devices": row["n_devices"],
        "trace_start_ns": span[0],
        "trace_end_ns": span[1],
        "started_at": m.started,
        "finished_at": utc_now(),
        "warnings": "; ".join(m.warnings) or None,
    }


def flatten_alone(m: Member, scratch: Path, workers: int, max_inflate: float | None, formulas=None):
    """Flatten a member by `flatten` into `scratch`: its facts (quarantined if it is no trace)."""
    from pipeline.flatten import flatten

    m.alone = True
    captures, ids, warned = _readable_captures(m, max_inflate)
    try:
        r = flatten(
            m.path,
            scratch / m.trace_id,
            workers=workers,
            max_inflate=max_inflate,
            formulas=formulas,
            graph_captures=captures,
            capture_trace_ids=ids,
        )
    except OutputError:
        raise  # a full disk: not the file's fault, retried by the next run
    except TracepipeError as e:
        m.facts = {
            "status": "quarantined",
            "error": quarantine_message(e, m.path, m.source),
            "started_at": m.started,
            "finished_at": utc_now(),
        }
        return
    m.flat = r.out_dir
    m.warnings = warned + list(r.warnings)
    row = {"n_events": r.n_events, "n_gpu_ops": r.n_gpu_ops, "n_flows": r.n_flows, "n_devices": r.n_devices}
    m.facts = facts(m, row, r.truncated, r.truncation_reason, file_span(r.out_dir / "events.parquet"))


def _readable_captures(m: Member, max_inflate: float | None) -> tuple[list[str], list[str | None], list[str]]:
    """The capture traces beside a member (`dataset.captures`) that can be read, their trace_ids,
    and a warning for each that cannot: a bad capture trace leaves the replays unpaired, it does
    not quarantine the trace."""
    if not m.captures:
        return [], [], []
    from pipeline.dataset.captures import capture_trace_ids
    from pipeline.flatten import read_captures

    captures, ids, warned = [], [], []
    for path, tid in zip(m.captures, capture_trace_ids(m.captures)):
        try:
            read_captures([path], [tid], max_inflate)  # kept by this process for the flatten below
        except TracepipeError as e:
            warned.append(f"not paired with {e}")  # "graph capture trace PATH: why"
            continue
        captures.append(path)
        ids.append(tid)
    return captures, ids, warned
