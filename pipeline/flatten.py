"""flatten: the driver. Reads a trace (`read.source`), has its chunks decoded into tables
(`read.decode`, in `read.workers` for a large trace), writes them to Parquet in file order, then
links and costs them (`cost.enrich`). Memory stays bounded by chunk size times workers.
"""

from __future__ import annotations

import gc
import os
import shutil
import tempfile
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator, Sequence
from contextlib import ExitStack
from dataclasses import dataclass, field
from multiprocessing.pool import Pool
from pathlib import Path

import orjson
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from pipeline import schema, store
from pipeline.errors import BadTrace, TracepipeError, UsageError
from pipeline.kineto import trace_stem
from pipeline.read import head_start
from pipeline.read.by_native import available as native_available
from pipeline.read.chunks import ordered_results
from pipeline.read.decode import build_chunk, build_from_text
from pipeline.read.durations import Durations
from pipeline.read.launches import LaunchCount
from pipeline.read.limits import not_regular
from pipeline.read.metadata import devices_table, sampled_content_id, trace_row
from pipeline.read.source import ARRAY_NOT_CLOSED, DEFAULT_CHUNK_BYTES, NATIVE_CHUNK_BYTES, TraceSource
from pipeline.read.tables import ChunkTables
from pipeline.read.tame import BAD_UNICODE, TOO_LARGE, scrub
from pipeline.read.values import Problems
from pipeline.read.workers import (
    SpilledChunk,
    default_workers,
    give_back_freed_memory,
    in_flight,
    slots_home,
    start_pool,
    stop_forkserver,
    submitter,
    unspill,
)
from pipeline.runs.tables import write_empty_run_tables, write_run_tables


@dataclass
class FlattenResult:
    out_dir: Path
    n_events: int
    n_gpu_ops: int
    n_flows: int
    n_devices: int
    truncated: bool
    truncation_reason: str | None
    problems: dict
    warnings: list
    seconds: dict = field(default_factory=dict)  # wall seconds by stage: "flatten", "link_cost"
    chunking: Chunking | None = None  # how the trace was read, when every chunk parsed alone

    @property
    def ok(self) -> bool:
        return not self.truncated


@dataclass(frozen=True)
class Chunking:
    """How a trace was read: its pieces (`TraceSource(path, chunk_bytes).pieces(spans)`) and the
    events each held, in order; a later pass over the same pieces needs to parse only those it
    wants events of (`rewrite.slice`)."""

    spans: bool
    chunk_bytes: int
    rows: tuple[int, ...]


def _offset(tbl: pa.Table, offset: int) -> pa.Table:
    if offset == 0 or tbl.num_rows == 0:
        return tbl
    i = tbl.schema.get_field_index("event_idx")
    return tbl.set_column(i, "event_idx", pc.add(tbl.column(i), pa.scalar(offset, pa.int64())))


def _write_chunk(writers: dict, ct: ChunkTables, offset: int):
    """A chunk's tables appended to their files, its event_idx made the trace's."""
    for name in ("events", "gpu_ops", "flows"):
        writers[name].write(_offset(getattr(ct, name), offset))


# Rows of each table gathered before a write while reading: the chunks' tables wait for them in
# the main process's memory, copied out of the workers' slots (`read.workers.Slots`). With 64K
# rows and two writes queued the 1 GB traces peaked at 424-467 MB; with 32K and one, at 389-429,
# no slower (three alternating runs each; linking reads the smaller row groups as fast).
READ_BUFFER_ROWS = 1 << 15


