"""comm_kernels: which GPU kernels are communication, library by library (a declarative table).

Each `CommLibrary` names its kernels by a regex on the kernel name as a trace writes it (CUPTI /
roctracer demangle templates: ``void deep_ep::internode::dispatch<...>(...)``) and says where the
names were found. Kernels of any library get the category `communication` (`COMM_KERNEL`, read by
`categories`), so they count as communication in the breakdowns, in `communication`'s exposed
time and in `ranks`' per-step exposed communication.

`matched` says which are also *collectives* that `ranks` matches across ranks (`COLLECTIVE_KERNEL`):
a call of a process group (NCCL, RCCL) is the i-th of its group on every rank, and its launch
sits inside the `record_param_comms` / `nccl:*` / `c10d::*` events that name the group and the
message. The other libraries launch their kernels outside any process group's sequence (a DeepEP
dispatch is an all-to-all-like exchange whose peers and token counts are decided on the GPU; a
custom all-reduce runs on the compute stream of its own IPC-buffer communicator), so nothing in
a trace says which call on one rank is which on another: they count as communication time only.

Patterns anchor at the function name (a parameter type such as ``ncclDevComm_t`` in a DeepEP
kernel's signature must not make it an NCCL collective; ``cdpsk::ep::`` CUB scans are not DeepEP).
Names are matched as traces write them (the categories see raw names): the un-namespaced ones also
in their Itanium-mangled form, the namespaced ones (DeepEP, MSCCL++) only demangled, as CUPTI and
roctracer write kernels launched the usual way.
"""

from __future__ import annotations

from dataclasses import dataclass

# Where a function name may start: the name's start, after `::`, a space or `(`, or after the
# length digits of an Itanium-mangled name (`_ZN4vllm26cross_device_reduce_1stage...`, which
# the category table sees raw).
_START = r"(?:^|[^A-Za-z_])"


@dataclass(frozen=True)
class CommLibrary:
    """One communication library: its kernels (`kernel`, a regex on the kernel name), whether
    `ranks` matches them across ranks as collectives, the source of the names, and whether the
    library issues them itself inside a collective (`own_tasks`: no launch call precedes them, so
    a missing launch does not mean they were queued before profiling)."""

    name: str
    kernel: str
    matched: bool
    source: str
    own_tasks: bool = False  # the library puts these tasks on the device itself: no launch of their own


