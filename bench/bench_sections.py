"""The single-trace analyses of `analyze` one at a time on a flattened trace: time and peak memory
(summed PSS) of each section alone, beside the whole `analyze` (every section) in the same run."""

from __future__ import annotations

import sys
from pathlib import Path

SECTIONS = ("idle", "queue", "sequences", "memory", "allocations", "critical-path")


def bench_sections(flat_dir: Path, work: Path, measure) -> str:
    """A Markdown table: each of SECTIONS, then the whole analyze, with seconds and MB."""
    rows = []
    for section in (*SECTIONS, None):
        only = ["--section", section] if section else []
        cmd = [sys.executable, "-m", "pipeline", "analyze", str(flat_dir), "-f", "json", "-o", str(work / "s.json")]
        seconds, mb, _ = measure(cmd + only)
        rows.append((section or "analyze (every section)", seconds, mb))
    whole = rows[-1][1]
    lines = ["| section | s | x whole analyze | peak MB (summed PSS) |", "|---|---|---|---|"]
    lines += [f"| {name} | {s:.1f} | {s / whole:.2f} | {mb:.0f} |" for name, s, mb in rows]
    parquet_mb = sum(f.stat().st_size for f in flat_dir.glob("*.parquet")) / 1e6
    return f"analyses on {flat_dir.name} ({parquet_mb:.0f} MB of Parquet):\n" + "\n".join(lines)