def flatten_into(
    path: str,
    tmp: Path,
    workers: int | None = None,
    chunk_bytes: int | None = None,
    progress: Callable[[int], None] | None = None,
    max_inflate: float | None = None,
):
    """Read one trace and write events/gpu_ops/flows/devices/trace Parquet files into `tmp`.

    Returns (trace_row dict, Problems, Tail, Chunking or None). Link and cost run afterwards over
    these files.
    With workers, chunks go to them as file positions where the file is uncompressed (they read
    the bytes themselves) and come back as Arrow files in shared memory (see `read.workers.Slots`).
    """
    started = head_start.take(path, workers, chunk_bytes, max_inflate)  # begun before the imports?
    if started:
        workers, chunk_bytes, src = started.workers, started.chunk_bytes, started.src
    else:
        workers = default_workers(path) if workers is None else max(1, workers)
        parallel_native = workers > 1 and native_available()  # larger chunks pay there (`NATIVE_CHUNK_BYTES`)
        chunk_bytes = chunk_bytes or (NATIVE_CHUNK_BYTES if parallel_native else DEFAULT_CHUNK_BYTES)
        src = TraceSource(path, chunk_bytes, max_inflate=max_inflate)
    problems = Problems()
    corrupt: list[str] = []
    device_ids: set = set()
    task_pids: set = set()  # processes of device tasks without a cat (`read.device_tasks`)
    cats: set = set()  # the event categories held, which tell the layout
    with ExitStack() as cleanup:  # undone in reverse, whatever happens (a full disk included)
        cleanup.callback(src.close)
        ahead = in_flight(workers)
        pool: Pool | None
        if started:
            spill_dir, pool = started.spill_dir, started.pool
        else:
            spill_dir = tempfile.mkdtemp(prefix="tracepipe-", dir=slots_home(tmp, ahead + 1, chunk_bytes))
        cleanup.callback(shutil.rmtree, spill_dir, True)
        if gc.isenabled():
            gc.disable()
            cleanup.callback(gc.enable)
        if not started:
            pool = start_pool(workers) if workers > 1 else None  # before the outputs are open: workers inherit none
        if pool:
            cleanup.callback(stop_forkserver)
            cleanup.callback(pool.terminate)
        writers = {
            n: store.TableWriter(tmp / f"{n}.parquet", n, buffer_rows=READ_BUFFER_ROWS)
            for n in ("events", "gpu_ops", "flows")
        }
        for w in writers.values():
            cleanup.callback(w.abandon)  # a no-op once closed
        submit: Callable | None
        if started:
            submit, pieces = started.submit, started.all_pieces()
        else:
            submit = submitter(pool, spill_dir, ahead + 1) if pool else None
            pieces = src.pieces(spans=pool is not None)
        results: Iterator[ChunkTables | SpilledChunk] = ordered_results(  # spilled by the workers
            pieces,
            build_from_text,
            build_chunk,
            submit=submit,
            max_inflight=ahead,
            on_corrupt=corrupt.append,
        )
        offset, rows = 0, []
        durations = Durations()  # B/E pairs across chunks
        launches = LaunchCount()  # against the device ops: device activity lost?
        # the writes in a thread while the workers build the next chunks; not without workers: a
        # thread writing the tables the main one builds grew the heap with the trace (glibc arenas)
        behind = cleanup.enter_context(store.WriteBehind(1 if pool else 0))  # ends before writers are abandoned
        for ct in map(unspill, results):
            durations.feed(ct.open_ends, offset)
            launches.add(ct.launches)
            behind.submit(_write_chunk, writers, ct, offset)
            offset += ct.events.num_rows
            rows.append(ct.events.num_rows)
            problems.merge(ct.problems)
            device_ids |= ct.device_ids
            task_pids |= ct.task_pids
            cats |= ct.cats
            if progress:
                progress(src.file_bytes_read)
        behind.drain()
        for w in writers.values():
            w.close()
        if pool:
            give_back_freed_memory()
        problems.unmatched.update(durations.finish())
        durations.patch(tmp / "events.parquet", lambda path: store.TableWriter(path, "events"))
        if task_pids:
            device_ids = _task_devices(tmp, task_pids, device_ids)
        if src.values_cut:
            problems.coerced[TOO_LARGE] += src.values_cut
    tail = src.tail
    if tail.unclosed:
        problems.coerced[ARRAY_NOT_CLOSED] += 1
    src.metadata, bad_strings = scrub(src.metadata)
    if bad_strings:
        problems.coerced[BAD_UNICODE] += bad_strings
    if corrupt and not tail.truncated:
        tail.truncated, tail.reason = True, corrupt[0]
    devices = devices_table(src.metadata, device_ids, problems)
    store.write_table(devices, tmp / "devices.parquet", "devices", ("flatten",))
    counts = {
        "n_events": writers["events"].rows,
        "n_gpu_ops": writers["gpu_ops"].rows,
        "n_flows": writers["flows"].rows,
        "n_devices": devices.num_rows,
    }
    row = trace_row(path, src.metadata, counts, problems, tail, cats, launches.problems(counts["n_gpu_ops"]))
    whole = not (tail.truncated or corrupt or src.values_cut)  # else chunks were merged or salvaged
    chunking = Chunking(pool is not None, src.chunk_bytes, tuple(rows)) if whole else None
    return row, problems, tail, chunking


