"""link: GPU activity -> CPU launch -> CPU op, and their context (step, annotation, module).

All joins are polars queries over the flattened Parquet files; no Python loops over events or
threads (batches loop over GPU ops and time cells).

Rules (see docs/explanation/link-rules.md):
1. launch, by flow: a flow's `s` endpoint binds to the runtime/driver slice that starts at the
   same (pid, tid, ts) and its `f` endpoint to the GPU activity at the same (pid, tid, ts); `s`
   and `f` pair by (cat, id). A flow link whose two sides carry different correlation ids is
   rejected.
2. launch, by correlation: GPU activity still unlinked joins the first runtime/driver slice with
   the same `args.correlation`.
3. cpu_op, by nesting: the innermost `cpu_op` on the launch's thread whose interval contains the
   launch start. Innermost is found without loops over events: the nesting depth at every point
   of a thread is the count of interval starts minus ends before it (binary searches in the
   thread's sorted starts and ends); the innermost op containing a launch at depth d is the last
   op at depth d that started before it (`pipeline.nesting`). Slices starting at one instant nest
   longer first (a zero-length op at the start of a longer one is inside it), identical ones in
   file order (the later event is the inner one).
4. cpu_op, by External id: only for launches no cpu_op contains, and only in layouts where a
   kernel's External id is not simply its correlation id (older traces); 0 is none.
Flows of other shapes, as layouts declare them (`kineto.INSIDE_FLOWS`, `kineto.OP_FLOWS`; torch_npu):
5. launch, by a flow starting inside it: the `s` endpoint lies inside the launch call on the same
   thread id (the flow may name another process: torch_npu's `HostToDevice` starts on its CANN
   process, inside the `Dequeue@...` call of the task-queue thread); string flow ids pair too.
6. cpu_op, by a flow from the op: the `s` endpoint is where the op that issued the activity
   starts (torch_npu's `async_npu`); the op, step, annotation and module are those around that
   point (rule 3 at the flow's start instead of the launch's; `cpu_op_link` = `op_flow`).

Memory does not grow with the trace. GPU ops are linked BATCH_ROWS at a time, in file order
(`link_batches`), and for each batch only the rows it needs are read, by predicates that the
Parquet reader applies row group by row group (skipping those its statistics rule out):
- the flows ending at its ops (`f` at their (pid, tid, ts)) and the flows starting those (`s`
  with the same (cat, id)): `_flows`; the runtime calls sharing a correlation id with its ops and
  those at those flow starts, in one read: `_launch_candidates`;
- the CPU slices (ops, annotations, modules) on the launching threads that run at the launch
  times, one time cell of about CELL_SLICES slices at a time (`windows.TimeCells`): `_context`.
Only a few facts are kept for the whole trace (`LinkSources`). Whatever the order of the files,
a read keeps only the rows of one batch or one cell; the order decides how many row groups a read
can skip, i.e. the time (Kineto writes events and GPU activity roughly in time order).

Reading the slices of a window [a, b] (the first and last launch of a cell) rather than all of
them gives the same answer wherever slices nest properly (on every real trace we test, with the
tie rule above): a slice that ended before a counts as started and as ended at every point of
the window, and cannot overlap the start of a slice still running at a without containing it,
so no depth changes; slices starting after b are counted nowhere. Where slices overlap without
nesting, the innermost is decided among the slices the window reads.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import polars as pl
import pyarrow.parquet as pq

from pipeline import schema, store
from pipeline.kineto import (
    ANNOTATION_CATS,
    API_OPS,
    CPU_OP_CATS,
    INSIDE_FLOWS,
    LAUNCH_CATS,
    LAUNCH_FLOWS,
    LINK_FLOW_CATS,
    MODULE_CATS,
    MODULE_PREFIX,
    OP_FLOWS,
    STEP_CATS,
    STEP_NAME,
    cat_regex,
)
from pipeline.link import nesting
from pipeline.link.windows import EventReach, RunningSlices, TimeBins, TimeCells
from pipeline.read.durations import SLICE

# GPU ops linked together: a batch's reads and nesting take ~1.3 KB per GPU op at their peak, and
# two batches are in memory at once (`link_batches`, `cost.enrich.link_pass`). Each batch's reads
# decode the row groups at the ends of its stretch of the trace again, and every query has its
# cost: on a 1 GB trace (333K GPU ops) 32K took ~0.8 CPU-s less than 16K (link and cost ~5.3 s).
# With polars' allocator keeping freed memory (`pipeline.allocator`) 32K took 45 MB more on a trace
# of many batches than on one of one, 16K half of that; now both take ~30 MB, 64K ~75 MB
BATCH_ROWS = 1 << 15
CELL_SLICES = 1 << 17  # CPU slices starting in one time cell (read together), about

LAUNCH, CPU_OP, ANNOTATION, MODULE = 0, 1, 2, 3
KIND_CATS = {LAUNCH: LAUNCH_CATS, CPU_OP: CPU_OP_CATS, ANNOTATION: ANNOTATION_CATS, MODULE: MODULE_CATS}
CONTEXT_KINDS = (CPU_OP, ANNOTATION, MODULE)  # the slices that launches are nested in
# GPU op columns linking reads, and the columns it adds (in this order)
GPU_LINK_INPUTS = ["event_idx", "pid", "tid", "ts_ns", "correlation", "external_id"]
LINK_COLUMNS = [
    "launch_event_idx",
    "launch_link",
    "launch_name",
    "launch_ts_ns",
    "launch_dur_ns",
    "cpu_op_event_idx",
    "cpu_op_link",
    "annotation",
    "module",
    "cpu_op_name",
    "step",
]
_FLOW_COLS = ["ph", "cat", "id", "pid", "tid", "ts_ns"]
_FLOW_TYPES = pl.Schema(schema.table("flows").arrow_schema())  # polars' types of the flows' columns
_LAUNCH_COLUMNS = [
    "event_idx",
    pl.col("name").cast(pl.Categorical),
    "pid",
    "tid",
    "ts_ns",
    "dur_ns",
    "correlation",
    "external_id",
]
_THREAD_TIME = ["pid", "tid", "ts_ns"]
_REPEATED_GPU_TEXT = ("name",)  # gpu_ops text columns carried as categoricals


@dataclass(frozen=True)
class LinkSources:
    """The files linking reads, and the few facts about the whole trace that every batch needs."""

    events: Path
    flows: Path
    gpu_ops: Path
    cats: dict[int, tuple[str, ...]]  # the trace's own category strings of each slice kind
    # every GPU op has a correlation id: runtime calls sharing none with a GPU op launched nothing
    launches_share_gpu_correlation: bool
    trust_external_id: bool  # kernels' External ids are not just their correlation ids (rule 4)
    reach: EventReach
    cells: TimeCells
    inside_flows: bool = False  # the trace holds flows of rule 5
    op_flows: bool = False  # the trace holds flows of rule 6
    launch_flows: bool = True  # the trace holds flows of rule 1 (of a category of theirs)

    @classmethod
    def of(cls, flat_dir: Path) -> LinkSources:
        """One streaming pass over the events (categories, slice starts over time) and one over
        the GPU ops' correlation ids; the rest comes from the Parquet statistics."""
        flat_dir = Path(flat_dir)
        events, gpu_ops = flat_dir / "events.parquet", flat_dir / "gpu_ops.parquet"
        reach = EventReach.of(events)
        bins = TimeBins.over(reach.span)
        starts = (
            pl.scan_parquet(events)
            .filter(SLICE & pl.col("ts_ns").is_not_null())
            .group_by("cat", bin=bins.of(pl.col("ts_ns")))
            .agg(n=pl.len())
            .collect(engine="streaming")
        )
        present = starts["cat"].unique().drop_nulls()
        cats = {
            kind: tuple(present.filter(present.str.contains(cat_regex(*of_kind))).sort())
            for kind, of_kind in KIND_CATS.items()
        }
        context_cats = [c for k in CONTEXT_KINDS for c in cats[k]]
        histogram = starts.filter(pl.col("cat").is_in(context_cats)).group_by("bin").agg(pl.col("n").sum())
        gpu = (
            pl.scan_parquet(gpu_ops)
            .select(
                missing=pl.col("correlation").null_count(),
                differ=(pl.col("external_id") != pl.col("correlation")).mean(),
            )
            .collect(engine="streaming")
            .row(0, named=True)
        )
        flow_cats = set(
            pl.scan_parquet(flat_dir / "flows.parquet").select(pl.col("cat").unique()).collect()["cat"].drop_nulls()
        )
        return cls(
            events,
            flat_dir / "flows.parquet",
            gpu_ops,
            cats,
            launches_share_gpu_correlation=gpu["missing"] == 0,
            trust_external_id=gpu["differ"] is not None and gpu["differ"] >= 0.5,
            reach=reach,
            cells=TimeCells.of(histogram, bins, CELL_SLICES),
            inside_flows=bool(flow_cats & {cat for cat, _ in INSIDE_FLOWS}),
            op_flows=bool(flow_cats & {cat for cat, _ in OP_FLOWS}),
            launch_flows=bool(flow_cats & set(LINK_FLOW_CATS)),
        )

    @property
    def step_cats(self) -> tuple[str, ...]:
        """The trace's categories of context slices that can be ProfilerStep#N (`kineto.STEP_CATS`)."""
        return tuple(c for k in CONTEXT_KINDS for c in self.cats[k] if c.lower() in STEP_CATS)

    def is_slice(self, *kinds: int) -> pl.Expr:
        """Events that are CPU slices of these kinds (complete events with a thread and a start)."""
        cats = [c for k in kinds for c in self.cats[k]]
        where = (
            _one_of("cat", cats)
            & SLICE
            & pl.col("pid").is_not_null()
            & pl.col("tid").is_not_null()
            & pl.col("ts_ns").is_not_null()
        )
        if MODULE in kinds and self.cats[MODULE]:  # of python functions, only nn.Module calls
            where &= ~_one_of("cat", self.cats[MODULE]) | pl.col("name").str.starts_with(MODULE_PREFIX)
        return where

    def running_slices(self) -> RunningSlices:
        """A reader of the context slices (ops, annotations, modules) running around launches."""
        return RunningSlices(partial(_context_slices, self), self.reach)

    def kind(self) -> pl.Expr:
        """The slice kind (LAUNCH, CPU_OP, ...) of an event from its category."""
        out = pl.lit(None, pl.Int8)
        for k in reversed(KIND_CATS):
            out = pl.when(_one_of("cat", self.cats[k])).then(pl.lit(k, pl.Int8)).otherwise(out)
        return out


