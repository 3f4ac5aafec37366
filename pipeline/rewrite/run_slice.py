"""run_slice: the same window of every rank of a run, each rank's trace sliced (`slice`) into one
folder that `combine --align clocks` (or `ranks`) reads as the run.

The window means the same instant on every rank: `--steps` and `--annotation` are each rank's own
(ProfilerStep N is the same step everywhere); `--start-us/--end-us` count from the run's first
event on its aligned clock (each rank's clock offset as `tracepipe ranks` estimates it, from the
ends of its blocking collectives), and become each rank's own times. A slice keeps the collectives
of its window, so the sliced run can be aligned again: its window should hold one at least.

Each rank is flattened once (no link) into a temporary folder: its first event gives the run's
origin, and its slice is made from the same tables; one rank at a time is written.
"""

from __future__ import annotations

import re
import tempfile
from dataclasses import replace
from pathlib import Path

from pipeline.analyses.window import Window, trace_origin_ns
from pipeline.errors import UsageError
from pipeline.flatten import flatten
from pipeline.rewrite.run_timeline import rank_traces
from pipeline.rewrite.slice import SliceResult, slice_trace


def parse_ranks(spec: str) -> set[int] | None:
    """`all` (None) or ranks and ranges: `0,2-3`."""
    if spec.strip().lower() == "all":
        return None
    out: set[int] = set()
    for part in spec.split(","):
        m = re.fullmatch(r"\s*(\d+)\s*(?:-\s*(\d+)\s*)?", part)
        if not m:
            raise UsageError(f"--ranks must be all or ranks and ranges like 0,2-3, not {spec!r}")
        a, b = int(m.group(1)), int(m.group(2) or m.group(1))
        if b < a:
            raise UsageError(f"--ranks {spec}: {a}-{b} runs backwards")
        out.update(range(a, b + 1))
    return out


def _out_name(src: Path, path: str) -> str:
    """The rank's file under the output folder: its path inside the run folder."""
    try:
        return str(Path(path).resolve().relative_to(src.resolve()))
    except ValueError:
        return Path(path).name


def slice_run(
    src, out_dir, window: Window, ranks: str = "all", keep_secrets: bool = False, run: str | None = None
) -> list[SliceResult]:
    """Slice the ranks `ranks` of the run in `src` (a run folder) to OUT_DIR/<same file names>."""
    src, out_dir = Path(src), Path(out_dir)
    if window.empty:
        raise UsageError("slice needs a window: --steps, --start-us/--end-us or --annotation")
    if not src.is_dir():
        raise UsageError(f"{src}: --ranks slices a run folder (a folder of its ranks' traces)")
    if out_dir.exists() and not out_dir.is_dir() or out_dir.name.endswith((".json", ".gz")):
        raise UsageError(f"{out_dir}: a run's slices go to a folder: give a folder name")
    wanted = parse_ranks(ranks)
    members = [m for m in rank_traces(src, run) if wanted is None or m[0] in wanted]
    if not members:
        raise UsageError(f"{src}: no trace of ranks {ranks}")
    timed = window.start_us is not None or window.end_us is not None
    results = []
    with tempfile.TemporaryDirectory(prefix="tracepipe-slice-run-") as tmp:
        flat = {r: flatten(path, Path(tmp) / str(r), link=False).out_dir for r, path, _ in members}
        origin = {r: trace_origin_ns(flat[r] / "events.parquet") for r, _, _ in members}
        # the run's origin on the aligned clock: each rank's first event less its offset
        run_origin = min(origin[r] - (off or 0) for r, _, off in members)
        out_dir.mkdir(parents=True, exist_ok=True)
        for r, path, off in members:
            w = window
            if timed:  # the run's µs -> this rank's own µs after its own first event
                lag_us = (run_origin + (off or 0) - origin[r]) / 1000
                w = replace(
                    window,
                    start_us=None if window.start_us is None else window.start_us + lag_us,
                    end_us=None if window.end_us is None else window.end_us + lag_us,
                )
            target = out_dir / _out_name(src, path)
            target.parent.mkdir(parents=True, exist_ok=True)
            results.append(slice_trace(path, target, w, flat_dir=flat[r], keep_secrets=keep_secrets))
    return results
