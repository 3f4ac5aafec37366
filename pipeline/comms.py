"""comms: the vocabulary of collective communication in a trace, as data, in one place that
imports nothing heavy (no polars, no Arrow): which GPU kernels are collectives
(`cost.comm_kernels`), which CPU events around a launch say what a collective is
(`cost.formulas.messages`), which args name its process group, and the kind a kernel's name says.

Both readers of collectives use these tables: `runs.collectives` (polars, over a flattened trace)
and `runs.scan` (one streaming pass over a trace file, for `tracepipe ranks RUN_DIR`). The regexes
are written so that Python's `re` and polars (Rust regex) read them alike.
"""

from __future__ import annotations

from pipeline.cost.comm_kernels import COLLECTIVE_KERNEL, COMM_KERNEL
from pipeline.cost.formulas.messages import COMM_EVENTS, HCCL_OP_KIND

NCCL_KERNEL = COLLECTIVE_KERNEL  # the kernels matched across ranks (comm_kernels: NCCL, RCCL)
COMM_OP = COMM_EVENTS  # the CPU events around a launch that say what a collective is (messages.SIZE_SOURCES)
# gloo's work: annotations on the pt_gloo_runloop threads (tests/data/runs/gloo4)
GLOO_WORK = r"^gloo:"
RUNLOOP_THREAD = "pt_gloo_runloop"
# kernel name -> kind, for kernels whose args and CPU ops say nothing (older layouts), in order
KERNEL_KINDS = (
    ("AllReduce", "allreduce"),
    ("AllGather", "allgather"),
    ("ReduceScatter", "reducescatter"),
    ("AllToAll", "alltoall"),
    ("Broadcast", "broadcast"),
    ("SendRecv", "sendrecv"),
    ("Send", "sendrecv"),
    ("Recv", "sendrecv"),
    ("Reduce", "reduce"),
)
KERNEL_KIND_PATTERN = r"(?:^|_|\s){}(?:_|\(|$)"  # a KERNEL_KINDS word as a whole part of the name
# column -> the arg (of a kernel, or of the events around its launch) that names its group
ARG_KEYS = {
    "collective": "Collective name",
    "pg_name": "Process Group Name",
    "pg_desc": "Process Group Description",
    "pg_ranks": "Process Group Ranks",
}
PG_KEYS = list(ARG_KEYS)
RANK_IN_LIST = r"-?\d+"  # a rank of `Process Group Ranks` ("[0, 1, 2, 3]"): a group's size counts them

# HCCL (Ascend NPUs): torch_npu's trace_view.json writes each collective on a lane of its `HCCL`
# process named `Group <group> Communication` (msprof hccl_assembler.cpp: `Communication` alone when
# the group has no name), as a complete event without a cat named `hcom_<kind>_<...>`, its args
# `count` (elements) and `data_type` (FP32, BFP16, ...); at Level1 and above the collective's tasks
# follow on the group's `Plane <n>` lanes, their args `src rank`, `dst rank`, `size(Byte)`,
# `transport type` (SDMA, RDMA, LOCAL), `link type` (HCCS, PCIE, ROCE, SIO, ...). Both are told by
# their args (an event is read without its process's name, which may come after it).
HCCL_OP_ARGS = ("count", "data_type")  # a collective on a group's lane: it holds both
HCCL_TASK_ARGS = ("src rank", "dst rank")  # a task of a collective's planes: it holds both
HCCL_TASK_SIZE, HCCL_TASK_LINK = "size(Byte)", "link type"
HCCL_GROUP_LANE = r"^(?:Group (.+) )?Communication$"  # the lane's thread name -> the group's name

__all__ = [
    "ARG_KEYS",
    "COMM_KERNEL",
    "COMM_OP",
    "GLOO_WORK",
    "HCCL_GROUP_LANE",
    "HCCL_OP_ARGS",
    "HCCL_OP_KIND",
    "HCCL_TASK_ARGS",
    "HCCL_TASK_LINK",
    "HCCL_TASK_SIZE",
    "KERNEL_KINDS",
    "KERNEL_KIND_PATTERN",
    "NCCL_KERNEL",
    "PG_KEYS",
    "RANK_IN_LIST",
    "RUNLOOP_THREAD",
]