def _is_launch_flow(flows: tuple = LAUNCH_FLOWS) -> pl.Expr:
    """Flow endpoints of the launch -> GPU activity flows of every layout (`kineto.LAUNCH_FLOWS`:
    a category, and the name where the category alone says too little, as the 2021 `async`)."""
    out = pl.lit(False)
    for cat, name in flows:
        out |= (pl.col("cat") == cat) if name is None else (pl.col("cat") == cat) & (pl.col("name") == name)
    return out


def _one_of(column: str, values) -> pl.Expr:
    """The string column is one of `values`."""
    return pl.col(column).is_in(pl.Series(list(values), dtype=pl.String).implode())


def among(column: str, values: pl.Series) -> pl.Expr:
    """column is one of `values`; the range first, so the reader can skip row groups outside it."""
    values = values.drop_nulls()
    if values.is_empty():
        return pl.lit(False)
    low, high = pl.lit(values.min(), values.dtype), pl.lit(values.max(), values.dtype)  # strings are no column names
    return pl.col(column).is_between(low, high) & pl.col(column).is_in(values.unique().implode())


def _in_range(column: str, values: pl.Series) -> pl.Expr:
    """column lies between the smallest and the largest of `values` (none: never)."""
    values = values.drop_nulls()
    return pl.col(column).is_between(values.min(), values.max()) if values.len() else pl.lit(False)


