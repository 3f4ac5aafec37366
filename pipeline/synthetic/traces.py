"""synthetic: Kineto (PyTorch profiler) traces written by the project itself: for the tests, the
bundled demo and the benchmark.

`make_trace(...)` returns a trace as a dict shaped like what torch.profiler / Kineto writes:
ProfilerStep#N annotations, nested cpu_ops (aten::linear -> aten::addmm / aten::mm) with
shapes, cudaLaunchKernel runtime calls with correlation ids, launch flows, kernels with
device/stream/grid/block, a memcpy and a memset per step, `M` metadata (string pids
included) and the usual top-level metadata, in four layouts ("new", "old", "oldest", "2021").
Timestamps are built as `Decimal`s with three decimals (what Kineto prints); they are stored
as floats (layout "new"), ints (layouts "old"/"oldest") or, with `ns_digits=True`, as Decimals
too long for a float64 (`1712195495519695.812`). `write_trace` writes Decimals as their exact
text. `ns(v)` is the independent expectation of a µs value in integer nanoseconds.
"""

from __future__ import annotations

import gzip
import json
import re
from decimal import Decimal
from pathlib import Path

import orjson

PID = 1670242
TID = 1670242
BWD_TID = 1670299
STREAM = 7
BASE_NEW = Decimal("2413669096090.100")  # µs since boot, like recent Kineto
BASE_OLD = Decimal("1661203462598738")  # µs since epoch, integers (older Kineto)
BASE_NS = Decimal("1712195495519695.812")  # µs since epoch with ns digits: too long for a float
STEP_US = Decimal("5000")
OP_US = Decimal("120")

GPU_CATS_BY_LAYOUT = {
    "new": {"kernel": "kernel", "memcpy": "gpu_memcpy", "memset": "gpu_memset"},
    "old": {"kernel": "kernel", "memcpy": "gpu_memcpy", "memset": "gpu_memset"},
    "oldest": {"kernel": "Kernel", "memcpy": "Memcpy", "memset": "Memset"},
    "2021": {"kernel": "Kernel", "memcpy": "Memcpy", "memset": "Memset"},
}
CAPITALISED = ("oldest", "2021")  # layouts whose CPU cats are Operator / Runtime
ALL_GPU_CATS = {
    "kernel",
    "gpu_memcpy",
    "gpu_memset",
    "Kernel",
    "Memcpy",
    "Memset",
    "memcpy",
    "memset",
    "mtia_ccp_events",
}

DEVICE_PROPS = {
    "name": "NVIDIA A100-SXM4-80GB",
    "totalGlobalMem": 85031714816,
    "computeMajor": 8,
    "computeMinor": 0,
    "maxThreadsPerBlock": 1024,
    "maxThreadsPerMultiprocessor": 2048,
    "regsPerBlock": 65536,
    "warpSize": 32,
    "sharedMemPerBlock": 49152,
    "numSms": 108,
    "regsPerMultiprocessor": 65536,
    "sharedMemPerBlockOptin": 166912,
    "sharedMemPerMultiprocessor": 167936,
}

# strings and args that contain the splitter's boundary pattern `}, {"` where it is no boundary
TRICKY_NAME = 'weird}, {"name": "not an event"}, {"ph": "X'
TRICKY_ARGS = {
    "nested": [{"a": 1}, {"b": [{"c": '}, {"'}, {"d": [1, 2, {"e": None}]}]}, {"f": "x"}],
    "Call stack": 'f.py(1): g}, {"x": 1}\n}, {"',
    "deep": {"l1": {"l2": [{"l3": [{"l4": '}]}, {"k": ['}]}]}},
}


class _Clock:
    def __init__(self, layout: str, ns_digits: bool):
        self.layout, self.ns_digits = layout, ns_digits
        self.base = BASE_NS if ns_digits else (BASE_NEW if layout == "new" else BASE_OLD)

    def t(self, d: Decimal):
        """A timestamp `d` µs after the base, in the layout's number type."""
        v = self.base + d
        if self.ns_digits:
            return v
        if self.layout == "new":
            return float(v)
        return int(v)

    def d(self, d: Decimal):
        """A duration of `d` µs in the layout's number type."""
        if self.ns_digits:
            return d
        if self.layout == "new":
            return float(d)
        return int(d.to_integral_value())


def _kineto_ids():
    n = 0
    while True:
        n += 1
        yield n


