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
from dataclasses import dataclass, field
from pathlib import Path

import polars as pl

from pipeline import store
from pipeline.errors import DatasetError, UsageError
from pipeline.flatten import flatten
from pipeline.kineto import GPU_KINDS
from pipeline.read.device_tasks import is_task_event
from pipeline.read.metadata import sampled_content_id
from pipeline.rewrite.jsonout import TraceWriter, metadata_after, open_trace, read_events

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


def _costs_of(path: str, flat_dir, flatten_kwargs: dict) -> tuple[list, list]:
    """The kernel costs of the trace and the warnings of flattening it (when flat_dir is None)."""
    if flat_dir is not None:
        _check_flat_dir(flat_dir, path)
        return kernel_costs(flat_dir), []
    with tempfile.TemporaryDirectory(prefix="tracepipe-augment-") as tmp:
        r = flatten(path, tmp, **flatten_kwargs)
        return kernel_costs(r.out_dir), r.warnings


def _add_cost(event, fields: dict, idx: int):
    if type(event) is not dict or (event.get("cat") not in GPU_KINDS and not is_task_event(event)):
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


def augment(trace_path, out_path, flat_dir=None, keep_secrets: bool = False, **flatten_kwargs) -> AugmentResult:
    """Write `trace_path` to `out_path` (.json or .json.gz) with cost fields in costed kernels' args;
    secrets in its metadata redacted unless `keep_secrets` (the output is meant to be shared).

    With `flat_dir` (a flattened, linked directory of this trace) its gpu_ops costs are used;
    otherwise the trace is flattened to a temporary directory first (`flatten_kwargs`:
    workers, device_specs, device, dtype, ...).
    """
    path = str(trace_path)
    with open_trace(path) as src:  # a bad trace is reported before any flattening
        costs, warnings = _costs_of(path, flat_dir, flatten_kwargs)
        with TraceWriter(out_path, src.header.metadata, keep_secrets=keep_secrets) as out:
            for events in with_costs(read_events(src), costs):
                out.write(events)
            out.tail = metadata_after(src)
    return AugmentResult(Path(out_path), out.n_events, len(costs), src.tail.truncated, src.tail.reason, warnings)
