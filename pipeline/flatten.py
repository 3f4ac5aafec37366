"""flatten: parsed trace events -> typed Arrow columns (events, gpu_ops, flows).

`build_chunk` turns one chunk of events into Arrow tables; it runs in worker processes.
Every value either lands in a typed column or is counted by reason in `problems`; nothing
is dropped silently (the raw value always stays in `args_json` / `extra_json`).
"""
from __future__ import annotations

import datetime as _dt
import functools
import gc
import hashlib
import math
import multiprocessing as _mp
import os
import re
import shutil
import tempfile
from collections import Counter
from dataclasses import dataclass, field
from itertools import repeat
from decimal import Decimal, InvalidOperation
from pathlib import Path
from typing import Callable

import orjson
import pyarrow as pa
import pyarrow.compute as pc

from . import __version__, schema, store
from .errors import BadTrace
from .reader import (NeedsExactParse, TraceSource, _run_local, ordered_results, parse_chunk, parse_chunk_exact,
                     text_of)

# cat -> kind of GPU/accelerator activity (case as written; old layouts capitalise)
GPU_KINDS = {
    "kernel": "kernel", "Kernel": "kernel",
    "gpu_memcpy": "memcpy", "Memcpy": "memcpy", "memcpy": "memcpy",
    "gpu_memset": "memset", "Memset": "memset", "memset": "memset",
    "mtia_ccp_events": "kernel",
}
FLOW_PHASES = frozenset(("s", "f", "t"))
KNOWN_KEYS = frozenset(("ph", "cat", "name", "pid", "tid", "ts", "dur", "args", "id"))
INT64_MAX = 2**63 - 1
# |µs| below this: round(x * 1000) of a float is the exact nanosecond count of its
# (≤ 3-decimal) text. Larger floats are re-parsed from the decimal text (NeedsExactParse).
FLOAT_EXACT_US = 4.39e12
_NS = Decimal(1000)


def _json_default(v):
    if isinstance(v, Decimal):
        if v.is_finite():
            return orjson.Fragment(str(v).encode())
        return None
    raise TypeError


def dumps(v) -> bytes:
    return orjson.dumps(v, default=_json_default)


@dataclass
class Problems:
    """Counts of coerced and dropped values, by reason."""

    coerced: Counter = field(default_factory=Counter)
    dropped: Counter = field(default_factory=Counter)

    def merge(self, other: "Problems"):
        self.coerced.update(other.coerced)
        self.dropped.update(other.dropped)


def us_to_ns(v, what: str, problems: Problems):
    """A µs time value (int, float, Decimal or numeric string) as int64 ns, else None."""
    t = type(v)
    if t is int:
        ns = v * 1000
    elif t is float:
        if -FLOAT_EXACT_US < v < FLOAT_EXACT_US:
            return round(v * 1000)
        if math.isnan(v) or math.isinf(v):
            problems.dropped[f"{what}_not_finite"] += 1
            return None
        raise NeedsExactParse(what)
    elif v is None:
        return None
    else:
        if t is not Decimal:
            if t is bool or not isinstance(v, str):
                problems.dropped[f"{what}_wrong_type"] += 1
                return None
            try:
                v = Decimal(v.strip())
            except InvalidOperation:
                problems.dropped[f"{what}_not_a_number"] += 1
                return None
            problems.coerced[f"{what}_string_to_number"] += 1
        if not v.is_finite():
            problems.dropped[f"{what}_not_finite"] += 1
            return None
        ns = int((v * _NS).to_integral_value())
    if -INT64_MAX <= ns <= INT64_MAX:
        return ns
    problems.dropped[f"{what}_out_of_range"] += 1
    return None


def as_int(v, what: str, problems: Problems):
    """An id-like value as int64: ints as they are, integral floats and numeric/hex strings coerced."""
    t = type(v)
    if t is int:
        if -INT64_MAX <= v <= INT64_MAX:
            return v
        problems.dropped[f"{what}_out_of_range"] += 1
        return None
    if v is None:
        return None
    try:
        if t is str:
            s = v.strip()
            n = int(s, 16) if s[:2].lower() == "0x" else int(s)
        elif t is float or t is Decimal:
            if v != v or v in (math.inf, -math.inf) or v != int(v):
                problems.dropped[f"{what}_not_integer"] += 1
                return None
            n = int(v)
        else:
            problems.dropped[f"{what}_wrong_type"] += 1
            return None
    except (ValueError, OverflowError, InvalidOperation):
        problems.dropped[f"{what}_not_integer"] += 1
        return None
    if -INT64_MAX <= n <= INT64_MAX:
        problems.coerced[f"{what}_to_int"] += 1
        return n
    problems.dropped[f"{what}_out_of_range"] += 1
    return None


