"""by_dicts: the builders over orjson dicts. `events_by_column` builds a column at a time with
C-level loops when every value is of its column's type; `events_by_event` takes any chunk, one
event at a time, coercing and counting every odd value."""

from __future__ import annotations

import functools
from itertools import repeat

import orjson
import pyarrow as pa
import pyarrow.compute as pc

from pipeline.kineto import GPU_ARG_ALIASES
from pipeline.read.arrays import (
    DICT_OR_NONE,
    STR_OR_NONE,
    args_json_of,
    int_column,
    int_or_str_columns,
    plain_ints,
)
from pipeline.read.chunks import NeedsExactParse
from pipeline.read.tables import EVENT_COLUMNS, events_table
from pipeline.read.timestamps import TimestampTexts, ns_column, ts_column
from pipeline.read.values import (
    FLOAT_EXACT_US,
    INT64_MAX,
    KNOWN_KEYS,
    Problems,
    as_float,
    as_int,
    as_text,
    dim_at,
    dumps,
    json_default,
    us_to_ns,
    wide_int,
)

EMPTY_ARGS: dict = {}


def events_by_column(
    events: list, text: bytes | None, raw_args: list | None = None, problems: Problems | None = None
) -> pa.Table | None:
    """The events table built a column at a time with C-level loops (map, Arrow compute).

    Returns None as soon as any value is not of its column's plain type (a non-object event,
    a non-string name, a float id, an out-of-range integer, ...): such chunks go through
    `events_by_event`, which counts each coercion. Timestamps written as decimal strings (torch_npu)
    are read here, exactly, and counted in `problems` as `events_by_event` counts them.
    """
    if set(map(type, events)) - {dict}:
        return None
    get = dict.get
    raw = {k: list(map(get, events, repeat(k))) for k in ("ph", "cat", "name", "pid", "tid", "ts", "dur", "id", "args")}
    cols = {}
    for k in ("ph", "cat", "name"):
        if set(map(type, raw[k])) - STR_OR_NONE:
            return None
        cols[k] = pa.array(raw[k], pa.string())
    for k in ("pid", "tid"):
        split = int_or_str_columns(raw[k])
        if split is None:
            return None
        cols[k], cols[f"{k}_str"] = split
    counted = Problems()  # merged into `problems` once the chunk is built here
    ts = ts_column(raw["ts"], text, counted)
    dur = ns_column(raw["dur"], None)
    ids = int_or_str_columns(raw["id"])
    args = raw["args"]
    if ts is None or dur is None or ids is None or set(map(type, args)) - DICT_OR_NONE:
        return None
    cols["ts_ns"], cols["dur_ns"] = ts, dur
    cols["id"], cols["id_str"] = ids
    arg_dicts = [a or EMPTY_ARGS for a in args]
    corr = int_column(list(map(get, arg_dicts, repeat("correlation"))))
    ext = int_column(list(map(get, arg_dicts, repeat("External id"))))
    if text is None or b'"external id"' in text:
        lower = int_column(list(map(get, arg_dicts, repeat("external id"))))
        ext = None if ext is None or lower is None else pc.coalesce(ext, lower)
    if corr is None or ext is None:
        return None
    cols["correlation"], cols["external_id"] = corr, ext
    cols["args_json"] = args_json_of(raw_args if raw_args is not None else _dump_all(args))
    cols["extra_json"] = _extra_json(events, cols)
    if problems is not None:
        problems.merge(counted)
    return events_table({k: cols[k] for k in EVENT_COLUMNS})


_dumps_exact = functools.partial(orjson.dumps, default=json_default)  # C-level: no Python frame per event


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


