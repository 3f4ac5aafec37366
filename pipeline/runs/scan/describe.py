"""describe: a collective kernel's kind, process group and message, from the sources that can say
them, by the rules `runs.collectives` applies to a flattened trace and over the same tables: the
kernel's own args, the communication events around its launch on the launching thread, the calls
a coalesced group recorded, the kernel's name. Each of `messages.SIZE_SOURCES` gives a reading
(`Message`); `message` picks the collective's counts and dtype from them as `with_message` does.
`describe` applies them all to one kernel: the one place the streaming pass decides what a
collective is.
"""

from __future__ import annotations

import re
from bisect import bisect_right
from functools import lru_cache

import orjson

from pipeline.comms import ARG_KEYS, KERNEL_KIND_PATTERN, KERNEL_KINDS
from pipeline.cost.formulas.collectives import normalize_kind as _normalize_kind
from pipeline.cost.formulas.dtypes import DTYPE_SIZE
from pipeline.cost.formulas.messages import SIZE_SOURCES, Message, message_nelems, op_message
from pipeline.kineto import ARG_ALIASES

_NAME_KINDS = tuple((re.compile(KERNEL_KIND_PATTERN.format(p)), kind) for p, kind in KERNEL_KINDS)
normalize_kind = lru_cache(maxsize=4096)(_normalize_kind)  # a trace names few kinds, thousands of times
_EVENTS = [re.compile(s.events) if s.on != "kernel" else None for s in SIZE_SOURCES]
_ALIASES = [(alias, key) for alias, key in ARG_ALIASES.items()]


def kind_from_name(name: str) -> str | None:
    """The kind a collective kernel's name says (None for ncclDevKernel_Generic and the like)."""
    for pattern, kind in _NAME_KINDS:
        if pattern.search(name):
            return kind
    return None


def canonical(args: dict) -> dict:
    """Args under their usual names where an older layout names them otherwise (`Input dims`)."""
    missing = [(a, k) for a, k in _ALIASES if k not in args and a in args]
    return {**args, **{k: args[a] for a, k in missing}} if missing else args


def pg_values(args: dict) -> dict:
    """The group args (ARG_KEYS) as `runs.collectives` reads them: text (a list or a number
    written as its JSON), None where absent."""
    out: dict[str, str | None] = {}
    for col, key in ARG_KEYS.items():
        v = args.get(key)
        out[col] = None if v is None else v if isinstance(v, str) else orjson.dumps(v).decode()
    return out


class OpsAround:
    """A trace's communication CPU events (ops and annotations), by source and thread, to find
    the one around a launch; and its `record_param_comms` calls, for coalesced groups."""

    def __init__(self, ops: list[dict]):
        self.by_source: list[dict] = [{} for _ in SIZE_SOURCES]  # source -> thread -> ([start], [op])
        self.calls: dict = {}  # thread -> ([start], [op]): record_param_comms, for coalesced groups
        for op in sorted(ops, key=lambda o: o["ts_ns"]):
            args = canonical(op["args"])
            values = pg_values(args)
            rpc = op["name"] == "record_param_comms"
            kind = normalize_kind(values["collective"]) or (None if rpc else normalize_kind(op["name"]))
            op = {**op, "args": args, "values": values, "op_kind": kind, "message": op_message(op["name"], args)}
            thread = (op["pid"], op["tid"])
            for i, pattern in enumerate(_EVENTS):
                if pattern is not None and pattern.search(op["name"]):  # around a launch, or a coalesced group's
                    _add(self.by_source[i], thread, op)
            if rpc:
                _add(self.calls, thread, op)

    def around(self, i: int, thread: tuple, at: int) -> dict | None:
        """The last event of source `i` that started at or before `at` on the thread, if it still ran then."""
        starts, rows = self.by_source[i].get(thread, ((), ()))
        j = bisect_right(starts, at) - 1
        if j < 0 or rows[j]["end_ns"] < at:
            return None
        return rows[j]

    def coalesced(self, i: int, thread: tuple, since: int | None, at: int) -> tuple[Message | None, str | None]:
        """The calls recorded on the thread in (since, at], as source `i` reads them, summed (None
        when one count is unknown), and their kind when they agree."""
        starts, rows = self.calls.get(thread, ((), ()))
        a = 0 if since is None else bisect_right(starts, since)
        b = bisect_right(starts, at)
        got = [(SIZE_SOURCES[i].read(r["name"], r["args"]), r["op_kind"]) for r in rows[a:b]]
        if not got:
            return None, None
        msgs = [m or Message() for m, _ in got]
        total = lambda xs: None if any(x is None for x in xs) else sum(xs)
        first = lambda xs: next((x for x in xs if x is not None), None)
        m = Message(
            total([x.in_nelems for x in msgs]),
            total([x.out_nelems for x in msgs]),
            first([x.dtype for x in msgs]),
            first([x.group_size for x in msgs]),
        )
        kinds = {k for _, k in got}
        return m, (kinds.pop() if len(kinds) == 1 else None)


