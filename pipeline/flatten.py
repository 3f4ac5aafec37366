"""flatten: the driver. Reads a trace (`reader`), has its chunks built into tables (`columns`)
in worker processes, writes them to Parquet, then links and costs them (`cost.enrich`).

Memory stays bounded by chunk size times workers: workers read their chunk's bytes from the
file themselves (uncompressed input) and hand their tables back as Arrow files in shared memory,
and the main process writes each chunk's tables as they arrive, in order.
"""
from __future__ import annotations

import ctypes
import datetime as _dt
import gc
import hashlib
import multiprocessing as _mp
import os
import re
import shutil
import sys
import tempfile
import time
import warnings
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import orjson
import pyarrow as pa
import pyarrow.compute as pc

from pipeline.version import __version__

from pipeline import schema

from pipeline import store
from pipeline.kineto import trace_stem
from pipeline.read.decode import ChunkTables, Problems, as_int, build_chunk, build_from_text, dumps
from pipeline.errors import BadTrace
from pipeline.read.limits import not_regular
from pipeline.redact import redact
from pipeline.read.tame import BAD_UNICODE, TOO_LARGE, scrub
from pipeline.read.source import FileSpan, TraceSource, _run_local, json_bytes_estimate, ordered_results, text_of
PARALLEL_MIN_BYTES = 48 << 20


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

    @property
    def ok(self) -> bool:
        return not self.truncated


def sampled_content_id(path: str) -> str:
    """A content id from the size and the first and last MiB of the file (fast on huge files)."""
    h = hashlib.blake2b(digest_size=8)
    size = os.path.getsize(path)
    h.update(str(size).encode())
    with open(path, "rb") as f:
        h.update(f.read(1 << 20))
        if size > 2 << 20:
            f.seek(-(1 << 20), os.SEEK_END)
            h.update(f.read())
    return h.hexdigest()


def _worker_init():
    gc.disable()
    _reuse_freed_memory()


_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3  # glibc's mallopt parameters


def _reuse_freed_memory():
    """Have glibc's malloc keep freed blocks for reuse instead of giving each large one back to the
    OS and faulting it in again: a worker allocates and frees several MB per chunk (texts, Arrow
    buffers), and in a VM the page faults cost as much as a third of the parsing (measured: sys
    time 3 s -> 0.5 s per GB, 1000 -> 20 faults per MB). Memory stays bounded by the largest chunk's
    working set. No effect where the C library is not glibc."""
    try:
        libc = ctypes.CDLL(None)
        libc.mallopt(_M_MMAP_THRESHOLD, 32 << 20)  # the largest value glibc takes on 64-bit
        libc.mallopt(_M_TRIM_THRESHOLD, 256 << 20)
    except (OSError, AttributeError):
        pass


def _pool(workers: int):
    """The worker processes. On Linux they are forked from this process: nothing is imported again
    and the modules' pages stay shared (measured: ~60 MB less in all, 0.5-1 s sooner per trace).
    That is safe here because a worker uses only pyarrow, msgspec and orjson (no thread pool the
    parent may have started, such as polars'). Elsewhere (fork is unsafe on macOS) a forkserver."""
    if sys.platform == "linux":
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)  # Python 3.12+: fork with threads alive
            return _mp.get_context("fork").Pool(workers, initializer=_worker_init)
    ctx = _mp.get_context("forkserver")
    ctx.set_forkserver_preload(["pipeline.flatten", "pipeline.read.decode"])
    return ctx.Pool(workers, initializer=_worker_init)


def _stop_forkserver():
    """Stop the forkserver process the pool started (it holds the preloaded modules, ~50-80 MB):
    it would otherwise live on through linking, which needs no workers. A later pool starts it
    again. (The resource tracker, ~10 MB, stays: it still tracks the pool's semaphores.)"""
    from multiprocessing import forkserver
    try:
        forkserver._forkserver._stop()
    except (AttributeError, OSError):  # a private API: stopping is only a saving
        pass