def step_events(
    step: int,
    ops_per_step: int = 3,
    layout: str = "new",
    with_flows: bool = True,
    ns_digits: bool = False,
    gpu_devices=(0,),
    first_ext: int = 1,
    first_corr: int = 1000,
    step_index: int | None = None,
) -> list[dict]:
    """The events of one ProfilerStep: annotation, ops, launches, flows, kernels, memcpy, memset."""
    clk = _Clock(layout, ns_digits)
    cats = GPU_CATS_BY_LAYOUT[layout]
    op_cat = "Operator" if layout in CAPITALISED else "cpu_op"
    rt_cat = "Runtime" if layout in CAPITALISED else "cuda_runtime"
    ann_cat = "Operator" if layout in CAPITALISED else "user_annotation"
    ext_key = "external id" if layout in CAPITALISED else "External id"
    op_ext_key = "External id" if layout == "2021" else ext_key  # the 2021 layout capitalises it on ops only
    dims_key = "Input dims" if layout == "2021" else "Input Dims"
    own_ext = layout in ("new", "2021")  # GPU events carry their op's External id, not the correlation
    flow_cat, flow_name = {
        "new": ("ac2g", "ac2g"),
        "old": ("async_cpu_to_gpu", "async_gpu"),
        "oldest": ("async_gpu", "cudaLaunchKernel"),
        "2021": ("async", "launch"),
    }[layout]
    k = step if step_index is None else step_index
    t0 = STEP_US * k
    ext = first_ext
    corr = first_corr
    out: list[dict] = []

    def x(cat, name, pid, tid, ts, dur, args):
        if layout == "2021":  # threads as strings, GPU streams as "stream N"; op args keyed as then
            tid = str(tid) if pid == PID else f"stream {tid}"
            if cat == op_cat:
                args = {
                    (op_ext_key if k == ext_key else dims_key if k == "Input Dims" else k): v for k, v in args.items()
                }
        out.append(
            {
                "ph": "X",
                "cat": cat,
                "name": name,
                "pid": pid,
                "tid": tid,
                "ts": clk.t(ts),
                "dur": clk.d(dur),
                "args": args,
            }
        )

    def flow(c, launch_ts, gpu_pid, gpu_ts, launch_name):
        if not with_flows:
            return
        s = {
            "ph": "s",
            "id": c,
            "pid": PID,
            "tid": TID,
            "ts": clk.t(launch_ts),
            "cat": flow_cat,
            "name": flow_name if layout != "oldest" else launch_name,
        }
        f = {
            "ph": "f",
            "id": c,
            "pid": gpu_pid,
            "tid": f"stream {STREAM}" if layout == "2021" else STREAM,
            "ts": clk.t(gpu_ts),
            "cat": flow_cat,
            "name": flow_name if layout != "oldest" else launch_name,
            "bp": "e",
        }
        if layout != "new":
            s["bp"] = "e"
        out.append(s)
        out.append(f)

    step_len = OP_US * (ops_per_step + 3)
    x(ann_cat, f"ProfilerStep#{step}", PID, TID, t0, step_len, {ext_key: ext, "Record function id": 0})
    ext += 1
    for i in range(ops_per_step):
        dev = gpu_devices[i % len(gpu_devices)]
        s = t0 + Decimal("10.125") + OP_US * i
        lin_ext, inner_ext = ext, ext + 1
        ext += 2
        x(
            op_cat,
            "aten::linear",
            PID,
            TID,
            s,
            Decimal("100.250"),
            {
                ext_key: lin_ext,
                "Record function id": 0,
                "Sequence number": 100 + i,
                "Fwd thread id": 0,
                "Input Dims": [[32, 128], [64, 128], [64]],
                "Input type": ["float", "float", "float"],
                "Concrete Inputs": ["", "", ""],
                "Ev Idx": len(out),
            },
        )
        if i % 2 == 0:
            name, dims, types, conc = (
                "aten::addmm",
                [[64], [32, 128], [128, 64], [], []],
                ["float", "float", "float", "Scalar", "Scalar"],
                ["", "", "", "1", "1"],
            )
        else:
            name, dims, types, conc = ("aten::mm", [[32, 128], [128, 64]], ["c10::BFloat16", "c10::BFloat16"], ["", ""])
        x(
            op_cat,
            name,
            PID,
            TID,
            s + Decimal("5.5"),
            Decimal("80.001"),
            {
                ext_key: inner_ext,
                "Record function id": 0,
                "Input Dims": dims,
                "Input type": types,
                "Concrete Inputs": conc,
                "Ev Idx": len(out),
            },
        )
        launch_ts = s + Decimal("20.333")
        x(
            rt_cat,
            "cudaLaunchKernel",
            PID,
            TID,
            launch_ts,
            Decimal("9.871"),
            {ext_key: inner_ext, "cbid": 211, "correlation": corr},
        )
        k_ts = s + Decimal("40.007") + Decimal(i)
        kext = inner_ext if own_ext else corr  # old layouts: External id == correlation
        x(
            cats["kernel"],
            "ampere_sgemm_32x32_sliced1x4_tn" if i % 2 == 0 else "sm80_xmma_gemm_bf16bf16_bf16f32",
            dev,
            STREAM,
            k_ts,
            Decimal("25.312"),
            {
                ext_key: kext,
                "queued": 0,
                "device": dev,
                "context": 1,
                "stream": STREAM,
                "correlation": corr,
                "registers per thread": 90,
                "shared memory": 49152,
                "blocks per SM": 0.5925926,
                "warps per SM": 2.3703704,
                "grid": [64, 1, 1],
                "block": [128, 1, 1],
                "est. achieved occupancy %": 25,
            },
        )
        flow(corr, launch_ts, dev, k_ts, "cudaLaunchKernel")
        corr += 1
    dev = gpu_devices[0]
    # one memcpy and one memset per step
    s = t0 + OP_US * ops_per_step + Decimal("10.5")
    cext = ext
    ext += 1
    x(
        op_cat,
        "aten::copy_",
        PID,
        TID,
        s,
        Decimal("60.25"),
        {
            ext_key: cext,
            "Record function id": 0,
            "Input Dims": [[32, 64], [32, 64], []],
            "Input type": ["float", "float", "Scalar"],
            "Concrete Inputs": ["", "", "False"],
        },
    )
    x(
        rt_cat,
        "cudaMemcpyAsync",
        PID,
        TID,
        s + Decimal("3.25"),
        Decimal("20.5"),
        {ext_key: cext, "cbid": 41, "correlation": corr},
    )
    m_ts = s + Decimal("30.125")
    x(
        cats["memcpy"],
        "Memcpy HtoD (Pageable -> Device)",
        dev,
        STREAM,
        m_ts,
        Decimal("4.096"),
        {
            ext_key: cext if own_ext else corr,
            "device": dev,
            "context": 1,
            "stream": STREAM,
            "correlation": corr,
            "bytes": 8192,
            "memory bandwidth (GB/s)": 2.0,
        },
    )
    flow(corr, s + Decimal("3.25"), dev, m_ts, "cudaMemcpyAsync")
    corr += 1
    s = s + Decimal("70")
    x(rt_cat, "cudaMemsetAsync", PID, TID, s, Decimal("5.5"), {"cbid": 51, "correlation": corr})
    z_ts = s + Decimal("8.25")
    x(
        cats["memset"],
        "Memset (Device)",
        dev,
        STREAM,
        z_ts,
        Decimal("1.024"),
        {
            ext_key: 0 if own_ext else corr,
            "device": dev,
            "context": 1,
            "stream": STREAM,
            "correlation": corr,
            "bytes": 8,
            "memory bandwidth (GB/s)": 0.0078125,
        },
    )
    corr += 1
    # a backward op on another thread, linked forward -> backward by a fwdbwd flow (new layout)
    if layout == "new" and with_flows:
        b = s + Decimal("20")
        out.append(
            {
                "ph": "s",
                "id": lin_ext if ops_per_step else ext,
                "pid": PID,
                "tid": TID,
                "ts": clk.t(t0 + Decimal("10.125")),
                "cat": "fwdbwd",
                "name": "fwdbwd",
            }
        )
        x(
            op_cat,
            "autograd::engine::evaluate_function: AddmmBackward0",
            PID,
            BWD_TID,
            b,
            Decimal("15"),
            {ext_key: ext, "Record function id": 0, "Sequence number": 100, "Fwd thread id": 1},
        )
        out.append(
            {
                "ph": "f",
                "id": lin_ext if ops_per_step else ext,
                "pid": PID,
                "tid": BWD_TID,
                "ts": clk.t(b),
                "cat": "fwdbwd",
                "name": "fwdbwd",
                "bp": "e",
            }
        )
        ext += 1
    return out


