"""head_start: a large trace's reading begun before the command has imported what comes after it.

`tracepipe analyze TRACE` and `tracepipe flatten TRACE` spent their first 0.3-0.4 s importing
polars, the link and cost stages and the analyses, on one core, before reading started. `begin`,
called first thing by the command line, starts the reading workers (`read.workers`) and hands them
the trace's first chunks while those imports run; `flatten_into` then `take`s what was begun and
reads on from there, exactly as if it had begun it itself (the same pool, slots and chunks).

Only for what reads in workers with the default settings: an uncompressed regular file of
`workers.PARALLEL_MIN_BYTES` or more. What this module imports is what the workers use (pyarrow,
msgspec, orjson, the readers): they are forked from this process, polars never loaded in them.
Anything unexpected leaves the reading to `flatten_into` (the head start is only a saving), and a
head start nobody took (a usage error, `--help`) is stopped at exit.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import shutil
import tempfile
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from dataclasses import dataclass, field
from itertools import islice
from multiprocessing.pool import Pool

from pipeline.read.by_native import available as native_available
from pipeline.read.source import NATIVE_CHUNK_BYTES, TraceSource
from pipeline.read.stream import json_bytes_estimate
from pipeline.read.workers import default_workers, in_flight, slots_home, start_pool, submitter

COMMANDS = ("analyze", "flatten")  # whose first argument, a trace file, is read first


@dataclass
class Started:
    """A trace's reading as `begin` left it: the pool, slot files and chunks `flatten_into` reads
    on with, and the chunks submitted already with their results to come (`submit`)."""

    path: str
    workers: int
    pool: Pool
    spill_dir: str
    src: TraceSource
    hand_over: Callable  # a chunk to the workers (`workers.submitter`)
    pieces: Iterator  # the rest of src.pieces(spans=True)
    submitted: deque = field(default_factory=deque)  # (piece, async result) in order

    @property
    def chunk_bytes(self) -> int:
        return self.src.chunk_bytes

    def submit(self, piece):
        """`piece` to the workers: its result already on its way if `begin` submitted it."""
        if self.submitted and self.submitted[0][0] is piece:
            return self.submitted.popleft()[1]
        return self.hand_over(piece)

    def all_pieces(self):
        """Every chunk of the trace in order: those submitted, then the rest."""
        yield from [piece for piece, _ in self.submitted]
        yield from self.pieces

    def stop(self):
        """Workers, slots and file given up: a head start `take` found read with other settings,
        or one nobody took by the exit (`flatten_into` cleans up one it took with its own)."""
        with contextlib.suppress(Exception):
            self.pool.terminate()
        self.src.close()
        shutil.rmtree(self.spill_dir, True)


_started: Started | None = None


def begin(argv: list[str]) -> None:
    """For a command line of COMMANDS whose first argument is a trace file read in workers (by
    default, or as its -j/--workers says), start its reading (`take` gets it)."""
    global _started
    if len(argv) < 2 or argv[0] not in COMMANDS or argv[1].startswith("-") or _started is not None:
        return
    if any(a == "--help" or a.startswith("--max-inflate") for a in argv):
        return
    path = argv[1]
    try:
        workers = _workers_option(argv[2:])
        if not os.path.isfile(path) or json_bytes_estimate(path) != os.path.getsize(path):
            return  # compressed (its chunks go through this process's decompressor): no head start
        workers = default_workers(path) if workers is None else workers
        if workers < 2 or not native_available():
            return
        _started = _start(path, workers)
    except Exception:  # a head start is only a saving: flatten_into reads as ever
        return
    if _started is not None:
        atexit.register(_abandon)


def _workers_option(args: list[str]) -> int | None:
    """The value of -j/--workers in `args` (None: not given); ValueError if it is not a number."""
    for i, a in enumerate(args):
        if a in ("-j", "--workers"):
            if i + 1 == len(args):
                raise ValueError("-j/--workers without a value")
            return int(args[i + 1])
        if a.startswith("--workers="):
            return int(a.split("=", 1)[1])
        if a.startswith("-j"):
            return int(a[2:])
    return None


def _start(path: str, workers: int) -> Started | None:
    ahead = in_flight(workers)  # as flatten_into's: its slots are reused round robin
    home = slots_home(None, ahead + 1, NATIVE_CHUNK_BYTES)
    if home is None:  # no room in shared memory: flatten_into puts the slots beside its output
        return None
    with ExitStack() as undo:  # what is made so far, undone if the start fails
        src = TraceSource(path, NATIVE_CHUNK_BYTES)
        undo.callback(src.close)
        spill_dir = tempfile.mkdtemp(prefix="tracepipe-", dir=home)
        undo.callback(shutil.rmtree, spill_dir, True)
        pool = start_pool(workers)
        undo.callback(pool.terminate)
        started = Started(
            path, workers, pool, spill_dir, src, submitter(pool, spill_dir, ahead + 1), src.pieces(spans=True)
        )
        for piece in islice(started.pieces, ahead):
            started.submitted.append((piece, started.submit(piece)))
        undo.pop_all()
    return started


def take(path: str, workers: int | None, chunk_bytes: int | None, max_inflate: float | None) -> Started | None:
    """The reading `begin` started of `path`, once. Read with other settings it is stopped; another
    trace read first (a graph capture trace, say) leaves it for its own."""
    global _started
    started = _started
    if started is None or os.path.realpath(path) != os.path.realpath(started.path):
        return None
    _started = None
    if workers in (None, started.workers) and chunk_bytes in (None, started.chunk_bytes) and max_inflate is None:
        return started
    started.stop()
    return None


def _abandon():
    """At exit: a head start nobody took (the command failed before reading, or read no trace)."""
    global _started
    if _started is not None:
        _started.stop()
        _started = None