def default_workers(path: str) -> int:
    """All cores (up to 8) for a trace of PARALLEL_MIN_BYTES of JSON or more, compressed or not
    (a 1 GB trace gzips to ~50 MB), else 1: starting workers costs more than a small trace."""
    try:
        size = json_bytes_estimate(path)
    except OSError:
        return 1
    if size < PARALLEL_MIN_BYTES:
        return 1
    return max(1, min(len(os.sched_getaffinity(0)), 8))


def _offset(tbl: pa.Table, offset: int) -> pa.Table:
    if offset == 0 or tbl.num_rows == 0:
        return tbl
    i = tbl.schema.get_field_index("event_idx")
    return tbl.set_column(i, "event_idx", pc.add(tbl.column(i), pa.scalar(offset, pa.int64())))


def _int_or_none(v):
    return v if type(v) is int else None


def devices_table(metadata: dict, gpu_device_ids: set, problems: Problems) -> pa.Table:
    """One row per deviceProperties entry plus one per device id seen only on GPU events."""
    props = metadata.get("deviceProperties")
    rows = []
    if props is not None and not isinstance(props, list):
        problems.dropped["deviceProperties_not_a_list"] += 1
        props = []
    for p in props or []:
        if not isinstance(p, dict):
            problems.dropped["deviceProperties_entry_not_object"] += 1
            continue
        rows.append({
            "device": as_int(p.get("id"), "device_id", problems), "source": "deviceProperties",
            "name": p.get("name") if isinstance(p.get("name"), str) else None,
            "total_global_mem": _int_or_none(p.get("totalGlobalMem")),
            "compute_major": _int_or_none(p.get("computeMajor")),
            "compute_minor": _int_or_none(p.get("computeMinor")),
            "num_sms": _int_or_none(p.get("numSms")),
            "warp_size": _int_or_none(p.get("warpSize")),
            "max_threads_per_block": _int_or_none(p.get("maxThreadsPerBlock")),
            "shared_mem_per_block": _int_or_none(p.get("sharedMemPerBlock")),
            "props_json": dumps(p).decode(),
        })
    listed = {r["device"] for r in rows}
    for d in sorted(gpu_device_ids - listed):
        rows.append({"device": d, "source": "gpu_events"})
    return pa.Table.from_pylist(rows, schema=schema.table("devices").arrow_schema())


def trace_row(path: str, metadata: dict, counts: dict, problems: Problems, tail) -> dict:
    dist = metadata.get("distributedInfo") if isinstance(metadata.get("distributedInfo"), dict) else {}
    rest = {k: v for k, v in metadata.items() if k != "deviceProperties"}
    issues = {**{f"coerced:{k}": v for k, v in problems.coerced.items()},
              **{f"dropped:{k}": v for k, v in problems.dropped.items()}}
    if tail.truncated:
        issues["truncated"] = 1
    sv = metadata.get("schemaVersion")
    base = metadata.get("baseTimeNanoseconds")
    return {
        "trace_id": sampled_content_id(path),
        "source_path": str(path),
        "source_bytes": os.path.getsize(path),
        "stem": trace_stem(path),
        "schema_version": None if sv is None else str(sv),
        "trace_name": metadata.get("traceName") if isinstance(metadata.get("traceName"), str) else None,
        "base_time_ns": base if type(base) is int else None,
        "rank": _int_or_none(dist.get("rank")),
        "world_size": _int_or_none(dist.get("world_size")),
        "backend": dist.get("backend") if isinstance(dist.get("backend"), str) else None,
        **counts,
        "n_coerced": sum(problems.coerced.values()),
        "n_dropped": sum(problems.dropped.values()),
        "problems_json": dumps(issues).decode(),
        "truncated": tail.truncated,
        "metadata_json": dumps(redact(rest)).decode(),
        "tracepipe_version": __version__,
        "flattened_at": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
    }


