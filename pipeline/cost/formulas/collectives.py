"""Collective formulas: c10d, _c10d_functional, ProcessGroupNCCL/Gloo ranges and record_param_comms.

A collective's FLOPs are 0 (the reduction arithmetic of allreduce is ignored); its bytes are the
message size as nccl-tests reports it ("size"): the full buffer of allreduce/broadcast/reduce, the
gathered output of allgather, the scattered input of reducescatter, the send buffer of alltoall.
`collective_bandwidth` turns a size and a time into nccl-tests' algbw and busbw.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping
from functools import partial
from typing import Any, Literal

from .dtypes import DTYPE_SIZE, normalize_dtype
from .inputs import Insufficient, OpInputs, need
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
_KIND_ALIASES = {"alltoallv": "alltoall", "send": "sendrecv", "recv": "sendrecv", "recvanysource": "sendrecv"}


def normalize_kind(raw: Any) -> str | None:
    """The collective kind (`KINDS`) a name says: `allreduce`, `all_reduce`, `c10d::allreduce_`,
    `nccl:all_reduce`, `_allgather_base`, `gloo:all_gather`, `AllReduce`, ... else None."""
    if not isinstance(raw, str) or not raw.strip():
        return None
    key = re.split(r"::|:", raw.strip())[-1].split(" ")[0].strip("_").lower()
    for suffix in ("_coalesced", "_base", "_into_tensor", "_tensor", "_single"):
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


# Where an allgather that records only its input shard finds the group size: this event arg
# ("Group size"), or an input index (a Concrete Input); None: the op records the full output.
_GROUP_FROM_ATTRS: Literal["attrs"] = "attrs"
GroupSizeFrom = int | Literal["attrs"] | None


def _group_size(source: int | Literal["attrs"], inp: OpInputs) -> int:
    """The group size an allgather's shard is multiplied by; Insufficient when not recorded."""
    group = inp.concrete(source) if isinstance(source, int) else inp.attrs.get("Group size")
    if type(group) is not int or group < 1:
        raise Insufficient
    return group


def _collective(kind: str | None, group_size_from: GroupSizeFrom, inp: OpInputs) -> Work:
    """Message size (nccl-tests "size") of one collective; FLOPs 0.

    The largest tensor argument (a TensorList summed) is the message: it is the full buffer of
    allreduce/broadcast, the gathered output of allgather (c10d ops list their outputs), the
    scattered input of reducescatter. Ops that show only an allgather's input shard multiply it by
    the group size (a Concrete Input or the "Group size" arg), or give None without one.
    """
    attrs = inp.attrs
    kind = kind or collective_kind("record_param_comms", attrs)
    need(kind is not None)
    dtype = normalize_dtype(attrs.get("dtype")) or inp.compute_dtype()
    counts = [v for v in (attrs.get(key) for key in ("In msg nelems", "Out msg nelems")) if type(v) is int and v >= 0]
    if counts:  # record_param_comms: element counts of both buffers
        return Work(0, (), read_bytes=max(counts) * DTYPE_SIZE.get(dtype or "", math.nan), dtype=dtype)
    sizes = [(inp.numel(i) or 0) * inp.elem_size(i) for i in range(inp.n) if inp.shapes(i)]
    need(sizes)
    message = max(sizes)
    if kind == "allgather" and group_size_from is not None:
        message *= _group_size(group_size_from, inp)
    return Work(0, (), read_bytes=message, dtype=dtype)


_COLLECTIVES: tuple[tuple[tuple[str, ...], str | None, GroupSizeFrom], ...] = (
    # (ops, kind (None: from the "Collective name" arg), where an allgather's group size is)
    (("record_param_comms",), None, _GROUP_FROM_ATTRS),
    (("c10d::allreduce_", "c10d::allreduce_coalesced_"), "allreduce", None),
    (
        (
            "c10d::allgather_",
            "c10d::_allgather_base_",
            "c10d::allgather_coalesced_",
            "c10d::allgather_into_tensor_coalesced_",
        ),
        "allgather",
        None,
    ),
    (
        ("c10d::reduce_scatter_", "c10d::_reduce_scatter_base_", "c10d::reduce_scatter_tensor_coalesced_"),
        "reducescatter",
        None,
    ),
    (("c10d::broadcast_",), "broadcast", None),
    (("c10d::reduce_",), "reduce", None),
    (("c10d::alltoall_", "c10d::alltoall_base_"), "alltoall", None),
    (("c10d::send", "c10d::recv_", "c10d::recv_any_source_"), "sendrecv", None),
    (
        (
            "_c10d_functional::all_reduce",
            "_c10d_functional::all_reduce_",
            "_c10d_functional::all_reduce_coalesced",
            "_c10d_functional::all_reduce_coalesced_",
        ),
        "allreduce",
        None,
    ),
    (
        ("_c10d_functional::all_gather_into_tensor", "_c10d_functional::all_gather_into_tensor_coalesced"),
        "allgather",
        1,
    ),
    (
        ("_c10d_functional::reduce_scatter_tensor", "_c10d_functional::reduce_scatter_tensor_coalesced"),
        "reducescatter",
        None,
    ),
    (("_c10d_functional::all_to_all_single",), "alltoall", None),
    (("_c10d_functional::broadcast", "_c10d_functional::broadcast_"), "broadcast", None),
) + tuple(
    # record_function ranges of ProcessGroupNCCL / ProcessGroupGloo: they record the input tensors
    (tuple(f"{backend}:{op}" for backend in ("nccl", "gloo") for op in ops), kind, _GROUP_FROM_ATTRS)
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
for _names, _kind, _group in _COLLECTIVES:
    register(
        Formula(
            _names,
            "collective",
            "0",
            "message size = nccl-tests size: max tensor argument × dtype size ("
            "record_param_comms: max(In, Out msg nelems)); an allgather shard × group size",
            partial(_collective, _kind, _group),
        )
    )