def _task_devices(tmp: Path, task_pids: set, device_ids: set) -> set:
    """The device ids of a trace with device tasks that carry no cat, each task process's pid read
    by the scheme its sort index says (`read.device_tasks`); gpu_ops rewritten when a process was
    written by another scheme than the one the chunks assumed."""
    from pipeline.kineto import DEVICE_PIDS
    from pipeline.read.device_tasks import device_ids as task_device_ids
    from pipeline.read.device_tasks import rewrite_devices

    found = task_device_ids(tmp / "events.parquet", task_pids)
    fix = {p: d for p, d in found.items() if d != DEVICE_PIDS[0].device(p)}
    if fix:
        rewrite_devices(tmp / "gpu_ops.parquet", fix)
        kept = pc.unique(pq.read_table(tmp / "gpu_ops.parquet", columns=["device"]).column("device"))
        return set(kept.drop_null().to_pylist())
    return device_ids


def write_trace_table(row: dict, tmp: Path):
    t = pa.Table.from_pylist([row], schema=schema.table("trace").arrow_schema(schema.ALL_STAGES))
    store.write_table(t, tmp / "trace.parquet", "trace")


STAGES = ("read", "link+cost", "write")  # flatten's stages, as `flatten(stage=...)` names them
_CAPTURES: OrderedDict = OrderedDict()  # the graphs of capture traces read in this process (`read_captures`)
CAPTURES_KEPT = 8


def read_captures(
    paths: Sequence[str | os.PathLike],
    trace_ids: Sequence[str | None] | None = None,
    max_inflate: float | None = None,
):
    """The CUDA/HIP graphs each capture trace captured (`link.captures.CapturedGraphs`): each trace
    flattened without linking into a temporary directory, its graphs read, the directory removed.
    Kept per file (path, size, mtime) for the next replays of this process (a run's ranks share
    one capture trace). `trace_ids`: the trace_id each is known by (default: the one `flatten`
    gives it). A capture trace that cannot be read raises BadTrace."""
    from pipeline.link.captures import captured_graphs

    out, seen = [], set()
    for path, tid in zip(map(str, paths), trace_ids or [None] * len(paths)):
        why = not_regular(path)
        if why:
            raise BadTrace(f"graph capture trace {path}: {why}")
        st = os.stat(path)
        tid = tid or sampled_content_id(path)
        key = (os.path.realpath(path), st.st_size, st.st_mtime_ns, tid)
        if tid in seen:
            continue
        seen.add(tid)
        if key not in _CAPTURES:
            with tempfile.TemporaryDirectory(prefix="tracepipe-capture-") as tmp:
                try:
                    r = flatten(path, tmp, link=False, workers=1, max_inflate=max_inflate)
                except TracepipeError as e:
                    raise type(e)(f"graph capture trace {e if path in str(e) else f'{path}: {e}'}") from None
                _CAPTURES[key] = captured_graphs(r.out_dir, tid, trace_stem(path))
            while len(_CAPTURES) > CAPTURES_KEPT:
                _CAPTURES.popitem(last=False)
        _CAPTURES.move_to_end(key)
        out.append(_CAPTURES[key])
    return out


