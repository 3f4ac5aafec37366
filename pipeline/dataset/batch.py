"""batch: many traces -> one dataset (`layout`), incrementally and crash-safely.

Inputs (`inputs`) whose content is not in the dataset yet go to long-lived workers (`engines`) in
tasks: small traces together, GROUP_BYTES of JSON (at most GROUP_TRACES) per task, read, linked,
costed and written as one (`group.run_group`: each trace's rows exactly those `flatten` gives it
alone); a large trace in a task of its own, split over the idle cores. Each task writes one part
file per table into staging and is committed as one (`layout.commit`): its parts, then its
manifest rows. Bad inputs are committed as quarantined manifest rows with their reason (re-runs
report them without reading them again); a failure that is not the file's fault (a full disk, a
bug) commits nothing and is retried by the next run; when a worker dies, the inputs it may have
held are run again in halves, one task at a time, until the one that kills its worker is alone:
it is quarantined. At the end the run's small parts are merged (`compact`).
"""

from __future__ import annotations

import concurrent.futures as cf
import contextlib
import math
import os
import shutil
import tarfile
import uuid
import zipfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from pipeline.dataset.captures import CAPTURE_DIR, CaptureFinder
from pipeline.dataset.engines import Pool, check_engine
from pipeline.dataset.inputs import TAR_SUFFIXES, Item, Sources, inputs, sources
from pipeline.dataset.layout import (
    PART_COLUMN,
    STAGING,
    commit,
    commit_id,
    locked,
    part_name,
    read_manifest,
    recover,
    uncommit,
)
from pipeline.dataset.members import utc_now
from pipeline.errors import UsageError
from pipeline.kineto import is_trace_name
from pipeline.version import __version__

__all__ = ["FAULT_KILL", "BatchResult", "count_inputs", "default_jobs", "run_batch"]
FAULT_KILL = "TRACEPIPE_FAULT_KILL"  # tests: a task given an input whose name holds this value kills its worker

GROUP_BYTES = 24 << 20  # JSON bytes of small traces read, linked, costed and written as one task
GROUP_TRACES = 512  # traces of one task at most
MIN_GROUP_BYTES = 2 << 20  # ... and at least, unless GROUP_TRACES asks for more tasks
SMALL_TRACE_BYTES = 32 << 20  # a trace with more JSON than this gets a task of its own
DIED = "the worker flattening it died (killed by a signal: out of memory?)"


@dataclass
class BatchResult:
    dataset: Path
    added: int = 0  # traces committed by this run (ok or truncated)
    truncated: int = 0  # ... of which salvaged from a truncated file
    quarantined: int = 0  # bad inputs (this run's and those already quarantined)
    skipped: int = 0  # content already in the dataset
    duplicates: int = 0  # same content as another input of this run
    failed: int = 0  # not committed (worker died, internal error): retried next run
    problems: list = field(default_factory=list)
    compacted: object = None  # the compaction at the end (`compact.CompactResult`), if any

    @property
    def exit_code(self) -> int:
        return 1 if (self.quarantined or self.truncated or self.failed) else 0


def manifest_row(item: Item, cid: str, facts: dict) -> dict:
    """The manifest row of an input committed as part of commit `cid`, with its flattening facts."""
    return {
        "trace_id": item.trace_id,
        PART_COLUMN: part_name(cid) if facts["status"] != "quarantined" else None,
        "path": item.source,
        "source_path": item.source,
        "size": item.size,
        "content_hash": item.content_hash,
        "tracepipe_version": __version__,
        **facts,
    }


def group_limits(total: int | None, n_seen: int, bytes_seen: int, jobs: int) -> tuple[float, int]:
    """The JSON bytes and the traces of the task being gathered: GROUP_BYTES and GROUP_TRACES while
    how many inputs there are is unknown; else the inputs' estimated bytes (their count times the
    mean size so far) in equal tasks, as few as those limits allow, a multiple of `jobs` of them,
    so that the workers finish together. A task costs ~0.2 s whatever its size (a few hundred
    small queries): tasks that shrank towards the end (1/jobs of what was left each) took 12
    tasks for 2,000 small traces where 6 do."""
    if not total or not n_seen:
        return GROUP_BYTES, GROUP_TRACES
    est = total * bytes_seen / n_seen
    fewest = max(math.ceil(est / GROUP_BYTES), math.ceil(total / GROUP_TRACES), 1)
    # ... but no task of less than MIN_GROUP_BYTES made for the workers' sake (a few small traces: one)
    n = min(jobs * math.ceil(fewest / jobs), max(fewest, math.floor(est / MIN_GROUP_BYTES)))
    return est / n, math.ceil(total / n)


def default_jobs() -> int:
    return max(1, len(os.sched_getaffinity(0)))


