"""synthetic: Kineto (PyTorch profiler) traces written by the project itself: for the tests, the
bundled demo and the benchmark.

`make_trace(...)` returns a trace as a dict shaped like what torch.profiler / Kineto writes:
ProfilerStep#N annotations, nested cpu_ops (aten::linear -> aten::addmm / aten::mm) with
shapes, cudaLaunchKernel runtime calls with correlation ids, launch flows, kernels with
device/stream/grid/block, a memcpy and a memset per step, `M` metadata (string pids
included) and the usual top-level metadata, in three layouts ("new", "old", "oldest").
Timestamps are built as `Decimal`s with three decimals (what Kineto prints); they are stored
as floats (layout "new"), ints (layouts "old"/"oldest") or, with `ns_digits=True`, as Decimals
too long for a float64 (`1712195495519695.812`). `write_trace` writes Decimals as their exact
text. `ns(v)` is the independent expectation of a µs value in integer nanoseconds.

`write_demo(path, mb)` streams a transformer-like training run on an H100 of any size, laid out
with the whitespace Kineto writes (the demo trace and the benchmark's template).
"""
from __future__ import annotations

import gzip
import json
import random
import re
from decimal import Decimal
from pathlib import Path
from typing import Iterator

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
}
ALL_GPU_CATS = {"kernel", "gpu_memcpy", "gpu_memset", "Kernel", "Memcpy", "Memset", "memcpy", "memset",
                "mtia_ccp_events"}

DEVICE_PROPS = {
    "name": "NVIDIA A100-SXM4-80GB", "totalGlobalMem": 85031714816, "computeMajor": 8, "computeMinor": 0,
    "maxThreadsPerBlock": 1024, "maxThreadsPerMultiprocessor": 2048, "regsPerBlock": 65536, "warpSize": 32,
    "sharedMemPerBlock": 49152, "numSms": 108, "regsPerMultiprocessor": 65536,
    "sharedMemPerBlockOptin": 166912, "sharedMemPerMultiprocessor": 167936,
}

