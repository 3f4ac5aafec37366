"""messages: how big a collective's message is (nccl-tests' "size") and where a trace says so.

One rule for the two places that need it: the `collectives` table (`pipeline.runs.collectives`: a
collective kernel's size from its own args and from the CPU events around its launch) and the cost
formulas of the communication ops (`collectives.py` here: an op's size from its own args).

`SIZE_SOURCES` lists, in the order they are trusted, where a trace writes the size: each entry
reads a `Message` (element counts of the input and the output buffer, dtype, group size) from one
event and names the layout that taught it. A collective's counts come from the first source that
has them, its dtype from the first that has one. `SIZE_RULE` says which count is the message of
each kind, as nccl-tests reports it: the buffer of allreduce, broadcast and reduce; the gathered
output of allgather; the input of reducescatter; the whole send buffer of alltoall (uneven
splits included). A count known only per rank (an allgather's input shard) is multiplied by the
group size.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from .dtypes import DTYPE_SIZE, normalize_dtype
from .inputs import OpInputs


@dataclass(frozen=True)
class Message:
    """What one event says about a collective's buffers (None: not said)."""

    in_nelems: int | None = None
    out_nelems: int | None = None
    dtype: str | None = None  # normalised: fp32, bf16, ...
    group_size: int | None = None

    @property
    def has_counts(self) -> bool:
        return self.in_nelems is not None or self.out_nelems is not None


Reader = Callable[[str, Mapping[str, Any]], Message | None]


@dataclass(frozen=True)
class Reading:
    """How a source reads one event: `fn(name, args)`, which looks at the event args named `args`
    only (so a caller may read each distinct combination of them once)."""

    args: tuple[str, ...]
    fn: Reader

    def __call__(self, name: str, args: Mapping[str, Any]) -> Message | None:
        return self.fn(name, args)


# The args torch writes on record_param_comms (2.1+) and on NCCL kernels (2.3+): column -> arg.
MSG_ARGS = {"in_nelems": "In msg nelems", "out_nelems": "Out msg nelems", "dtype": "dtype", "group_size": "Group size"}


def _count(v: Any) -> int | None:
    return v if type(v) is int and v >= 0 else None


def read_msg_args(name: str, args: Mapping[str, Any]) -> Message | None:
    """`In msg nelems`, `Out msg nelems`, `dtype` (a c10::ScalarType name: `Float`, `BFloat16`),
    `Group size`."""
    m = Message(
        _count(args.get(MSG_ARGS["in_nelems"])),
        _count(args.get(MSG_ARGS["out_nelems"])),
        normalize_dtype(args.get(MSG_ARGS["dtype"])),
        _count(args.get(MSG_ARGS["group_size"])) or None,
    )
    return m if m.has_counts or m.dtype else None


def read_inputs(name: str, args: Mapping[str, Any]) -> Message | None:
    """`Input Dims` x `Input type` of the tensors the event records as its inputs, summed (a
    TensorList's tensors, the tensors of a coalesced call); unknown when a TensorList's shapes
    were not recorded (torch 2.0 writes `[]`)."""
    inp = OpInputs.from_args(args)
    total, dtype, tensors = 0, None, 0
    for i in range(inp.n):
        if inp.shapes(i):
            tensors += 1
            total += inp.numel(i) or 0
            dtype = dtype or inp.dtype(i)
        elif inp.types and inp.types[i].strip().lower() == "tensorlist":
            return None
    group = _count(args.get(MSG_ARGS["group_size"])) or None
    return Message(in_nelems=total, dtype=dtype, group_size=group) if tensors else None


def read_record_param_comms(name: str, args: Mapping[str, Any]) -> Message | None:
    """Its msg args (torch 2.1+), else the input tensors it records first (torch 2.0: `Input Dims`
    [[6144], [], ...], the other inputs scalars)."""
    return read_msg_args(name, args) or read_inputs(name, args)


