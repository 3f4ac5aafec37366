"""make bench: flatten speed and memory against orjson.loads, a bare ijson pass and a bare SIMD
JSON parse, in one run.

    python bench/bench.py [--sizes 1000,2000] [--gz] [--template TRACE] [--workdir DIR] [--no-duckdb] [--pairs N]

For each size (MB) it writes a large trace (from a realistic synthetic template, or by
replicating the events of --template, a real trace), then measures, each in a fresh process:
`orjson.loads` of the file (the baseline), one bare `ijson.items` pass, a bare pysimdjson read
and parse of the file (the floor for any reader that looks at every byte: one core, builds
nothing; the time inside the process, the fastest of three, as `check.py limit` takes it),
`tracepipe flatten` (wall time and peak memory of all its processes, summed PSS), and
link+cost+analyze on the flattened directory; for the first size also DuckDB's `read_json` of
the events into Parquet (what a data engineer would try first; unlinked, the args kept as JSON).
Everything is reported as ratios measured in the same run; the ratio to simdjson also as the
median of `--pairs` alternating runs of both (the host's speed can swing between minutes).
"""

from __future__ import annotations

import argparse
import gzip
import importlib.metadata
import math
import os
import platform
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import orjson

from pipeline.synthetic import write_demo

# ------------------------------------------------------------------ trace generation
ID_ARGS = ("External id", "correlation")


def write_replicated(src: str, path: Path, target_mb: float, sectioned: bool = False):
    """Copies of a real trace's events, each shifted past the last in time and ids. `sectioned`:
    laid out as one long Kineto run writes it, every copy's leading block of CPU events first,
    then every copy's interleaved runtime calls, flows and GPU activity."""
    with (gzip.open if src.endswith(".gz") else open)(src, "rb") as f:
        trace = orjson.loads(f.read())
    events = trace.pop("traceEvents")
    ts = [e["ts"] for e in events if isinstance(e.get("ts"), (int, float))]
    span = max(ts) - min(ts) + 1000
    id_step = 10 ** (len(str(max(e.get("args", {}).get("correlation", 0) or 0 for e in events))) + 1)
    # metadata events are written once: a copy is the other events (of a tiny trace, most bytes are metadata)
    per_copy = len(orjson.dumps([e for e in events if e.get("ph") != "M"])) or 1
    copies = max(1, math.ceil(target_mb * 1e6 / per_copy))
    lead = next((i for i, e in enumerate(events) if str(e.get("cat", "")).lower() in _LAUNCHED), len(events))
    parts = [events[:lead], events[lead:]] if sectioned else [events]
    with open(path, "wb") as out:
        out.write(orjson.dumps(trace)[:-1] + b', "traceEvents": [\n')
        first = True
        for part in parts:
            for copy in range(copies):
                blob = b",\n".join(
                    orjson.dumps(_shifted(e, copy * span, copy * id_step))
                    for e in part
                    if not (copy and e.get("ph") == "M")
                )
                if blob:
                    out.write(blob if first else b",\n" + blob)
                    first = False
        out.write(b"\n]}\n")


# the categories of launches, flows and GPU activity: a Kineto trace's leading CPU block ends at the first
_LAUNCHED = {
    "cuda_runtime",
    "cuda_driver",
    "runtime",
    "kernel",
    "gpu_memcpy",
    "gpu_memset",
    "memcpy",
    "memset",
    "ac2g",
    "async_cpu_to_gpu",
}


def _shifted(e: dict, dt: float, did: int) -> dict:
    if not did:
        return e
    e = dict(e)
    if isinstance(e.get("ts"), (int, float)):
        e["ts"] = e["ts"] + dt
    if e.get("ph") in ("s", "f", "t") and isinstance(e.get("id"), int):
        e["id"] = e["id"] + did
    if isinstance(e.get("args"), dict):
        e["args"] = {k: (v + did if k in ID_ARGS and isinstance(v, int) and v > 0 else v) for k, v in e["args"].items()}
    return e


