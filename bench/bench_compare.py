"""make bench (runs over time): `tracepipe compare` of two runs and `tracepipe trend` over every run
of a dataset of 100 runs, each beside `tracepipe query` (top kernels) on the same dataset,
measured in the same run as ratios.

    python bench/bench_compare.py [--runs 100] [--ranks 8] [--kernels 30] [--steps 2] [-j J]

The runs are `pipeline.synthetic.regression`'s (a change from the 60th run on), batched once into a
dataset (kept in the work folder for the next time). Each command runs in a fresh process, start-up
included, best of 3; peak memory is the summed PSS of its processes.
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench import measure
from pipeline.synthetic.regression import write_runs

TOP_KERNELS = "select name, count(*) as n, sum(dur_ns) as t from gpu_ops group by name order by t desc limit 20"


def tracepipe(*args: str) -> list[str]:
    return [sys.executable, "-m", "pipeline", *args]


def best_of(cmd: list[str], k: int = 3) -> tuple[float, float]:
    """(best wall seconds, its peak MB) of k runs."""
    runs = [measure(cmd)[:2] for _ in range(k)]
    return min(runs)


def dataset(work: Path, runs: int, ranks: int, kernels: int, steps: int, jobs: int) -> tuple[Path, float]:
    src, ds = work / f"runs_{runs}x{ranks}", work / f"ds_{runs}x{ranks}"
    marker = ds / ".complete"
    if not marker.exists():
        shutil.rmtree(src, ignore_errors=True)
        shutil.rmtree(ds, ignore_errors=True)
        write_runs(src, runs=runs, world=ranks, steps=steps, kernels=kernels, changes={3: (runs * 6 // 10, 1.2)})
        t0 = time.perf_counter()
        subprocess.run(tracepipe("batch", str(src), "-o", str(ds), "-j", str(jobs), "-q"), check=True)
        (ds / ".complete").write_text(f"{time.perf_counter() - t0:.1f}")
    return ds, float(marker.read_text())


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=100)
    ap.add_argument("--ranks", type=int, default=8)
    ap.add_argument("--kernels", type=int, default=30)
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("-j", "--jobs", type=int, default=len(os.sched_getaffinity(0)))
    ap.add_argument("--workdir", default="/tmp/tracepipe-bench-compare")
    a = ap.parse_args()
    work = Path(a.workdir)
    work.mkdir(parents=True, exist_ok=True)
    print(f"machine: {platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}")
    ds, t_batch = dataset(work, a.runs, a.ranks, a.kernels, a.steps, a.jobs)
    import polars as pl

    from pipeline.dataset.tables import tables

    rows = tables(ds, ["gpu_ops"])["gpu_ops"].select(pl.len()).collect().item()
    mid = a.runs // 2
    out = ["--format", "json", "-o", str(work / "out.json")]  # to a file: a pipe read only at the end could fill
    t_query, m_query = best_of(tracepipe("query", str(ds), TOP_KERNELS, *out))
    t_cmp, m_cmp = best_of(tracepipe("compare", str(ds), "--base", f"run{mid - 1:02d}", "--new", f"run{mid:02d}", *out))
    t_trend, m_trend = best_of(tracepipe("trend", str(ds), *out))
    print(
        f"dataset: {a.runs} runs x {a.ranks} ranks ({a.runs * a.ranks} traces, {rows:,} gpu_ops rows), batched in "
        f"{t_batch:.1f}s"
    )
    print(f"query (top kernels): {t_query:.2f}s, peak {m_query:.0f} MB")
    print(f"compare (two runs, every level): {t_cmp:.2f}s = {t_cmp / t_query:.2f}x query, peak {m_cmp:.0f} MB")
    ratio = t_trend / t_query
    print(f"trend (top 5 kernels over {a.runs} runs): {t_trend:.2f}s = {ratio:.2f}x query, peak {m_trend:.0f} MB")


if __name__ == "__main__":
    main()