LIBRARIES: tuple[CommLibrary, ...] = (
    CommLibrary(
        "NCCL",
        r"(?i)^(?:void\s+)?nccl\w*",
        True,
        "hta/a100_nccl (`ncclKernel_AllReduce_RING_LL_Sum_float`, NCCL 2.17), tracelens/b200_eager "
        "(`ncclDevKernel_AllGather_RING_LL`, NCCL 2.27); NCCL >= 2.19 names most `ncclDevKernel_Generic`",
    ),
    CommLibrary(
        "RCCL",
        r"(?i)^(?:void\s+)?(?:rccl\w*|mscclKernel_\w+)",
        True,
        "ROCm/rccl: NCCL's kernel names (`ncclDevKernel_Generic_1`) and its MSCCL executor's "
        "`mscclKernel_Sum_hip_bfloat16_Simple_false` (src/include/msccl/msccl_kernel.h), as MI300X "
        "vLLM/SGLang traces write them",
    ),
    CommLibrary(
        "DeepEP",
        r"\b(?:deep_ep|dpsk::ep)::(?:legacy::)?(?:intranode|internode|internode_ll)::"
        r"(?:\w*notify\w*|dispatch\w*|combine\w*|barrier|clean_\w+|\w+_mask_buffer)\b"
        r"|\bdeep_ep::elastic::\w+_impl\b",
        False,
        "deepseek-ai/DeepEP csrc/kernels/{intranode,internode,internode_ll}.cu (`deep_ep::internode::"
        "dispatch`, `notify_dispatch`, `cached_notify`, `combine`, `internode_ll::dispatch`), EPv2 "
        "deep_ep/include/deep_ep/impls (`deep_ep::elastic::dispatch_impl`, `hybrid_combine_impl`); "
        "deepseek-ai/profile-data H800 traces (`dpsk::ep::internode::dispatch`, `dispatch_ll`, "
        "`combine_ll`). `get_dispatch_layout` counts tokens locally: not communication",
    ),
    CommLibrary(
        "NVSHMEM",
        _START + r"(?:barrier|sync|sync_all|alltoall|broadcast|fcollect|rdxn)_on_stream_kernel\w*",
        False,
        "NVIDIA NVSHMEM nvshmemi_h_to_d_coll_defs.cuh: the `*_on_stream_kernel` collectives "
        "(`barrier_on_stream_kernel_threadgroup`, `alltoall_on_stream_kernel`, `rdxn_on_stream_kernel`)",
    ),
    CommLibrary(
        "MSCCL++",
        r"(?i)\bmscclpp::\w*(?:all_?reduce|all_?gather|reduce_?scatter|all_?to_?all|executionkernel)"
        r"|\b(?:sglang::)?allreduce_1shotLL_\dnode\b",
        False,
        "microsoft/mscclpp src/ext/collectives (`mscclpp::allreduceFullmesh`, `allreduceNvls`, "
        "`allgatherFullmesh`), src/core/include/execution_kernel.hpp (`mscclpp::executionKernel`); "
        "sgl-project/sglang sgl-kernel/csrc/allreduce/mscclpp_allreduce.cuh (`allreduce_1shotLL_1node`)",
    ),
    CommLibrary(
        "custom all-reduce (vLLM, SGLang, aiter)",
        _START + r"cross_device_reduce_\w+",
        False,
        "vllm-project/vllm csrc/custom_all_reduce.cuh (`vllm::cross_device_reduce_1stage`, `_2stage`, "
        "`_half_butterfly`), sgl-project/sglang sgl-kernel/csrc/allreduce/custom_all_reduce.cuh, ROCm "
        "aiter (`aiter::cross_device_reduce_2stage<bf16,8,false>` in MI300X traces)",
    ),
    CommLibrary(
        "quick all-reduce (vLLM, SGLang on ROCm)",
        r"\bquickreduce::allreduce_prototype_\w+",
        False,
        "vllm-project/vllm csrc/quickreduce/quick_reduce.h (`quickreduce::allreduce_prototype_twoshot`), "
        "sgl-project/sglang sgl-kernel/csrc/allreduce/quick_all_reduce.h",
    ),
    CommLibrary(
        "TensorRT-LLM / FlashInfer all-reduce",
        _START + r"(?:(?:one|two)ShotAllReduceKernel|allreduce_fusion_kernel_\w+)",
        False,
        "NVIDIA/TensorRT-LLM cpp/tensorrt_llm/kernels/customAllReduceKernels.cu (`oneShotAllReduceKernel`, "
        "`twoShotAllReduceKernel`), allReduceFusionKernels.cu (`allreduce_fusion_kernel_oneshot_lamport`); "
        "the same kernels in FlashInfer's trtllm_allreduce and SGLang's trt_reduce_internal.cu",
    ),
    CommLibrary(
        "PyTorch symmetric memory",
        _START + r"(?:multimem_\w*|one_shot_all_reduce\w*|two_shot_all_reduce\w*)_kernel",
        False,
        "tracelens/b200_eager (vLLM on B200: `(anonymous namespace)::multimem_all_reduce_kernel<c10::"
        "BFloat16, 16>` under `symm_mem::multimem_all_reduce_`); pytorch torch/csrc/distributed/c10d/"
        "symm_mem/CUDASymmetricMemoryOps.cu (`one_shot_all_reduce_kernel`, `two_shot_all_reduce_kernel`)",
    ),
    CommLibrary(
        "HCCL (Ascend)",
        r"^(?:Notify[ _]?(?:Wait|Record)|Write[ _]?Value|SDMA|RDMA\w*|Reduce[ _]?(?:Inline|TBE)|Inline[ _]?Reduce"
        r"|Local[ _]?Copy|Memcpy|hcom_\w+|HcclAll\w+)$",
        False,
        "torch_npu traces (ascend/npu_level0_rank0): the tasks HCCL puts on the `Ascend Hardware` streams, "
        "named by their task type (`Notify Wait`, `Write Value`, `SDMA`; `Notify_Wait`, `Memcpy`, "
        "`Reduce_Inline`, `RDMASend` on the `Plane N` lanes at Level1, msprof hccl_assembler.cpp). The "
        "collectives themselves (`hcom_allReduce_*` on the HCCL process's `Group N Communication` lane) "
        "are matched across ranks from there (`runs.collectives`), not from these tasks",
        own_tasks=True,
    ),
    CommLibrary(
        "other collective names",
        r"(?i)all_?reduce|all_?gather|reduce_?scatter|all_?to_?all|sendrecv",
        False,
        "kernels of libraries not listed that say what they do, such as MSCCL++'s benchmark kernels "
        "`allreduce1`..`allreduce6` (microsoft/mscclpp python/mscclpp_benchmark/allreduce.cu)",
    ),
)


def _union(patterns: list[str]) -> str:
    # each pattern keeps its own flags: (?i) at the start of one becomes a scoped group
    parts = [f"(?i:{p[4:]})" if p.startswith("(?i)") else f"(?:{p})" for p in patterns]
    return "|".join(parts)


COMM_KERNEL = _union([lib.kernel for lib in LIBRARIES])
"""A kernel of any communication library (category `communication`)."""
COLLECTIVE_KERNEL = _union([lib.kernel for lib in LIBRARIES if lib.matched])
"""A kernel of a process group's collective, matched across ranks by `ranks`."""
OWN_TASK = _union([lib.kernel for lib in LIBRARIES if lib.own_tasks])
"""A task a communication library issues itself (no launch of its own: `coverage`'s library_task)."""


def libraries_markdown() -> str:
    """The documentation's table of `LIBRARIES` (scripts/gen_docs.py)."""
    rows = [
        "| library | kernels (regex on the name) | matched across ranks | where the names come from |",
        "|---|---|---|---|",
    ]
    for lib in LIBRARIES:
        cells = (lib.name, f"`{lib.kernel}`", "yes" if lib.matched else "no: communication time only", lib.source)
        rows.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
    return "\n".join(rows)


def library_of(kernel_name: str) -> str | None:
    """The first library whose kernels `kernel_name` is one of, else None (the README table, tests)."""
    import re

    for lib in LIBRARIES:
        if re.search(lib.kernel, kernel_name):
            return lib.name
    return None