def metadata_events(layout: str = "new", ns_digits: bool = False, gpu_devices=(0,)) -> list[dict]:
    clk = _Clock(layout, ns_digits)
    t = clk.t(Decimal("-100"))
    out = [
        {"name": "process_name", "ph": "M", "ts": t, "pid": PID, "tid": 0, "args": {"name": "python3.10"}},
        {"name": "process_labels", "ph": "M", "ts": t, "pid": PID, "tid": 0, "args": {"labels": "CPU"}},
        {"name": "process_sort_index", "ph": "M", "ts": t, "pid": PID, "tid": 0, "args": {"sort_index": PID}},
        {"name": "thread_name", "ph": "M", "ts": t, "pid": PID, "tid": TID, "args": {"name": "thread 1 (python3)"}},
        {"name": "thread_sort_index", "ph": "M", "ts": t, "pid": PID, "tid": TID, "args": {"sort_index": TID}},
    ]
    for d in gpu_devices:
        out += [
            {"name": "process_name", "ph": "M", "ts": t, "pid": d, "tid": 0, "args": {"name": "python3.10"}},
            {"name": "process_labels", "ph": "M", "ts": t, "pid": d, "tid": 0, "args": {"labels": f"GPU {d}"}},
            {"name": "thread_name", "ph": "M", "ts": t, "pid": d, "tid": STREAM, "args": {"name": f"stream {STREAM}"}},
        ]
    out += [
        {"name": "process_sort_index", "ph": "M", "ts": t, "pid": "Spans", "tid": 0, "args": {"sort_index": 536870912}},
        {"name": "process_name", "ph": "M", "ts": t, "pid": "Spans", "tid": 0, "args": {"name": "Spans"}},
        {
            "ph": "X",
            "cat": "Trace",
            "ts": t,
            "dur": clk.d(Decimal("20000")),
            "pid": "Spans",
            "tid": "PyTorch Profiler",
            "name": "PyTorch Profiler (0)",
            "args": {"Op count": 0},
        },
        {
            "name": "Iteration Start: PyTorch Profiler",
            "ph": "i",
            "s": "g",
            "pid": "Traces",
            "tid": "Trace PyTorch Profiler",
            "ts": t,
        },
    ]
    return out