# ------------------------------------------------------------------ measuring
def group_stats(pgid: int) -> Iterator[tuple[int, list[str]]]:
    """(pid, the fields of /proc/PID/stat after the command name) of every process of a process
    group: a command started with `start_new_session=True` and all its workers."""
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                with open(f"/proc/{d}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if len(fields) > 2 and int(fields[2]) == pgid:
                yield int(d), fields


def tree_pss_bytes(pgid: int) -> int:
    total = 0
    for pid, _ in group_stats(pgid):
        try:
            for line in open(f"/proc/{pid}/smaps_rollup"):
                if line.startswith("Pss:"):
                    total += int(line.split()[1]) * 1024
                    break
        except (OSError, ValueError, IndexError):
            continue
    return total


def measure(cmd: list[str], env: dict | None = None) -> tuple[float, float, str]:
    """Wall seconds, peak summed PSS (MB) of the process group, stdout."""
    t0 = time.perf_counter()
    p = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True, env={**os.environ, **(env or {})}
    )
    peak = 0
    while p.poll() is None:
        peak = max(peak, tree_pss_bytes(p.pid))
        time.sleep(0.05)
    wall = time.perf_counter() - t0
    out, err = p.communicate()
    if p.returncode not in (0, 1):
        raise SystemExit(f"bench: {' '.join(cmd[:3])} failed: {err.decode()[-300:]}")
    return wall, peak / 2**20, out.decode()


# DuckDB reads the events with this type (read_json's own inference fails on some traces: struct
# keys differing only in case, such as "bytes" and "Bytes", are one name to it)
DUCKDB_EVENTS = (
    "STRUCT(ph VARCHAR, cat VARCHAR, name VARCHAR, pid JSON, tid JSON, ts DOUBLE, dur DOUBLE, id JSON, args JSON)[]"
)


def simdjson_seconds(path: Path, runs: int = 3) -> float:
    """A bare pysimdjson read and parse of the file: seconds inside a fresh process (start-up not
    counted), the fastest of `runs`; nan without pysimdjson."""
    opener = "gzip.open" if path.suffix == ".gz" else "open"
    code = (
        "import simdjson, gzip, time; t = time.perf_counter(); "
        f"b = {opener}({str(path)!r}, 'rb').read(); d = simdjson.Parser().parse(b); n = len(d['traceEvents']); "
        "print(time.perf_counter() - t)"
    )
    try:
        return min(float(measure([sys.executable, "-c", code])[2]) for _ in range(runs))
    except SystemExit:  # no pysimdjson (pip install pysimdjson)
        return float("nan")


def paired_simdjson(path: Path, work: Path, pairs: int) -> str:
    """flatten against a bare pysimdjson parse, `pairs` times alternately (one parse, then one
    flatten): on a host whose speed swings between minutes, the ratio of two runs side by side is
    steadier than the ratio of a fastest-of-three parse to one flatten. The median and the range."""
    out = work / "flat"
    ratios = []
    for _ in range(pairs):
        t_simd = simdjson_seconds(path, runs=1)
        shutil.rmtree(out, ignore_errors=True)
        t_flat = measure([sys.executable, "-m", "pipeline", "flatten", str(path), "-o", str(out), "-q"])[0]
        ratios.append(t_flat / t_simd)
    if not ratios or any(math.isnan(r) for r in ratios):
        return "paired: no pysimdjson (pip install pysimdjson)" if ratios else "paired: --pairs 0"
    ratios.sort()
    return (
        f"paired: flatten / a bare simdjson parse, {pairs} alternating pairs: median {ratios[len(ratios) // 2]:.2f}x "
        f"(range {ratios[0]:.2f}-{ratios[-1]:.2f}x)"
    )


def duckdb_run(path: Path, work: Path) -> tuple[float, float]:
    """DuckDB's read_json of the trace's events into one Parquet file: wall seconds, peak MB."""
    out = work / "duckdb_events.parquet"
    sql = (
        f"COPY (SELECT unnest(e) FROM (SELECT unnest(traceEvents) AS e FROM read_json({str(path)!r}, "
        f"columns={{'traceEvents': '{DUCKDB_EVENTS}'}}, maximum_object_size=2147483647))) "
        f"TO {str(out)!r} (FORMAT parquet)"
    )
    t, m, _ = measure([sys.executable, "-c", f"import duckdb; duckdb.sql({sql!r})"])
    out.unlink(missing_ok=True)
    return t, m