def flatten_into(path: str, tmp: Path, workers: int | None = None, chunk_bytes: int | None = None,
                 progress: Callable[[int], None] | None = None, max_inflate: float | None = None):
    """Read one trace and write events/gpu_ops/flows/devices/trace Parquet files into `tmp`.

    Returns (trace_row dict, Problems, Tail). Link and cost run afterwards over these files.
    With workers, chunks go to them as file positions where the file is uncompressed (they read
    the bytes themselves) and come back as Arrow files in shared memory (see `_spill`).
    """
    workers = default_workers(path) if workers is None else max(1, workers)
    src = TraceSource(path, **({"chunk_bytes": chunk_bytes} if chunk_bytes else {}), max_inflate=max_inflate)
    problems = Problems()
    corrupt = []
    device_ids: set = set()
    with ExitStack() as cleanup:  # undone in reverse, whatever happens (a full disk included)
        cleanup.callback(src.close)
        shm = _SHARED_MEMORY if os.access(_SHARED_MEMORY, os.W_OK) else tmp
        spill_dir = tempfile.mkdtemp(prefix="tracepipe-", dir=shm)
        cleanup.callback(shutil.rmtree, spill_dir, True)
        if gc.isenabled():
            gc.disable()
            cleanup.callback(gc.enable)
        pool = _pool(workers) if workers > 1 else None  # before the outputs are open: workers inherit none
        if pool:
            cleanup.callback(_stop_forkserver)
            cleanup.callback(pool.terminate)
        writers = {n: store.TableWriter(tmp / f"{n}.parquet", n) for n in ("events", "gpu_ops", "flows")}
        for w in writers.values():
            cleanup.callback(w.abandon)  # a no-op once closed
        in_flight = 4 * workers
        slots = _ChunkSlots(spill_dir, in_flight + 1)
        submit = (lambda piece: pool.apply_async(_run_chunk, (slots.put(piece), spill_dir))) if pool else None
        results = ordered_results(src.pieces(spans=pool is not None), build_from_text, build_chunk, submit=submit,
                                  max_inflight=in_flight, on_corrupt=corrupt.append)
        offset = 0
        for ct in map(_unspill, results):
            writers["events"].write(_offset(ct.events, offset))
            writers["gpu_ops"].write(_offset(ct.gpu_ops, offset))
            writers["flows"].write(_offset(ct.flows, offset))
            offset += ct.events.num_rows
            problems.merge(ct.problems)
            device_ids |= ct.device_ids
            if progress:
                progress(src.bytes_read)
        for w in writers.values():
            w.close()
        if src.values_cut:
            problems.coerced[TOO_LARGE] += src.values_cut
    tail = src.tail
    src.metadata, bad_strings = scrub(src.metadata)
    if bad_strings:
        problems.coerced[BAD_UNICODE] += bad_strings
    if corrupt and not tail.truncated:
        tail.truncated, tail.reason = True, corrupt[0]
    devices = devices_table(src.metadata, device_ids, problems)
    store.write_table(devices, tmp / "devices.parquet", "devices", ("flatten",))
    counts = {"n_events": writers["events"].rows, "n_gpu_ops": writers["gpu_ops"].rows,
              "n_flows": writers["flows"].rows, "n_devices": devices.num_rows}
    row = trace_row(path, src.metadata, counts, problems, tail)
    return row, problems, tail


_SHARED_MEMORY = "/dev/shm"
_CHUNK_TABLES = ("events", "gpu_ops", "flows")


