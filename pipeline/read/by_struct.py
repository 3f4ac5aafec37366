"""by_struct: the fast builder. msgspec decodes a chunk straight into typed structs (no dict per
event; `args` kept as its raw JSON text, never parsed and written again). It takes a chunk only
when every event has the plain shape (known keys, each of its usual type), else returns None."""

from __future__ import annotations

from itertools import repeat
from operator import attrgetter

import msgspec
import pyarrow as pa
import pyarrow.compute as pc

from pipeline.kineto import GPU_ARG_ALIASES
from pipeline.read.arrays import (
    args_json_of,
    int_column,
    int_or_str_columns,
    plain_ints,
    plain_strings,
    raw_texts,
    valid_utf8,
)
from pipeline.read.tables import EVENT_COLUMNS, ChunkTables, events_table, flows_of, gpu_and_flow_rows, gpu_ops_of
from pipeline.read.timestamps import ns_column, ts_column
from pipeline.read.values import Problems

# ---------------------------------------------------------------- 1. typed structs (msgspec)
_NULL = msgspec.Raw(b"null")


_ABSENT = msgspec.Raw(b"")


class _Event(msgspec.Struct, forbid_unknown_fields=True, gc=False):
    """An event of the plain shape; any other key or type fails the decode (`tables_by_struct`)."""

    ph: str | None = None
    cat: str | None = None
    name: str | None = None
    pid: int | str | None = None
    tid: int | str | None = None
    ts: int | float | str | None = None  # a string: torch_npu's exact decimal text
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


def _transpose(structs: list, kind: type[msgspec.Struct]) -> dict:
    """{field: tuple of its values} of a list of msgspec structs of one kind: one C call per
    struct (astuple) and a C-level transpose, half the cost of a getattr per field and struct."""
    columns = zip(*map(msgspec.structs.astuple, structs)) if structs else repeat(())
    return dict(zip(kind.__struct_fields__, columns))


_PLAIN_JSON_VALUE = r'^(?:"[^"\\\x00-\x1f]*"|null)$'  # a value every JSON writer writes the same way


def tables_by_struct(text: bytes) -> ChunkTables | None:
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
    extras = {k: raw_texts(v) for k in _EXTRA_KEYS if (v := fields.pop(k)).count(_ABSENT) < len(v)}
    problems = Problems()
    cols = _event_columns_by_struct(fields, extras, text, problems)
    if cols is None:
        return None
    ev_table = events_table(cols)
    gpu_rows, flow_rows = gpu_and_flow_rows(ev_table)
    arg_cols = _gpu_arg_columns_by_struct([fields["args"][i] for i in gpu_rows])
    if arg_cols is None:
        return None
    gpu_table, device_ids, task_pids = gpu_ops_of(
        gpu_rows,
        [fields["cat"][i] for i in gpu_rows],
        [fields["pid"][i] for i in gpu_rows],
        arg_cols,
        ev_table,
        problems,
    )
    bp = plain_strings(extras["bp"].take(flow_rows)) if "bp" in extras else pa.nulls(len(flow_rows), pa.string())
    return ChunkTables(ev_table, gpu_table, flows_of(flow_rows, bp, ev_table), problems, device_ids, task_pids)


def _event_columns_by_struct(fields: dict, extras: dict, text: bytes, problems: Problems) -> dict | None:
    """The events columns from the structs' fields (`_Event`'s, each a tuple) and extra keys
    (`_EXTRA_KEYS`, raw JSON texts); None if a value needs the dict path. Timestamps written as
    decimal strings are counted in `problems` as the dict path counts them."""
    raws = fields["args"]
    try:
        ids = _DECODE_ID_ARGS.decode(b"[" + b",".join(raws) + b"]")
    except (msgspec.MsgspecError, ValueError):
        return None  # an args value that is not an object, or an id that is not an integer
    cols = {k: pa.array(fields[k], pa.string()) for k in ("ph", "cat", "name")}
    for k in ("pid", "tid", "id"):
        split = int_or_str_columns(fields[k], typed=True)
        if split is None:
            return None
        cols[k], cols[f"{k}_str"] = split
    cols["ts_ns"], cols["dur_ns"] = (
        ts_column(fields["ts"], text, problems, typed=True),
        ns_column(fields["dur"], None, typed=True),
    )
    if None in ids:
        ids = [a or _EMPTY_ID_ARGS for a in ids]
    id_arg = lambda key: int_column(list(map(attrgetter(key), ids)), typed=True)  # cheaper than a transpose
    ext, lower = id_arg("external_id"), id_arg("external_id_lower")  # the oldest layout writes "external id"
    if ext is not None and lower is not None and lower.null_count < len(lower):
        ext = pc.coalesce(ext, lower)
    cols["correlation"], cols["external_id"] = id_arg("correlation"), None if lower is None else ext
    cols["extra_json"] = extra_json_of_struct_keys(extras, len(raws))
    if any(v is None for v in cols.values()):
        return None
    cols["args_json"] = args_json_of(raws)
    if not all(valid_utf8(a) for a in (cols["args_json"], *extras.values())):
        return None  # raw texts are not decoded: the dict path reports the chunk
    return {k: cols[k] for k in EVENT_COLUMNS}