def read_where(path: Path, where: pl.Expr, columns: list) -> pl.DataFrame:
    """The rows of a Parquet file that `where` selects, streaming: rows are filtered row group by
    row group, and the other columns decoded for the rows kept."""
    return pl.scan_parquet(path).filter(where).select(columns).collect(engine="streaming")


def link_batches(
    flat_dir: Path,
    carry: tuple[str, ...] = (),
    row_groups: Sequence[int] | None = None,
    src: LinkSources | None = None,
    ahead: bool = True,
) -> Iterator[pl.DataFrame]:
    """(event_idx, correlation, *LINK_COLUMNS, *carry) of the GPU ops of a flattened trace, BATCH_ROWS
    at a time in the order of its gpu_ops.parquet; `carry` are gpu_ops columns passed through (the
    kernel name as a categorical). `row_groups`: only the GPU ops of these row groups of
    gpu_ops.parquet (`gpu_parts`); `src`: the trace's `LinkSources`, when known already.
    Yields at least one frame (empty when there are no GPU ops). With `ahead`, what the next
    batch reads (the slices around its launches: `_Read`) is read while this one is nested, and
    the launches of the one after are looked up meanwhile (`store.one_ahead`): three batches in
    memory at once; without, one."""
    src = src or LinkSources.of(flat_dir)
    carried = [c for c in carry if c not in GPU_LINK_INPUTS]
    batches = _gpu_batches(src, list(dict.fromkeys([*GPU_LINK_INPUTS, *carry])), row_groups)
    running = src.running_slices()
    launched: Iterator[tuple[tuple[pl.DataFrame, list[pl.DataFrame]], pl.DataFrame]] = (
        (_launched(src, gpu.select(GPU_LINK_INPUTS)), gpu.select(carried)) for gpu in batches
    )
    if ahead:  # a batch's launches are looked up while the one before reads its slices
        launched = store.one_ahead(launched)
    read = ((_Read.around(src, running, *found), passed) for found, passed in launched)
    for batch, passed in store.one_ahead(read) if ahead else read:
        yield _context_of(src, batch).hstack(passed)


def gpu_parts(flat_dir: Path, parts: int) -> list[list[int]]:
    """The row groups of a flattened trace's gpu_ops.parquet in up to `parts` runs of consecutive
    ones holding about as many GPU ops each (`link_batches` of each run, concatenated in order,
    give the same rows as one of the whole file): parts of the work that can run side by side."""
    meta = pq.ParquetFile(Path(flat_dir) / "gpu_ops.parquet").metadata
    rows = [meta.row_group(i).num_rows for i in range(meta.num_row_groups)]
    out: list[list[int]] = [[]]
    total, have = sum(rows), 0
    for i, n in enumerate(rows):
        if out[-1] and have >= total * len(out) / parts and len(out) < parts:
            out.append([])
        out[-1].append(i)
        have += n
    return [p for p in out if p] or [[]]


def _gpu_batches(
    src: LinkSources, columns: list[str], row_groups: Sequence[int] | None = None
) -> Iterator[pl.DataFrame]:
    """The GPU ops' `columns` (of `row_groups` only, if given), BATCH_ROWS at a time; one empty
    frame when there are none. Kernel names come as categoricals: decoding them as strings was
    most of the time of the read."""
    read_as_dictionary = [c for c in columns if c in _REPEATED_GPU_TEXT]
    empty = True
    for batch in store.read_batches(
        src.gpu_ops, BATCH_ROWS, columns, read_dictionary=read_as_dictionary, row_groups=row_groups
    ):
        empty = False
        yield store.frame_from_arrow(batch)
    if empty:
        yield (
            pl.scan_parquet(src.gpu_ops)
            .select(columns)
            .clear()
            .with_columns(pl.col(c).cast(pl.Categorical) for c in read_as_dictionary)
            .collect()
        )