# Where a c10d op's buffers are among its arguments: op -> (input index, output index, index of
# the group size among its Concrete Inputs). The ops' schemas (torch/csrc/distributed/c10d/Ops.cpp,
# _c10d_functional), as Kineto records them: tests/data/runs/gloo4 `c10d::allgather_` Input Dims
# [[], [[1]], ...] (output lists, input), runs/dlrm8_v100 `c10d::alltoall_base_` [[768], [3392], ...]
# (output, input: uneven splits).
OP_ARGS: dict[str, tuple[int | None, int | None, int | None]] = {
    "c10d::allreduce_": (0, None, None),
    "c10d::allreduce_coalesced_": (0, None, None),
    "c10d::allgather_": (1, 0, None),
    "c10d::_allgather_base_": (1, 0, None),
    "c10d::allgather_coalesced_": (1, 0, None),
    "c10d::allgather_into_tensor_coalesced_": (1, 0, None),
    "c10d::reduce_scatter_": (1, 0, None),
    "c10d::_reduce_scatter_base_": (1, 0, None),
    "c10d::reduce_scatter_tensor_coalesced_": (1, 0, None),
    "c10d::alltoall_": (1, 0, None),
    "c10d::alltoall_base_": (1, 0, None),
    "c10d::broadcast_": (0, None, None),
    "c10d::reduce_": (0, None, None),
    "c10d::gather_": (1, 0, None),
    "c10d::scatter_": (1, 0, None),
    "c10d::send": (0, None, None),
    "c10d::recv_": (0, None, None),
    "c10d::recv_any_source_": (0, None, None),
    "_c10d_functional::all_reduce": (0, None, None),
    "_c10d_functional::all_reduce_": (0, None, None),
    "_c10d_functional::all_reduce_coalesced": (0, None, None),
    "_c10d_functional::all_reduce_coalesced_": (0, None, None),
    "_c10d_functional::all_gather_into_tensor": (0, None, 1),
    "_c10d_functional::all_gather_into_tensor_out": (0, None, 1),
    "_c10d_functional::all_gather_into_tensor_coalesced": (0, None, 1),
    "_c10d_functional::reduce_scatter_tensor": (0, None, 2),
    "_c10d_functional::reduce_scatter_tensor_coalesced": (0, None, 2),
    "_c10d_functional::all_to_all_single": (0, None, None),
    "_c10d_functional::broadcast": (0, None, None),
    "_c10d_functional::broadcast_": (0, None, None),
}


def read_op_args(name: str, args: Mapping[str, Any]) -> Message | None:
    """A c10d op's input and output buffers at their places among its arguments (`OP_ARGS`)."""
    where = OP_ARGS.get(name)
    if where is None:
        return None
    inp = OpInputs.from_args(args)
    i_in, i_out, i_group = where
    counts = [inp.numel(i) if i is not None else None for i in (i_in, i_out)]
    dtype = next((d for d in (inp.dtype(i) for i in (i_in, i_out) if i is not None) if d), None)
    group = inp.concrete(i_group) if i_group is not None else None
    m = Message(counts[0], counts[1], dtype, group if type(group) is int and group > 0 else None)
    return m if m.has_counts else None


# NCCL kernels of reductions name their element type (ncclKernel_AllReduce_RING_LL_Sum_float,
# ncclDevKernel_ReduceScatter_Sum_bf16_RING_LL); type-agnostic ones (SendRecv, Broadcast,
# AllGather) are named int8_t whatever they move, so their names say nothing.
_REDUCTION_KERNEL = re.compile(r"(?:^|_)(?:AllReduce|ReduceScatter|Reduce)_")
_NAME_DTYPE = re.compile(
    r"_(float|half|double|bf16|f16|f32|f64|i8|u8|i32|u32|i64|u64|int8_t|uint8_t|int32_t|"
    r"uint32_t|int64_t|uint64_t|bfloat16|__nv_bfloat16|fp8_e4m3|fp8_e5m2)(?=_|\(|$)"
)
_NAME_DTYPES = {"f16": "fp16", "f32": "fp32", "f64": "fp64", "i8": "int8", "u8": "uint8", "i32": "int32",
                "u32": "uint32", "i64": "int64", "u64": "uint64", "int8_t": "int8", "uint8_t": "uint8",
                "int32_t": "int32", "uint32_t": "uint32", "int64_t": "int64", "uint64_t": "uint64",
                "__nv_bfloat16": "bf16", "fp8_e4m3": "fp8", "fp8_e5m2": "fp8"}  # fmt: skip


