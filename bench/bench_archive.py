"""make bench (archives): `tracepipe batch` on many small traces and on a few large ones, the dataset's
files per 1,000 traces and query latency, each beside its single-file / single-trace baseline,
measured in the same run.

    python bench/bench_archive.py [--small N] [--small-kb KB] [--large N] [--large-mb MB] [-j J]

* small: N distinct traces of ~KB each (one synthetic template, a top-level key made unique per
  copy, gzip, in 20 run folders) batched into a dataset, against `tracepipe flatten` on ONE trace
  of the same total bytes (the template's events replicated): the per-trace overhead;
* files: every file of the dataset (the manifest and .lock included) per 1,000 traces;
* query: the top-kernels SQL through `tracepipe query DATASET --format json` against polars
  running the same SQL on the same gpu_ops rows in one Parquet file (best of 3 each, in fresh
  processes: start-up included on both sides);
* large: N traces of ~MB each batched, against `tracepipe flatten` on one of them, times N.

Wall time and peak memory (summed PSS of every process of the command) of each command.
"""

from __future__ import annotations

import argparse
import gzip
import os
import platform
import shutil
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench import measure, write_replicated
from pipeline.synthetic import write_demo

TOP_KERNELS = "select name, count(*) as n, sum(dur_ns) as t from gpu_ops group by name order by t desc limit 20"


def tracepipe(*args: str) -> list[str]:
    return [sys.executable, "-m", "pipeline", *args]


def small_traces(work: Path, n: int, kb: float) -> tuple[Path, Path, float]:
    """N distinct small traces under work/small/runXX/ (gzip) and their template (plain JSON)."""
    src, template = work / "small", work / f"small_template_{kb:g}kb.json"
    if not template.exists():
        write_demo(template, kb / 2000, seed=7)  # the demo generator writes about twice the size asked
    text = template.read_bytes()
    marker = src / f".made-{n}"
    if not marker.exists():
        shutil.rmtree(src, ignore_errors=True)
        head = text.index(b"{") + 1
        for i in range(n):
            d = src / f"run{i % 20:02d}"
            d.mkdir(parents=True, exist_ok=True)
            with gzip.open(d / f"rank-{i // 20}.json.gz", "wb", compresslevel=1) as f:
                f.write(text[:head] + b'"benchVariant": %d, ' % i + text[head:])
        marker.touch()
    return src, template, n * len(text) / 1e6


def files_of(ds: Path) -> int:
    return sum(len(fs) for d, _, fs in os.walk(ds) if "_staging" not in d)


def best_of(cmd: list[str], k: int = 3) -> float:
    best = float("inf")
    for _ in range(k):
        t0 = time.perf_counter()
        subprocess.run(cmd, check=True, capture_output=True)
        best = min(best, time.perf_counter() - t0)
    return best