def link_batch(src: LinkSources, gpu: pl.DataFrame) -> pl.DataFrame:
    """(event_idx, correlation, *LINK_COLUMNS) of GPU ops (GPU_LINK_INPUTS), in their order."""
    return _context_of(src, _Read.of(src, src.running_slices(), gpu))


@dataclass(frozen=True)
class _Read:
    """A batch of GPU ops with their launches (`_launches_of`) and, per time cell of the launches
    (in time order), the launch points and the CPU slices running around them (`_slices_running`):
    what linking the batch reads from the events but for rule 4, so that nesting them
    (`_context_of`) can run beside the reads of the next batch."""

    linked: pl.DataFrame
    cells: list[tuple[pl.DataFrame, pl.DataFrame]]  # (points, slices)

    @classmethod
    def of(cls, src: LinkSources, running: RunningSlices, gpu: pl.DataFrame) -> _Read:
        return cls.around(src, running, *_launched(src, gpu))

    @classmethod
    def around(cls, src: LinkSources, running: RunningSlices, linked: pl.DataFrame, points: list) -> _Read:
        """The batch of GPU ops `_launched` found the launches (`linked`) and `points` of, with the
        slices running around the points of each time cell. `running` reads on from where the
        batch before left it: batches are read in order."""
        return cls(linked, [(p, _slices_running(src, running, p)) for p in points])


def _launched(src: LinkSources, gpu: pl.DataFrame) -> tuple[pl.DataFrame, list[pl.DataFrame]]:
    """A batch of GPU ops with their launches (`_launches_of`), and the points whose context is
    wanted (point_id, pid, tid, t, via) per time cell of the launches, in time order: what reads
    nothing of the batches before, so that it can run ahead of their slices' reads."""
    linked = _launches_of(src, gpu)
    points = linked.filter(pl.col("launch_event_idx").is_not_null()).select(
        point_id="event_idx", pid="launch_pid", tid="launch_tid", t="launch_ts_ns", via=pl.lit("nesting")
    )
    if src.op_flows:  # rule 6: the context at the start of the op a flow names, where there is one
        at_op = _op_flow_points(src, gpu)
        points = pl.concat([at_op, points.join(at_op, on="point_id", how="anti")])
    cells = points.with_columns(cell=src.cells.cell(points["t"])).partition_by("cell", include_key=False, as_dict=True)
    return linked, [cells[k] for k in sorted(cells)] or [points]


def _launches_of(src: LinkSources, gpu: pl.DataFrame) -> pl.DataFrame:
    """GPU ops (GPU_LINK_INPUTS) with their launch (rules 1 and 2): event_idx, correlation,
    launch_event_idx, launch_link and the launch's name, pid, tid, ts_ns, dur_ns and external_id."""
    corrs = gpu["correlation"].drop_nulls().unique()
    flows = _flows(src, gpu, corrs)
    launches = _launch_candidates(src, corrs, flows.filter(pl.col("ph") == "s"))
    launch = launch_links(launches.lazy(), gpu.lazy(), flows.lazy())
    if src.inside_flows:  # rule 5, for the GPU ops rules 1 and 2 left without a launch
        inside, calls = _inside_launches(src, gpu)
        launch = pl.concat([launch, inside.lazy().join(launch, on="event_idx", how="anti")])
        launches = pl.concat([launches, calls]).unique("event_idx", keep="first", maintain_order=True)
    about_launch = launches.lazy().select(
        launch_event_idx="event_idx",
        launch_name="name",
        launch_pid="pid",
        launch_tid="tid",
        launch_ts_ns="ts_ns",
        launch_dur_ns="dur_ns",
        launch_external_id="external_id",
    )
    return (
        gpu.lazy()
        .select("event_idx", "correlation")
        .join(launch, on="event_idx", how="left", maintain_order="left")
        .join(about_launch, on="launch_event_idx", how="left", maintain_order="left")
    ).collect()


def _context_of(src: LinkSources, batch: _Read) -> pl.DataFrame:
    """(event_idx, correlation, *LINK_COLUMNS) of a batch of GPU ops: the CPU op and context around
    their launches (rules 3 and 4)."""
    context = pl.concat([_context_in_cell(points, slices) for points, slices in batch.cells])
    out = batch.linked.join(context, on="event_idx", how="left", maintain_order="left")
    return (
        _external_id_fallback(src, out)
        .with_columns(
            pl.col("launch_name").cast(pl.String),
            step=pl.col("step_name").str.extract(STEP_NAME, 1).cast(pl.Int64),
            module=pl.col("module").str.strip_prefix(MODULE_PREFIX),
        )
        .select("event_idx", "correlation", *LINK_COLUMNS)
    )