def _as_float(v):
    t = type(v)
    if t is float or t is int:
        return float(v)
    if t is Decimal:
        return float(v)
    return None


def _text(v, what, problems):
    if v is None or type(v) is str:
        return v
    problems.coerced[f"{what}_not_string"] += 1
    return dumps(v).decode()


def _dim(v, i):
    if type(v) is list and len(v) > i and type(v[i]) is int:
        return v[i]
    return None


@dataclass
class ChunkTables:
    events: pa.Table
    gpu_ops: pa.Table
    flows: pa.Table
    problems: Problems
    device_ids: set


_TS_TEXT = re.compile(rb'"ts"\s*:\s*(-?[0-9][0-9.eE+-]*|[^,}\s]+)')


class TimestampTexts:
    """Exact ns for float timestamps too large for a float64, from the chunk's own text.

    The k-th `"ts":` in the text belongs to the k-th event that has a `ts` key; that alignment
    is verified (same count, and the text parses to the same float) before a value is used.
    Anything unexpected raises NeedsExactParse (the chunk is then parsed with ijson).
    """

    def __init__(self, text: bytes | None, events: list):
        self.text, self.events, self._texts, self._ordinal = text, events, None, None

    def ns(self, i: int, value: float) -> int:
        if self.text is None:
            raise NeedsExactParse("ts")
        if self._texts is None:
            self._texts = _TS_TEXT.findall(self.text)
            with_ts = [j for j, e in enumerate(self.events) if type(e) is dict and "ts" in e]
            if len(with_ts) != len(self._texts):
                raise NeedsExactParse("ts")
            self._ordinal = {j: k for k, j in enumerate(with_ts)}
        t = self._texts[self._ordinal[i]]
        whole, dot, frac = t.partition(b".")
        if not dot or len(frac) > 3 or not frac.isdigit() or float(t) != value:
            raise NeedsExactParse("ts")
        ns = abs(int(whole)) * 1000 + int(frac.ljust(3, b"0"))
        return -ns if whole.startswith(b"-") else ns


def build_chunk(events: list, text: bytes | None = None) -> ChunkTables:
    """Typed tables for one chunk of parsed events; event_idx is local (0-based) to the chunk.

    The common case (every value of the type its column wants) is built column by column by
    C-level loops (`_events_by_column`); a chunk with any odd value is built event by event by
    `_events_by_event`, which coerces and counts every such value. Both give the same tables.
    """
    problems = Problems()
    ev_table = _events_by_column(events, text)
    if ev_table is None:
        ev_table = _events_by_event(events, text, problems)
    ph, cat = ev_table.column("ph"), ev_table.column("cat")
    flow_rows = pc.indices_nonzero(pc.fill_null(pc.is_in(ph, _FLOW_PHASES_ARRAY), False)).to_pylist()
    is_gpu = pc.and_(pc.equal(ph, "X"), pc.is_in(cat, _GPU_CATS_ARRAY))
    gpu_rows = pc.indices_nonzero(pc.fill_null(is_gpu, False)).to_pylist()
    gpu_table, device_ids = _gpu_ops(events, gpu_rows, ev_table, problems)
    flows_table = _flows(events, flow_rows, ev_table)
    return ChunkTables(ev_table, gpu_table, flows_table, problems, device_ids)


_FLOW_PHASES_ARRAY = pa.array(sorted(FLOW_PHASES), pa.string())
_GPU_CATS_ARRAY = pa.array(sorted(GPU_KINDS), pa.string())
_NONE = type(None)
_INT_OR_NONE, _STR_OR_NONE, _DICT_OR_NONE = {int, _NONE}, {str, _NONE}, {dict, _NONE}
_NUMBER_OR_NONE = {int, float, _NONE}
_EMPTY: dict = {}


def _events_table(cols: dict) -> pa.Table:
    n = len(cols["ph"])
    return pa.table({"event_idx": pa.array(range(n), pa.int64()), **cols})


