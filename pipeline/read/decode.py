"""columns: one chunk of traceEvents text -> typed Arrow tables (events, gpu_ops, flows).

`build_from_text` runs in the worker processes. It tries three builders, fastest first, each
giving the same tables for the chunks it accepts:

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

import functools
import json
import math
import re
from collections import Counter
from dataclasses import dataclass, field
from decimal import Decimal, InvalidOperation
from itertools import repeat
from operator import attrgetter

import msgspec
import orjson
import pyarrow as pa
import pyarrow.compute as pc

from pipeline import schema
from pipeline.kineto import FLOW_PHASES, GPU_KINDS
from pipeline.read.source import ChunkParseError, NeedsExactParse, parse_chunk, parse_chunk_exact
from pipeline.read.tame import BAD_UNICODE, MAX_DEPTH, TOO_DEEP, TooDeep, scrub, tame_deep

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
    """JSON text of a parsed value, exact: Decimals as their text, integers beyond 64 bits too;
    a part nested deeper than orjson writes (255 levels) as the JSON string of its text."""
    try:
        return orjson.dumps(v, default=_json_default)
    except TypeError:  # orjson writes no integer beyond 64 bits, nothing nested past 255 levels,
        try:  # no lone surrogate
            return orjson.dumps(_writable(v, 0), default=_json_default)
        except TypeError:
            return orjson.dumps(_writable(scrub(v)[0], 0), default=_json_default)


def _writable(v, depth: int):
    if type(v) is int and not -(2**63) <= v < 2**64:
        return orjson.Fragment(str(v).encode())
    if type(v) in (dict, list) and depth >= MAX_DEPTH:
        try:
            return json.dumps(v, default=str)
        except (RecursionError, ValueError):
            return "<nested too deep>"
    if type(v) is dict:
        return {k: _writable(x, depth + 1) for k, x in v.items()}
    if type(v) is list:
        return [_writable(x, depth + 1) for x in v]
    return v


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
_PLAIN_DECIMAL = re.compile(rb"-?[0-9]+(?:\.[0-9]+)?\Z")


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
        if not _PLAIN_DECIMAL.match(t) or float(t) != value:
            raise NeedsExactParse("ts")
        return int((Decimal(t.decode()) * _NS).to_integral_value())  # as us_to_ns does with ijson's Decimal


def build_from_text(text: bytes) -> ChunkTables:
    """Parse one chunk of traceEvents text and build its tables (the worker's job). Values nested
    too deep for the parsers are kept as their text and counted (`pipeline.tame`)."""
    try:
        return _build_from_text(text)
    except (RecursionError, TooDeep):
        tamed, n = tame_deep(text)
        if not n:  # the deep value goes on past this chunk: a cut to merge with the next
            raise ChunkParseError("a value nested too deep goes on past the chunk") from None
        tables = _build_from_text(tamed)
        tables.problems.coerced[TOO_DEEP] += n
        return tables


def _build_from_text(text: bytes) -> ChunkTables:
    tables = _tables_by_struct(text)
    if tables is not None:
        return tables
    raw_args = _raw_args(text)
    try:
        return build_chunk(parse_chunk(text), text, raw_args)
    except NeedsExactParse:
        return build_chunk(parse_chunk_exact(text), None, raw_args)


def build_chunk(events: list, text: bytes | None = None, raw_args: list | None = None) -> ChunkTables:
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
    C-level loops (`_events_by_column`); a chunk with any odd value is built event by event by
    `_events_by_event`, which coerces and counts every such value. Both give the same tables.
    `raw_args` (`_raw_args`) gives each event's args as the trace writes them; without it args
    are serialised again.
    """
    problems = Problems()
    ev_table = _events_by_column(events, text, raw_args)
    if ev_table is None:
        ev_table = _events_by_event(events, text, raw_args, problems)
    gpu_rows, flow_rows = _gpu_and_flow_rows(ev_table)
    gpu = [events[i] for i in gpu_rows]  # GPU events and flow endpoints are objects (their ph and cat say so)
    gpu_args = [a if type(a) is dict else _EMPTY for a in map(dict.get, gpu, repeat("args"))]
    gpu_table, device_ids = _gpu_ops(gpu_rows, [e["cat"] for e in gpu], [e.get("pid") for e in gpu],
                                     _gpu_arg_columns(gpu_args), ev_table, problems)
    bp = pa.array([v if type(v) is str else None for v in (events[i].get("bp") for i in flow_rows)], pa.string())
    flows_table = _flows(pa.array(flow_rows, pa.int64()), bp, ev_table)
    return ChunkTables(ev_table, gpu_table, flows_table, problems, device_ids)


def _gpu_and_flow_rows(ev: pa.Table) -> tuple[list, list]:
    """Rows of GPU activity (ph X, a GPU cat) and of flow endpoints (ph s/f/t)."""
    ph, cat = ev.column("ph"), ev.column("cat")
    is_gpu = pc.and_(pc.equal(ph, "X"), pc.is_in(cat, _GPU_CATS_ARRAY))
    gpu_rows = pc.indices_nonzero(pc.fill_null(is_gpu, False)).to_pylist()
    flow_rows = pc.indices_nonzero(pc.fill_null(pc.is_in(ph, _FLOW_PHASES_ARRAY), False)).to_pylist()
    return gpu_rows, flow_rows


# ---------------------------------------------------------------- 1. typed structs (msgspec)
_NULL = msgspec.Raw(b"null")
_ABSENT = msgspec.Raw(b"")


class _Event(msgspec.Struct, forbid_unknown_fields=True, gc=False):
    """An event of the plain shape; any other key or type fails the decode (`_tables_by_struct`)."""

    ph: str | None = None
    cat: str | None = None
    name: str | None = None
    pid: int | str | None = None
    tid: int | str | None = None
    ts: int | float | None = None
    dur: int | float | None = None
    id: int | str | None = None
    args: msgspec.Raw = _NULL
    # the usual keys beyond KNOWN_KEYS (extra_json), as raw JSON text (empty when absent)
    bp: msgspec.Raw = _ABSENT  # flow binding point
    s: msgspec.Raw = _ABSENT  # instant event scope


class _IdArgs(msgspec.Struct, gc=False):
    """The ids every event's args may carry; other args are skipped unparsed."""

    correlation: int | None = None
    external_id: int | None = msgspec.field(default=None, name="External id")
    external_id_lower: int | None = msgspec.field(default=None, name="external id")


class _ArgsOnly(msgspec.Struct, gc=False):
    args: msgspec.Raw = _NULL


_DECODE_EVENTS = msgspec.json.Decoder(list[_Event])
_DECODE_ID_ARGS = msgspec.json.Decoder(list[_IdArgs | None])
_DECODE_ARGS_ONLY = msgspec.json.Decoder(list[_ArgsOnly])
_DECODE_RAW_LIST = msgspec.json.Decoder(list[msgspec.Raw])
_DECODE_ONE_ARGS_ONLY = msgspec.json.Decoder(_ArgsOnly)
_EXTRA_KEYS = ("bp", "s")  # _Event's keys beyond KNOWN_KEYS
_EMPTY_ID_ARGS = _IdArgs()


def _transpose(structs: list, kind: type) -> dict:
    """{field: tuple of its values} of a list of msgspec structs of one kind: one C call per
    struct (astuple) and a C-level transpose, half the cost of a getattr per field and struct."""
    columns = zip(*map(msgspec.structs.astuple, structs)) if structs else repeat(())
    return dict(zip(kind.__struct_fields__, columns))
_PLAIN_JSON_VALUE = r'^(?:"[^"\\\x00-\x1f]*"|null)$'  # a value every JSON writer writes the same way


def _tables_by_struct(text: bytes) -> ChunkTables | None:
    """The chunk's tables from typed structs, or None if any event is not of the plain shape.

    No dict is made per event and args are not parsed (only their ids, by a second typed decode
    of their raw text that skips every other key; GPU events' args by a third), which makes this
    the cheapest builder.
    """
    try:
        events = _DECODE_EVENTS.decode(b"[" + text + b"]")
    except (msgspec.MsgspecError, ValueError):  # ValueError: UnicodeDecodeError
        return None
    if not events:
        return None
    # one C call per event, then a C-level transpose: half the cost of a getattr per field
    fields = _transpose(events, _Event)
    del events
    extras = {k: _raw_texts(v) for k in _EXTRA_KEYS if (v := fields.pop(k)).count(_ABSENT) < len(v)}
    cols = _event_columns_by_struct(fields, extras, text)
    if cols is None:
        return None
    ev_table = _events_table(cols)
    gpu_rows, flow_rows = _gpu_and_flow_rows(ev_table)
    arg_cols = _gpu_arg_columns_by_struct([fields["args"][i] for i in gpu_rows])
    if arg_cols is None:
        return None
    problems = Problems()
    gpu_table, device_ids = _gpu_ops(gpu_rows, [fields["cat"][i] for i in gpu_rows],
                                     [fields["pid"][i] for i in gpu_rows], arg_cols, ev_table, problems)
    rows = pa.array(flow_rows, pa.int64())
    bp = _plain_strings(extras["bp"].take(rows)) if "bp" in extras else pa.nulls(len(rows), pa.string())
    return ChunkTables(ev_table, gpu_table, _flows(rows, bp, ev_table), problems, device_ids)


def _event_columns_by_struct(fields: dict, extras: dict, text: bytes) -> dict | None:
    """The events columns from the structs' fields (`_Event`'s, each a tuple) and extra keys
    (`_EXTRA_KEYS`, raw JSON texts); None if a value needs the dict path."""
    raws = fields["args"]
    try:
        ids = _DECODE_ID_ARGS.decode(b"[" + b",".join(raws) + b"]")
    except (msgspec.MsgspecError, ValueError):
        return None  # an args value that is not an object, or an id that is not an integer
    cols = {k: pa.array(fields[k], pa.string()) for k in ("ph", "cat", "name")}
    for k in ("pid", "tid", "id"):
        split = _int_or_str_columns(fields[k], typed=True)
        if split is None:
            return None
        cols[k], cols[f"{k}_str"] = split
    cols["ts_ns"], cols["dur_ns"] = _ns_column(fields["ts"], text, typed=True), _ns_column(fields["dur"], None, typed=True)
    id_args = _transpose([a or _EMPTY_ID_ARGS for a in ids], _IdArgs)
    id_arg = lambda key: _int_column(id_args[key], typed=True)  # noqa: E731
    ext, lower = id_arg("external_id"), id_arg("external_id_lower")  # the oldest layout writes "external id"
    if ext is not None and lower is not None and lower.null_count < len(lower):
        ext = pc.coalesce(ext, lower)
    cols["correlation"], cols["external_id"] = id_arg("correlation"), None if lower is None else ext
    cols["extra_json"] = _extra_json_of_struct_keys(extras, len(raws))
    if any(v is None for v in cols.values()):
        return None
    cols["args_json"] = _args_json(raws)
    if not all(_valid_utf8(a) for a in (cols["args_json"], *extras.values())):
        return None  # raw texts are not decoded: the dict path reports the chunk
    return {k: cols[k] for k in _EVENT_COLUMNS}


def _valid_utf8(arr: pa.Array) -> bool:
    try:
        arr.validate(full=True)
        return True
    except pa.ArrowInvalid:
        return False


class _GpuArgs(msgspec.Struct, gc=False):
    """The args of GPU activity that gpu_ops reads (`_gpu_arg_columns`), each of its usual type."""

    device: int | None = None
    stream: int | None = None
    grid: list[int] | None = None
    block: list[int] | None = None
    registers_per_thread: int | None = msgspec.field(default=None, name="registers per thread")
    shared_memory: int | None = msgspec.field(default=None, name="shared memory")
    copy_bytes: int | None = msgspec.field(default=None, name="bytes")
    warps_per_sm: int | float | None = msgspec.field(default=None, name="warps per SM")
    occupancy_pct: int | float | None = msgspec.field(default=None, name="est. achieved occupancy %")
    copy_bw_gbps: int | float | None = msgspec.field(default=None, name="memory bandwidth (GB/s)")


_DECODE_GPU_ARGS = msgspec.json.Decoder(list[_GpuArgs | None])
_EMPTY_GPU_ARGS = _GpuArgs()


def _gpu_arg_columns_by_struct(raws: list) -> dict | None:
    """`_gpu_arg_columns` from the GPU events' raw args; None if a value needs the dict path."""
    try:
        args = [a or _EMPTY_GPU_ARGS for a in _DECODE_GPU_ARGS.decode(b"[" + b",".join(raws) + b"]")]
    except (msgspec.MsgspecError, ValueError):
        return None
    fields = _transpose(args, _GpuArgs)
    field = fields.__getitem__
    cols = {"device": field("device"), "stream": field("stream")}
    for key in ("grid", "block"):
        dims = _dims_by_column(field(key))
        if dims is None:
            return None
        cols.update({f"{key}_{d}": v for d, v in zip("xyz", dims)})
    for k in ("registers_per_thread", "shared_memory", "copy_bytes"):
        cols[k] = _plain_ints(field(k))
    for k in ("warps_per_sm", "occupancy_pct", "copy_bw_gbps"):
        cols[k] = pa.array(field(k), pa.float64())
    return cols


def _dims_by_column(values: list) -> list | None:
    """x, y, z columns of [x, y, z] lists of ints (or None); None if a list is shorter or a value
    is out of range (the element-wise `_dim` decides those)."""
    try:
        lists = pa.array(values, pa.list_(pa.int64()))
    except (pa.ArrowInvalid, OverflowError):
        return None
    if lists.null_count < len(lists) and pc.min(pc.list_value_length(lists)).as_py() < 3:
        return None
    return [pc.list_element(lists, i) for i in range(3)]


def _extra_json_of_struct_keys(extras: dict, n: int) -> pa.Array | None:
    """extra_json from the extra keys `_Event` accepts (`extras`: key -> raw JSON texts, empty when
    absent; keys absent from every event left out), e.g. `{"bp":"e"}`; None (the dict path decides) when an event has two of them (their
    order in the event is unknown here) or when a value is not a plain string or null (another
    writer could write it otherwise)."""
    out = None
    for key, raw in extras.items():
        present = pc.not_equal(raw, "")
        if not pc.any(present).as_py():
            continue
        if not pc.all(pc.match_substring_regex(raw.filter(present), _PLAIN_JSON_VALUE)).as_py():
            return None
        text = pc.if_else(present, pc.binary_join_element_wise('{"%s":' % key, raw, "}", ""), pa.scalar(None, pa.string()))
        if out is not None and pc.any(pc.and_(pc.is_valid(out), pc.is_valid(text))).as_py():
            return None
        out = text if out is None else pc.coalesce(out, text)
    return out if out is not None else pa.nulls(n, pa.string())


def _plain_strings(raw: pa.Array) -> pa.Array:
    """The strings that plain raw JSON values hold (`"e"` -> `e`; null, absent -> null)."""
    return pc.if_else(pc.starts_with(raw, '"'), pc.utf8_slice_codeunits(raw, 1, -1), pa.scalar(None, pa.string()))


def _raw_texts(raws: list) -> pa.Array:
    """A string column of raw JSON texts (msgspec.Raw or bytes): the texts joined into one buffer
    with their offsets, no string object made per event."""
    data = b"".join(raws)  # a chunk is far below 2 GB: int32 offsets
    offsets = pa.concat_arrays([pa.array([0], pa.int32()), pc.cumulative_sum(pa.array(list(map(len, raws)), pa.int32()))])
    return pa.StringArray.from_buffers(len(raws), offsets.buffers()[1], pa.py_buffer(data))


def _args_json(raws: list) -> pa.Array:
    """args_json from each event's raw args text (None for none)."""
    text = _raw_texts([r if r is not None else b"null" for r in raws] if None in raws else raws)
    return pc.if_else(pc.equal(text, "null"), pa.scalar(None, pa.string()), text)


def _raw_args(text: bytes) -> list | None:
    """Each event's args as raw JSON text (None for an element that is not an object), or None
    when the chunk is not strict JSON for msgspec (NaN, say): args are then serialised again."""
    try:
        return list(map(attrgetter("args"), _DECODE_ARGS_ONLY.decode(b"[" + text + b"]")))
    except (msgspec.MsgspecError, ValueError):
        pass
    try:
        elements = _DECODE_RAW_LIST.decode(b"[" + text + b"]")
        return [_DECODE_ONE_ARGS_ONLY.decode(e).args if memoryview(e)[:1] == b"{" else None for e in elements]
    except (msgspec.MsgspecError, ValueError):
        return None


# ---------------------------------------------------------------- 2. and 3. dicts (orjson)
_FLOW_PHASES_ARRAY = pa.array(sorted(FLOW_PHASES), pa.string())
_GPU_CATS_ARRAY = pa.array(sorted(GPU_KINDS), pa.string())
_NONE = type(None)
_INT_OR_NONE, _STR_OR_NONE, _DICT_OR_NONE = {int, _NONE}, {str, _NONE}, {dict, _NONE}
_NUMBER_OR_NONE = {int, float, _NONE}
_EMPTY: dict = {}


def _events_table(cols: dict) -> pa.Table:
    n = len(cols["ph"])
    return pa.table({"event_idx": pa.array(range(n), pa.int64()), **cols})


def _events_by_column(events: list, text: bytes | None, raw_args: list | None = None) -> pa.Table | None:
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
    ts = _ns_column(raw["ts"], text)
    dur = _ns_column(raw["dur"], None)
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
    cols["args_json"] = _args_json(raw_args if raw_args is not None else _dump_all(args))
    cols["extra_json"] = _extra_json(events, cols)
    return _events_table({k: cols[k] for k in _EVENT_COLUMNS})


_EVENT_COLUMNS = ("ph", "cat", "name", "pid", "pid_str", "tid", "tid_str", "ts_ns", "dur_ns", "id", "id_str",
                  "correlation", "external_id", "args_json", "extra_json")
_INT64_MIN = -(2**63)


_dumps_exact = functools.partial(orjson.dumps, default=_json_default)  # C-level: no Python frame per event


def _dump_all(values: list) -> list:
    """`dumps` of each value, by the C-level partial unless a value needs `dumps`' big-int care."""
    try:
        return list(map(_dumps_exact, values))
    except TypeError:
        return list(map(dumps, values))


def _extra_json(events: list, cols: dict) -> pa.Array:
    """Keys other than the known ones, as a JSON object per event (null when there are none).

    An event's key count against the known columns it filled tells, without looking at its
    keys, that it has no other key, or only `bp` (flow ends); only the rest are looked at.
    """
    bp = list(map(dict.get, events, repeat("bp")))
    filled = [pc.is_valid(cols[k]) for k in ("ph", "cat", "name", "ts_ns", "dur_ns", "args_json")]
    filled += [pc.or_(pc.is_valid(cols[k]), pc.is_valid(cols[f"{k}_str"])) for k in ("pid", "tid", "id")]
    bp_text = pa.array(list(map(bytes.decode, _dump_all(bp))), pa.string())
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


def _int_column(values: list, typed: bool = False) -> pa.Array | None:
    """int64 Array of ints/None, or None if any value is another type or outside ±INT64_MAX.
    `typed`: the values are known to be ints or None (from a typed decode): no type check."""
    if not typed and set(map(type, values)) - _INT_OR_NONE:
        return None
    try:
        arr = pa.array(values, pa.int64())
    except OverflowError:
        return None
    return _no_int64_min(arr)


def _no_int64_min(arr: pa.Array) -> pa.Array | None:
    """The int64 array, or None if it holds -2**63 (outside the ±INT64_MAX the columns take)."""
    return None if pc.min(arr).as_py() == _INT64_MIN else arr


def _int_or_str_columns(values: list, typed: bool = False) -> tuple[pa.Array, pa.Array] | None:
    """(int64 column, string column) of values that are ints, strings or None; else None.
    `typed`: the values are known to be ints, strings or None."""
    if typed:
        try:
            ints = _int_column(values, typed=True)  # raises at the first string
            return None if ints is None else (ints, pa.nulls(len(values), pa.string()))
        except (pa.ArrowInvalid, pa.ArrowTypeError):
            return _ints_beside_strings(values)
    types = set(map(type, values))
    if not types - _INT_OR_NONE:
        ints = _int_column(values)
        return None if ints is None else (ints, pa.nulls(len(values), pa.string()))
    if types - {int, str, _NONE}:
        return None
    ints = _int_column([v if type(v) is int else None for v in values])
    strs = pa.array([v if type(v) is str else None for v in values], pa.string())
    return None if ints is None else (ints, strs)


def _ints_beside_strings(values: list) -> tuple[pa.Array, pa.Array] | None:
    """`_int_or_str_columns` of typed values (ints, strings, None) some of which are strings, in one
    pass over them: a trace names a few processes and threads ("Spans", "PyTorch Profiler"),
    every other pid and tid is an int."""
    ints, strs = list(values), [None] * len(values)
    for i in [i for i, v in enumerate(values) if v.__class__ is str]:
        strs[i], ints[i] = ints[i], None
    column = _int_column(ints, typed=True)
    return None if column is None else (column, pa.array(strs, pa.string()))


def _ns_column(values: list, text: bytes | None, typed: bool = False) -> pa.Array | None:
    """µs values (int/float/None) as int64 ns, exactly as `us_to_ns`; None if that needs coercion.

    Floats below FLOAT_EXACT_US: round(v * 1000) (Arrow rounds half to even, as Python does).
    Larger ones (epoch-based timestamps) take their exact decimal text from the chunk
    (`_exact_ns_from_text`); without text they are left to the event-by-event path.
    `typed`: the values are known to be ints, floats or None: Arrow's type inference tells which
    (and its array is used as it is).
    """
    if typed:
        try:
            arr = pa.array(values)
        except (pa.ArrowInvalid, OverflowError):
            return None
        if arr.type == pa.null():
            arr = arr.cast(pa.int64())
        if arr.type not in (pa.int64(), pa.float64()):
            return None  # beyond int64
        ints = _no_int64_min(arr) if arr.type == pa.int64() else None
        has_float = arr.type == pa.float64()
    else:
        types = set(map(type, values))
        if types - _NUMBER_OR_NONE:
            return None
        has_float = float in types
        ints = None if has_float else _int_column(values, typed=True)
        try:
            arr = pa.array(values, pa.float64()) if has_float else None
        except pa.ArrowInvalid:  # an int beside the floats that a float64 cannot hold exactly
            return None
    if not has_float:
        if ints is None:
            return None
        try:
            return pc.multiply_checked(ints, pa.scalar(1000, pa.int64()))
        except pa.ArrowInvalid:
            return None
    if pc.all(pc.less(pc.abs(arr), FLOAT_EXACT_US)).as_py() is not False:
        return pc.cast(pc.round(pc.multiply(arr, 1000.0)), pa.int64())
    if text is None:
        return None
    return _exact_ns_from_text(arr, text)


_EXACT_TS_TEXT = r"^-?[0-9]+(?:\.[0-9]+)?$"


def _exact_ns_from_text(values: pa.Array, text: bytes) -> pa.Array | None:
    """int64 ns of timestamps (float64, null where an event has none; some may have been ints)
    from their decimal text in the chunk (see TimestampTexts): the µs text times 1000, digits
    below a nanosecond rounded half to even, exactly as `us_to_ns` turns ijson's Decimals.

    The k-th `"ts":` text belongs to the k-th event that has a ts; that alignment and every value
    are verified (as many texts as timestamps, and each text parses to the same float) or None
    is returned (a `"ts"` inside args, `"ts": null`, exponents: the careful path decides).
    """
    if not pc.all(pc.less(pc.abs(values), 9.2e15)).as_py():
        return None
    texts = _TS_TEXT.findall(text)
    if len(texts) != len(values) - values.null_count:
        return None
    s = pa.array(texts, pa.binary()).cast(pa.string())
    present = values.is_valid()
    try:
        same = pc.all(pc.equal(pc.cast(s, pa.float64()), values.filter(present))).as_py()
    except pa.ArrowInvalid:  # a text that is no number: a string "ts" inside args, say
        return None
    if not same:
        return None
    ns = _ns_of_decimal_texts(s)
    if ns is None:
        return None
    return ns if not values.null_count else pc.replace_with_mask(pa.nulls(len(values), pa.int64()), present, ns)


_TENS = pa.array([10**k for k in range(19)], pa.int64())  # an int64 holds 19 digits at the most


def _ns_of_decimal_texts(s: pa.Array) -> pa.Array | None:
    """int64 ns of µs decimal texts (`-?digits[.digits]`, below 9.2e15 µs), digits below a ns
    rounded half to even (as a Decimal's to_integral_value); None if a text is not such a number.

    Texts whose digits fit an int64 (epoch µs with three decimals do) are read as one integer
    without the dot and scaled by their number of decimals; longer ones are split at the dot
    (`_ns_of_long_decimal_texts`)."""
    if pc.max(pc.count_substring(s, ".")).as_py() > 1:
        return None
    try:
        digits = pc.cast(pc.replace_substring(s, ".", ""), pa.int64())  # only digits and a sign cast
        magnitude = pc.abs_checked(digits)
    except pa.ArrowInvalid:  # more digits than an int64 holds, or no number
        return _ns_of_long_decimal_texts(s)
    dot = pc.find_substring(s, ".")
    decimals = pc.if_else(pc.less(dot, 0), 0, pc.subtract(pc.subtract(pc.utf8_length(s), dot), 1))
    scale_up = pc.less_equal(decimals, 3)
    ns = pc.if_else(scale_up, pc.multiply(magnitude, _TENS.take(pc.subtract(3, pc.min_element_wise(decimals, 3)))),
                    magnitude)
    if not pc.all(scale_up).as_py():  # digits below a ns: divide, rounding half to even
        below = _TENS.take(pc.subtract(pc.max_element_wise(decimals, 3), 3))
        whole_ns = pc.divide(magnitude, below)  # integer division of non-negatives
        rest = pc.subtract(magnitude, pc.multiply(whole_ns, below))
        twice = pc.multiply(rest, 2)
        up = pc.or_(pc.greater(twice, below), pc.and_(pc.equal(twice, below), pc.equal(pc.bit_wise_and(whole_ns, 1), 1)))
        ns = pc.if_else(scale_up, ns, pc.add(whole_ns, pc.cast(up, pa.int64())))
    return pc.if_else(pc.less(digits, 0), pc.negate(ns), ns)


def _ns_of_long_decimal_texts(s: pa.Array) -> pa.Array | None:
    """`_ns_of_decimal_texts` of texts with more digits than an int64 holds: whole µs and the
    first three decimals read apart, the digits after them compared as text."""
    if not pc.all(pc.match_substring_regex(s, _EXACT_TS_TEXT)).as_py():
        return None
    parts = pc.extract_regex(s, r"^(?P<sign>-?)(?P<whole>[0-9]+)(?:\.(?P<digits>[0-9]+))?$")
    whole, digits = pc.struct_field(parts, "whole"), pc.struct_field(parts, "digits")  # no fraction: ""
    ns = pc.add(pc.multiply(pc.cast(whole, pa.int64()), 1000),
                pc.cast(pc.utf8_slice_codeunits(pc.utf8_rpad(digits, 3, "0"), 0, 3), pa.int64()))
    below = pc.utf8_rtrim(pc.utf8_slice_codeunits(digits, 3), "0")  # digits below a ns
    up = pc.or_(pc.greater(below, "5"), pc.and_(pc.equal(below, "5"), pc.equal(pc.bit_wise_and(ns, 1), 1)))
    ns = pc.add(ns, pc.cast(up, pa.int64()))
    return pc.if_else(pc.equal(pc.struct_field(parts, "sign"), "-"), pc.negate(ns), ns)


def _events_by_event(events: list, text: bytes | None, raw_args: list | None, problems: Problems) -> pa.Table:
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
    dumps_ = dumps
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
        pid_c[i], pid_s[i] = _int_or_str(e.get("pid"), "pid", problems)
        tid_c[i], tid_s[i] = _int_or_str(e.get("tid"), "tid", problems)
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
            args_c[i] = dumps_(args).decode()
            if type(args) is dict:
                c = args.get("correlation")
                if c is not None:
                    corr_c[i] = c if type(c) is int and -INT64_MAX <= c <= INT64_MAX else as_int(
                        c, "correlation", problems)
                x = args.get("External id")
                if x is None:
                    x = args.get("external id")
                if x is not None:
                    ext_c[i] = x if type(x) is int and -INT64_MAX <= x <= INT64_MAX else as_int(
                        x, "external_id", problems)
            else:
                problems.coerced["args_not_object"] += 1
        if not known.issuperset(e):
            extra_c[i] = dumps_({k: v for k, v in e.items() if k not in known}).decode()
    return _events_table({
        "ph": pa.array(ph_c, pa.string()), "cat": pa.array(cat_c, pa.string()),
        "name": pa.array(name_c, pa.string()),
        "pid": pa.array(pid_c, pa.int64()), "pid_str": pa.array(pid_s, pa.string()),
        "tid": pa.array(tid_c, pa.int64()), "tid_str": pa.array(tid_s, pa.string()),
        "ts_ns": pa.array(ts_c, pa.int64()), "dur_ns": pa.array(dur_c, pa.int64()),
        "id": pa.array(id_c, pa.int64()), "id_str": pa.array(id_s, pa.string()),
        "correlation": pa.array(corr_c, pa.int64()), "external_id": pa.array(ext_c, pa.int64()),
        "args_json": _args_json(raw_args) if raw_args is not None else pa.array(args_c, pa.string()),
        "extra_json": pa.array(extra_c, pa.string()),
    })


def _int_or_str(v, what: str, problems: Problems) -> tuple:
    """(int, None) for an in-range integer, (None, str) for a string, else (coerced int or None, None)."""
    if type(v) is int and -INT64_MAX <= v <= INT64_MAX:
        return v, None
    if type(v) is str:
        return None, v
    return (None if v is None else as_int(v, what, problems)), None


def _gpu_arg_columns(args: list) -> dict:
    """The args gpu_ops reads, from a dict per GPU event: `device` and `stream` as raw values (for
    `_gpu_ops` to coerce and count), the rest as columns (a value of another type is null)."""
    arg = lambda key: list(map(dict.get, args, repeat(key)))  # noqa: E731
    grid, block = arg("grid"), arg("block")
    return {
        "device": arg("device"), "stream": arg("stream"),
        **{f"grid_{d}": pa.array([_dim(g, i) for g in grid], pa.int64()) for i, d in enumerate("xyz")},
        **{f"block_{d}": pa.array([_dim(b, i) for b in block], pa.int64()) for i, d in enumerate("xyz")},
        "registers_per_thread": _plain_ints(arg("registers per thread")),
        "shared_memory": _plain_ints(arg("shared memory")),
        "copy_bytes": _plain_ints(arg("bytes")),
        "warps_per_sm": pa.array(list(map(_as_float, arg("warps per SM"))), pa.float64()),
        "occupancy_pct": pa.array(list(map(_as_float, arg("est. achieved occupancy %"))), pa.float64()),
        "copy_bw_gbps": pa.array(list(map(_as_float, arg("memory bandwidth (GB/s)"))), pa.float64()),
    }


def _gpu_ops(rows: list, cats: list, pids: list, arg_cols: dict, ev: pa.Table, problems: Problems):
    """The gpu_ops rows of a chunk: launch geometry and copy sizes from each GPU event's args
    (`arg_cols`: `_gpu_arg_columns`; `cats`, `pids`: the rows' cat and raw pid values)."""
    devices = list(arg_cols["device"])
    for j, cat in enumerate(cats):
        if devices[j] is None and cat == "mtia_ccp_events":
            devices[j] = pids[j]  # MTIA device activity lives in the device's process
    device = _ints(devices, "device", problems)
    idx = pa.array(rows, pa.int64())
    take = ev.take(idx)
    table = pa.table({
        "event_idx": idx,
        "kind": pa.array([GPU_KINDS[c] for c in cats], pa.string()),
        **{k: take.column(k) for k in ("cat", "name")},
        "device": device,
        "stream": _ints(arg_cols["stream"], "stream", problems),
        **{k: take.column(k) for k in ("pid", "tid", "correlation", "external_id", "ts_ns", "dur_ns")},
        **{k: v for k, v in arg_cols.items() if k not in ("device", "stream")},
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


def _flows(rows: pa.Array, bp: pa.Array, ev: pa.Table) -> pa.Table:
    """The flows rows of a chunk (`rows` into the events table; `bp`: their binding points)."""
    take = ev.take(rows)
    table = pa.table({
        "event_idx": rows,
        **{k: take.column(k) for k in ("id", "id_str", "cat", "ph", "name", "ts_ns", "pid", "pid_str", "tid",
                                       "tid_str")},
        "bp": bp,
    })
    return schema.conform(table, "flows", ("flatten",))