def _flows(src: LinkSources, gpu: pl.DataFrame, corrs: pl.Series) -> pl.DataFrame:
    """The flows that can link these GPU ops (correlation ids `corrs`): (ph, cat, id, pid, tid,
    ts_ns) of the `f` endpoints at their (pid, tid, ts) and of the `s` endpoints with the same
    (cat, id).

    One read finds the `f` endpoints by time and the `s` endpoints by the ops' correlation ids (a
    Kineto flow's id is its launch's correlation id): Kineto writes both ends of a flow near each
    other, so they lie in the same row groups, decoded once. The read selects by the ranges of
    times and ids only, the exact ones are picked from what it returns (measured cheaper than
    looking each row's value up while reading), and `f` endpoints by the ops' processes too (a
    Kineto of May 2023, `hta/a100_old_format_rank0`, also ends ac2g flows on runtime calls such as
    cudaEventQuery, without a start: 1.2 M of the 1.5 M ends of that trace scaled to 1 GB, each
    read and joined for nothing; `_flows` 0.45-0.62 -> 0.36-0.44 CPU-s there). `s` endpoints with
    other ids are read after."""
    if not src.launch_flows:  # none to read (a trace without flows: 7.6 ms a batch, 0.16 CPU-s a GB)
        return pl.DataFrame(schema={c: _FLOW_TYPES[c] for c in _FLOW_COLS})
    at = gpu.select(_THREAD_TIME).drop_nulls()  # repeated: `among` and the semi-join take them so
    link_flow = _is_launch_flow() & pl.col("id").is_not_null()
    is_end, is_start = pl.col("ph") == "f", pl.col("ph") == "s"
    found = read_where(
        src.flows,
        link_flow
        & ((is_end & _in_range("ts_ns", at["ts_ns"]) & among("pid", at["pid"])) | (is_start & _in_range("id", corrs))),
        _FLOW_COLS,
    )
    ends = found.filter(is_end).join(at, on=_THREAD_TIME, how="semi")
    starts = found.filter(is_start & pl.col("id").is_in(corrs.implode()))
    pairs = ends.select("cat", "id").unique()
    other_ids = pairs["id"].filter(~pairs["id"].is_in(corrs.implode()))
    if not other_ids.is_empty():
        starts = pl.concat([starts, read_where(src.flows, link_flow & is_start & among("id", other_ids), _FLOW_COLS)])
    return pl.concat([ends, starts.join(pairs, on=["cat", "id"], how="semi")])


def _launch_candidates(src: LinkSources, corrs: pl.Series, flow_starts: pl.DataFrame) -> pl.DataFrame:
    """The runtime/driver calls that can have launched a batch of GPU ops (_LAUNCH_COLUMNS): those
    sharing a correlation id with one (`corrs`), and those at the start of a flow that ends at one
    (when every GPU op has a correlation id, only calls sharing one with some GPU op of the trace).

    The calls by correlation are read first: a Kineto flow's id is its launch's correlation id, so
    they are at almost every flow start already, and only the flow starts with no call among them
    are looked up by time, in a second read (the ~30K start times of a batch in the first read's
    predicate took a third of it: 32 -> 21 ms a batch of the 1 GB HTA trace). The result is in
    file order, each call once."""
    at = flow_starts.select(_THREAD_TIME)  # repeated: `among` and the semi-join take them so
    calls = read_where(src.events, src.is_slice(LAUNCH) & among("correlation", corrs), _LAUNCH_COLUMNS)
    if at.is_empty():
        return calls
    unmatched = at.join(calls.select(_THREAD_TIME), on=_THREAD_TIME, how="anti")
    if not unmatched.is_empty():
        more = read_where(src.events, src.is_slice(LAUNCH) & among("ts_ns", unmatched["ts_ns"]), _LAUNCH_COLUMNS)
        calls = pl.concat([calls, more]).unique("event_idx", keep="first").sort("event_idx")
    by_correlation = pl.col("correlation").is_in(corrs.implode())
    at_flows = calls.join(at, on=_THREAD_TIME, how="semi")
    if src.launches_share_gpu_correlation:
        shared = _gpu_correlations_among(src, at_flows["correlation"], corrs)
        at_flows = at_flows.filter(pl.col("correlation").is_in(shared.implode()))
    return calls.filter(by_correlation | pl.col("event_idx").is_in(at_flows["event_idx"].implode()))


def _gpu_correlations_among(src: LinkSources, corrs: pl.Series, known: pl.Series) -> pl.Series:
    """The correlation ids in `corrs` that some GPU op of the trace carries (`known` ones do)."""
    other = corrs.drop_nulls().unique()
    other = other.filter(~other.is_in(known.implode()))
    if other.is_empty():
        return known
    found = read_where(src.gpu_ops, among("correlation", other), ["correlation"])["correlation"]
    return pl.concat([known, found.unique()])