# The args of GPU activity that gpu_ops reads (`gpu_arg_columns`), each of its usual type: (field,
# type, key in the args); then the keys some backends write instead (`kineto.GPU_ARG_ALIASES`), as
# fields `<field>__<i>` read where the field is absent.
GPU_ARG_FIELDS = (
    ("device", int | None, "device"),
    ("stream", int | None, "stream"),
    ("grid", list[int] | None, "grid"),
    ("block", list[int] | None, "block"),
    ("registers_per_thread", int | None, "registers per thread"),
    ("shared_memory", int | None, "shared memory"),
    ("copy_bytes", int | None, "bytes"),
    ("warps_per_sm", int | float | None, "warps per SM"),
    ("occupancy_pct", int | float | None, "est. achieved occupancy %"),
    ("copy_bw_gbps", int | float | None, "memory bandwidth (GB/s)"),
    ("kineto_graph_id", int | None, "graph id"),
    ("kineto_graph_node_id", int | None, "graph node id"),
)
ALIAS_FIELDS = tuple(
    (f"{field}__{i}", field, typ, alias)
    for field, typ, key in GPU_ARG_FIELDS
    for i, alias in enumerate(GPU_ARG_ALIASES.get(key, ()))
)
_GpuArgs = msgspec.defstruct(
    "_GpuArgs",
    [
        (f, t, msgspec.field(default=None, name=key))
        for f, t, key in (*GPU_ARG_FIELDS, *((f, t, key) for f, _, t, key in ALIAS_FIELDS))
    ],
    gc=False,
)


_DECODE_GPU_ARGS = msgspec.json.Decoder(list[_GpuArgs | None])  # type: ignore[valid-type]  # a defstruct


_EMPTY_GPU_ARGS = _GpuArgs()


def _gpu_arg_columns_by_struct(raws: list) -> dict | None:
    """`gpu_arg_columns` from the GPU events' raw args; None if a value needs the dict path."""
    try:
        args = [a or _EMPTY_GPU_ARGS for a in _DECODE_GPU_ARGS.decode(b"[" + b",".join(raws) + b"]")]
    except (msgspec.MsgspecError, ValueError):
        return None
    fields = _transpose(args, _GpuArgs)
    for alias_field, field_name, _, _ in ALIAS_FIELDS:  # a backend's name for the arg, where it is absent
        fields[field_name] = [v if v is not None else a for v, a in zip(fields[field_name], fields.pop(alias_field))]
    field = fields.__getitem__
    cols = {"device": field("device"), "stream": field("stream")}
    for key in ("grid", "block"):
        dims = _dims_by_column(field(key))
        if dims is None:
            return None
        cols.update({f"{key}_{d}": v for d, v in zip("xyz", dims)})
    for k in ("registers_per_thread", "shared_memory", "copy_bytes", "kineto_graph_id", "kineto_graph_node_id"):
        cols[k] = plain_ints(field(k))
    for k in ("warps_per_sm", "occupancy_pct", "copy_bw_gbps"):
        cols[k] = pa.array(field(k), pa.float64())
    return cols


def _dims_by_column(values: list) -> list | None:
    """x, y, z columns of [x, y, z] lists of ints (or None); None if a list is shorter or a value
    is out of range (the element-wise `dim_at` decides those)."""
    try:
        lists = pa.array(values, pa.list_(pa.int64()))
    except (pa.ArrowInvalid, OverflowError):
        return None
    if lists.null_count < len(lists) and pc.min(pc.list_value_length(lists)).as_py() < 3:
        return None
    return [pc.list_element(lists, i) for i in range(3)]


def extra_json_of_struct_keys(extras: dict, n: int) -> pa.Array | None:
    """extra_json from the extra keys `_Event` accepts (`extras`: key -> raw JSON texts, empty when
    absent; keys absent from every event left out), e.g. `{"bp":"e"}`; None (the dict path decides)
    when an event has two of them (their order in the event is unknown here) or when a value is not
    a plain string or null (another writer could write it otherwise)."""
    out = None
    for key, raw in extras.items():
        # a key's values are few (`"e"`): checked and wrapped once per distinct value
        coded = pc.dictionary_encode(raw)
        values = coded.dictionary
        present = pc.not_equal(values, "")
        if not pc.any(present).as_py():
            continue
        if not pc.all(pc.match_substring_regex(values.filter(present), _PLAIN_JSON_VALUE)).as_py():
            return None
        wrapped = pc.if_else(
            present, pc.binary_join_element_wise(f'{{"{key}":', values, "}", ""), pa.scalar(None, pa.string())
        )
        text = wrapped.take(coded.indices)
        if out is not None and pc.any(pc.and_(pc.is_valid(out), pc.is_valid(text))).as_py():
            return None
        out = text if out is None else pc.coalesce(out, text)
    return out if out is not None else pa.nulls(n, pa.string())


def raw_args_of(text: bytes) -> list | None:
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