def _add(table: dict, thread: tuple, op: dict) -> None:
    starts, rows = table.setdefault(thread, ([], []))
    starts.append(op["ts_ns"])
    rows.append(op)


def describe(kernel: dict, launch: tuple | None, ops: OpsAround, previous: int | None) -> dict:
    """collective, kind, op_name, the group args, group_size and `readings` (one Message or None
    per size source) of one collective kernel; `launch`: the (pid, tid, ts_ns) of its launch, if
    known; `previous`: the launch before it of a collective kernel on that thread."""
    args = canonical(kernel["args"])
    out: dict = pg_values(args)
    readings: list[Message | None] = []
    around: list[dict] = []  # the events around the launch, in the sources' order
    coalesced_kind = None
    thread = (launch[0], launch[1]) if launch is not None and launch[0] is not None else None
    for i, source in enumerate(SIZE_SOURCES):
        if source.on == "kernel":
            readings.append(source.read(kernel["name"], args))
        elif thread is None:
            readings.append(None)
        elif source.on == "launch":
            op = ops.around(i, thread, launch[2])  # type: ignore[index]
            readings.append(op["message"] if op is not None else None)
            if op is not None:
                around.append(op)
        else:  # a coalesced group: only when the launch sits inside its event (`nccl:coalesced`)
            inside = ops.around(i, thread, launch[2]) is not None  # type: ignore[index]
            m, k = ops.coalesced(i, thread, previous, launch[2]) if inside else (None, None)  # type: ignore[index]
            readings.append(m)
            coalesced_kind = k
    for col in out:
        if out[col] is None:
            out[col] = next((op["values"][col] for op in around if op["values"][col] is not None), None)
    kind = normalize_kind(out["collective"])
    for op in around:
        kind = kind or op["op_kind"]
    out["kind"] = kind or coalesced_kind or kind_from_name(kernel["name"])
    out["op_name"] = next((op["name"] for op in around if op["op_kind"] is not None), None)
    out["group_size"] = next((m.group_size for m in readings if m is not None and m.group_size), None)
    out["readings"] = readings
    return out


def message(kind: str, readings: list[Message | None], pg_size: int | None, sources: list[str] | None = None) -> tuple:
    """(in_nelems, out_nelems, dtype, bytes, size_from) of a collective from its sources'
    readings: the counts of the first source by which its kind's size is known, the dtype of that
    source else of the first that says one; bytes = nccl-tests' size x the dtype's size (None for
    barrier or without a dtype). `sources`: the readings' source names (default: SIZE_SOURCES')."""
    chosen = next(
        (i for i, m in enumerate(readings) if m is not None and message_nelems(kind, m, pg_size) is not None), None
    )
    m = readings[chosen] if chosen is not None else None
    dtype = (m.dtype if m is not None else None) or next((r.dtype for r in readings if r is not None and r.dtype), None)
    n = message_nelems(kind, m, pg_size) if m is not None else None
    size = DTYPE_SIZE.get(dtype) if dtype else None
    nbytes = n * size if kind != "barrier" and n is not None and size is not None else None
    names = sources if sources is not None else [x.name for x in SIZE_SOURCES]
    source = names[chosen] if chosen is not None else None
    return (m.in_nelems if m else None, m.out_nelems if m else None, dtype, nbytes, source)