def launch_links(launch_slices: pl.LazyFrame, gpu: pl.LazyFrame, flows: pl.LazyFrame) -> pl.LazyFrame:
    """event_idx of each GPU op -> launch_event_idx, launch_link ('flow' | 'correlation')."""
    launches = launch_slices.select(
        pl.col("event_idx").alias("launch_event_idx"), "pid", "tid", "ts_ns", pl.col("correlation").alias("launch_corr")
    )
    # one scan per endpoint: a filtered frame shared by both would be held whole (all the flows)
    fl = lambda ph: flows.filter(
        (pl.col("ph") == ph) & pl.col("cat").is_in(LINK_FLOW_CATS) & pl.col("id").is_not_null()
    ).select("cat", "id", "pid", "tid", "ts_ns")
    starts = (
        fl("s")
        .join(launches, on=["pid", "tid", "ts_ns"], how="inner")
        .group_by("cat", "id")
        .agg(pl.col("launch_event_idx").min(), pl.col("launch_corr").sort_by("launch_event_idx").first())
    )
    g = gpu.select("event_idx", "pid", "tid", "ts_ns", "correlation")
    ends = fl("f").join(g, on=["pid", "tid", "ts_ns"], how="inner").select("cat", "id", "event_idx", "correlation")
    by_flow = (
        ends.join(starts, on=["cat", "id"], how="inner")
        .filter(
            pl.col("correlation").is_null()
            | pl.col("launch_corr").is_null()
            | (pl.col("correlation") == pl.col("launch_corr"))
        )
        .group_by("event_idx")
        .agg(pl.col("launch_event_idx").min())
        .with_columns(launch_link=pl.lit("flow"))
    )
    first_by_corr = (
        launches.filter(pl.col("launch_corr").is_not_null())
        .group_by("launch_corr")
        .agg(pl.col("launch_event_idx").min())
    )
    by_corr = (
        g.join(by_flow.select("event_idx"), on="event_idx", how="anti")
        .join(first_by_corr, left_on="correlation", right_on="launch_corr", how="inner")
        .select("event_idx", "launch_event_idx", launch_link=pl.lit("correlation"))
    )
    return pl.concat([by_flow.select("event_idx", "launch_event_idx", "launch_link"), by_corr])


_FLOW_KEY = ["cat", "id", "id_str"]  # a flow's two endpoints share these (string ids: id is null)


def _flow_pairs(src: LinkSources, gpu: pl.DataFrame, flows: tuple) -> pl.DataFrame:
    """(event_idx, pid, tid, t) of the `s` endpoints of the flows (`flows`: (cat, name) pairs)
    whose `f` endpoint is at a GPU op's (pid, tid, ts); ids as integers or as strings."""
    at = gpu.select(_THREAD_TIME).drop_nulls().unique()
    cols = [*_FLOW_KEY, "pid", "tid", "ts_ns"]
    of_kind = _is_launch_flow(flows) & (pl.col("id").is_not_null() | pl.col("id_str").is_not_null())
    ends = read_where(src.flows, of_kind & (pl.col("ph") == "f") & _in_range("ts_ns", at["ts_ns"]), cols)
    ends = ends.join(at, on=_THREAD_TIME, how="semi")
    if ends.is_empty():
        return pl.DataFrame(schema={"event_idx": pl.Int64, "pid": pl.Int64, "tid": pl.Int64, "t": pl.Int64})
    by_id = among("id", ends["id"]) | among("id_str", ends["id_str"])
    starts = read_where(src.flows, of_kind & (pl.col("ph") == "s") & by_id, cols)
    starts = starts.unique(_FLOW_KEY, keep="first", maintain_order=True)
    pairs = ends.join(starts, on=_FLOW_KEY, how="inner", nulls_equal=True, suffix="_s")
    return (
        gpu.select("event_idx", *_THREAD_TIME)
        .join(pairs, on=_THREAD_TIME, how="inner")
        .select("event_idx", pid="pid_s", tid="tid_s", t="ts_ns_s")
        .unique("event_idx", keep="first", maintain_order=True)
    )


def _op_flow_points(src: LinkSources, gpu: pl.DataFrame) -> pl.DataFrame:
    """Rule 6: (point_id, pid, tid, t, via) of the GPU ops a flow from their op ends at: the op's start."""
    return _flow_pairs(src, gpu, OP_FLOWS).select(
        point_id="event_idx", pid="pid", tid="tid", t="t", via=pl.lit("op_flow")
    )


def _inside_launches(src: LinkSources, gpu: pl.DataFrame) -> tuple[pl.DataFrame, pl.DataFrame]:
    """Rule 5: (event_idx, launch_event_idx, launch_link) of the GPU ops a flow ends at that starts
    inside a launch call (the innermost one running at the flow's start on its thread id, whatever
    process the flow names), and those calls (_LAUNCH_COLUMNS)."""
    starts = _flow_pairs(src, gpu, INSIDE_FLOWS)
    none = pl.DataFrame(schema={"event_idx": pl.Int64, "launch_event_idx": pl.Int64, "launch_link": pl.String})
    if starts.is_empty():
        return none, read_where(src.events, pl.lit(False), _LAUNCH_COLUMNS)
    first, last = starts["t"].min(), starts["t"].max()
    end = pl.col("ts_ns") + pl.col("dur_ns").fill_null(0)
    calls = read_where(
        src.events,
        src.is_slice(LAUNCH) & among("tid", starts["tid"]) & (pl.col("ts_ns") <= last) & (end >= first),
        _LAUNCH_COLUMNS,
    )
    if calls.is_empty():
        return none, calls
    # the innermost call around each start: the last one started at or before it that still runs
    around = (
        starts.sort("t")
        .join_asof(
            calls.select("tid", launch_event_idx="event_idx", _ts="ts_ns", _end=end).sort("_ts"),
            left_on="t",
            right_on="_ts",
            by="tid",
            strategy="backward",
            check_sortedness=False,
        )
        .filter(pl.col("_end") >= pl.col("t"))
        .select("event_idx", "launch_event_idx", launch_link=pl.lit("flow"))
    )
    return around, calls.join(around.select(event_idx="launch_event_idx").unique(), on="event_idx", how="semi")