def _events_by_column(events: list, text: bytes | None) -> pa.Table | None:
    """The events table built a column at a time with C-level loops (map, Arrow compute).

    Returns None as soon as any value is not of its column's plain type (a non-object event,
    a non-string name, a float id, an out-of-range integer, ...): such chunks go through
    `_events_by_event`, which counts each coercion.
    """
    if set(map(type, events)) - {dict}:
        return None
    get = dict.get
    raw = {k: list(map(get, events, repeat(k))) for k in ("ph", "cat", "name", "pid", "tid", "ts", "dur", "id", "args")}
    cols = {}
    for k in ("ph", "cat", "name"):
        if set(map(type, raw[k])) - _STR_OR_NONE:
            return None
        cols[k] = pa.array(raw[k], pa.string())
    for k in ("pid", "tid"):
        split = _int_or_str_columns(raw[k])
        if split is None:
            return None
        cols[k], cols[f"{k}_str"] = split
    ts = _ns_column(raw["ts"], events, text)
    dur = _ns_column(raw["dur"], None, None)
    ids = _int_or_str_columns(raw["id"])
    args = raw["args"]
    if ts is None or dur is None or ids is None or set(map(type, args)) - _DICT_OR_NONE:
        return None
    cols["ts_ns"], cols["dur_ns"] = ts, dur
    cols["id"], cols["id_str"] = ids
    arg_dicts = [a or _EMPTY for a in args]
    corr = _int_column(list(map(get, arg_dicts, repeat("correlation"))))
    ext = _int_column(list(map(get, arg_dicts, repeat("External id"))))
    if text is None or b'"external id"' in text:
        lower = _int_column(list(map(get, arg_dicts, repeat("external id"))))
        ext = None if ext is None or lower is None else pc.coalesce(ext, lower)
    if corr is None or ext is None:
        return None
    cols["correlation"], cols["external_id"] = corr, ext
    args_text = pa.array(list(map(bytes.decode, map(_dumps_exact, args))), pa.string())
    cols["args_json"] = pc.if_else(pc.equal(args_text, "null"), pa.scalar(None, pa.string()), args_text)
    cols["extra_json"] = _extra_json(events, cols)
    return _events_table({k: cols[k] for k in _EVENT_COLUMNS})


_EVENT_COLUMNS = ("ph", "cat", "name", "pid", "pid_str", "tid", "tid_str", "ts_ns", "dur_ns", "id", "id_str",
                  "correlation", "external_id", "args_json", "extra_json")
_INT64_MIN = -(2**63)


_dumps_exact = functools.partial(orjson.dumps, default=_json_default)  # C-level: no Python frame per event


def _extra_json(events: list, cols: dict) -> pa.Array:
    """Keys other than the known ones, as a JSON object per event (null when there are none).

    An event's key count against the known columns it filled tells, without looking at its
    keys, that it has no other key, or only `bp` (flow ends); only the rest are looked at.
    """
    bp = list(map(dict.get, events, repeat("bp")))
    filled = [pc.is_valid(cols[k]) for k in ("ph", "cat", "name", "ts_ns", "dur_ns", "args_json")]
    filled += [pc.or_(pc.is_valid(cols[k]), pc.is_valid(cols[f"{k}_str"])) for k in ("pid", "tid", "id")]
    bp_text = pa.array(list(map(bytes.decode, map(_dumps_exact, bp))), pa.string())
    has_bp = pc.not_equal(bp_text, "null")
    count = functools.reduce(pc.add, [pc.cast(f, pa.int32()) for f in filled + [has_bp]])
    odd = pc.not_equal(pa.array(list(map(len, events)), pa.int32()), count)
    out = pc.if_else(has_bp, pc.binary_join_element_wise('{"bp":', bp_text, "}", ""), pa.scalar(None, pa.string()))
    odd_rows = pc.indices_nonzero(odd).to_pylist()
    if not odd_rows:
        return out
    texts = []
    for i in odd_rows:
        extra = {k: v for k, v in events[i].items() if k not in KNOWN_KEYS}
        texts.append(dumps(extra).decode() if extra else None)
    return pc.replace_with_mask(out, odd, pa.array(texts, pa.string()))


def _int_column(values: list) -> pa.Array | None:
    """int64 Array of ints/None, or None if any value is another type or outside ±INT64_MAX."""
    if set(map(type, values)) - _INT_OR_NONE:
        return None
    try:
        arr = pa.array(values, pa.int64())
    except OverflowError:
        return None
    low = pc.min(arr).as_py()
    return None if low == _INT64_MIN else arr


def _int_or_str_columns(values: list) -> tuple[pa.Array, pa.Array] | None:
    """(int64 column, string column) of values that are ints, strings or None; else None."""
    types = set(map(type, values))
    if not types - _INT_OR_NONE:
        ints = _int_column(values)
        return None if ints is None else (ints, pa.nulls(len(values), pa.string()))
    if types - {int, str, _NONE}:
        return None
    ints = _int_column([v if type(v) is int else None for v in values])
    strs = pa.array([v if type(v) is str else None for v in values], pa.string())
    return None if ints is None else (ints, strs)


