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
import warnings
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

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
    # Arrow's default pool (mimalloc) keeps the pages a chunk's tables freed for itself: ~25 MB a
    # worker more than the C library's heap, which the next chunk's Python and native buffers reuse
    # too (measured: worker PSS 104-111 -> 81-87 MB, the same time)
    pa.set_memory_pool(pa.system_memory_pool())


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


def give_back_freed_memory() -> None:
    """Hand the C library heap's free pages back to the OS (glibc's malloc_trim): after reading,
    the tables copied out of the workers' slots (`unspill`) leave the parent's heap large and
    mostly free, and linking, which allocates elsewhere (Arrow's and polars' own allocators), would
    otherwise peak on top of it (measured: +60 MB). No effect where the C library is not glibc."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None).malloc_trim(0)


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
SLOT_ROOM = 3  # chunk_bytes a slot may hold: a chunk's text, and its tables (~1.3x the text)


def slots_home(fallback: Path | None, slots: int, chunk_bytes: int) -> Path | str | None:
    """Where a flatten's slot files (`Slots`) go: shared memory when it is writable and has room
    for them, else `fallback` (the output's temporary directory: on disk, the page cache serves
    the reused files the same way). A container's /dev/shm is often 64 MB (Docker's default),
    less than two workers' slots may take; filling it failed the flatten with "No space left on
    device" named after the output directory, whose disk had room."""
    try:
        st = os.statvfs(SHARED_MEMORY)
    except OSError:
        return fallback
    room = st.f_bavail * st.f_frsize
    return SHARED_MEMORY if os.access(SHARED_MEMORY, os.W_OK) and room >= SLOT_ROOM * slots * chunk_bytes else fallback


class Slots:
    """Files in shared memory reused round robin, one per chunk that can be unsettled at once: a
    slot's pages stay allocated, where a file per chunk had its pages allocated, zeroed, mapped
    and freed again. `ordered_results` has at most `in_flight` chunks unsettled when it submits one
    (a slot is taken then), reads a failed chunk's text (to merge it) before settling it, and the
    parent copies a settled chunk's tables out of their slot (`unspill`) before it submits
    another: with in_flight + 1 slots a slot is rewritten only once its chunk is done with.

    Two sets of them: chunk texts of compressed input (`put`), handed to the workers instead of
    through the task pipe (one copy each way rather than a pickle, a pipe and an unpickle;
    measured: 2.6 s of CPU per GB through the pipe), and the tables the workers build (`take`;
    measured on 4 MB chunks of a 1 GB trace, ~5 MB of tables each: 3.3-3.5 -> 1.3-1.4 ms of CPU per
    chunk from the worker's write to the parent's free, against a file per chunk that the parent
    mapped: ~0.55 CPU-s per GB)."""

    def __init__(self, directory: str, kind: str, n: int, files: tuple[str, ...] = ("",)):
        """n slots of `files` files each (a table of each name: `{path}{name}`)."""
        self.paths = [os.path.join(directory, f"{kind}{i}") for i in range(n)]
        for path in self.paths:
            for name in files:
                os.close(os.open(path + name, os.O_WRONLY | os.O_CREAT, 0o600))
        self.next = 0

    def take(self) -> str:
        path = self.paths[self.next % len(self.paths)]
        self.next += 1
        return path

    def put(self, piece):
        """A FileSpan of the chunk text in the next slot (other pieces as they are)."""
        if not isinstance(piece, bytes):
            return piece
        path = self.take()
        fd = os.open(path, os.O_WRONLY)
        try:
            os.pwrite(fd, piece, 0)  # may leave an older chunk's bytes after it: the span ends before
        finally:
            os.close(fd)
        return FileSpan(path, 0, len(piece))


def _table_file(slot: str, name: str) -> str:
    """The file of a `Slots` slot that holds a chunk's table `name`."""
    return f"{slot}.{name}.arrow"


TABLE_FILES = tuple(_table_file("", name) for name in _CHUNK_TABLES)  # a slot's files, after its path


@dataclass
class SpilledChunk:
    """A worker's ChunkTables with the tables as Arrow IPC files in a slot (`Slots`): the first
    `sizes[name]` bytes of its file `_table_file(slot, name)` (pickling tables through the result pipe cost
    more than building them)."""

    slot: str
    sizes: dict
    problems: Problems
    device_ids: set
    task_pids: set
    open_ends: OpenEnds | None = None
    launches: Counter | None = None
    cats: set = field(default_factory=set)


def _spill(ct: ChunkTables, slot: str) -> SpilledChunk:
    sizes = {}
    for name in _CHUNK_TABLES:
        tbl = getattr(ct, name)
        # written over the start of the slot's file, not truncated (its pages stay allocated); an
        # older chunk's bytes may follow: `sizes` says where these end
        with open(_table_file(slot, name), "r+b", buffering=1 << 20) as f:
            with pa.ipc.new_file(pa.PythonFile(f, mode="w"), tbl.schema) as w:
                w.write_table(tbl)
            sizes[name] = f.tell()
    return SpilledChunk(slot, sizes, ct.problems, ct.device_ids, ct.task_pids, ct.open_ends, ct.launches, ct.cats)


def unspill(ct: ChunkTables | SpilledChunk) -> ChunkTables:
    """A worker's tables, copied out of their slot (a later chunk rewrites it), each table into a
    buffer of its own: a table of a few rows may wait long for others of its kind to be written
    after the chunk's other tables are gone (one buffer for the three kept every chunk's tables
    alive while its small gpu_ops table waited: +240 MB on a 1 GB trace)."""
    if isinstance(ct, ChunkTables):
        return ct
    tables = {}
    for name, size in ct.sizes.items():
        buf = pa.allocate_buffer(size, memory_pool=pa.system_memory_pool())  # its heap: fewer pages kept
        FileSpan(_table_file(ct.slot, name), 0, size).read_into(buf)
        tables[name] = pa.ipc.open_file(buf).read_all()
    tables_ = (tables["events"], tables["gpu_ops"], tables["flows"])
    return ChunkTables(*tables_, ct.problems, ct.device_ids, ct.task_pids, ct.open_ends, ct.launches, ct.cats)


IN_FLIGHT_PER_WORKER = 4  # chunks submitted ahead of the one being settled, per worker


def in_flight(workers: int) -> int:
    """Chunks a read with `workers` keeps submitted ahead (`chunks.ordered_results`'s
    max_inflight); its `Slots` are one more of each kind."""
    return IN_FLIGHT_PER_WORKER * workers


def submitter(pool, spill_dir: str, slots: int):
    """Hands a chunk to the workers: its text through a slot file when it comes as bytes (of
    compressed input), its tables back through another (`Slots`). Made only with workers: a
    flatten in one process has no slot files to create."""
    texts, tables = Slots(spill_dir, "chunk", slots), Slots(spill_dir, "tables", slots, TABLE_FILES)
    return lambda piece: pool.apply_async(run_chunk, (texts.put(piece), tables.take()))


def run_chunk(piece, slot: str):
    """A chunk's tables built in a worker, written to `slot` (a `Slots` path with TABLE_FILES)."""
    ok, value = run_local(build_from_text, text_of(piece))
    return ok, (_spill(value, slot) if ok else value)