# the nesting hierarchies of context slices (ops, ProfilerStep#N annotations, other annotations,
# modules), each nested apart: (name, code, whether a launch takes its outermost slice, else innermost)
NESTS = (("cpu_op", 0, False), ("step", 1, False), ("annotation", 2, True), ("module", 3, True))
API_NEST = (
    4  # ops that are a vendor API's call (`kineto.API_OPS`), in traces with op flows: nested apart, never a task's op
)


def _context_in_cell(points: pl.DataFrame, slices: pl.DataFrame) -> pl.DataFrame:
    """(event_idx, cpu_op_event_idx, cpu_op_link, cpu_op_name, step_name, annotation, module) of the
    launch points (point_id, pid, tid, t) of a time cell, from the slices running around them."""
    candidates = slices.filter("maybe_step")  # few (annotations): only their names are matched
    steps = candidates.filter(pl.col("name").cast(pl.String).str.contains(STEP_NAME))["event_idx"]
    nest = (
        pl.when(pl.col("event_idx").is_in(steps.implode()))
        .then(1)
        .when(pl.col("api_call"))
        .then(API_NEST)
        .when(pl.col("kind") == CPU_OP)
        .then(0)
        .when(pl.col("kind") == MODULE)
        .then(3)
        .otherwise(2)
        .cast(pl.Int8)
    )
    intervals = slices.select(iv_idx="event_idx", pid="pid", tid="tid", nest=nest, ts_ns="ts_ns", end_ns="end_ns")
    # every point once per nest that has slices here (modules often have none), nest after nest:
    # the answers of the k-th of them are rows k*n to (k+1)*n
    have = set(intervals["nest"].unique())
    present = [(name, code) for name, code, _ in NESTS if code in have]
    each_nest = pl.concat(
        [points.select("pid", "tid", "t", nest=pl.lit(code, pl.Int8)) for _, code in present]
        or [points.select("pid", "tid", "t", nest=pl.lit(None, pl.Int8))]
    )
    outermost = each_nest["nest"].is_in([code for _, code, outer in NESTS if outer])
    rows = nesting.rows_around(each_nest, intervals, nesting.LONGER_FIRST, outermost, by=("pid", "tid", "nest"))
    named = slices.select(iv_idx=pl.col("event_idx").gather(rows), name=pl.col("name").gather(rows).cast(pl.String))
    n = points.height
    none = named.clear(n)  # a nest without slices: nothing around any point
    of_nest = {name: none for name, _, _ in NESTS} | {
        name: named.slice(k * n, n) for k, (name, _) in enumerate(present)
    }
    cpu_op_event_idx = of_nest["cpu_op"]["iv_idx"]
    via = points["via"] if "via" in points.columns else pl.lit("nesting")
    return points.select(event_idx="point_id").with_columns(
        cpu_op_event_idx=cpu_op_event_idx,
        cpu_op_link=pl.when(cpu_op_event_idx.is_not_null()).then(via),
        cpu_op_name=of_nest["cpu_op"]["name"],
        step_name=of_nest["step"]["name"],
        annotation=of_nest["annotation"]["name"],
        module=of_nest["module"]["name"],
    )


def context_at(src: LinkSources, points: pl.DataFrame) -> pl.DataFrame:
    """(event_idx, cpu_op_event_idx, cpu_op_link, cpu_op_name, step_name, annotation, module) of CPU
    points (point_id, pid, tid, t) other than a batch's launches (rule 3, by nesting: the calls a
    capture trace captured into graphs), read one time cell after another as `_Read` does."""
    running = src.running_slices()
    cells = points.with_columns(cell=src.cells.cell(points["t"])).partition_by("cell", include_key=False, as_dict=True)
    in_order = [cells[k] for k in sorted(cells)] or [points]
    return pl.concat([_context_in_cell(p, _slices_running(src, running, p)) for p in in_order])


def _slices_running(src: LinkSources, running: RunningSlices, points: pl.DataFrame) -> pl.DataFrame:
    """(event_idx, kind, name, pid, tid, ts_ns, end_ns) of the CPU slices (ops, annotations, modules)
    on the points' threads (pid, tid) that run at some time from the first point t to the last."""
    threads = points.select("pid", "tid").unique()
    if points.is_empty():
        return _context_slices(src, pl.lit(False), threads)
    first, last = points["t"].min(), points["t"].max()
    assert isinstance(first, int) and isinstance(last, int)  # int64 ns: launches have a start
    return running.between(threads, first, last)


def api_call() -> pl.Expr:
    """A CPU op that is a vendor API's call (`kineto.API_OPS`)."""
    out = pl.lit(False)
    for pattern, unless in API_OPS:
        hit = pl.col("name").cast(pl.String).str.contains(pattern)
        out |= hit if unless is None else hit & ~pl.col("name").cast(pl.String).str.contains(unless)
    return out