def read_kernel_name(name: str, args: Mapping[str, Any]) -> Message | None:
    """The element type a reduction kernel's name says (a dtype, no counts)."""
    if not _REDUCTION_KERNEL.search(name):
        return None
    found = _NAME_DTYPE.search(name.split("(")[0])
    if found is None:
        return None
    token = found.group(1)
    dtype = _NAME_DTYPES.get(token) or normalize_dtype(token)
    return Message(dtype=dtype) if dtype else None


def read_hccl_op(name: str, args: Mapping[str, Any]) -> Message | None:
    """An HCCL collective's `count` elements of `data_type` (torch_npu's HCCL lane: `comms.HCCL_OP_ARGS`).
    `count` is the buffer of allreduce, broadcast and reduce, a rank's send buffer of allgather
    (HcclAllGather's sendCount) and its receive buffer of reducescatter (recvCount)."""
    count = _count(args.get("count"))
    if count is None:
        return None
    kind = re.match(HCCL_OP_KIND, name)
    scatter = kind is not None and kind.group(1).lower().startswith("reducescatter")
    dtype = normalize_dtype(args.get("data_type"))
    return Message(None, count, dtype) if scatter else Message(count, None, dtype)


HCCL_OP_KIND = r"^hcom_([A-Za-z]+)"  # an HCCL collective's name says its kind: hcom_allReduce__868_0_1


@dataclass(frozen=True)
class SizeSource:
    """Where a trace writes a collective's size: `on` the collective kernel itself, on a CPU
    event (`events`, a regex on its name) around the kernel's launch on the launching thread, or
    (`coalesced`) on the calls recorded since the thread's previous collective launch."""

    name: str
    on: Literal["kernel", "launch", "coalesced"]
    events: str
    read: Reading
    taught_by: str


_DIMS = ("Input Dims", "Input type")
MSG = Reading(tuple(MSG_ARGS.values()), read_msg_args)
INPUTS = Reading((*_DIMS, MSG_ARGS["group_size"]), read_inputs)
RECORD_PARAM_COMMS = Reading((*MSG_ARGS.values(), *_DIMS), read_record_param_comms)
OP_ARGUMENTS = Reading((*_DIMS, "Concrete Inputs"), read_op_args)
KERNEL_NAME = Reading((), read_kernel_name)
HCCL_OP = Reading(("count", "data_type"), read_hccl_op)


SIZE_SOURCES: tuple[SizeSource, ...] = (
    SizeSource(
        "the kernel's args",
        "kernel",
        "",
        MSG,
        "hta/a100_nccl (torch 2.3, NCCL 2.17): `In msg nelems` 6637568, `Out msg nelems`, `dtype` Float, "
        "`Group size` 2 on `ncclKernel_AllReduce_RING_LL_Sum_float`; tracelens/b200_eager: `_allgather_base` "
        "In 25136, Out 201088",
    ),
    SizeSource(
        "the nccl:/gloo: annotation",
        "launch",
        r"^(?:nccl|rccl|gloo):",
        INPUTS,
        "runs/dlrm8_v100 (torch 2.0, 8x V100): `nccl:all_reduce` Input Dims [[394241]] x Input type float "
        "around the launch; `nccl:all_to_all` [[3392]] int (the send buffer); tests/data/runs/gloo4 (torch "
        "2.13): `gloo:all_reduce` [[2632]] float",
    ),
    SizeSource(
        "record_param_comms",
        "launch",
        r"^record_param_comms$",
        RECORD_PARAM_COMMS,
        "hta/a100_nccl (torch 2.3): In/Out msg nelems, dtype; runs/dlrm8_v100 (torch 2.0): only Input Dims "
        "[[6144], [], ...] of its input tensor, a TensorList as []",
    ),
    SizeSource(
        "the c10d op",
        "launch",
        r"^(?:c10d::|_c10d_functional::)",
        OP_ARGUMENTS,
        "runs/dlrm8_v100: `c10d::alltoall_base_` [[768], [3392], ...] (output, input); tests/data/runs/gloo4: "
        "`c10d::allreduce_` [[[2632]], ...] (a TensorList, no dtype)",
    ),
    SizeSource(
        "the coalesced calls",
        "coalesced",
        r"^(?:nccl|rccl):coalesced$",
        RECORD_PARAM_COMMS,
        "torch's ProcessGroupNCCL::endCoalescing launches a coalesced group's kernel inside `nccl:coalesced`, "
        "which records nothing (mlcommons/chakra#178, pytorch/pytorch#194693): the sum of the "
        "`record_param_comms` recorded on the thread since its previous collective launch, one per call",
    ),
    SizeSource(
        "the kernel's name",
        "kernel",
        "",
        KERNEL_NAME,
        "hta/a100_nccl: `ncclKernel_AllReduce_RING_LL_Sum_float` (the dtype of a reduction only: "
        "`ncclKernel_Broadcast_RING_LL_Sum_int8_t` moved Long)",
    ),
)

