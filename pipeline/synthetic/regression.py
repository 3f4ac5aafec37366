"""regression: runs of one synthetic training job repeated over time, with known performance
changes and realistic noise (`write_runs`): the truth `tracepipe compare` and `trend` must find.

Each run has `world` rank traces (RUN/rank-R.json.gz) of `steps` ProfilerSteps; each step launches
`kernels` kinds of kernel (`kernel_NN`, under op `aten::op_NN`, between 2 and 40 instances each,
means from 5 to 400 µs) and one NCCL allreduce of 8 MiB. Durations carry the noise of repeated
runs: per rank and kernel a systematic factor exp(N(0, rank_sd)), per instance exp(N(0,
instance_sd)), per run exp(N(0, run_sd)) on every kernel (the machine of the day). A change is
(kernel index, factor) from a given run on. `baseTimeNanoseconds` grows a day per run, so the
runs' time order is their order.
"""

from __future__ import annotations

import gzip
import math
import random
from pathlib import Path

import orjson

DAY_NS = 86_400 * 10**9
START_NS = 1_700_000_000 * 10**9  # 2023-11-14


def _launch(pid: int, tid: int, ts: float, corr: int, ext: int) -> dict:
    """A cudaLaunchKernel call of 4 µs at `ts`."""
    return {
        "ph": "X",
        "cat": "cuda_runtime",
        "name": "cudaLaunchKernel",
        "pid": pid,
        "tid": tid,
        "ts": round(ts, 3),
        "dur": 4.0,
        "args": {"correlation": corr, "External id": ext},
    }


def kernel_name(i: int) -> str:
    return f"void kernel_{i:02d}<float, 128>(float const*, float*, int)"


def _kinds(kernels: int) -> list[tuple[str, str, int, float]]:
    """(kernel name, op name, instances per step, mean µs) of each kernel kind (fixed by index)."""
    rng = random.Random(12345)
    return [(kernel_name(i), f"aten::op_{i:02d}", rng.randint(2, 40), rng.uniform(5, 400)) for i in range(kernels)]


def rank_trace(
    run: int,
    rank: int,
    world: int,
    steps: int,
    kernels: int,
    changes: dict[int, float],
    rank_sd: float,
    instance_sd: float,
    run_factor: float,
    seed: int,
) -> dict:
    """The trace document of one rank of one run (see the module docstring)."""
    rng = random.Random(seed * 1_000_003 + run * 1009 + rank)
    system = [math.exp(rng.gauss(0, rank_sd)) for _ in range(kernels)]
    pid, tid, stream = 100 + rank, 100 + rank, 7
    t, corr, ext = 1_000.0, 1, 1
    events: list[dict] = []
    for s in range(steps):
        step_start = t
        step_events: list[dict] = []
        gpu_t = t + 20.0
        for k, (kname, op, n, mean) in enumerate(_kinds(kernels)):
            for _ in range(n):
                dur = mean * system[k] * run_factor * math.exp(rng.gauss(0, instance_sd)) * changes.get(k, 1.0)
                step_events.append(
                    {
                        "ph": "X",
                        "cat": "cpu_op",
                        "name": op,
                        "pid": pid,
                        "tid": tid,
                        "ts": round(t, 3),
                        "dur": 6.0,
                        "args": {"External id": ext},
                    }
                )
                step_events.append(_launch(pid, tid, t + 1.0, corr, ext))
                gpu_t = max(gpu_t, t + 8.0)
                step_events.append(
                    {
                        "ph": "X",
                        "cat": "kernel",
                        "name": kname,
                        "pid": rank,
                        "tid": stream,
                        "ts": round(gpu_t, 3),
                        "dur": round(dur, 3),
                        "args": {"device": rank, "stream": stream, "correlation": corr, "External id": ext},
                    }
                )
                gpu_t += dur + 2.0
                t += 7.0
                corr += 1
                ext += 1
        nelems = 1 << 21
        comm = {
            "Collective name": "allreduce",
            "In msg nelems": nelems,
            "Out msg nelems": nelems,
            "Group size": world,
            "dtype": "Float",
            "Process Group Name": "0",
            "Process Group Description": "default_pg",
            "Process Group Ranks": str(list(range(world))),
        }
        step_events.append(_launch(pid, tid, t, corr, ext))
        lat = 300.0 * run_factor * math.exp(rng.gauss(0, instance_sd))
        step_events.append(
            {
                "ph": "X",
                "cat": "kernel",
                "name": "ncclDevKernel_AllReduce_Sum_f32_RING_LL",
                "pid": rank,
                "tid": 9,
                "ts": round(max(gpu_t, t + 8.0), 3),
                "dur": round(lat, 3),
                "args": {"device": rank, "stream": 9, "correlation": corr, "External id": ext, **comm},
            }
        )
        corr += 1
        ext += 1
        t = max(t + 20.0, gpu_t + lat + 20.0)
        events.append(
            {
                "ph": "X",
                "cat": "user_annotation",
                "name": f"ProfilerStep#{s}",
                "pid": pid,
                "tid": tid,
                "ts": round(step_start, 3),
                "dur": round(t - step_start, 3),
                "args": {"External id": ext},
            }
        )
        ext += 1
        events += step_events
        t += 5.0
    return {
        "schemaVersion": 1,
        "baseTimeNanoseconds": START_NS + run * DAY_NS,
        "distributedInfo": {"backend": "nccl", "rank": rank, "world_size": world},
        "deviceProperties": [{"id": rank, "name": "NVIDIA H100 80GB HBM3", "totalGlobalMem": 85018279936,
                              "computeMajor": 9, "computeMinor": 0, "numSms": 132}],
        "traceEvents": events,
    }  # fmt: skip


def write_runs(
    out_dir: Path,
    runs: int = 3,
    world: int = 4,
    steps: int = 3,
    kernels: int = 30,
    changes: dict[int, tuple[int, float]] | None = None,
    rank_sd: float = 0.04,
    instance_sd: float = 0.08,
    run_sd: float = 0.0,
    seed: int = 0,
    names: list[str] | None = None,
) -> dict:
    """Write `runs` runs (OUT/<name>/rank-R.json.gz; names run00, run01, ... unless given).
    `changes`: kernel index -> (first run changed, factor). Returns the truth: {"runs": [names],
    "changed": {kernel name: {"from": run name, "factor": f}}}."""
    out_dir = Path(out_dir)
    names = names or [f"run{i:02d}" for i in range(runs)]
    changes = changes or {}
    day = random.Random(seed)
    for r, name in enumerate(names):
        run_factor = math.exp(day.gauss(0, run_sd)) if run_sd else 1.0
        active = {k: f for k, (first, f) in changes.items() if r >= first}
        (out_dir / name).mkdir(parents=True, exist_ok=True)
        for rank in range(world):
            doc = rank_trace(r, rank, world, steps, kernels, active, rank_sd, instance_sd, run_factor, seed)
            with gzip.open(out_dir / name / f"rank-{rank}.json.gz", "wb", compresslevel=1) as f:
                f.write(orjson.dumps(doc))
    changed = {kernel_name(k): {"from": names[first], "factor": f} for k, (first, f) in changes.items()}
    return {"runs": names, "changed": changed}
