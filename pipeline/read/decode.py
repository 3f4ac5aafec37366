"""columns: one chunk of traceEvents text -> typed Arrow tables (events, gpu_ops, flows).

`build_from_text` runs in the worker processes. It tries three builders, fastest first, each
giving the same tables for the chunks it accepts:

0. `by_native.tables_by_native`: the compiled builder (`native/`), when it is installed: one
   simdjson pass over the text fills what the struct builder fills;
1. `_tables_by_struct`: msgspec decodes the chunk straight into typed structs (no dict per
   event, `args` kept as its raw JSON text, never parsed and re-serialised); it accepts a chunk
   only when every event has the plain shape (known keys, each of its usual type);
2. `_events_by_column`: orjson dicts, columns built a key at a time by C-level loops;
   it accepts a chunk when every value is of its column's type;
3. `_events_by_event`: one event at a time; every odd value is coerced and counted by reason.

Every value either lands in a typed column or is counted by reason in `Problems`; nothing is
dropped silently (the raw value always stays in `args_json` / `extra_json`). `args_json` is the
args object's JSON text as the trace writes it (its whitespace included) wherever the chunk is
valid JSON, so tables do not depend on which builder took a chunk.
"""

from __future__ import annotations

from itertools import repeat

import pyarrow as pa
import pyarrow.compute as pc

from pipeline.read.by_dicts import EMPTY_ARGS, events_by_column, events_by_event, gpu_arg_columns
from pipeline.read.by_native import tables_by_native
from pipeline.read.by_struct import raw_args_of, tables_by_struct
from pipeline.read.chunks import ChunkParseError, NeedsExactParse, parse_chunk, parse_chunk_exact
from pipeline.read.durations import pair_chunk
from pipeline.read.launches import launch_counts
from pipeline.read.tables import ChunkTables, flows_of, gpu_and_flow_rows, gpu_ops_of
from pipeline.read.tame import BAD_UNICODE, TOO_DEEP, TooDeep, scrub, tame_deep
from pipeline.read.values import Problems


def build_from_text(text: bytes) -> ChunkTables:
    """Parse one chunk of traceEvents text and build its tables (the worker's job). Values nested
    too deep for the parsers are kept as their text and counted (`pipeline.tame`)."""
    try:
        return _paired(_build_from_text(text))
    except (RecursionError, TooDeep):
        tamed, n = tame_deep(text)
        if not n:  # the deep value goes on past this chunk: a cut to merge with the next
            raise ChunkParseError("a value nested too deep goes on past the chunk") from None
        tables = _build_from_text(tamed)
        tables.problems.coerced[TOO_DEEP] += n
        return _paired(tables)


def _paired(tables: ChunkTables) -> ChunkTables:
    """The chunk's B/E events paired into durations on their B rows, what is left open kept for the
    next chunks (`read.durations`); its launch calls counted and its categories listed, here in the
    worker rather than in the process writing the tables. Every builder's tables go through here."""
    tables.events, tables.open_ends = pair_chunk(tables.events)
    if tables.launches is None:  # the native pass lists the categories and counts the launches as it reads
        tables.cats = set(pc.unique(tables.events.column("cat")).to_pylist())
        tables.launches = launch_counts(tables.events, tables.cats)
    return tables


def _build_from_text(text: bytes) -> ChunkTables:
    tables = tables_by_native(text)  # None when not installed, turned off, or not for this chunk
    if tables is not None:
        return tables
    tables = tables_by_struct(text)
    if tables is not None:
        return tables
    raw_args = raw_args_of(text)
    try:
        return _build_scrubbed(parse_chunk(text), text, raw_args)
    except NeedsExactParse:
        return _build_scrubbed(parse_chunk_exact(text), None, raw_args)


def build_chunk(events: list, text: bytes | None = None, raw_args: list | None = None) -> ChunkTables:
    """The tables of parsed events (a salvaged stretch), B/E pairs paired as `build_from_text` does."""
    return _paired(_build_scrubbed(events, text, raw_args))


def _build_scrubbed(events: list, text: bytes | None = None, raw_args: list | None = None) -> ChunkTables:
    """`_build_chunk`; strings holding a lone surrogate (no UTF-8 for it) fixed first and counted."""
    try:
        return _build_chunk(events, text, raw_args)
    except UnicodeEncodeError:
        events, n = scrub(events)
        tables = _build_chunk(events, text, raw_args)
        tables.problems.coerced[BAD_UNICODE] += n
        return tables


def _build_chunk(events: list, text: bytes | None = None, raw_args: list | None = None) -> ChunkTables:
    """Typed tables for one chunk of parsed events; event_idx is local (0-based) to the chunk.

    The common case (every value of the type its column wants) is built column by column by
    C-level loops (`events_by_column`); a chunk with any odd value is built event by event by
    `events_by_event`, which coerces and counts every such value. Both give the same tables.
    `raw_args` (`raw_args_of`) gives each event's args as the trace writes them; without it args
    are serialised again.
    """
    problems = Problems()
    ev_table = events_by_column(events, text, raw_args, problems)
    if ev_table is None:
        ev_table = events_by_event(events, text, raw_args, problems)
    gpu_rows, flow_rows = gpu_and_flow_rows(ev_table)
    gpu = [events[i] for i in gpu_rows]  # GPU events and flow endpoints are objects (their ph and cat say so)
    gpu_args = [a if type(a) is dict else EMPTY_ARGS for a in map(dict.get, gpu, repeat("args"))]
    gpu_table, device_ids, task_pids = gpu_ops_of(
        gpu_rows,
        [e.get("cat") for e in gpu],
        [e.get("pid") for e in gpu],
        gpu_arg_columns(gpu_args),
        ev_table,
        problems,
    )
    bps = (events[i].get("bp") for i in flow_rows.to_pylist())
    bp = pa.array([v if type(v) is str else None for v in bps], pa.string())
    flows_table = flows_of(flow_rows, bp, ev_table)
    return ChunkTables(ev_table, gpu_table, flows_table, problems, device_ids, task_pids)
