"""Whole runs at scale (part of `make bench`; `python bench/bench_runs.py [--worlds 256] [--extracts 256,1024]`).

For each world size, a synthetic NCCL run of that many ranks, 10,000 collectives each (one rank late
at one collective, clocks off by up to 2 ms; `pipeline.synthetic.write_run`), then, each in a fresh
process, wall time and peak memory of all its processes (summed PSS):

- `ranks RUN_DIR` with an empty cache: the first look (every trace read once, in parallel, kept);
- `ranks RUN_DIR` with its cache filled: the whole-run analysis alone (the Extracts read a window
  of collectives at a time), and its time per collective call (linear in ranks x collectives);
- for the first world size: `batch` of the run into a dataset, its JSON MB/s against `flatten` of
  one trace of the same events (LIKE_RANKS ranks' collectives in one file), then `ranks DATASET`.
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
from pipeline.synthetic.runs import write_rank

COLLECTIVES = 10_000
LIKE_RANKS = 32  # batch's baseline: flatten of one trace holding this many ranks' worth of collectives


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


def write_extracts(src: Path, cache_dir: Path, world: int) -> None:
    """A run of `world` ranks x COLLECTIVES as the cache holds it (the Extracts the streaming pass
    would keep, with write_run's physics), beside placeholder trace files of the sizes and times
    they record: `ranks` of it measures the whole-run analysis alone, at a size whose traces would
    take hours to write and read here."""
    import numpy as np

    from pipeline.files import folder_cache
    from pipeline.runs.calls import KIND_CODE, Extract, steps_of_rows
    from pipeline.runs.scan import cache

    if (src / f"rank-{world - 1}.json").exists():
        return
    print(f"bench: writing {src} (Extracts) ...", file=sys.stderr)
    src.mkdir(parents=True, exist_ok=True)
    store = folder_cache(src)
    n = COLLECTIVES
    i = np.arange(n)
    kinds = np.array([KIND_CODE[k] for k in ("allreduce", "allgather", "reducescatter")], np.int8)[i % 3]
    size = np.array([(1 << 22) * 2, (1 << 18) * world * 2, (1 << 20) * 2], np.int64)[i % 3]
    delayed, late = n // 2, 5000.0
    names = [f"ProfilerStep#{k}" for k in range(n // 8)]
    key = ",".join(map(str, range(world))) + "#0"
    for r in range(world):
        path = src / f"rank-{r}.json"
        path.write_text('{"traceEvents": []}')
        st = path.stat()
        t = 1e9 + _offset(r) * 1e3 + i * 110e3 + np.where(i > delayed, late * 1e3, 0)
        start = t + 20e3 + np.where((i == delayed) & (r == world // 3), late * 1e3, 0)
        dur = 50e3 + np.where((i == delayed) & (r != world // 3), late * 1e3, 0)
        calls = {
            "pg": np.zeros(n, np.int32),
            "seq": i.astype(np.int64),
            "kind": kinds,
            "bytes": size,
            "dtype": np.zeros(n, np.int32),
            "pg_size": np.full(n, world, np.int64),
            "ts": start.astype(np.int64),
            "dur": dur.astype(np.int64),
            "step": (i // 8).astype(np.int32),
        }
        steps = [
            (names[k], int(t[8 * k]), int(t[8 * k] + 880e3), 0, 720_000, 320_000, 400_000, 400_000)
            for k in range(n // 8)
        ]
        step_cols, step_names = steps_of_rows(steps, names)
        info = {
            "source": str(path), "stem": f"rank-{r}", "size": st.st_size, "mtime_ns": st.st_mtime_ns, "status": "ok",
            "reason": None, "rank": r, "rank_from": "distributedInfo", "world_size": world, "n_collectives": n,
            "problems": {}, "pgs": [{"key": key, "name": "0", "ranks": None, "desc": None, "offset": 0, "n": n}],
            "dtypes": ["bf16"], "steps": step_names,
        }  # fmt: skip
        cache.write(cache.entry(store, str(path)), Extract(info, calls, step_cols))


def tp(*args: str) -> list[str]:
    return [sys.executable, "-m", "pipeline", *args]


def one_world(work: Path, world: int, jobs: int, with_batch: bool) -> None:
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
    print(
        f"ranks, {world:,} ranks x {COLLECTIVES:,} collectives ({json_mb:,.0f} MB of JSON): first look {t1:.1f}s "
        f"({json_mb / t1:.0f} MB/s), peak {m1:.0f} MB; cached {t2:.1f}s = {t2 / calls * 1e9:.0f} ns per call, "
        f"peak {m2:.0f} MB (all processes); straggler {doc['stragglers'][0]['rank']} (truly {world // 3}), "
        f"{len(doc['collectives']):,} collectives",
        flush=True,
    )
    if with_batch:
        ds = work / f"run_{world}_ds"
        shutil.rmtree(ds, ignore_errors=True)
        tb, mb, _ = measure([*tp("batch", str(src), "-o", str(ds), "-j", str(jobs), "-q")])
        # the baseline: one trace of the same events (a rank of LIKE_RANKS ranks' collectives), so that
        # both rates are per byte of the same kind of JSON (these traces are collective-dense)
        one = work / f"one_like_{world}" / "rank-0.json.gz"
        if not one.exists():
            n = COLLECTIVES * LIKE_RANKS
            write_rank(one.parent, 0, world, n, world // 3, 5000.0, n // 2)
        one_mb = json_bytes_estimate(str(one)) / 1e6
        shutil.rmtree(work / "one_flat", ignore_errors=True)
        tf, mf, _ = measure([*tp("flatten", str(one), "-o", str(work / "one_flat"))])
        td, md, _ = measure([*tp("ranks", str(ds), "--format", "json", "-o", str(out))])
        print(
            f"batch of that run: {tb:.1f}s = {json_mb / tb:.1f} MB/s of JSON, peak {mb:.0f} MB; flatten of one "
            f"{one_mb:,.0f} MB trace of the same events {tf:.1f}s = {one_mb / tf:.1f} MB/s, peak {mf:.0f} MB "
            f"(batch at {json_mb / tb / (one_mb / tf):.2f}x its rate per byte); "
            f"ranks of the dataset {td:.1f}s, peak {md:.0f} MB",
            flush=True,
        )


def extracts_world(work: Path, world: int) -> str:
    src = work / f"extracts_{world}x{COLLECTIVES}"
    env = {"TRACEPIPE_CACHE_DIR": str(work / "cache_extracts")}
    os.environ.update(env)
    write_extracts(src, work / "cache_extracts", world)
    out = work / "ranks_extracts.json"
    t, m, _ = measure(tp("ranks", str(src), "--format", "json", "-o", str(out)), env)
    doc = orjson.loads(out.read_bytes())["runs"][0]
    calls = world * COLLECTIVES
    return (
        f"ranks, {world:,} ranks x {COLLECTIVES:,} collectives (the whole-run analysis, from generated Extracts): "
        f"{t:.1f}s = {t / calls * 1e9:.0f} ns per call, peak {m:.0f} MB (all processes); straggler "
        f"{doc['stragglers'][0]['rank']} (truly {world // 3}), {len(doc['collectives']):,} collectives"
    )


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    # 256 only by default: a run of 1,024 ranks is 35 GB of JSON, over an hour to write and read on
    # two cores (the 1,024-rank analysis is measured from generated Extracts, `--extracts`)
    ap.add_argument("--worlds", default="256", help="ranks of each run read from JSON, comma-separated")
    ap.add_argument("-j", "--jobs", type=int, default=os.cpu_count() or 2)
    ap.add_argument("--workdir", default="/tmp/tracepipe-bench")
    ap.add_argument("--no-batch", action="store_true", help="skip batch (and ranks of its dataset)")
    ap.add_argument("--extracts", default="256,1024", help="ranks of runs measured from generated Extracts")
    a = ap.parse_args()
    work = Path(a.workdir)
    work.mkdir(parents=True, exist_ok=True)
    for world in (int(w) for w in a.extracts.split(",") if w):
        print(extracts_world(work, world), flush=True)
    for i, world in enumerate(int(w) for w in a.worlds.split(",") if w):
        one_world(work, world, a.jobs, with_batch=i == 0 and not a.no_batch)


if __name__ == "__main__":
    main()
