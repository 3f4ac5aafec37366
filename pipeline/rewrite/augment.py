"""augment: the original trace, streamed back out with each costed kernel's cost in its `args`.

Costs come from the `gpu_ops` table of the flattened trace (`event_idx` = position in
traceEvents). Only costed kernels are held in memory (O(kernels)); the trace itself is read
chunk by chunk in file order with a running event index, and every event and top-level key is
written back (see `pipeline.jsonout`). Field names `kernel_flop` / `kernel_num_gb` are those of
torch's profile_analysis `--augment_trace`; `kernel_cost_source` says where the figures came from
(`gpu_ops.cost_source`: formula, user_formula, inductor). Flattening an augmented trace again
gives the same costs: tracepipe reads `kernel_flop` / `kernel_num_gb` only from Inductor's launch
records (CPU ops with `kernel_backend`), never from a kernel's own args, where augmenters write
them (ours split over an op's kernels, torch's the op's whole count on each of its kernels).
"""

from __future__ import annotations

import tempfile
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import polars as pl

from pipeline import store
from pipeline.errors import DatasetError, UsageError
from pipeline.flatten import flatten
from pipeline.kineto import GPU_KINDS
from pipeline.read.device_tasks import is_task_event
from pipeline.read.metadata import sampled_content_id
from pipeline.rewrite import lanes
from pipeline.rewrite.jsonout import TraceWriter, metadata_after, open_trace, read_events
from pipeline.rewrite.tracks import timeline_events

# args key -> expression over gpu_ops
COST_ARGS = {
    "kernel_flop": pl.col("flops"),
    "kernel_num_gb": pl.col("bytes") / 1e9,
    "kernel_flop_pct": pl.col("achieved_flops_pct"),
    "kernel_bw_pct": pl.col("achieved_bw_pct"),
    "kernel_arithmetic_intensity": pl.col("arithmetic_intensity"),
    "kernel_roofline_bound": pl.col("roofline_bound"),
    "kernel_cost_source": pl.col("cost_source"),
}
COST_COLUMNS = sorted({c for e in COST_ARGS.values() for c in e.meta.root_names()})
OPTIONAL = ("cost_source",)  # tables flattened before it existed have none: left out of the args


@dataclass
class AugmentResult:
    out_path: Path
    n_events: int
    n_costed: int
    truncated: bool
    truncation_reason: str | None
    warnings: list = field(default_factory=list)
    n_moved: int = 0  # slices moved to sibling tracks (`lanes`)
    added: dict = field(default_factory=dict)  # events added per track (`tracks`)


def kernel_costs(flat_dir) -> list[tuple[int, dict]]:
    """(event_idx, cost args) of every kernel with a cost, sorted by event_idx; null fields left out."""
    g = store.scan(flat_dir, "gpu_ops")
    have = g.collect_schema().names()
    g = g.with_columns(pl.lit(None, pl.String).alias(c) for c in OPTIONAL if c not in have)
    missing = [c for c in COST_COLUMNS if c not in have and c not in OPTIONAL]
    if missing:
        raise DatasetError(f"{flat_dir}: gpu_ops has no cost columns ({', '.join(missing)}); flatten with linking")
    rows = (
        g.filter((pl.col("kind") == "kernel") & (pl.col("flops").is_not_null() | pl.col("bytes").is_not_null()))
        .select("event_idx", *[e.alias(k) for k, e in COST_ARGS.items()])
        .sort("event_idx")
        .collect()
    )
    return [(r.pop("event_idx"), {k: v for k, v in r.items() if v is not None}) for r in rows.iter_rows(named=True)]


def _check_flat_dir(flat_dir, path: str):
    trace = store.scan(flat_dir, "trace").select("trace_id").collect()
    if trace.height != 1 or trace["trace_id"][0] != sampled_content_id(path):
        raise UsageError(f"{flat_dir} was not flattened from {path}")


@contextmanager
def _flattened(path: str, flat_dir, flatten_kwargs: dict):
    """(the flattened trace's directory, flatten's warnings): `flat_dir` when given, else the trace
    flattened into a temporary directory for the block."""
    if flat_dir is not None:
        _check_flat_dir(flat_dir, path)
        yield Path(flat_dir), []
        return
    with tempfile.TemporaryDirectory(prefix="tracepipe-augment-") as tmp:
        r = flatten(path, tmp, **flatten_kwargs)
        yield r.out_dir, r.warnings


def _is_device_activity(event) -> bool:
    """A GPU activity as gpu_ops has them: a GPU category, or a device task without one (torch_npu's
    on the `Ascend Hardware` process: `read.device_tasks.is_task_event`, the rule flatten reads by)."""
    if type(event) is not dict:
        return False
    return event.get("cat") in GPU_KINDS or is_task_event(event)


def _add_cost(event, fields: dict, idx: int):
    if not _is_device_activity(event):
        raise DatasetError(f"traceEvents[{idx}] is not the kernel gpu_ops names: the flattened tables are stale")
    args = event.get("args")
    if args is None:
        event["args"] = args = {}
    if type(args) is dict:
        args.update(fields)


def with_costs(batches, costs: list[tuple[int, dict]]):
    """Yield each batch of events with the costs of its kernels added (costs sorted by event_idx)."""
    pending = iter(costs)
    nxt = next(pending, None)
    base = 0
    for events in batches:
        end = base + len(events)
        while nxt is not None and nxt[0] < end:
            _add_cost(events[nxt[0] - base], nxt[1], nxt[0])
            nxt = next(pending, None)
        base = end
        yield events
    if nxt is not None:
        raise DatasetError(f"the flattened tables name event {nxt[0]}, past the trace's {base} events: they are stale")


def augment(
    trace_path, out_path, flat_dir=None, keep_secrets: bool = False, tracks: bool = True, **flatten_kwargs
) -> AugmentResult:
    """Write `trace_path` to `out_path` (.json or .json.gz) with cost fields in costed kernels' args,
    the timeline tracks (`rewrite.tracks`: launch queue and memory counters, the critical path,
    the findings) unless `tracks` is false, and every slice Perfetto could not nest on a sibling
    track (`rewrite.lanes`); secrets in its metadata redacted unless `keep_secrets` (the output is
    meant to be shared).

    With `flat_dir` (a flattened, linked directory of this trace) its tables are used; otherwise
    the trace is flattened to a temporary directory first (`flatten_kwargs`: workers,
    device_specs, device, dtype, ...).
    """
    path = str(trace_path)
    stage = flatten_kwargs.get("stage")
    with open_trace(path) as src, _flattened(path, flat_dir, flatten_kwargs) as (flat, warnings):
        costs = kernel_costs(flat)
        if stage:
            stage("tracks")
        added, counts = timeline_events(flat) if tracks else ([], {})
        moves = lanes.plan(pl.scan_parquet(flat / "events.parquet"), pl.scan_parquet(flat / "flows.parquet"))
        if stage:
            stage("write")
        with TraceWriter(out_path, src.header.metadata, keep_secrets=keep_secrets) as out:
            base = 0
            for events in with_costs(read_events(src), costs):
                moves.apply(events, base)
                base += len(events)
                out.write(events)
            out.write(added)
            out.tail = metadata_after(src)
    return AugmentResult(
        Path(out_path), out.n_events, len(costs), src.tail.truncated, src.tail.reason, warnings, moves.moved, counts
    )