def bench_file(path: Path, work: Path, duckdb: bool = False) -> dict:
    py = sys.executable
    size_mb = path.stat().st_size / 1e6
    opener = "gzip.open" if path.suffix == ".gz" else "open"
    t_simd = simdjson_seconds(path)
    t_orjson, m_orjson, n = measure(
        [
            py,
            "-c",
            f"import orjson, gzip; d=orjson.loads({opener}({str(path)!r},'rb').read()); print(len(d['traceEvents']))",
        ]
    )
    t_ijson, m_ijson, _ = measure(
        [
            py,
            "-c",
            f"import ijson, gzip; print(sum(1 for _ in ijson.items({opener}({str(path)!r},'rb'), "
            "'traceEvents.item', use_float=True)))",
        ]
    )
    out = work / "flat"
    shutil.rmtree(out, ignore_errors=True)
    t_flat, m_flat, summary = measure([sys.executable, "-m", "pipeline", "flatten", str(path), "-o", str(out)])
    stages = {k: float(v) for k, v in re.findall(r"([a-z+]+) ([0-9.]+) s\b", summary.rsplit("(", 1)[-1])}
    flat_dir = next(out.iterdir())
    parquet_mb = sum(f.stat().st_size for f in flat_dir.glob("*.parquet")) / 1e6
    t_analyze, m_analyze, _ = measure(
        [sys.executable, "-m", "pipeline", "analyze", str(flat_dir), "--format", "json", "-o", str(work / "a.json")]
    )
    events = int(n.strip())
    t_duck, m_duck = duckdb_run(path, work) if duckdb else (float("nan"), float("nan"))
    return {
        "file": path.name,
        "MB": size_mb,
        "events": events,
        "orjson_s": t_orjson,
        "orjson_MB": m_orjson,
        "ijson_s": t_ijson,
        "flatten_s": t_flat,
        "flatten_MB": m_flat,
        "x_orjson": t_flat / t_orjson,
        "x_ijson": t_flat / t_ijson,
        "simdjson_s": t_simd,
        "x_simdjson": t_flat / t_simd,
        "duckdb_s": t_duck,
        "duckdb_MB": m_duck,
        "Mevents_s": events / t_flat / 1e6,
        "parquet_MB": parquet_mb,
        "analyze_s": t_analyze,
        "read_s": stages.get("flatten", float("nan")),
        "link_s": stages.get("link+cost", float("nan")),
        "link_analyze_s": stages.get("link+cost", float("nan")) + t_analyze,
    }


def bench_slice(path: Path, work: Path, flatten_s: float | None = None, flatten_mb: float | None = None) -> str:
    """`tracepipe slice` of a 1% window in the middle of the trace, beside `flatten` of the same
    file (wall time, peak summed PSS): a slice flattens (no link) and then writes in one more
    streaming pass, so its memory should be flatten's, not the trace's."""
    import polars as pl

    out = work / "flat"
    if flatten_s is None or not out.is_dir():
        shutil.rmtree(out, ignore_errors=True)
        flatten_s, flatten_mb, _ = measure([sys.executable, "-m", "pipeline", "flatten", str(path), "-o", str(out)])
    events = pl.scan_parquet(next(out.iterdir()) / "events.parquet").filter(pl.col("ph") != "M")
    lo, hi = (
        events.select(lo=pl.col("ts_ns").min(), hi=(pl.col("ts_ns") + pl.col("dur_ns").fill_null(0)).max())
        .collect()
        .row(0)
    )
    a, b = 0.495 * (hi - lo) / 1e3, 0.505 * (hi - lo) / 1e3
    target = work / "slice.json.gz"
    t, mb, _ = measure(
        [
            sys.executable,
            "-m",
            "pipeline",
            "slice",
            str(path),
            "--start-us",
            f"{a:.3f}",
            "--end-us",
            f"{b:.3f}",
            "-o",
            str(target),
            "-q",
        ]
    )
    return (
        f"slice of a 1% window of {path.name} ({path.stat().st_size / 1e6:.0f} MB): {t:.1f} s, peak {mb:.0f} MB, "
        f"{target.stat().st_size / 1e6:.1f} MB written; flatten of the same file: {flatten_s:.1f} s, "
        f"peak {flatten_mb:.0f} MB (slice/flatten: {t / flatten_s:.2f}x the time, {mb / flatten_mb:.2f}x the memory)"
    )


