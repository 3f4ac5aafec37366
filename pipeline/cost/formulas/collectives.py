"""Collective formulas: c10d, _c10d_functional, ProcessGroupNCCL/Gloo ranges and record_param_comms.

A collective's FLOPs are 0 (the reduction arithmetic of allreduce is ignored); its bytes are the
message size as nccl-tests reports it ("size"): the full buffer of allreduce/broadcast/reduce, the
gathered output of allgather, the scattered input of reducescatter, the send buffer of alltoall,
read from the op's own args by the rule `ranks` uses too (`messages`).
`collective_bandwidth` turns a size and a time into nccl-tests' algbw and busbw.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping
from dataclasses import replace
from functools import partial
from typing import Any

from .inputs import OpInputs, need
from .messages import OP_ARGS, message_bytes, op_message
from .registry import Formula, Work, register

# nccl-tests bus-bandwidth factors, n = the number of ranks in the collective
BUS_FACTOR: dict[str, Callable[[int], float]] = {
    "allreduce": lambda n: 2 * (n - 1) / n,
    "allgather": lambda n: (n - 1) / n,
    "reducescatter": lambda n: (n - 1) / n,
    "alltoall": lambda n: (n - 1) / n,
    "broadcast": lambda n: 1.0,
    "reduce": lambda n: 1.0,
    "sendrecv": lambda n: 1.0,
}
KINDS = (*BUS_FACTOR, "barrier", "gather", "scatter")  # every collective kind; the last ones move no message
_KIND_ALIASES = {
    "alltoallv": "alltoall",
    "alltoallvc": "alltoall",  # HCCL (hcom_alltoallvc_)
    "allgatherv": "allgather",
    "reducescatterv": "reducescatter",
    "send": "sendrecv",
    "recv": "sendrecv",
    "receive": "sendrecv",  # HCCL (hcom_receive_)
    "batchsendrecv": "sendrecv",
    "recvanysource": "sendrecv",
}


def normalize_kind(raw: Any) -> str | None:
    """The collective kind (`KINDS`) a name says: `allreduce`, `all_reduce`, `c10d::allreduce_`,
    `nccl:all_reduce`, `_allgather_base`, `gloo:all_gather`, `AllReduce`, ... else None."""
    if not isinstance(raw, str) or not raw.strip():
        return None
    key = re.split(r"::|:", raw.strip())[-1].split(" ")[0].strip("_").lower()
    for suffix in ("_coalesced", "_base", "_into_tensor", "_tensor", "_single", "_oop"):
        key = key.replace(suffix, "")
    key = key.replace("_", "")
    key = _KIND_ALIASES.get(key, key)
    return key if key in KINDS else None


def _normalize_kind(raw: Any) -> str | None:
    """A kind that moves a message (has a bus-bandwidth factor), else None."""
    kind = normalize_kind(raw)
    return kind if kind in BUS_FACTOR else None


def collective_kind(name: str, args: Mapping[str, Any] | None = None) -> str | None:
    """allreduce / allgather / reducescatter / alltoall / broadcast / reduce / sendrecv, or None.

    ``record_param_comms`` events name their collective in the "Collective name" arg.
    """
    if name == "record_param_comms":
        return _normalize_kind((args or {}).get("Collective name")) if isinstance(args, Mapping) else None
    return _normalize_kind(name)


def collective_bandwidth(kind: str, message_bytes: float, seconds: float, world_size: int) -> tuple[float, float]:
    """(algbw, busbw) in GB/s (1e9 bytes/s) as nccl-tests reports them.

    algbw = message bytes / time; busbw = algbw × factor: allreduce 2(n-1)/n, allgather,
    reducescatter and alltoall (n-1)/n, broadcast, reduce and send/recv 1. `message_bytes` is
    nccl-tests' size (`Cost.bytes` of a collective). Unknown kind: ValueError; a non-positive
    time, a negative size or a world size below 1: (nan, nan).
    """
    key = _normalize_kind(kind)
    if key is None:
        raise ValueError(f"unknown collective kind: {kind!r}")
    try:
        ok = seconds > 0 and message_bytes >= 0 and world_size >= 1 and math.isfinite(seconds)
    except TypeError:
        ok = False
    if not ok:
        return math.nan, math.nan
    algbw = message_bytes / seconds / 1e9
    return algbw, algbw * BUS_FACTOR[key](int(world_size))


def _collective(name: str, kind: str | None, inp: OpInputs) -> Work:
    """Message size (nccl-tests "size") of one collective op from its own args; FLOPs 0.

    What the op records is read as `messages.op_message` reads it (record_param_comms: In/Out msg
    nelems; `nccl:*` / `gloo:*`: its input tensors; `c10d::*`: its input and output arguments),
    and the size is the count `messages.SIZE_RULE` names for the kind (an allgather's shard times
    the group size, when the op records it).
    """
    attrs = inp.attrs
    kind = kind or collective_kind("record_param_comms", attrs)
    need(kind is not None)
    message = op_message(name, attrs)
    need(message is not None)
    assert message is not None
    if message.dtype is None:  # a TensorList's element type is not recorded
        message = replace(message, dtype=inp.dtype_fallback)
    size = message_bytes(kind, message)
    need(size is not None)
    return Work(0, (), read_bytes=size, dtype=message.dtype)


_COLLECTIVES: tuple[tuple[tuple[str, ...], str | None], ...] = (
    # (ops that record their buffers alike, kind (None: from the "Collective name" arg))
    (("record_param_comms",), None),
    (("c10d::allreduce_", "c10d::allreduce_coalesced_"), "allreduce"),
    (
        (
            "c10d::allgather_",
            "c10d::_allgather_base_",
            "c10d::allgather_coalesced_",
            "c10d::allgather_into_tensor_coalesced_",
        ),
        "allgather",
    ),
    (
        ("c10d::reduce_scatter_", "c10d::_reduce_scatter_base_", "c10d::reduce_scatter_tensor_coalesced_"),
        "reducescatter",
    ),
    (("c10d::broadcast_",), "broadcast"),
    (("c10d::reduce_",), "reduce"),
    (("c10d::alltoall_", "c10d::alltoall_base_"), "alltoall"),
    (("c10d::send", "c10d::recv_", "c10d::recv_any_source_"), "sendrecv"),
    (
        (
            "_c10d_functional::all_reduce",
            "_c10d_functional::all_reduce_",
            "_c10d_functional::all_reduce_coalesced",
            "_c10d_functional::all_reduce_coalesced_",
        ),
        "allreduce",
    ),
    (
        (
            "_c10d_functional::all_gather_into_tensor",
            "_c10d_functional::all_gather_into_tensor_out",
            "_c10d_functional::all_gather_into_tensor_coalesced",
        ),
        "allgather",
    ),
    (
        ("_c10d_functional::reduce_scatter_tensor", "_c10d_functional::reduce_scatter_tensor_coalesced"),
        "reducescatter",
    ),
    (("_c10d_functional::all_to_all_single",), "alltoall"),
    (("_c10d_functional::broadcast", "_c10d_functional::broadcast_"), "broadcast"),
) + tuple(
    # record_function ranges of ProcessGroupNCCL / ProcessGroupGloo: they record the input tensors
    (tuple(f"{backend}:{op}" for backend in ("nccl", "gloo") for op in ops), kind)
    for ops, kind in (
        (("all_reduce", "all_reduce_coalesced", "allreduce_coalesced"), "allreduce"),
        (("all_gather", "_all_gather_base", "all_gather_into_tensor_coalesced", "allgather_coalesced"), "allgather"),
        (("reduce_scatter", "_reduce_scatter_base", "reduce_scatter_tensor_coalesced"), "reducescatter"),
        (("broadcast",), "broadcast"),
        (("reduce",), "reduce"),
        (("all_to_all", "alltoall_base", "alltoall"), "alltoall"),
        (("send", "recv"), "sendrecv"),
    )
)
for _names, _kind in _COLLECTIVES:
    # the ops of a row record their buffers at the same places: the first one's reading holds for all
    assert len({OP_ARGS.get(n) for n in _names}) == 1, _names
    register(
        Formula(
            _names,
            "collective",
            "0",
            "message size = nccl-tests size of the buffers the op records (docs: Whole runs, collective sizes)",
            partial(_collective, _names[0], _kind),
        )
    )
