"""decode: the group's tables (`Tables`): the events texts of a few members decoded as one chunk
(`decode_some`), then each member's metadata, devices and trace row (`finish_read`)."""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass

import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.compute as pc

from pipeline import schema, store
from pipeline.dataset.members import Member

SENTINEL = b'{"ph":"tracepipe:next-trace"}'  # between two traces' events in a joined chunk
_SENTINEL_PH = "tracepipe:next-trace"

READ_TABLES = ("events", "gpu_ops", "flows")

DECODE_BYTES = 4 << 20  # events text decoded at once (the decode holds several times its size)


@dataclass
class Tables:
    """The events, gpu_ops and flows of a group's members, member after member (each member's rows
    in its own order, event_idx its own), and the member of each row (`owner`)."""

    tables: dict[str, pa.Table]
    owner: dict[str, np.ndarray]  # int64 member index of each row
    n: int  # members

    def counts(self, name: str) -> np.ndarray:
        return np.bincount(self.owner[name], minlength=self.n)

    def starts(self, name: str) -> np.ndarray:
        """The first row of each member (and the end, last)."""
        return np.concatenate([[0], np.cumsum(self.counts(name))])


def _build(text: bytes):
    from pipeline.read.decode import build_from_text

    return build_from_text(text)


def concat(parts: list[Tables]) -> Tables:
    """Tables of consecutive groups of members as one."""
    if len(parts) == 1:
        return parts[0]
    if not parts:
        return Tables({n: _empty(n) for n in READ_TABLES}, {n: np.zeros(0, np.int64) for n in READ_TABLES}, 0)
    tables = {n: pa.concat_tables([p.tables[n] for p in parts]) for n in READ_TABLES}
    first = np.cumsum([0, *(p.n for p in parts)])
    owner = {n: np.concatenate([p.owner[n] + f for p, f in zip(parts, first)]) for n in READ_TABLES}
    return Tables(tables, owner, int(first[-1]))


def decode_some(members: list[Member]) -> tuple[list[Member], Tables]:
    """The tables of a few members, decoded: their texts joined into one chunk (a sentinel event
    between two) when that decodes without any problem, else one by one (each with its own
    problems; a member whose text does not decode goes alone). Returns the members decoded."""
    from pipeline.read.chunks import ChunkParseError
    from pipeline.read.values import Problems

    with_text = [m for m in members if m.text]
    if len(with_text) > 1:
        try:
            texts = [x for m in with_text for x in (m.text or b"", SENTINEL)]
            joined = _build(b",".join(texts[:-1]))
        except (ChunkParseError, RecursionError, ValueError):
            joined = None
        # B/E events pair per thread: joined, one member's could close another's (`read.durations`)
        if joined is not None and joined.open_ends is None and not (joined.problems.coerced or joined.problems.dropped):
            cuts = pc.indices_nonzero(pc.fill_null(pc.equal(joined.events.column("ph"), _SENTINEL_PH), False))
            if len(cuts) == len(with_text) - 1:
                for m in members:
                    m.problems, m.text = Problems(), None
                return members, _split_joined(joined, cuts.to_numpy(), members, with_text)
    decoded, parts = [], []
    for m in members:
        if not m.text:
            m.problems = Problems()
            ct_tables = {n: _empty(n) for n in READ_TABLES}
        else:
            try:
                ct = _build(m.text)
            except (ChunkParseError, RecursionError, ValueError):
                m.alone, m.text = True, None
                continue
            m.problems = ct.problems
            m.problems.unmatched.update(_unpaired(ct.open_ends))
            ct_tables = {"events": ct.events, "gpu_ops": ct.gpu_ops, "flows": ct.flows}
        m.text = None
        decoded.append(m)
        parts.append(ct_tables)
    tables = {n: pa.concat_tables([p[n] for p in parts]) if parts else _empty(n) for n in READ_TABLES}
    owner = {n: np.repeat(np.arange(len(parts), dtype=np.int64), [p[n].num_rows for p in parts]) for n in READ_TABLES}
    return decoded, Tables(tables, owner, len(decoded))


def _unpaired(left) -> Counter:
    """What a whole trace decoded as one chunk left of its B/E events: all unmatched."""
    from pipeline.read.durations import Durations

    pairs = Durations()
    pairs.feed(left, 0)
    return pairs.finish()