def _ns_column(values: list, events: list | None, text: bytes | None) -> pa.Array | None:
    """µs values (int/float/None) as int64 ns, exactly as `us_to_ns`; None if that needs coercion.

    Floats below FLOAT_EXACT_US: round(v * 1000) (Arrow rounds half to even, as Python does).
    Larger floats (epoch-based timestamps) take their exact decimal text from the chunk
    (`_exact_ns_from_text`); without text they are left to the event-by-event path.
    """
    types = set(map(type, values))
    if types - _NUMBER_OR_NONE:
        return None
    if float not in types:
        ints = _int_column(values)
        if ints is None:
            return None
        try:
            return pc.multiply_checked(ints, pa.scalar(1000, pa.int64()))
        except pa.ArrowInvalid:
            return None
    arr = pa.array(values, pa.float64())
    if pc.all(pc.less(pc.abs(arr), FLOAT_EXACT_US)).as_py() is not False:
        return pc.cast(pc.round(pc.multiply(arr, 1000.0)), pa.int64())
    if events is None or text is None or int in types:
        return None
    return _exact_ns_from_text(arr, events, text)


_EXACT_TS_TEXT = r"^-?[0-9]+\.[0-9]{1,3}$"


def _exact_ns_from_text(values: pa.Array, events: list, text: bytes) -> pa.Array | None:
    """int64 ns of float timestamps from their decimal text in the chunk (see TimestampTexts).

    The k-th `"ts":` text belongs to the k-th event with a `ts` key; that alignment and every
    value are verified (the text parses to the same float) or None is returned.
    """
    if not pc.all(pc.less(pc.abs(values), 9.2e15)).as_py():
        return None
    texts = _TS_TEXT.findall(text)
    has_ts = pa.array(list(map(dict.__contains__, events, repeat("ts"))), pa.bool_())
    if len(texts) != pc.sum(has_ts).as_py() or values.null_count:
        return None  # a ts key inside args or a null ts: leave it to the careful path
    s = pa.array(texts, pa.binary()).cast(pa.string())
    if not pc.all(pc.match_substring_regex(s, _EXACT_TS_TEXT)).as_py():
        return None
    if not pc.all(pc.equal(pc.cast(s, pa.float64()), values)).as_py():
        return None
    negative = pc.starts_with(s, "-")
    parts = pc.split_pattern(pc.utf8_ltrim(s, "-"), ".")
    whole = pc.cast(pc.list_element(parts, 0), pa.int64())
    frac = pc.cast(pc.utf8_rpad(pc.list_element(parts, 1), 3, "0"), pa.int64())
    ns = pc.add(pc.multiply(whole, 1000), frac)
    return pc.if_else(negative, pc.negate(ns), ns)


