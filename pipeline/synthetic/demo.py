"""demo: a transformer-like training run on an H100 of any size (`write_demo`), laid out with the
whitespace Kineto writes: the bundled demo trace and the benchmark's template."""

from __future__ import annotations

import gzip
import json
import random
from pathlib import Path

import orjson


def _transformer_step(
    step: int, t0: float, corr0: int, rng: random.Random, gpu_free: float = 0.0
) -> tuple[list, float, int, float]:
    """One ProfilerStep of a transformer-like model: nested cpu_ops, launches, flows, kernels."""
    ev: list[dict] = []
    t, corr = t0, corr0
    pid, tid, gpu_pid, stream = 4242, 4242, 0, 7
    step_start = t
    # (op, child op, op's Input Dims, child's Input Dims, kernel)
    layer_ops = [
        (
            "aten::linear",
            "aten::addmm",
            [[512, 1024], [4096, 1024], [4096]],
            [[4096], [512, 1024], [1024, 4096]],
            "sm90_xmma_gemm_bf16bf16_bf16f32",
        ),
        (
            "aten::gelu",
            None,
            [[512, 4096]],
            None,
            "void at::native::vectorized_elementwise_kernel<4, GeluCUDAKernelImpl>",
        ),
        (
            "aten::layer_norm",
            "aten::native_layer_norm",
            [[512, 1024], [], [1024], [1024]],
            [[512, 1024], [], [1024], [1024], []],
            "void at::native::vectorized_layer_norm_kernel<float>",
        ),
        (
            "aten::add",
            None,
            [[512, 1024], [512, 1024], []],
            None,
            "void at::native::elementwise_kernel<128, 4, AddFunctor>",
        ),
    ]
    for _layer in range(24):
        for outer, inner, dims, inner_dims, kname in layer_ops:
            dur = rng.uniform(20, 60)
            ev.append(
                {
                    "ph": "X",
                    "cat": "cpu_op",
                    "name": outer,
                    "pid": pid,
                    "tid": tid,
                    "ts": round(t, 3),
                    "dur": round(dur, 3),
                    "args": {
                        "External id": corr,
                        "Record function id": 0,
                        "Input Dims": dims,
                        "Input type": ["c10::BFloat16"] * len(dims),
                        "Input Strides": [[d[-1], 1] if len(d) == 2 else [1] * len(d) for d in dims],
                        "Concrete Inputs": [""] * len(dims),
                        "Fwd thread id": 0,
                        "Sequence number": corr,
                        "Ev Idx": len(ev),
                    },
                }
            )
            lt = t + 2
            if inner:
                assert inner_dims is not None  # an op with a child op has the child's Input Dims
                ev.append(
                    {
                        "ph": "X",
                        "cat": "cpu_op",
                        "name": inner,
                        "pid": pid,
                        "tid": tid,
                        "ts": round(t + 1, 3),
                        "dur": round(dur - 2, 3),
                        "args": {
                            "External id": corr + 1,
                            "Input Dims": inner_dims,
                            "Input type": ["c10::BFloat16"] * len(inner_dims),
                        },
                    }
                )
                lt = t + 3
            ev.append(
                {
                    "ph": "X",
                    "cat": "cuda_runtime",
                    "name": "cudaLaunchKernel",
                    "pid": pid,
                    "tid": tid,
                    "ts": round(lt, 3),
                    "dur": 4.25,
                    "args": {"External id": corr, "cbid": 211, "correlation": corr},
                }
            )
            ev.append(
                {"ph": "s", "id": corr, "pid": pid, "tid": tid, "ts": round(lt, 3), "cat": "ac2g", "name": "ac2g"}
            )
            kt = max(lt + rng.uniform(5, 50), gpu_free)  # a stream runs one kernel at a time
            kd = rng.uniform(3, 50)
            gpu_free = round(kt, 3) + round(kd, 3)
            ev.append(
                {
                    "ph": "X",
                    "cat": "kernel",
                    "name": kname,
                    "pid": gpu_pid,
                    "tid": stream,
                    "ts": round(kt, 3),
                    "dur": round(kd, 3),
                    "args": {
                        "External id": corr,
                        "queued": 0,
                        "device": 0,
                        "context": 1,
                        "stream": stream,
                        "correlation": corr,
                        "registers per thread": 128,
                        "shared memory": 49152,
                        "blocks per SM": 1.21,
                        "warps per SM": 9.7,
                        "grid": [132, 1, 1],
                        "block": [384, 1, 1],
                        "est. achieved occupancy %": 15,
                    },
                }
            )
            ev.append(
                {
                    "ph": "f",
                    "id": corr,
                    "pid": gpu_pid,
                    "tid": stream,
                    "ts": round(kt, 3),
                    "cat": "ac2g",
                    "name": "ac2g",
                    "bp": "e",
                }
            )
            t += dur + rng.uniform(1, 5)
            corr += 2
    ev.insert(
        0,
        {
            "ph": "X",
            "cat": "user_annotation",
            "name": f"ProfilerStep#{step}",
            "pid": pid,
            "tid": tid,
            "ts": round(step_start, 3),
            "dur": round(t - step_start, 3),
            "args": {"External id": corr0},
        },
    )
    return ev, t, corr, gpu_free


def kineto_text(event: dict) -> bytes:
    """One event laid out the way Kineto writes it: the top-level keys on one line, args one per
    line, indented (real traces carry this whitespace, and parsing speed depends on it)."""
    pairs = lambda d, sep: sep.join(orjson.dumps(k) + b": " + orjson.dumps(v) for k, v in d.items())
    text = b"  {\n    " + pairs({k: v for k, v in event.items() if k != "args"}, b", ")
    if "args" in event:
        text += b',\n    "args": {\n      ' + pairs(event["args"], b",\n      ") + b"\n    }"
    return text + b"\n  }"


def write_demo(path: Path, target_mb: float, seed: int = 0):
    """Write a trace of about target_mb MB (gzip-compressed when the name ends in .gz)."""
    rng = random.Random(seed)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    head = {
        "schemaVersion": 1,
        "deviceProperties": [
            {
                "id": 0,
                "name": "NVIDIA H100 80GB HBM3",
                "totalGlobalMem": 85018279936,
                "computeMajor": 9,
                "computeMinor": 0,
                "numSms": 132,
            }
        ],
        "distributedInfo": {"backend": "nccl", "rank": 0, "world_size": 8},
    }
    with (gzip.open if path.name.endswith(".gz") else open)(path, "wb") as f:
        f.write(json.dumps(head)[:-1].encode() + b', "traceEvents": [\n')
        written, step, t, corr, first, gpu_free = 0, 0, 1_712_000_000_000.0, 1, True, 0.0
        while written < target_mb * 1e6:
            evs, t, corr, gpu_free = _transformer_step(step, t, corr, rng, gpu_free)
            blob = b",\n".join(map(kineto_text, evs))
            f.write(blob if first else b",\n" + blob)
            first = False
            written += len(blob)
            step += 1
        f.write(b'\n], "traceName": "bench", "baseTimeNanoseconds": 1700000000000000000}\n')
