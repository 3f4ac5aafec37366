"""torch: `torch.profiler.profile(on_trace_ready=on_trace_ready(DATASET, run=...))` writes each
trace into a tracepipe dataset as the profiler finishes it, with its run, rank and step.

    import torch
    from pipeline.integrations.torch import on_trace_ready

    with torch.profiler.profile(
        schedule=torch.profiler.schedule(wait=1, warmup=1, active=3),
        on_trace_ready=on_trace_ready("/data/traces", run="nightly-2024-06-01"),
    ) as prof:
        for batch in loader:
            train_step(batch)
            prof.step()

Each trace is exported (`export_chrome_trace`) to a temporary file, flattened, linked and costed in
this process, and committed into the dataset as `batch` commits (`pipeline.dataset.append`): the
ranks of a job may write into one dataset at once, and a reader never sees half a trace. The trace
is named RUN/rank-R.step-S.pt.trace.json in the dataset, so that its run is RUN (the directory, as
`ranks`, `compare` and `trend` group runs), its rank R (`distributedInfo` when torch.distributed
is initialised, else the file name) and S the profiler's step when it finished. torch is not a
dependency of tracepipe: it is imported by the profiler that calls the handler, never here.
"""

from __future__ import annotations

import os
import sys
import tempfile
from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path

from pipeline.dataset.append import COMPACT_AFTER, Added, add_trace

__all__ = ["on_trace_ready", "trace_name", "current_rank"]


def current_rank() -> int:
    """This process's rank: torch.distributed's when it is initialised, else $RANK, else 0."""
    dist = sys.modules.get("torch.distributed")
    try:
        if dist is not None and dist.is_available() and dist.is_initialized():
            return int(dist.get_rank())
    except (RuntimeError, ValueError):
        pass
    try:
        return int(os.environ.get("RANK", "0"))
    except ValueError:
        return 0


def trace_name(rank: int, step: int | None) -> str:
    """The file name a trace has in the dataset: rank-R.step-S.pt.trace.json."""
    return f"rank-{rank}" + (f".step-{step}" if step is not None else "") + ".pt.trace.json"


def on_trace_ready(
    dataset: str | os.PathLike,
    run: str | None = None,
    *,
    rank: int | None = None,
    compact_after: int | None = COMPACT_AFTER,
    on_added: Callable[[Added], None] | None = None,
) -> Callable[[object], None]:
    """A handler for `torch.profiler.profile(on_trace_ready=...)` that adds each trace to `dataset`
    under `run` (default: the UTC time the handler was made, `YYYYmmdd-HHMMSS`, which every rank
    of a job must share: pass one). `rank`: default `current_rank()`. `on_added` is called with
    what became of each trace (`Added`: trace_id, status)."""
    run = run or datetime.now(timezone.utc).strftime("%Y%m%d-%H%M%S")
    if not run.strip("/") or ".." in Path(run).parts:
        raise ValueError(f"run {run!r}: give a name (a relative path without '..')")

    def handler(prof) -> None:
        r = current_rank() if rank is None else rank
        name = trace_name(r, getattr(prof, "step_num", None))
        with tempfile.TemporaryDirectory(prefix="tracepipe-torch-") as tmp:
            path = Path(tmp) / name
            prof.export_chrome_trace(str(path))
            added = add_trace(dataset, path, source=f"{run.strip('/')}/{name}", compact_after=compact_after)
        if on_added is not None:
            on_added(added)

    return handler
