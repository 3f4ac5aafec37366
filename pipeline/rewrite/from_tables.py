"""from_tables: a trace written back from its rows in a batch dataset (or a flattened trace), for
`combine DATASET`: the dataset is often all that is kept of a run.

The `events` table holds every element of traceEvents (schemas/events.toml): its phase, category,
name, ids, times in ns, `args` as JSON text and every other key in `extra_json`. An event is
rebuilt from them: `ts`/`dur` in µs from the ns (exactly: `jsonout.us_number`), `pid`/`tid` as
written (the string form where the trace wrote a string, `tid_str`), `id` likewise, `args` and the
other keys as they were; an element that was no object (kept whole in `extra_json`) comes back
as it was. The top-level metadata is the trace table's `metadata_json` (already redacted; its
distributedInfo too) with the trace's `deviceProperties` from the devices table.
Rows are read in `event_idx` order, a batch at a time: memory is one batch, not the trace.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import orjson
import polars as pl

from pipeline.dataset.tables import tables
from pipeline.read.durations import BEGIN
from pipeline.rewrite.jsonout import us_number

BATCH = 1 << 16
COLUMNS = ["event_idx", "ph", "cat", "name", "pid", "pid_str", "tid", "tid_str", "ts_ns", "dur_ns", "id", "id_str"]


@dataclass
class Tail:
    truncated: bool = False
    reason: str | None = None


def _loads(text: str | None):
    if text is None:
        return None
    try:
        return orjson.loads(text)
    except orjson.JSONDecodeError:
        return None


def event_of(row: dict, args_json: str | None, extra_json: str | None):
    """One traceEvents element from its events-table row."""
    extra = _loads(extra_json)
    if extra is not None and not isinstance(extra, dict):
        return extra  # not an object in the trace: kept whole
    e: dict = {}
    for key, value in (("ph", row["ph"]), ("cat", row["cat"]), ("name", row["name"])):
        if value is not None:
            e[key] = value
    for key in ("pid", "tid"):
        text, number = row[f"{key}_str"], row[key]
        if text is not None:
            e[key] = text
        elif number is not None:
            e[key] = number
    if row["ts_ns"] is not None:
        e["ts"] = us_number(row["ts_ns"])
    if row["dur_ns"] is not None and row["ph"] != BEGIN:  # a B's duration is its E's, not written
        e["dur"] = us_number(row["dur_ns"])
    if row["id_str"] is not None:
        e["id"] = row["id_str"]
    elif row["id"] is not None:
        e["id"] = row["id"]
    args = _loads(args_json)
    if args is not None:
        e["args"] = args
    if extra:
        e.update({k: v for k, v in extra.items() if k not in e})
    return e


def device_properties(devices: pl.LazyFrame) -> dict:
    """{"deviceProperties": [...]}: the trace's own entries, as it wrote them (the devices table's
    `props_json` of its deviceProperties rows, in their order); {} when it wrote none."""
    rows = devices.filter(pl.col("source") == "deviceProperties").select("props_json").collect()["props_json"]
    entries = [e for e in map(_loads, rows) if e is not None]
    return {"deviceProperties": entries} if entries else {}


class TableSource:
    """One trace of a dataset as `combine` reads a trace file: `events()` batches, `metadata`, `tail`."""

    def __init__(self, dataset: str | Path, trace_id: str):
        t = tables(dataset, {"events", "trace", "devices"})
        key = pl.col("trace_id") == trace_id
        self.events_table = t["events"].filter(key)
        row = t["trace"].filter(key).select("metadata_json", "truncated").collect()
        if not row.height:
            from pipeline.errors import DatasetError

            raise DatasetError(f"{dataset}: holds no trace {trace_id}")
        meta = _loads(row["metadata_json"][0])
        self.metadata = meta if isinstance(meta, dict) else {}
        if "devices" in t:
            self.metadata.update(device_properties(t["devices"].filter(key)))
        self.tail = Tail(bool(row["truncated"][0]), "truncated when it was flattened" if row["truncated"][0] else None)

    def events(self) -> Iterator[list]:
        """The trace's events in file order, a batch at a time (a trace's rows are in event_idx
        order in its part: a dataset's parts hold whole traces, as flatten wrote them)."""
        frame = self.events_table.select(*COLUMNS, "args_json", "extra_json")
        for rows in frame.collect_batches(chunk_size=BATCH, maintain_order=True):
            args, extra = rows["args_json"].to_list(), rows["extra_json"].to_list()
            yield [event_of(r, a, x) for r, a, x in zip(rows.select(COLUMNS).iter_rows(named=True), args, extra)]
