"""folder: the Extracts of every trace of a run folder (or archive), each trace read in one
streaming pass, several at once in worker processes, or taken from the cache (`cache`) when the
trace has not changed since.

Workers are forked once the few modules a scan needs are imported (their pages are shared), one
trace at a time, largest first; a run whose traces hold little JSON is read in this process
(starting workers would cost more). A worker writes its Extract to the cache and sends it back
only when it is small; a large one is then read from its file a slice at a time.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from pipeline.kineto import is_trace_path
from pipeline.read.limits import not_regular
from pipeline.runs.calls import Extract
from pipeline.runs.scan import cache

IN_PROCESS_BYTES = 24 << 20  # less JSON than this in all: read here, no workers
SEND_BACK_CALLS = 200_000  # a worker sends back Extracts of fewer calls; larger ones stay in their file
HELD_CALLS = 1_000_000  # calls of a run's Extracts held in memory (~40 MB); the others stay in their files


def trace_files(folder: str) -> list[str]:
    """Every file under `folder` named like a trace (recursive, sorted)."""
    found = []
    for d, dirs, files in os.walk(folder):
        dirs.sort()
        found += [
            os.path.join(d, f) for f in sorted(files) if is_trace_path(os.path.relpath(os.path.join(d, f), folder))
        ]
    return found


def _json_bytes(path: str) -> int:
    from pipeline.read.stream import json_bytes_estimate

    try:
        return json_bytes_estimate(path)
    except OSError:
        return 0


def _scan_one(job: tuple) -> tuple[str, Extract | None]:
    """Scan one trace (in a worker or here) and keep its Extract in `store` (a file path)."""
    path, source, store, max_inflate = job
    from pipeline.runs.scan.rank import scan_trace

    why = not_regular(path)
    if why:
        ex = Extract.empty(_unread(path, source, why))
    else:
        ex = scan_trace(path, max_inflate)
        ex.info["source"] = source
    if store is not None:
        try:
            cache.write(Path(store), ex)
        except OSError:
            store = None
    small = store is None or len(ex.calls["ts"]) < SEND_BACK_CALLS
    return (store or ""), (ex if small else None)


def _unread(path: str, source: str, why: str) -> dict:
    size = mtime = None
    try:
        st = os.stat(path)
        size, mtime = st.st_size, st.st_mtime_ns
    except OSError:
        pass
    return {
        "source": source,
        "stem": _stem(source),
        "size": size,
        "mtime_ns": mtime,
        "status": "quarantined",
        "reason": why,
    }


def _stem(source: str) -> str:
    from pipeline.kineto import trace_stem

    return trace_stem(source.rsplit("!", 1)[-1])


@contextmanager
def scanned(
    src: str | Path, jobs: int | None = None, use_cache: bool = True, max_inflate: float | None = None
) -> Iterator[list]:
    """The Extracts (in memory, or `cache.CachedExtract`) of every trace in a folder, an archive
    or a file listing traces, in the order of their paths."""
    src = str(src)
    with tempfile.TemporaryDirectory(prefix="tracepipe-ranks-") as tmp:
        if os.path.isdir(src):
            files = [(p, p) for p in trace_files(src)]
            store_dir = cache.folder_cache(src) if use_cache else Path(tmp) / "extracts"
        else:
            files = _archive_files(src, Path(tmp))
            store_dir, use_cache = Path(tmp) / "extracts", False
        yield _scan_all(files, store_dir, use_cache, jobs, max_inflate)


def _archive_files(src: str, tmp: Path) -> list[tuple[str, str]]:
    """(local path, source name) of the traces in an archive or listed in a file (members
    extracted one at a time, as `batch` reads them; refused members quarantined)."""
    from pipeline.dataset.inputs import inputs

    out = []
    for item in inputs(src, tmp / "members", tmp / "none"):
        if item.path is None:
            out.append(("", f"{item.source}\0{item.rejected or item.failed or 'not read'}"))
        else:
            out.append((item.path, item.source))
    return out


def _scan_all(files: list[tuple[str, str]], store_dir: Path, use_cache: bool, jobs, max_inflate) -> list:
    out: dict[int, object] = {}
    todo = []
    for i, (path, source) in enumerate(files):
        if not path:  # refused before reading (an archive member): its reason after the \0
            name, why = source.split("\0", 1)
            out[i] = Extract.empty(_unread("", name, why))
            continue
        entry = cache.entry(store_dir, source)
        hit = cache.read(entry, source) if use_cache else None
        if hit is not None:
            out[i] = hit
        else:
            todo.append((i, (path, source, str(entry), max_inflate)))
    held = 0  # calls of the Extracts held in memory: past HELD_CALLS, the rest are read from their files
    if todo:
        for i, (store, ex) in _run(todo, jobs):
            if ex is not None and store and held + len(ex.calls["ts"]) > HELD_CALLS:
                ex = None
            held += len(ex.calls["ts"]) if ex is not None else 0
            out[i] = ex if ex is not None else cache.read(Path(store))
            if out[i] is None:  # the file went missing under us: read it again, here
                out[i] = _scan_one((*todo[[j for j, _ in todo].index(i)][1][:2], None, max_inflate))[1]
    return [out[i] for i in range(len(files))]


def _run(todo: list, jobs: int | None) -> Iterator[tuple[int, tuple]]:
    sizes = {i: _json_bytes(job[0]) for i, job in todo}
    todo = sorted(todo, key=lambda t: -sizes[t[0]])
    n = min(jobs or os.cpu_count() or 1, len(todo))
    if n <= 1 or sum(sizes.values()) < IN_PROCESS_BYTES:
        for i, job in todo:
            yield i, _scan_one(job)
        return
    import multiprocessing as mp
    from concurrent.futures import ProcessPoolExecutor

    with ProcessPoolExecutor(n, mp_context=mp.get_context("fork")) as pool:
        futures = {pool.submit(_scan_one, job): i for i, job in todo}
        for f, i in futures.items():
            yield i, f.result()


def clear(folder: str | Path) -> None:
    """Remove a run folder's cached Extracts."""
    shutil.rmtree(cache.folder_cache(folder), ignore_errors=True)
