"""describe: a collective kernel's kind, sizes, dtype and process group, from the sources that
can say them, in the order `runs.collectives` applies them to a flattened trace: the kernel's
own args, else the communication op around its launch that carries them (`record_param_comms`),
else the op that names its kind (`c10d::allreduce_`, `nccl:all_reduce`), else the kernel's
name. One function (`describe`) applies them, over the shared tables of `pipeline.comms`.
"""

from __future__ import annotations

import re
from bisect import bisect_right
from functools import lru_cache

import orjson

from pipeline.comms import ARG_KEYS, INT_ARGS, KERNEL_KIND_PATTERN, KERNEL_KINDS
from pipeline.cost.formulas.collectives import normalize_kind as _normalize_kind

_NAME_KINDS = tuple((re.compile(KERNEL_KIND_PATTERN.format(p)), kind) for p, kind in KERNEL_KINDS)
KEYS = tuple(ARG_KEYS)
normalize_kind = lru_cache(maxsize=4096)(_normalize_kind)  # a trace names few kinds, thousands of times


def kind_from_name(name: str) -> str | None:
    """The kind a collective kernel's name says (None for ncclDevKernel_Generic and the like)."""
    for pattern, kind in _NAME_KINDS:
        if pattern.search(name):
            return kind
    return None


def arg_values(args: dict) -> dict:
    """The collective args (ARG_KEYS) of an event's args, as `runs.collectives` reads them:
    text (a list or number written as its JSON), the counts as ints; None where absent."""
    out: dict[str, int | str | None] = {}
    for col, key in ARG_KEYS.items():
        v = args.get(key)
        if v is None:
            out[col] = None
        elif col in INT_ARGS:
            out[col] = _int(v)
        else:
            out[col] = v if isinstance(v, str) else orjson.dumps(v).decode()
    return out


def _int(v) -> int | None:
    if type(v) is int:
        return v
    if type(v) is float and v.is_integer():
        return int(v)
    if isinstance(v, str):
        try:
            return int(v.strip())
        except ValueError:
            return None
    return None


class OpsAround:
    """The communication CPU ops of a trace by thread, to find the one around a launch."""

    def __init__(self, ops: list[dict]):
        self.informed: dict = {}  # thread -> ([start], [op]) of ops carrying a collective's args
        self.named: dict = {}  # thread -> ([start], [op]) of ops whose name says the kind
        for op in sorted(ops, key=lambda o: o["ts_ns"]):
            values = arg_values(op["args"])
            rpc = op["name"] == "record_param_comms"
            op_kind = normalize_kind(values["collective"]) or (None if rpc else normalize_kind(op["name"]))
            op = {**op, "values": values, "op_kind": op_kind}
            thread = (op["pid"], op["tid"])
            if values["collective"] is not None:
                self._add(self.informed, thread, op)
            if not op["name"].startswith("record_param_comms") and op_kind is not None:
                self._add(self.named, thread, op)

    @staticmethod
    def _add(table: dict, thread: tuple, op: dict) -> None:
        starts, rows = table.setdefault(thread, ([], []))
        starts.append(op["ts_ns"])
        rows.append(op)

    @staticmethod
    def around(table: dict, thread: tuple, at: int) -> dict | None:
        """The last op that started at or before `at` on the thread, if it still ran then."""
        starts, rows = table.get(thread, ((), ()))
        i = bisect_right(starts, at) - 1
        if i < 0 or rows[i]["end_ns"] < at:
            return None
        return rows[i]


def describe(kernel: dict, launch: tuple | None, ops: OpsAround) -> dict:
    """kind, op_name and the ARG_KEYS columns of one collective kernel (`launch`: the (pid, tid,
    ts_ns) of its launch, if known)."""
    own = arg_values(kernel["args"])
    informed = named = None
    if launch is not None and launch[0] is not None:
        thread, at = (launch[0], launch[1]), launch[2]
        informed = ops.around(ops.informed, thread, at)
        named = ops.around(ops.named, thread, at)
    out = {k: own[k] if own[k] is not None else (informed["values"][k] if informed else None) for k in KEYS}
    kind = normalize_kind(own["collective"])
    for source in (informed, named):
        if kind is None and source is not None:
            kind = source["op_kind"]
    out["kind"] = kind or kind_from_name(kernel["name"])
    op_name = named["name"] if named is not None else None
    if op_name is None and informed is not None and informed["op_kind"] is not None:
        op_name = "record_param_comms"
    out["op_name"] = op_name
    return out
