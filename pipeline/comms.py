"""comms: the vocabulary of collective communication in a trace, as data, in one place that
imports nothing heavy: which GPU kernels are collectives, which CPU ops and annotations describe
them, which args say what, and the kind a kernel's name says.

Both readers of collectives use these tables: `runs.collectives` (polars, over a flattened trace)
and `runs.scan` (one streaming pass over a trace file, for `tracepipe ranks RUN_DIR`). The regexes
are written so that Python's `re` and polars (Rust regex) read them alike.
"""

from __future__ import annotations

# the GPU kernels of collective libraries (a100_nccl: ncclKernel_*, ncclDevKernel_*; MI300X: rccl)
NCCL_KERNEL = r"(?i)nccl|rccl"
# the kernels whose time is communication (the `communication` category of `cost.categories`)
COMM_KERNEL = r"(?i)nccl|rccl|all_?reduce|all_?gather|reduce_?scatter|all_?to_?all|sendrecv|cross_device_reduce"
# CPU ops around a collective kernel's launch that name its kind or carry its args
COMM_OP = r"^(?:c10d::|_c10d_functional::|nccl:|rccl:|record_param_comms$)"
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
# column -> the arg (of a kernel, or of record_param_comms) that holds it
ARG_KEYS = {
    "collective": "Collective name",
    "in_nelems": "In msg nelems",
    "out_nelems": "Out msg nelems",
    "group_size": "Group size",
    "dtype_text": "dtype",
    "pg_name": "Process Group Name",
    "pg_desc": "Process Group Description",
    "pg_ranks": "Process Group Ranks",
}
INT_ARGS = ("in_nelems", "out_nelems", "group_size")
