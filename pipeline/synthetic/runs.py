"""runs: a synthetic NCCL run of many ranks with known physics (`write_run`): one rank late at one
collective, every rank's clock off by a known offset (the truth `tracepipe ranks` must find)."""

from __future__ import annotations

import gzip
from collections.abc import Iterator
from pathlib import Path

import orjson

RUN_KINDS = (
    ("allreduce", "ncclDevKernel_AllReduce_Sum_bf16_RING_LL", 1 << 22),
    ("allgather", "ncclDevKernel_AllGather_RING_LL", 1 << 18),
    ("reduce_scatter", "ncclDevKernel_ReduceScatter_Sum_bf16_RING_LL", 1 << 20),
)


def run_rank_events(
    rank: int,
    world: int,
    collectives: int,
    per_step: int = 8,
    straggler: int | None = None,
    delay_us: float = 0.0,
    delayed: int = -1,
    offset_us: float = 0.0,
) -> Iterator[dict]:
    """The events of one rank of a synthetic NCCL run (see `write_run`), in start order per thread."""
    pid, gpu, stream = 1000 + rank, rank, 17
    t = 1_000_000.0 + offset_us  # µs on this rank's clock
    corr = ext = 1
    for i in range(collectives):
        if i % per_step == 0:
            yield {
                "ph": "X",
                "cat": "user_annotation",
                "name": f"ProfilerStep#{i // per_step}",
                "pid": pid,
                "tid": pid,
                "ts": round(t, 3),
                "dur": round(per_step * 110.0 + (delay_us if i <= delayed < i + per_step else 0), 3),
                "args": {"External id": ext},
            }
        kind, kname, nelems = RUN_KINDS[i % len(RUN_KINDS)]
        late = delay_us if (rank == straggler and i == delayed) else 0.0
        waits = delay_us if (rank != straggler and i == delayed) else 0.0
        out = nelems * world if kind == "allgather" else nelems // world if kind == "reduce_scatter" else nelems
        args = {
            "Collective name": kind,
            "In msg nelems": nelems,
            "Out msg nelems": out,
            "Group size": world,
            "dtype": "BFloat16",
            "Process Group Name": "0",
            "Process Group Description": "default_pg",
            "Process Group Ranks": str(list(range(world))),
        }
        launch = t + 5.0 + late
        yield {
            "ph": "X",
            "cat": "cpu_op",
            "name": "record_param_comms",
            "pid": pid,
            "tid": pid,
            "ts": round(t + late, 3),
            "dur": 20.0,
            "args": {"External id": ext, **args},
        }
        yield {
            "ph": "X",
            "cat": "cuda_runtime",
            "name": "cudaLaunchKernel",
            "pid": pid,
            "tid": pid,
            "ts": round(launch, 3),
            "dur": 4.0,
            "args": {"correlation": corr, "External id": ext},
        }
        yield {
            "ph": "X",
            "cat": "kernel",
            "name": "sm90_gemm_bf16",
            "pid": gpu,
            "tid": 7,
            "ts": round(t + 30.0, 3),
            "dur": 40.0,
            "args": {"device": gpu, "stream": 7, "correlation": corr + 1, "External id": ext},
        }
        yield {
            "ph": "X",
            "cat": "kernel",
            "name": kname,
            "pid": gpu,
            "tid": stream,
            "ts": round(launch + 15.0, 3),
            "dur": round(50.0 + waits, 3),
            "args": {"device": gpu, "stream": stream, "correlation": corr, "External id": ext, **args},
        }
        t += 110.0 + (delay_us if i == delayed else 0.0)
        corr += 2
        ext += 1


def write_rank(
    out_dir: Path,
    rank: int,
    world: int,
    collectives: int,
    straggler: int | None = None,
    delay_us: float = 0.0,
    delayed: int = -1,
    offset_us: float = 0.0,
    per_step: int = 8,
) -> Path:
    """Write rank `rank` of a synthetic NCCL run (`write_run`) as OUT/rank-R.json.gz."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    head = {
        "schemaVersion": 1,
        "distributedInfo": {"backend": "nccl", "rank": rank, "world_size": world},
        "deviceProperties": [
            {
                "id": rank,
                "name": "NVIDIA H100 80GB HBM3",
                "totalGlobalMem": 85018279936,
                "computeMajor": 9,
                "computeMinor": 0,
                "numSms": 132,
            }
        ],
    }
    path = out_dir / f"rank-{rank}.json.gz"
    with gzip.open(path, "wb", compresslevel=1) as f:
        f.write(orjson.dumps(head)[:-1] + b',"traceEvents":[')
        first = True
        for e in run_rank_events(rank, world, collectives, per_step, straggler, delay_us, delayed, offset_us):
            f.write((b"" if first else b",") + orjson.dumps(e))
            first = False
        f.write(b"]}")
    return path


def write_run(
    out_dir: Path,
    world: int,
    collectives: int,
    straggler: int | None = None,
    delay_us: float = 0.0,
    delayed: int = -1,
    offsets_us: list[float] | None = None,
    per_step: int = 8,
) -> dict:
    """Write a synthetic NCCL run of `world` ranks (OUT/rank-R.json.gz), each with `collectives`
    allreduce/allgather/reducescatter kernels (launched by record_param_comms, beside a compute
    kernel each) and a ProfilerStep every `per_step`. The physics of a late rank: `straggler`
    starts collective `delayed` `delay_us` late; every other rank's kernel lasts that much longer,
    and everything after shifts on every rank. `offsets_us[r]` is added to rank r's clock.
    Returns the truth: {world_size, straggler, delay_us, delayed, offsets_us}."""
    offsets = offsets_us or [0.0] * world
    for r in range(world):
        write_rank(out_dir, r, world, collectives, straggler, delay_us, delayed, offsets[r], per_step)
    return {
        "world_size": world,
        "straggler": straggler,
        "delay_us": delay_us,
        "delayed": delayed,
        "offsets_us": offsets,
    }