def _events_by_event(events: list, text: bytes | None, problems: Problems) -> pa.Table:
    """The events table built one event at a time: every odd value is coerced and counted.

    The common types take the first branch of each test; odd values go through the coercing
    helpers, which count every coercion or drop by reason.
    """
    exact_ts = TimestampTexts(text, events)
    n = len(events)
    ph_c, cat_c, name_c = [None] * n, [None] * n, [None] * n
    pid_c, pid_s, tid_c, tid_s = [None] * n, [None] * n, [None] * n, [None] * n
    ts_c, dur_c, id_c, id_s = [None] * n, [None] * n, [None] * n, [None] * n
    corr_c, ext_c, args_c, extra_c = [None] * n, [None] * n, [None] * n, [None] * n
    known = KNOWN_KEYS
    dumps_, odumps, default = dumps, orjson.dumps, _json_default
    for i, e in enumerate(events):
        if type(e) is not dict:
            extra_c[i] = dumps_(e).decode()
            problems.coerced["event_not_object"] += 1
            continue
        ph = e.get("ph")
        cat = e.get("cat")
        name = e.get("name")
        if type(ph) is not str and ph is not None:
            ph = _text(ph, "ph", problems)
        if type(cat) is not str and cat is not None:
            cat = _text(cat, "cat", problems)
        if type(name) is not str and name is not None:
            name = _text(name, "name", problems)
        ph_c[i], cat_c[i], name_c[i] = ph, cat, name
        pid = e.get("pid")
        if type(pid) is int:
            pid_c[i] = pid
        elif type(pid) is str:
            pid_s[i] = pid
        elif pid is not None:
            pid_c[i] = as_int(pid, "pid", problems)
        tid = e.get("tid")
        if type(tid) is int:
            tid_c[i] = tid
        elif type(tid) is str:
            tid_s[i] = tid
        elif tid is not None:
            tid_c[i] = as_int(tid, "tid", problems)
        ts = e.get("ts")
        if type(ts) is float and -FLOAT_EXACT_US < ts < FLOAT_EXACT_US:
            ts_c[i] = round(ts * 1000)
        elif type(ts) is int and -9223372036854775 <= ts <= 9223372036854775:
            ts_c[i] = ts * 1000
        elif type(ts) is float and ts == ts and abs(ts) < 9.2e15:
            ts_c[i] = exact_ts.ns(i, ts)
        else:
            ts_c[i] = us_to_ns(ts, "ts", problems)
        dur = e.get("dur")
        if dur is not None:
            if type(dur) is float and -FLOAT_EXACT_US < dur < FLOAT_EXACT_US:
                dur_c[i] = round(dur * 1000)
            elif type(dur) is int and -9223372036854775 <= dur <= 9223372036854775:
                dur_c[i] = dur * 1000
            else:
                dur_c[i] = us_to_ns(dur, "dur", problems)
        fid = e.get("id")
        if fid is not None:
            if type(fid) is int and -INT64_MAX <= fid <= INT64_MAX:
                id_c[i] = fid
            else:
                id_s[i] = fid if type(fid) is str else dumps_(fid).decode()
        args = e.get("args")
        if args is not None:
            # .decode(): a small bytes from orjson.dumps holds a 4 KB buffer; the str is exact-sized
            args_c[i] = odumps(args, default=default).decode()
            if type(args) is dict:
                c = args.get("correlation")
                if c is not None:
                    corr_c[i] = c if type(c) is int else as_int(c, "correlation", problems)
                x = args.get("External id")
                if x is None:
                    x = args.get("external id")
                if x is not None:
                    ext_c[i] = x if type(x) is int else as_int(x, "external_id", problems)
            else:
                problems.coerced["args_not_object"] += 1
        if not known.issuperset(e):
            extra_c[i] = odumps({k: v for k, v in e.items() if k not in known}, default=default).decode()
    return _events_table({
        "ph": pa.array(ph_c, pa.string()), "cat": pa.array(cat_c, pa.string()),
        "name": pa.array(name_c, pa.string()),
        "pid": pa.array(pid_c, pa.int64()), "pid_str": pa.array(pid_s, pa.string()),
        "tid": pa.array(tid_c, pa.int64()), "tid_str": pa.array(tid_s, pa.string()),
        "ts_ns": pa.array(ts_c, pa.int64()), "dur_ns": pa.array(dur_c, pa.int64()),
        "id": pa.array(id_c, pa.int64()), "id_str": pa.array(id_s, pa.string()),
        "correlation": pa.array(corr_c, pa.int64()), "external_id": pa.array(ext_c, pa.int64()),
        "args_json": pa.array(args_c, pa.string()), "extra_json": pa.array(extra_c, pa.string()),
    })


def _gpu_ops(events, rows, ev, problems):
    """The gpu_ops rows of a chunk: launch geometry and copy sizes from each GPU event's args."""
    gpu_events = [events[i] for i in rows]
    args = [a if type(a) is dict else _EMPTY for a in map(dict.get, gpu_events, repeat("args"))]
    arg = lambda key: list(map(dict.get, args, repeat(key)))  # noqa: E731
    cats = [e["cat"] for e in gpu_events]
    devices = arg("device")
    for j, cat in enumerate(cats):
        if devices[j] is None and cat == "mtia_ccp_events":
            devices[j] = gpu_events[j].get("pid")  # MTIA device activity lives in the device's process
    device = _ints(devices, "device", problems)
    grid, block = arg("grid"), arg("block")
    idx = pa.array(rows, pa.int64())
    take = ev.take(idx)
    table = pa.table({
        "event_idx": idx,
        "kind": pa.array([GPU_KINDS[c] for c in cats], pa.string()),
        "cat": take.column("cat"),
        "name": take.column("name"),
        "device": device,
        "stream": _ints(arg("stream"), "stream", problems),
        "pid": take.column("pid"),
        "tid": take.column("tid"),
        "correlation": take.column("correlation"),
        "external_id": take.column("external_id"),
        "ts_ns": take.column("ts_ns"),
        "dur_ns": take.column("dur_ns"),
        **{f"grid_{d}": pa.array([_dim(g, i) for g in grid], pa.int64()) for i, d in enumerate("xyz")},
        **{f"block_{d}": pa.array([_dim(b, i) for b in block], pa.int64()) for i, d in enumerate("xyz")},
        "registers_per_thread": _plain_ints(arg("registers per thread")),
        "shared_memory": _plain_ints(arg("shared memory")),
        "copy_bytes": _plain_ints(arg("bytes")),
        "warps_per_sm": pa.array(list(map(_as_float, arg("warps per SM"))), pa.float64()),
        "occupancy_pct": pa.array(list(map(_as_float, arg("est. achieved occupancy %"))), pa.float64()),
        "copy_bw_gbps": pa.array(list(map(_as_float, arg("memory bandwidth (GB/s)"))), pa.float64()),
    })
    return schema.conform(table, "gpu_ops", ("flatten",)), set(pc.unique(device.drop_null()).to_pylist())


