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
