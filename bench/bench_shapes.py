"""make bench-shapes: `check.py limit` on every real trace's shape, in one run.

    python bench/bench_shapes.py [--mb 1000] [--traces T,T] [--workdir DIR]

Each real trace of ../shared/traces (or --traces) is scaled to --mb MB by replicating its events
(shifted past each other in time and ids: `bench.write_replicated`), then measured in fresh
processes: a bare pysimdjson read and parse of the file (the floor: one core, builds nothing;
the fastest of three, as `check.py limit` takes it) and one `tracepipe flatten` (wall time, peak
summed PSS of all its processes). The ratio of the two is what issue 36's bar (at most 3.0x, in at
most 512 MB) gates, on shapes the acceptance run does not show: a shape's mix of events, not its
size, decides where the time goes (flows per kernel, args per op, float timestamps, graph replays).
Traces that are not a {"traceEvents": [...]} object (Ascend's bare arrays) cannot be replicated
this way and are listed as skipped. Each scaled file is deleted once measured.
"""

from __future__ import annotations

import argparse
import gzip
import shutil
import sys
from pathlib import Path

import orjson

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench import measure, simdjson_seconds, write_replicated

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared" / "traces"
BAR, MEMORY_MB = 3.0, 512  # issue 36: flatten at most 3.0x the floor, in at most 512 MB


def replicable(path: Path) -> bool:
    """Whether the trace is a JSON object holding traceEvents (what `write_replicated` scales)."""
    with (gzip.open if path.suffix == ".gz" else open)(path, "rb") as f:
        doc = orjson.loads(f.read())
    return isinstance(doc, dict) and isinstance(doc.get("traceEvents"), list)


def shape(path: Path) -> str:
    """The trace's name as the acceptance check's ROLES give it: its folder and stem."""
    return f"{path.parent.name}/{_stem(path)}"


def _stem(path: Path) -> str:
    """The file's name without .json / .json.gz (names hold dots: h100_qwen1.5_0.5b)."""
    return path.name.removesuffix(".gz").removesuffix(".json")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--mb", type=float, default=1000, help="size each trace is scaled to (MB)")
    ap.add_argument("--traces", help="traces, comma-separated (default: every one of ../shared/traces)")
    ap.add_argument("--workdir", default="/tmp/tracepipe-bench-shapes")
    a = ap.parse_args()
    found = sorted(p for p in SHARED.glob("*/*.json*") if ".truth." not in p.name)  # not the truth files
    traces = [Path(t) for t in a.traces.split(",")] if a.traces else found
    if not traces:
        raise SystemExit(f"bench-shapes: no traces (looked in {SHARED}; give --traces)")
    work = Path(a.workdir)
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    rows, skipped = [], []
    for src in traces:
        if not replicable(src):
            skipped.append(shape(src))
            continue
        big = work / f"{_stem(src)}.json"
        write_replicated(str(src), big, a.mb)
        floor = simdjson_seconds(big)
        out = work / "flat"
        shutil.rmtree(out, ignore_errors=True)
        wall, peak, _ = measure([sys.executable, "-m", "pipeline", "flatten", str(big), "-o", str(out), "-q"])
        ratio = wall / floor
        rows.append((shape(src), big.stat().st_size / 1e6, wall, floor, ratio, peak))
        print(f"{shape(src)}: flatten {wall:.1f} s, simdjson {floor:.2f} s, {ratio:.2f}x, {peak:.0f} MB", flush=True)
        big.unlink()
        shutil.rmtree(out, ignore_errors=True)
    print(f"\nflatten of each real trace's shape scaled to {a.mb:.0f} MB, against a bare pysimdjson read and parse")
    print(f"(the fastest of three) of the same file, in the same run; bar: {BAR}x, {MEMORY_MB} MB\n")
    print("| trace (shape) | MB | flatten s | simdjson s | x simdjson | peak MB |")
    print("|---|---|---|---|---|---|")
    for name, mb, wall, floor, ratio, peak in sorted(rows, key=lambda r: -r[4]):
        over = " (over)" if ratio > BAR or peak > MEMORY_MB else ""
        print(f"| {name} | {mb:.0f} | {wall:.1f} | {floor:.2f} | {ratio:.2f}{over} | {peak:.0f} |")
    if skipped:
        print(f"\nnot replicable (not a traceEvents object): {', '.join(skipped)}")
    print(f"\npython {sys.version.split()[0]}, orjson {orjson.__version__}")


if __name__ == "__main__":
    main()