def _ints(values: list, what: str, problems: Problems) -> pa.Array:
    """int64 Array of id-like values; anything but an in-range int is coerced by `as_int` (and counted)."""
    arr = _int_column(values)
    if arr is None:
        arr = pa.array([v if type(v) is int and -INT64_MAX <= v <= INT64_MAX else as_int(v, what, problems)
                        for v in values], pa.int64())
    return arr


def _plain_ints(values: list) -> pa.Array:
    """int64 Array of the values that are in-range ints; other values are null."""
    arr = _int_column(values)
    if arr is None:
        arr = pa.array([v if type(v) is int and -INT64_MAX <= v <= INT64_MAX else None for v in values], pa.int64())
    return arr


def _flows(events, rows, ev):
    idx = pa.array(rows, pa.int64())
    take = ev.take(idx)
    bp = [v if type(v) is str else None for v in map(dict.get, (events[i] for i in rows), repeat("bp"))]
    table = pa.table({
        "event_idx": idx,
        "id": take.column("id"),
        "id_str": take.column("id_str"),
        "cat": take.column("cat"),
        "ph": take.column("ph"),
        "name": take.column("name"),
        "ts_ns": take.column("ts_ns"),
        "pid": take.column("pid"),
        "pid_str": take.column("pid_str"),
        "tid": take.column("tid"),
        "tid_str": take.column("tid_str"),
        "bp": pa.array(bp, pa.string()),
    })
    return schema.conform(table, "flows", ("flatten",))


def build_from_text(text: bytes) -> ChunkTables:
    """Parse one chunk of traceEvents text and build its tables (the worker's job)."""
    try:
        return build_chunk(parse_chunk(text), text)
    except NeedsExactParse:
        return build_chunk(parse_chunk_exact(text))


# ====================================================================== the driver

PARALLEL_MIN_BYTES = 48 << 20
SECRET_KEY = re.compile(r"TOKEN|SECRET|PASSW|CREDENTIAL|PRIVATE|COOKIE|AUTH|(^|[_\-. ])(API|ACCESS)?_?KEY([_\-. ]|$)", re.I)
SECRET_VALUE = re.compile(r"^(hf_|ghp_|gho_|ghs_|github_pat_|sk-|xox[abpr]-|AKIA|ASIA|glpat-)[A-Za-z0-9_\-]{8,}")
REDACTED = "<redacted>"


@dataclass
class FlattenResult:
    out_dir: Path
    n_events: int
    n_gpu_ops: int
    n_flows: int
    n_devices: int
    truncated: bool
    truncation_reason: str | None
    problems: dict
    warnings: list

    @property
    def ok(self) -> bool:
        return not self.truncated


def redact(obj):
    """A copy of trace metadata with values under secret-looking keys (and token-like values) replaced."""
    if isinstance(obj, dict):
        return {k: (REDACTED if SECRET_KEY.search(str(k)) and obj[k] not in (None, "") else redact(v))
                for k, v in obj.items()}
    if isinstance(obj, list):
        return [redact(v) for v in obj]
    if isinstance(obj, str) and SECRET_VALUE.match(obj):
        return REDACTED
    return obj


def sampled_content_id(path: str) -> str:
    """A content id from the size and the first and last MiB of the file (fast on huge files)."""
    h = hashlib.blake2b(digest_size=8)
    size = os.path.getsize(path)
    h.update(str(size).encode())
    with open(path, "rb") as f:
        h.update(f.read(1 << 20))
        if size > 2 << 20:
            f.seek(-(1 << 20), os.SEEK_END)
            h.update(f.read())
    return h.hexdigest()


def _worker_init():
    gc.disable()
    _return_memory_promptly()


def _return_memory_promptly():
    """Let Arrow's allocator give freed memory back at once (it keeps it for seconds by default)."""
    try:
        pa.jemalloc_set_decay_ms(0)
    except (pa.ArrowNotImplementedError, AttributeError):
        pass


def _pool(workers: int):
    ctx = _mp.get_context("forkserver")
    ctx.set_forkserver_preload(["pipeline.flatten"])
    return ctx.Pool(workers, initializer=_worker_init)