def flatten(
    path: str | os.PathLike,
    out: str | os.PathLike,
    *,
    workers: int | None = None,
    chunk_bytes: int | None = None,
    link: bool = True,
    device_specs: str | None = None,
    device: str | None = None,
    dtype: str | None = None,
    progress: Callable[[int], None] | None = None,
    max_inflate: float | None = None,
    stage: Callable[[str], None] | None = None,
    formulas=None,
    graph_captures: Sequence[str | os.PathLike] = (),
    capture_trace_ids: Sequence[str | None] | None = None,
    run_tables: bool = True,
) -> FlattenResult:
    """Flatten one trace into OUT/<stem>/{events,gpu_ops,flows,devices,trace}.parquet.

    The directory appears complete or not at all. With `link` (default) GPU ops are linked to
    their launches and CPU ops and costed (see `pipeline.link` and `pipeline.cost`); `formulas`, a
    formula file (its path, or as `pipeline.load_formulas` loaded it), costs the ops it names.

    For a progress display: `progress(n)` is called as reading goes on, n the bytes of the file
    read so far (compressed bytes for .gz and .zst: the file's size is the total); `stage(name)`
    as each of STAGES begins.

    `graph_captures`: capture traces of the CUDA/HIP graphs this trace replays (`read_captures`;
    `capture_trace_ids` the trace_ids to refer to them by): replayed kernels are given the ops that
    captured them (see `pipeline.link.graphs`).

    `run_tables=False` leaves out collectives.parquet and steps.parquet, what whole runs are
    measured from (`pipeline.runs`): for a flatten that one trace's report reads and throws away.
    """
    say_stage = stage or (lambda name: None)
    if formulas is not None:
        from pipeline.cost.formulas.user import as_formulas

        formulas = as_formulas(formulas)  # a path is loaded (and checked) before any work
    path = str(path)
    why = not_regular(path)
    if why:
        raise BadTrace(f"{path}: {why}")
    if graph_captures and not link:
        raise UsageError("--graph-capture pairs graph replays while linking: it cannot go with --no-link")
    final = Path(out) / trace_stem(path)
    warnings: list = []
    seconds = {}
    captures = read_captures(graph_captures, capture_trace_ids, max_inflate) if graph_captures else []
    with store.output_of(final, made=Path(out)), store.atomic_dir(final) as tmp:
        t0 = time.perf_counter()
        say_stage("read")
        try:
            row, problems, tail, chunking = flatten_into(path, tmp, workers, chunk_bytes, progress, max_inflate)
        except BadTrace as e:  # every input error names its file
            if path in str(e):
                raise
            raise BadTrace(f"{path}: {e}") from None
        seconds["flatten"] = time.perf_counter() - t0
        if link:
            from pipeline.cost.enrich import enrich

            t0 = time.perf_counter()
            say_stage("link+cost")
            warnings += enrich(
                tmp,
                row,
                device_specs=device_specs,
                device=device,
                dtype=dtype,
                formulas=formulas,
                captures=captures,
            )
            if run_tables:
                give_back_freed_memory()  # what linking freed, before the run tables' reads (-25 MB)
                write_run_tables(tmp, row)
            seconds["link_cost"] = time.perf_counter() - t0
        elif run_tables:
            write_empty_run_tables(tmp)
        say_stage("write")  # the trace table, then the directory committed
        write_trace_table(row, tmp)
    return FlattenResult(
        final,
        row["n_events"],
        row["n_gpu_ops"],
        row["n_flows"],
        row["n_devices"],
        tail.truncated,
        tail.reason,
        orjson.loads(row["problems_json"]),
        warnings,
        seconds,
        chunking,
    )