def bench_small(work: Path, n: int, kb: float, jobs: int) -> list[str]:
    src, template, mb = small_traces(work, n, kb)
    kb = template.stat().st_size / 1000  # what the generator made of the size asked for
    one = work / f"small_one_{mb:.0f}mb.json"
    if not one.exists():
        write_replicated(str(template), one, mb)
    out, ds = work / "small_flat", work / "small_ds"
    shutil.rmtree(out, ignore_errors=True)
    shutil.rmtree(ds, ignore_errors=True)
    t_one, m_one, _ = measure(tracepipe("flatten", str(one), "-o", str(out), "-q"))
    t_batch, m_batch, _ = measure(tracepipe("batch", str(src), "-o", str(ds), "-j", str(jobs), "-q"))
    t_again, _, _ = measure(tracepipe("batch", str(src), "-o", str(ds), "-j", str(jobs), "-q"))
    files = files_of(ds)
    # the same gpu_ops rows in one file, and the same SQL on it by polars itself
    single = work / "small_gpu_ops_one.parquet"
    import polars as pl

    from pipeline.dataset.tables import tables

    tables(ds, ["gpu_ops"])["gpu_ops"].sink_parquet(single)
    t_query = best_of(tracepipe("query", str(ds), TOP_KERNELS, "--format", "json"))
    ref = (
        "import polars as pl, sys; c = pl.SQLContext(gpu_ops=pl.scan_parquet(sys.argv[1])); "
        "print(c.execute(sys.argv[2]).collect().write_json())"
    )
    t_polars = best_of([sys.executable, "-c", ref, str(single), TOP_KERNELS])
    rows = pl.scan_parquet(single).select(pl.len()).collect().item()
    return [
        f"small: {n:,} traces of {kb:.0f} KB ({mb:.0f} MB of JSON) batched -j {jobs} in {t_batch:.1f}s = "
        f"{n / t_batch:,.0f} traces/s, {mb / t_batch:.0f} MB/s, peak {m_batch:.0f} MB; one {mb:.0f} MB trace "
        f"flattened in {t_one:.1f}s (peak {m_one:.0f} MB): batch = {t_batch / t_one:.2f}x the single trace; "
        f"re-run {t_again:.1f}s",
        f"files: {files} in the dataset = {files * 1000 / n:.1f} per 1,000 traces (a file per trace and table, "
        "and one for its manifest row, would be 8,000)",
        f"query at {n:,} traces ({rows:,} gpu_ops rows): top kernels {t_query:.2f}s = {t_query / t_polars:.2f}x "
        f"polars on the same rows in one file ({t_polars:.2f}s; both in fresh processes, best of 3)",
    ]


def bench_large(work: Path, n: int, mb: float, jobs: int) -> list[str]:
    src = work / f"large_{n}x{mb:g}mb"
    if not (src / f"rank{n - 1:02d}.json").exists():
        src.mkdir(parents=True, exist_ok=True)
        for i in range(n):
            write_demo(src / f"rank{i:02d}.json", mb, seed=100 + i)
    total = sum(f.stat().st_size for f in src.iterdir()) / 1e6
    out, ds = work / "large_flat", work / "large_ds"
    shutil.rmtree(out, ignore_errors=True)
    shutil.rmtree(ds, ignore_errors=True)
    t_one, m_one, _ = measure(tracepipe("flatten", str(src / "rank00.json"), "-o", str(out), "-q"))
    t_batch, m_batch, _ = measure(tracepipe("batch", str(src), "-o", str(ds), "-j", str(jobs), "-q"))
    return [
        f"large: {n} traces of {mb:g} MB ({total:.0f} MB) batched -j {jobs} in {t_batch:.1f}s = {total / t_batch:.0f} "
        f"MB/s, peak {m_batch:.0f} MB; one of them flattened in {t_one:.2f}s ({(total / n) / t_one:.0f} MB/s, "
        f"peak {m_one:.0f} MB): batch = {t_batch / (n * t_one):.2f}x {n} single flattens one after another; "
        f"{files_of(ds)} files"
    ]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--small", type=int, default=10_000, help="how many small traces")
    ap.add_argument("--small-kb", type=float, default=67, help="size of a small trace (KB of JSON)")
    ap.add_argument("--large", type=int, default=20, help="how many large traces")
    ap.add_argument("--large-mb", type=float, default=50, help="size of a large trace (MB of JSON)")
    ap.add_argument("-j", "--jobs", type=int, default=len(os.sched_getaffinity(0)))
    ap.add_argument("--workdir", default="/tmp/tracepipe-bench-archive")
    a = ap.parse_args()
    work = Path(a.workdir)
    work.mkdir(parents=True, exist_ok=True)
    print(f"machine: {platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}")
    for line in bench_small(work, a.small, a.small_kb, a.jobs):
        print(line, flush=True)
    for line in bench_large(work, a.large, a.large_mb, a.jobs):
        print(line, flush=True)


if __name__ == "__main__":
    main()