def default_workers(path: str) -> int:
    try:
        size = os.path.getsize(path)
    except OSError:
        return 1
    if size < PARALLEL_MIN_BYTES:
        return 1
    return max(1, min(len(os.sched_getaffinity(0)), 8))


def _offset(tbl: pa.Table, offset: int) -> pa.Table:
    if offset == 0 or tbl.num_rows == 0:
        return tbl
    i = tbl.schema.get_field_index("event_idx")
    return tbl.set_column(i, "event_idx", pc.add(tbl.column(i), pa.scalar(offset, pa.int64())))


def _int_or_none(v):
    return v if type(v) is int else None


def devices_table(metadata: dict, gpu_device_ids: set, problems: Problems) -> pa.Table:
    """One row per deviceProperties entry plus one per device id seen only on GPU events."""
    props = metadata.get("deviceProperties")
    rows = []
    if props is not None and not isinstance(props, list):
        problems.dropped["deviceProperties_not_a_list"] += 1
        props = []
    for p in props or []:
        if not isinstance(p, dict):
            problems.dropped["deviceProperties_entry_not_object"] += 1
            continue
        rows.append({
            "device": as_int(p.get("id"), "device_id", problems), "source": "deviceProperties",
            "name": p.get("name") if isinstance(p.get("name"), str) else None,
            "total_global_mem": _int_or_none(p.get("totalGlobalMem")),
            "compute_major": _int_or_none(p.get("computeMajor")),
            "compute_minor": _int_or_none(p.get("computeMinor")),
            "num_sms": _int_or_none(p.get("numSms")),
            "warp_size": _int_or_none(p.get("warpSize")),
            "max_threads_per_block": _int_or_none(p.get("maxThreadsPerBlock")),
            "shared_mem_per_block": _int_or_none(p.get("sharedMemPerBlock")),
            "props_json": dumps(p).decode(),
        })
    listed = {r["device"] for r in rows}
    for d in sorted(gpu_device_ids - listed):
        rows.append({"device": d, "source": "gpu_events"})
    return pa.Table.from_pylist(rows, schema=schema.table("devices").arrow_schema())


def trace_row(path: str, metadata: dict, counts: dict, problems: Problems, tail) -> dict:
    dist = metadata.get("distributedInfo") if isinstance(metadata.get("distributedInfo"), dict) else {}
    rest = {k: v for k, v in metadata.items() if k != "deviceProperties"}
    issues = {**{f"coerced:{k}": v for k, v in problems.coerced.items()},
              **{f"dropped:{k}": v for k, v in problems.dropped.items()}}
    if tail.truncated:
        issues["truncated"] = 1
    sv = metadata.get("schemaVersion")
    base = metadata.get("baseTimeNanoseconds")
    return {
        "trace_id": sampled_content_id(path),
        "source_path": str(path),
        "source_bytes": os.path.getsize(path),
        "stem": store.trace_stem(path),
        "schema_version": None if sv is None else str(sv),
        "trace_name": metadata.get("traceName") if isinstance(metadata.get("traceName"), str) else None,
        "base_time_ns": base if type(base) is int else None,
        "rank": _int_or_none(dist.get("rank")),
        "world_size": _int_or_none(dist.get("world_size")),
        "backend": dist.get("backend") if isinstance(dist.get("backend"), str) else None,
        **counts,
        "n_coerced": sum(problems.coerced.values()),
        "n_dropped": sum(problems.dropped.values()),
        "problems_json": dumps(issues).decode(),
        "truncated": tail.truncated,
        "metadata_json": dumps(redact(rest)).decode(),
        "tracepipe_version": __version__,
        "flattened_at": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
    }