def _context_slices(src: LinkSources, where: pl.Expr, threads: pl.DataFrame) -> pl.DataFrame:
    """(event_idx, kind, name, pid, tid, ts_ns, end_ns) of the CPU slices on `threads` (pid, tid)
    that `where` selects (`RunningSlices`' reads)."""
    end = pl.col("ts_ns") + pl.col("dur_ns").fill_null(0)
    on_threads = pl.col("pid").is_in(threads["pid"].implode()) & pl.col("tid").is_in(threads["tid"].implode())
    slices = read_where(
        src.events,
        src.is_slice(*CONTEXT_KINDS) & where & on_threads,
        [
            "event_idx",
            src.kind().alias("kind"),
            pl.col("name").cast(pl.Categorical),
            "pid",
            "tid",
            "ts_ns",
            end.alias("end_ns"),
            _one_of("cat", src.step_cats).alias("maybe_step"),
            ((src.kind() == CPU_OP) & api_call() if src.op_flows else pl.lit(False)).alias("api_call"),
        ],
    )
    return slices.join(threads, on=["pid", "tid"], how="semi")


def gpu_links(flat_dir: Path) -> pl.DataFrame:
    """(event_idx, correlation, *LINK_COLUMNS) of every GPU op of a flattened trace, in the order of
    its gpu_ops.parquet (all batches of `link_batches` together). Only the GPU ops'
    `GPU_LINK_INPUTS` are read: the wide table is joined afterwards (`with_links`)."""
    return pl.concat(list(link_batches(flat_dir)))


def with_links(flat_dir: Path, links: pl.DataFrame) -> pl.LazyFrame:
    """The flattened gpu_ops of `flat_dir` with the link columns of `links` (`gpu_links`), sorted by
    event_idx. Flatten writes GPU ops in file order, so the scan is sorted already and the query
    streams; it sorts (holding the whole table) only if it is not."""
    gpu = pl.scan_parquet(Path(flat_dir) / "gpu_ops.parquet").select(schema.table("gpu_ops").names(("flatten",)))
    out = gpu.join(links.drop("correlation").lazy(), on="event_idx", how="left", maintain_order="left")
    return out if links["event_idx"].is_sorted() else out.sort("event_idx")


def link_gpu_ops(flat_dir: Path) -> tuple[pl.DataFrame, dict]:
    """gpu_ops of a flattened trace with link columns added, and link counts by reason."""
    # only the flattened columns are read: linking an already linked directory again gives the same result
    out = with_links(flat_dir, gpu_links(flat_dir)).collect()
    return out, link_counts(out)


def _external_id_fallback(src: LinkSources, out: pl.DataFrame) -> pl.DataFrame:
    """cpu_op by External id for launches no op contains, where External id is trustworthy. An
    External id of 0 names no op: Kineto writes 0 for a runtime call without a linked CPU op (the
    2021 layout, `kineto/v100_tbplugin_resnet50`: 102 of its cudaLaunchKernel calls). Reading the
    ops with External id 0 found none there, and decoded most of the events to learn it (the
    range 0..0 rules out no row group that also holds such calls): 0.5 CPU-s of a 1 GB trace."""
    if not src.trust_external_id:
        return out
    unlinked = pl.col("cpu_op_event_idx").is_null()
    wanted = out.filter(unlinked & (pl.col("launch_external_id") != 0))["launch_external_id"]
    if wanted.is_empty():
        return out
    ops = read_where(
        src.events,
        src.is_slice(CPU_OP) & among("external_id", wanted),
        ["event_idx", "external_id", pl.col("name").cast(pl.String)],
    )
    by_ext = (
        ops.sort("event_idx")
        .group_by("external_id")
        .agg(ext_op_idx=pl.col("event_idx").last(), ext_op_name=pl.col("name").last())
    )
    return (
        out.join(by_ext, left_on="launch_external_id", right_on="external_id", how="left", maintain_order="left")
        .with_columns(
            cpu_op_link=pl.when(unlinked & pl.col("ext_op_idx").is_not_null())
            .then(pl.lit("external_id"))
            .otherwise(pl.col("cpu_op_link")),
            cpu_op_name=pl.when(unlinked).then(pl.col("ext_op_name")).otherwise(pl.col("cpu_op_name")),
            cpu_op_event_idx=pl.coalesce("cpu_op_event_idx", "ext_op_idx"),
        )
        .drop("ext_op_idx", "ext_op_name")
    )


def link_counts(g: pl.DataFrame) -> dict:
    """How many GPU ops were linked, and why the others were not."""
    c = g.select(
        total=pl.len(),
        by_flow=(pl.col("launch_link") == "flow").sum(),
        by_corr=(pl.col("launch_link") == "correlation").sum(),
        no_launch_with_corr=(pl.col("launch_event_idx").is_null() & pl.col("correlation").is_not_null()).sum(),
        no_corr=(pl.col("launch_event_idx").is_null() & pl.col("correlation").is_null()).sum(),
        op_nesting=(pl.col("cpu_op_link") == "nesting").sum(),
        op_external=(pl.col("cpu_op_link") == "external_id").sum(),
        launch_outside_op=(pl.col("launch_event_idx").is_not_null() & pl.col("cpu_op_event_idx").is_null()).sum(),
    ).row(0, named=True)
    return {
        "link:launch_by_flow": c["by_flow"],
        "link:launch_by_correlation": c["by_corr"],
        "unlinked:no_launch_event_for_correlation (launched before profiling started?)": c["no_launch_with_corr"],
        "unlinked:no_correlation_id": c["no_corr"],
        "link:cpu_op_by_nesting": c["op_nesting"],
        "link:cpu_op_by_external_id": c["op_external"],
        "unlinked:launch_not_inside_a_cpu_op": c["launch_outside_op"],
    }