# strings and args that contain the splitter's boundary pattern `}, {"` where it is no boundary
TRICKY_NAME = 'weird}, {"name": "not an event"}, {"ph": "X'
TRICKY_ARGS = {
    "nested": [{"a": 1}, {"b": [{"c": "}, {\""}, {"d": [1, 2, {"e": None}]}]}, {"f": "x"}],
    "Call stack": 'f.py(1): g}, {"x": 1}\n}, {"',
    "deep": {"l1": {"l2": [{"l3": [{"l4": "}]}, {\"k\": ["}]}]}},
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


def step_events(step: int, ops_per_step: int = 3, layout: str = "new", with_flows: bool = True,
                ns_digits: bool = False, gpu_devices=(0,), first_ext: int = 1, first_corr: int = 1000,
                step_index: int | None = None) -> list[dict]:
    """The events of one ProfilerStep: annotation, ops, launches, flows, kernels, memcpy, memset."""
    clk = _Clock(layout, ns_digits)
    cats = GPU_CATS_BY_LAYOUT[layout]
    op_cat = "Operator" if layout == "oldest" else "cpu_op"
    rt_cat = "Runtime" if layout == "oldest" else "cuda_runtime"
    ann_cat = "Operator" if layout == "oldest" else "user_annotation"
    ext_key = "external id" if layout == "oldest" else "External id"
    flow_cat, flow_name = {"new": ("ac2g", "ac2g"), "old": ("async_cpu_to_gpu", "async_gpu"),
                           "oldest": ("async_gpu", "cudaLaunchKernel")}[layout]
    k = step if step_index is None else step_index
    t0 = STEP_US * k
    ext = first_ext
    corr = first_corr
    out: list[dict] = []

    def x(cat, name, pid, tid, ts, dur, args):
        out.append({"ph": "X", "cat": cat, "name": name, "pid": pid, "tid": tid,
                    "ts": clk.t(ts), "dur": clk.d(dur), "args": args})

    def flow(c, launch_ts, gpu_pid, gpu_ts, launch_name):
        if not with_flows:
            return
        s = {"ph": "s", "id": c, "pid": PID, "tid": TID, "ts": clk.t(launch_ts), "cat": flow_cat,
             "name": flow_name if layout != "oldest" else launch_name}
        f = {"ph": "f", "id": c, "pid": gpu_pid, "tid": STREAM, "ts": clk.t(gpu_ts), "cat": flow_cat,
             "name": flow_name if layout != "oldest" else launch_name, "bp": "e"}
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
        x(op_cat, "aten::linear", PID, TID, s, Decimal("100.250"),
          {ext_key: lin_ext, "Record function id": 0, "Sequence number": 100 + i, "Fwd thread id": 0,
           "Input Dims": [[32, 128], [64, 128], [64]], "Input type": ["float", "float", "float"],
           "Concrete Inputs": ["", "", ""], "Ev Idx": len(out)})
        if i % 2 == 0:
            name, dims, types, conc = ("aten::addmm", [[64], [32, 128], [128, 64], [], []],
                                       ["float", "float", "float", "Scalar", "Scalar"], ["", "", "", "1", "1"])
        else:
            name, dims, types, conc = ("aten::mm", [[32, 128], [128, 64]],
                                       ["c10::BFloat16", "c10::BFloat16"], ["", ""])
        x(op_cat, name, PID, TID, s + Decimal("5.5"), Decimal("80.001"),
          {ext_key: inner_ext, "Record function id": 0, "Input Dims": dims, "Input type": types,
           "Concrete Inputs": conc, "Ev Idx": len(out)})
        launch_ts = s + Decimal("20.333")
        x(rt_cat, "cudaLaunchKernel", PID, TID, launch_ts, Decimal("9.871"),
          {ext_key: inner_ext, "cbid": 211, "correlation": corr})
        k_ts = s + Decimal("40.007") + Decimal(i)
        kext = inner_ext if layout == "new" else corr  # old layouts: External id == correlation
        x(cats["kernel"], "ampere_sgemm_32x32_sliced1x4_tn" if i % 2 == 0 else "sm80_xmma_gemm_bf16bf16_bf16f32",
          dev, STREAM, k_ts, Decimal("25.312"),
          {ext_key: kext, "queued": 0, "device": dev, "context": 1, "stream": STREAM, "correlation": corr,
           "registers per thread": 90, "shared memory": 49152, "blocks per SM": 0.5925926,
           "warps per SM": 2.3703704, "grid": [64, 1, 1], "block": [128, 1, 1],
           "est. achieved occupancy %": 25})
        flow(corr, launch_ts, dev, k_ts, "cudaLaunchKernel")
        corr += 1
    dev = gpu_devices[0]
    # one memcpy and one memset per step
    s = t0 + OP_US * ops_per_step + Decimal("10.5")
    cext = ext
    ext += 1
    x(op_cat, "aten::copy_", PID, TID, s, Decimal("60.25"),
      {ext_key: cext, "Record function id": 0, "Input Dims": [[32, 64], [32, 64], []],
       "Input type": ["float", "float", "Scalar"], "Concrete Inputs": ["", "", "False"]})
    x(rt_cat, "cudaMemcpyAsync", PID, TID, s + Decimal("3.25"), Decimal("20.5"),
      {ext_key: cext, "cbid": 41, "correlation": corr})
    m_ts = s + Decimal("30.125")
    x(cats["memcpy"], "Memcpy HtoD (Pageable -> Device)", dev, STREAM, m_ts, Decimal("4.096"),
      {ext_key: cext if layout == "new" else corr, "device": dev, "context": 1, "stream": STREAM,
       "correlation": corr, "bytes": 8192, "memory bandwidth (GB/s)": 2.0})
    flow(corr, s + Decimal("3.25"), dev, m_ts, "cudaMemcpyAsync")
    corr += 1
    s = s + Decimal("70")
    x(rt_cat, "cudaMemsetAsync", PID, TID, s, Decimal("5.5"), {"cbid": 51, "correlation": corr})
    z_ts = s + Decimal("8.25")
    x(cats["memset"], "Memset (Device)", dev, STREAM, z_ts, Decimal("1.024"),
      {ext_key: 0 if layout == "new" else corr, "device": dev, "context": 1, "stream": STREAM,
       "correlation": corr, "bytes": 8, "memory bandwidth (GB/s)": 0.0078125})
    corr += 1
    # a backward op on another thread, linked forward -> backward by a fwdbwd flow (new layout)
    if layout == "new" and with_flows:
        b = s + Decimal("20")
        out.append({"ph": "s", "id": lin_ext if ops_per_step else ext, "pid": PID, "tid": TID,
                    "ts": clk.t(t0 + Decimal("10.125")), "cat": "fwdbwd", "name": "fwdbwd"})
        x(op_cat, "autograd::engine::evaluate_function: AddmmBackward0", PID, BWD_TID, b, Decimal("15"),
          {ext_key: ext, "Record function id": 0, "Sequence number": 100, "Fwd thread id": 1})
        out.append({"ph": "f", "id": lin_ext if ops_per_step else ext, "pid": PID, "tid": BWD_TID,
                    "ts": clk.t(b), "cat": "fwdbwd", "name": "fwdbwd", "bp": "e"})
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
        {"ph": "X", "cat": "Trace", "ts": t, "dur": clk.d(Decimal("20000")), "pid": "Spans",
         "tid": "PyTorch Profiler", "name": "PyTorch Profiler (0)", "args": {"Op count": 0}},
        {"name": "Iteration Start: PyTorch Profiler", "ph": "i", "s": "g", "pid": "Traces",
         "tid": "Trace PyTorch Profiler", "ts": t},
    ]
    return out