class _ChunkSlots:
    """Chunk texts (of compressed input) handed to the workers through files in shared memory,
    one per slot, reused round robin, instead of the task pipe: one copy each way rather than a
    pickle, a pipe and an unpickle (measured: 2.6 s of CPU per GB through the pipe), and the
    slots' pages stay allocated. `ordered_results` has at most `in_flight` chunks unsettled when
    it submits one, and reads a failed chunk's text (to merge it) before settling it: with
    in_flight + 1 slots a slot is rewritten only once its chunk is settled."""

    def __init__(self, directory: str, n: int):
        self.paths = [os.path.join(directory, f"chunk{i}") for i in range(n)]
        self.next = 0

    def put(self, piece):
        """A FileSpan of the chunk text in the next slot (other pieces as they are)."""
        if not isinstance(piece, bytes):
            return piece
        path = self.paths[self.next % len(self.paths)]
        self.next += 1
        fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o600)
        try:
            os.pwrite(fd, piece, 0)  # may leave an older chunk's bytes after it: the span ends before
        finally:
            os.close(fd)
        return FileSpan(path, 0, len(piece))


@dataclass
class SpilledChunk:
    """A worker's ChunkTables with the tables in Arrow IPC files: the parent maps them without
    copying (pickling tables through the result pipe cost more than building them)."""

    paths: dict
    problems: Problems
    device_ids: set


def _spill(ct: ChunkTables, spill_dir: str) -> SpilledChunk:
    fd, base = tempfile.mkstemp(dir=spill_dir)
    os.close(fd)
    paths = {}
    for name in _CHUNK_TABLES:
        tbl = getattr(ct, name)
        paths[name] = f"{base}.{name}.arrow"
        with pa.OSFile(paths[name], "wb") as f, pa.ipc.new_file(f, tbl.schema) as w:
            w.write_table(tbl)
    os.remove(base)
    return SpilledChunk(paths, ct.problems, ct.device_ids)


def _unspill(ct: ChunkTables | SpilledChunk) -> ChunkTables:
    if isinstance(ct, ChunkTables):
        return ct
    tables = {}
    for name, p in ct.paths.items():
        tables[name] = pa.ipc.open_file(pa.memory_map(p)).read_all()
        os.remove(p)  # the mapping stays valid; the memory goes when the table does
    return ChunkTables(tables["events"], tables["gpu_ops"], tables["flows"], ct.problems, ct.device_ids)


def _run_chunk(piece, spill_dir: str):
    ok, value = _run_local(build_from_text, text_of(piece))
    return ok, (_spill(value, spill_dir) if ok else value)


def write_trace_table(row: dict, tmp: Path):
    t = pa.Table.from_pylist([row], schema=schema.table("trace").arrow_schema(schema.ALL_STAGES))
    store.write_table(t, tmp / "trace.parquet", "trace")


def flatten(path: str | os.PathLike, out: str | os.PathLike, *, workers: int | None = None,
            chunk_bytes: int | None = None, link: bool = True, device_specs: str | None = None,
            device: str | None = None, dtype: str | None = None,
            progress: Callable[[int], None] | None = None, max_inflate: float | None = None) -> FlattenResult:
    """Flatten one trace into OUT/<stem>/{events,gpu_ops,flows,devices,trace}.parquet.

    The directory appears complete or not at all. With `link` (default) GPU ops are linked to
    their launches and CPU ops and costed (see `pipeline.link` and `pipeline.cost`).
    """
    path = str(path)
    why = not_regular(path)
    if why:
        raise BadTrace(f"{path}: {why}")
    final = Path(out) / trace_stem(path)
    warnings: list = []
    seconds = {}
    with store.output_of(final, made=Path(out)):
        with store.atomic_dir(final) as tmp:
            t0 = time.perf_counter()
            row, problems, tail = flatten_into(path, tmp, workers, chunk_bytes, progress, max_inflate)
            seconds["flatten"] = time.perf_counter() - t0
            if link:
                from pipeline.cost.enrich import enrich
                t0 = time.perf_counter()
                warnings += enrich(tmp, row, device_specs=device_specs, device=device, dtype=dtype)
                seconds["link_cost"] = time.perf_counter() - t0
            write_trace_table(row, tmp)
    return FlattenResult(final, row["n_events"], row["n_gpu_ops"], row["n_flows"], row["n_devices"],
                         tail.truncated, tail.reason, orjson.loads(row["problems_json"]), warnings, seconds)
