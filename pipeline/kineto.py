"""kineto: the vocabulary of Kineto / Chrome-trace JSON that every stage reads, in one place.

Category names as profilers write them (old layouts capitalise some: `Kernel`, `Runtime`), what
kind of activity each names, the flows that link a launch to its GPU activity, and the names of
the annotations tracepipe understands (`ProfilerStep#N`, `nn.Module: X`, compiled regions).
"""

from __future__ import annotations

import os

# cat -> kind of GPU/accelerator activity (case as written; old layouts capitalise)
GPU_KINDS = {
    "kernel": "kernel",
    "Kernel": "kernel",
    "gpu_memcpy": "memcpy",
    "Memcpy": "memcpy",
    "memcpy": "memcpy",
    "gpu_memset": "memset",
    "Memset": "memset",
    "memset": "memset",
    "mtia_ccp_events": "kernel",
}
ACTIVITY_KINDS = ("kernel", "memcpy", "memset")  # the `kind`s of gpu_ops
FLOW_PHASES = frozenset(("s", "f", "t"))

# CPU slices, by what they are (matched case-insensitively)
LAUNCH_CATS = (
    "cuda_runtime",
    "cuda_driver",
    "runtime",
    "driver",
    "hip_runtime",
    "hip_driver",
    "mtia_runtime",
    "xpu_runtime",
    "privateuse1_runtime",
)
CPU_OP_CATS = ("cpu_op", "operator")
ANNOTATION_CATS = ("user_annotation",)
MODULE_CATS = ("python_function",)
LINK_FLOW_CATS = ("ac2g", "async_cpu_to_gpu", "async_gpu")  # launch -> GPU activity flows


def cat_regex(*cats: str) -> str:
    """A case-insensitive regex matching exactly one of the categories."""
    return "(?i)^(" + "|".join(cats) + ")$"


LAUNCH_CAT, CPU_OP_CAT, ANNOTATION_CAT = cat_regex(*LAUNCH_CATS), cat_regex(*CPU_OP_CATS), cat_regex(*ANNOTATION_CATS)
OP_CAT = cat_regex(*CPU_OP_CATS, *ANNOTATION_CATS)  # cpu ops and user annotations (ProfilerStep#N, ...)
FRAME_CAT = cat_regex(*CPU_OP_CATS, *ANNOTATION_CATS, *MODULE_CATS)  # what a stack is made of

# CUDA / HIP graphs (runtime and driver call names, any version suffix): a graph launch replays the
# kernels captured between a thread's Begin- and EndCapture (see pipeline/link/graphs.py). Taught by
# tracelens/mi300x_vllm_graph_{replay,capture} (hipGraphLaunch; hipStreamBeginCapture with
# hip(Ext)(Module)LaunchKernel carrying `kernel`, `grid`, `block` in its args); the CUDA names are
# the same calls of the CUDA runtime and driver APIs (cudaLaunchKernel carries no kernel name).
_API = r"^(?:cuda|hip|cu)"
_VERSION = r"(?:_v\d+|_ptsz|_ptds|_spt)*$"
GRAPH_LAUNCH = _API + r"GraphLaunch" + _VERSION  # cudaGraphLaunch, hipGraphLaunch, cuGraphLaunch
CAPTURE_BEGIN = _API + r"StreamBeginCapture(?:ToGraph)?" + _VERSION  # cudaStreamBeginCapture, hip..., cu...
CAPTURE_END = _API + r"StreamEndCapture" + _VERSION
# the calls captured into a graph as one node each: (node kind, name regex), first match wins
CAPTURED_CALLS = (
    ("kernel", _API + r"\w*Launch\w*Kernel\w*" + _VERSION),  # cudaLaunchKernel(ExC), hipExtModuleLaunchKernel, ...
    ("memcpy", _API + r"Memcpy\w*" + _VERSION),  # cudaMemcpyAsync, hipMemcpyWithStream, cuMemcpyDtoDAsync_v2, ...
    ("memset", _API + r"Memset\w*" + _VERSION),  # cudaMemsetAsync, hipMemsetD32Async, ...
)
# python frames that only carry a graph replay to its launch (skipped when telling what launched one)
GRAPH_REPLAY_FRAMES = (
    r"^torch/cuda/graphs\.py\(\d+\): replay$",  # torch.cuda.CUDAGraph.replay
    r"^<built-in method replay of ",
    r"^vllm/compilation/cuda_graph\.py\(\d+\): __call__$",  # vLLM's CUDAGraphWrapper
    r"^vllm/compilation/cuda_piecewise_backend\.py\(\d+\): __call__$",
    r"cuda_graph_runner\.py\(\d+\): replay$",  # SGLang's CudaGraphRunner.replay
    r"^torch/_inductor/cudagraph_trees\.py\(\d+\): ",  # torch.compile(mode="reduce-overhead")
)

STEP_NAME = r"^ProfilerStep#(\d+)$"
MODULE_PREFIX = "nn.Module: "
# torch.compile regions (CPU side); gaps between them hint at graph breaks
COMPILED_REGION = r"^(?:CompiledFunction|CompiledFunctionBackward|Torch-Compiled Region.*|## Call CompiledFxGraph.*)$"

COMPRESSIONS = (".gz", ".zst")
TRACE_SUFFIXES = tuple(f".json{c}" for c in ("", *COMPRESSIONS))  # what a trace file is called (batch looks for)


def is_trace_name(name: str) -> bool:
    return name.endswith(TRACE_SUFFIXES)


def trace_stem(path: str | os.PathLike) -> str:
    """The file name without .json / .json.gz / .json.zst (or a bare .gz / .zst: flatten reads
    any file, whatever its name)."""
    b = os.path.basename(str(path))
    for s in (*TRACE_SUFFIXES, *COMPRESSIONS):
        if b.endswith(s) and len(b) > len(s):
            return b[: -len(s)]
    return b