def bench_batch(work: Path, n: int = 24, mb: float = 8.0, jobs: int = 2) -> str:
    """Batch throughput: n generated traces of ~mb MB each (gzip), first run and re-run."""
    src, ds = work / "batch_src", work / "batch_ds"
    shutil.rmtree(ds, ignore_errors=True)
    if not src.is_dir() or len(list(src.iterdir())) != n:
        shutil.rmtree(src, ignore_errors=True)
        for i in range(n):
            write_demo(src / f"rank{i:03d}.json.gz", mb, seed=i)
    total_mb = sum(f.stat().st_size for f in src.iterdir()) / 1e6
    raw_mb = n * mb
    t1, m1, _ = measure([sys.executable, "-m", "pipeline", "batch", str(src), "-o", str(ds), "-j", str(jobs), "-q"])
    t2, _, _ = measure([sys.executable, "-m", "pipeline", "batch", str(src), "-o", str(ds), "-j", str(jobs), "-q"])
    return (
        f"batch -j {jobs}: {n} traces ({total_mb:.0f} MB gzip, ~{raw_mb:.0f} MB JSON) in {t1:.1f}s = "
        f"{n / t1:.2f} traces/s, {raw_mb / t1:.1f} MB/s of JSON, peak {m1:.0f} MB (all processes); "
        f"re-run {t2:.1f}s (incremental, nothing to do)"
    )


def bench_sections(flat_dir: Path, work: Path, measure) -> str:
    """Each analysis section alone on a flattened trace (bench/bench_sections.py)."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from bench_sections import bench_sections as run

    return run(flat_dir, work, measure)


def bench_html(flat_dir: Path, work: Path, measure) -> str:
    """The html page of a flattened trace: size, write time, load time (bench/bench_html.py)."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from bench_html import bench_html as run

    return run(flat_dir, work, measure)


def _deps() -> str:
    """The versions the numbers were measured with (polars, pyarrow, the compiled module)."""
    found = []
    for d in ("polars", "pyarrow", "tracepipe-native"):
        try:
            found.append(f"{d} {importlib.metadata.version(d)}")
        except importlib.metadata.PackageNotFoundError:
            found.append(f"{d} not installed")
    return ", ".join(found)


