"""graphs: a CUDA/HIP graph replay trace and the trace of its capture, with the truth of who captured what.

`GraphCase` describes graphs (nodes: the op that captured a kernel, its shapes, the kernel's name,
grid, block and replay stream), which are captured (in order, each between a Begin- and EndCapture
on the capturing thread) and which replays the replay trace holds (a graph index each, in launch
order, and optionally the order its kernels start on the GPU: multi-stream graphs). `capture_trace`
and `replay_trace` write them as Kineto does: HIP (`api="hip"`: hipLaunchKernel args carry
`kernel`, `grid`, `block`; replayed kernels none of them, as ROCm's "Dispatch Task" rows) or CUDA
(`api="cuda"`: cudaLaunchKernel args carry neither; replayed kernels carry grid and block).
`truth` maps each replayed kernel's event index to the node that captured it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from pipeline.synthetic.traces import DEVICE_PROPS

PID, TID, GPU = 4242, 4242, 0
GRAPH_ID_BASE, NODE_ID_BASE = 10, 1000
BASE = 6520367000000.0  # µs, like the shared MI300X pair
MI300X = {"name": "AMD Instinct MI300X", "totalGlobalMem": 205822885888, "computeMajor": 9, "computeMinor": 4}


@dataclass(frozen=True)
class Node:
    """One captured kernel: the op that captured it (name, Input Dims, Input type), the kernel."""

    op: str
    dims: tuple
    kernel: str
    grid: tuple = (64, 1, 1)
    block: tuple = (256, 1, 1)
    stream: int = 0  # the stream it runs on when replayed
    dur_us: float = 20.0
    types: tuple = ("c10::BFloat16", "c10::BFloat16")
    kind: str = "kernel"  # or memset: captured as a memset call, replayed as ROCm's fill kernel or a memset


def mm(m: int, k: int, n: int, kernel: str = "Cijk_gemm_MT64x64", **kw) -> Node:
    return Node("aten::mm", ((m, k), (k, n)), kernel, **kw)


def memset(n: int, **kw) -> Node:
    return Node("aten::zero_", ((n,),), "__amd_rocclr_fillBufferAligned", kind="memset", **kw)


def pointwise(n: int, kernel: str = "triton_poi_fused_add_0", op: str = "aten::add", **kw) -> Node:
    return Node(op, ((n,), (n,)), kernel, **kw)


@dataclass
class GraphCase:
    """What is captured and what is replayed (see the module docstring)."""

    graphs: list[list[Node]]
    captured: list[int] | None = None  # which graphs the capture trace captures, in order (default all)
    replays: list[int] = field(default_factory=list)  # graph index of each replay, in launch order
    start_order: dict[int, list[int]] = field(default_factory=dict)  # replay -> node order on the GPU
    api: str = "hip"
    eager: int = 2  # eager kernels launched by ops in the replay trace, before the replays
    gpu_lag_us: float = 1000.0  # how far the GPU runs behind the CPU (0: a replay starts right after its launch)
    # CUDA: kernels carry Kineto's `graph id` / `graph node id` (CUDA 12+, kineto 2026-02): graph g is
    # id GRAPH_ID_BASE + g, its node j id NODE_ID_BASE * (g + 1) + j; eager kernels 0 and 0
    kineto_graph_ids: bool = False


class _Ids:
    def __init__(self, first: int):
        self.n = first

    def __call__(self) -> int:
        self.n += 1
        return self.n


def _x(cat, name, pid, tid, ts, dur, args) -> dict:
    return {"ph": "X", "cat": cat, "name": name, "pid": pid, "tid": tid, "ts": round(ts, 3), "dur": dur, "args": args}


def _doc(events: list[dict], api: str) -> dict:
    props = MI300X if api == "hip" else DEVICE_PROPS
    return {
        "schemaVersion": 1,
        "deviceProperties": [{"id": GPU, **props}],
        "traceEvents": events,
        "traceName": "graphs.json",
    }


def _op_args(node: Node, ext: int) -> dict:
    return {
        "External id": ext,
        "Record function id": 0,
        "Input Dims": [list(d) for d in node.dims],
        "Input type": list(node.types),
        "Concrete Inputs": [""] * len(node.dims),
        "Ev Idx": ext,
    }


def capture_trace(case: GraphCase) -> dict:
    """The capture phase: per captured graph, Begin- and EndCapture around one op per node, each
    launching its kernel (not run: nothing reaches the GPU), plus a warm-up op that did run."""
    api, ev, t = case.api, [], BASE
    ids, corr = _Ids(0), _Ids(100)
    begin, end = f"{api}StreamBeginCapture", f"{api}StreamEndCapture"
    launch = "hipLaunchKernel" if api == "hip" else "cudaLaunchKernel"
    ev.append(_x("python_function", "vllm/worker.py(10): capture_model", PID, TID, t, 1e6, {}))
    warm = pointwise(1024)
    e = ids()
    ev.append(_x("cpu_op", warm.op, PID, TID, t + 1, 10, _op_args(warm, e)))
    c = corr()
    ev.append(_x("cuda_runtime", launch, PID, TID, t + 2, 4, {"External id": e, "correlation": c}))
    ev.append(_x("kernel", warm.kernel, GPU, 1, t + 20, 5, {"device": GPU, "stream": 1, "correlation": c}))
    t += 100
    for g in range(len(case.graphs)) if case.captured is None else case.captured:
        ev.append(_x("cuda_runtime", begin, PID, TID, t, 1, {"correlation": corr()}))
        t += 5
        for node in case.graphs[g]:
            e = ids()
            ev.append(_x("cpu_op", node.op, PID, TID, t, 20, _op_args(node, e)))
            args: dict = {"External id": e, "correlation": corr()}
            call = launch if node.kind == "kernel" else f"{api}MemsetAsync"
            if api == "hip" and node.kind == "kernel":
                args |= {"kernel": node.kernel, "grid": list(node.grid), "block": list(node.block)}
            ev.append(_x("cuda_runtime", call, PID, TID, t + 10, 3.5, args))
            t += 30
        ev.append(_x("cuda_runtime", end, PID, TID, t, 2, {"correlation": corr()}))
        t += 50
    return _doc(ev, api)


def replay_trace(case: GraphCase) -> tuple[dict, dict[int, tuple[int, int]]]:
    """The replay trace and its truth: {event index of a replayed kernel: (graph, node)}."""
    api, ev, truth = case.api, [], {}
    t, gpu_t = BASE + 5e6, BASE + 5e6 + case.gpu_lag_us
    ids, corr = _Ids(1000), _Ids(50000)
    launch, graph_launch = f"{api}LaunchKernel", f"{api}GraphLaunch"
    ev.append(_x("user_annotation", "execute_model", PID, TID, t, 1e5, {}))
    for _ in range(case.eager):
        node = mm(128, 256, 512, kernel="eager_gemm")
        e, c = ids(), corr()
        ev.append(_x("cpu_op", node.op, PID, TID, t + 1, 10, _op_args(node, e)))
        ev.append(_x("cuda_runtime", launch, PID, TID, t + 2, 4, {"External id": e, "correlation": c}))
        args = _kernel_args(api, node, c, 0) | ({"graph id": 0, "graph node id": 0} if case.kineto_graph_ids else {})
        ev.append(_x("kernel", node.kernel, GPU, 0, gpu_t, 15, args))
        t, gpu_t = t + 20, gpu_t + 20
    for r, g in enumerate(case.replays):
        nodes = case.graphs[g]
        ev.append(_x("python_function", "vllm/compilation/cuda_graph.py(208): __call__", PID, TID, t, 60, {}))
        ev.append(_x("python_function", "torch/cuda/graphs.py(139): replay", PID, TID, t + 2, 50, {}))
        c = corr()
        ev.append(_x("cuda_runtime", graph_launch, PID, TID, t + 5, 30, {"correlation": c}))
        gpu_t = max(gpu_t, t + 40)  # not before its launch
        ends: dict[int, float] = {}
        for j in case.start_order.get(r, range(len(nodes))):
            node = nodes[j]
            start = max(gpu_t, ends.get(node.stream, gpu_t))
            truth[len(ev)] = (g, j)
            cat, name = (
                ("kernel", node.kernel) if node.kind == "kernel" or api == "hip" else ("gpu_memset", "Memset (Device)")
            )
            args = _kernel_args(api, node, c, None)
            if case.kineto_graph_ids:
                args |= {"graph id": GRAPH_ID_BASE + g, "graph node id": NODE_ID_BASE * (g + 1) + j}
            ev.append(_x(cat, name, GPU, node.stream, start, node.dur_us, args))
            ends[node.stream] = start + node.dur_us + 1
            gpu_t = start + 2  # the next kernel starts after this one started (streams overlap)
        gpu_t = max(ends.values()) + 5
        t += 100
    return _doc(ev, api), truth


def _kernel_args(api: str, node: Node, corr: int, stream: int | None) -> dict:
    args = {"device": GPU, "stream": node.stream if stream is None else stream, "correlation": corr}
    if api == "hip":
        return args | {"kind": "Dispatch Task" if stream is None else "Dispatch Kernel"}
    return args | {"grid": list(node.grid), "block": list(node.block)}
