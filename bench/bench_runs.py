"""Whole runs at scale (part of `make bench`; `python bench/bench_runs.py [--worlds 256,1024]`).

For each world size, a synthetic NCCL run of that many ranks, 10,000 collectives each (one rank late
at one collective, clocks off by up to 2 ms; `pipeline.synthetic.write_run`), then, each in a fresh
process, wall time and peak memory of all its processes (summed PSS):

- `ranks RUN_DIR` with an empty cache: the first look (every trace read once, in parallel, kept);
- `ranks RUN_DIR` with its cache filled: the whole-run analysis alone (the Extracts read a window
  of collectives at a time), and its time per collective call (linear in ranks x collectives);
- for the first world size: `batch` of the run into a dataset, its JSON MB/s against `flatten` of
  one trace of about the same bytes, then `ranks DATASET`.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import orjson

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench import measure
from pipeline.read.stream import json_bytes_estimate
from pipeline.synthetic import write_demo
from pipeline.synthetic.runs import write_rank

COLLECTIVES = 10_000


def _offset(r: int) -> float:
    return ((r * 7919) % 4001 - 2000) / 1.0


def write(src: Path, world: int, jobs: int) -> None:
    if (src / f"rank-{world - 1}.json.gz").exists():
        return
    print(f"bench: writing {src} ...", file=sys.stderr)
    src.mkdir(parents=True, exist_ok=True)
    with ProcessPoolExecutor(jobs) as pool:
        list(
            pool.map(
                write_rank,
                [src] * world,
                range(world),
                [world] * world,
                [COLLECTIVES] * world,
                [world // 3] * world,
                [5000.0] * world,
                [COLLECTIVES // 2] * world,
                [_offset(r) for r in range(world)],
                chunksize=8,
            )
        )


def tp(*args: str) -> list[str]:
    return [sys.executable, "-m", "pipeline", *args]


def one_world(work: Path, world: int, jobs: int, with_batch: bool) -> list[str]:
    src = work / f"run_{world}x{COLLECTIVES}"
    write(src, world, jobs)
    json_mb = sum(json_bytes_estimate(str(p)) for p in src.iterdir()) / 1e6
    calls = world * COLLECTIVES
    env = {"TRACEPIPE_CACHE_DIR": str(work / "cache")}
    out = work / "ranks.json"
    shutil.rmtree(work / "cache", ignore_errors=True)
    ranks = tp("ranks", str(src), "--format", "json", "-o", str(out), "-j", str(jobs))
    t1, m1, _ = measure(ranks, env)  # the first look: every trace read, its Extract kept
    t2, m2, _ = measure(ranks, env)  # the cache filled: the whole-run analysis alone
    doc = orjson.loads(out.read_bytes())["runs"][0]
    lines = [
        f"ranks, {world:,} ranks x {COLLECTIVES:,} collectives ({json_mb:,.0f} MB of JSON): first look {t1:.1f}s "
        f"({json_mb / t1:.0f} MB/s), peak {m1:.0f} MB; cached {t2:.1f}s = {t2 / calls * 1e9:.0f} ns per call, "
        f"peak {m2:.0f} MB (all processes); straggler {doc['stragglers'][0]['rank']} (truly {world // 3}), "
        f"{len(doc['collectives']):,} collectives"
    ]
    if with_batch:
        ds = work / f"run_{world}_ds"
        shutil.rmtree(ds, ignore_errors=True)
        tb, mb, _ = measure([*tp("batch", str(src), "-o", str(ds), "-j", str(jobs), "-q")])
        one = work / f"one_{json_mb:.0f}mb.json"
        if not one.exists():
            write_demo(one, json_mb)
        shutil.rmtree(work / "one_flat", ignore_errors=True)
        tf, mf, _ = measure([*tp("flatten", str(one), "-o", str(work / "one_flat"))])
        td, md, _ = measure([*tp("ranks", str(ds), "--format", "json", "-o", str(out))])
        lines.append(
            f"batch of that run: {tb:.1f}s = {json_mb / tb:.1f} MB/s of JSON, peak {mb:.0f} MB; flatten of one "
            f"{json_mb:,.0f} MB trace {tf:.1f}s = {json_mb / tf:.1f} MB/s (batch at {tf / tb:.2f}x its rate per byte); "
            f"ranks of the dataset {td:.1f}s, peak {md:.0f} MB"
        )
    return lines


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--worlds", default="256,1024", help="ranks of each run, comma-separated")
    ap.add_argument("-j", "--jobs", type=int, default=os.cpu_count() or 2)
    ap.add_argument("--workdir", default="/tmp/tracepipe-bench")
    a = ap.parse_args()
    work = Path(a.workdir)
    work.mkdir(parents=True, exist_ok=True)
    for i, world in enumerate(int(w) for w in a.worlds.split(",")):
        for line in one_world(work, world, a.jobs, with_batch=i == 0):
            print(line, flush=True)


if __name__ == "__main__":
    main()