def flatten_into(path: str, tmp: Path, workers: int | None = None, chunk_bytes: int | None = None,
                 progress: Callable[[int], None] | None = None):
    """Read one trace and write events/gpu_ops/flows/devices/trace Parquet files into `tmp`.

    Returns (trace_row dict, Problems, Tail). Link and cost run afterwards over these files.
    With workers, chunks go to them as file positions where the file is uncompressed (they read
    the bytes themselves) and come back as Arrow files in shared memory (see `_spill`).
    """
    workers = default_workers(path) if workers is None else max(1, workers)
    _return_memory_promptly()
    src = TraceSource(path, **({"chunk_bytes": chunk_bytes} if chunk_bytes else {}))
    problems = Problems()
    corrupt = []
    writers = {n: store.TableWriter(tmp / f"{n}.parquet", n) for n in ("events", "gpu_ops", "flows")}
    device_ids: set = set()
    pool = _pool(workers) if workers > 1 else None
    spill_dir = tempfile.mkdtemp(prefix="tracepipe-", dir=_SHARED_MEMORY if os.access(_SHARED_MEMORY, os.W_OK) else tmp)
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        submit = (lambda piece: pool.apply_async(_run_chunk, (piece, spill_dir))) if pool else None
        results = ordered_results(src.pieces(spans=pool is not None), build_from_text, build_chunk, submit=submit,
                                  max_inflight=4 * workers, on_corrupt=corrupt.append)
        offset = 0
        for ct in map(_unspill, results):
            writers["events"].write(_offset(ct.events, offset))
            writers["gpu_ops"].write(_offset(ct.gpu_ops, offset))
            writers["flows"].write(_offset(ct.flows, offset))
            offset += ct.events.num_rows
            problems.merge(ct.problems)
            device_ids |= ct.device_ids
            if progress:
                progress(src.bytes_read)
    finally:
        if pool:
            pool.terminate()
        for w in writers.values():
            w.close()
        src.close()
        shutil.rmtree(spill_dir, ignore_errors=True)
        if was_enabled:
            gc.enable()
    tail = src.tail
    if corrupt and not tail.truncated:
        tail.truncated, tail.reason = True, corrupt[0]
    devices = devices_table(src.metadata, device_ids, problems)
    store.write_table(devices, tmp / "devices.parquet", "devices", ("flatten",))
    counts = {"n_events": writers["events"].rows, "n_gpu_ops": writers["gpu_ops"].rows,
              "n_flows": writers["flows"].rows, "n_devices": devices.num_rows}
    row = trace_row(path, src.metadata, counts, problems, tail)
    return row, problems, tail


_SHARED_MEMORY = "/dev/shm"
_CHUNK_TABLES = ("events", "gpu_ops", "flows")


@dataclass
class SpilledChunk:
    """A worker's ChunkTables with the tables in Arrow IPC files: the parent maps them without
    copying (pickling tables through the result pipe cost more than building them)."""

    paths: dict
    problems: Problems
    device_ids: set


def _spill(ct: ChunkTables, spill_dir: str) -> SpilledChunk:
    fd, base = tempfile.mkstemp(dir=spill_dir)
    os.close(fd)
    paths = {}
    for name in _CHUNK_TABLES:
        tbl = getattr(ct, name)
        paths[name] = f"{base}.{name}.arrow"
        with pa.OSFile(paths[name], "wb") as f, pa.ipc.new_file(f, tbl.schema) as w:
            w.write_table(tbl)
    os.remove(base)
    return SpilledChunk(paths, ct.problems, ct.device_ids)


def _unspill(ct: ChunkTables | SpilledChunk) -> ChunkTables:
    if isinstance(ct, ChunkTables):
        return ct
    tables = {}
    for name, p in ct.paths.items():
        tables[name] = pa.ipc.open_file(pa.memory_map(p)).read_all()
        os.remove(p)  # the mapping stays valid; the memory goes when the table does
    return ChunkTables(tables["events"], tables["gpu_ops"], tables["flows"], ct.problems, ct.device_ids)


def _run_chunk(piece, spill_dir: str):
    ok, value = _run_local(build_from_text, text_of(piece))
    return ok, (_spill(value, spill_dir) if ok else value)


def write_trace_table(row: dict, tmp: Path):
    t = pa.Table.from_pylist([row], schema=schema.table("trace").arrow_schema(schema.ALL_STAGES))
    store.write_table(t, tmp / "trace.parquet", "trace")


def flatten(path: str | os.PathLike, out: str | os.PathLike, *, workers: int | None = None,
            chunk_bytes: int | None = None, link: bool = True, device_specs: str | None = None,
            device: str | None = None, dtype: str | None = None,
            progress: Callable[[int], None] | None = None) -> FlattenResult:
    """Flatten one trace into OUT/<stem>/{events,gpu_ops,flows,devices,trace}.parquet.

    The directory appears complete or not at all. With `link` (default) GPU ops are linked to
    their launches and CPU ops and costed (see `pipeline.link` and `pipeline.cost`).
    """
    path = str(path)
    if not os.path.isfile(path):
        raise BadTrace(f"{path}: no such file")
    final = Path(out) / store.trace_stem(path)
    warnings: list = []
    with store.atomic_dir(final) as tmp:
        row, problems, tail = flatten_into(path, tmp, workers, chunk_bytes, progress)
        if link:
            from .cost import enrich
            warnings += enrich(tmp, row, device_specs=device_specs, device=device, dtype=dtype)
        write_trace_table(row, tmp)
    return FlattenResult(final, row["n_events"], row["n_gpu_ops"], row["n_flows"], row["n_devices"],
                         tail.truncated, tail.reason, orjson.loads(row["problems_json"]), warnings)