def count_inputs(src: Sources, dataset: Path) -> int | None:
    """How many inputs `inputs(src)` yields, where that is known without reading them (for a progress
    display): the trace files under a directory, a zip's trace members, a list's paths, 1 for a
    trace; None for a tar (streamed: its members are known only as they come) or what cannot be
    listed. Decides what SRC is as `inputs` does; several sources: the sum (None if one is unknown)."""
    counts = [_count(s, dataset) for s in sources(src)]
    return None if None in counts else sum(c or 0 for c in counts)


def _count(src: str, dataset: Path) -> int | None:
    try:
        if os.path.isdir(src):
            skip, n = dataset.resolve(), 0
            for d, dirs, files in os.walk(src):
                dirs[:] = [x for x in dirs if Path(d, x).resolve() != skip]
                n += sum(map(is_trace_name, files))
            return n
        low = src.lower()
        if is_trace_name(low):
            return 1
        if low.endswith(".zip") or (not low.endswith(TAR_SUFFIXES) and zipfile.is_zipfile(src)):
            with zipfile.ZipFile(src) as zf:
                return sum(not i.is_dir() and is_trace_name(i.filename) for i in zf.infolist())
        if low.endswith(TAR_SUFFIXES) or tarfile.is_tarfile(src):
            return None
        lines = (line.strip() for line in Path(src).read_text().splitlines())
        return sum(1 for line in lines if line and not line.startswith("#"))
    except (OSError, ValueError, zipfile.BadZipFile):
        return None


@dataclass
class _Task:
    items: list[Item]
    cid: str  # its commit id: part-<cid>.parquet
    stage: Path
    small: bool
    workers: int = 1
    retry: bool = False  # run again, alone, after a worker died


def _json_bytes(item: Item) -> int:
    from pipeline.read.stream import json_bytes_estimate

    try:
        return json_bytes_estimate(item.path) if item.path else 0
    except OSError:
        return 0


