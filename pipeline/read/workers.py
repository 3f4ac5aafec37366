"""workers: chunks decoded in worker processes, in bounded memory.

Workers read an uncompressed file's chunk bytes themselves (by position); chunks of a compressed
trace reach them through round-robin slot files in shared memory; their tables come back as Arrow
IPC files there, which the parent maps without copying. Workers start only for traces large
enough to pay for them (`default_workers`).
"""

from __future__ import annotations

import contextlib
import ctypes
import gc
import multiprocessing as _mp
import os
import sys
import tempfile
import warnings
from collections import Counter
from dataclasses import dataclass, field

import pyarrow as pa

from pipeline.read.chunks import FileSpan, run_local, text_of
from pipeline.read.decode import build_from_text
from pipeline.read.durations import OpenEnds
from pipeline.read.stream import json_bytes_estimate
from pipeline.read.tables import ChunkTables
from pipeline.read.values import Problems

PARALLEL_MIN_BYTES = 48 << 20


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


def start_pool(workers: int):
    """The worker processes. On Linux they are forked from this process: nothing is imported again
    and the modules' pages stay shared (measured: ~60 MB less in all, 0.5-1 s sooner per trace).
    That is safe here because a worker uses only pyarrow, msgspec and orjson (no thread pool the
    parent may have started, such as polars'). Elsewhere (fork is unsafe on macOS) a forkserver."""
    if sys.platform == "linux":
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)  # Python 3.12+: fork with threads alive
            return _mp.get_context("fork").Pool(workers, initializer=_worker_init)
    ctx = _mp.get_context("forkserver")
    ctx.set_forkserver_preload(["pipeline.read.workers", "pipeline.read.decode"])
    return ctx.Pool(workers, initializer=_worker_init)


def stop_forkserver():
    """Stop the forkserver process the pool started (it holds the preloaded modules, ~50-80 MB):
    it would otherwise live on through linking, which needs no workers. A later pool starts it
    again. (The resource tracker, ~10 MB, stays: it still tracks the pool's semaphores.)"""
    from multiprocessing import forkserver

    with contextlib.suppress(AttributeError, OSError):  # a private API: stopping is only a saving
        forkserver._forkserver._stop()


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


SHARED_MEMORY = "/dev/shm"


_CHUNK_TABLES = ("events", "gpu_ops", "flows")


class ChunkSlots:
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
    task_pids: set
    open_ends: OpenEnds | None = None
    launches: Counter = field(default_factory=Counter)
    cats: set = field(default_factory=set)


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
    return SpilledChunk(paths, ct.problems, ct.device_ids, ct.task_pids, ct.open_ends, ct.launches, ct.cats)


def unspill(ct: ChunkTables | SpilledChunk) -> ChunkTables:
    if isinstance(ct, ChunkTables):
        return ct
    tables = {}
    for name, p in ct.paths.items():
        tables[name] = pa.ipc.open_file(pa.memory_map(p)).read_all()
        os.remove(p)  # the mapping stays valid; the memory goes when the table does
    tables_ = (tables["events"], tables["gpu_ops"], tables["flows"])
    return ChunkTables(*tables_, ct.problems, ct.device_ids, ct.task_pids, ct.open_ends, ct.launches, ct.cats)


def run_chunk(piece, spill_dir: str):
    ok, value = run_local(build_from_text, text_of(piece))
    return ok, (_spill(value, spill_dir) if ok else value)