def events_by_event(events: list, text: bytes | None, raw_args: list | None, problems: Problems) -> pa.Table:
    """The events table built one event at a time: every odd value is coerced and counted.

    The common types take the first branch of each test; odd values go through the coercing
    helpers, which count every coercion or drop by reason.
    """
    exact_ts = TimestampTexts(text, events)
    n = len(events)
    # a value per event, None where it has none
    ph_c: list[str | None]
    cat_c: list[str | None]
    name_c: list[str | None]
    pid_c: list[int | None]
    pid_s: list[str | None]
    tid_c: list[int | None]
    tid_s: list[str | None]
    ts_c: list[int | None]
    dur_c: list[int | None]
    id_c: list[int | None]
    id_s: list[str | None]
    corr_c: list[int | None]
    ext_c: list[int | None]
    args_c: list[str | None]
    extra_c: list[str | None]
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
            ph = as_text(ph, "ph", problems)
        if type(cat) is not str and cat is not None:
            cat = as_text(cat, "cat", problems)
        if type(name) is not str and name is not None:
            name = as_text(name, "name", problems)
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
            elif type(fid) is int:
                id_c[i], id_s[i] = wide_int(fid)
            elif type(fid) is float and not -INT64_MAX <= fid <= INT64_MAX:
                raise NeedsExactParse("id")  # orjson reads an integer beyond 64 bits as a float
            else:
                id_s[i] = fid if type(fid) is str else dumps_(fid).decode()
        args = e.get("args")
        if args is not None:
            # .decode(): a small bytes from orjson.dumps holds a 4 KB buffer; the str is exact-sized
            args_c[i] = dumps_(args).decode()
            if type(args) is dict:
                c = args.get("correlation")
                if c is not None:
                    corr_c[i] = (
                        c if type(c) is int and -INT64_MAX <= c <= INT64_MAX else as_int(c, "correlation", problems)
                    )
                x = args.get("External id")
                if x is None:
                    x = args.get("external id")
                if x is not None:
                    ext_c[i] = (
                        x if type(x) is int and -INT64_MAX <= x <= INT64_MAX else as_int(x, "external_id", problems)
                    )
            else:
                problems.coerced["args_not_object"] += 1
        if not known.issuperset(e):
            extra_c[i] = dumps_({k: v for k, v in e.items() if k not in known}).decode()
    return events_table(
        {
            "ph": pa.array(ph_c, pa.string()),
            "cat": pa.array(cat_c, pa.string()),
            "name": pa.array(name_c, pa.string()),
            "pid": pa.array(pid_c, pa.int64()),
            "pid_str": pa.array(pid_s, pa.string()),
            "tid": pa.array(tid_c, pa.int64()),
            "tid_str": pa.array(tid_s, pa.string()),
            "ts_ns": pa.array(ts_c, pa.int64()),
            "dur_ns": pa.array(dur_c, pa.int64()),
            "id": pa.array(id_c, pa.int64()),
            "id_str": pa.array(id_s, pa.string()),
            "correlation": pa.array(corr_c, pa.int64()),
            "external_id": pa.array(ext_c, pa.int64()),
            "args_json": args_json_of(raw_args) if raw_args is not None else pa.array(args_c, pa.string()),
            "extra_json": pa.array(extra_c, pa.string()),
        }
    )


def _int_or_str(v, what: str, problems: Problems) -> tuple:
    """(int, None) for an in-range integer, (None, str) for a string, an integer beyond int64 as
    `wide_int` keeps it, else (coerced int or None, None)."""
    if type(v) is int and -INT64_MAX <= v <= INT64_MAX:
        return v, None
    if type(v) is str:
        return None, v
    if type(v) is int:
        return wide_int(v)
    if type(v) is float and not -INT64_MAX <= v <= INT64_MAX:
        raise NeedsExactParse(what)  # orjson reads an integer beyond 64 bits as a float
    return (None if v is None else as_int(v, what, problems)), None


def gpu_arg_columns(args: list) -> dict:
    """The args gpu_ops reads, from a dict per GPU event: `device` and `stream` as raw values (for
    `gpu_ops_of` to coerce and count), the rest as columns (a value of another type is null)."""
    arg = lambda key: _with_aliases(args, key)
    grid, block = arg("grid"), arg("block")
    return {
        "device": arg("device"),
        "stream": arg("stream"),
        **{f"grid_{d}": pa.array([dim_at(g, i) for g in grid], pa.int64()) for i, d in enumerate("xyz")},
        **{f"block_{d}": pa.array([dim_at(b, i) for b in block], pa.int64()) for i, d in enumerate("xyz")},
        "registers_per_thread": plain_ints(arg("registers per thread")),
        "shared_memory": plain_ints(arg("shared memory")),
        "copy_bytes": plain_ints(arg("bytes")),
        "kineto_graph_id": plain_ints(arg("graph id")),
        "kineto_graph_node_id": plain_ints(arg("graph node id")),
        "warps_per_sm": pa.array(list(map(as_float, arg("warps per SM"))), pa.float64()),
        "occupancy_pct": pa.array(list(map(as_float, arg("est. achieved occupancy %"))), pa.float64()),
        "copy_bw_gbps": pa.array(list(map(as_float, arg("memory bandwidth (GB/s)"))), pa.float64()),
    }


def _with_aliases(args: list, key: str) -> list:
    """Each dict's value of `key`, else of the first alias a backend writes instead that it has
    (`kineto.GPU_ARG_ALIASES`: XPU's `sycl queue` for `stream`)."""
    values = list(map(dict.get, args, repeat(key)))
    for alias in GPU_ARG_ALIASES.get(key, ()):
        values = [v if v is not None else a.get(alias) for v, a in zip(values, args)]
    return values