def run_batch(
    src: Sources,
    dataset: str | os.PathLike,
    *,
    jobs: int | None = None,
    engine: str = "local",
    report: Callable[[str, str, str, int], None] | None = None,
    max_inflate: float | None = None,
    started: Callable[[int | None], None] | None = None,
    compact: bool = True,
    group_bytes: int | None = None,
    formulas=None,
    capture_dir: str | None = CAPTURE_DIR,
) -> BatchResult:
    """Flatten every trace of SRC (one source or several) into DATASET (see the module docstring),
    skipping known content.

    `report(kind, source, message, nbytes)` is called as inputs finish (a task's inputs when it
    commits; nbytes: the input's size);
    kind is one of ok, truncated, quarantined, failed, skipped, duplicate. `started(total)` is
    called once before that, with how many inputs SRC holds (`count_inputs`; None when unknown):
    a progress display's total. `compact`: merge the dataset's small parts at the end.
    `group_bytes`: JSON bytes of small traces per task (default GROUP_BYTES, less towards the end).
    `formulas`: a formula file (its path, or as `pipeline.load_formulas` loaded it), for the traces added.
    `capture_dir`: the folder beside a run's traces that holds their graph capture traces
    (`captures`; None: no pairing).
    """
    check_engine(engine)
    if formulas is not None:
        from pipeline.cost.formulas.user import as_formulas

        formulas = as_formulas(formulas)  # a path is loaded (and checked) before any work
    jobs = default_jobs() if jobs is None else jobs
    if jobs < 1:
        raise UsageError("-j must be at least 1")
    ds = Path(dataset)
    if ds.exists() and not ds.is_dir():
        raise UsageError(f"{ds}: exists and is not a directory")
    ds.mkdir(parents=True, exist_ok=True)
    res = BatchResult(ds)
    say = report or (lambda kind, source, msg, nbytes: None)

    def note(kind, item, msg=""):
        if kind in ("quarantined", "truncated", "failed"):
            res.problems.append(f"{item.source}: {kind}" + (f": {msg}" if msg else ""))
        say(kind, item.source, msg, item.size or 0)

    with locked(ds):
        recover(ds)
        known = read_manifest(ds)  # what earlier runs committed
        run = ds / STAGING / uuid.uuid4().hex[:12]
        run.mkdir(parents=True)
        pool, seen = Pool(engine, jobs), set()
        pending: dict[cf.Future, _Task] = {}
        suspects: list[list[Item]] = []  # inputs of tasks lost with a dead worker: run again in halves
        group: list[Item] = []  # small inputs waiting for their task
        group_size = 0  # their JSON bytes
        rejected: list[Item] = []  # refused unread: committed together
        committed = False

        def drop_temp(items: list[Item]):
            for item in items:
                if item.temp and item.path:
                    shutil.rmtree(Path(item.path).parent, ignore_errors=True)

        def settle(task: _Task, facts: list[dict]):
            """Commit a task's outcome; a commit the disk refuses is undone and retried next run."""
            nonlocal committed
            rows = [manifest_row(item, task.cid, f) for item, f in zip(task.items, facts)]
            try:
                commit(ds, task.stage, task.cid, rows)
            except OSError as e:
                uncommit(ds, task.cid)
                for item in task.items:
                    res.failed += 1
                    note("failed", item, f"cannot commit: {e.strerror or e}")
                    seen.discard(item.trace_id)
                return
            finally:
                shutil.rmtree(task.stage, ignore_errors=True)
            committed = True
            for item, f in zip(task.items, facts):
                st = f["status"]
                res.quarantined += st == "quarantined"
                res.added += st != "quarantined"
                res.truncated += st == "truncated"
                note(st, item, f.get("error") or "")

        def finish(fut: cf.Future):
            task = pending.pop(fut)
            keep_inputs = False
            try:
                facts = fut.result()
            except cf.process.BrokenProcessPool:  # a worker died (killed, out of memory): whose input was it?
                if task.retry and len(task.items) == 1:  # run alone, and died again: this input kills it
                    now = utc_now()
                    settle(task, [{"status": "quarantined", "started_at": now, "finished_at": now, "error": DIED}])
                elif task.retry:  # run alone, and died again: one of its inputs kills it
                    half = len(task.items) // 2
                    suspects[:0] = [task.items[:half], task.items[half:]]
                    keep_inputs = True
                else:  # it may have died of another task's input: run again alone
                    suspects.append(task.items)
                    keep_inputs = True
            except Exception as e:
                for item in task.items:
                    res.failed += 1
                    note("failed", item, f"{type(e).__name__}: {e}".splitlines()[0])
                    seen.discard(item.trace_id)
            else:
                settle(task, facts)
            finally:
                shutil.rmtree(task.stage, ignore_errors=True)
                if not keep_inputs:
                    drop_temp(task.items)

        def submit(items: list[Item], small: bool, retry: bool = False):
            cid = commit_id()
            workers = 1
            if not small and engine == "local" and not pending:  # alone: its chunks over the idle cores
                from pipeline.read.workers import default_workers

                workers = min(jobs, default_workers(items[0].path or ""))
            task = _Task(items, cid, run / cid, small, workers, retry)
            tasks = [(i.path, i.source, i.trace_id, i.captures) for i in items]
            from pipeline.dataset.group import run_group

            pending[pool.submit(run_group, tasks, str(task.stage), max_inflate, workers, small, formulas)] = task

        def wait(limit: int):
            while len(pending) > limit:
                for f in cf.wait(list(pending), return_when=cf.FIRST_COMPLETED).done:
                    finish(f)

        def flush_group():
            nonlocal group, group_size
            if group:
                wait(2 * jobs - 1)
                submit(group, True)
                group, group_size = [], 0

        def commit_rejected():
            if rejected:
                cid = commit_id()
                now = utc_now()
                task = _Task(list(rejected), cid, run / cid, True)
                task.stage.mkdir(parents=True, exist_ok=True)
                rejected.clear()
                settle(
                    task,
                    [
                        {"status": "quarantined", "error": i.rejected, "started_at": now, "finished_at": now}
                        for i in task.items
                    ],
                )

        try:
            pool.start()
            items = inputs(src, run / "x", ds, max_inflate)
            captures = CaptureFinder(capture_dir)
            total = count_inputs(src, ds)
            if started:
                started(total)
            n_seen = bytes_seen = 0
            for item in items:
                n_seen += 1
                if item.failed:
                    res.failed += 1
                    note("failed", item, item.failed)
                    continue
                tid = item.trace_id
                if tid in known or tid in seen:
                    old = known.get(tid)
                    if old is not None and old["status"] != "ok":
                        res.quarantined += old["status"] == "quarantined"
                        res.truncated += old["status"] == "truncated"
                        note(old["status"], item, f"{old['error']} (already in the dataset)")
                    elif old is not None:
                        res.skipped += 1
                        say("skipped", item.source, "", item.size or 0)
                    else:
                        res.duplicates += 1
                        say("duplicate", item.source, "", item.size or 0)
                    drop_temp([item])
                    continue
                seen.add(tid)
                if item.path and not item.temp:  # a file, not an archive member
                    item.captures = captures.of(item.path)
                if item.rejected:
                    rejected.append(item)
                    if len(rejected) >= GROUP_TRACES:
                        commit_rejected()
                    continue
                size = _json_bytes(item)
                bytes_seen += size
                if size > SMALL_TRACE_BYTES:
                    wait(2 * jobs - 1)
                    submit([item], False)
                    continue
                group.append(item)
                group_size += size
                limit, most = group_limits(total, n_seen, bytes_seen, jobs)
                limit = group_bytes if group_bytes is not None else limit
                if group_size >= limit or len(group) >= most:
                    flush_group()
            flush_group()
            commit_rejected()
            wait(0)
            while suspects:  # one task at a time: a worker that dies now died of one of its inputs
                lost = suspects.pop(0)
                submit(lost, len(lost) > 1, retry=True)
                wait(0)
        finally:
            pool.close()
        try:
            if compact and committed:
                from pipeline.dataset.compact import compact_locked

                res.compacted = compact_locked(ds)
        finally:
            shutil.rmtree(run, ignore_errors=True)
            with contextlib.suppress(OSError):
                (ds / STAGING).rmdir()
    return res
