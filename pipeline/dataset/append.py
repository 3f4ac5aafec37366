"""append: one trace added to a dataset as it is born (`add_trace`), safely while other processes
(the other ranks of a job) add theirs, and while `batch` or `compact` run.

The trace is flattened outside the dataset's lock, in a staging folder of its own that clean-ups
leave alone while it is in use (`layout.held_stage`); only the commit (its parts renamed into the
table folders, then its manifest file: `layout.commit`, as `batch` commits a task) waits for the
lock. The same content twice is one trace. Every `compact_after` manifest files (each added trace
makes one), the committing writer compacts the dataset while it holds the lock.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from pipeline.dataset.batch import manifest_row
from pipeline.dataset.inputs import Item, file_hash
from pipeline.dataset.layout import commit, commit_id, committed_ids, held_stage, locked, manifest_files, uncommit
from pipeline.errors import BadTrace

COMPACT_AFTER = 64  # manifest files (commits) before the writer that sees them compacts


@dataclass(frozen=True)
class Added:
    """What became of a trace given to `add_trace`: its id, its manifest status (ok, truncated,
    quarantined) and its error, or `already` when the dataset held its content before."""

    trace_id: str
    status: str
    error: str | None = None


def add_trace(
    dataset: str | os.PathLike,
    path: str | os.PathLike,
    source: str | None = None,
    compact_after: int | None = COMPACT_AFTER,
) -> Added:
    """Flatten the trace file `path` into `dataset` (made when missing) as `source` (default: its
    path; the run is its directory, as everywhere). Safe with concurrent writers (module docstring)."""
    from pipeline.dataset.group import run_group

    ds = Path(dataset)
    ds.mkdir(parents=True, exist_ok=True)
    path = str(path)
    try:
        digest, size = file_hash(path)
    except OSError as e:
        raise BadTrace(f"{path}: cannot read: {e.strerror or e}") from None
    item = Item(source=source or path, path=path, size=size, content_hash=digest)
    with held_stage(ds) as stage:
        if item.trace_id in committed_ids(ds):
            return Added(item.trace_id, "already")
        task = stage / "task"
        facts = run_group([(path, item.source, item.trace_id)], str(task), None, 1, False)[0]
        with locked(ds, wait=True):
            if item.trace_id in committed_ids(ds):
                return Added(item.trace_id, "already")
            cid = commit_id()
            try:
                commit(ds, task, cid, [manifest_row(item, cid, facts)])
            except OSError:
                uncommit(ds, cid)
                raise
            if compact_after and len(manifest_files(ds)) > compact_after:
                from pipeline.dataset.compact import compact_locked

                compact_locked(ds)
    return Added(item.trace_id, facts["status"], facts.get("error"))