# An HCCL collective's size: its own args on the HCCL lane (`runs.collectives`' HCCL source)
HCCL_SIZE = SizeSource(
    "the HCCL op's count",
    "kernel",
    "",
    HCCL_OP,
    "ascend/npu_level0_rank0 (torch_npu, Level0): `hcom_allReduce__868_0_1` count 4097000, data_type FP32 "
    "(16388000 bytes, as the job's own communication.json and kernel_details.csv give them)",
)

# The events the CPU-side sources read (the `collectives` table reads these around launches), and
# the args they look at.
COMM_EVENTS = "|".join(f"(?:{s.events})" for s in SIZE_SOURCES if s.on == "launch")
COMM_EVENT_ARGS = tuple(dict.fromkeys(a for s in SIZE_SOURCES if s.on == "launch" for a in s.read.args))


def op_message(name: str, args: Any) -> Message | None:
    """What a communication CPU event (`nccl:all_reduce`, `record_param_comms`, `c10d::allreduce_`)
    says about its collective's buffers: the first CPU-side source that reads it."""
    if not isinstance(args, Mapping):
        return None
    for source in SIZE_SOURCES:
        if source.on == "launch" and re.search(source.events, name):
            return source.read(name, args)
    return None


_ON = {
    "kernel": "the collective kernel",
    "launch": "around the kernel's launch",
    "coalesced": "on the launching thread since its previous collective launch",
}


def sources_markdown() -> str:
    """The documentation's table of `SIZE_SOURCES` (scripts/gen_docs.py)."""
    rows = ["| # | source | read on | events | what it reads | taught by |", "|---|---|---|---|---|---|"]
    for i, s in enumerate(SIZE_SOURCES, 1):
        reads = " ".join((s.read.fn.__doc__ or "").split())
        cells = (str(i), s.name, _ON[s.on], f"`{s.events}`" if s.events else "", reads, s.taught_by)
        rows.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
    return "\n".join(rows)


# kind -> the counts that give nccl-tests' size, the first known wins: (count, x group size)
SizeRule = tuple[tuple[Literal["in", "out"], bool], ...]
SIZE_RULE: dict[str, SizeRule] = {
    "allgather": (("out", False), ("in", True)),
    "reducescatter": (("in", False), ("out", True)),
    "alltoall": (("in", False), ("out", False)),
    "barrier": (),  # no message
}
DEFAULT_SIZE_RULE: SizeRule = (("in", False), ("out", False))
# Kinds whose message may differ between the ranks of one call: an alltoall with uneven splits
# (`alltoall_base` with split sizes, all_to_all_single) sends each rank's own buffer.
SIZE_PER_RANK = frozenset({"alltoall"})


def message_nelems(kind: str | None, m: Message, group_size: int | None = None) -> int | None:
    """nccl-tests' size of a collective of `kind` in elements (`SIZE_RULE`), None when unknown."""
    group = m.group_size or group_size
    for count, per_rank in SIZE_RULE.get(kind or "", DEFAULT_SIZE_RULE):
        n = m.in_nelems if count == "in" else m.out_nelems
        if n is not None and not per_rank:
            return n
        if n is not None and group:
            return n * group
    return None


def message_bytes(kind: str | None, m: Message, group_size: int | None = None) -> float | None:
    """nccl-tests' size in bytes (NaN when the count is known but not the dtype; None: unknown)."""
    n = message_nelems(kind, m, group_size)
    if n is None:
        return None
    return float(n * DTYPE_SIZE[m.dtype]) if m.dtype in DTYPE_SIZE else math.nan