def _split_joined(joined, cuts: np.ndarray, members: list[Member], with_text: list[Member]) -> Tables:
    """The Tables of a joined chunk: sentinel rows dropped, event_idx made each member's own."""
    n_ev = joined.events.num_rows
    lo = np.concatenate([[0], cuts + 1])  # first event of each member with a text
    hi = np.concatenate([cuts, [n_ev]])
    index = {id(m): k for k, m in enumerate(members)}
    member_of_text = np.array([index[id(m)] for m in with_text], dtype=np.int64)
    tables, owner = {}, {}
    for name in READ_TABLES:
        t = joined.events if name == "events" else getattr(joined, name)
        if name == "events":
            keep = np.ones(n_ev, dtype=bool)
            keep[cuts] = False
            t = t.filter(pa.array(keep))
        idx = t.column("event_idx").to_numpy()
        k = np.searchsorted(hi, idx, side="left")  # the text whose [lo, hi) holds the event
        t = t.set_column(t.schema.get_field_index("event_idx"), "event_idx", pa.array(idx - lo[k], pa.int64()))
        tables[name], owner[name] = t, member_of_text[k]
    return Tables(tables, owner, len(members))


def _empty(name: str) -> pa.Table:
    return schema.table(name).arrow_schema().empty_table()


_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89abAB]")  # what `scrub` may have to fix


def finish_read(members: list[Member], t: Tables, memo: dict):
    """The rest of `flatten_into` per member: metadata scrubbed, devices, the trace row. Members
    whose deviceProperties text and device ids are the same share one devices table (`memo`)."""
    from pipeline.read.launches import LaunchCount, launch_counts_of_parts
    from pipeline.read.metadata import devices_table, trace_row
    from pipeline.read.source import Tail
    from pipeline.read.tame import BAD_UNICODE, scrub
    from pipeline.read.values import Problems

    gpu = t.tables["gpu_ops"]
    device_ids: list[set] = [set() for _ in members]
    if gpu.num_rows:
        pairs = pl.DataFrame({"m": t.owner["gpu_ops"], "device": store.series_from_arrow(gpu.column("device"))})
        for k, d in pairs.drop_nulls().unique().iter_rows():
            device_ids[k].add(d)
    cats: list[set] = [set() for _ in members]  # the event categories each holds (its layout)
    held = pl.DataFrame({"m": t.owner["events"], "cat": store.series_from_arrow(t.tables["events"].column("cat"))})
    for k, c in held.drop_nulls().unique().iter_rows():
        cats[k].add(c)
    counts = {n: t.counts(n) for n in READ_TABLES}
    first = t.starts("events")
    calls = launch_counts_of_parts(t.tables["events"], first, set().union(*cats))  # each member's
    for k, m in enumerate(members):
        if m.raw_metadata is None or _SURROGATE_ESCAPE.search(m.raw_metadata):
            m.metadata, bad_strings = scrub(m.metadata)
            if bad_strings:
                m.problems.coerced[BAD_UNICODE] += bad_strings
        key = None if m.raw_devices is None else (m.raw_devices, frozenset(device_ids[k]))
        if key is None or key not in memo:
            added = Problems()
            devices = devices_table(m.metadata, device_ids[k], added)
            if key is not None:
                memo[key] = (devices, added)
        else:
            devices, added = memo[key]
        m.problems.merge(added)
        m.devices, m.devices_key = devices, key
        n = {
            "n_events": int(counts["events"][k]),
            "n_gpu_ops": int(counts["gpu_ops"][k]),
            "n_flows": int(counts["flows"][k]),
            "n_devices": devices.num_rows,
        }
        launches = LaunchCount()  # against the device ops: device activity lost? (as `flatten_into`)
        launches.add(calls[k])
        m.row = trace_row(m.path, m.metadata, n, m.problems, Tail(), cats[k], launches.problems(n["n_gpu_ops"]))
        m.metadata = {}


def select(tbl: pa.Table, rows: np.ndarray) -> pa.Table:
    """The rows `rows` of a table, in that order."""
    return tbl.take(pa.array(rows, pa.int64()))
