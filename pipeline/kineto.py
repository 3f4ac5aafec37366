"""kineto: the vocabulary of Kineto / Chrome-trace JSON that every stage reads, in one place.

Category names as profilers write them (old layouts capitalise some: `Kernel`, `Runtime`), what
kind of activity each names, the flows that link a launch to its GPU activity, and the names of
the annotations tracepipe understands (`ProfilerStep#N`, `nn.Module: X`, compiled regions).
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable
from dataclasses import dataclass

from pipeline.resources import find_dir, read_toml

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
}
ACTIVITY_KINDS = ("kernel", "memcpy", "memset", "sync")  # the `kind`s of gpu_ops (sync: a stream waits)
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
    "xpu_driver",
    "privateuse1_runtime",
    "privateuse1_driver",
    "dequeue",  # torch_npu's task-queue thread: `Dequeue@aclnnAdd` calls the API that launches the tasks
)
# the launch calls that put work on a device (each makes one device op or more: a graph launch many):
# what they are called, and what a call so called may be that is not one (RE2 regexes)
# cudaLaunchKernel(ExC), cuLaunchKernel, hip(Ext)(Module)LaunchKernel, *GraphLaunch, urEnqueueKernelLaunch
DEVICE_LAUNCH = r"(?i)launch"
NOT_DEVICE_LAUNCH = r"(?i)host"  # cudaLaunchHostFunc, cuLaunchHostFunc: run on the host
CPU_OP_CATS = ("cpu_op", "operator")
ANNOTATION_CATS = ("user_annotation",)
MODULE_CATS = ("python_function",)


# ---------------------------------------------------------------- layouts (data/kineto_layouts.toml)
@dataclass(frozen=True)
class Layout:
    """One Kineto trace layout: its id, the torch versions that write it, since when, the categories
    that mark it, what distinguishes it, and the real traces that taught it."""

    id: str
    torch: str
    since: str
    cats: tuple[str, ...]
    marks: str
    traces: tuple[str, ...]  # real traces (under ../shared/traces) that taught it
    source: str = ""  # else: the sources it was learned from
    built_by: str = ""  # and the test that builds a trace from them
    device: str = ""  # the devices' name where the trace names none (a vendor's layout: "Ascend NPU")


_LAYOUT_FILE = read_toml(find_dir("data") / "kineto_layouts.toml")
LAYOUTS = tuple(
    Layout(
        x["id"],
        x["torch"],
        x["since"],
        tuple(x["cats"]),
        x["marks"],
        tuple(x["traces"]),
        x.get("source", ""),
        x.get("built_by", ""),
        x.get("device", ""),
    )
    for x in _LAYOUT_FILE["layouts"]
)


def layout_device(layout: str | None) -> str | None:
    """The name of the devices a trace of `layout` runs on when it names none (None: not known)."""
    return next((x.device for x in LAYOUTS if x.id == layout and x.device), None)


# device activity beyond CUDA's and ROCm's categories: cat -> its kind; where its device id is the
# pid (args.device absent), the cat -> the pids below which it is (None: any)
GPU_KINDS.update({x["cat"]: x["kind"] for x in _LAYOUT_FILE["device_activity"]})
DEVICE_FROM_PID = {x["cat"]: x.get("pid_below") for x in _LAYOUT_FILE["device_activity"] if x.get("device") == "pid"}
# device activity args some backends name otherwise: key -> its aliases (read where key is absent)
GPU_ARG_ALIASES: dict[str, tuple[str, ...]] = {}
for _x in _LAYOUT_FILE["gpu_arg_aliases"]:
    GPU_ARG_ALIASES[_x["key"]] = (*GPU_ARG_ALIASES.get(_x["key"], ()), _x["alias"])
NO_LAUNCH_FLOWS, CPU_ONLY = "no launch flows", "cpu only"  # the layouts no category marks
assert {NO_LAUNCH_FLOWS, CPU_ONLY} <= {x.id for x in LAYOUTS if not x.cats}
# string thread ids naming a number: regexes with a group `n` (`"1890023232"`, `"stream 7"`)
THREAD_ID_FORMS = tuple(x["pattern"] for x in _LAYOUT_FILE["thread_ids"])
# launch -> GPU activity flows: (cat, name) pairs, name None for any; `start` "launch" (the default):
# the flow starts where the launch call starts; "inside": it starts inside the call, on its thread
LAUNCH_FLOWS = tuple(
    (x["cat"], x.get("name")) for x in _LAYOUT_FILE["launch_flows"] if x.get("start", "launch") == "launch"
)
INSIDE_FLOWS = tuple((x["cat"], x.get("name")) for x in _LAYOUT_FILE["launch_flows"] if x.get("start") == "inside")
assert {x.get("start", "launch") for x in _LAYOUT_FILE["launch_flows"]} <= {"launch", "inside"}
LINK_FLOW_CATS = tuple(dict.fromkeys(cat for cat, _ in LAUNCH_FLOWS))
# flows from the CPU op that issued device activity, starting where the op starts: (cat, name)
OP_FLOWS = tuple((x["cat"], x.get("name")) for x in _LAYOUT_FILE.get("op_flows", ()))
ARG_ALIASES = {x["alias"]: x["key"] for x in _LAYOUT_FILE["arg_aliases"]}  # alias -> the usual key
CALL_COUNTERS = tuple(k for x in _LAYOUT_FILE.get("call_counters", ()) for k in x["keys"])
# CPU ops that are a vendor API's call inside the framework op that made it (torch_npu's `aclnnMm`
# inside `aten::mm`): not a task's op where an op flow names it: (pattern, except) regexes
API_OPS = tuple((x["pattern"], x.get("except")) for x in _LAYOUT_FILE.get("api_ops", ()))


@dataclass(frozen=True)
class DeviceTasks:
    """Device activity written without a `cat` (torch_npu's `Ascend Hardware` tasks): complete
    events whose args hold every key of `marks` and one of `stream_args`."""

    marks: tuple[str, ...]
    stream_args: tuple[str, ...]  # the stream: the first of them present
    task_type_arg: str  # the arg `TASK_KINDS` reads


DEVICE_TASKS = tuple(
    DeviceTasks(tuple(x["marks"]), tuple(x["stream_args"]), x["task_type_arg"])
    for x in _LAYOUT_FILE.get("device_tasks", ())
)
# a device task's kind by its task type, and by its name (tried first): kernel where neither says
TASK_TYPE_KINDS = {t: x["kind"] for x in _LAYOUT_FILE.get("task_kinds", ()) for t in x.get("task_types", ())}
TASK_NAME_KINDS = {n: x["kind"] for x in _LAYOUT_FILE.get("task_kinds", ()) for n in x.get("names", ())}


@dataclass(frozen=True)
class DevicePids:
    """How a profiler writes a device id into the pid of a device process: device = pid %
    device_mod, its sort index (pid // index_div) % index_mod; `host_device`: the id it writes for
    the host."""

    formula: str
    device_mod: int
    index_div: int
    index_mod: int
    host_device: int

    def device(self, pid: int) -> int:
        return pid % self.device_mod

    def sort_index(self, pid: int) -> int:
        return (pid // self.index_div) % self.index_mod


DEVICE_PIDS = tuple(
    DevicePids(x["formula"], x["device_mod"], x["index_div"], x["index_mod"], x["host_device"])
    for x in _LAYOUT_FILE.get("device_pids", ())
)


def task_device(pid: int, sort_index: int | None) -> int:
    """The device id in the pid of a device process whose `process_sort_index` is `sort_index`: by
    the first of DEVICE_PIDS whose sort index the pid holds, else by the first."""
    for scheme in DEVICE_PIDS:
        if sort_index is not None and scheme.sort_index(pid) == sort_index:
            return scheme.device(pid)
    return DEVICE_PIDS[0].device(pid)


def task_kind(task_type: str | None, name: str | None) -> str:
    """A device task's kind (`ACTIVITY_KINDS`) from its name, else its task type, else kernel."""
    return TASK_NAME_KINDS.get(name or "") or TASK_TYPE_KINDS.get(task_type or "") or "kernel"


def layout_of(cats: Iterable[str | None]) -> str:
    """The layout of a trace from the event categories it holds (`Layout.id`, else NO_LAUNCH_FLOWS
    when it has GPU activity, else CPU_ONLY)."""
    held = {c for c in cats if c}
    for layout in LAYOUTS:
        if held.intersection(layout.cats):
            return layout.id
    return NO_LAUNCH_FLOWS if held.intersection(GPU_KINDS) else CPU_ONLY


def layouts_markdown() -> str:
    """The layout table for the documentation (scripts/gen_docs.py)."""
    rows = ["| layout | torch | since | what distinguishes it | real traces that test it |", "|---|---|---|---|---|"]
    for x in LAYOUTS:
        traces = ", ".join(f"`{t}`" for t in x.traces) or f"none yet: learned from {x.source}; built by `{x.built_by}`"
        rows.append(f"| `{x.id}` | {x.torch} | {x.since} | {' '.join(x.marks.split())} | {traces} |")
    return "\n".join(rows)


# list args a layout writes as one text: key -> (item separator, number separator or None)
ARG_TEXTS = {x["key"]: (x["item"], x.get("numbers")) for x in _LAYOUT_FILE.get("arg_texts", ())}


def canonical_args(args: dict) -> dict:
    """Event args with the keys of older layouts renamed to today's (`Input dims` -> `Input Dims`),
    where today's key is absent, and list args written as one text read as lists (`ARG_TEXTS`)."""
    texts = [k for k, v in args.items() if type(v) is str and k in ARG_TEXTS]
    if not texts and not any(a in args for a in ARG_ALIASES):
        return args
    out = dict(args)
    for alias, key in ARG_ALIASES.items():
        if alias in out and key not in out:
            out[key] = out.pop(alias)
    for key in texts:
        out[key] = list_of_text(out[key], *ARG_TEXTS[key])
    return out


def list_of_text(text: str, item: str, numbers: str | None) -> list:
    """A list arg written as one text: its items (stripped), each a list of ints when `numbers`
    (an item that is no such list: [])."""
    items = [x.strip() for x in text.split(item)]
    if numbers is None:
        return items
    out: list = []
    for x in items:
        parts = [p.strip() for p in x.split(numbers)] if x else []
        out.append([int(p) for p in parts] if all(p.isdigit() for p in parts) else [])
    return out


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
# replayed GPU activity that stands for a captured memcpy / memset node though its row is a kernel:
# ROCm runs a graph's copies and fills as blit kernels (TraceLens' capture merge pairs Memset nodes
# with `fillBuffer` kernels): (node kind, kernel name regex)
BLIT_KERNELS = (("memset", r"fillBuffer"), ("memcpy", r"copyBuffer"))
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
# the categories a ProfilerStep#N slice has: a user annotation, or in the 2021 layout an `Operator`
# (record_function ranges were written as ops then), or in torch_npu's traces a `cpu_op`
STEP_CATS = (*ANNOTATION_CATS, "operator", "cpu_op")  # torch_npu writes ProfilerStep#N as a cpu_op
STEP_CAT = cat_regex(*STEP_CATS)
MODULE_PREFIX = "nn.Module: "
# torch.compile regions (CPU side); gaps between them hint at graph breaks
COMPILED_REGION = r"^(?:CompiledFunction|CompiledFunctionBackward|Torch-Compiled Region.*|## Call CompiledFxGraph.*)$"

COMPRESSIONS = (".gz", ".zst")
TRACE_SUFFIXES = tuple(f".json{c}" for c in ("", *COMPRESSIONS))  # what a trace file is called (batch looks for)


def is_trace_name(name: str) -> bool:
    return name.endswith(TRACE_SUFFIXES)


# torch_npu writes each rank's output into a folder `<worker>_ascend_pt` whose JSON files are no
# traces (profiler_info_N.json, communication.json, the msprof timelines of its PROF_* folder) but
# for `ASCEND_PROFILER_OUTPUT/trace_view.json`, its trace
NPU_OUTPUT_DIR, NPU_TRACE_DIR, NPU_TRACE_STEM = "_ascend_pt", "ASCEND_PROFILER_OUTPUT", "trace_view"


def is_trace_path(path: str) -> bool:
    """Whether a file found under a folder (its path from the folder) is a trace: named like one,
    and inside a torch_npu output folder only its trace_view.json."""
    parts = re.split(r"[/\\]", str(path))
    if not is_trace_name(parts[-1]):
        return False
    for i, part in enumerate(parts[:-1]):
        if part.endswith(NPU_OUTPUT_DIR):
            rest = parts[i + 1 :]
            return len(rest) == 2 and rest[0] == NPU_TRACE_DIR and trace_stem(rest[1]) == NPU_TRACE_STEM
    return True


def trace_stem(path: str | os.PathLike) -> str:
    """The file name without .json / .json.gz / .json.zst (or a bare .gz / .zst: flatten reads
    any file, whatever its name)."""
    b = os.path.basename(str(path))
    for s in (*TRACE_SUFFIXES, *COMPRESSIONS):
        if b.endswith(s) and len(b) > len(s):
            return b[: -len(s)]
    return b
