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
from pipeline.cost.formulas.messages import COMM_EVENTS

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

__all__ = [
    "ARG_KEYS",
    "COMM_KERNEL",
    "COMM_OP",
    "GLOO_WORK",
    "KERNEL_KINDS",
    "KERNEL_KIND_PATTERN",
    "NCCL_KERNEL",
    "PG_KEYS",
    "RANK_IN_LIST",
    "RUNLOOP_THREAD",
]