def top_metadata(layout: str = "new", device_props=True, prop_ids=(0,)) -> tuple[dict, dict]:
    """(keys Kineto writes before traceEvents, keys it writes after)."""
    before, after = {}, {}
    if layout != "oldest":
        before["schemaVersion"] = 1
        if device_props:
            before["deviceProperties"] = [{"id": i, **DEVICE_PROPS} for i in prop_ids]
        before["cupti_version"] = 18
        before["cuda_runtime_version"] = 12000
        before["record_shapes"] = 1
    before["distributedInfo"] = {"backend": "nccl", "rank": 1, "world_size": 4}
    if layout != "oldest":
        after["traceName"] = "/tmp/tmpu3g3sevh/synth.json"
        after["displayTimeUnit"] = "ms"
        after["baseTimeNanoseconds"] = 1727743122000000000
    return before, after


def make_trace(n_steps: int = 2, ops_per_step: int = 3, layout: str = "new", with_flows: bool = True,
               device_props: bool = True, metadata_after: bool = False, ns_digits: bool = False,
               gpu_devices=(0,), prop_ids=None, extra_metadata: dict | None = None,
               extra_events: list | None = None, tricky: bool = False) -> dict:
    """A synthetic Kineto trace as a dict (key order = the order `write_trace` writes).

    layout: "new" (ac2g flows, float µs), "old" (async_cpu_to_gpu flows, int µs, kernel External id
    = correlation), "oldest" (cats Kernel/Memcpy/Memset/Runtime/Operator, `external id`, async_gpu
    flows, no schemaVersion/deviceProperties). metadata_after: deviceProperties, distributedInfo and
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
            events.append({"ph": "X", "cat": "python_function", "name": TRICKY_NAME, "pid": PID, "tid": TID,
                           "ts": clk.t(STEP_US * s + Decimal("1.5")), "dur": clk.d(Decimal("2")),
                           "args": TRICKY_ARGS})
            events.append({"ph": "i", "cat": "cpu_instant_event", "name": "}, {\"", "pid": PID, "tid": TID,
                           "s": "t", "ts": clk.t(STEP_US * s + Decimal("2.5")),
                           "args": {"list": [{"k": i, "v": [{"w": "}, {"}]} for i in range(5)]}})
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


# ------------------------------------------------------------------ expectations
def ns(v) -> int | None:
    """Independent expectation: a µs value (as written in the JSON text) in integer ns."""
    if v is None:
        return None
    if type(v) is int:
        return v * 1000
    if type(v) is float:
        return int(Decimal(repr(v)) * 1000)
    if isinstance(v, Decimal):
        return int(v * 1000)
    raise TypeError(type(v))


def gpu_events(trace: dict) -> list[tuple[int, dict]]:
    return [(i, e) for i, e in enumerate(trace["traceEvents"])
            if isinstance(e, dict) and e.get("ph") == "X" and e.get("cat") in ALL_GPU_CATS]


def flow_events(trace: dict) -> list[tuple[int, dict]]:
    return [(i, e) for i, e in enumerate(trace["traceEvents"])
            if isinstance(e, dict) and e.get("ph") in ("s", "f", "t")]


def complete_events(text: str) -> list:
    """The complete traceEvents elements in a (possibly cut) document, by raw_decode (as check.py)."""
    dec, out = json.JSONDecoder(), []
    if '"traceEvents"' in text:
        pos = text.index("[", text.index('"traceEvents"')) + 1
    elif text.lstrip().startswith("["):
        pos = text.index("[") + 1
    else:
        return out
    while True:
        while pos < len(text) and text[pos] in " \t\r\n,":
            pos += 1
        if pos >= len(text) or text[pos] == "]":
            return out
        try:
            v, pos = dec.raw_decode(text, pos)
        except json.JSONDecodeError:
            return out
        out.append(v)


# ------------------------------------------------------------------ the demo: a transformer-like run
def _transformer_step(step: int, t0: float, corr0: int, rng: random.Random) -> tuple[list, float, int]:
    """One ProfilerStep of a transformer-like model: nested cpu_ops, launches, flows, kernels."""
    ev, t, corr = [], t0, corr0
    pid, tid, gpu_pid, stream = 4242, 4242, 0, 7
    step_start = t
    # (op, child op, op's Input Dims, child's Input Dims, kernel)
    layer_ops = [("aten::linear", "aten::addmm", [[512, 1024], [4096, 1024], [4096]], [[4096], [512, 1024], [1024, 4096]],
                  "sm90_xmma_gemm_bf16bf16_bf16f32"),
                 ("aten::gelu", None, [[512, 4096]], None, "void at::native::vectorized_elementwise_kernel<4, GeluCUDAKernelImpl>"),
                 ("aten::layer_norm", "aten::native_layer_norm", [[512, 1024], [], [1024], [1024]],
                  [[512, 1024], [], [1024], [1024], []], "void at::native::vectorized_layer_norm_kernel<float>"),
                 ("aten::add", None, [[512, 1024], [512, 1024], []], None, "void at::native::elementwise_kernel<128, 4, AddFunctor>")]
    for layer in range(24):
        for outer, inner, dims, inner_dims, kname in layer_ops:
            dur = rng.uniform(20, 60)
            ev.append({"ph": "X", "cat": "cpu_op", "name": outer, "pid": pid, "tid": tid, "ts": round(t, 3),
                       "dur": round(dur, 3), "args": {"External id": corr, "Record function id": 0,
                                                      "Input Dims": dims, "Input type": ["c10::BFloat16"] * len(dims),
                                                      "Input Strides": [[d[-1], 1] if len(d) == 2 else [1] * len(d) for d in dims],
                                                      "Concrete Inputs": [""] * len(dims), "Fwd thread id": 0,
                                                      "Sequence number": corr, "Ev Idx": len(ev)}})
            lt = t + 2
            if inner:
                ev.append({"ph": "X", "cat": "cpu_op", "name": inner, "pid": pid, "tid": tid, "ts": round(t + 1, 3),
                           "dur": round(dur - 2, 3), "args": {"External id": corr + 1, "Input Dims": inner_dims,
                                                              "Input type": ["c10::BFloat16"] * len(inner_dims)}})
                lt = t + 3
            ev.append({"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": pid, "tid": tid,
                       "ts": round(lt, 3), "dur": 4.25, "args": {"External id": corr, "cbid": 211, "correlation": corr}})
            ev.append({"ph": "s", "id": corr, "pid": pid, "tid": tid, "ts": round(lt, 3), "cat": "ac2g", "name": "ac2g"})
            kt = lt + rng.uniform(5, 50)
            kd = rng.uniform(3, 120)
            ev.append({"ph": "X", "cat": "kernel", "name": kname, "pid": gpu_pid, "tid": stream, "ts": round(kt, 3),
                       "dur": round(kd, 3), "args": {"External id": corr, "queued": 0, "device": 0, "context": 1,
                                                     "stream": stream, "correlation": corr, "registers per thread": 128,
                                                     "shared memory": 49152, "blocks per SM": 1.21, "warps per SM": 9.7,
                                                     "grid": [132, 1, 1], "block": [384, 1, 1],
                                                     "est. achieved occupancy %": 15}})
            ev.append({"ph": "f", "id": corr, "pid": gpu_pid, "tid": stream, "ts": round(kt, 3), "cat": "ac2g",
                       "name": "ac2g", "bp": "e"})
            t += dur + rng.uniform(1, 5)
            corr += 2
    ev.insert(0, {"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{step}", "pid": pid, "tid": tid,
                  "ts": round(step_start, 3), "dur": round(t - step_start, 3), "args": {"External id": corr0}})
    return ev, t, corr


def kineto_text(event: dict) -> bytes:
    """One event laid out the way Kineto writes it: the top-level keys on one line, args one per
    line, indented (real traces carry this whitespace, and parsing speed depends on it)."""
    pairs = lambda d, sep: sep.join(orjson.dumps(k) + b": " + orjson.dumps(v) for k, v in d.items())  # noqa: E731
    text = b"  {\n    " + pairs({k: v for k, v in event.items() if k != "args"}, b", ")
    if "args" in event:
        text += b',\n    "args": {\n      ' + pairs(event["args"], b",\n      ") + b"\n    }"
    return text + b"\n  }"


def write_demo(path: Path, target_mb: float, seed: int = 0):
    """Write a trace of about target_mb MB (gzip-compressed when the name ends in .gz)."""
    rng = random.Random(seed)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    head = {"schemaVersion": 1, "deviceProperties": [{"id": 0, "name": "NVIDIA H100 80GB HBM3",
            "totalGlobalMem": 85018279936, "computeMajor": 9, "computeMinor": 0, "numSms": 132}],
            "distributedInfo": {"backend": "nccl", "rank": 0, "world_size": 8}}
    with (gzip.open if path.name.endswith(".gz") else open)(path, "wb") as f:
        f.write(json.dumps(head)[:-1].encode() + b', "traceEvents": [\n')
        written, step, t, corr, first = 0, 0, 1_712_000_000_000.0, 1, True
        while written < target_mb * 1e6:
            evs, t, corr = _transformer_step(step, t, corr, rng)
            blob = b",\n".join(map(kineto_text, evs))
            f.write(blob if first else b",\n" + blob)
            first = False
            written += len(blob)
            step += 1
        f.write(b'\n], "traceName": "bench", "baseTimeNanoseconds": 1700000000000000000}\n')




# ------------------------------------------------------------------ runs of many ranks
RUN_KINDS = (("allreduce", "ncclDevKernel_AllReduce_Sum_bf16_RING_LL", 1 << 22),
             ("allgather", "ncclDevKernel_AllGather_RING_LL", 1 << 18),
             ("reduce_scatter", "ncclDevKernel_ReduceScatter_Sum_bf16_RING_LL", 1 << 20))


def run_rank_events(rank: int, world: int, collectives: int, per_step: int = 8, straggler: int | None = None,
                    delay_us: float = 0.0, delayed: int = -1, offset_us: float = 0.0) -> Iterator[dict]:
    """The events of one rank of a synthetic NCCL run (see `write_run`), in start order per thread."""
    pid, gpu, stream = 1000 + rank, rank, 17
    t = 1_000_000.0 + offset_us  # µs on this rank's clock
    corr = ext = 1
    for i in range(collectives):
        if i % per_step == 0:
            yield {"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{i // per_step}", "pid": pid, "tid": pid,
                   "ts": round(t, 3), "dur": round(per_step * 110.0 + (delay_us if i <= delayed < i + per_step else 0), 3),
                   "args": {"External id": ext}}
        kind, kname, nelems = RUN_KINDS[i % len(RUN_KINDS)]
        late = delay_us if (rank == straggler and i == delayed) else 0.0
        waits = delay_us if (rank != straggler and i == delayed) else 0.0
        out = nelems * world if kind == "allgather" else nelems // world if kind == "reduce_scatter" else nelems
        args = {"Collective name": kind, "In msg nelems": nelems, "Out msg nelems": out, "Group size": world,
                "dtype": "BFloat16", "Process Group Name": "0", "Process Group Description": "default_pg",
                "Process Group Ranks": str(list(range(world)))}
        launch = t + 5.0 + late
        yield {"ph": "X", "cat": "cpu_op", "name": "record_param_comms", "pid": pid, "tid": pid, "ts": round(t + late, 3),
               "dur": 20.0, "args": {"External id": ext, **args}}
        yield {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": pid, "tid": pid,
               "ts": round(launch, 3), "dur": 4.0, "args": {"correlation": corr, "External id": ext}}
        yield {"ph": "X", "cat": "kernel", "name": "sm90_gemm_bf16", "pid": gpu, "tid": 7, "ts": round(t + 30.0, 3),
               "dur": 40.0, "args": {"device": gpu, "stream": 7, "correlation": corr + 1, "External id": ext}}
        yield {"ph": "X", "cat": "kernel", "name": kname, "pid": gpu, "tid": stream, "ts": round(launch + 15.0, 3),
               "dur": round(50.0 + waits, 3), "args": {"device": gpu, "stream": stream, "correlation": corr,
                                                      "External id": ext, **args}}
        t += 110.0 + (delay_us if i == delayed else 0.0)
        corr += 2
        ext += 1


def write_run(out_dir: Path, world: int, collectives: int, straggler: int | None = None, delay_us: float = 0.0,
              delayed: int = -1, offsets_us: list[float] | None = None, per_step: int = 8) -> dict:
    """Write a synthetic NCCL run of `world` ranks (OUT/rank-R.json.gz), each with `collectives`
    allreduce/allgather/reducescatter kernels (launched by record_param_comms, beside a compute
    kernel each) and a ProfilerStep every `per_step`. The physics of a late rank: `straggler`
    starts collective `delayed` `delay_us` late; every other rank's kernel lasts that much longer,
    and everything after shifts on every rank. `offsets_us[r]` is added to rank r's clock.
    Returns the truth: {world_size, straggler, delay_us, delayed, offsets_us}."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    offsets = offsets_us or [0.0] * world
    for r in range(world):
        head = {"schemaVersion": 1, "distributedInfo": {"backend": "nccl", "rank": r, "world_size": world},
                "deviceProperties": [{"id": r, "name": "NVIDIA H100 80GB HBM3", "totalGlobalMem": 85018279936,
                                      "computeMajor": 9, "computeMinor": 0, "numSms": 132}]}
        with gzip.open(out_dir / f"rank-{r}.json.gz", "wb", compresslevel=1) as f:
            f.write(orjson.dumps(head)[:-1] + b',"traceEvents":[')
            first = True
            for e in run_rank_events(r, world, collectives, per_step, straggler, delay_us, delayed, offsets[r]):
                f.write((b"" if first else b",") + orjson.dumps(e))
                first = False
            f.write(b"]}")
    return {"world_size": world, "straggler": straggler, "delay_us": delay_us, "delayed": delayed,
            "offsets_us": offsets}