def memory_event(ts: float, total: int, reserved: int, device: int, nbytes: int = 512) -> dict:
    """A `[memory]` instant event as the profiler writes it with profile_memory=True: `nbytes`
    allocated (negative: freed), the allocator's totals after it; device -1 is the CPU."""
    return {
        "ph": "i",
        "cat": "cpu_instant_event",
        "name": "[memory]",
        "pid": 1,
        "tid": 1,
        "ts": ts,
        "s": "t",
        "args": {
            "Bytes": nbytes,
            "Total Allocated": total,
            "Total Reserved": reserved,
            "Device Type": 1 if device >= 0 else 0,
            "Device Id": device,
        },
    }


def top_metadata(layout: str = "new", device_props=True, prop_ids=(0,)) -> tuple[dict, dict]:
    """(keys Kineto writes before traceEvents, keys it writes after)."""
    before: dict[str, object] = {}
    after: dict[str, object] = {}
    if layout != "oldest":
        before["schemaVersion"] = 1
    if layout not in CAPITALISED:
        if device_props:
            before["deviceProperties"] = [{"id": i, **DEVICE_PROPS} for i in prop_ids]
        before["cupti_version"] = 18
        before["cuda_runtime_version"] = 12000
        before["record_shapes"] = 1
    before["distributedInfo"] = {"backend": "nccl", "rank": 1, "world_size": 4}
    if layout not in CAPITALISED:
        after["traceName"] = "/tmp/tmpu3g3sevh/synth.json"
        after["displayTimeUnit"] = "ms"
        after["baseTimeNanoseconds"] = 1727743122000000000
    return before, after