def markdown(rows: list[dict]) -> str:
    cols = [
        ("file", "{}"),
        ("MB", "{:.0f}"),
        ("events", "{:,}"),
        ("flatten_s", "{:.1f}"),
        ("orjson_s", "{:.1f}"),
        ("ijson_s", "{:.1f}"),
        ("simdjson_s", "{:.1f}"),
        ("x_orjson", "{:.2f}"),
        ("x_ijson", "{:.2f}"),
        ("x_simdjson", "{:.2f}"),
        ("flatten_MB", "{:.0f}"),
        ("orjson_MB", "{:.0f}"),
        ("Mevents_s", "{:.3f}"),
        ("parquet_MB", "{:.0f}"),
        ("read_s", "{:.1f}"),
        ("link_s", "{:.1f}"),
        ("analyze_s", "{:.1f}"),
        ("link_analyze_s", "{:.1f}"),
        ("duckdb_s", "{:.1f}"),
        ("duckdb_MB", "{:.0f}"),
    ]
    head = "| " + " | ".join(c for c, _ in cols) + " |"
    sep = "|" + "---|" * len(cols)
    cell = lambda v, f: "" if isinstance(v, float) and math.isnan(v) else f.format(v)  # nan: not measured
    body = ["| " + " | ".join(cell(r[c], f) for c, f in cols) + " |" for r in rows]
    return "\n".join([head, sep, *body])


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="1000,2000", help="trace sizes in MB, comma-separated")
    ap.add_argument("--gz", action="store_true", help="also measure the first size gzip-compressed")
    ap.add_argument("--template", help="replicate this real trace instead of the synthetic template")
    ap.add_argument(
        "--sectioned",
        action="store_true",
        help="with --template: every copy's CPU block first, then every copy's GPU part (one long run's layout)",
    )
    ap.add_argument("--workdir", default="/tmp/tracepipe-bench")
    ap.add_argument(
        "--no-duckdb", action="store_true", help="skip DuckDB's read_json (it holds ~7x the first size in memory)"
    )
    ap.add_argument(
        "--pairs", type=int, default=3, help="flatten and simdjson alternated this many times on the first size"
    )
    ap.add_argument("--batch-only", action="store_true", help="only measure batch throughput")
    ap.add_argument("--sections-only", type=Path, help="only time each analysis section on this flattened trace")
    ap.add_argument("--html-only", type=Path, help="only measure the html page of this flattened trace")
    ap.add_argument(
        "--slice-only", action="store_true", help="only slice (a 1%% window) and flatten the first size's trace"
    )
    a = ap.parse_args()
    if a.sectioned and not a.template:
        ap.error("--sectioned lays out the copies of a real trace: give --template")
    work = Path(a.workdir)
    work.mkdir(parents=True, exist_ok=True)
    if a.sections_only:
        print(bench_sections(a.sections_only, work, measure))
        return
    if a.html_only:
        print(bench_html(a.html_only, work, measure))
        return
    if a.batch_only:
        print(bench_batch(work))
        return
    if a.slice_only:
        mb = float(a.sizes.split(",")[0])
        path = work / f"bench_{int(mb)}mb.json"
        if not path.exists():
            print(f"bench: writing {path} ...", file=sys.stderr)
            (write_replicated(a.template, path, mb) if a.template else write_demo(path, mb))
        print(bench_slice(path, work))
        return
    rows = []
    for i, mb in enumerate(float(s) for s in a.sizes.split(",")):
        path = work / f"bench_{int(mb)}mb{'_sectioned' if a.sectioned else ''}.json"
        if not path.exists():
            print(f"bench: writing {path} ...", file=sys.stderr)
            (write_replicated(a.template, path, mb, a.sectioned) if a.template else write_demo(path, mb))
        rows.append(bench_file(path, work, duckdb=i == 0 and not a.no_duckdb))
        print(markdown(rows[-1:]).splitlines()[-1], file=sys.stderr)
        if i == 0:
            sections = bench_sections(next((work / "flat").iterdir()), work, measure)
            page = bench_html(next((work / "flat").iterdir()), work, measure)
            cut = bench_slice(path, work, rows[-1]["flatten_s"], rows[-1]["flatten_MB"])
            paired = paired_simdjson(path, work, a.pairs)
            print(paired, file=sys.stderr)
        if a.gz and i == 0:
            gz = path.with_suffix(".json.gz")
            if not gz.exists():
                with open(path, "rb") as src, gzip.open(gz, "wb", compresslevel=6) as dst:
                    shutil.copyfileobj(src, dst, 16 << 20)
            rows.append(bench_file(gz, work))
    print(f"machine: {platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}, {_deps()}")
    print(markdown(rows))
    if len(rows) >= 2 and rows[0]["file"].endswith(".json"):
        big = [r for r in rows if r["file"].endswith(".json")]
        if len(big) >= 2:
            print(
                f"\nscaling: {big[1]['MB']:.0f} MB takes {big[1]['flatten_s'] / big[0]['flatten_s']:.2f}x "
                f"the {big[0]['MB']:.0f} MB time"
            )
        gz = [r for r in rows if r["file"].endswith(".gz")]
        if gz:
            print(f"gzip: {gz[0]['flatten_s'] / rows[0]['flatten_s']:.2f}x the uncompressed time")
    print(paired)
    print(sections)
    print(page)
    print(cut)
    print(bench_batch(work))
    print("whole runs: bench/bench_runs.py (make bench runs it next)")


if __name__ == "__main__":
    main()