def make_trace(
    n_steps: int = 2,
    ops_per_step: int = 3,
    layout: str = "new",
    with_flows: bool = True,
    device_props: bool = True,
    metadata_after: bool = False,
    ns_digits: bool = False,
    gpu_devices=(0,),
    prop_ids=None,
    extra_metadata: dict | None = None,
    extra_events: list | None = None,
    tricky: bool = False,
) -> dict:
    """A synthetic Kineto trace as a dict (key order = the order `write_trace` writes).

    layout: "new" (ac2g flows, float µs), "old" (async_cpu_to_gpu flows, int µs, kernel External id
    = correlation), "oldest" (cats Kernel/Memcpy/Memset/Runtime/Operator, `external id`, async_gpu
    flows, no schemaVersion/deviceProperties), "2021" (torch 1.8: as "oldest" but threads as strings,
    GPU streams as `"stream 7"`, flows of cat `async` named `launch`, `Input dims`, and kernels' lower-case
    `external id` their op's). metadata_after: deviceProperties, distributedInfo and
    the rest follow traceEvents (as in newer Kineto). tricky: add events whose strings and args
    contain `}, {"` and nested lists of objects. extra_metadata: added at the top level (after
    traceEvents when metadata_after). extra_events: appended to traceEvents.
    """
    if layout not in GPU_CATS_BY_LAYOUT:
        raise ValueError(layout)
    prop_ids = tuple(gpu_devices) if prop_ids is None else tuple(prop_ids)
    events = metadata_events(layout, ns_digits, gpu_devices)
    ext, corr = 1, 1000
    for s in range(n_steps):
        es = step_events(s + 1, ops_per_step, layout, with_flows, ns_digits, gpu_devices, ext, corr, s)
        ext += 4 * ops_per_step + 10
        corr += ops_per_step + 5
        events += es
        if tricky:
            clk = _Clock(layout, ns_digits)
            events.append(
                {
                    "ph": "X",
                    "cat": "python_function",
                    "name": TRICKY_NAME,
                    "pid": PID,
                    "tid": TID,
                    "ts": clk.t(STEP_US * s + Decimal("1.5")),
                    "dur": clk.d(Decimal("2")),
                    "args": TRICKY_ARGS,
                }
            )
            events.append(
                {
                    "ph": "i",
                    "cat": "cpu_instant_event",
                    "name": '}, {"',
                    "pid": PID,
                    "tid": TID,
                    "s": "t",
                    "ts": clk.t(STEP_US * s + Decimal("2.5")),
                    "args": {"list": [{"k": i, "v": [{"w": "}, {"}]} for i in range(5)]},
                }
            )
    events += extra_events or []
    before, after = top_metadata(layout, device_props, prop_ids)
    meta = {**before, **after, **(extra_metadata or {})}
    if not metadata_after:
        return {**meta, "traceEvents": events}
    first = {"schemaVersion": meta.pop("schemaVersion")} if "schemaVersion" in meta else {}
    return {**first, "traceEvents": events, **meta}


# ------------------------------------------------------------------ writing
_DEC = re.compile(r'"@@DEC@@([^@"]+)@@"')


def _mark_decimals(v):
    t = type(v)
    if t is dict:
        return {k: _mark_decimals(x) for k, x in v.items()}
    if t is list:
        return [_mark_decimals(x) for x in v]
    if t is Decimal:
        return f"@@DEC@@{v}@@"
    return v


def dumps_trace(trace, indent: int | None = None) -> bytes:
    """JSON text as Python's json writes it (`, ` and `: ` separators, NaN kept), Decimals exact."""
    text = json.dumps(_mark_decimals(trace), indent=indent, ensure_ascii=False)
    return _DEC.sub(r"\1", text).encode()


def write_trace(trace, path, gz: bool = False, indent: int | None = None, zstd: bool = False) -> Path:
    """Write a trace (dict or list) as JSON, plain, gzip (`gz`) or zstd (`zstd`)."""
    path = Path(path)
    data = dumps_trace(trace, indent)
    if gz:
        data = gzip.compress(data)
    elif zstd:
        import zstandard

        data = zstandard.ZstdCompressor().compress(data)
    path.write_bytes(data)
    return path


def write_big_trace(path, target_bytes: int, ops_per_step: int = 40) -> int:
    """Stream a large "new"-layout trace to `path` (compact JSON) without holding it in memory.

    Returns the number of traceEvents written.
    """
    before, after = top_metadata("new", True, (0,))
    n = 0
    with open(path, "wb") as f:
        head = orjson.dumps(before)
        f.write(head[:-1] + b',"traceEvents":[')
        first = True
        for e in metadata_events("new"):
            f.write((b"" if first else b",") + orjson.dumps(e))
            first = False
            n += 1
        step, ext, corr = 1, 1, 1000
        while f.tell() < target_bytes:
            es = step_events(step, ops_per_step, "new", True, False, (0,), ext, corr, step - 1)
            ext += 4 * ops_per_step + 10
            corr += ops_per_step + 5
            f.write(b"," + b",".join(orjson.dumps(e) for e in es))
            n += len(es)
            step += 1
        f.write(b"]," + orjson.dumps(after)[1:])
    return n
